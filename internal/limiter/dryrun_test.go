package limiter

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/google/go-cmp/cmp"
)

// state is every figure of a tenant that admission reads or writes.
type state struct {
	Tokens       [numDims]float64
	InFlight, KV int64
	Snapshot     Snapshot
	Last         int64
	Suspended    bool
	On           uint8
}

func stateOf(t *Tenant, now time.Time) state {
	s := t.Snapshot(now)
	t.mu.Lock()
	defer t.mu.Unlock()
	return state{Tokens: t.tokens, InFlight: t.inFlight, KV: t.kv, Snapshot: s, Last: t.last, Suspended: t.suspended, On: t.on}
}

// dryRunLimits binds every dimension. Rates are multiples of 240 per minute
// so that every refill over a multiple of 250 ms is an exact integer, and the
// bucket values below are exact.
func dryRunLimits(dry bool) Limits {
	return Limits{
		WeightedPerMinute: i64(96000), WeightedBurst: i64(3000), // 400 per 250 ms
		InputPerMinute:    i64(24000),                     // burst 4000, 100 per 250 ms
		OutputPerMinute:   i64(24000),                     // burst 4000, 100 per 250 ms
		RequestsPerMinute: i64(480), RequestBurst: i64(4), // 2 per 250 ms
		MaxConcurrent: i64(16), MaxKVBlocks: i64(8000),
		DryRun: dry,
	}
}

// TestDryRunMatchesEnforce: a DryRun tenant fed 2000 random admissions and
// settlements ends every step in exactly the state of an Enforce tenant fed
// the same sequence (where the Enforce tenant refuses, the DryRun tenant
// returns a shadow reservation carrying the same Rejection), and of a third
// Enforce tenant fed only the admitted requests: bucket tokens, in flight, KV
// blocks and Snapshot are equal, exactly.
func TestDryRunMatchesEnforce(t *testing.T) {
	enforce := NewTenant(dryRunLimits(false), now0)
	dry := NewTenant(dryRunLimits(true), now0)
	admittedOnly := NewTenant(dryRunLimits(false), now0)
	type held struct{ e, d, a *Reservation }
	var open, openShadow []held // admitted, shadow
	rng := rand.New(rand.NewPCG(1, 2))
	now := now0
	var admitted, shadows, settled int
	reasons := map[Reason]int{}
	for step := range 2000 {
		if rng.IntN(6) == 0 {
			now = now.Add(time.Duration(1+rng.IntN(4)) * 250 * time.Millisecond)
		}
		if len(open)+len(openShadow) > 0 && rng.IntN(2) == 0 {
			list := &open
			if len(open) == 0 || (len(openShadow) > 0 && rng.IntN(2) == 0) {
				list = &openShadow
			}
			k := rng.IntN(len(*list))
			h := (*list)[k]
			*list = append((*list)[:k], (*list)[k+1:]...)
			// Usage: the prompt as charged, output up to the maximum plus a
			// little (an overrun is an extra debit, BC-29); 1 in 4 unknown.
			c := h.d.Cost()
			u := Usage{PromptTokens: c.PromptTokens, OutputTokens: rng.Int64N(c.MaxOutputTokens + 20), Known: rng.IntN(4) != 0}
			cancel := rng.IntN(5) == 0
			settle := func(r *Reservation) Settlement {
				if cancel {
					return r.Cancel(now)
				}
				return r.Complete(now, u)
			}
			sd := settle(h.d)
			if h.e == nil {
				used := int64(0)
				if !cancel {
					_, _, used = h.d.cost.used(u)
				}
				if diff := cmp.Diff(Settlement{Applied: true, UsedWeighted: used}, sd); diff != "" {
					t.Fatalf("step %d: shadow settlement (-want +got):\n%s", step, diff)
				}
			} else {
				se, sa := settle(h.e), settle(h.a)
				if diff := cmp.Diff(se, sd); diff != "" {
					t.Fatalf("step %d: DryRun settlement differs from Enforce (-enforce +dryrun):\n%s", step, diff)
				}
				if diff := cmp.Diff(se, sa); diff != "" {
					t.Fatalf("step %d: settlement differs from the admitted-only tenant (-enforce +admitted-only):\n%s", step, diff)
				}
			}
			settled++
		} else {
			// Small, prompt-heavy, output-heavy, and 1 in 20 too large for
			// the weighted bucket or the KV limit.
			var c Cost
			switch k := rng.IntN(20); {
			case k == 0:
				c = ones.Cost(1000, 2000+int64(rng.IntN(1000)))
			case k < 7:
				c = ones.Cost(int64(rng.IntN(1500)), int64(rng.IntN(50)))
			case k < 14:
				c = ones.Cost(int64(rng.IntN(50)), int64(rng.IntN(1500)))
			default:
				c = ones.Cost(int64(rng.IntN(100)), int64(rng.IntN(100)))
			}
			re, rejE := enforce.Admit(now, c)
			rd, rejD := dry.Admit(now, c)
			if rejD != nil || rd == nil {
				t.Fatalf("step %d: DryRun returned a rejection %+v", step, rejD)
			}
			var ra *Reservation
			if rejE != nil {
				shadows++
				reasons[rejE.Reason]++
				if got := rd.DryRunRejection(); got == nil || *got != *rejE {
					t.Fatalf("step %d: DryRunRejection %+v, want %+v", step, got, *rejE)
				}
				if rd.OverLimit() {
					t.Fatalf("step %d: a shadow reservation is OverLimit", step)
				}
			} else {
				admitted++
				if got := rd.DryRunRejection(); got != nil {
					t.Fatalf("step %d: admitted with DryRunRejection %+v", step, *got)
				}
				ra = mustAdmit(t, admittedOnly, now, c)
			}
			if rd.Cost() != c {
				t.Fatalf("step %d: Cost %+v, want %+v", step, rd.Cost(), c)
			}
			if ra == nil {
				openShadow = append(openShadow, held{re, rd, ra})
			} else {
				open = append(open, held{re, rd, ra})
			}
		}
		want := stateOf(enforce, now)
		if diff := cmp.Diff(want, stateOf(dry, now)); diff != "" {
			t.Fatalf("step %d: DryRun state differs from Enforce (-enforce +dryrun):\n%s", step, diff)
		}
		if diff := cmp.Diff(want, stateOf(admittedOnly, now)); diff != "" {
			t.Fatalf("step %d: admitted-only state differs from Enforce (-enforce +admitted-only):\n%s", step, diff)
		}
	}
	// The sequence exercised every kind of refusal.
	for _, r := range []Reason{ReasonTokenRate, ReasonInputTokenRate, ReasonOutputTokenRate, ReasonRequestRate, ReasonConcurrency, ReasonMemory, ReasonTooLarge} {
		if reasons[r] == 0 {
			t.Errorf("no %s refusal in the sequence (%v)", r, reasons)
		}
	}
	t.Logf("%d admitted, %d shadow, %d settled; refusals %v", admitted, shadows, settled, reasons)
}

// TestDryRunNeverRefuses: suspended and too-large requests, which are not
// retryable, become shadow reservations too; Check and Allowed hold nothing
// back; Snapshot.Limited is computed as under Enforce.
func TestDryRunNeverRefuses(t *testing.T) {
	tests := []struct {
		name string
		l    Limits
		c    Cost
		want Rejection
	}{
		{"suspended", Limits{WeightedPerMinute: i64(0)}, ones.Cost(1, 0), Rejection{Reason: ReasonSuspended}},
		{"concurrency 0", Limits{MaxConcurrent: i64(0)}, ones.Cost(1, 0), Rejection{Reason: ReasonSuspended}},
		{"too large for the bucket", Limits{WeightedPerMinute: i64(6000)}, ones.Cost(1001, 0),
			Rejection{Reason: ReasonTooLarge, Limit: 6000, Remaining: 1000, Unit: "weighted tokens", Need: 1001, Capacity: 1000}},
		{"too large for the KV limit", Limits{MaxKVBlocks: i64(100)}, ones.Cost(101, 0),
			Rejection{Reason: ReasonTooLarge, Limit: 100, Remaining: 100, Unit: "KV blocks", Need: 101, Capacity: 100}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			enforce := NewTenant(tc.l, now0)
			if diff := cmp.Diff(tc.want, mustReject(t, enforce, now0, tc.c)); diff != "" {
				t.Fatalf("Enforce (-want +got):\n%s", diff)
			}
			tc.l.DryRun = true
			tn := NewTenant(tc.l, now0)
			before := stateOf(tn, now0)
			if rej := tn.Check(now0, tc.c); rej != nil || !tn.Allowed(now0, tc.c) {
				t.Errorf("Check = %+v, Allowed = %v; want nil, true", rej, tn.Allowed(now0, tc.c))
			}
			r := mustAdmit(t, tn, now0, tc.c)
			if got := r.DryRunRejection(); got == nil || *got != tc.want {
				t.Fatalf("DryRunRejection = %+v, want %+v", got, tc.want)
			}
			if diff := cmp.Diff(before, stateOf(tn, now0)); diff != "" {
				t.Errorf("a shadow admission changed the tenant (-before +after):\n%s", diff)
			}
			if got, want := tn.Snapshot(now0).Limited, enforce.Snapshot(now0).Limited; got != want {
				t.Errorf("Limited = %v, want %v as under Enforce", got, want)
			}
		})
	}
}

// TestDryRunShadowSettlesOnce: a shadow reservation settles exactly once,
// even when Complete and Cancel race; it moves no bucket and releases nothing
// (the slot and blocks belong to the admitted request); UsedWeighted is the
// actual spend (usage weighted, or the cost when usage is unknown, 0 on
// Cancel) so that the budget counts it.
func TestDryRunShadowSettlesOnce(t *testing.T) {
	newTenant := func() (*Tenant, *Reservation, *Reservation) {
		tn := NewTenant(Limits{WeightedPerMinute: i64(6000), MaxConcurrent: i64(1), DryRun: true}, now0)
		held := mustAdmit(t, tn, now0, DefaultCostModel.Cost(100, 100)) // 500 weighted
		shadow := mustAdmit(t, tn, now0, DefaultCostModel.Cost(100, 100))
		if rej := shadow.DryRunRejection(); rej == nil || rej.Reason != ReasonConcurrency {
			t.Fatalf("second request: DryRunRejection %+v, want concurrency_limit", rej)
		}
		return tn, held, shadow
	}
	for _, tc := range []struct {
		name   string
		settle func(*Reservation) Settlement
		want   Settlement
	}{
		{"complete with usage", func(r *Reservation) Settlement {
			return r.Complete(now0, Usage{PromptTokens: 100, OutputTokens: 20, Known: true})
		}, Settlement{Applied: true, UsedWeighted: 180}},
		{"complete without usage", func(r *Reservation) Settlement { return r.Complete(now0, Usage{}) },
			Settlement{Applied: true, UsedWeighted: 500}},
		{"cancel", func(r *Reservation) Settlement { return r.Cancel(now0) }, Settlement{Applied: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tn, held, shadow := newTenant()
			before := stateOf(tn, now0)
			if diff := cmp.Diff(tc.want, tc.settle(shadow)); diff != "" {
				t.Errorf("first settlement (-want +got):\n%s", diff)
			}
			if s := shadow.Cancel(now0); s != (Settlement{}) {
				t.Errorf("Cancel after settlement = %+v, want the zero Settlement", s)
			}
			if s := shadow.Complete(now0, Usage{Known: true}); s != (Settlement{}) {
				t.Errorf("Complete after settlement = %+v, want the zero Settlement", s)
			}
			if diff := cmp.Diff(before, stateOf(tn, now0)); diff != "" {
				t.Errorf("settling the shadow changed the tenant (-before +after):\n%s", diff)
			}
			// The admitted request still holds its slot and settles normally.
			if got := held.Complete(now0, Usage{PromptTokens: 100, OutputTokens: 20, Known: true}); got != (Settlement{Applied: true, ChargedWeighted: 500, UsedWeighted: 180, RefundedWeighted: 320}) {
				t.Errorf("admitted settlement %+v", got)
			}
			if got := weighted(tn, now0); got != 820 {
				t.Errorf("bucket %v, want 820", got)
			}
			if s := tn.Snapshot(now0); s.InFlight != 0 {
				t.Errorf("in flight %d, want 0", s.InFlight)
			}
		})
	}
	t.Run("racing settlements", func(t *testing.T) {
		for range 200 {
			tn, _, shadow := newTenant()
			before := stateOf(tn, now0)
			results := make([]Settlement, 3)
			var wg sync.WaitGroup
			for i, settle := range []func() Settlement{
				func() Settlement { return shadow.Complete(now0, Usage{PromptTokens: 100, Known: true}) },
				func() Settlement { return shadow.Complete(now0, Usage{PromptTokens: 100, Known: true}) },
				func() Settlement { return shadow.Cancel(now0) },
			} {
				wg.Go(func() { results[i] = settle() })
			}
			wg.Wait()
			applied := 0
			for _, s := range results {
				if s.Applied {
					applied++
				} else if s != (Settlement{}) {
					t.Fatalf("a no-op settlement returned %+v", s)
				}
			}
			if applied != 1 {
				t.Fatalf("%d settlements applied, want 1: %+v", applied, results)
			}
			if diff := cmp.Diff(before, stateOf(tn, now0)); diff != "" {
				t.Fatalf("racing shadow settlements changed the tenant (-before +after):\n%s", diff)
			}
		}
	})
}

// TestDryRunParallel: 8 goroutines admit 1000 one-token requests at once on a
// frozen clock against a request burst of 100, while others read Check,
// Allowed and Snapshot: exactly 100 are admitted and charged, 900 are shadow
// reservations refused by the request rate, and after every settlement the
// request bucket is exactly empty and nothing is held.
func TestDryRunParallel(t *testing.T) {
	for iter := range 20 {
		tn := NewTenant(Limits{RequestsPerMinute: i64(600), WeightedPerMinute: i64(1 << 30), MaxConcurrent: i64(1000), DryRun: true}, now0)
		c := ones.Cost(1, 0)
		var mu sync.Mutex
		var real, shadow []*Reservation
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 8 {
			wg.Go(func() {
				<-start
				for range 125 {
					r, rej := tn.Admit(now0, c)
					if rej != nil {
						t.Errorf("DryRun rejected: %+v", rej)
						return
					}
					mu.Lock()
					if d := r.DryRunRejection(); d == nil {
						real = append(real, r)
					} else if d.Reason != ReasonRequestRate {
						t.Errorf("shadow reason %s, want request_rate_limit", d.Reason)
					} else {
						shadow = append(shadow, r)
					}
					mu.Unlock()
				}
			})
		}
		for range 2 {
			wg.Go(func() {
				<-start
				for range 200 {
					if tn.Check(now0, c) != nil || !tn.Allowed(now0, c) {
						t.Error("Check refused under DryRun")
						return
					}
					tn.Snapshot(now0)
				}
			})
		}
		close(start)
		wg.Wait()
		if len(real) != 100 || len(shadow) != 900 {
			t.Fatalf("iteration %d: %d admitted, %d shadow; want 100 and 900", iter, len(real), len(shadow))
		}
		if s := tn.Snapshot(now0); s.InFlight != 100 || s.KVBlocks != 100 || s.RequestsRemaining != 0 || !s.Limited {
			t.Fatalf("iteration %d: snapshot %+v, want 100 in flight, 100 blocks, 0 requests left, Limited", iter, s)
		}
		for _, rs := range [][]*Reservation{real, shadow} {
			for _, r := range rs {
				wg.Go(func() { r.Complete(now0, Usage{PromptTokens: 1, Known: true}) })
			}
		}
		wg.Wait()
		if got := requests(tn, now0); got != 0 {
			t.Fatalf("iteration %d: request bucket %v, want 0", iter, got)
		}
		if got := weighted(tn, now0); got != tn.capacity[dimWeighted]-100 {
			t.Fatalf("iteration %d: weighted bucket %v, want capacity - 100", iter, got)
		}
		if s := tn.Snapshot(now0); s.InFlight != 0 || s.KVBlocks != 0 {
			t.Fatalf("iteration %d: %+v after settlement, want nothing held", iter, s)
		}
	}
}

// TestDryRunUpdate: switching the mode changes later admissions only; every
// reservation settles by the mode it was admitted under.
func TestDryRunUpdate(t *testing.T) {
	l := Limits{WeightedPerMinute: i64(6000), MaxConcurrent: i64(1)}
	tn := NewTenant(l, now0)
	real := mustAdmit(t, tn, now0, ones.Cost(600, 0))
	mustReject(t, tn, now0, ones.Cost(1, 0))
	l.DryRun = true
	tn.Update(now0, l)
	shadow := mustAdmit(t, tn, now0, ones.Cost(600, 0))
	if rej := shadow.DryRunRejection(); rej == nil || rej.Reason != ReasonConcurrency {
		t.Fatalf("DryRunRejection %+v, want concurrency_limit", rej)
	}
	l.DryRun = false
	tn.Update(now0, l)
	if s := shadow.Complete(now0, Usage{PromptTokens: 600, Known: true}); s != (Settlement{Applied: true, UsedWeighted: 600}) {
		t.Errorf("shadow settlement %+v", s)
	}
	if s := tn.Snapshot(now0); s.InFlight != 1 || s.TokensRemaining != 400 {
		t.Errorf("after the shadow settles: %+v, want 1 in flight, 400 tokens", s)
	}
	if s := real.Cancel(now0); s != (Settlement{Applied: true, ChargedWeighted: 600, RefundedWeighted: 600}) {
		t.Errorf("real settlement %+v", s)
	}
	if s := tn.Snapshot(now0); s.InFlight != 0 || s.TokensRemaining != 1000 {
		t.Errorf("after the real one settles: %+v, want nothing held, 1000 tokens", s)
	}
}

// TestDryRunWithSoft: Soft decides first (a request over the token rate is
// admitted over the limit and charged into debt); a hard refusal (the request
// rate) becomes a shadow reservation that is not OverLimit.
func TestDryRunWithSoft(t *testing.T) {
	tn := NewTenant(Limits{WeightedPerMinute: i64(6000), RequestsPerMinute: i64(12), Soft: true, DryRun: true}, now0) // burst 1000, 2 requests
	mustAdmit(t, tn, now0, ones.Cost(800, 0))
	over := mustAdmit(t, tn, now0, ones.Cost(800, 0))
	if !over.OverLimit() || over.DryRunRejection() != nil {
		t.Errorf("over the soft limit: OverLimit %v, DryRunRejection %+v; want true, nil", over.OverLimit(), over.DryRunRejection())
	}
	shadow := mustAdmit(t, tn, now0, ones.Cost(800, 0))
	if rej := shadow.DryRunRejection(); rej == nil || rej.Reason != ReasonRequestRate || shadow.OverLimit() {
		t.Errorf("third: DryRunRejection %+v, OverLimit %v; want request_rate_limit, false", rej, shadow.OverLimit())
	}
	if got := weighted(tn, now0); got != -600 {
		t.Errorf("bucket %v, want -600 (the shadow charged nothing)", got)
	}
}

// TestTenantLayout: the admission path touches three whole cache lines and
// writes the first, and the third's refill compensation while a bucket is
// below its capacity (see Tenant): 192 bytes, a size class whose objects
// are 64-byte aligned; the bucket contents end line 0, the limits fill line 1
// and the rates start line 2. A
// Reservation is 88 bytes, so that a slab of 64 plus the 8-byte malloc header
// fits the 6144-byte size class (96 bytes per admission; 96-byte
// reservations would take the 6528-byte class).
func TestTenantLayout(t *testing.T) {
	var tn Tenant
	got := [6]uintptr{unsafe.Sizeof(tn), unsafe.Offsetof(tn.tokens), unsafe.Offsetof(tn.on), unsafe.Offsetof(tn.capacity), unsafe.Offsetof(tn.perMinute), unsafe.Sizeof(Reservation{})}
	if want := [6]uintptr{192, 32, 64, 96, 128, 88}; got != want {
		t.Errorf("Tenant size, offsets of tokens, on, capacity, perMinute, Reservation size = %v, want %v", got, want)
	}
	for range 100 {
		if p := uintptr(unsafe.Pointer(NewTenant(Limits{}, now0))); p%64 != 0 {
			t.Fatalf("tenant at %#x, not 64-byte aligned", p)
		}
	}
}
