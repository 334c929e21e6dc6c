package gateway

import (
	"net/http"
	"testing"
	"time"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// TestInputOutputOnlyFiguresAreObserved: a provider answer carrying only
// Anthropic's input-tokens and output-tokens triplets (no tokens or requests
// triplet) is observed by the model's throttle: after one saying 0 input
// tokens left until +30 s, the next call is not sent (503
// upstream_quota_exhausted, one upstream call), instead of being sent into
// the exhausted quota because the answer was dropped for lacking the tokens
// and requests figures.
func TestInputOutputOnlyFiguresAreObserved(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		reset := t0.Add(30 * time.Second).Format(time.RFC3339)
		h := w.Header()
		h.Set("anthropic-ratelimit-input-tokens-limit", "40000")
		h.Set("anthropic-ratelimit-input-tokens-remaining", "0")
		h.Set("anthropic-ratelimit-input-tokens-reset", reset)
		h.Set("anthropic-ratelimit-output-tokens-limit", "8000")
		h.Set("anthropic-ratelimit-output-tokens-remaining", "8000")
		h.Set("anthropic-ratelimit-output-tokens-reset", reset)
		okJSON(10, 5)(w, r, body)
	})
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(100000), RequestsPerMinute: i64(600)})},
		withPool(func(p *registry.PoolPolicy) { p.Dialect = "Anthropic" }))
	resp := e.do("POST", "/v1/completions", "key-a", completionsBody(100, 50, ""))
	readAll(t, resp)
	if resp.StatusCode != 200 {
		t.Fatalf("first call: %d, want 200", resp.StatusCode)
	}
	resp = e.do("POST", "/v1/completions", "key-a", completionsBody(100, 50, ""))
	body := decode[errorBody](t, resp)
	if resp.StatusCode != 503 || body.Error.Code != "upstream_quota_exhausted" || up.calls.Load() != 1 {
		t.Fatalf("second call: %d %+v after %d upstream calls; want 503 upstream_quota_exhausted and 1 (input tokens exhausted)",
			resp.StatusCode, body.Error, up.calls.Load())
	}
}
