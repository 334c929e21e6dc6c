package gateway

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// BenchmarkProxy compares one non-streaming call through the gateway
// (identification, parsing and token estimate, admission, throttle,
// proxying, usage refund) with a plain httputil.ReverseProxy to the same
// loopback upstream (brief "performance targets": p50 within 1.25x).
// Compare the ns/op of the two sub-benchmarks from one run.
func BenchmarkProxy(b *testing.B) {
	up := newUpstream(b, okJSON(12, 5))
	body := `{"model":"` + testModel + `","messages":[{"role":"user","content":"Summarise the quarterly report in three bullet points."}],"max_tokens":64}`
	run := func(b *testing.B, url, key string) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+key)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Errorf("status %d", resp.StatusCode)
					return
				}
			}
		})
	}
	b.Run("reverseproxy", func(b *testing.B) {
		u, _ := url.Parse(up.srv.URL)
		srv := httptest.NewServer(httputil.NewSingleHostReverseProxy(u))
		defer srv.Close()
		run(b, srv.URL, "any")
	})
	b.Run("gateway", func(b *testing.B) {
		e := newEnv(b, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
		run(b, e.srv.URL, "key-a")
	})
}
