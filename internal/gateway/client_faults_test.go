package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/metrics"
	"github.com/fairshare-dev/fairshare/internal/providersim"
	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/tokencount"
)

// Client faults (issue 7): the gateway in front of the real provider
// simulator, served by the production server (NewServer) on 127.0.0.1.
// Figures that the tests print with t.Logf ("figure: ...") are measured,
// not asserted; the assertions are on outcomes and bounds.

// faultSim wraps the simulator's handler to count calls that returned,
// those whose request context was cancelled (the gateway went away), and
// the bytes the simulator wrote.
type faultSim struct {
	sim       *providersim.Server
	srv       *httptest.Server
	returned  atomic.Int64
	cancelled atomic.Int64
	written   atomic.Int64
}

// countingWriter counts the bytes a handler writes; Unwrap lets
// http.ResponseController flush through it.
type countingWriter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (c countingWriter) Write(b []byte) (int, error) {
	n, err := c.ResponseWriter.Write(b)
	c.n.Add(int64(n))
	return n, err
}

func (c countingWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

func newFaultSim(t testing.TB, cfg providersim.Config) *faultSim {
	t.Helper()
	u := &faultSim{sim: providersim.New(cfg)}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.sim.ServeHTTP(countingWriter{w, &u.written}, r)
		if r.Context().Err() != nil {
			u.cancelled.Add(1)
		}
		u.returned.Add(1)
	}))
	t.Cleanup(u.srv.Close)
	return u
}

// clientEnv is a gateway on a fake clock (no refill: bucket levels are
// exact) in front of the simulator, served by NewServer.
type clientEnv struct {
	clock *clocktesting.FakeClock
	reg   *registry.Registry
	gw    *Gateway
	srv   *httptest.Server
	up    *faultSim
	store *jobs.MemStore
	prom  *prometheus.Registry
	// bodyRead counts the request body bytes the gateway read.
	bodyRead atomic.Int64
}

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (c countingBody) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func newClientEnv(t testing.TB, up *faultSim, tenants []registry.TenantPolicy, o Options, so ServerOptions) *clientEnv {
	t.Helper()
	fc := clocktesting.NewFakeClock(t0)
	reg := registry.New(fc)
	pool := registry.PoolPolicy{Name: "pool", BaseURL: up.srv.URL,
		Models:    []registry.ModelPolicy{{Name: testModel, TokensPerMinute: 1 << 40, RequestsPerMinute: 1 << 30}},
		CostModel: limiter.CostModel{InputWeight: 1, OutputWeight: 4}, DefaultMaxOutputTokens: 4096, UpstreamTimeout: 60 * time.Second}
	if err := reg.SetPool(pool); err != nil {
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
	o.Registry, o.Clock, o.Store, o.Rand = reg, fc, store, func() float64 { return 0 }
	o.Metrics = metrics.New(prom, func() registry.Snapshot { return reg.Snapshot(fc.Now()) })
	gw := New(o)
	e := &clientEnv{clock: fc, reg: reg, gw: gw, up: up, store: store, prom: prom}
	e.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A copy: net/http inspects the original request's body after the
		// handler (to drain or close), which must stay its own type.
		r2 := r.WithContext(r.Context())
		r2.Body = countingBody{r.Body, &e.bodyRead}
		gw.ServeHTTP(w, r2)
	}))
	e.srv.Config = NewServer(e.srv.Config.Handler, so)
	e.srv.Start()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = gw.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		e.srv.Close()
	})
	return e
}

func (e *clientEnv) post(t testing.TB, ctx context.Context, path, key, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// settledIdle waits until nothing of the tenant or the pool is in flight.
func (e *clientEnv) settledIdle(t *testing.T, id string) {
	t.Helper()
	waitFor(t, "the call to be settled", func() bool {
		s := e.reg.Tenant(id).Limiter.Snapshot(e.clock.Now())
		return s.InFlight == 0 && s.KVBlocks == 0 && e.reg.Snapshot(e.clock.Now()).InFlight == 0
	})
}

func (e *clientEnv) counter(c *prometheus.CounterVec, labels ...string) int64 {
	return int64(testutil.ToFloat64(c.WithLabelValues(labels...)))
}

// requests is the tenant's requests_total for outcome.
func (e *clientEnv) requests(id, outcome string) int64 {
	return e.tenantCount(id, func(s *metrics.TenantSeries) *metrics.TenantCounter { return s.Requests(outcome) })
}

// tenantCount is the tenant's count in the series pick chooses (such as
// (*metrics.TenantSeries).Charged); 0 when it was never counted.
func (e *clientEnv) tenantCount(id string, pick func(*metrics.TenantSeries) *metrics.TenantCounter) int64 {
	n, _ := pick(e.gw.metrics.Tenant(e.reg.Tenant(id))).Value()
	return n
}

// waitOutcomes waits until n requests of tenant have their outcome counted
// in requests_total: a handler counts the outcome after it settles the
// call, so a test that waited for the settlement may look too early.
func (e *clientEnv) waitOutcomes(t *testing.T, tenant string, n int64) {
	t.Helper()
	waitFor(t, "the outcomes counted", func() bool {
		var sum int64
		for _, o := range []string{metrics.OutcomeOK, metrics.OutcomeClientGone, metrics.OutcomeUpstreamError} {
			sum += e.requests(tenant, o)
		}
		return sum >= n
	})
}

const chatPrompt = `[{"role":"user","content":"Tell me a long story about a fox."}]`

func chatStreamBody(maxTokens int64) string {
	return fmt.Sprintf(`{"model":%q,"messages":%s,"max_tokens":%d,"stream":true}`, testModel, chatPrompt, maxTokens)
}

func promptEstimate(t testing.TB) int64 {
	var msgs []tokencount.Message
	if err := json.Unmarshal([]byte(chatPrompt), &msgs); err != nil {
		t.Fatal(err)
	}
	n, err := tokencount.Chat(msgs)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func limitedTenant(id string, burst int64) registry.TenantPolicy {
	return tenant(id, limiter.Limits{WeightedPerMinute: i64(burst * 6), WeightedBurst: i64(burst), MaxConcurrent: i64(4), MaxKVBlocks: i64(1 << 20)})
}

// readContentEvents reads n SSE events with content from br.
func readContentEvents(t testing.TB, br *bufio.Reader, n int) {
	t.Helper()
	for got := 0; got < n; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("stream ended after %d events: %v", got, err)
		}
		if strings.HasPrefix(line, "data: {") {
			got++
		}
	}
}

// A client that goes away mid-stream: the upstream call is cancelled (the
// simulator's request context ends long before its 1000 frames), the
// tenant is charged the prompt plus the output tokens of the deltas the
// gateway forwarded (docs/architecture.md, cost model: "a client that
// leaves after 400 of 1000 tokens pays prompt + 400"), the rest is refunded
// exactly, and concurrency and KV blocks return to 0.
func TestClientDisconnectMidStream(t *testing.T) {
	up := newFaultSim(t, providersim.Config{OutputTokens: 1000, FrameInterval: 5 * time.Millisecond})
	const burst = 1_000_000
	e := newClientEnv(t, up, []registry.TenantPolicy{limitedTenant("a", burst)}, Options{}, ServerOptions{})
	prompt := promptEstimate(t)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := e.post(t, ctx, endpointChat, "key-a", chatStreamBody(1000))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, readAll(t, resp))
	}
	charged := prompt + 4*1000
	if got := e.tenantCount("a", (*metrics.TenantSeries).Charged); got != charged {
		t.Fatalf("charged %d, want %d", got, charged)
	}
	if s := e.reg.Tenant("a").Limiter.Snapshot(e.clock.Now()); s.InFlight != 1 || s.KVBlocks == 0 {
		t.Fatalf("in flight %d, KV %d during the stream", s.InFlight, s.KVBlocks)
	}
	const seen = 50
	readContentEvents(t, bufio.NewReader(resp.Body), seen)
	start := time.Now()
	cancel()
	resp.Body.Close()

	e.settledIdle(t, "a")
	waitFor(t, "the upstream call to end", func() bool { return up.returned.Load() == 1 })
	t.Logf("figure: mid-stream disconnect settled and upstream cancelled in %v", time.Since(start).Round(time.Millisecond))
	if up.cancelled.Load() != 1 || up.sim.Stats().Succeeded != 0 {
		t.Fatalf("upstream call not cancelled: cancelled %d, succeeded %d", up.cancelled.Load(), up.sim.Stats().Succeeded)
	}
	simSent := up.sim.Stats().CompletionTokens // frames the simulator generated before the cancel
	used := e.tenantCount("a", (*metrics.TenantSeries).Used)
	refunded := e.tenantCount("a", (*metrics.TenantSeries).Refunded)
	out := (used - prompt) / 4
	// Each simulator frame is one cl100k token: the gateway counted the
	// frames it read, at least those the client got, at most those sent.
	if (used-prompt)%4 != 0 || out < seen || out > simSent || simSent >= 1000 {
		t.Fatalf("used %d = prompt %d + 4 x %d output; client saw %d, simulator sent %d", used, prompt, out, seen, simSent)
	}
	if refunded != charged-used {
		t.Fatalf("refunded %d, want charged %d - used %d", refunded, charged, used)
	}
	if left := e.reg.Tenant("a").Limiter.Snapshot(e.clock.Now()).TokensRemaining; left != burst-used {
		t.Fatalf("bucket %d, want %d - %d", left, burst, used)
	}
	e.waitOutcomes(t, "a", 1)
	if got := e.requests("a", metrics.OutcomeClientGone); got != 1 {
		t.Fatalf("client_gone counted %d", got)
	}
}

// A client that goes away while its call waits for the provider's first
// byte (interactive calls never wait in a queue: admission is immediate;
// the only wait is upstream): the upstream request is cancelled, the token
// charge is refunded in full (the provider produced nothing), the request
// stays charged (the provider received it: a client disconnecting at once
// must not exceed its request rate) and everything is released, long
// before the simulator's 30 s latency.
func TestClientDisconnectWaitingForUpstream(t *testing.T) {
	up := newFaultSim(t, providersim.Config{Latency: 30 * time.Second})
	const burst, requestBurst = 1_000_000, 100
	pol := limitedTenant("a", burst)
	pol.Limits.RequestsPerMinute, pol.Limits.RequestBurst = i64(6), i64(requestBurst) // refills 1 in 10 s
	e := newClientEnv(t, up, []registry.TenantPolicy{pol}, Options{}, ServerOptions{})
	for _, stream := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			body := chatStreamBody(100)
			if !stream {
				body = strings.Replace(body, `"stream":true`, `"stream":false`, 1)
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+endpointChat, strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer key-a")
			resp, err := e.srv.Client().Do(req)
			if err == nil {
				resp.Body.Close()
			}
			errc <- err
		}()
		before := up.returned.Load()
		waitFor(t, "the call to reach the simulator", func() bool {
			return up.sim.Stats().Requests == before+1 && e.reg.Tenant("a").Limiter.Snapshot(e.clock.Now()).InFlight == 1
		})
		start := time.Now()
		cancel()
		if err := <-errc; err == nil {
			t.Fatal("the cancelled request got a response")
		}
		e.settledIdle(t, "a")
		waitFor(t, "the upstream call to end", func() bool { return up.returned.Load() == before+1 })
		t.Logf("figure: disconnect while waiting for upstream (stream=%v) released in %v", stream, time.Since(start).Round(time.Millisecond))
	}
	if up.cancelled.Load() != 2 {
		t.Fatalf("upstream calls cancelled %d, want 2", up.cancelled.Load())
	}
	if used := e.tenantCount("a", (*metrics.TenantSeries).Used); used != 0 {
		t.Fatalf("used %d, want 0 (full refund)", used)
	}
	snap := e.reg.Tenant("a").Limiter.Snapshot(e.clock.Now())
	if snap.TokensRemaining != burst {
		t.Fatalf("bucket %d, want %d", snap.TokensRemaining, burst)
	}
	if snap.RequestsRemaining != requestBurst-2 {
		t.Fatalf("request bucket %d, want %d (the two abandoned calls stay counted)", snap.RequestsRemaining, requestBurst-2)
	}
	e.waitOutcomes(t, "a", 2)
	if got := e.requests("a", metrics.OutcomeClientGone); got != 2 {
		t.Fatalf("client_gone counted %d, want 2", got)
	}
}

// TestUpstreamTimeoutAfterSendKeepsRequestCharge: a call sent in full to a
// provider that does not answer within the pool's upstream timeout gets a
// 504 upstream_timeout; its tokens are refunded but its request stays
// charged (the provider received it and counts it), as for a client that
// leaves while waiting. A call that never reached the provider (connection
// refused) is refunded in full, request included (BC-22).
func TestUpstreamTimeoutAfterSendKeepsRequestCharge(t *testing.T) {
	up := newFaultSim(t, providersim.Config{Latency: 30 * time.Second})
	const burst, requestBurst = 1_000_000, 100
	pol := limitedTenant("a", burst)
	pol.Limits.RequestsPerMinute, pol.Limits.RequestBurst = i64(6), i64(requestBurst) // refills 1 in 10 s
	e := newClientEnv(t, up, []registry.TenantPolicy{pol}, Options{}, ServerOptions{})
	pool := *e.reg.Pool()
	pool.UpstreamTimeout = 200 * time.Millisecond
	if err := e.reg.SetPool(pool); err != nil {
		t.Fatal(err)
	}
	call := func() (int, string) {
		body := strings.Replace(chatStreamBody(100), `"stream":true`, `"stream":false`, 1)
		req, _ := http.NewRequest(http.MethodPost, e.srv.URL+endpointChat, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer key-a")
		resp, err := e.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var eb errorBody
		_ = json.NewDecoder(resp.Body).Decode(&eb)
		return resp.StatusCode, eb.Error.Code
	}
	if st, code := call(); st != http.StatusGatewayTimeout || code != codeUpstreamTimeout {
		t.Fatalf("timed-out call: %d %q, want 504 %q", st, code, codeUpstreamTimeout)
	}
	e.settledIdle(t, "a")
	snap := e.reg.Tenant("a").Limiter.Snapshot(e.clock.Now())
	if snap.TokensRemaining != burst || snap.RequestsRemaining != requestBurst-1 {
		t.Fatalf("after a timeout: bucket %d, request bucket %d; want %d (tokens refunded), %d (the request stays charged)",
			snap.TokensRemaining, snap.RequestsRemaining, burst, requestBurst-1)
	}

	// Nothing listens at the provider's address any more: the request is
	// never sent, and is refunded in full.
	up.srv.Close()
	if st, code := call(); st != http.StatusBadGateway || code != codeUpstreamUnavailable {
		t.Fatalf("unreachable provider: %d %q, want 502 %q", st, code, codeUpstreamUnavailable)
	}
	e.settledIdle(t, "a")
	snap = e.reg.Tenant("a").Limiter.Snapshot(e.clock.Now())
	if snap.TokensRemaining != burst || snap.RequestsRemaining != requestBurst-1 {
		t.Fatalf("after an unreachable provider: bucket %d, request bucket %d; want %d, %d (refunded in full)",
			snap.TokensRemaining, snap.RequestsRemaining, burst, requestBurst-1)
	}
}

// liveHeap is the live heap after a full collection, bytes.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// A slow reader: a client that stops reading a 400,000-frame stream (about
// 72 MB) holds the gateway back by TCP backpressure: the simulator is
// blocked before half of the stream (what it writes until then fills the
// kernel's send and receive buffers of the two loopback connections, which
// autotune to several MB each: 9 to 19 MB on a host whose tcp_rmem maximum
// is 32 MB),
// and the gateway's live heap grows by less than 4 MiB (it buffers one
// event, not the stream). When the client reads again the whole stream
// arrives and is settled from the provider's usage.
func TestClientSlowReaderBoundedMemory(t *testing.T) {
	const frames = 400_000
	up := newFaultSim(t, providersim.Config{OutputTokens: frames})
	e := newClientEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})}, Options{}, ServerOptions{})
	// The stream takes tens of seconds under the race detector on a busy
	// host: the env's 60 s upstream timeout would cut it.
	pool := *e.reg.Pool()
	pool.UpstreamTimeout = 10 * time.Minute
	if err := e.reg.SetPool(pool); err != nil {
		t.Fatal(err)
	}
	// The tokenizer's vocabulary (about 3.5 MB live) is loaded by the
	// first count; load it before the baseline.
	if _, err := tokencount.Text("warm"); err != nil {
		t.Fatal(err)
	}
	base := liveHeap()
	resp := e.post(t, context.Background(), endpointChat, "key-a", chatStreamBody(frames))
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	// The client reads nothing: wait until the simulator is blocked (its
	// written bytes stop growing over 5 polls 20 ms apart).
	var last int64 = -1
	for stable := 0; stable < 5; {
		time.Sleep(20 * time.Millisecond)
		n := up.written.Load()
		if n == last {
			stable++
		} else {
			stable, last = 0, n
		}
	}
	heap := liveHeap()
	growth := int64(heap) - int64(base)
	t.Logf("figure: stalled reader: simulator blocked after %d bytes of the stream; gateway+client live heap growth %d bytes", last, growth)
	if growth > 4<<20 {
		t.Fatalf("live heap grew by %d bytes while the client stalled", growth)
	}
	// The client reads again: every frame arrives, [DONE] closes the stream.
	n, done := 0, false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	for sc.Scan() {
		switch line := sc.Text(); {
		case strings.HasPrefix(line, `data: {`) && strings.Contains(line, `"content"`):
			n++
		case line == "data: [DONE]":
			done = true
		}
	}
	if n != frames || !done {
		t.Fatalf("got %d content frames, done %v", n, done)
	}
	if total := up.written.Load(); last >= total/2 {
		t.Fatalf("the simulator wrote %d of the stream's %d bytes without the client reading: no backpressure", last, total)
	}
	e.settledIdle(t, "a")
	if used, want := e.tenantCount("a", (*metrics.TenantSeries).Used), promptEstimate(t)+4*frames; used != want {
		t.Fatalf("used %d, want %d", used, want)
	}
}

// A client that stops reading for longer than the write stall timeout is
// cut off: the blocked write fails, the upstream call is cancelled and the
// call is settled from the deltas forwarded, everything released; without
// the bound the write would block until the client closed its connection.
func TestClientStalledReaderIsCutOff(t *testing.T) {
	const frames = 200_000
	up := newFaultSim(t, providersim.Config{OutputTokens: frames})
	e := newClientEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})}, Options{WriteStallTimeout: 300 * time.Millisecond}, ServerOptions{})
	resp := e.post(t, context.Background(), endpointChat, "key-a", chatStreamBody(frames))
	defer resp.Body.Close()
	start := time.Now()
	e.settledIdle(t, "a")
	waitFor(t, "the upstream call to end", func() bool { return up.returned.Load() == 1 })
	t.Logf("figure: stalled reader (stall bound 300ms) cut off and settled %v after the response began", time.Since(start).Round(time.Millisecond))
	if up.cancelled.Load() != 1 {
		t.Fatal("upstream call not cancelled")
	}
	used := e.tenantCount("a", (*metrics.TenantSeries).Used)
	if prompt := promptEstimate(t); used <= prompt || used >= prompt+4*frames || (used-prompt)%4 != 0 {
		t.Fatalf("used %d, want prompt %d + 4 x (frames forwarded < %d)", used, prompt, frames)
	}
	e.waitOutcomes(t, "a", 1)
	if got := e.requests("a", metrics.OutcomeClientGone); got != 1 {
		t.Fatalf("client_gone counted %d", got)
	}
}

// Slowloris: a client that sends its headers a byte at a time is
// disconnected once the server's header timeout passes, and no handler
// runs; a header block above MaxHeaderBytes is answered 431.
func TestClientSlowlorisHeaders(t *testing.T) {
	up := newFaultSim(t, providersim.Config{})
	e := newClientEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})}, Options{}, ServerOptions{ReadHeaderTimeout: 300 * time.Millisecond})
	conn, err := net.Dial("tcp", e.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	closed := make(chan time.Duration, 1)
	go func() {
		_, _ = io.Copy(io.Discard, conn) // returns when the server closes
		closed <- time.Since(start)
	}()
	head := "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer key-a\r\nX-Slow: " + strings.Repeat("a", 200)
	sent := 0
	var took time.Duration
loop:
	for i := range len(head) {
		if _, err := conn.Write([]byte{head[i]}); err != nil {
			break
		}
		sent++
		select {
		case took = <-closed:
			break loop
		case <-time.After(20 * time.Millisecond):
		}
	}
	if took == 0 {
		select {
		case took = <-closed:
		case <-time.After(10 * time.Second):
			t.Fatal("the server kept a slowloris connection open")
		}
	}
	t.Logf("figure: slowloris connection (header timeout 300ms) closed after %v and %d header bytes", took.Round(time.Millisecond), sent)
	if sent == len(head) {
		t.Fatal("the whole header was accepted")
	}
	if e.bodyRead.Load() != 0 || up.sim.Stats().Requests != 0 {
		t.Fatal("a handler ran")
	}
	if got, err := testutil.GatherAndCount(e.prom, "fairshare_scheduler_requests_total"); err != nil || got != 0 {
		t.Fatalf("%d request series counted (%v)", got, err)
	}

	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+endpointChat, strings.NewReader("{}"))
	req.Header.Set("X-Big", strings.Repeat("b", DefaultMaxHeaderBytes+4096))
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("oversized headers: status %d, want 431", resp.StatusCode)
	}
}

// errorCode returns the status and the code of an OpenAI-style error.
func errorCode(t testing.TB, resp *http.Response) (int, string) {
	t.Helper()
	var eb struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	b := readAll(t, resp)
	if err := json.Unmarshal(b, &eb); err != nil {
		t.Fatalf("status %d, not an error body: %q", resp.StatusCode, b)
	}
	return resp.StatusCode, eb.Error.Code
}

// Oversized bodies on every POST route: announced by Content-Length (413
// before any byte of the body is read: the client sends none), chunked or
// unannounced (413 after limit+1 bytes: the gateway reads no further).
func TestClientOversizedBodies(t *testing.T) {
	up := newFaultSim(t, providersim.Config{})
	e := newClientEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})}, Options{}, ServerOptions{})
	const limit = DefaultMaxBodyBytes
	for _, path := range []string{endpointChat, endpointCompletions, endpointEmbeddings, "/v1/jobs", "/v1/jobs/bulk"} {
		t.Run(strings.ReplaceAll(path[1:], "/", "_"), func(t *testing.T) {
			// Content-Length above the limit, no body sent at all.
			conn, err := net.Dial("tcp", e.srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
			fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-a\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", path, limit+1)
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			if st, code := errorCode(t, resp); st != http.StatusRequestEntityTooLarge || code != codeBodyTooLarge {
				t.Fatalf("Content-Length %d: %d %s", limit+1, st, code)
			}
			// Chunked (no Content-Length), 3x the limit offered.
			e.bodyRead.Store(0)
			body := io.MultiReader(strings.NewReader(`{"model":"`+testModel+`","prompt":"`), bytes.NewReader(bytes.Repeat([]byte("a"), 3*limit)))
			req, _ := http.NewRequest(http.MethodPost, e.srv.URL+path, body)
			req.ContentLength = -1
			req.Header.Set("Authorization", "Bearer key-a")
			resp, err = e.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if st, code := errorCode(t, resp); st != http.StatusRequestEntityTooLarge || code != codeBodyTooLarge {
				t.Fatalf("chunked: %d %s", st, code)
			}
			if n := e.bodyRead.Load(); n != limit+1 {
				t.Fatalf("the gateway read %d body bytes, want limit+1 = %d", n, limit+1)
			}
		})
	}
	if up.sim.Stats().Requests != 0 || e.reg.Snapshot(e.clock.Now()).Backlog != 0 {
		t.Fatal("an oversized body reached the provider or the queue")
	}
}

// nested returns depth nested JSON arrays.
func nested(depth int) string { return strings.Repeat("[", depth) + strings.Repeat("]", depth) }

// Malformed, mistyped and hostile bodies: each is a 400 with a code, fast
// and with bounded memory, and none reaches the provider or the queue.
func TestClientMalformedBodies(t *testing.T) {
	up := newFaultSim(t, providersim.Config{})
	e := newClientEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})}, Options{}, ServerOptions{})
	chat := func(msgs string) string { return `{"model":"` + testModel + `","messages":` + msgs + `}` }
	job := func(body string) string { return `{"endpoint":"/v1/chat/completions","body":` + body + `}` }
	cases := []struct {
		name, path, body, ctype string
		status                  int
		code                    string
	}{
		{"empty", endpointChat, ``, "application/json", 400, codeInvalidJSON},
		{"truncated", endpointChat, `{"model":"` + testModel + `","messages":[`, "application/json", 400, codeInvalidJSON},
		{"trailing garbage", endpointChat, chat(chatPrompt) + `}`, "application/json", 400, codeInvalidJSON},
		{"array", endpointChat, `[1,2]`, "application/json", 400, codeInvalidJSON},
		{"null", endpointChat, `null`, "application/json", 400, codeInvalidJSON},
		{"invalid utf8 string", endpointChat, chat(`[{"role":"user","content":"` + "\xff\xfe" + `"}]`), "application/json", 200, ""},
		{"form body", endpointChat, `model=x&messages=y`, "application/x-www-form-urlencoded", 400, codeInvalidJSON},
		// The body is parsed as JSON whatever the Content-Type: SDKs and
		// proxies differ, and the provider does the same.
		{"json as text/plain", endpointChat, chat(chatPrompt), "text/plain", 200, ""},
		{"no content type", endpointChat, chat(chatPrompt), "", 200, ""},
		{"messages not array", endpointChat, chat(`"hi"`), "application/json", 400, codeInvalidRequest},
		{"model number", endpointChat, `{"model":1,"messages":` + chatPrompt + `}`, "application/json", 400, codeInvalidRequest},
		{"max_tokens huge", endpointChat, `{"model":"` + testModel + `","messages":` + chatPrompt + `,"max_tokens":1e300}`, "application/json", 400, codeInvalidRequest},
		{"max_tokens x n overflow", endpointChat, `{"model":"` + testModel + `","messages":` + chatPrompt + `,"max_tokens":4611686018427387904,"n":4}`, "application/json", 413, codeRequestTooLarge},
		{"nesting bomb 100k in messages", endpointChat, chat(nested(100_000)), "application/json", 400, codeInvalidJSON},
		{"nesting bomb 100k in tools", endpointChat, `{"model":"` + testModel + `","messages":` + chatPrompt + `,"tools":` + nested(100_000) + `}`, "application/json", 400, codeInvalidJSON},
		{"nesting 5000 in content", endpointChat, chat(`[{"role":"user","content":` + nested(5000) + `}]`), "application/json", 400, codeInvalidRequest},
		{"nesting 9000 in tools passes through", endpointChat, `{"model":"` + testModel + `","messages":` + chatPrompt + `,"tools":` + nested(9000) + `}`, "application/json", 200, ""},
		{"nesting bomb 4M (8 MiB) in messages", endpointChat, chat(nested(4_000_000)), "application/json", 400, codeInvalidJSON},
		{"job empty", "/v1/jobs", ``, "application/json", 400, codeInvalidJSON},
		{"job malformed", "/v1/jobs", `{"endpoint":`, "application/json", 400, codeInvalidJSON},
		{"job body not object", "/v1/jobs", job(`"x"`), "application/json", 400, codeInvalidRequest},
		{"job body malformed", "/v1/jobs", `{"body":{"model":}}`, "application/json", 400, codeInvalidJSON},
		{"job nesting bomb in body", "/v1/jobs", job(chat(nested(100_000))), "application/json", 400, codeInvalidJSON},
		{"job nesting bomb in metadata", "/v1/jobs", `{"body":` + chat(chatPrompt) + `,"metadata":` + nested(100_000) + `}`, "application/json", 400, codeInvalidJSON},
		{"job deadline string", "/v1/jobs", `{"body":` + chat(chatPrompt) + `,"deadlineSeconds":"1"}`, "application/json", 400, codeInvalidDeadline},
		{"job deadline NaN-like", "/v1/jobs", `{"body":` + chat(chatPrompt) + `,"deadlineSeconds":-1}`, "application/json", 400, codeInvalidDeadline},
		{"bulk empty", "/v1/jobs/bulk", "\n\n", "application/x-ndjson", 400, codeInvalidRequest},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			base := liveHeap()
			var peak atomic.Uint64
			stop := make(chan struct{})
			sampled := make(chan struct{})
			go func() { // samples the heap while the request runs
				defer close(sampled)
				var m runtime.MemStats
				for {
					runtime.ReadMemStats(&m)
					if m.HeapAlloc > peak.Load() {
						peak.Store(m.HeapAlloc)
					}
					select {
					case <-stop:
						return
					case <-time.After(time.Millisecond):
					}
				}
			}()
			req, _ := http.NewRequest(http.MethodPost, e.srv.URL+c.path, strings.NewReader(c.body))
			req.Header.Set("Authorization", "Bearer key-a")
			if c.ctype != "" {
				req.Header.Set("Content-Type", c.ctype)
			}
			start := time.Now()
			resp, err := e.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)
			close(stop)
			<-sampled
			if c.code == "" { // passed to the simulator: its status
				b := readAll(t, resp)
				if resp.StatusCode != c.status {
					t.Fatalf("status %d: %s", resp.StatusCode, b)
				}
			} else if st, code := errorCode(t, resp); st != c.status || code != c.code {
				t.Fatalf("got %d %q, want %d %q", st, code, c.status, c.code)
			}
			t.Logf("figure: %s (%d bytes): %d in %v, heap peak above baseline %d bytes", c.name, len(c.body), c.status, took.Round(time.Microsecond), int64(peak.Load())-int64(base))
		})
	}
	if bl := e.reg.Snapshot(e.clock.Now()).Backlog; bl != 0 {
		t.Fatalf("backlog %d", bl)
	}
}

// Bodies of many small array elements (the largest amplification of an
// 8 MiB body): they are decoded in bounded memory and refused 413 once
// counted, as the model's provider token limit (hint 1,000,000) is
// exceeded; the figures give the time and the live heap peak.
func TestClientLargeArrayBodies(t *testing.T) {
	up := newFaultSim(t, providersim.Config{})
	e := newClientEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})}, Options{}, ServerOptions{})
	pool := *e.reg.Pool()
	pool.Models = []registry.ModelPolicy{{Name: testModel, TokensPerMinute: 1_000_000, RequestsPerMinute: 1000}}
	if err := e.reg.SetPool(pool); err != nil {
		t.Fatal(err)
	}
	chat := func(msgs string) string {
		return `{"model":"` + testModel + `","max_tokens":1000000,"messages":` + msgs + `}`
	}
	for _, c := range []struct{ name, path, body string }{
		{"8 MiB of empty messages", endpointChat, chat("[" + strings.Repeat("{},", 2_700_000) + "{}]")},
		{"8 MiB of one-char content parts", endpointChat, chat(`[{"role":"user","content":[` + strings.Repeat(`{"type":"text","text":"a"},`, 290_000) + `{"type":"text","text":"a"}]}]`)},
		{"8 MiB of token ids", endpointCompletions, `{"model":"` + testModel + `","max_tokens":1,"prompt":[` + strings.Repeat("1,", 4_000_000) + `1]}`},
		{"8 MiB of one-char strings", endpointCompletions, `{"model":"` + testModel + `","max_tokens":1,"prompt":[` + strings.Repeat(`"a",`, 2_000_000) + `"a"]}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			base := liveHeap()
			var peak atomic.Uint64
			stop, sampled := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(sampled)
				var m runtime.MemStats
				for {
					runtime.ReadMemStats(&m)
					if m.HeapAlloc > peak.Load() {
						peak.Store(m.HeapAlloc)
					}
					select {
					case <-stop:
						return
					case <-time.After(time.Millisecond):
					}
				}
			}()
			start := time.Now()
			resp := e.post(t, context.Background(), c.path, "key-a", c.body)
			took := time.Since(start)
			close(stop)
			<-sampled
			if st, code := errorCode(t, resp); st != http.StatusRequestEntityTooLarge || code != codeRequestTooLarge {
				t.Fatalf("got %d %s", st, code)
			}
			t.Logf("figure: %s (%d bytes): 413 in %v, heap peak above baseline %d bytes", c.name, len(c.body), took.Round(time.Millisecond), int64(peak.Load())-int64(base))
		})
	}
	if up.sim.Stats().Requests != 0 {
		t.Fatal("sent upstream")
	}
}

// Bulk uploads: a nesting bomb or malformed line is refused on its own
// line with its code, the others are queued; a line count above the bound
// is refused whole.
func TestClientBulkHostileLines(t *testing.T) {
	up := newFaultSim(t, providersim.Config{Latency: time.Hour})
	tp := tenant("a", limiter.Limits{})
	tp.MaxQueued = 100
	e := newClientEnv(t, up, []registry.TenantPolicy{tp}, Options{}, ServerOptions{})
	good := `{"body":{"model":"` + testModel + `","messages":` + chatPrompt + `,"max_tokens":10}}`
	lines := []string{good, `{"body":{"model":"` + testModel + `","messages":` + nested(100_000) + `}}`, `{"body":`, `[]`, good}
	resp := e.post(t, context.Background(), "/v1/jobs/bulk", "key-a", strings.Join(lines, "\n"))
	br := decode[struct {
		Queued, Refused int
		Data            []struct {
			Line  int
			Error *struct{ Code string }
		}
	}](t, resp)
	if br.Queued != 2 || br.Refused != 3 || len(br.Data) != 5 {
		t.Fatalf("queued %d refused %d entries %d", br.Queued, br.Refused, len(br.Data))
	}
	for i, want := range []string{"", codeInvalidJSON, codeInvalidJSON, codeInvalidJSON, ""} {
		got := ""
		if br.Data[i].Error != nil {
			got = br.Data[i].Error.Code
		}
		if got != want || br.Data[i].Line != i+1 {
			t.Fatalf("line %d: code %q, want %q", br.Data[i].Line, got, want)
		}
	}
	many := strings.Repeat("{}\n", maxBulkLines+1)
	if st, code := errorCode(t, e.post(t, context.Background(), "/v1/jobs/bulk", "key-a", many)); st != 413 || code != codeTooManyJobs {
		t.Fatalf("too many lines: %d %s", st, code)
	}
}

// A client that breaks off its upload (job or bulk) queues nothing and is
// charged nothing; one that sends its body slower than the body read
// timeout is answered 408 body_timeout.
func TestClientUploadBrokenOffOrSlow(t *testing.T) {
	up := newFaultSim(t, providersim.Config{})
	e := newClientEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})}, Options{BodyReadTimeout: 300 * time.Millisecond}, ServerOptions{})
	good := `{"body":{"model":"` + testModel + `","messages":` + chatPrompt + `}}`
	for _, path := range []string{"/v1/jobs", "/v1/jobs/bulk", endpointChat} {
		conn, err := net.Dial("tcp", e.srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-a\r\nContent-Length: %d\r\n\r\n%s", path, 2*len(good), good)
		conn.Close()
	}
	waitFor(t, "the three broken uploads to be read", func() bool { return e.bodyRead.Load() == int64(3*len(good)) })
	// The slow upload: half the body, then nothing.
	conn, err := net.Dial("tcp", e.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	fmt.Fprintf(conn, "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-a\r\nContent-Length: %d\r\n\r\n%s", 2*len(good), good)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	if st, code := errorCode(t, resp); st != http.StatusRequestTimeout || code != codeBodyTimeout {
		t.Fatalf("slow body: %d %s", st, code)
	}
	t.Logf("figure: slow body (read timeout 300ms) answered 408 after %v", time.Since(start).Round(time.Millisecond))
	list, _, err := e.store.List("a", jobs.Filter{Limit: 10})
	if err != nil || len(list) != 0 || e.reg.Snapshot(e.clock.Now()).Backlog != 0 {
		t.Fatalf("jobs stored %d (err %v), backlog %d", len(list), err, e.reg.Snapshot(e.clock.Now()).Backlog)
	}
	if up.sim.Stats().Requests != 0 || e.tenantCount("a", (*metrics.TenantSeries).Charged) != 0 {
		t.Fatal("a broken upload was sent or charged")
	}
}

// The write deadline each response arms at its start (stallWriter) bounds
// writes only: a non-streaming response whose provider takes longer than
// the stall bound to answer is still written in full (its first write arms
// the deadline again), and so is the next response on the same keep-alive
// connection after an idle time longer than the bound.
func TestWriteStallBoundsWritesOnly(t *testing.T) {
	const stall = 200 * time.Millisecond
	up := newFaultSim(t, providersim.Config{Latency: 3 * stall, OutputTokens: 5})
	e := newClientEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})}, Options{WriteStallTimeout: stall}, ServerOptions{})
	for i := range 2 {
		if i == 1 {
			time.Sleep(2 * stall) // the connection idles past the first response's deadline
		}
		var reused atomic.Bool
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) { reused.Store(info.Reused) },
		})
		resp := e.post(t, ctx, endpointChat, "key-a", chatBody(5))
		b := readAll(t, resp)
		if resp.StatusCode != http.StatusOK || !bytes.Contains(b, []byte(`"completion_tokens":5`)) {
			t.Fatalf("response %d: status %d, body %q", i+1, resp.StatusCode, b)
		}
		if i == 1 && !reused.Load() {
			t.Fatal("the second request did not reuse the kept-alive connection")
		}
	}
}
