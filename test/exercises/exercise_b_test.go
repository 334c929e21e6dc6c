package exercises

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/providersim"
)

// The two request shapes of seed 002 section 1, in provider tokens: tenant A
// ("tiny") sends 50 prompt tokens and gets 100 output tokens, tenant B
// ("huge") sends 100,000 prompt tokens and gets 4,000.
const (
	tinyPrompt, tinyOutput = 50, 100
	hugePrompt, hugeOutput = 100_000, 4_000
)

// Exercise B sizing. The request plan of phase 1 is small because every
// huge request is tokenized by the gateway and by the simulator (100,000
// cl100k_base tokens each time).
const (
	// Phase 1: 60 requests per minute, bucket of 2, nothing else.
	p1RequestsPerMinute, p1RequestBurst = 60, 2
	p1Window                            = 4900 * time.Millisecond
	// Phase 2: weighted tokens per minute and a bucket of exactly one huge
	// request (100,000 + 4,000 x 4 = 116,000 weighted tokens), so that the
	// huge tenant may send one huge request every 4 s; 4 calls in flight;
	// 6,500 KV blocks (one huge request: ceil(104,000 / 16)); and a request
	// rate far above what either needs (the secondary bound, seed 002
	// section 2).
	p2WeightedPerMinute, p2WeightedBurst = 1_740_000, 116_000
	p2MaxConcurrent, p2MaxKVBlocks       = 4, 6_500
	p2RequestsPerMinute, p2RequestBurst  = 12_000, 200
	p2Window                             = 9500 * time.Millisecond
	// Client workers per tenant (same in both phases).
	tinyWorkers, hugeWorkers = 4, 2
)

// simForB is a provider that never binds (1e9 tokens and 1e6 requests per
// minute) and generates up to 4,000 tokens per answer, capped by max_tokens
// (so tiny gets 100 and huge 4,000), 100 µs per token after 2 ms.
var simForB = providersim.Config{TokensPerMinute: 1_000_000_000, RequestsPerMinute: 1_000_000,
	OutputTokens: hugeOutput, Latency: 2 * time.Millisecond, FrameInterval: 100 * time.Microsecond}

// TestExercise693xArithmetic reproduces the figures of seed 002 section 1 ("Same
// limit. 693x the resource consumption."): 1,000 requests a minute of each
// shape, in provider tokens and in the pool's weighted tokens.
func TestExercise693xArithmetic(t *testing.T) {
	a := int64(1000) * (tinyPrompt + tinyOutput)
	b := int64(1000) * (hugePrompt + hugeOutput)
	if a != 150_000 || b != 104_000_000 {
		t.Fatalf("provider tokens per minute: A %d, B %d; want 150,000 and 104,000,000", a, b)
	}
	if got := fmt.Sprintf("%.2f", ratio(b, a)); got != "693.33" {
		t.Fatalf("provider token ratio %s, want 693.33", got)
	}
	wa, wb := 1000*costModel.Weighted(tinyPrompt, tinyOutput), 1000*costModel.Weighted(hugePrompt, hugeOutput)
	if wa != 450_000 || wb != 116_000_000 {
		t.Fatalf("weighted tokens per minute: A %d, B %d; want 450,000 and 116,000,000", wa, wb)
	}
	if got := fmt.Sprintf("%.2f", ratio(wb, wa)); got != "257.78" {
		t.Fatalf("weighted token ratio %s, want 257.78", got)
	}
	if c := costModel.Cost(hugePrompt, hugeOutput); c.Weighted != p2WeightedBurst || c.KVBlocks != p2MaxKVBlocks {
		t.Fatalf("a huge request charges %d weighted tokens and %d KV blocks; the phase 2 plan assumes %d and %d",
			c.Weighted, c.KVBlocks, p2WeightedBurst, p2MaxKVBlocks)
	}
}

// occupancy is a tenant's KV-cache occupancy as its limiter counts it (the
// blocks held by its calls in flight: ceil((prompt + max output) / 16)),
// sampled every occupancyPeriod: the peak, and the integral in block-seconds
// (seed 002 section 2: memory-time).
type occupancy struct {
	peakBlocks, peakInFlight int64
	blockSeconds             float64
}

// occupancyPeriod is the sampling period of occupancy.
const occupancyPeriod = 2 * time.Millisecond

// sampleOccupancy samples the limiter of tenant id until stop is closed.
func sampleOccupancy(h *harness, id string, stop <-chan struct{}, o *occupancy) {
	lim := h.reg.Tenant(id).Limiter
	tick := time.NewTicker(occupancyPeriod)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-stop:
			return
		case now := <-tick.C:
			s := lim.Snapshot(now)
			o.peakBlocks = max(o.peakBlocks, s.KVBlocks)
			o.peakInFlight = max(o.peakInFlight, s.InFlight)
			o.blockSeconds += float64(s.KVBlocks) * now.Sub(last).Seconds()
			last = now
		}
	}
}

// phaseResult is one phase of exercise B.
type phaseResult struct {
	tiny, huge     tally
	occTiny        occupancy
	occHuge        occupancy
	window         time.Duration
	providerPrompt int64
	providerOutput int64
}

// runPhase serves tiny and huge with limits l, lets both clients send as
// fast as the plan allows for window, and measures.
func runPhase(t *testing.T, l limiter.Limits, window time.Duration) *phaseResult {
	t.Helper()
	h := newHarness(t, simForB, tenantPolicy("tiny", l), tenantPolicy("huge", l))
	tinyBody := chatBody(t, tinyPrompt, tinyOutput)
	hugeBody := chatBody(t, hugePrompt, hugeOutput)
	res := &phaseResult{window: window}
	pt, ph := newPacer(), newPacer()
	// What each client knows it will be charged: its weighted estimate
	// (prompt x 1 + max_tokens x 4, the pool's published cost model) and
	// one request.
	costTiny := map[string]float64{dimTokens: float64(costModel.Cost(tinyPrompt, tinyOutput).Weighted), dimRequests: 1}
	costHuge := map[string]float64{dimTokens: float64(costModel.Cost(hugePrompt, hugeOutput).Weighted), dimRequests: 1}
	stop := make(chan struct{})
	var samplers sync.WaitGroup
	samplers.Go(func() { sampleOccupancy(h, "tiny", stop, &res.occTiny) })
	samplers.Go(func() { sampleOccupancy(h, "huge", stop, &res.occHuge) })
	deadline := time.Now().Add(window)
	var wg sync.WaitGroup
	wg.Go(func() { politeWorkers(h, "tiny", tinyBody, costTiny, tinyWorkers, deadline, nil, pt, &res.tiny, nil) })
	wg.Go(func() { politeWorkers(h, "huge", hugeBody, costHuge, hugeWorkers, deadline, nil, ph, &res.huge, nil) })
	wg.Wait()
	close(stop)
	samplers.Wait()
	st := h.sim.Stats()
	res.providerPrompt, res.providerOutput = st.PromptTokens, st.CompletionTokens
	for _, tl := range []*tally{&res.tiny, &res.huge} {
		if tl.transportErrors > 0 {
			t.Errorf("%d transport errors", tl.transportErrors)
		}
	}
	return res
}

// table renders a phase as a table.
func (r *phaseResult) table(title string) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s\n", title)
	w := tabwriter.NewWriter(&sb, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "tenant\tsent\tok\trefused\tprompt tok\toutput tok\tprovider tok\tweighted tok\tweighted/ok\tpeak KV blocks\tKV block-s\trefusals by code\t")
	for _, row := range []struct {
		name string
		tl   *tally
		occ  *occupancy
	}{{"tiny", &r.tiny, &r.occTiny}, {"huge", &r.huge, &r.occHuge}} {
		tl := row.tl
		per := int64(0)
		if tl.ok > 0 {
			per = tl.weighted() / tl.ok
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%.1f\t%s\t\n", row.name, tl.sent, tl.ok, tl.rejections(),
			tl.prompt, tl.output, tl.provider(), tl.weighted(), per, row.occ.peakBlocks, row.occ.blockSeconds, tl.codes())
	}
	_ = w.Flush()
	fmt.Fprintf(&sb, "huge / tiny: successful requests %.3gx, provider tokens %.1fx, weighted tokens %.2fx, KV block-seconds %.0fx\n",
		ratio(r.huge.ok, r.tiny.ok), ratio(r.huge.provider(), r.tiny.provider()), ratio(r.huge.weighted(), r.tiny.weighted()),
		r.occHuge.blockSeconds/r.occTiny.blockSeconds)
	fmt.Fprintf(&sb, "provider (simulator) counted %d prompt + %d output tokens\n", r.providerPrompt, r.providerOutput)
	return sb.String()
}

// TestExerciseB is seed 002 exercise B: "Simulate two tenants under a
// request-based limit, one sending tiny requests and one sending huge ones.
// Measure actual resource consumption. Then switch to token+concurrency
// limiting and re-measure."
//
// Both tenants run the same client (the header-paced client of exercise D,
// so that each sends exactly as fast as its plan allows); only the request
// shape differs. Consumption is measured from the usage of every successful
// response, in provider tokens (prompt + output) and weighted tokens
// (prompt x 1 + output x 4).
func TestExerciseB(t *testing.T) {
	start := time.Now()

	// Phase 1: a request-count plan only.
	p1 := runPhase(t, limiter.Limits{RequestsPerMinute: i64(p1RequestsPerMinute), RequestBurst: i64(p1RequestBurst)}, p1Window)
	t.Log("\n" + p1.table(fmt.Sprintf("Exercise B, phase 1: both tenants %d requests/min (bucket %d), no token limit; window %v",
		p1RequestsPerMinute, p1RequestBurst, p1Window)))

	// Phase 2: tokens + concurrency + KV blocks (+ a loose request rate).
	l2 := limiter.Limits{WeightedPerMinute: i64(p2WeightedPerMinute), WeightedBurst: i64(p2WeightedBurst),
		MaxConcurrent: i64(p2MaxConcurrent), MaxKVBlocks: i64(p2MaxKVBlocks),
		RequestsPerMinute: i64(p2RequestsPerMinute), RequestBurst: i64(p2RequestBurst)}
	p2 := runPhase(t, l2, p2Window)
	t.Log("\n" + p2.table(fmt.Sprintf("Exercise B, phase 2: both tenants %d weighted tokens/min (bucket %d), %d in flight, %d KV blocks, %d requests/min; window %v",
		p2WeightedPerMinute, p2WeightedBurst, p2MaxConcurrent, p2MaxKVBlocks, p2RequestsPerMinute, p2Window)))
	t.Logf("exercise B wall time %v", time.Since(start).Round(100*time.Millisecond))

	// Every successful answer has exactly the seed's shape.
	for _, p := range []*phaseResult{p1, p2} {
		if p.tiny.ok == 0 || p.huge.ok == 0 {
			t.Fatalf("a tenant got nothing: tiny %d, huge %d successes", p.tiny.ok, p.huge.ok)
		}
		if p.tiny.prompt != tinyPrompt*p.tiny.ok || p.tiny.output != tinyOutput*p.tiny.ok {
			t.Errorf("tiny: %d prompt and %d output tokens over %d answers, want %d and %d each", p.tiny.prompt, p.tiny.output, p.tiny.ok, tinyPrompt, tinyOutput)
		}
		if p.huge.prompt != hugePrompt*p.huge.ok || p.huge.output != hugeOutput*p.huge.ok {
			t.Errorf("huge: %d prompt and %d output tokens over %d answers, want %d and %d each", p.huge.prompt, p.huge.output, p.huge.ok, hugePrompt, hugeOutput)
		}
		// The only refusals are the tenant's own rate, concurrency and
		// memory limits (never the provider's quota, never a 413).
		for _, tl := range []*tally{&p.tiny, &p.huge} {
			for code := range tl.rejected {
				switch limiter.Reason(code) {
				case limiter.ReasonRequestRate, limiter.ReasonTokenRate, limiter.ReasonConcurrency, limiter.ReasonMemory:
				default:
					t.Errorf("unexpected refusals: %s", tl.codes())
				}
			}
		}
		// The provider billed exactly what the tenants' usage says.
		if got, want := p.providerPrompt+p.providerOutput, p.tiny.provider()+p.huge.provider(); got != want {
			t.Errorf("the simulator counted %d provider tokens, the usage of the answers %d", got, want)
		}
	}

	// Phase 1: the same number of requests (the plan binds both equally:
	// at most bucket + rate x window each), hundreds of times the resources.
	maxReq := int64(p1RequestBurst + p1RequestsPerMinute*(p1Window+time.Second).Seconds()/60)
	for name, tl := range map[string]*tally{"tiny": &p1.tiny, "huge": &p1.huge} {
		if tl.ok > maxReq {
			t.Errorf("phase 1: %s got %d requests through a plan that allows at most %d in the window", name, tl.ok, maxReq)
		}
	}
	// Both get through at least the bucket; tiny, whose calls are cheap,
	// gets what the plan allows in the window (bucket + one per second) but
	// one. Huge may get fewer on a loaded machine: each of its calls costs
	// two 100,000-token tokenizations.
	minTiny := int64(p1RequestBurst+p1RequestsPerMinute*int64(p1Window/time.Second)/60) - 1
	if p1.huge.ok < p1RequestBurst || p1.tiny.ok < minTiny {
		t.Errorf("phase 1: tiny got %d requests, huge %d; want at least %d and %d", p1.tiny.ok, p1.huge.ok, minTiny, p1RequestBurst)
	}
	if r := ratio(p1.huge.weighted(), p1.tiny.weighted()); r <= 20 {
		t.Errorf("phase 1: huge consumed %.1fx the weighted tokens of tiny, want > 20x", r)
	}
	if r := ratio(p1.huge.provider(), p1.tiny.provider()); r <= 20 {
		t.Errorf("phase 1: huge consumed %.1fx the provider tokens of tiny, want > 20x", r)
	}

	// Phase 2: each tenant within its plan (bucket + rate x window, plus one
	// second of rate for a call sent at the end of the window), and about
	// the same consumption.
	ceiling := p2WeightedBurst + int64(float64(p2WeightedPerMinute)/60*(p2Window+time.Second).Seconds())
	for name, tl := range map[string]*tally{"tiny": &p2.tiny, "huge": &p2.huge} {
		if tl.weighted() > ceiling {
			t.Errorf("phase 2: %s consumed %d weighted tokens, above the plan's %d for the window", name, tl.weighted(), ceiling)
		}
	}
	if r := ratio(p2.huge.weighted(), p2.tiny.weighted()); r >= 2 || r <= 0.5 {
		t.Errorf("phase 2: huge consumed %.2fx the weighted tokens of tiny, want within (0.5, 2)", r)
	}
}
