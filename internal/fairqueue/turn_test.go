package fairqueue

import (
	"fmt"
	"testing"
	"time"
)

// TestIneligiblePassKeepsTheTurn covers the dispatcher's pattern while the upstream
// paces it: a dequeued job is refused by the throttle, requeued, and the next Dequeue
// finds every tenant ineligible (the model is blocked). Such a pass must neither move
// the round on nor grant a fresh quantum, or the tenant at the cursor is re-granted on
// every refusal and the others starve. Shares must stay at the weights (1:3).
func TestIneligiblePassKeepsTheTurn(t *testing.T) {
	now := time.Unix(0, 0)
	q := New(Config{Quantum: 4096})
	q.SetTenant("bulk", 1, 5000)
	q.SetTenant("premium", 3, 5000)
	for i := 0; i < 1000; i++ {
		for _, tenant := range []string{"bulk", "premium"} {
			if err := q.Enqueue(now, &Job{ID: fmt.Sprint(tenant, i), Tenant: tenant, Cost: 163, Deadline: now.Add(time.Hour)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	counts := map[string]int{}
	for step := 0; step < 1600; step++ {
		j, _ := q.Dequeue(now, nil)
		if j == nil {
			t.Fatal("queue drained early")
		}
		if step%2 == 1 { // the throttle refuses every other start
			q.Requeue(j)
			if j2, _ := q.Dequeue(now, func(string, *Job) bool { return false }); j2 != nil {
				t.Fatalf("an all-ineligible pass returned %s", j2.ID)
			}
			continue
		}
		counts[j.Tenant]++
	}
	ratio := float64(counts["premium"]) / float64(counts["bulk"])
	if ratio < 2.85 || ratio > 3.15 {
		t.Fatalf("premium/bulk = %d/%d = %.2f, want 3 +- 5%%", counts["premium"], counts["bulk"], ratio)
	}
}

// TestRequeueOfLastJobKeepsTheTurn: a tenant's last job is dequeued (the tenant leaves
// the round) and refused by the throttle; Requeue must put the tenant back at the turn
// with its deficit, not at the end of the round. Otherwise, when the throttle refuses
// most first attempts, the tenant's last job waits a whole round of the others every
// time and can starve until they drain.
func TestRequeueOfLastJobKeepsTheTurn(t *testing.T) {
	now := time.Unix(0, 0)
	q := New(Config{Quantum: 1000})
	q.SetTenant("bulk", 1, 100)
	q.SetTenant("small", 1, 100)
	for i := 0; i < 50; i++ {
		if err := q.Enqueue(now, &Job{ID: fmt.Sprint("b", i), Tenant: "bulk", Cost: 100, Deadline: now.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Enqueue(now, &Job{ID: "s0", Tenant: "small", Cost: 100, Deadline: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	// bulk's turn: 10 jobs of its quantum.
	for i := 0; i < 10; i++ {
		if j, _ := q.Dequeue(now, nil); j == nil || j.Tenant != "bulk" {
			t.Fatalf("dequeue %d: got %v, want a bulk job", i, j)
		}
	}
	s, _ := q.Dequeue(now, nil)
	if s == nil || s.ID != "s0" {
		t.Fatalf("got %v, want s0", s)
	}
	deficit := q.Deficit("small") // 0: small left the round
	for attempt := 0; attempt < 3; attempt++ {
		q.Requeue(s) // refused by the throttle
		if got := q.Deficit("small"); got != 1000 {
			t.Fatalf("attempt %d: small's deficit after Requeue = %d, want 1000 (its deficit before the Dequeue); was %d", attempt, got, deficit)
		}
		if j, _ := q.Dequeue(now, nil); j == nil || j.ID != "s0" {
			t.Fatalf("attempt %d: after Requeue got %v, want s0 again (small keeps its turn)", attempt, j)
		}
	}
}
