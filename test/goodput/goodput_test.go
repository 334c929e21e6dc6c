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
	// promptTokens + maxTokens is the charge of every request, in tokens
	// (but in the anthropic-refund scenario, whose max_tokens is
	// refundMaxTokens).
	promptTokens = 40
	maxTokens    = 60
	// refundMaxTokens and refundOutputTokens are the anthropic-refund
	// scenario's max_tokens and generated tokens: 180 of the 200 reserved
	// output tokens are refunded at the end of every response.
	refundMaxTokens    = 200
	refundOutputTokens = 20
	// latency is the simulator's delay before answering.
	latency = 20 * time.Millisecond
	// concurrency is the gateway's upstream concurrency and the naive
	// client's worker count.
	concurrency = 16
	// backlog is the number of requests to drain: more than any client can
	// finish in a run (the initial burst of a full minute bucket is 600).
	backlog = 3000
	// Warmup is the pacer's warm-up (it never bursts, so a fixed time
	// will do); Measure is the benchmark's steady-state window.
	Warmup  = 5 * time.Second
	Measure = 20 * time.Second
	// MaxWarmup bounds the warm-up of the clients that burst: the run
	// fails if the simulator's quota has not run short by then.
	MaxWarmup = 45 * time.Second
	// Settle follows the first shortage; the measurement starts at the
	// next shortage after it (then up to the window boundary): the
	// responses in flight at the first end within the simulator's latency
	// and refund their unused output reservation, up to concurrency x 180
	// tokens in the anthropic-refund scenario, which the client then spends.
	Settle = time.Second
	// SettleMax ends the warm-up of a continuous bucket at the latest this
	// long after Settle, drained or not.
	SettleMax = 5 * time.Second
	// NoShortage ends the warm-up of a client that has not run the quota
	// short this long after its start.
	NoShortage = 20 * time.Second
)

// scenario is one dialect's simulator and quota.
type scenario struct {
	name      string
	sim       providersim.Config
	hint      string // the ProviderPool dialect hint (api/v1alpha1 Dialect)
	requests  bool   // utilisation counts requests (the dialect's headers count requests), else tokens
	align     time.Duration
	maxTokens int64 // the requests' max_tokens
	// models are the models the backlog's jobs name in turn, all counted
	// against the simulator's one quota, in the ProviderPool's
	// rateLimitGroup group; nil: [model] without a group.
	models []string
	group  string
	// hidden is the most quota, in the utilisation's unit, that the
	// dialect's rounding of remaining can hide from the client (Anthropic:
	// a 1,000-token step): a bucket may keep that much unseen, and a
	// measurement may gain it (see TestGoodputGateway's upper bound).
	hidden float64
}

// scenarios are the six dialects with the quotas of the package doc;
// Anthropic three times: separate input and output buckets (the default
// headers), the same with max_tokens ten times the output (refunds), and
// one tokens bucket with the tokens triplet only.
func scenarios() []scenario {
	tok := func(d string) providersim.Config {
		return providersim.Config{Dialect: d, TokensPerMinute: 60000, RequestsPerMinute: 1200}
	}
	// Anthropic: separate input and output buckets, both binding at 10
	// requests/s (40 input and 60 output tokens per request), described by
	// the input-tokens and output-tokens triplets rounded to the nearest
	// thousand (the default AnthropicHeadersInOut mode); no tokens triplet.
	anth := providersim.Config{Dialect: providersim.DialectAnthropic, InputTokensPerMinute: 24000,
		OutputTokensPerMinute: 36000, RequestsPerMinute: 1200}
	// anthropic-refund: 200 output tokens reserved, 20 generated: 10
	// requests/s is 400 input and 200 (net) output tokens per second.
	anthRefund := providersim.Config{Dialect: providersim.DialectAnthropic, InputTokensPerMinute: 24000,
		OutputTokensPerMinute: 12000, RequestsPerMinute: 1200}
	// anthropic-tokens: one 60000 TPM bucket described by the tokens
	// triplet only, rounded down (AnthropicHeadersTokens).
	anthTokens := tok(providersim.DialectAnthropic)
	anthTokens.AnthropicHeaders = providersim.AnthropicHeadersTokens
	s := []scenario{
		{name: providersim.DialectOpenAI, sim: tok(providersim.DialectOpenAI), hint: "OpenAI"},
		{name: providersim.DialectAnthropic, sim: anth, hint: "Anthropic", hidden: providersim.DefaultAnthropicRemainingStep},
		{name: "anthropic-refund", sim: anthRefund, hint: "Anthropic", maxTokens: refundMaxTokens, hidden: providersim.DefaultAnthropicRemainingStep},
		{name: "anthropic-tokens", sim: anthTokens, hint: "Anthropic", hidden: providersim.DefaultAnthropicRemainingStep},
		{name: providersim.DialectAzure, sim: tok(providersim.DialectAzure), hint: "Azure", align: 10 * time.Second},
		{name: providersim.DialectClassic, sim: providersim.Config{Dialect: providersim.DialectClassic, RequestsPerMinute: 600},
			hint: "Classic", requests: true, align: 5 * time.Second},
		{name: providersim.DialectIETF, sim: tok(providersim.DialectIETF), hint: "IETF", align: 5 * time.Second},
		{name: providersim.DialectIETFLegacy, sim: providersim.Config{Dialect: providersim.DialectIETFLegacy, RequestsPerMinute: 600},
			hint: "IETF", requests: true, align: 5 * time.Second},
	}
	for i := range s {
		s[i].sim.Latency, s[i].sim.OutputTokens = latency, maxTokens
		if s[i].maxTokens == 0 {
			s[i].maxTokens = maxTokens
		} else {
			s[i].sim.OutputTokens = refundOutputTokens
		}
		switch s[i].name {
		case providersim.DialectAzure:
			s[i].sim.SubWindow = 10 * time.Second
		case providersim.DialectClassic, providersim.DialectIETF, providersim.DialectIETFLegacy:
			s[i].sim.Window = 5 * time.Second
		}
	}
	return s
}

// groupScenario is the openai scenario with the backlog spread over two
// models that the simulator counts against its one quota (as OpenAI counts a
// model's dated snapshots against one limit), in one rateLimitGroup. Without
// the group, each model's throttle takes the shared remaining for its own:
// about 30 upstream 429s in the 10 s measured.
func groupScenario() scenario {
	s := scenarios()[0]
	s.name, s.models, s.group = "openai-group", []string{model, model + "-2024-07-18"}, model
	return s
}

// modelNames returns the scenario's models ([model] by default).
func (s scenario) modelNames() []string {
	if len(s.models) == 0 {
		return []string{model}
	}
	return s.models
}

// tokensPerMinute is the tokens quota: TokensPerMinute, or for Anthropic's
// separate buckets ITPM + OTPM (the gateway's pool is configured with it).
func (s scenario) tokensPerMinute() int64 {
	if s.sim.TokensPerMinute > 0 {
		return s.sim.TokensPerMinute
	}
	return s.sim.InputTokensPerMinute + s.sim.OutputTokensPerMinute
}

// perSecond is the binding quota in its unit (tokens or requests) per second.
func (s scenario) perSecond() float64 {
	if s.requests {
		return float64(s.sim.RequestsPerMinute) / 60
	}
	return float64(s.tokensPerMinute()) / 60
}

// unit is one accepted request in the binding unit: 1 request, or the
// tokens it finally costs (prompt and generated tokens, the unused output
// reservation being refunded).
func (s scenario) unit() float64 {
	if s.requests {
		return 1
	}
	return float64(promptTokens + min(s.sim.OutputTokens, s.maxTokens))
}

// interval is the fixed-rate pacer's period: one request per unit of quota.
func (s scenario) interval() time.Duration {
	return time.Duration(s.unit() / s.perSecond() * float64(time.Second))
}

// event is one chat completion the simulator answered.
type event struct {
	at     time.Time
	status int
	body   string // the start of a 429's body (the simulator names the short dimension and by how much)
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
	body   []byte // the first bytes of a 429's body
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
	if w.status == http.StatusTooManyRequests && len(w.body) < 512 {
		w.body = append(w.body, b[:min(len(b), 512-len(w.body))]...)
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
		r.events = append(r.events, event{at, sw.status, string(sw.body)})
		r.mu.Unlock()
	})
}

// result is one run's figures.
type result struct {
	dialect, client string
	util            float64  // percent of the quota used in the measurement window
	throttled       int      // 429s for requests that arrived in the measurement window
	throttledDetail []string // for each of them: its arrival after the window's start and the simulator's message
	warmupThrottled int      // 429s before it
	accepted        int      // requests accepted in the measurement window
	other           int      // responses neither 200 nor 429 in the window
	from, to        time.Time
	warmup          time.Duration // from the start to the measurement
}

func (r result) String() string {
	return fmt.Sprintf("%-16s %-7s util %6.2f%%  429s %4d (warm-up %4d, %5.2fs)  accepted %4d  other %d",
		r.dialect, r.client, r.util, r.throttled, r.warmupThrottled, r.warmup.Seconds(), r.accepted, r.other)
}

// window returns the measurement window for a warm-up that ended at end:
// from end aligned up to the scenario's window boundary, for length.
func (s scenario) window(end time.Time, length time.Duration) (from, to time.Time) {
	from = end
	if s.align > 0 {
		if tr := from.Truncate(s.align); tr.Before(from) {
			from = tr.Add(s.align)
		}
	}
	return from, from.Add(length)
}

// drained reports whether some continuously replenished meter holds at
// most 5% of what it refills over length: the binding bucket's initial
// content is spent, so the measurement cannot gain more than 5% from it.
func drained(levels map[string]providersim.Level, length time.Duration, hidden float64) bool {
	for _, l := range levels {
		if l.Window == 0 && l.Level <= max(0.05*l.Limit/60*length.Seconds(), hidden) {
			return true
		}
	}
	return false
}

// client drains the backlog against the simulator at simURL until ctx ends.
type client func(ctx context.Context, tb testing.TB, s scenario, simURL string)

// run measures one client against a fresh simulator of the scenario. The
// warm-up ends on an event, not after a fixed time, once the simulator's
// quota has first run short (providersim.Stats.FirstExhausted: the
// initially full buckets have been spent, so the burst cannot land in the
// measurement): at once when fixed windows bind (align > 0); for
// continuous buckets Settle later, at the next shortage or as soon as a
// bucket holds at most 5% of its refill over the measurement (drained),
// so that a pause after the first shortage cannot leave a surplus to spend
// in the measurement. For a paced client (which never bursts), after
// Warmup. It fails if the warm-up has not ended within MaxWarmup. The
// measurement then starts at the next window boundary of the scenario and
// lasts length.
func run(tb testing.TB, s scenario, name string, c client, paced bool, length time.Duration) result {
	tb.Helper()
	rec := &recorder{}
	ps := providersim.New(s.sim)
	sim := httptest.NewServer(rec.wrap(ps))
	defer sim.Close()
	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		from, to  time.Time
		warmupErr error
		done      = make(chan struct{})
	)
	go func() { // ends the run (cancel) at the end of the measurement
		defer close(done)
		defer cancel()
		wait := func(until time.Time) bool {
			t := time.NewTimer(time.Until(until))
			defer t.Stop()
			select {
			case <-t.C:
				return true
			case <-ctx.Done():
				return false
			}
		}
		end := start.Add(Warmup)
		if !paced {
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			var settled time.Time
			for {
				st := ps.Stats()
				if first := st.FirstExhausted; !first.IsZero() {
					if s.align > 0 {
						// Fixed windows (or Azure's sub-windows) bind:
						// the measurement spans whole windows, whose
						// limits cap it, so the first shortage will do.
						end = first
						break
					}
					if settled.IsZero() {
						settled = first.Add(Settle)
					}
					if st.LastExhausted.After(settled) {
						end = st.LastExhausted
						break
					}
					if now := time.Now(); now.After(settled) && drained(ps.Levels(), length, s.hidden) {
						end = now
						break
					}
					if now := time.Now(); now.After(settled.Add(SettleMax)) {
						// The initial burst is long spent (the quota ran
						// short SettleMax ago): what a bucket still holds is
						// bounded by the upper bound's allowance.
						end = now
						break
					}
				}
				if st.FirstExhausted.IsZero() && time.Since(start) > NoShortage {
					// The client paced below the quota from the start (it
					// never spent the initial bucket): nothing to wait for.
					end = time.Now()
					break
				}
				if time.Since(start) > MaxWarmup {
					warmupErr = fmt.Errorf("%s/%s: warm-up never ended: within %v the simulator's quota did not run short, "+
						"or not again after %v with every bucket above 5%% of its refill over the measurement "+
						"(stats %+v, levels %+v), so the initial burst cannot be told apart from the steady state",
						s.name, name, MaxWarmup, Settle, st, ps.Levels())
					return
				}
				select {
				case <-tick.C:
				case <-ctx.Done():
					return
				}
			}
		}
		from, to = s.window(end, length)
		wait(to.Add(100 * time.Millisecond))
	}()
	c(ctx, tb, s, sim.URL)
	<-ctx.Done()
	<-done
	if warmupErr != nil {
		tb.Fatal(warmupErr)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	r := result{dialect: s.name, client: name, from: from, to: to, warmup: from.Sub(start)}
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
			r.throttledDetail = append(r.throttledDetail, fmt.Sprintf("at +%v: %s", e.at.Sub(from).Round(time.Millisecond), e.body))
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

func requestBody(s scenario) []byte { return requestBodyFor(s, model) }

// requestBodyFor is requestBody naming model m.
func requestBodyFor(s scenario, m string) []byte {
	b, _ := json.Marshal(map[string]any{
		"model": m, "max_tokens": s.maxTokens,
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
		CostModel:       limiter.CostModel{InputWeight: 1, OutputWeight: 1},
		MaxQueuedJobs:   backlog,
		UpstreamTimeout: 30 * time.Second,
	}
	for _, m := range s.modelNames() {
		pool.Models = append(pool.Models, registry.ModelPolicy{Name: m, TokensPerMinute: s.tokensPerMinute(), RequestsPerMinute: s.sim.RequestsPerMinute,
			RateLimitGroup: s.group})
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

	var lines [][]byte
	for _, m := range s.modelNames() {
		line, _ := json.Marshal(map[string]any{"endpoint": "/v1/chat/completions", "body": json.RawMessage(requestBodyFor(s, m))})
		lines = append(lines, line)
	}
	var upload bytes.Buffer
	for i := range backlog {
		upload.Write(lines[i%len(lines)])
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
		MaxTokens: openai.Int(s.maxTokens),
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
	body := requestBody(s)
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
	name  string
	c     client
	paced bool // never bursts: fixed Warmup
}{{"gateway", gatewayClient, false}, {"naive", naiveClient, false}, {"pacer", pacerClient, true}}

// BenchmarkGoodput runs every client against every dialect once per b.N
// (use -benchtime 1x) and reports the steady-state utilisation ("util%") and
// 429 count ("429s"), and the warm-up's 429s ("warmup429s").
func BenchmarkGoodput(b *testing.B) {
	for _, s := range scenarios() {
		for _, c := range clients {
			b.Run("dialect="+s.name+"/client="+c.name, func(b *testing.B) {
				var util, throttled, warm float64
				for i := 0; i < b.N; i++ {
					r := run(b, s, c.name, c.c, c.paced, Measure)
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
// drains a backlog with no upstream 429 after the warm-up and between 90%
// and 105% of the quota used (more than 100% means the initial burst
// leaked into the measurement: the measurement is wrong). The scenarios run
// at once, each against its own simulator, from goroutines (so -parallel
// does not serialise them): the warm-up (see run: about 3-28 s, at most
// MaxWarmup), up to the next window boundary, then 10 s measured, so that
// a fixed-window dialect's measurement spans whole windows: about 15-45 s
// in all. openai-group (groupScenario) spreads the backlog over two models
// of one rateLimitGroup that share the simulator's quota. Where the dialect rounds remaining (scenario.hidden > 0,
// Anthropic), a 10 s measurement is imprecise by up to the hidden amount:
// only no 429 and at least 80% are asserted there.
func TestGoodputGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 15-45 s on the real clock")
	}
	var wg sync.WaitGroup
	for _, s := range append(scenarios(), groupScenario()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.Run(s.name, func(t *testing.T) {
				r := run(t, s, "gateway", gatewayClient, false, 10*time.Second)
				t.Log(r)
				if r.throttled != 0 {
					t.Errorf("%d upstream 429s after the warm-up, want 0:\n%s", r.throttled, strings.Join(r.throttledDetail, "\n"))
				}
				switch {
				case s.hidden == 0 && (r.util < 90 || r.util > 105):
					t.Errorf("utilisation %.2f%%, want within [90%%, 105%%]", r.util)
				case s.hidden > 0 && r.util < 80:
					// The rounding of remaining hides up to s.hidden in each
					// bucket, so a 10 s measurement may read well above 100%
					// (the benchmark's 20 s figures are the reference); it
					// must still not stall.
					t.Errorf("utilisation %.2f%%, want at least 80%%", r.util)
				}
				if r.other != 0 {
					t.Errorf("%d responses neither 200 nor 429", r.other)
				}
			})
		}()
	}
	wg.Wait()
}
