package gateway

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
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

// TestReviewDPStreamContentTypeIsCaseInsensitive: media types are
// case-insensitive (RFC 9110 section 8.3.1). A streaming response labelled
// "Text/Event-Stream" must be proxied as a stream (event by event, usage
// read), not buffered whole and refused as invalid JSON.
func TestReviewDPStreamContentTypeIsCaseInsensitive(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "Text/Event-Stream; charset=utf-8")
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hello\"}}]}\n\n")
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":5}}\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(600_000_000), WeightedBurst: i64(10_000_000)})})
	resp := e.do("POST", "/v1/chat/completions", "key-a", hiStreamBody)
	b := readAll(t, resp)
	if resp.StatusCode != 200 || !strings.Contains(string(b), "hello") {
		t.Fatalf("got %d %s; want 200 with the stream", resp.StatusCode, b)
	}
	waitFor(t, "settled", func() bool { return e.reg.Tenant("a").Limiter.Snapshot(e.clock.Now()).InFlight == 0 })
	if got := 10_000_000 - e.tokensLeft("a"); got != 15 {
		t.Errorf("charged %d, want 15 (the stream's usage)", got)
	}
}

// TestReviewDPCompletionsBestOfCharged: on /v1/completions the provider
// generates best_of completions server side and bills all of them (the
// provider header reference: Azure's TPM estimate "includes prompt text,
// max_tokens and best_of"). A request with best_of 20 and max_tokens 100
// must reserve 20 x 100 output tokens, as n does, not 100.
func TestReviewDPCompletionsBestOfCharged(t *testing.T) {
	up := newUpstream(t, noUsageJSON)
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(600_000_000), WeightedBurst: i64(10_000_000)})})
	resp := e.do("POST", "/v1/completions", "key-a", completionsBody(10, 100, `,"best_of":20`))
	if b := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if got := 10_000_000 - e.tokensLeft("a"); got != 10+20*100 {
		t.Errorf("charged %d (no usage: the charge stands), want prompt 10 + best_of 20 x max_tokens 100 = 2010", got)
	}
}

// TestReviewDPCompletionsBestOfValidated: best_of must be a positive
// integer: 400 invalid_request naming best_of, nothing sent upstream.
func TestReviewDPCompletionsBestOfValidated(t *testing.T) {
	up := newUpstream(t, noUsageJSON)
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
	for _, v := range []string{`0`, `-1`, `"2"`, `1.5`} {
		resp := e.do("POST", "/v1/completions", "key-a", completionsBody(10, 100, `,"best_of":`+v))
		b := readAll(t, resp)
		if resp.StatusCode != 400 || decodeCode(b) != "invalid_request" || !strings.Contains(string(b), `"param":"best_of"`) {
			t.Errorf("best_of %s: %d %s; want 400 invalid_request param best_of", v, resp.StatusCode, b)
		}
	}
	if n := up.calls.Load(); n != 0 {
		t.Errorf("%d calls upstream, want 0", n)
	}
}

// TestReviewDPStreamCROnlyLineEnds: SSE lines may end in CR alone (WHATWG
// HTML "Server-sent events", event stream interpretation: CRLF, LF or CR).
// A stream whose lines end in CR must be proxied event by event with its
// usage read (charged 15), not read as one line that is only forwarded at
// the end and settled from no usage and no counted delta (the prompt alone).
func TestReviewDPStreamCROnlyLineEnds(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hello\"}}]}\r\r")
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":5}}\r\r")
		fmt.Fprint(w, "data: [DONE]\r\r")
	})
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(600_000_000), WeightedBurst: i64(10_000_000)})})
	resp := e.do("POST", "/v1/chat/completions", "key-a", hiStreamBody)
	b := readAll(t, resp)
	if resp.StatusCode != 200 || !strings.Contains(string(b), "hello") || strings.Contains(string(b), "usage") {
		t.Errorf("got %d %q; want 200, the content event, and no usage chunk (the client did not ask for it)", resp.StatusCode, b)
	}
	waitFor(t, "settled", func() bool { return e.reg.Tenant("a").Limiter.Snapshot(e.clock.Now()).InFlight == 0 })
	if got := 10_000_000 - e.tokensLeft("a"); got != 15 {
		t.Errorf("charged %d, want 15 (the stream's usage)", got)
	}
}

// TestReviewDPCRReader: crReader turns each lone CR into CRLF whatever the
// read sizes, keeps LF and CRLF line ends, and passes the rest through.
func TestReviewDPCRReader(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"a\nb\n\n", "a\nb\n\n"},
		{"a\r\nb\r\n\r\n", "a\r\nb\r\n\r\n"},
		{"a\rb\r\r", "a\r\nb\r\n\r\n"},
		{"a\r\rb\r\n\r", "a\r\n\r\nb\r\n\r\n"},
		{"\r\r\r\r\r\r", "\r\n\r\n\r\n\r\n\r\n\r\n"},
	} {
		for _, chunk := range []int{1, 2, 3, 1000} {
			for _, buf := range []int{1, 2, 5, 64} {
				cr := crReader{r: &chunkReader{s: c.in, n: chunk}}
				var got []byte
				p := make([]byte, buf)
				for i := 0; i < 1000; i++ {
					n, err := cr.Read(p)
					got = append(got, p[:n]...)
					if err != nil {
						break
					}
				}
				if string(got) != c.want {
					t.Errorf("%q (reads of %d, buffer %d): got %q, want %q", c.in, chunk, buf, got, c.want)
				}
			}
		}
	}
}

// chunkReader returns s n bytes at a time, then io.EOF.
type chunkReader struct {
	s string
	n int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if r.s == "" {
		return 0, io.EOF
	}
	k := copy(p, r.s[:min(r.n, len(r.s))])
	r.s = r.s[k:]
	return k, nil
}
