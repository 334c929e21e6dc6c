package fairqueue

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestSetCostReprices: jobs queued at one price and repriced (the pool's
// cost model changed) compete at the new price: A's six jobs queued at 200
// and repriced to 500 alternate with B's jobs of 500 under quantum 500,
// instead of A dispatching two or three per visit. A job out of the queue
// keeps the Cost it was charged, so Requeue gives back exactly that, and
// can be repriced once it is back.
func TestSetCostReprices(t *testing.T) {
	q := New(Config{Quantum: 500})
	fill(t, q, "A", 6, 200)
	out, _ := q.Dequeue(now0, nil) // A-0, charged 200
	for i := range 5 {
		if j := q.tenants["A"].ring[(q.tenants["A"].head+uint32(i))&q.tenants["A"].mask()]; !q.SetCost(j, 500) {
			t.Fatalf("SetCost(%s) = false", j.ID)
		}
	}
	if q.SetCost(out, 500) || out.Cost != 200 {
		t.Fatalf("a dispatched job was repriced to %d", out.Cost)
	}
	if st := q.Tenants()[0]; st.Tokens != 2500 || st.Deficit != 300 {
		t.Fatalf("A: %d tokens queued, deficit %d; want 2500 and 300 (the deficit untouched)", st.Tokens, st.Deficit)
	}
	q.Requeue(out)
	if q.Deficit("A") != 500 || !q.SetCost(out, 500) {
		t.Fatalf("after Requeue: A's deficit %d, want 500 (the 200 charged given back)", q.Deficit("A"))
	}
	fill(t, q, "B", 6, 500)
	got := tenantsOf(drain(t, q, now0))
	want := []string{"A", "B", "A", "B", "A", "B", "A", "B", "A", "B", "A", "B"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("order at the new price (-want +got):\n%s", diff)
	}
	if q.SetCost(nil, 1) || q.SetCost(job("x", "A", 1), 5) {
		t.Error("SetCost of nil or of a job never queued reported true")
	}
}
