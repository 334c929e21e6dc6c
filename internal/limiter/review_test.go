package limiter

import (
	"testing"
)

// TestReviewSoftRefundNeverExceedsWhatWasTaken: a Soft tenant's bucket
// (capacity 1000) is at its floor of -1000 after two calls of 1000; a third
// call of 1000 is admitted over the limit but takes nothing (the debt is
// clamped at -capacity). Cancelling it must give back nothing: a refund is
// clamped to the charge actually taken (issue "Refunds are clamped to the
// charge"), so the bucket stays at -1000 instead of being credited 1000 it
// never paid, which would let a soft tenant mint tokens by cancelling.
func TestReviewSoftRefundNeverExceedsWhatWasTaken(t *testing.T) {
	tn := NewTenant(Limits{WeightedPerMinute: i64(6000), WeightedBurst: i64(1000), Soft: true}, now0)
	mustAdmit(t, tn, now0, ones.Cost(1000, 0))
	mustAdmit(t, tn, now0, ones.Cost(1000, 0))
	if got := weighted(tn, now0); got != -1000 {
		t.Fatalf("bucket %v after two calls, want -1000", got)
	}
	r3 := mustAdmit(t, tn, now0, ones.Cost(1000, 0))
	if got := weighted(tn, now0); got != -1000 {
		t.Fatalf("bucket %v after the third, want -1000 (floor)", got)
	}
	s := r3.Cancel(now0)
	if got := weighted(tn, now0); got != -1000 {
		t.Errorf("bucket %v after cancelling a call that took nothing, want -1000 (settlement %+v)", got, s)
	}
	// The same through Complete: a call charged 1000 while at the floor
	// that used 100 must leave the bucket 100 lower, not 900 higher.
	tn2 := NewTenant(Limits{WeightedPerMinute: i64(6000), WeightedBurst: i64(1000), Soft: true}, now0)
	mustAdmit(t, tn2, now0, ones.Cost(1000, 0))
	mustAdmit(t, tn2, now0, ones.Cost(1000, 0))
	r4 := mustAdmit(t, tn2, now0, ones.Cost(1000, 0))
	r4.Complete(now0, Usage{PromptTokens: 100, Known: true})
	if got := weighted(tn2, now0); got != -1000 {
		t.Errorf("bucket %v after completing an untaken charge of 1000 with usage 100, want -1000 (the floor)", got)
	}
}
