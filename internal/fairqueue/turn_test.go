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
