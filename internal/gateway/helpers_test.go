package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fairshare-dev/fairshare/internal/fairqueue"
	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/metrics"
	"github.com/fairshare-dev/fairshare/internal/providerkey"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// t0 is NOW of the regression cases: 2026-01-01T00:00:00Z.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

const testModel = "gpt-test"

func i64(v int64) *int64 { return &v }

// upstream is a fake provider on 127.0.0.1 that records calls.
type upstream struct {
	srv     *httptest.Server
	calls   atomic.Int64
	mu      sync.Mutex
	bodies  [][]byte
	headers []http.Header
	handle  func(w http.ResponseWriter, r *http.Request, body []byte)
}

func newUpstream(t testing.TB, handle func(w http.ResponseWriter, r *http.Request, body []byte)) *upstream {
	t.Helper()
	u := &upstream{handle: handle}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u.calls.Add(1)
		u.mu.Lock()
		u.bodies = append(u.bodies, b)
		u.headers = append(u.headers, r.Header.Clone())
		u.mu.Unlock()
		u.handle(w, r, b)
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *upstream) lastBody() map[string]any {
	u.mu.Lock()
	defer u.mu.Unlock()
	var m map[string]any
	_ = json.Unmarshal(u.bodies[len(u.bodies)-1], &m)
	return m
}

// okJSON answers a non-streaming completion with the given usage and
// OpenAI quota headers (so the throttle has figures).
func okJSON(prompt, completion int64) func(w http.ResponseWriter, r *http.Request, body []byte) {
	return func(w http.ResponseWriter, r *http.Request, body []byte) {
		quotaHeaders(w.Header())
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"cmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`,
			prompt, completion, prompt+completion)
	}
}

func quotaHeaders(h http.Header) {
	h.Set("x-ratelimit-limit-tokens", "1000000")
	h.Set("x-ratelimit-remaining-tokens", "999000")
	h.Set("x-ratelimit-reset-tokens", "1s")
	h.Set("x-ratelimit-limit-requests", "10000")
	h.Set("x-ratelimit-remaining-requests", "9999")
	h.Set("x-ratelimit-reset-requests", "6ms")
}

// sseStream answers a streaming completion with n content chunks, a finish
// chunk and, when the request asked for it, a usage chunk.
func sseStream(n, prompt int64) func(w http.ResponseWriter, r *http.Request, body []byte) {
	return func(w http.ResponseWriter, r *http.Request, body []byte) {
		var req struct {
			StreamOptions struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
		}
		_ = json.Unmarshal(body, &req)
		quotaHeaders(w.Header())
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for i := range n {
			fmt.Fprintf(w, "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" t%d\"}}]}\n\n", i)
		}
		fmt.Fprint(w, "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n")
		if req.StreamOptions.IncludeUsage {
			fmt.Fprintf(w, "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", prompt, n, prompt+n)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}
}

// env is a gateway on a fake clock in front of a fake upstream.
type env struct {
	t     testing.TB
	clock *clocktesting.FakeClock
	reg   *registry.Registry
	gw    *Gateway
	srv   *httptest.Server
	up    *upstream
	store *jobs.MemStore
	prom  *prometheus.Registry
	// stopRun stops the gateway's Run (as a scheduler shutdown does) and
	// waits for it to return.
	stopRun func()
}

type envConfig struct {
	pool        registry.PoolPolicy
	concurrency int
	maxResp     int64 // Options.MaxResponseBytes; 0: the default
	wrapStore   func(*jobs.MemStore, *clocktesting.FakeClock) jobs.Store
	key         *providerkey.Key  // Options.LiveProviderKey; nil: "sk-provider-secret"
	transport   http.RoundTripper // Options.Transport; nil: the default
	wrapClock   func(*clocktesting.FakeClock) clock.WithTicker
}

type envOption func(*envConfig)

func withPool(f func(p *registry.PoolPolicy)) envOption {
	return func(c *envConfig) { f(&c.pool) }
}

func withConcurrency(n int) envOption {
	return func(c *envConfig) { c.concurrency = n }
}

// withStore gives the gateway the store f returns around the env's MemStore.
func withStore(f func(*jobs.MemStore, *clocktesting.FakeClock) jobs.Store) envOption {
	return func(c *envConfig) { c.wrapStore = f }
}

// withProviderKey gives the gateway the live provider key k.
func withProviderKey(k *providerkey.Key) envOption {
	return func(c *envConfig) { c.key = k }
}

// withTransport makes the gateway call the provider through rt.
func withTransport(rt http.RoundTripper) envOption {
	return func(c *envConfig) { c.transport = rt }
}

// withClock gives the gateway the clock f returns around the env's fake
// clock (the registry and the store keep the fake clock itself).
func withClock(f func(*clocktesting.FakeClock) clock.WithTicker) envOption {
	return func(c *envConfig) { c.wrapClock = f }
}

func withMaxResponseBytes(n int64) envOption {
	return func(c *envConfig) { c.maxResp = n }
}

func newEnv(t testing.TB, up *upstream, tenants []registry.TenantPolicy, opts ...envOption) *env {
	t.Helper()
	fc := clocktesting.NewFakeClock(t0)
	reg := registry.New(fc)
	cfg := envConfig{pool: registry.PoolPolicy{Name: "pool", BaseURL: up.srv.URL, Models: []registry.ModelPolicy{{Name: testModel, TokensPerMinute: 1000000, RequestsPerMinute: 10000}},
		CostModel: limiter.CostModel{InputWeight: 1, OutputWeight: 1}, DefaultMaxOutputTokens: 4096, UpstreamTimeout: 10 * time.Second}}
	for _, o := range opts {
		o(&cfg)
	}
	if err := reg.SetPool(cfg.pool); err != nil {
		t.Fatal(err)
	}
	for _, tp := range tenants {
		if err := reg.UpsertTenant(tp); err != nil {
			t.Fatal(err)
		}
	}
	reg.SetTenantsSynced()
	prom := prometheus.NewRegistry()
	store := jobs.NewMemStore(fc, 0, 0)
	var gwStore jobs.Store = store
	if cfg.wrapStore != nil {
		gwStore = cfg.wrapStore(store, fc)
	}
	var gwClock clock.WithTicker = fc
	if cfg.wrapClock != nil {
		gwClock = cfg.wrapClock(fc)
	}
	gw := New(Options{Registry: reg, Clock: gwClock, ProviderKey: "sk-provider-secret", LiveProviderKey: cfg.key, Store: gwStore, UpstreamConcurrency: cfg.concurrency, MaxResponseBytes: cfg.maxResp, Transport: cfg.transport,
		Metrics: metrics.New(prom, func() registry.Snapshot { return reg.Snapshot(fc.Now()) }), Rand: func() float64 { return 0 }})
	srv := httptest.NewServer(gw)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = gw.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		srv.Close()
	})
	return &env{t: t, clock: fc, reg: reg, gw: gw, srv: srv, up: up, store: store, prom: prom,
		stopRun: func() { cancel(); <-done }}
}

// tenant returns a tenant policy with key "key-<id>".
func tenant(id string, l limiter.Limits) registry.TenantPolicy {
	return registry.TenantPolicy{ID: id, Name: id, Limits: l, Weight: 1, MaxQueued: 100,
		DefaultDeadline: time.Hour, KeyHashes: []registry.KeyHash{registry.HashKey("key-" + id)}}
}

func (e *env) do(method, path, key string, body string) *http.Response {
	e.t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp
}

func readAll(t testing.TB, resp *http.Response) []byte {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func decode[T any](t testing.TB, resp *http.Response) T {
	t.Helper()
	var v T
	b := readAll(t, resp)
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decoding %q: %v", b, err)
	}
	return v
}

// tokensLeft is the tenant's weighted bucket level at the fake clock's now.
func (e *env) tokensLeft(id string) int64 {
	return e.reg.Tenant(id).Limiter.Snapshot(e.clock.Now()).TokensRemaining
}

// inQueue reports whether the job is in the fair queue.
func (e *env) inQueue(id string) bool {
	var ok bool
	e.reg.WithQueue(func(q *fairqueue.Queue) { ok = q.Queued(e.gw.dispatch.byID[id]) })
	return ok
}

// trackDequeued makes the dispatcher record the jobs it takes out of the
// fair queue (its dequeuedHook); the function returned reports whether it
// took the given job out at least once.
func (e *env) trackDequeued() func(id string) bool {
	var seen sync.Map
	hook := func(fj *fairqueue.Job) { seen.Store(fj.ID, true) }
	e.gw.dispatch.dequeuedHook.Store(&hook)
	return func(id string) bool { _, ok := seen.Load(id); return ok }
}

// waitPutBack waits until the dispatcher has taken the job out of the
// queue and put it back because its model is paused (the model's first
// job after e.pause): from then on the dispatcher leaves the model's jobs
// in the queue until the pause ends, so a cancellation finds the job
// there. While the job is out of the queue a DELETE is 409
// job_not_cancellable (TestCancelWhileDispatchedSaysSo). dequeued is
// trackDequeued's, called before the job was submitted.
func (e *env) waitPutBack(t *testing.T, dequeued func(id string) bool, id string) {
	t.Helper()
	waitFor(t, "the dispatcher to put the job back while the model is paused", func() bool {
		return dequeued(id) && e.inQueue(id)
	})
}

// waitFor polls cond until it holds, failing after 10 s of real time. It
// waits for goroutines of the gateway (dispatcher, upstream calls) to reach
// a state, not for time to pass: the fake clock does not move.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// completionsBody is a /v1/completions body with exactly prompt prompt
// tokens (token ids) and the given max_tokens.
func completionsBody(prompt int, maxTokens int64, extra string) string {
	var b bytes.Buffer
	b.WriteString(`{"model":"` + testModel + `","prompt":[`)
	for i := range prompt {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("1")
	}
	fmt.Fprintf(&b, `],"max_tokens":%d%s}`, maxTokens, extra)
	return b.String()
}
