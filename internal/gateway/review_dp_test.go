package gateway

import (
	"bytes"
	"strings"
	"testing"

	"github.com/fairshare-dev/fairshare/internal/tokencount"
)

// TestReviewDPStreamLegacyFunctionCallDeltasCounted: a stream of the legacy
// functions API (delta.function_call.arguments) that ends without usage is
// settled from the prompt plus the output counted from the deltas sent
// (api.md "Interactive calls"); the function_call arguments are generated
// output the provider bills, so they must be counted, not refunded.
func TestReviewDPStreamLegacyFunctionCallDeltasCounted(t *testing.T) {
	args := []string{`{"city":`, `"Paris",`, `"unit":"celsius","days":[1,2,3,4,5,6,7]}`}
	var events []string
	for _, a := range args {
		events = append(events, contentEvent("function_call", map[string]any{"arguments": a}))
	}
	events = append(events, "[DONE]")
	_, charged := streamEvents(t, events, hiStreamBody)
	k, _ := tokencount.Text(strings.Join(args, ""))
	if want := hiPromptTokens(t) + k; charged != want {
		t.Errorf("charged %d, want prompt + tokens of the function_call arguments = %d", charged, want)
	}
}

// TestReviewDPScanChunkFunctionCallMatchesJSON: the strict scanner reads
// the legacy function_call deltas exactly as encoding/json does.
func TestReviewDPScanChunkFunctionCallMatchesJSON(t *testing.T) {
	for _, s := range []string{
		`{"choices":[{"delta":{"function_call":{"name":"f","arguments":"{\"a\":"}}}]}`,
		`{"choices":[{"delta":{"function_call":{"arguments":"x"},"content":"y"}}]}`,
		`{"choices":[{"delta":{"function_call":null}}]}`,
		`{"choices":[{"delta":{"function_call":{"arguments":null}}}]}`,
		`{"choices":[{"delta":{"function_call":{"arguments":1}}}]}`,
		`{"choices":[{"delta":{"function_call":"auto"}}]}`,
		`{"choices":[{"delta":{"function_call":{"arguments":"a","arguments":"b"}}}]}`,
		`{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"t"}}],"function_call":{"arguments":"f"}}}]}`,
	} {
		checkScanEvent(t, []byte("data: "+s+"\n\n"))
		var text, want []byte
		var r chunkResult
		if scanChunk([]byte(s), &text, &r) {
			if got := decodeChunkJSON([]byte(s), &want); got != r || !bytes.Equal(text, want) {
				t.Errorf("%q: scanChunk %+v %q, encoding/json %+v %q", s, r, text, got, want)
			}
		}
	}
}
