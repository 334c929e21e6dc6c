package gateway

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// faultyTransport calls the provider through http.DefaultTransport and
// panics, either in RoundTrip itself or in the second Read of the
// response body (mid-stream).
type faultyTransport struct{ inBody bool }

func (f faultyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if !f.inBody {
		panic("fault injected in RoundTrip")
	}
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err == nil {
		resp.Body = &panickyBody{ReadCloser: resp.Body}
	}
	return resp, err
}

type panickyBody struct {
	io.ReadCloser
	reads int
}

func (b *panickyBody) Read(p []byte) (int, error) {
	if b.reads++; b.reads > 1 {
		panic("fault injected in the response body")
	}
	return b.ReadCloser.Read(p)
}

// TestPanicInCallReleasesEverything: a panic while a call is in flight (in
// the transport, or while a stream is relayed) is recovered by the HTTP
// server, and the call's deferred settlement still returns its tenant's
// concurrency slot and KV blocks and the pool's upstream slot, so the
// tenant (concurrency 1) is admitted again. A panic before the provider
// answered refunds the whole charge.
func TestPanicInCallReleasesEverything(t *testing.T) {
	for _, tc := range []struct {
		name   string
		inBody bool
		body   string
	}{
		{"round trip", false, completionsBody(10, 100, "")},
		{"mid-stream", true, completionsBody(10, 100, `,"stream":true`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, sseStream(200, 10))
			e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(6000), WeightedBurst: i64(1000),
				MaxConcurrent: i64(1), MaxKVBlocks: i64(1000)})}, withTransport(faultyTransport{inBody: tc.inBody}))
			for range 2 { // the second is admitted only if the first gave its slots back
				req, err := http.NewRequest("POST", e.srv.URL+"/v1/completions", strings.NewReader(tc.body))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Authorization", "Bearer key-a")
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body) // cut off by the panic
					resp.Body.Close()
					if resp.StatusCode == http.StatusTooManyRequests {
						t.Fatal("refused 429: the panicked call kept its slot")
					}
				}
				ta := e.reg.Tenant("a")
				waitFor(t, "the call's release", func() bool {
					s := ta.Limiter.Snapshot(e.clock.Now())
					return s.InFlight == 0 && s.KVBlocks == 0 && len(e.gw.sem) == 0
				})
				if s := ta.Limiter.Snapshot(e.clock.Now()); !tc.inBody && s.TokensRemaining != 1000 {
					t.Errorf("tokens %d after a panic before the answer, want 1000 (refunded)", s.TokensRemaining)
				} else if s.TokensRemaining > 1000 {
					t.Errorf("tokens %d, above the burst", s.TokensRemaining)
				}
			}
		})
	}
}

// TestPanicInBatchJobFailsTheJob: a panic while a batch job's call is in
// flight (in the transport) fails that job with internal_error, refunds its
// charge and gives its slots back, and the scheduler goes on: the next job
// runs (and fails the same way) instead of the process crashing, which the
// dispatcher's goroutine, unlike the HTTP server's handlers, had no
// recovery for.
func TestPanicInBatchJobFailsTheJob(t *testing.T) {
	up := newUpstream(t, okJSON(10, 5))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(6000), WeightedBurst: i64(1000),
		MaxConcurrent: i64(1), MaxKVBlocks: i64(1000)})}, withTransport(faultyTransport{}))
	for range 2 {
		j := e.submit("key-a", jobBody(10, 100, ""))
		waitFor(t, "the job's end", func() bool { return e.storeStatus(j.ID) == jobs.StatusFailed })
		got, err := e.store.Get(j.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Error == nil || got.Error.Code != "internal_error" || got.Error.Message != "The scheduler failed while running the job; it was not retried." {
			t.Fatalf("job error %+v, want internal_error", got.Error)
		}
		ta := e.reg.Tenant("a")
		waitFor(t, "the call's release", func() bool {
			s := ta.Limiter.Snapshot(e.clock.Now())
			return s.InFlight == 0 && s.KVBlocks == 0 && len(e.gw.sem) == 0
		})
		if s := ta.Limiter.Snapshot(e.clock.Now()); s.TokensRemaining != 1000 {
			t.Errorf("tokens %d after a panic before the answer, want 1000 (refunded)", s.TokensRemaining)
		}
	}
	if up.calls.Load() != 0 {
		t.Errorf("%d upstream calls, want 0 (the transport panicked first)", up.calls.Load())
	}
}
