package limiter

import (
	"math"
	"testing"
	"time"
)

// TestLongIdleRefillsExactlyToTheBurst: at the CRD's largest rate and burst
// (10^15 weighted tokens), a bucket in full debt (-burst) that stays idle for
// 200 years holds exactly its burst: the refill of 6.3e18 ns at 10^15 a
// minute (about 10^23 tokens) neither overflows nor exceeds the capacity; a
// refund on top of a full bucket stays at the burst, and the Snapshot's
// figures are whole and exact.
func TestLongIdleRefillsExactlyToTheBurst(t *testing.T) {
	const big = int64(1_000_000_000_000_000)
	tn := NewTenant(Limits{WeightedPerMinute: i64(big), WeightedBurst: i64(big), RequestsPerMinute: i64(big)}, now0)
	// 2.5*10^11 prompt tokens at weight 4,000: 10^15 weighted tokens; the
	// usage reported is 2^40 tokens, far above: the debt stops at -burst.
	w4k := CostModel{InputWeight: 4000, OutputWeight: 4000, KVBlockTokens: 1}
	r := mustAdmit(t, tn, now0, w4k.Cost(250_000_000_000, 0))
	r.Complete(now0, Usage{PromptTokens: 1 << 40, Known: true})
	if got := weighted(tn, now0); got != -float64(big) {
		t.Fatalf("after the overrun: %v, want -10^15", got)
	}
	later := now0.Add(200 * 365 * 24 * time.Hour)
	if got := weighted(tn, later); got != float64(big) {
		t.Fatalf("after 200 idle years: %v, want exactly 10^15", got)
	}
	r = mustAdmit(t, tn, later, ones.Cost(1000, 0))
	if s := r.Complete(later.Add(time.Second), Usage{PromptTokens: 0, Known: true}); s.RefundedWeighted != 1000 {
		t.Fatalf("refund %d, want 1000", s.RefundedWeighted)
	}
	if got := weighted(tn, later.Add(time.Second)); got != float64(big) {
		t.Fatalf("a refund into a full bucket: %v, want 10^15 (the burst)", got)
	}
	s := tn.Snapshot(later.Add(time.Second))
	if s.TokensRemaining != big || s.TokensReset != 0 || s.InFlight != 0 || s.Limited {
		t.Fatalf("snapshot %+v, want %d remaining, nothing in flight, not limited", s, big)
	}
	b := NewBucket(float64(big), float64(big)/60, now0)
	b.Debit(now0, 3*float64(big))
	if got := b.Tokens(later); got != float64(big) {
		t.Fatalf("Bucket after 200 idle years: %v, want 10^15", got)
	}
}

// TestRefillExactOverAMillionOperations: a bucket of 10^9 weighted tokens
// refilled at 10^9 a minute (16.67 tokens a microsecond) and charged 16
// tokens every microsecond for 999,999 microseconds never fills, so every
// refill is added to what the bucket holds (a float64 rounding each, at
// values up to 666,666). It must then hold 999,999 x 2/3 = 666,666 tokens:
// the rounding of a million additions stays below 10^-7 token, admission
// at the boundary is exact (666,666 admitted, one more token refused), and
// the next token's wait is the exact 60 ns. Each refill added on its own
// lost up to half a unit in the last place of the level: the bucket held
// 666,665.999997815 (-2.2e-6, beyond the 1e-6 tolerance), so a request for
// exactly what had been refilled was refused with Retry-After 1 s; refills
// are now summed with compensation (Tenant.comp). A refill computed per
// tick with integer arithmetic (BC-16) would be 16 a tick and hold 0. The
// standalone Bucket follows the same rule.
func TestRefillExactOverAMillionOperations(t *testing.T) {
	const n = 999_999
	tn := NewTenant(Limits{WeightedPerMinute: i64(1_000_000_000), WeightedBurst: i64(1_000_000_000)}, now0)
	mustAdmit(t, tn, now0, ones.Cost(1_000_000_000, 0)).Complete(now0, Usage{PromptTokens: 1_000_000_000, Known: true})
	var now time.Time
	for i := 1; i <= n; i++ {
		now = now0.Add(time.Duration(i) * time.Microsecond)
		r, rej := tn.Admit(now, ones.Cost(16, 0))
		if rej != nil {
			t.Fatalf("operation %d refused: %+v", i, *rej)
		}
		r.Complete(now, Usage{PromptTokens: 16, Known: true})
	}
	got := weighted(tn, now)
	t.Logf("after %d operations: %.9f tokens (drift %.3g)", n, got, got-666_666)
	if math.Abs(got-666_666) > 1e-7 {
		t.Fatalf("after %d operations: %.9f tokens, want 666666 within 1e-7", n, got)
	}
	if s := tn.Snapshot(now); s.TokensRemaining != 666_666 || s.InFlight != 0 {
		t.Fatalf("snapshot %+v, want 666666 remaining and nothing in flight", s)
	}
	mustAdmit(t, tn, now, ones.Cost(666_666, 0))
	rej := mustReject(t, tn, now, ones.Cost(1, 0))
	if rej.Reason != ReasonTokenRate || rej.RetryAfter != 60*time.Nanosecond {
		t.Fatalf("one more token: %+v, want token_rate_limit with a 60 ns wait", rej)
	}

	b := NewBucket(1e9, 1e9/60, now0)
	b.Debit(now0, 1e9)
	for i := 1; i <= n; i++ {
		if ok, _ := b.TakeN(now0.Add(time.Duration(i)*time.Microsecond), 16); !ok {
			t.Fatalf("Bucket: operation %d refused", i)
		}
	}
	if got := b.Tokens(now); math.Abs(got-666_666) > 1e-7 {
		t.Fatalf("Bucket after %d operations: %.9f tokens, want 666666 within 1e-7", n, got)
	}
}

// TestSlotsReturnedOnEveryExit: a tenant at its concurrency (2) and KV
// block (100) limits gets both back from every settlement: Complete,
// Cancel, Abandon, and a second settlement of any of them releases nothing
// more (the counters never go below 0 and a third request still counts).
func TestSlotsReturnedOnEveryExit(t *testing.T) {
	cm := CostModel{InputWeight: 1, OutputWeight: 1, KVBlockTokens: 10}
	tn := NewTenant(Limits{MaxConcurrent: i64(2), MaxKVBlocks: i64(100)}, now0)
	for name, settle := range map[string]func(*Reservation){
		"complete": func(r *Reservation) { r.Complete(now0, Usage{PromptTokens: 200, OutputTokens: 300, Known: true}) },
		"unknown":  func(r *Reservation) { r.Complete(now0, Usage{}) },
		"cancel":   func(r *Reservation) { r.Cancel(now0) },
		"abandon":  func(r *Reservation) { r.Abandon(now0) },
	} {
		a := mustAdmit(t, tn, now0, cm.Cost(200, 300)) // 50 blocks
		b := mustAdmit(t, tn, now0, cm.Cost(200, 300))
		if rej := mustReject(t, tn, now0, cm.Cost(1, 0)); rej.Reason != ReasonConcurrency {
			t.Fatalf("%s: third request %+v, want concurrency_limit", name, rej)
		}
		settle(a)
		settle(a)
		if s := tn.Snapshot(now0); s.InFlight != 1 || s.KVBlocks != 50 {
			t.Fatalf("%s: after settling one twice: %d in flight, %d blocks; want 1 and 50", name, s.InFlight, s.KVBlocks)
		}
		settle(b)
		if s := tn.Snapshot(now0); s.InFlight != 0 || s.KVBlocks != 0 || s.Limited {
			t.Fatalf("%s: after settling both: %+v, want nothing held", name, s)
		}
	}
}
