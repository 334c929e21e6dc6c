package gateway

import (
	"net/http"
	"strings"
	"testing"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// TestRateLimitGroupPausesEveryMember: testModel and gpt-test-snapshot share
// the provider rate limit "g" (ProviderPool spec.models[].rateLimitGroup),
// gpt-other has its own. A 429 with Retry-After 20 for testModel pauses
// gpt-test-snapshot too (503 upstream_quota_exhausted, no
// upstream call, the Retry-After of testModel's own paused answer), while
// gpt-other is still sent.
func TestRateLimitGroupPausesEveryMember(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if strings.Contains(string(body), `"model":"`+testModel+`"`) {
			w.Header().Set("Retry-After", "20")
			w.WriteHeader(429)
			w.Write([]byte(`{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}`))
			return
		}
		okJSON(10, 5)(w, r, body)
	})
	limits := limiter.Limits{WeightedPerMinute: i64(100000), RequestsPerMinute: i64(600)}
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limits)}, withPool(func(p *registry.PoolPolicy) {
		p.Models = []registry.ModelPolicy{
			{Name: testModel, TokensPerMinute: 1000000, RateLimitGroup: "g"},
			{Name: "gpt-test-snapshot", TokensPerMinute: 1000000, RateLimitGroup: "g"},
			{Name: "gpt-other", TokensPerMinute: 1000000},
		}
	}))
	resp := e.do("POST", "/v1/completions", "key-a", completionsBody(100, 50, ""))
	if body := decode[errorBody](t, resp); resp.StatusCode != 503 || body.Error.Code != "upstream_quota_exhausted" {
		t.Fatalf("first call: %d %+v, want the provider's 429 as 503 upstream_quota_exhausted", resp.StatusCode, body.Error)
	}
	model := func(name string) string {
		return strings.Replace(completionsBody(100, 50, ""), `"model":"`+testModel+`"`, `"model":"`+name+`"`, 1)
	}
	// testModel is paused now; its member answers exactly as it does.
	resp = e.do("POST", "/v1/completions", "key-a", completionsBody(100, 50, ""))
	readAll(t, resp)
	paused := resp.Header.Get("Retry-After")
	if resp.StatusCode != 503 || paused == "" || up.calls.Load() != 1 {
		t.Fatalf("paused model: %d Retry-After %q after %d upstream calls; want 503 with a Retry-After and 1", resp.StatusCode, paused, up.calls.Load())
	}
	resp = e.do("POST", "/v1/completions", "key-a", model("gpt-test-snapshot"))
	body := decode[errorBody](t, resp)
	if resp.StatusCode != 503 || body.Error.Code != "upstream_quota_exhausted" || resp.Header.Get("Retry-After") != paused || up.calls.Load() != 1 {
		t.Fatalf("same group: %d %+v Retry-After %q after %d upstream calls; want 503 upstream_quota_exhausted, %s, 1 (paused)",
			resp.StatusCode, body.Error, resp.Header.Get("Retry-After"), up.calls.Load(), paused)
	}
	resp = e.do("POST", "/v1/completions", "key-a", model("gpt-other"))
	readAll(t, resp)
	if resp.StatusCode != 200 || up.calls.Load() != 2 {
		t.Fatalf("other model: %d after %d upstream calls; want 200 and 2", resp.StatusCode, up.calls.Load())
	}
}
