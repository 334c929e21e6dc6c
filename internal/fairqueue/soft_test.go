package fairqueue

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestDeprioritisedTenantGetsQuarterShare: two backlogged tenants of equal
// weight; b is over its soft limit (Deprioritised) on every visit, so its
// deficit grows by Quantum/4 per round while a's grows by Quantum: with jobs
// of cost Quantum/4, a dispatches 4 jobs per round and b 1 (seed 002
// section 5, soft limit).
func TestDeprioritisedTenantGetsQuarterShare(t *testing.T) {
	q := New(Config{Quantum: 100})
	fill(t, q, "a", 100, 25)
	fill(t, q, "b", 100, 25)
	el := func(tenant string, _ *Job) Eligibility {
		if tenant == "b" {
			return Deprioritised
		}
		return Eligible
	}
	got := map[string]int{}
	for range 50 {
		j, _ := q.DequeueWith(now0, el)
		if j == nil {
			t.Fatal("nil job with both tenants backlogged")
		}
		got[j.Tenant]++
	}
	if d := cmp.Diff(map[string]int{"a": 40, "b": 10}, got); d != "" {
		t.Errorf("dispatches (-want +got):\n%s", d)
	}
}

// TestDeprioritisedAloneIsWorkConserving: a deprioritised tenant alone in
// the queue still gets every job, each in one Dequeue call, even when a job
// costs more than its reduced quantum.
func TestDeprioritisedAloneIsWorkConserving(t *testing.T) {
	q := New(Config{Quantum: 100, DeprioritisedDivisor: 10})
	fill(t, q, "b", 5, 95)
	for i := range 5 {
		j, _ := q.DequeueWith(now0, func(string, *Job) Eligibility { return Deprioritised })
		if j == nil || j.Tenant != "b" {
			t.Fatalf("Dequeue %d = %v, want a job of b", i, j)
		}
	}
	if n := q.Total(); n != 0 {
		t.Errorf("queued = %d, want 0", n)
	}
}

// TestDequeueBoolMatchesEligible: Dequeue's boolean test is DequeueWith
// with Eligible/Ineligible: the same sequence from the same queue.
func TestDequeueBoolMatchesEligible(t *testing.T) {
	build := func() *Queue {
		q := New(Config{Quantum: 50})
		fill(t, q, "a", 20, 30)
		fill(t, q, "b", 20, 70)
		fill(t, q, "c", 20, 10)
		return q
	}
	q1, q2 := build(), build()
	for i := range 60 {
		j1, _ := q1.Dequeue(now0, func(tenant string, _ *Job) bool { return tenant != "c" || i%3 == 0 })
		j2, _ := q2.DequeueWith(now0, func(tenant string, _ *Job) Eligibility {
			if tenant != "c" || i%3 == 0 {
				return Eligible
			}
			return Ineligible
		})
		if (j1 == nil) != (j2 == nil) || (j1 != nil && j1.ID != j2.ID) {
			t.Fatalf("step %d: Dequeue %v, DequeueWith %v", i, j1, j2)
		}
	}
}

// TestSetConfigAppliesLive: a new quantum applies to a non-empty queue from
// the next grant, without dropping or reordering jobs; a lower MaxTotal
// refuses new jobs but keeps the queued ones.
func TestSetConfigAppliesLive(t *testing.T) {
	q := New(Config{Quantum: 100})
	fill(t, q, "a", 10, 100)
	fill(t, q, "b", 10, 100)
	order := func(n int) string {
		s := ""
		for range n {
			j, _ := q.Dequeue(now0, nil)
			s += j.Tenant
		}
		return s
	}
	if got := order(4); got != "abab" {
		t.Fatalf("quantum 100: %q, want abab", got)
	}
	q.SetConfig(Config{Quantum: 200, MaxTotal: 5})
	if got := order(8); got != "aabbaabb" {
		t.Errorf("quantum 200: %q, want aabbaabb", got)
	}
	if q.Total() != 8 {
		t.Errorf("queued = %d, want 8 (nothing dropped)", q.Total())
	}
	if err := q.Enqueue(now0, job("late", "a", 100)); err == nil {
		t.Error("MaxTotal 5 with 8 queued accepted a job")
	}
}
