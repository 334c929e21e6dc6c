package gateway

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// A usage without completion_tokens is settled with total_tokens minus
// prompt_tokens as its output (OpenAI: total = prompt + completion), not
// with no output: a provider that sends only the prompt and the total was
// refunded the whole output reservation. A total_tokens that is not an
// integer (or below the prompt) is ignored without losing the rest of the
// usage. Charged in weighted tokens (the test pool weighs input and output 1).
func TestUsageOutputFromTotalTokens(t *testing.T) {
	for _, c := range []struct {
		name, usage string
		want        int64
	}{
		{"total only", `{"prompt_tokens":10,"total_tokens":15}`, 10 + 5},
		{"completion wins", `{"prompt_tokens":10,"completion_tokens":2,"total_tokens":15}`, 10 + 2},
		{"odd total ignored", `{"prompt_tokens":10,"completion_tokens":2,"total_tokens":"15"}`, 10 + 2},
		{"fractional total ignored", `{"prompt_tokens":10,"total_tokens":15.5}`, 10},
		{"total below prompt", `{"prompt_tokens":10,"total_tokens":7}`, 10},
		{"null completion", `{"prompt_tokens":10,"completion_tokens":null,"total_tokens":13}`, 10 + 3},
		{"Total_Tokens folded", `{"prompt_tokens":10,"Total_Tokens":14}`, 10 + 4},
	} {
		t.Run(c.name+"/json", func(t *testing.T) {
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprintf(w, `{"id":"cmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":%s}`, c.usage)
			})
			e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(600_000_000), WeightedBurst: i64(10_000_000)})})
			resp := e.do("POST", "/v1/chat/completions", "key-a", `{"model":"`+testModel+`","messages":[{"role":"user","content":"hi"}],"max_tokens":1000}`)
			readAll(t, resp)
			waitFor(t, "settled", func() bool { return e.reg.Tenant("a").Limiter.Snapshot(e.clock.Now()).InFlight == 0 })
			if got := 10_000_000 - e.tokensLeft("a"); resp.StatusCode != 200 || got != c.want {
				t.Errorf("status %d, charged %d, want 200, %d", resp.StatusCode, got, c.want)
			}
		})
		t.Run(c.name+"/stream", func(t *testing.T) {
			_, charged := streamEvents(t, []string{
				`{"choices":[{"index":0,"delta":{"content":"hello"}}]}`,
				`{"choices":[],"usage":` + c.usage + `}`,
				"[DONE]",
			}, hiStreamBody)
			if charged != c.want {
				t.Errorf("charged %d, want %d", charged, c.want)
			}
		})
	}
}
