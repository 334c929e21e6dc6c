package gateway

import (
	"net/http"
	"testing"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// TestProviderAccountHeadersNotPassedToTenants: the provider answers with
// the organization and project of the pool's key and sets a cookie for the
// pool's client (as OpenAI and Anthropic do). A tenant shares the pool and
// must not learn its account: those fields are dropped, on a success and
// on a provider error alike, while per-call fields (X-Request-Id,
// Openai-Processing-Ms) still pass.
func TestProviderAccountHeadersNotPassedToTenants(t *testing.T) {
	for _, status := range []int{http.StatusOK, http.StatusBadRequest} {
		ok := okJSON(10, 5)
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
			h := w.Header()
			h.Set("Openai-Organization", "pool-account-org")
			h.Set("Openai-Project", "proj_pool")
			h.Set("Anthropic-Organization-Id", "org-uuid")
			h.Set("Set-Cookie", "__cf_bm=pool-session; path=/; domain=.api.openai.com")
			h.Set("X-Request-Id", "req_123")
			h.Set("Openai-Processing-Ms", "42")
			if status != http.StatusOK {
				h.Set("Content-Type", "application/json")
				w.WriteHeader(status)
				_, _ = w.Write([]byte(`{"error":{"message":"bad","type":"invalid_request_error"}}`))
				return
			}
			ok(w, r, body)
		})
		e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
		resp := e.do("POST", "/v1/completions", "key-a", completionsBody(10, 20, ""))
		readAll(t, resp)
		if resp.StatusCode != status {
			t.Fatalf("status %d, want %d", resp.StatusCode, status)
		}
		for _, k := range []string{"Openai-Organization", "Openai-Project", "Anthropic-Organization-Id", "Set-Cookie"} {
			if v := resp.Header.Values(k); len(v) > 0 {
				t.Errorf("provider %d: %s %q passed to the tenant; want it dropped", status, k, v)
			}
		}
		if resp.Header.Get("X-Request-Id") != "req_123" || resp.Header.Get("Openai-Processing-Ms") != "42" {
			t.Errorf("provider %d: per-call headers X-Request-Id %q, Openai-Processing-Ms %q; want them passed", status,
				resp.Header.Get("X-Request-Id"), resp.Header.Get("Openai-Processing-Ms"))
		}
	}
}
