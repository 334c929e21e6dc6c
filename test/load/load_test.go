// Package load drives one pool's gateway, in process on 127.0.0.1, with 10,000 tenants
// (issue 7, "Load: 10k tenants, a sustained open-loop load through the gateway for a
// bounded time with mixed interactive and batch traffic: no errors besides intended
// rejections, memory flat after warm-up, p99 recorded; 1M queued jobs held within the
// documented memory bound").
//
// The upstream is a loopback HTTP server answering every chat completion at once with
// usage and OpenAI quota headers far above the load. The tests are long (30 s of load,
// 1M jobs) and skip under -short; run them with `make test-load` (go test ./test/load/
// -run . -v -count=1).
package load

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/fairshare-dev/fairshare/internal/gateway"
	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/metrics"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

const (
	model = "sim-gpt"
	// tenantHeader identifies tenants (TrustedHeader mode).
	tenantHeader = "X-Fairshare-Tenant"
	// numTenants is the registry size of both tests.
	numTenants = 10000
	// limitedTenants are the first tenants, whose plan grants limitedRPM requests a
	// minute (burst limitedBurst): the load's intended rejections, 429
	// request_rate_limit, come from them and from nobody else.
	limitedTenants = 100
	limitedRPM     = 6
	limitedBurst   = 2
)

// tenantID names tenant i.
func tenantID(i int) string { return fmt.Sprintf("t%05d", i) }

// newRegistry returns a registry (real clock) with the pool at baseURL, one model of
// 1e9 tokens and 1e7 requests a minute, tenants identified by tenantHeader,
// maxQueuedJobs pool-wide, and numTenants tenants of maxQueued jobs each; the first
// limitedTenants are limited to limitedRPM requests a minute.
func newRegistry(t testing.TB, baseURL string, maxQueuedJobs, maxQueued int) *registry.Registry {
	t.Helper()
	reg := registry.New(clock.RealClock{})
	if err := reg.SetPool(registry.PoolPolicy{Name: "load", BaseURL: baseURL,
		Models:    []registry.ModelPolicy{{Name: model, TokensPerMinute: 1_000_000_000, RequestsPerMinute: 10_000_000}},
		CostModel: limiter.CostModel{InputWeight: 1, OutputWeight: 1}, DefaultMaxOutputTokens: 256,
		IdentMode: registry.IdentifyTrustedHeader, IdentHeader: tenantHeader,
		MaxQueuedJobs: maxQueuedJobs, UpstreamTimeout: 10 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	rpm, burst := int64(limitedRPM), int64(limitedBurst)
	for i := range numTenants {
		p := registry.TenantPolicy{ID: tenantID(i), Weight: 1, MaxQueued: maxQueued, DefaultDeadline: time.Hour}
		if i < limitedTenants {
			p.Limits = limiter.Limits{RequestsPerMinute: &rpm, RequestBurst: &burst}
		}
		if err := reg.UpsertTenant(p); err != nil {
			t.Fatal(err)
		}
	}
	reg.SetTenantsSynced()
	return reg
}

// upstream answers a chat completion with 12 prompt and 5 completion tokens and
// quota headers far above the load; block, when not nil, holds each call until it is
// closed.
func upstream(t testing.TB, block <-chan struct{}) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if block != nil {
			select {
			case <-block:
			case <-r.Context().Done():
				return
			}
		}
		h := w.Header()
		h.Set("x-ratelimit-limit-tokens", "1000000000")
		h.Set("x-ratelimit-remaining-tokens", "999000000")
		h.Set("x-ratelimit-reset-tokens", "1s")
		h.Set("x-ratelimit-limit-requests", "10000000")
		h.Set("x-ratelimit-remaining-requests", "9999999")
		h.Set("x-ratelimit-reset-requests", "1s")
		h.Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"cmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}`)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// chatBody is the body of every call and job: 32 output tokens at most.
const chatBody = `{"model":"` + model + `","messages":[{"role":"user","content":"Summarise the quarterly report in three bullet points."}],"max_tokens":32}`

// heapAfterGC returns HeapAlloc after two garbage collections, in bytes.
func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

const (
	// loadDuration is the measured load (real time), warmUp its first part, excluded
	// from the memory-flatness check.
	loadDuration = 30 * time.Second
	warmUp       = 10 * time.Second
	// rate is the open-loop arrival rate, requests a second, batchEvery the share of
	// job submissions (1 in batchEvery), the rest interactive calls.
	rate       = 200
	batchEvery = 5
	// maxOutstanding bounds the client's requests in flight; an arrival beyond it is a
	// client-side error (the gateway is not keeping up), never silently dropped.
	maxOutstanding = 2000
	// memSample is the heap sampling period.
	memSample = 2 * time.Second
	// heapTolerance is the growth allowed after warm-up, in bytes of HeapAlloc after
	// GC: 8 MiB, about 5 s of the finished-job churn at this rate bounded by the
	// store's maxFinished (keptFinished) plus the allocator's slack.
	heapTolerance = 8 << 20
	// keptFinished is the in-memory store's cap of finished jobs, reached during
	// warm-up (batch arrivals are rate/batchEvery = 40 a second), so that retention
	// is at its steady state when memory is measured.
	keptFinished = 500
)

// limitedEvery: 1 arrival in limitedEvery goes to a limited tenant (in rotation), the
// others to the whole registry in rotation (tenant n*7919 mod numTenants).
const limitedEvery = 10

// pickTenant returns the tenant of arrival n.
func pickTenant(n int) int {
	if n%limitedEvery == 3 {
		return (n / limitedEvery) % limitedTenants
	}
	return (n * 7919) % numTenants
}

// outcome is one request's result.
type outcome struct {
	batch   bool
	tenant  int
	status  int
	code    string // error.code of a refusal
	err     error  // transport error
	latency time.Duration
}

// TestOpenLoop first sends one call of every tenant (closed loop, the warm-up of the
// tenants' state), then rate requests a second for loadDuration, on a fixed schedule
// independent of the answers (open loop), to a gateway with numTenants tenants: four
// interactive chat completions for one batch job submission, each from a tenant picked
// by pickTenant (1 in limitedEvery a limited tenant, so that their limits bind). It
// asserts: no transport error, no
// status besides 200 (calls), 202 (jobs) and 429 request_rate_limit from the limited
// tenants; the limited tenants' admissions within their bucket (burst + rate x time);
// the heap (after GC, sampled every memSample) after warm-up within heapTolerance of
// its value at the end of warm-up; every job finished at the end. p50/p99 are logged
// per class.
func TestOpenLoop(t *testing.T) {
	if testing.Short() {
		t.Skip("load test: 30 s of traffic; run without -short (make test-load)")
	}
	up := upstream(t, nil)
	reg := newRegistry(t, up.URL, 100000, 1000)
	prom := prometheus.NewRegistry()
	store := jobs.NewMemStore(clock.RealClock{}, 0, keptFinished)
	gw := gateway.New(gateway.Options{Registry: reg, Store: store, UpstreamConcurrency: 256, Log: logr.Discard(),
		Metrics: metrics.New(prom, func() registry.Snapshot { return reg.Snapshot(time.Now()) })})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: gw, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan struct{})
	go func() { defer close(runDone); _ = gw.Run(ctx) }()
	defer func() {
		cancel()
		<-runDone
		_ = srv.Close()
	}()
	base := "http://" + ln.Addr().String()
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		MaxIdleConns: maxOutstanding, MaxIdleConnsPerHost: maxOutstanding, IdleConnTimeout: time.Minute}}

	// Warm-up, closed loop: one call of every tenant, 64 at a time, so that every
	// tenant's runtime state exists before the measured load.
	warmStart := time.Now()
	var wwg sync.WaitGroup
	sem := make(chan struct{}, 64)
	var warmErrors atomic.Int64
	for i := range numTenants {
		sem <- struct{}{}
		wwg.Add(1)
		go func() {
			defer func() { <-sem; wwg.Done() }()
			req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(chatBody))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(tenantHeader, tenantID(i))
			resp, err := client.Do(req)
			if err != nil {
				warmErrors.Add(1)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				warmErrors.Add(1)
			}
		}()
	}
	wwg.Wait()
	t.Logf("warm-up: one call of each of %d tenants in %s, %d not 200", numTenants, time.Since(warmStart).Round(time.Millisecond), warmErrors.Load())
	if warmErrors.Load() != 0 {
		t.Fatalf("warm-up: %d calls not 200", warmErrors.Load())
	}

	var (
		mu          sync.Mutex
		results     = make([]outcome, 0, int(loadDuration/(time.Second/rate)))
		outstanding atomic.Int64
		overrun     atomic.Int64
		wg          sync.WaitGroup
	)
	send := func(n int) {
		defer wg.Done()
		defer outstanding.Add(-1)
		o := outcome{batch: n%batchEvery == batchEvery-1, tenant: pickTenant(n)}
		path, body := "/v1/chat/completions", chatBody
		if o.batch {
			path, body = "/v1/jobs", `{"endpoint":"/v1/chat/completions","body":`+chatBody+`}`
		}
		req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(tenantHeader, tenantID(o.tenant))
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			o.err = err
		} else {
			b, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			o.latency, o.status, o.err = time.Since(start), resp.StatusCode, rerr
			if resp.StatusCode >= 300 {
				var e struct{ Error struct{ Code string } }
				_ = json.Unmarshal(b, &e)
				o.code = e.Error.Code
			}
		}
		mu.Lock()
		results = append(results, o)
		mu.Unlock()
	}

	type sample struct {
		at   time.Duration
		heap uint64
	}
	var samples []sample
	begin := time.Now()
	interval := time.Second / rate
	nextSample := time.Duration(0)
	total := int(loadDuration / interval)
	for n := range total {
		at := time.Duration(n) * interval
		if at >= nextSample {
			samples = append(samples, sample{at: time.Since(begin), heap: heapAfterGC()})
			nextSample += memSample
		}
		if d := time.Until(begin.Add(at)); d > 0 {
			time.Sleep(d)
		}
		if outstanding.Load() >= maxOutstanding {
			overrun.Add(1)
			continue
		}
		outstanding.Add(1)
		wg.Add(1)
		go send(n)
	}
	samples = append(samples, sample{at: time.Since(begin), heap: heapAfterGC()})
	sent := time.Since(begin)
	wg.Wait()

	// Jobs drain: none queued or running within 30 s.
	deadline := time.Now().Add(30 * time.Second)
	for {
		s := reg.Snapshot(time.Now())
		if s.Backlog == 0 && s.InFlight == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the load: %d jobs queued, %d calls in flight after 30 s", s.Backlog, s.InFlight)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Outcomes.
	count := map[string]int{}
	var lat = map[bool][]time.Duration{}
	admittedLimited := map[int]int{}
	for _, o := range results {
		switch {
		case o.err != nil:
			count["transport error"]++
			if count["transport error"] <= 5 {
				t.Errorf("tenant %s: %v", tenantID(o.tenant), o.err)
			}
			continue
		case o.status == http.StatusTooManyRequests && o.code == string(limiter.ReasonRequestRate) && o.tenant < limitedTenants:
			count["429 request_rate_limit (limited tenant)"]++
		case !o.batch && o.status == http.StatusOK, o.batch && o.status == http.StatusAccepted:
			if o.batch {
				count["202 job queued"]++
			} else {
				count["200 call"]++
			}
			if o.tenant < limitedTenants {
				admittedLimited[o.tenant]++
			}
		default:
			count[fmt.Sprintf("unexpected %d %s (batch=%v, limited=%v)", o.status, o.code, o.batch, o.tenant < limitedTenants)]++
		}
		lat[o.batch] = append(lat[o.batch], o.latency)
	}
	keys := make([]string, 0, len(count))
	for k := range count {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		t.Logf("outcome %-45s %d", k, count[k])
		if strings.HasPrefix(k, "unexpected") || k == "transport error" {
			t.Errorf("outcome %s: %d, want 0", k, count[k])
		}
	}
	if got := overrun.Load(); got != 0 {
		t.Errorf("%d arrivals found %d requests outstanding (the gateway fell behind the open loop)", got, maxOutstanding)
	}
	if len(results) != total {
		t.Errorf("%d results, want %d", len(results), total)
	}
	// Each limited tenant receives total/numTenants requests; its bucket admits at most
	// burst + rpm x elapsed (batch submissions are admitted at dispatch, not counted).
	maxAdmit := limitedBurst + int(float64(limitedRPM)*sent.Minutes()+1)
	for id, n := range admittedLimited {
		if n > maxAdmit {
			t.Errorf("limited tenant %s: %d requests admitted in %s, bucket allows %d", tenantID(id), n, sent, maxAdmit)
		}
	}
	if count["429 request_rate_limit (limited tenant)"] == 0 {
		t.Errorf("no intended rejection: the limited tenants were never refused")
	}
	for _, batch := range []bool{false, true} {
		l := lat[batch]
		slices.Sort(l)
		if len(l) == 0 {
			continue
		}
		name := "interactive"
		if batch {
			name = "batch submit"
		}
		t.Logf("latency %s: n=%d p50=%s p99=%s max=%s", name, len(l), l[len(l)/2], l[len(l)*99/100], l[len(l)-1])
	}

	// Memory: flat after warm-up.
	var ref uint64
	var peak uint64
	for _, s := range samples {
		t.Logf("heap at %5.1fs: %.2f MiB", s.at.Seconds(), float64(s.heap)/(1<<20))
		if s.at < warmUp {
			ref = s.heap
			continue
		}
		peak = max(peak, s.heap)
	}
	t.Logf("heap after warm-up: reference %.2f MiB, peak %.2f MiB, growth %.2f MiB (tolerance %.0f MiB)",
		float64(ref)/(1<<20), float64(peak)/(1<<20), (float64(peak)-float64(ref))/(1<<20), float64(heapTolerance)/(1<<20))
	if peak > ref+heapTolerance {
		t.Errorf("heap grew from %d to %d bytes after warm-up, more than %d", ref, peak, heapTolerance)
	}
}

const (
	// millionJobs are queued by TestMillionQueuedJobs: 100 per tenant.
	millionJobs   = 1_000_000
	jobsPerTenant = millionJobs / numTenants
	// docPerJobOverhead is the documented per-job size besides body, metadata and
	// response (docs/operations.md "Sizing" and docs/api.md spec.scheduler.jobStore.size:
	// "about (0.6 KiB + body + metadata + response) x 2 per retained job"). The
	// documents give no separate in-memory figure, so this test holds the heap cost of a
	// queued job (no metadata, no response yet) to that figure: (614 + body) x 2.
	docPerJobOverhead = 614
)

// TestMillionQueuedJobs queues 1,000,000 jobs (100 for each of numTenants tenants, as
// bulk uploads of 100 lines sent to the gateway's handler) while one job holds the only
// upstream slot, so that everything else stays queued, and measures the heap (after GC)
// before and after: the bytes per queued job must be at most (docPerJobOverhead + the
// job's body) x 2, the documented size of a retained job.
func TestMillionQueuedJobs(t *testing.T) {
	if testing.Short() {
		t.Skip("load test: 1M queued jobs; run without -short (make test-load)")
	}
	block := make(chan struct{})
	up := upstream(t, block)
	defer close(block)
	reg := newRegistry(t, up.URL, millionJobs, jobsPerTenant)
	store := jobs.NewMemStore(clock.RealClock{}, 0, 0)
	gw := gateway.New(gateway.Options{Registry: reg, Store: store, UpstreamConcurrency: 1, Log: logr.Discard(),
		Metrics: metrics.New(prometheus.NewRegistry(), func() registry.Snapshot { return reg.Snapshot(time.Now()) })})
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan struct{})
	go func() { defer close(runDone); _ = gw.Run(ctx) }()
	defer func() { cancel(); <-runDone }()

	line := []byte(`{"endpoint":"/v1/chat/completions","body":` + chatBody + "}\n")
	upload := bytes.Repeat(line, jobsPerTenant)
	before := heapAfterGC()
	start := time.Now()
	for i := range numTenants {
		req := httptest.NewRequest(http.MethodPost, "/v1/jobs/bulk", bytes.NewReader(upload))
		req.Header.Set("Content-Type", "application/x-ndjson")
		req.Header.Set(tenantHeader, tenantID(i))
		rec := &discardRecorder{header: http.Header{}}
		gw.ServeHTTP(rec, req)
		if rec.status != http.StatusOK || !bytes.Contains(rec.head, []byte(fmt.Sprintf(`"queued":%d`, jobsPerTenant))) {
			t.Fatalf("bulk upload of tenant %s: %d %.300s", tenantID(i), rec.status, rec.head)
		}
	}
	took := time.Since(start)
	after := heapAfterGC()
	s := reg.Snapshot(time.Now())
	if s.Backlog+s.InFlight != millionJobs || s.InFlight > 1 {
		t.Fatalf("queued %d + in flight %d, want %d with at most 1 in flight", s.Backlog, s.InFlight, millionJobs)
	}
	perJob := float64(after-before) / millionJobs
	bound := float64(2 * (docPerJobOverhead + len(chatBody)))
	t.Logf("1M queued jobs over %d tenants: submitted in %s (%.0f jobs/s); heap %.1f MiB -> %.1f MiB: %.0f bytes per job (body %d bytes); bound (0.6 KiB + body) x 2 = %.0f bytes",
		numTenants, took.Round(time.Millisecond), millionJobs/took.Seconds(), float64(before)/(1<<20), float64(after)/(1<<20), perJob, len(chatBody), bound)
	if perJob > bound {
		t.Errorf("%.0f bytes per queued job, more than the documented (0.6 KiB + body) x 2 = %.0f", perJob, bound)
	}
	runtime.KeepAlive(store)
}

// discardRecorder is a minimal http.ResponseWriter that keeps the status and the first
// 512 bytes of the body (httptest.ResponseRecorder keeps all of it).
type discardRecorder struct {
	header http.Header
	status int
	head   []byte
}

func (r *discardRecorder) Header() http.Header { return r.header }
func (r *discardRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}
func (r *discardRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	if n := 512 - len(r.head); n > 0 {
		r.head = append(r.head, b[:min(n, len(b))]...)
	}
	return len(b), nil
}
