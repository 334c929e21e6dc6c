package gateway

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/tokencount"
)

// refEventUsage is how an event's usage was read with encoding/json before
// scanEvent (the reference scanEvent must agree with): the first data line
// holding a JSON object with a non-null usage whose prompt_tokens is not
// null; usageOnly when its choices are empty.
func refEventUsage(event []byte) (u limiter.Usage, usageOnly, ok bool) {
	if !bytes.Contains(event, []byte(`"usage"`)) {
		return u, false, false
	}
	for line := range bytes.Lines(event) {
		data, found := bytes.CutPrefix(trimEOL(line), []byte("data:"))
		if !found {
			continue
		}
		data = bytes.TrimSpace(data)
		if len(data) == 0 || data[0] != '{' {
			continue
		}
		var ch struct {
			Choices []json.RawMessage `json:"choices"`
			Usage   *usageJSON        `json:"usage"`
		}
		if json.Unmarshal(data, &ch) != nil || ch.Usage == nil || ch.Usage.PromptTokens == nil {
			continue
		}
		return ch.Usage.usage(), len(ch.Choices) == 0, true
	}
	return u, false, false
}

// refDeltaText is the generated text of an event as it was read with
// encoding/json before scanEvent: for every data line that decodes as a
// streamChunk, each choice's text, delta content, refusal, reasoning
// content, tool-call arguments and legacy function_call arguments, in
// that order.
func refDeltaText(event []byte) string {
	if !bytes.Contains(event, []byte(`"choices"`)) {
		return ""
	}
	var sb strings.Builder
	for line := range bytes.Lines(event) {
		data, found := bytes.CutPrefix(trimEOL(line), []byte("data:"))
		if !found {
			continue
		}
		data = bytes.TrimSpace(data)
		if len(data) == 0 || data[0] != '{' {
			continue
		}
		var ch streamChunk
		if json.Unmarshal(data, &ch) != nil {
			continue
		}
		for _, c := range ch.Choices {
			sb.WriteString(c.Text + c.Delta.Content + c.Delta.Refusal + c.Delta.ReasoningContent)
			for _, tc := range c.Delta.ToolCalls {
				sb.WriteString(tc.Function.Arguments)
			}
			sb.WriteString(c.Delta.FunctionCall.Arguments)
		}
	}
	return sb.String()
}

// checkScanEvent fails t when scanEvent's reading of event differs from
// encoding/json's (refEventUsage, refDeltaText).
func checkScanEvent(t *testing.T, event []byte) {
	t.Helper()
	var text []byte
	info := scanEvent(event, &text)
	u, usageOnly, ok := refEventUsage(event)
	if info.usage.Known != ok || (ok && (info.usage != u || info.usageOnly != usageOnly)) {
		t.Fatalf("event %q: usage %+v usageOnly %v; encoding/json: %+v %v (found %v)", event, info.usage, info.usageOnly, u, usageOnly, ok)
	}
	if want := refDeltaText(event); string(text) != want {
		t.Fatalf("event %q: text %q; encoding/json: %q", event, text, want)
	}
	if info2 := scanEvent(event, nil); info2 != info {
		t.Fatalf("event %q: without text %+v, with text %+v", event, info2, info)
	}
}

// streamChunkSeeds are data lines of the shapes providers send (OpenAI
// chat and completions, vLLM continuous usage, tool calls, reasoning) and
// unusual ones that scanChunk leaves to encoding/json.
var streamChunkSeeds = []struct {
	data string
	fast bool // read by scanChunk itself
}{
	{`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`, true},
	{`{"id":"chatcmpl-1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":" token1"},"finish_reason":null}]}`, true},
	{`{"id":"chatcmpl-1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`, true},
	{`{"id":"chatcmpl-1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"function_call":{"name":"get","arguments":"{\"a\":1}"}},"finish_reason":null}]}`, true},
	{`{"id":"chatcmpl-1","object":"chat.completion.chunk","model":"m","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":64,"total_tokens":84}}`, true},
	{`{"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}],"usage":{"prompt_tokens":20,"completion_tokens":1,"total_tokens":21}}`, true},
	{`{"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}],"usage":null}`, true},
	{`{"id":"c","choices":[{"index":0,"text":" once upon","logprobs":null,"finish_reason":null}],"model":"m"}`, true},
	{`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get","arguments":"{\"city\":"}}]}}]}`, true},
	{`{"choices":[{"index":0,"delta":{"reasoning_content":"think","content":"say","refusal":null}}]}`, true},
	{`{"choices":[{"index":0,"delta":{"content":"line\nbreak \u00e9 \ud83d\ude00 \"q\""}}]}`, true},
	{`{"choices":[{"index":0,"delta":{"content":"caf` + "\xc3\xa9" + ` bad` + "\xff" + `"}}]}`, true},
	{`{"choices":[{"index":0,"delta":{"Content":"folded key"}}]}`, false},
	{`{"choices":[{"index":0,"delta":{"content":"a","content":"b"}}]}`, false},
	{`{"choices":[{"index":0,"delta":{"content":5}}]}`, false},
	{`{"choices":[1,{"delta":{"content":"x"}}],"usage":{"prompt_tokens":1}}`, false},
	{`{"choices":[],"usage":{"prompt_tokens":20,"total_tokens":84}}`, true},
	{`{"choices":[],"usage":{"prompt_tokens":20,"total_tokens":"84"}}`, false},
	{`{"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":null,"total_tokens":21}}`, true},
	{`{"choices":null,"usage":{"prompt_tokens":3,"completion_tokens":null}}`, true},
	{`{"choices":[],"usage":{"prompt_tokens":1.5,"completion_tokens":2}}`, false},
	{`{"choices":[],"usage":{"prompt_tokens":99999999999999999999}}`, false},
	{`{"choices":[],"usage":{"prompt_tokens":-0,"completion_tokens":1e2}}`, false},
	{`{"choices":[],"us\u0061ge":{"prompt_tokens":7}, "usage":{"prompt_tokens":8}}`, false},
	{`{"Usage":{"prompt_tokens":7},"choices":[]}`, false},
	{`{"usage":{"prompt_tokens":1},"usage":{"completion_tokens":2}}`, false},
	{`{"choices":[{"delta":{"content":"x"}}],"x":[[[{"a":[1,true,false,null,"s"]}]]],"usage":{"prompt_tokens":2,"completion_tokens":1}}`, true},
	{`{"choices":[{"delta":{"content":"x"}}],"usage":{"prompt_tokens":2}} trailing`, false},
	{`{"choices":[{"delta":{"content":"x"}}`, false},
	{`{"choices":[{"delta":{"tool_calls":[null,{"function":null},{"function":{"arguments":null}},{"function":{"arguments":"a"}}]}}]}`, true},
	{`{"choices":[{"delta":{"tool_calls":{"function":{"arguments":"a"}}}}]}`, false},
	{`{"choices":[null,{"text":null,"delta":null}]}`, true},
	{`{"choices":"x","usage":{"prompt_tokens":1}}`, false},
	{`{"choices":[{"text":"a","delta":{"content":"b","tool_calls":[{"function":{"arguments":"c"}}],"refusal":"d","reasoning_content":"e"}}]}`, true},
	{`{"ſusage":1,"choices":[{"delta":{"content":"k"}}]}`, false},
	{`{"choices":[{"delta":{"conte\u006et":"esc"}}]}`, false},
	{`{"choices":[{"deep":` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `,"delta":{"content":"d"}}]}`, false},
}

// TestScanEventMatchesJSON: scanEvent reads every seed chunk, and events of
// several data lines, comments and [DONE], as encoding/json does.
func TestScanEventMatchesJSON(t *testing.T) {
	for _, s := range streamChunkSeeds {
		checkScanEvent(t, []byte("data: "+s.data+"\n\n"))
		checkScanEvent(t, []byte("data:"+s.data+"\r\n\r\n"))
	}
	for _, e := range []string{
		"data: [DONE]\n\n",
		": comment\nevent: x\ndata: " + streamChunkSeeds[1].data + "\ndata: " + streamChunkSeeds[3].data + "\n\n",
		"data: " + streamChunkSeeds[5].data + "\ndata: " + streamChunkSeeds[4].data + "\n\n",
		"data: " + streamChunkSeeds[18].data + "\ndata: " + streamChunkSeeds[15].data + "\n\n",
	} {
		checkScanEvent(t, []byte(e))
	}
}

// TestScanChunkFastPath: the shapes providers send are read by scanChunk
// itself, without encoding/json, and unusual ones are left to it.
func TestScanChunkFastPath(t *testing.T) {
	for _, s := range streamChunkSeeds {
		var text []byte
		var r chunkResult
		if ok := scanChunk([]byte(s.data), &text, &r); ok != s.fast {
			t.Errorf("%.80q: scanChunk ok %v, want %v", s.data, ok, s.fast)
		}
	}
}

// FuzzScanEvent compares scanEvent with encoding/json (refEventUsage,
// refDeltaText) on random data lines: the same usage and the same text.
func FuzzScanEvent(f *testing.F) {
	for _, s := range streamChunkSeeds {
		f.Add(s.data)
	}
	f.Fuzz(func(t *testing.T, s string) {
		checkScanEvent(t, []byte("data: "+s+"\n\n"))
		var text []byte
		var r chunkResult
		if scanChunk([]byte(s), &text, &r) {
			var want []byte
			if got := decodeChunkJSON([]byte(s), &want); got != r || !bytes.Equal(text, want) {
				t.Fatalf("%q: scanChunk %+v %q, encoding/json %+v %q", s, r, text, got, want)
			}
		}
	})
}

// TestStreamTextCountsJoined: the deferred count of a stream's text is the
// count of the deltas joined, and a text beyond streamTextBatch is counted
// in batches (at most one token more per batch boundary).
func TestStreamTextCountsJoined(t *testing.T) {
	var s streamText
	pieces := []string{" the", " qu", "ick", " brown", " fox"}
	for _, p := range pieces {
		s.buf = append(s.buf, p...)
		s.add()
	}
	want, _ := tokencount.Text(strings.Join(pieces, ""))
	if got := s.count(); got != want || want != 4 {
		t.Fatalf("count %d, tokens of the joined text %d (want 4)", got, want)
	}
	if got := s.count(); got != want {
		t.Fatalf("second count %d, want %d", got, want)
	}
	var big streamText
	word := " lorem"
	n := 0
	for len(big.buf) < streamTextBatch-len(word) {
		big.buf = append(big.buf, word...)
		big.add()
		n++
	}
	if len(big.buf) == 0 {
		t.Fatal("counted before the batch was full")
	}
	big.buf = append(big.buf, word...)
	big.add()
	n++
	if len(big.buf) != 0 {
		t.Fatalf("%d bytes kept beyond the batch of %d", len(big.buf), streamTextBatch)
	}
	all, _ := tokencount.Text(strings.Repeat(word, n))
	if got := big.count(); got < all || got > all+1 {
		t.Fatalf("batched count %d, joined %d", got, all)
	}
}
