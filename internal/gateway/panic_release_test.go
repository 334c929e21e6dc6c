package gateway

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/fairshare-dev/fairshare/internal/tokencount"

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

// scriptedStream is a provider's 200 event stream that yields events, one
// per Read, then panics (a fault of the scheduler's own code mid-stream).
type scriptedStream struct{ events []string }

func (s scriptedStream) RoundTrip(r *http.Request) (*http.Response, error) {
	_, _ = io.Copy(io.Discard, r.Body)
	h := http.Header{}
	h.Set("Content-Type", "text/event-stream")
	return &http.Response{StatusCode: 200, Header: h, Body: &eventsThenPanic{events: s.events}, Request: r}, nil
}

type eventsThenPanic struct{ events []string }

func (b *eventsThenPanic) Read(p []byte) (int, error) {
	if len(b.events) == 0 {
		panic("fault injected after the events")
	}
	n := copy(p, b.events[0])
	b.events[0] = b.events[0][n:]
	if b.events[0] == "" {
		b.events = b.events[1:]
	}
	return n, nil
}

func (b *eventsThenPanic) Close() error { return nil }

// scriptedBody is a provider's 200 JSON answer whose body panics on read.
type scriptedBody struct{}

func (scriptedBody) RoundTrip(r *http.Request) (*http.Response, error) {
	_, _ = io.Copy(io.Discard, r.Body)
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	return &http.Response{StatusCode: 200, Header: h, Body: &eventsThenPanic{}, Request: r}, nil
}

// TestPanicAfterAnswerKeepsWhatWasUsed: a panic after the provider
// answered 200 does not refund the call as if it had never been sent. A
// stream broken by a panic after three deltas is settled like a cut stream,
// from the prompt and the output the client was sent (BC-23): 10 prompt
// tokens plus the deltas' tokens; a JSON answer whose body panics keeps the
// charge (prompt 10 + max_tokens 100), its usage being unknown (BC-28a).
// Before, both were refunded in full: each such panic gave the tenant a
// free call the provider billed.
func TestPanicAfterAnswerKeepsWhatWasUsed(t *testing.T) {
	deltas := []string{" alpha", " beta", " gamma"}
	var events []string
	for _, d := range deltas {
		events = append(events, `data: {"id":"c","choices":[{"index":0,"delta":{"content":"`+d+`"}}]}`+"\n\n")
	}
	out, err := tokencount.Text(strings.Join(deltas, ""))
	if err != nil || out < 3 {
		t.Fatalf("tokens of the deltas: %d %v", out, err)
	}
	for _, tc := range []struct {
		name string
		rt   http.RoundTripper
		body string
		used int64
	}{
		{"stream", scriptedStream{events: events}, completionsBody(10, 100, `,"stream":true`), 10 + out},
		{"json", scriptedBody{}, completionsBody(10, 100, ""), 110},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, okJSON(10, 5)) // not called: the transport answers
			e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(6000), WeightedBurst: i64(1000),
				MaxConcurrent: i64(1), MaxKVBlocks: i64(1000)})}, withTransport(tc.rt))
			req, err := http.NewRequest("POST", e.srv.URL+"/v1/completions", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer key-a")
			var got []byte
			if resp, err := http.DefaultClient.Do(req); err == nil { // the JSON answer's connection is cut
				got, _ = io.ReadAll(resp.Body) // cut off by the panic
				resp.Body.Close()
			}
			if tc.name == "stream" && !bytes.Contains(got, []byte(" gamma")) {
				t.Errorf("client got %q, want the three deltas", got)
			}
			ta := e.reg.Tenant("a")
			waitFor(t, "the call's release", func() bool {
				s := ta.Limiter.Snapshot(e.clock.Now())
				return s.InFlight == 0 && s.KVBlocks == 0 && len(e.gw.sem) == 0
			})
			if s := ta.Limiter.Snapshot(e.clock.Now()); s.TokensRemaining != 1000-tc.used {
				t.Errorf("tokens left %d, want %d (1000 - %d used)", s.TokensRemaining, 1000-tc.used, tc.used)
			}
		})
	}
}

// TestPanicAfterAnswerInBatchJobKeepsCharge: a batch job whose provider
// answered 200 and whose body then panics fails with internal_error and
// keeps its charge (prompt 10 + max_tokens 100; the usage is unknown,
// BC-28a) instead of being refunded as if it had not been sent.
func TestPanicAfterAnswerInBatchJobKeepsCharge(t *testing.T) {
	up := newUpstream(t, okJSON(10, 5))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(6000), WeightedBurst: i64(1000),
		MaxConcurrent: i64(1), MaxKVBlocks: i64(1000)})}, withTransport(scriptedBody{}))
	j := e.submit("key-a", jobBody(10, 100, ""))
	waitFor(t, "the job's end", func() bool { return e.storeStatus(j.ID) == jobs.StatusFailed })
	if got, err := e.store.Get(j.ID); err != nil || got.Error == nil || got.Error.Code != "internal_error" {
		t.Fatalf("job %+v %v, want internal_error", got.Error, err)
	}
	ta := e.reg.Tenant("a")
	waitFor(t, "the call's release", func() bool {
		s := ta.Limiter.Snapshot(e.clock.Now())
		return s.InFlight == 0 && s.KVBlocks == 0 && len(e.gw.sem) == 0
	})
	if s := ta.Limiter.Snapshot(e.clock.Now()); s.TokensRemaining != 890 {
		t.Errorf("tokens left %d, want 890 (the charge of 110 kept)", s.TokensRemaining)
	}
}
