package gateway

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/tokencount"
)

// TestPromptMemberNamesExact: admission counts the members the provider
// reads, whose names are case-sensitive. A message's long "content" next to
// a short "Content", or a content part's long "text" next to an empty
// "TEXT", is counted by the long one: over the tenant's burst, 413 before
// any call, nothing charged. (encoding/json's case-insensitive struct
// matching once counted the short one, so the call went through charged
// 12 weighted tokens while the provider read 60,000 bytes.)
func TestPromptMemberNamesExact(t *testing.T) {
	huge := strings.Repeat("hello world ", 5000)
	for name, msg := range map[string]string{
		"content and Content": `{"role":"user","content":"` + huge + `","Content":"hi"}`,
		"text and TEXT part":  `{"role":"user","content":[{"type":"text","text":"` + huge + `","TEXT":""}]}`,
		"escaped content key": `{"role":"user","\u0063ontent":"` + huge + `","Content":"hi"}`,
	} {
		t.Run(name, func(t *testing.T) {
			up := newUpstream(t, okJSON(5, 5))
			e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(600), WeightedBurst: i64(100)})})
			resp := e.do("POST", "/v1/chat/completions", "key-a", `{"model":"`+testModel+`","max_tokens":5,"messages":[`+msg+`]}`)
			if st, code := errorCode(t, resp); st != 413 || code != codeRequestTooLarge {
				t.Errorf("got %d %s, want 413 %s", st, code, codeRequestTooLarge)
			}
			if up.calls.Load() != 0 || e.tokensLeft("a") != 100 {
				t.Errorf("upstream calls %d, bucket %d; want 0 and 100", up.calls.Load(), e.tokensLeft("a"))
			}
		})
	}
}

// TestNegativeUsageKeepsTheCharge: a 200 whose usage has a negative count
// is settled as unknown usage: the charge (prompt 100 + max_tokens 1000)
// stands instead of a refund of everything (the counts were once clamped to
// zero tokens used). A job answered so records no usage (its record once
// showed the provider's negative count while the charge stood).
func TestNegativeUsageKeepsTheCharge(t *testing.T) {
	for _, u := range [][2]int64{{-5, 10}, {100, -1}} {
		up := newUpstream(t, okJSON(u[0], u[1]))
		e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(600), WeightedBurst: i64(10000)})})
		resp := e.do("POST", "/v1/completions", "key-a", completionsBody(100, 1000, ""))
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("usage %v: status %d", u, resp.StatusCode)
		}
		if got := e.tokensLeft("a"); got != 10000-1100 {
			t.Errorf("usage %v: bucket %d, want %d (the charge of 1100 stands)", u, got, 10000-1100)
		}
		id := e.submit("key-a", jobBody(100, 1000, "")).ID
		waitFor(t, "the job to succeed", func() bool { return e.storeStatus(id) == jobs.StatusSucceeded })
		if j := e.job("key-a", id); j.Usage != nil || !strings.Contains(string(j.Response), `"usage"`) {
			t.Errorf("usage %v: job usage %+v, want none (the response %s is kept as sent)", u, j.Usage, j.Response)
		}
		if got := e.tokensLeft("a"); got != 10000-2*1100 {
			t.Errorf("usage %v: bucket %d after the job, want %d (its charge of 1100 stands)", u, got, 10000-2*1100)
		}
	}
}

// TestStreamEventBounded: a provider that sends a server-sent event larger
// than MaxResponseBytes (here a line that never ends) gets the stream broken
// off once the bound is passed, as a provider failure: the client has the
// events before it and then a truncated response, and the gateway does not
// buffer the rest (it once read the line until the upstream timeout,
// without bound).
func TestStreamEventBounded(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n")
		fmt.Fprint(w, "data: "+strings.Repeat("x", 1<<20))
		w.(http.Flusher).Flush()
		<-r.Context().Done() // until the gateway gives up on the call
	})
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(600000), WeightedBurst: i64(10000)})},
		withMaxResponseBytes(64<<10))
	resp := e.do("POST", "/v1/completions", "key-a", completionsBody(10, 100, `,"stream":true`))
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil {
		t.Errorf("the stream ended cleanly; want it broken off")
	}
	if !bytes.HasPrefix(b, []byte("data: {\"choices\"")) || bytes.Contains(b, []byte("xxxx")) {
		t.Errorf("client got %.80q (%d bytes); want the first event and none of the oversized one", b, len(b))
	}
}

// TestToolTokensCharged: tool definitions (tools, legacy functions) and the
// tool calls of assistant messages are prompt tokens, counted by their
// compact JSON text (tokencount.JSONText): a call is charged for them, and
// one whose tools alone exceed the tenant's burst is refused with 413
// before any call (they were once not counted at all: 10,000 tokens of
// tool definitions were charged as 12).
func TestToolTokensCharged(t *testing.T) {
	huge := strings.Repeat("hello world ", 5000)
	user := `{"role":"user","content":"hi"}`
	for name, body := range map[string]string{
		"tools":      `"messages":[` + user + `],"tools":[{"type":"function","function":{"name":"f","description":"` + huge + `"}}]`,
		"functions":  `"messages":[` + user + `],"functions":[{"name":"f","description":"` + huge + `"}]`,
		"tool_calls": `"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"` + huge + `"}}]},` + user + `]`,
	} {
		t.Run("refused/"+name, func(t *testing.T) {
			up := newUpstream(t, okJSON(5, 5))
			e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(600), WeightedBurst: i64(100)})})
			resp := e.do("POST", "/v1/chat/completions", "key-a", `{"model":"`+testModel+`","max_tokens":5,`+body+`}`)
			if st, code := errorCode(t, resp); st != 413 || code != codeRequestTooLarge {
				t.Errorf("got %d %s, want 413 %s", st, code, codeRequestTooLarge)
			}
			if up.calls.Load() != 0 {
				t.Errorf("upstream calls %d, want 0", up.calls.Load())
			}
		})
	}
	t.Run("charged", func(t *testing.T) {
		// No usage in the answer: the charge stands and can be read off the bucket.
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"choices":[]}`)
		})
		e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(600), WeightedBurst: i64(100000)})})
		tools := `[ {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}} ]`
		calls := `[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]`
		msgs := `[{"role":"assistant","content":null,"tool_calls":` + calls + `},{"role":"user","content":"hi"}]`
		resp := e.do("POST", "/v1/chat/completions", "key-a", `{"model":"`+testModel+`","max_tokens":5,"messages":`+msgs+`,"tools":`+tools+`}`)
		resp.Body.Close()
		toolText := `[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]` // compact
		toolTokens, _ := tokencount.Text(toolText)
		callTokens, _ := tokencount.Text(calls)
		hi, _ := tokencount.Text("hi")
		prompt := tokencount.ReplyPrimingTokens + 2*tokencount.MessageOverheadTokens + hi + callTokens + toolTokens
		if got, want := 100000-e.tokensLeft("a"), prompt+5; resp.StatusCode != 200 || got != want {
			t.Errorf("status %d, charged %d; want 200, %d (prompt %d with tools %d and calls %d, + max_tokens 5)",
				resp.StatusCode, got, want, prompt, toolTokens, callTokens)
		}
		if toolTokens < 10 || callTokens < 10 {
			t.Errorf("tool tokens %d, call tokens %d: the texts were not counted", toolTokens, callTokens)
		}
	})
}

// TestMethodNotAllowed: a known path with another method is 405
// method_not_allowed with the route's methods in Allow (RFC 9110 section
// 15.5.6); an unknown path stays 404 (both were once 404 "Unknown path").
func TestMethodNotAllowed(t *testing.T) {
	e := newEnv(t, newUpstream(t, okJSON(5, 5)), []registry.TenantPolicy{tenant("a", limiter.Limits{})})
	for _, c := range []struct {
		method, path, allow string
		status              int
		code                string
	}{
		{"GET", "/v1/chat/completions", "POST", 405, codeMethodNotAllowed},
		{"PUT", "/v1/jobs/job-1", "GET, HEAD, DELETE", 405, codeMethodNotAllowed},
		{"DELETE", "/v1/jobs", "GET, HEAD, POST", 405, codeMethodNotAllowed},
		{"GET", "/v1/jobs/bulk", "POST", 405, codeMethodNotAllowed},
		{"HEAD", "/v1/jobs/bulk", "POST", 405, ""},
		{"DELETE", "/v1/jobs/bulk", "POST", 405, codeMethodNotAllowed},
		{"PUT", "/v1/jobs/bulk", "POST", 405, codeMethodNotAllowed},
		{"GET", "/v1/nope", "", 404, "not_found"},
	} {
		if c.method == http.MethodHead { // no body to read a code from
			resp := e.do(c.method, c.path, "key-a", "")
			resp.Body.Close()
			if allow := resp.Header.Get("Allow"); resp.StatusCode != c.status || allow != c.allow {
				t.Errorf("%s %s: %d Allow %q; want %d Allow %q", c.method, c.path, resp.StatusCode, allow, c.status, c.allow)
			}
			continue
		}
		resp := e.do(c.method, c.path, "key-a", "")
		allow := resp.Header.Get("Allow")
		if st, code := errorCode(t, resp); st != c.status || code != c.code || allow != c.allow {
			t.Errorf("%s %s: %d %s Allow %q; want %d %s Allow %q", c.method, c.path, st, code, allow, c.status, c.code, c.allow)
		}
	}
}
