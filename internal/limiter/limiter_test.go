package limiter

import (
	"math"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// now0 is the regression cases' NOW: 2026-01-01T00:00:00Z.
var now0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func i64(v int64) *int64 { return &v }

func at(d time.Duration) time.Time { return now0.Add(d) }

// ones is a cost model with input and output weights 1 and one token per KV
// block, so weighted tokens equal provider tokens and KV blocks.
var ones = CostModel{InputWeight: 1, OutputWeight: 1, KVBlockTokens: 1}

// weighted returns the exact tokens in the tenant's weighted bucket.
func weighted(t *Tenant, now time.Time) float64 {
	return tokens(t, dimWeighted, now)
}

// tokens returns the exact tokens in the tenant's bucket i at now.
func tokens(t *Tenant, i int, now time.Time) float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.advance(now.UnixNano())
	return t.tokens[i]
}

func requests(t *Tenant, now time.Time) float64 {
	return tokens(t, dimRequests, now)
}

func mustAdmit(tb testing.TB, t *Tenant, now time.Time, c Cost) *Reservation {
	tb.Helper()
	r, rej := t.Admit(now, c)
	if rej != nil {
		tb.Fatalf("Admit(%+v) rejected: %+v", c, *rej)
	}
	return r
}

func mustReject(tb testing.TB, t *Tenant, now time.Time, c Cost) Rejection {
	tb.Helper()
	r, rej := t.Admit(now, c)
	if rej == nil {
		tb.Fatalf("Admit(%+v) admitted %+v, want a rejection", c, r.Cost())
	}
	return *rej
}

func TestCostModel(t *testing.T) {
	tests := []struct {
		name        string
		m           CostModel
		prompt, max int64
		want        Cost
		wantUsedW   int64 // Weighted(prompt, max/2)
	}{
		{"defaults 1/4/16", CostModel{}, 1000, 1000,
			Cost{PromptTokens: 1000, MaxOutputTokens: 1000, Weighted: 5000, ProviderTokens: 2000, KVBlocks: 125, InputWeight: 1, OutputWeight: 4}, 3000},
		{"kv rounds up", DefaultCostModel, 1, 16,
			Cost{PromptTokens: 1, MaxOutputTokens: 16, Weighted: 65, ProviderTokens: 17, KVBlocks: 2, InputWeight: 1, OutputWeight: 4}, 33},
		{"custom weights", CostModel{2, 5, 100}, 300, 200,
			Cost{PromptTokens: 300, MaxOutputTokens: 200, Weighted: 1600, ProviderTokens: 500, KVBlocks: 5, InputWeight: 2, OutputWeight: 5}, 1100},
		{"weights below 1 take defaults", CostModel{0, -3, 0}, 10, 10,
			Cost{PromptTokens: 10, MaxOutputTokens: 10, Weighted: 50, ProviderTokens: 20, KVBlocks: 2, InputWeight: 1, OutputWeight: 4}, 30},
		{"negative counts are zero", ones, -5, -7, Cost{InputWeight: 1, OutputWeight: 1}, 0},
		{"huge counts are capped, no overflow", CostModel{maxWeight * 4, maxWeight * 4, 1}, math.MaxInt64, math.MaxInt64,
			Cost{PromptTokens: maxTokens, MaxOutputTokens: maxTokens, Weighted: 2 * maxTokens * maxWeight, ProviderTokens: 2 * maxTokens, KVBlocks: 2 * maxTokens, InputWeight: maxWeight, OutputWeight: maxWeight},
			2 * maxTokens * maxWeight},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, tc.m.Cost(tc.prompt, tc.max)); diff != "" {
				t.Errorf("Cost mismatch (-want +got):\n%s", diff)
			}
			if got := tc.m.Weighted(tc.prompt, tc.max/2); got != tc.wantUsedW {
				t.Errorf("Weighted = %d, want %d", got, tc.wantUsedW)
			}
		})
	}
}

// TestBC09_RetryAfterExactDeficit: capacity 10000, refill 100/s, 200 left, a
// 1500-token request waits exactly 13 s; 1490 left waits 0.1 s (header 1, never
// 0); Limit/Remaining/Reset describe the token dimension, not the request one.
func TestBC09_RetryAfterExactDeficit(t *testing.T) {
	tests := []struct {
		name      string
		available int64
		want      Rejection
		header    int64
	}{
		{"200 available", 200, Rejection{Reason: ReasonTokenRate, Retryable: true, RetryAfter: 13 * time.Second,
			Limit: 6000, Remaining: 200, Reset: 98 * time.Second}, 13},
		{"1490 available", 1490, Rejection{Reason: ReasonTokenRate, Retryable: true, RetryAfter: 100 * time.Millisecond,
			Limit: 6000, Remaining: 1490, Reset: 85100 * time.Millisecond}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := Limits{WeightedPerMinute: i64(6000), WeightedBurst: i64(10000), RequestsPerMinute: i64(6000)}
			tn := NewTenant(l, now0)
			mustAdmit(t, tn, now0, ones.Cost(10000-tc.available, 0))
			got := mustReject(t, tn, now0, ones.Cost(500, 1000))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Rejection mismatch (-want +got):\n%s", diff)
			}
			if h := RetryAfterSeconds(got.RetryAfter); h != tc.header {
				t.Errorf("Retry-After = %d, want %d", h, tc.header)
			}
			if got := weighted(tn, now0); got != float64(tc.available) {
				t.Errorf("bucket after rejection = %v, want %d (a refusal charges nothing)", got, tc.available)
			}
			// Retrying exactly at RetryAfter succeeds.
			mustAdmit(t, tn, now0.Add(tc.want.RetryAfter), ones.Cost(500, 1000))
		})
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want int64
	}{{0, 1}, {time.Nanosecond, 1}, {100 * time.Millisecond, 1}, {time.Second, 1}, {time.Second + 1, 2}, {13 * time.Second, 13}, {math.MaxInt64, 9223372037}} {
		if got := RetryAfterSeconds(tc.d); got != tc.want {
			t.Errorf("RetryAfterSeconds(%v) = %d, want %d", tc.d, got, tc.want)
		}
	}
}

// TestBC10_TooLargeIsNotRetryable: a request that exceeds a bucket's capacity
// (or the KV limit) is refused at once as request_too_large, with no
// Retry-After, and charges nothing, whatever the bucket holds.
func TestBC10_TooLargeIsNotRetryable(t *testing.T) {
	tests := []struct {
		name string
		l    Limits
		c    Cost
		want Rejection
	}{
		{"weighted burst 8000, cost 9000", Limits{WeightedPerMinute: i64(48000)}, ones.Cost(3000, 6000),
			Rejection{Reason: ReasonTooLarge, Limit: 48000, Remaining: 8000, Unit: "weighted tokens", Need: 9000, Capacity: 8000}},
		{"input bucket 100, prompt 101", Limits{InputPerMinute: i64(600)}, ones.Cost(101, 0),
			Rejection{Reason: ReasonTooLarge, Limit: 600, Remaining: 100, Unit: "input tokens", Need: 101, Capacity: 100}},
		{"output bucket 100, max output 101", Limits{OutputPerMinute: i64(600)}, ones.Cost(0, 101),
			Rejection{Reason: ReasonTooLarge, Limit: 600, Remaining: 100, Unit: "output tokens", Need: 101, Capacity: 100}},
		{"KV limit 10, 11 blocks", Limits{MaxKVBlocks: i64(10)}, ones.Cost(5, 6),
			Rejection{Reason: ReasonTooLarge, Limit: 10, Remaining: 10, Unit: "KV blocks", Need: 11, Capacity: 10}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tn := NewTenant(tc.l, now0)
			before := tn.Snapshot(now0)
			got := mustReject(t, tn, now0, tc.c)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Rejection mismatch (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(before, tn.Snapshot(now0)); diff != "" {
				t.Errorf("rejection changed the tenant (-before +after):\n%s", diff)
			}
		})
	}
}

// TestBC15_RefundClampedBoundedAppliedOnce follows the case exactly.
func TestBC15_RefundClampedBoundedAppliedOnce(t *testing.T) {
	tn := NewTenant(Limits{WeightedPerMinute: i64(600), WeightedBurst: i64(1000)}, now0) // 10 tokens/s
	a := mustAdmit(t, tn, now0, ones.Cost(0, 600))
	if got := weighted(tn, now0); got != 400 {
		t.Fatalf("after A's charge: %v, want 400", got)
	}
	t60 := at(60 * time.Second)
	if got := weighted(tn, t60); got != 1000 {
		t.Fatalf("at 60 s: %v, want 1000 (full)", got)
	}
	var wg sync.WaitGroup
	results := make([]Settlement, 3)
	for i, settle := range []func() Settlement{
		func() Settlement { return a.Complete(t60, Usage{OutputTokens: 100, Known: true}) }, // stream done
		func() Settlement { return a.Complete(t60, Usage{OutputTokens: 100, Known: true}) }, // client disconnected
		func() Settlement { return a.Cancel(t60) },
	} {
		wg.Add(1)
		go func() { defer wg.Done(); results[i] = settle() }()
	}
	wg.Wait()
	applied := 0
	for _, s := range results {
		if s.Applied {
			applied++
		} else if s != (Settlement{}) {
			t.Errorf("a no-op settlement returned %+v, want the zero Settlement", s)
		}
	}
	if applied != 1 {
		t.Fatalf("%d settlements applied, want exactly 1: %+v", applied, results)
	}
	if got := weighted(tn, t60); got != 1000 {
		t.Errorf("after A's refund: %v, want 1000 (clamped, not 1500)", got)
	}
	if s := tn.Snapshot(t60); s.InFlight != 0 {
		t.Errorf("in flight after A = %d, want 0 (released once)", s.InFlight)
	}

	b := mustAdmit(t, tn, t60, ones.Cost(0, 200))
	got := b.Complete(t60, Usage{OutputTokens: 350, Known: true})
	if diff := cmp.Diff(Settlement{Applied: true, ChargedWeighted: 200, UsedWeighted: 350, RefundedWeighted: -150}, got); diff != "" {
		t.Errorf("B settlement (-want +got):\n%s", diff)
	}
	if got := weighted(tn, t60); got != 650 {
		t.Errorf("after B: %v, want 650 (extra debit of 150)", got)
	}

	// Debt is bounded at -capacity.
	c := mustAdmit(t, tn, t60, ones.Cost(0, 600))
	c.Complete(t60, Usage{OutputTokens: 1_000_000, Known: true})
	if got := weighted(tn, t60); got != -1000 {
		t.Errorf("after a huge overrun: %v, want -1000 (debt floor)", got)
	}
	if s := tn.Snapshot(t60); s.TokensRemaining != 0 || !s.Limited {
		t.Errorf("snapshot in debt = %+v, want TokensRemaining 0 and Limited", s)
	}
	// Debt delays the next admission: 1000 tokens of debt + 100 of cost at 10/s.
	rej := mustReject(t, tn, t60, ones.Cost(0, 100))
	if rej.RetryAfter != 110*time.Second {
		t.Errorf("RetryAfter in debt = %v, want 110s", rej.RetryAfter)
	}
}

// TestBC16_RefillFromElapsedTime: refill is computed from elapsed time, so a
// 500/min bucket advanced every 10 ms gains 500 in 60 s (an integer per-tick
// refill floor(500*10/60000) would gain 0), and a 10/13 per second bucket
// holds one token again at 1.3 s despite float rounding.
func TestBC16_RefillFromElapsedTime(t *testing.T) {
	t.Run("500 per minute, 10 ms ticks", func(t *testing.T) {
		if perTick := int64(500) * 10 / 60000; perTick != 0 {
			t.Fatalf("the faulty integer refill per tick is %d; the case assumes 0", perTick)
		}
		b := NewBucket(500, 500.0/60, now0)
		if ok, _ := b.TakeN(now0, 500); !ok {
			t.Fatal("full bucket refused 500")
		}
		var got float64
		for tick := 1; tick <= 6000; tick++ {
			got = b.Tokens(now0.Add(time.Duration(tick) * 10 * time.Millisecond))
		}
		if math.Abs(got-500) > 1 {
			t.Errorf("after 60 s of 10 ms ticks: %v tokens, want 500 (±1)", got)
		}
	})
	t.Run("rate 10/13, burst 1", func(t *testing.T) {
		b := NewBucket(1, 10.0/13, now0)
		if ok, _ := b.TakeN(now0, 1); !ok {
			t.Fatal("t=0 refused")
		}
		if ok, wait := b.TakeN(at(1200*time.Millisecond), 1); ok || wait != 100*time.Millisecond {
			t.Errorf("t=1.2s: ok=%v wait=%v, want refused with 100ms", ok, wait)
		}
		if ok, _ := b.TakeN(at(1300*time.Millisecond), 1); !ok {
			t.Error("t=1.3s refused, want allowed")
		}
	})
}

func TestBucket(t *testing.T) {
	b := NewBucket(100, 10, now0)
	if ok, _ := b.TakeN(now0, 101); ok {
		t.Error("took more than the capacity")
	}
	if ok, wait := b.TakeN(now0, 101); ok || wait != math.MaxInt64 {
		t.Errorf("over capacity: wait %v, want MaxInt64 (never)", wait)
	}
	b.Debit(now0, 250)
	if got := b.Tokens(now0); got != -100 {
		t.Errorf("debt = %v, want -100 (floor -capacity)", got)
	}
	b.Credit(at(time.Second), 1000)
	if got := b.Tokens(at(time.Second)); got != 100 {
		t.Errorf("credit = %v, want 100 (clamped)", got)
	}
	// A clock that goes backwards adds nothing.
	b.Debit(at(time.Second), 50)
	if got := b.Tokens(now0); got != 50 {
		t.Errorf("after a backwards clock = %v, want 50", got)
	}
	// SetLimits: refill at the old rate up to now, then clamp.
	b.SetLimits(at(2*time.Second), 20, 1)
	if got := b.Tokens(at(2 * time.Second)); got != 20 {
		t.Errorf("after lowering capacity = %v, want 20", got)
	}
	if b.Capacity() != 20 || b.RefillPerSecond() != 1 {
		t.Errorf("limits = %v, %v, want 20, 1", b.Capacity(), b.RefillPerSecond())
	}
}

// TestBC19_ZeroRatesSuspend: a rate (or max) of 0 rejects the very first
// request as tenant_suspended, non-retryable; a burst of 0 with a positive rate
// takes the default burst instead of blocking forever.
func TestBC19_ZeroRatesSuspend(t *testing.T) {
	for name, l := range map[string]Limits{
		"weighted 0":       {WeightedPerMinute: i64(0)},
		"input 0":          {InputPerMinute: i64(0)},
		"output 0":         {OutputPerMinute: i64(0)},
		"requests 0":       {RequestsPerMinute: i64(0)},
		"max concurrent 0": {MaxConcurrent: i64(0)},
		"max KV blocks 0":  {MaxKVBlocks: i64(0)},
		"negative rate":    {WeightedPerMinute: i64(-5)},
	} {
		t.Run(name, func(t *testing.T) {
			tn := NewTenant(l, now0)
			got := mustReject(t, tn, now0, ones.Cost(1, 0))
			if diff := cmp.Diff(Rejection{Reason: ReasonSuspended}, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if !tn.Snapshot(now0).Limited {
				t.Error("snapshot not Limited")
			}
		})
	}
	t.Run("burst 0 takes the default", func(t *testing.T) {
		tn := NewTenant(Limits{WeightedPerMinute: i64(600), WeightedBurst: i64(0)}, now0)
		mustAdmit(t, tn, now0, ones.Cost(100, 0))
		if got := mustReject(t, tn, now0, ones.Cost(101, 0)); got.Reason != ReasonTooLarge {
			t.Errorf("101 with default burst 100: %s, want %s", got.Reason, ReasonTooLarge)
		}
	})
	t.Run("tiny rates burst at least 1", func(t *testing.T) {
		tn := NewTenant(Limits{WeightedPerMinute: i64(1), RequestsPerMinute: i64(1), InputPerMinute: i64(1)}, now0)
		mustAdmit(t, tn, now0, ones.Cost(1, 0))
	})
}

// TestBC20_AtomicCheckAndCharge: 50 goroutines race for a 10000-token bucket
// with 1000-token requests on a frozen clock: exactly 10 are admitted on every
// run and the bucket ends at exactly 0.
func TestBC20_AtomicCheckAndCharge(t *testing.T) {
	cost := ones.Cost(100, 900)
	for iter := range 1000 {
		tn := NewTenant(Limits{WeightedPerMinute: i64(60000), WeightedBurst: i64(10000)}, now0)
		var admitted, rejected int
		var mu sync.Mutex
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, rej := tn.Admit(now0, cost)
				mu.Lock()
				if rej == nil {
					admitted++
				} else {
					rejected++
				}
				mu.Unlock()
			}()
		}
		close(start)
		wg.Wait()
		if admitted != 10 || rejected != 40 {
			t.Fatalf("iteration %d: admitted %d, rejected %d; want 10 and 40", iter, admitted, rejected)
		}
		if got := weighted(tn, now0); got != 0 {
			t.Fatalf("iteration %d: bucket ends at %v, want 0", iter, got)
		}
	}
}

// TestRefusalChargesNothing: a request refused by any later dimension keeps
// none of the tokens an earlier dimension would have taken (the seed 002 fault:
// the request bucket refused after the token bucket had been charged).
func TestRefusalChargesNothing(t *testing.T) {
	tests := []struct {
		name   string
		l      Limits
		first  Cost // admitted, held
		second Cost // refused
		reason Reason
	}{
		{"request bucket", Limits{WeightedPerMinute: i64(60000), RequestsPerMinute: i64(6), RequestBurst: i64(1)},
			ones.Cost(1000, 0), ones.Cost(1000, 0), ReasonRequestRate},
		{"concurrency", Limits{WeightedPerMinute: i64(60000), MaxConcurrent: i64(1)},
			ones.Cost(1000, 0), ones.Cost(1000, 0), ReasonConcurrency},
		{"KV blocks", Limits{WeightedPerMinute: i64(60000), MaxKVBlocks: i64(1500)},
			ones.Cost(1000, 0), ones.Cost(1000, 0), ReasonMemory},
		{"output bucket after weighted and input", Limits{WeightedPerMinute: i64(60000), InputPerMinute: i64(60000), OutputPerMinute: i64(600)},
			ones.Cost(0, 60), ones.Cost(1000, 60), ReasonOutputTokenRate},
		{"input bucket", Limits{WeightedPerMinute: i64(60000), InputPerMinute: i64(600), OutputPerMinute: i64(60000)},
			ones.Cost(60, 0), ones.Cost(60, 1000), ReasonInputTokenRate},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tn := NewTenant(tc.l, now0)
			mustAdmit(t, tn, now0, tc.first)
			tn.mu.Lock()
			before := tn.tokens
			beforeKV := tn.kv
			tn.mu.Unlock()
			if got := mustReject(t, tn, now0, tc.second); got.Reason != tc.reason {
				t.Fatalf("reason %s, want %s", got.Reason, tc.reason)
			}
			tn.mu.Lock()
			defer tn.mu.Unlock()
			for i := range numDims {
				if tn.tokens[i] != before[i] {
					t.Errorf("dimension %d: %v tokens after the refusal, want %v", i, tn.tokens[i], before[i])
				}
			}
			if tn.inFlight != 1 || tn.kv != beforeKV {
				t.Errorf("in flight %d, KV %d; want 1, %d", tn.inFlight, tn.kv, beforeKV)
			}
		})
	}
}

// TestRetryAfterCoversEveryShortBucket: the first short dimension names the
// rejection, but the wait covers every short bucket so the retry can succeed.
func TestRetryAfterCoversEveryShortBucket(t *testing.T) {
	tn := NewTenant(Limits{WeightedPerMinute: i64(60000), RequestsPerMinute: i64(10), RequestBurst: i64(1)}, now0)
	mustAdmit(t, tn, now0, ones.Cost(9000, 0)) // 1000 left, refill 1000/s; request bucket empty, refill 1/6 per s
	got := mustReject(t, tn, now0, ones.Cost(2000, 0))
	want := Rejection{Reason: ReasonTokenRate, Retryable: true, RetryAfter: 6 * time.Second, Limit: 60000, Remaining: 1000, Reset: 9 * time.Second}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if _, rej := tn.Admit(at(5*time.Second), ones.Cost(2000, 0)); rej == nil || rej.Reason != ReasonRequestRate {
		t.Errorf("at 5 s: %+v, want request_rate_limit", rej)
	}
	mustAdmit(t, tn, at(6*time.Second), ones.Cost(2000, 0))
}

// TestBC22_CancelRefundsEverything: a request that fails before reaching the
// upstream gets a full refund (tokens and the request) and its slot back, so
// the identical retry is not refused with 429.
func TestBC22_CancelRefundsEverything(t *testing.T) {
	tn := NewTenant(Limits{WeightedPerMinute: i64(6000), WeightedBurst: i64(1000), RequestsPerMinute: i64(6), RequestBurst: i64(1), MaxConcurrent: i64(1)}, now0)
	for attempt := range 2 {
		r := mustAdmit(t, tn, now0, ones.Cost(600, 0))
		if got := weighted(tn, now0); got != 400 {
			t.Fatalf("attempt %d: after charge %v, want 400", attempt, got)
		}
		s := r.Cancel(now0) // no ready endpoint: 503
		if diff := cmp.Diff(Settlement{Applied: true, ChargedWeighted: 600, RefundedWeighted: 600}, s); diff != "" {
			t.Errorf("attempt %d settlement (-want +got):\n%s", attempt, diff)
		}
		if got := weighted(tn, now0); got != 1000 {
			t.Errorf("attempt %d: bucket %v after cancel, want 1000", attempt, got)
		}
		if got := requests(tn, now0); got != 1 {
			t.Errorf("attempt %d: request bucket %v after cancel, want 1", attempt, got)
		}
		if s := r.Complete(now0, Usage{PromptTokens: 600, Known: true}); s.Applied {
			t.Errorf("Complete after Cancel applied: %+v", s)
		}
		if s := tn.Snapshot(now0); s.InFlight != 0 {
			t.Errorf("attempt %d: in flight %d after cancel", attempt, s.InFlight)
		}
	}
}

// TestBC23_RefundFromReservationRecord: the refund is computed from what the
// reservation charged, not from the bucket's current state; a disconnect
// settles with the tokens generated so far.
func TestBC23_RefundFromReservationRecord(t *testing.T) {
	t.Run("cancel after other traffic", func(t *testing.T) {
		tn := NewTenant(Limits{WeightedPerMinute: i64(6000), WeightedBurst: i64(10000)}, now0) // 100/s
		r := mustAdmit(t, tn, at(58*time.Second), ones.Cost(5000, 0))                          // 5000
		other := mustAdmit(t, tn, at(60*time.Second), ones.Cost(3000, 0))                      // 5000+200-3000 = 2200
		s := r.Cancel(at(63 * time.Second))                                                    // 2200+300+5000
		if s.RefundedWeighted != 5000 {
			t.Errorf("refund %d, want 5000 (the reservation's own charge)", s.RefundedWeighted)
		}
		if got := weighted(tn, at(63*time.Second)); got != 7500 {
			t.Errorf("bucket %v, want 7500: the other request's 3000 stays charged", got)
		}
		if got := other.Cost().Weighted; got != 3000 {
			t.Errorf("other's record %d, want 3000", got)
		}
	})
	t.Run("client disconnect after 400 of 1000 output tokens", func(t *testing.T) {
		tn := NewTenant(Limits{WeightedPerMinute: i64(60000), WeightedBurst: i64(10000), MaxConcurrent: i64(4)}, now0)
		r := mustAdmit(t, tn, now0, DefaultCostModel.Cost(1000, 1000)) // 1000 + 4*1000 = 5000
		s := r.Complete(now0, Usage{PromptTokens: 1000, OutputTokens: 400, Known: true})
		if diff := cmp.Diff(Settlement{Applied: true, ChargedWeighted: 5000, UsedWeighted: 2600, RefundedWeighted: 2400}, s); diff != "" {
			t.Errorf("(-want +got):\n%s", diff)
		}
		if got := weighted(tn, now0); got != 7400 {
			t.Errorf("bucket %v, want 7400 (charge becomes prompt + 400)", got)
		}
	})
	t.Run("settles with the weights it was charged with", func(t *testing.T) {
		tn := NewTenant(Limits{WeightedPerMinute: i64(60000), WeightedBurst: i64(10000)}, now0)
		r := mustAdmit(t, tn, now0, CostModel{InputWeight: 2, OutputWeight: 3}.Cost(100, 100)) // 500
		if s := r.Complete(now0, Usage{PromptTokens: 100, OutputTokens: 10, Known: true}); s.UsedWeighted != 230 {
			t.Errorf("used %d, want 230 (2*100 + 3*10)", s.UsedWeighted)
		}
	})
	t.Run("no refund into a bucket that was replaced", func(t *testing.T) {
		l := Limits{WeightedPerMinute: i64(6000), WeightedBurst: i64(1000)}
		tn := NewTenant(l, now0)
		r := mustAdmit(t, tn, now0, ones.Cost(600, 0))
		tn.Update(now0, Limits{})
		tn.Update(now0, l) // a new, full bucket
		mustAdmit(t, tn, now0, ones.Cost(100, 0))
		r.Cancel(now0)
		if got := weighted(tn, now0); got != 900 {
			t.Errorf("bucket %v, want 900 (the old charge is not refunded into the new bucket)", got)
		}
		if s := tn.Snapshot(now0); s.InFlight != 1 {
			t.Errorf("in flight %d, want 1", s.InFlight)
		}
	})
	t.Run("unknown usage keeps the charge", func(t *testing.T) {
		tn := NewTenant(Limits{WeightedPerMinute: i64(60000), WeightedBurst: i64(10000)}, now0)
		r := mustAdmit(t, tn, now0, ones.Cost(200, 1000))
		s := r.Complete(now0, Usage{})
		if diff := cmp.Diff(Settlement{Applied: true, ChargedWeighted: 1200, UsedWeighted: 1200}, s); diff != "" {
			t.Errorf("(-want +got):\n%s", diff)
		}
		if got := weighted(tn, now0); got != 8800 {
			t.Errorf("bucket %v, want 8800", got)
		}
	})
}

// TestBC24_StreamingAndNonStreamingSettleAlike: both paths settle through
// Complete with the usage they saw, so both leave 7500 and five sequential
// requests exhaust the bucket identically.
func TestBC24_StreamingAndNonStreamingSettleAlike(t *testing.T) {
	run := func(streaming bool) []bool {
		tn := NewTenant(Limits{WeightedPerMinute: i64(60000), WeightedBurst: i64(10000)}, now0)
		var admitted []bool
		for i := range 5 {
			r, rej := tn.Admit(now0, ones.Cost(1000, 2000))
			admitted = append(admitted, rej == nil)
			if rej != nil {
				continue
			}
			// The non-streaming body's usage object and the stream's final
			// usage chunk carry the same figures and settle the same way.
			r.Complete(now0, Usage{PromptTokens: 1000, OutputTokens: 1500, Known: true})
			if i == 0 {
				if got := weighted(tn, now0); got != 7500 {
					t.Errorf("streaming=%v: bucket %v after one request, want 7500", streaming, got)
				}
			}
		}
		return admitted
	}
	// 10000 -> 7500 -> 5000 -> 2500; the fourth needs 3000 up front.
	want := []bool{true, true, true, false, false}
	if diff := cmp.Diff(want, run(false)); diff != "" {
		t.Errorf("non-streaming (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, run(true)); diff != "" {
		t.Errorf("streaming (-want +got):\n%s", diff)
	}
}

// TestBC25_ChargesPromptPlusMaxOutput: 20000 bucket, prompt 7000 + max 4000
// with 3000 generated leaves 10000; the second needs 11000 up front and is
// refused.
func TestBC25_ChargesPromptPlusMaxOutput(t *testing.T) {
	tn := NewTenant(Limits{WeightedPerMinute: i64(333), WeightedBurst: i64(20000)}, now0)
	r := mustAdmit(t, tn, now0, ones.Cost(7000, 4000))
	if got := weighted(tn, now0); got != 9000 {
		t.Errorf("after the charge: %v, want 9000", got)
	}
	r.Complete(now0, Usage{PromptTokens: 7000, OutputTokens: 3000, Known: true})
	if got := weighted(tn, now0); got != 10000 {
		t.Errorf("after settlement: %v, want 10000", got)
	}
	if got := mustReject(t, tn, now0, ones.Cost(7000, 4000)); got.Reason != ReasonTokenRate || got.Remaining != 10000 {
		t.Errorf("second request: %+v, want token_rate_limit with 10000 remaining", got)
	}
}

// TestBC31_AtTheLimit: max 1 with 0 in flight admits; held+need == max admits,
// held+need == max+1 rejects.
func TestBC31_AtTheLimit(t *testing.T) {
	t.Run("concurrency 1", func(t *testing.T) {
		tn := NewTenant(Limits{MaxConcurrent: i64(1)}, now0)
		r := mustAdmit(t, tn, now0, ones.Cost(1, 0))
		if diff := cmp.Diff(Rejection{Reason: ReasonConcurrency, Retryable: true, Limit: 1}, mustReject(t, tn, now0, ones.Cost(1, 0))); diff != "" {
			t.Errorf("(-want +got):\n%s", diff)
		}
		r.Complete(now0, Usage{PromptTokens: 1, Known: true})
		mustAdmit(t, tn, now0, ones.Cost(1, 0))
	})
	t.Run("KV 1000 with 900 held", func(t *testing.T) {
		tn := NewTenant(Limits{MaxKVBlocks: i64(1000)}, now0)
		mustAdmit(t, tn, now0, ones.Cost(900, 0))
		r := mustAdmit(t, tn, now0, ones.Cost(100, 0))
		r.Cancel(now0)
		if diff := cmp.Diff(Rejection{Reason: ReasonMemory, Retryable: true, Limit: 1000, Remaining: 100}, mustReject(t, tn, now0, ones.Cost(101, 0))); diff != "" {
			t.Errorf("(-want +got):\n%s", diff)
		}
	})
}

// TestBC32_OversizedAndZeroLimits covers the limiter's part of BC-32: with
// 950 of 1000 KV blocks held, 200 waits (retryable), 20 and 20 are admitted,
// 1500 is refused at once as non-retryable; a KV quota of 0 refuses even
// when nothing runs (no "admit when idle" escape).
func TestBC32_OversizedAndZeroLimits(t *testing.T) {
	tn := NewTenant(Limits{MaxKVBlocks: i64(1000)}, now0)
	mustAdmit(t, tn, now0, ones.Cost(950, 0))
	if got := mustReject(t, tn, now0, ones.Cost(200, 0)); got.Reason != ReasonMemory || !got.Retryable {
		t.Errorf("R1: %+v, want retryable memory_limit", got)
	}
	mustAdmit(t, tn, now0, ones.Cost(20, 0))
	mustAdmit(t, tn, now0, ones.Cost(20, 0))
	if diff := cmp.Diff(Rejection{Reason: ReasonTooLarge, Limit: 1000, Remaining: 10, Unit: "KV blocks", Need: 1500, Capacity: 1000}, mustReject(t, tn, now0, ones.Cost(1500, 0))); diff != "" {
		t.Errorf("R4 (-want +got):\n%s", diff)
	}
	for name, l := range map[string]Limits{"KV quota 0": {MaxKVBlocks: i64(0)}, "concurrency 0": {MaxConcurrent: i64(0)}} {
		idle := NewTenant(l, now0)
		if got := mustReject(t, idle, now0, ones.Cost(10, 0)); got.Reason != ReasonSuspended || got.Retryable {
			t.Errorf("R5 with %s: %+v, want non-retryable tenant_suspended", name, got)
		}
		if got := mustReject(t, idle, now0, ones.Cost(0, 0)); got.Reason != ReasonSuspended {
			t.Errorf("zero-block request with %s: %+v, want tenant_suspended", name, got)
		}
	}
}

// TestBC41_UpdateAppliesLive: removing the token limit lets a 5000-token
// request through at once; lowering the request rate applies to the existing
// limiter at once; removing everything (CR deleted, default policy) admits.
func TestBC41_UpdateAppliesLive(t *testing.T) {
	tn := NewTenant(Limits{RequestsPerMinute: i64(60), WeightedPerMinute: i64(1000)}, now0)
	if got := mustReject(t, tn, now0, ones.Cost(5000, 0)); got.Reason != ReasonTooLarge {
		t.Fatalf("before: %s, want request_too_large", got.Reason)
	}
	tn.Update(now0, Limits{RequestsPerMinute: i64(60)})
	mustAdmit(t, tn, now0, ones.Cost(5000, 0))
	if s := tn.Snapshot(now0); s.TokensRemaining != -1 || s.TokensLimitPerMinute != -1 || s.RequestsRemaining != 9 {
		t.Errorf("snapshot after removal: %+v", s)
	}
	tn.Update(now0, Limits{RequestsPerMinute: i64(10)}) // burst 1: the 9 left are clamped to 1
	mustAdmit(t, tn, now0, ones.Cost(1, 0))
	want := Rejection{Reason: ReasonRequestRate, Retryable: true, RetryAfter: 6 * time.Second, Limit: 10, Reset: 6 * time.Second}
	if diff := cmp.Diff(want, mustReject(t, tn, now0, ones.Cost(1, 0))); diff != "" {
		t.Errorf("lowered RPM (-want +got):\n%s", diff)
	}
	if s := tn.Snapshot(now0); s.InFlight != 2 {
		t.Errorf("in flight %d after updates, want 2 (kept)", s.InFlight)
	}
	tn.Update(now0, Limits{})
	mustAdmit(t, tn, now0, ones.Cost(1_000_000, 0))
	// A lowered token burst clamps at once too.
	tn.Update(now0, Limits{WeightedPerMinute: i64(60000)})
	mustAdmit(t, tn, now0, ones.Cost(9000, 0))
	tn.Update(now0, Limits{WeightedPerMinute: i64(6000)})
	if s := tn.Snapshot(now0); s.TokensRemaining != 1000 || s.TokensLimitPerMinute != 6000 {
		t.Errorf("after lowering the token rate: %+v, want 1000 remaining of 6000/min", s)
	}
}

// TestSmoothEnforcement: a published 60000/min with the default burst admits
// at most 10000 at t=0 (seed 002 section 5), then 1000 per second.
func TestSmoothEnforcement(t *testing.T) {
	tn := NewTenant(Limits{WeightedPerMinute: i64(60000)}, now0)
	n := 0
	for {
		if _, rej := tn.Admit(now0, ones.Cost(1000, 0)); rej != nil {
			if rej.RetryAfter != time.Second {
				t.Errorf("RetryAfter %v, want 1s", rej.RetryAfter)
			}
			break
		}
		n++
	}
	if n != 10 {
		t.Errorf("admitted %d x 1000 at t=0, want 10", n)
	}
	mustAdmit(t, tn, at(time.Second), ones.Cost(1000, 0))
	mustReject(t, tn, at(time.Second), ones.Cost(1, 0))
}

// TestSeedExerciseA: large max_tokens, few generated (seed 002 exercise A).
// Each request is charged 1000 + 4*4000 = 17000 and settles at 1000 + 4*50 =
// 1200, so exactly 3 fit a 20000 bucket on a frozen clock and every refund is
// exact.
func TestSeedExerciseA(t *testing.T) {
	tn := NewTenant(Limits{WeightedPerMinute: i64(120000)}, now0) // burst 20000
	var got []Settlement
	for {
		r, rej := tn.Admit(now0, DefaultCostModel.Cost(1000, 4000))
		if rej != nil {
			if rej.Reason != ReasonTokenRate || rej.Remaining != 16400 {
				t.Errorf("rejection %+v, want token_rate_limit with 16400 remaining", *rej)
			}
			break
		}
		got = append(got, r.Complete(now0, Usage{PromptTokens: 1000, OutputTokens: 50, Known: true}))
	}
	one := Settlement{Applied: true, ChargedWeighted: 17000, UsedWeighted: 1200, RefundedWeighted: 15800}
	if diff := cmp.Diff([]Settlement{one, one, one}, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if w := weighted(tn, now0); w != 16400 {
		t.Errorf("bucket %v, want 16400", w)
	}
}

// TestSoftLimit: over the token rate a soft tenant is admitted, charged into
// debt and marked OverLimit; the request rate and the size stay hard.
func TestSoftLimit(t *testing.T) {
	tn := NewTenant(Limits{WeightedPerMinute: i64(6000), RequestsPerMinute: i64(12), Soft: true}, now0) // burst 1000, 2 requests
	r1 := mustAdmit(t, tn, now0, ones.Cost(800, 0))
	r2 := mustAdmit(t, tn, now0, ones.Cost(800, 0))
	if r1.OverLimit() || !r2.OverLimit() {
		t.Errorf("OverLimit = %v, %v; want false, true", r1.OverLimit(), r2.OverLimit())
	}
	if got := weighted(tn, now0); got != -600 {
		t.Errorf("bucket %v, want -600 (debt)", got)
	}
	if got := mustReject(t, tn, now0, ones.Cost(1, 0)); got.Reason != ReasonRequestRate {
		t.Errorf("third: %s, want request_rate_limit", got.Reason)
	}
	if got := mustReject(t, tn, at(time.Hour), ones.Cost(1001, 0)); got.Reason != ReasonTooLarge {
		t.Errorf("oversized: %s, want request_too_large", got.Reason)
	}
}

// TestCheckHasNoSideEffects: Check and Allowed answer like Admit without
// charging.
func TestCheckHasNoSideEffects(t *testing.T) {
	tn := NewTenant(Limits{WeightedPerMinute: i64(6000), RequestsPerMinute: i64(60), MaxConcurrent: i64(2), MaxKVBlocks: i64(5000)}, now0)
	c := ones.Cost(600, 0)
	before := tn.Snapshot(now0)
	for range 5 {
		if rej := tn.Check(now0, c); rej != nil || !tn.Allowed(now0, c) {
			t.Fatalf("Check = %+v, want admitted", rej)
		}
	}
	if diff := cmp.Diff(before, tn.Snapshot(now0)); diff != "" {
		t.Errorf("Check changed the tenant (-before +after):\n%s", diff)
	}
	mustAdmit(t, tn, now0, c)
	rej := tn.Check(now0, c)
	_, admitRej := tn.Admit(now0, c)
	if rej == nil || admitRej == nil || !cmp.Equal(*rej, *admitRej) || tn.Allowed(now0, c) {
		t.Errorf("Check %+v and Admit %+v disagree", rej, admitRej)
	}
}

func TestSnapshot(t *testing.T) {
	tn := NewTenant(Limits{WeightedPerMinute: i64(6000), RequestsPerMinute: i64(60), MaxConcurrent: i64(3)}, now0)
	mustAdmit(t, tn, now0, DefaultCostModel.Cost(100, 100)) // 500 weighted, 13 KV blocks
	// 500 of 1000 missing at 100/s: full in 5 s; 1 of 10 requests at 1/s: 1 s.
	want := Snapshot{InFlight: 1, KVBlocks: 13, TokensRemaining: 500, TokensLimitPerMinute: 6000, RequestsRemaining: 9,
		TokensReset: 5 * time.Second, RequestsReset: time.Second}
	if diff := cmp.Diff(want, tn.Snapshot(now0)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	unlimited := NewTenant(Limits{}, now0)
	if diff := cmp.Diff(Snapshot{TokensRemaining: -1, TokensLimitPerMinute: -1, RequestsRemaining: -1}, unlimited.Snapshot(now0)); diff != "" {
		t.Errorf("unlimited (-want +got):\n%s", diff)
	}
}

// TestEligibleReportsSoftOverLimit: Eligible answers like Admit without
// charging, and says when a soft-limited tenant would be admitted over its
// token rate (the fair queue deprioritises it then).
func TestEligibleReportsSoftOverLimit(t *testing.T) {
	c := DefaultCostModel.Cost(100, 100) // 500 weighted
	soft := NewTenant(Limits{WeightedPerMinute: i64(6000), WeightedBurst: i64(600), Soft: true}, now0)
	hard := NewTenant(Limits{WeightedPerMinute: i64(6000), WeightedBurst: i64(600)}, now0)
	for _, tc := range []struct {
		name     string
		tn       *Tenant
		ok, over bool
	}{{"soft, full bucket", soft, true, false}, {"hard, full bucket", hard, true, false}} {
		if ok, over := tc.tn.Eligible(now0, c); ok != tc.ok || over != tc.over {
			t.Errorf("%s: Eligible = %v, %v; want %v, %v", tc.name, ok, over, tc.ok, tc.over)
		}
	}
	for _, tn := range []*Tenant{soft, hard} {
		if _, rej := tn.Admit(now0, c); rej != nil {
			t.Fatal(rej)
		}
	}
	// 100 left, 500 needed: hard is not eligible, soft is, over its limit.
	if ok, over := soft.Eligible(now0, c); !ok || !over {
		t.Errorf("soft at 100 of 500: Eligible = %v, %v; want true, true", ok, over)
	}
	if ok, over := hard.Eligible(now0, c); ok || over {
		t.Errorf("hard at 100 of 500: Eligible = %v, %v; want false, false", ok, over)
	}
	if got := soft.Snapshot(now0).TokensRemaining; got != 100 {
		t.Errorf("Eligible charged: %d left, want 100", got)
	}
	dry := NewTenant(Limits{WeightedPerMinute: i64(0), DryRun: true}, now0)
	if ok, over := dry.Eligible(now0, c); !ok || over {
		t.Errorf("DryRun suspended: Eligible = %v, %v; want true, false", ok, over)
	}
}

// TestTooLargeNamesUnitNeedAndCapacity: a refusal as too large says what
// did not fit and by how much.
func TestTooLargeNamesUnitNeedAndCapacity(t *testing.T) {
	tn := NewTenant(Limits{WeightedPerMinute: i64(48000), WeightedBurst: i64(8000), MaxKVBlocks: i64(1000)}, now0)
	_, rej := tn.Admit(now0, DefaultCostModel.Cost(3000, 1500)) // 9000 weighted
	if rej == nil || rej.Reason != ReasonTooLarge || rej.Unit != "weighted tokens" || rej.Need != 9000 || rej.Capacity != 8000 || rej.Retryable {
		t.Errorf("weighted: %+v", rej)
	}
	kvOnly := NewTenant(Limits{MaxKVBlocks: i64(1000)}, now0)
	_, rej = kvOnly.Admit(now0, CostModel{InputWeight: 1, OutputWeight: 1, KVBlockTokens: 16}.Cost(16000, 16)) // 1001 blocks
	if rej == nil || rej.Reason != ReasonTooLarge || rej.Unit != "KV blocks" || rej.Need != 1001 || rej.Capacity != 1000 {
		t.Errorf("KV blocks: %+v", rej)
	}
}

// TestNegativeUsageKeepsTheCharge: a provider's negative count is a
// malformed report, settled as unknown usage (the charge stands), never
// clamped into a full refund.
func TestNegativeUsageKeepsTheCharge(t *testing.T) {
	for _, u := range []Usage{
		{PromptTokens: -5, OutputTokens: 10, Known: true},
		{PromptTokens: 5, OutputTokens: -1, Known: true},
		{PromptTokens: -1, OutputTokens: -1, Known: true},
	} {
		tn := NewTenant(Limits{WeightedPerMinute: i64(600), WeightedBurst: i64(1000)}, now0)
		r := mustAdmit(t, tn, now0, ones.Cost(100, 200))
		got := r.Complete(now0, u)
		if diff := cmp.Diff(Settlement{Applied: true, ChargedWeighted: 300, UsedWeighted: 300, RefundedWeighted: 0}, got); diff != "" {
			t.Errorf("%+v: settlement (-want +got):\n%s", u, diff)
		}
		if got := weighted(tn, now0); got != 700 {
			t.Errorf("%+v: bucket %v, want 700 (the charge of 300 stands)", u, got)
		}
		if u.Valid() {
			t.Errorf("%+v: Valid() = true", u)
		}
	}
	if !(Usage{PromptTokens: 0, OutputTokens: 0, Known: true}).Valid() || (Usage{}).Valid() {
		t.Error("Valid: zero known usage must be valid, unknown usage not")
	}
}

// TestAbandonKeepsTheRequestCharged: a call its client left after it was
// sent upstream gets its tokens back but not its request (the provider
// counted it), so disconnecting at once cannot exceed the request rate; the
// slot and KV blocks are released, and only the first settlement applies.
func TestAbandonKeepsTheRequestCharged(t *testing.T) {
	tn := NewTenant(Limits{WeightedPerMinute: i64(6000), WeightedBurst: i64(1000), RequestsPerMinute: i64(6), RequestBurst: i64(2), MaxConcurrent: i64(1), MaxKVBlocks: i64(100)}, now0)
	cost := ones.Cost(600, 0)
	cost.KVBlocks = 40
	for attempt := range 2 {
		r := mustAdmit(t, tn, now0, cost)
		s := r.Abandon(now0)
		if diff := cmp.Diff(Settlement{Applied: true, ChargedWeighted: 600, RefundedWeighted: 600}, s); diff != "" {
			t.Errorf("attempt %d settlement (-want +got):\n%s", attempt, diff)
		}
		if got := weighted(tn, now0); got != 1000 {
			t.Errorf("attempt %d: bucket %v after Abandon, want 1000", attempt, got)
		}
		if got := requests(tn, now0); got != float64(1-attempt) {
			t.Errorf("attempt %d: request bucket %v after Abandon, want %d", attempt, got, 1-attempt)
		}
		if s := tn.Snapshot(now0); s.InFlight != 0 || s.KVBlocks != 0 {
			t.Errorf("attempt %d: in flight %d, KV blocks %d after Abandon", attempt, s.InFlight, s.KVBlocks)
		}
		if s := r.Cancel(now0); s.Applied {
			t.Errorf("Cancel after Abandon applied: %+v", s)
		}
	}
	// Both requests stay counted: the third is refused for the request rate.
	var r Reservation
	if rej := tn.AdmitInto(now0, cost, &r); rej == nil || rej.Reason != ReasonRequestRate {
		t.Fatalf("third request after two abandoned: %+v, want %s", rej, ReasonRequestRate)
	}
}
