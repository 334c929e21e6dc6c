package goodput

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

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"k8s.io/utils/clock"

	"github.com/fairshare-dev/fairshare/internal/gateway"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/providersim"
	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/tokencount"
)

const (
	model = "gpt-4o-mini"
	// promptTokens + maxTokens is the charge of every request, in tokens.
	promptTokens = 40
	maxTokens    = 60
	charge       = promptTokens + maxTokens
	// latency is the simulator's delay before answering.
	latency = 20 * time.Millisecond
	// concurrency is the gateway's upstream concurrency and the naive
	// client's worker count.
	concurrency = 16
	// backlog is the number of requests to drain: more than any client can
	// finish in a run (the initial burst of a full minute bucket is 600).
	backlog = 3000
	// Warmup is excluded from the figures; Measure is the steady-state window.
	Warmup  = 5 * time.Second
	Measure = 20 * time.Second
)

// scenario is one dialect's simulator and quota.
type scenario struct {
	name     string
	sim      providersim.Config
	hint     string // the ProviderPool dialect hint (api/v1alpha1 Dialect)
	requests bool   // utilisation counts requests (the dialect's headers count requests), else tokens
	align    time.Duration
}

// scenarios are the six dialects with the quotas of the package doc.
func scenarios() []scenario {
	tok := func(d string) providersim.Config {
		return providersim.Config{Dialect: d, TokensPerMinute: 60000, RequestsPerMinute: 1200}
	}
	s := []scenario{
		{name: providersim.DialectOpenAI, sim: tok(providersim.DialectOpenAI), hint: "OpenAI"},
		{name: providersim.DialectAnthropic, sim: tok(providersim.DialectAnthropic), hint: "Anthropic"},
		{name: providersim.DialectAzure, sim: tok(providersim.DialectAzure), hint: "Azure", align: 10 * time.Second},
		{name: providersim.DialectClassic, sim: providersim.Config{Dialect: providersim.DialectClassic, RequestsPerMinute: 600},
			hint: "Classic", requests: true, align: 5 * time.Second},
		{name: providersim.DialectIETF, sim: tok(providersim.DialectIETF), hint: "IETF", align: 5 * time.Second},
		{name: providersim.DialectIETFLegacy, sim: providersim.Config{Dialect: providersim.DialectIETFLegacy, RequestsPerMinute: 600},
			hint: "IETF", requests: true, align: 5 * time.Second},
	}
	for i := range s {
		s[i].sim.Latency, s[i].sim.OutputTokens = latency, maxTokens
		switch s[i].name {
		case providersim.DialectAzure:
			s[i].sim.SubWindow = 10 * time.Second
		case providersim.DialectClassic, providersim.DialectIETF, providersim.DialectIETFLegacy:
			s[i].sim.Window = 5 * time.Second
		}
	}
	return s
}

// perSecond is the binding quota in its unit (tokens or requests) per second.
func (s scenario) perSecond() float64 {
	if s.requests {
		return float64(s.sim.RequestsPerMinute) / 60
	}
	return float64(s.sim.TokensPerMinute) / 60
}

// unit is one accepted request in the binding unit.
func (s scenario) unit() float64 {
	if s.requests {
		return 1
	}
	return charge
}

// interval is the fixed-rate pacer's period: one request per unit of quota.
func (s scenario) interval() time.Duration {
	return time.Duration(s.unit() / s.perSecond() * float64(time.Second))
}

// event is one chat completion the simulator answered.
type event struct {
	at     time.Time
	status int
}

// recorder wraps the simulator's handler and records every chat completion's
// arrival time and status.
type recorder struct {
	mu     sync.Mutex
	events []event
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (r *recorder) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/v1/chat/completions" {
			h.ServeHTTP(w, req)
			return
		}
		at := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, req)
		r.mu.Lock()
		r.events = append(r.events, event{at, sw.status})
		r.mu.Unlock()
	})
}

// result is one run's figures.
type result struct {
	dialect, client string
	util            float64 // percent of the quota used in the measurement window
	throttled       int     // 429s for requests that arrived in the measurement window
	warmupThrottled int     // 429s before it
	accepted        int     // requests accepted in the measurement window
	other           int     // responses neither 200 nor 429 in the window
	from, to        time.Time
}

func (r result) String() string {
	return fmt.Sprintf("%-11s %-7s util %6.2f%%  429s %4d (warm-up %4d)  accepted %4d  other %d",
		r.dialect, r.client, r.util, r.throttled, r.warmupThrottled, r.accepted, r.other)
}

// window returns the measurement window of a run started at start: from the
// end of the warm-up, aligned up to the scenario's window boundary, for
// length.
func (s scenario) window(start time.Time, length time.Duration) (from, to time.Time) {
	from = start.Add(Warmup)
	if s.align > 0 {
		if tr := from.Truncate(s.align); tr.Before(from) {
			from = tr.Add(s.align)
		}
	}
	return from, from.Add(length)
}

// client drains the backlog against the simulator at simURL until ctx ends.
type client func(ctx context.Context, tb testing.TB, s scenario, simURL string)

// run measures one client against a fresh simulator of the scenario.
func run(tb testing.TB, s scenario, name string, c client, length time.Duration) result {
	tb.Helper()
	rec := &recorder{}
	sim := httptest.NewServer(rec.wrap(providersim.New(s.sim)))
	defer sim.Close()
	start := time.Now()
	from, to := s.window(start, length)
	ctx, cancel := context.WithDeadline(context.Background(), to.Add(100*time.Millisecond))
	defer cancel()
	c(ctx, tb, s, sim.URL)
	<-ctx.Done()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	r := result{dialect: s.name, client: name, from: from, to: to}
	for _, e := range rec.events {
		switch {
		case e.at.Before(from):
			if e.status == http.StatusTooManyRequests {
				r.warmupThrottled++
			}
		case !e.at.Before(to):
		case e.status == http.StatusOK:
			r.accepted++
		case e.status == http.StatusTooManyRequests:
			r.throttled++
		default:
			r.other++
		}
	}
	r.util = 100 * float64(r.accepted) * s.unit() / (s.perSecond() * to.Sub(from).Seconds())
	return r
}

// content is the user message of every request: promptTokens tokens in all
// (" the" is one cl100k_base token; one message costs the message overhead
// and the reply priming).
var content = strings.Repeat(" the", promptTokens-tokencount.MessageOverheadTokens-tokencount.ReplyPrimingTokens)

func requestBody() []byte {
	b, _ := json.Marshal(map[string]any{
		"model": model, "max_tokens": maxTokens,
		"messages": []map[string]string{{"role": "user", "content": content}},
	})
	return b
}

// gatewayClient: the backlog submitted to the Fairshare gateway as one bulk
// upload of batch jobs; the gateway drains it.
func gatewayClient(ctx context.Context, tb testing.TB, s scenario, simURL string) {
	reg := registry.New(clock.RealClock{})
	pool := registry.PoolPolicy{
		Name: "goodput", BaseURL: simURL, Dialect: s.hint,
		Models:          []registry.ModelPolicy{{Name: model, TokensPerMinute: s.sim.TokensPerMinute, RequestsPerMinute: s.sim.RequestsPerMinute}},
		CostModel:       limiter.CostModel{InputWeight: 1, OutputWeight: 1},
		MaxQueuedJobs:   backlog,
		UpstreamTimeout: 30 * time.Second,
	}
	if err := reg.SetPool(pool); err != nil {
		tb.Fatal(err)
	}
	if err := reg.UpsertTenant(registry.TenantPolicy{ID: "batch", Name: "batch", Weight: 1, MaxQueued: backlog,
		KeyHashes: []registry.KeyHash{registry.HashKey("key-batch")}}); err != nil {
		tb.Fatal(err)
	}
	reg.SetTenantsSynced()
	gw := gateway.New(gateway.Options{Registry: reg, UpstreamConcurrency: concurrency})
	srv := httptest.NewServer(gw)
	gctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = gw.Run(gctx) }()
	defer func() {
		cancel()
		<-done
		srv.Close()
	}()

	line, _ := json.Marshal(map[string]any{"endpoint": "/v1/chat/completions", "body": json.RawMessage(requestBody())})
	var upload bytes.Buffer
	for range backlog {
		upload.Write(line)
		upload.WriteByte('\n')
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/jobs/bulk", &upload)
	req.Header.Set("Authorization", "Bearer key-batch")
	req.Header.Set("Content-Type", "application/x-ndjson")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	var br struct {
		Queued, Refused int
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err := json.Unmarshal(b, &br); err != nil || resp.StatusCode != http.StatusOK || br.Queued != backlog {
		tb.Fatalf("bulk upload: %d queued %d refused %d: %.300s", resp.StatusCode, br.Queued, br.Refused, b)
	}
	<-ctx.Done()
}

// naiveClient: the openai-go SDK with its default retry policy, concurrency
// workers; a request that still fails after the SDK's retries is sent again.
func naiveClient(ctx context.Context, tb testing.TB, s scenario, simURL string) {
	c := openai.NewClient(option.WithBaseURL(simURL+"/v1/"), option.WithAPIKey("sk-naive"))
	params := openai.ChatCompletionNewParams{
		Model:     model,
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(content)},
		MaxTokens: openai.Int(maxTokens),
	}
	var left atomic.Int64
	left.Store(backlog)
	var wg sync.WaitGroup
	for range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && left.Load() > 0 {
				if _, err := c.Chat.Completions.New(ctx, params); err == nil {
					left.Add(-1)
				}
			}
		}()
	}
	wg.Wait()
}

// pacerClient: one request per interval at the nominal limit, whatever the
// answers; a refused request is sent again at a later tick.
func pacerClient(ctx context.Context, tb testing.TB, s scenario, simURL string) {
	body := requestBody()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer hc.CloseIdleConnections()
	var left atomic.Int64
	left.Store(backlog)
	var wg sync.WaitGroup
	defer wg.Wait()
	tick := time.NewTicker(s.interval())
	defer tick.Stop()
	send := func() {
		defer wg.Done()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, simURL+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			left.Add(-1)
		}
	}
	for left.Load() > 0 {
		wg.Add(1)
		go send()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

var clients = []struct {
	name string
	c    client
}{{"gateway", gatewayClient}, {"naive", naiveClient}, {"pacer", pacerClient}}

// BenchmarkGoodput runs every client against every dialect once per b.N
// (use -benchtime 1x) and reports the steady-state utilisation ("util%") and
// 429 count ("429s"), and the warm-up's 429s ("warmup429s").
func BenchmarkGoodput(b *testing.B) {
	for _, s := range scenarios() {
		for _, c := range clients {
			b.Run("dialect="+s.name+"/client="+c.name, func(b *testing.B) {
				var util, throttled, warm float64
				for i := 0; i < b.N; i++ {
					r := run(b, s, c.name, c.c, Measure)
					b.Log(r)
					util += r.util
					throttled += float64(r.throttled)
					warm += float64(r.warmupThrottled)
				}
				n := float64(b.N)
				b.ReportMetric(util/n, "util%")
				b.ReportMetric(throttled/n, "429s")
				b.ReportMetric(warm/n, "warmup429s")
			})
		}
	}
}

// TestGoodputGateway: in every dialect the simulator speaks, the gateway
// drains a backlog with no upstream 429 after the warm-up and at least 90%
// of the quota used (the dialects run in parallel, each against its own
// simulator: about 25 s in all with -parallel 6; 5 s warm-up, then 10 s
// measured from a window boundary, so that a fixed-window dialect's
// measurement spans whole windows).
func TestGoodputGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("runs about 25 s on the real clock")
	}
	for _, s := range scenarios() {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			r := run(t, s, "gateway", gatewayClient, 10*time.Second)
			t.Log(r)
			if r.throttled != 0 {
				t.Errorf("%d upstream 429s after the warm-up, want 0", r.throttled)
			}
			if r.util < 90 {
				t.Errorf("utilisation %.2f%%, want >= 90%%", r.util)
			}
			if r.other != 0 {
				t.Errorf("%d responses neither 200 nor 429", r.other)
			}
		})
	}
}
