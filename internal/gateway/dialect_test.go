package gateway

import (
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// TestPoolDialectHintAndMalformedHeaders: the provider answers with OpenAI
// figures (999,000 tokens left), a proxy's classic X-RateLimit-Remaining of
// 0 and one malformed OpenAI value. With spec.upstream.dialect OpenAI the
// classic figure is ignored (requests remaining stays the OpenAI 9,999);
// with Auto the most restrictive figure wins (0 requests). Either way the
// malformed value is counted once per response in
// upstream_headers_malformed_total.
func TestPoolDialectHintAndMalformedHeaders(t *testing.T) {
	for _, tc := range []struct {
		dialect      string
		wantRequests int64
	}{{"OpenAI", 9999}, {"Auto", 0}} {
		t.Run(tc.dialect, func(t *testing.T) {
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				w.Header().Set("X-RateLimit-Limit", "100")
				w.Header().Set("X-RateLimit-Remaining", "0")
				w.Header().Set("X-RateLimit-Reset", "30")
				quotaHeaders(w.Header())
				w.Header().Set("x-ratelimit-reset-requests", "soon") // malformed
				okJSON(10, 20)(&keepHeaders{w}, r, body)
			})
			e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})},
				withPool(func(p *registry.PoolPolicy) { p.Dialect = tc.dialect }))
			resp := e.do(http.MethodPost, "/v1/chat/completions", "key-a", chatBody(100))
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			st := e.reg.Model(testModel).Throttle.Status(e.clock.Now())
			if st.RequestsRemaining != tc.wantRequests {
				t.Errorf("requests remaining = %d, want %d", st.RequestsRemaining, tc.wantRequests)
			}
			if got := testutil.ToFloat64(e.gw.metrics.UpstreamHeadersMalformed.WithLabelValues(testModel)); got != 1 {
				t.Errorf("upstream_headers_malformed_total = %v, want 1", got)
			}
		})
	}
}

// keepHeaders is a ResponseWriter whose headers okJSON cannot overwrite
// (its Header returns a throwaway copy).
type keepHeaders struct{ http.ResponseWriter }

func (k *keepHeaders) Header() http.Header { return k.ResponseWriter.Header().Clone() }
