package fairqueue

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestRequeueOfLookaheadPick: A1 cannot start (too large); A2 is
// dispatched past it through Lookahead and refused at start (the model's
// throttle, the pool's slots), so the dispatcher Requeues it. The undo
// leaves A1 the tenant's oldest job with its bypass count as before, and A2
// behind it.
func TestRequeueOfLookaheadPick(t *testing.T) {
	q := New(Config{Quantum: 10000, Lookahead: 8, MaxBypass: 4})
	mustEnqueue(t, q, now0, job("A1", "A", 10), job("A2", "A", 10), job("A3", "A", 10))
	a1Blocked := blocked("A1")
	j, _ := q.DequeueWith(now0, a1Blocked)
	if j == nil || j.ID != "A2" {
		t.Fatalf("dispatched %v, want A2", j)
	}
	q.Requeue(j) // refused at start
	head := q.tenants["A"].first()
	if head.ID != "A1" || head.bypassed != 0 {
		t.Errorf("after Requeue of the lookahead pick: head %s (bypassed %d), want A1 (bypassed 0)", head.ID, head.bypassed)
	}
	got := ids(drain(t, q, now0))
	if diff := cmp.Diff([]string{"A1", "A2", "A3"}, got); diff != "" {
		t.Errorf("order once every job may start (-want +got):\n%s", diff)
	}
}

// TestBypassBoundAfterRequeue: the tenant's oldest job A1 (too large for
// now) is passed over at most MaxBypass = 4 times. A2 (model X) is picked
// past A1 and refused at start by X's throttle (Requeue); X stays paused;
// A3..A9 are for another model: A3..A6 go, then the tenant waits for A1.
func TestBypassBoundAfterRequeue(t *testing.T) {
	q := New(Config{Quantum: 10000, Lookahead: 8, MaxBypass: 4})
	for _, id := range []string{"A1", "A2", "A3", "A4", "A5", "A6", "A7", "A8", "A9"} {
		mustEnqueue(t, q, now0, job(id, "A", 10))
	}
	xPaused := false
	el := func(_ string, j *Job) Eligibility {
		switch {
		case j.ID == "A1":
			return Ineligible // too large until the end
		case j.ID == "A2" && xPaused:
			return Ineligible // its model is paused
		}
		return Eligible
	}
	j, _ := q.DequeueWith(now0, el)
	if j == nil || j.ID != "A2" {
		t.Fatalf("dispatched %v, want A2", j)
	}
	q.Requeue(j) // the model's throttle refused it
	xPaused = true
	var before []string
	for {
		j, _ := q.DequeueWith(now0, el)
		if j == nil {
			break
		}
		before = append(before, j.ID)
	}
	xPaused = false // model X resumes; A1 still too large
	for {
		j, _ := q.DequeueWith(now0, el)
		if j == nil {
			break
		}
		before = append(before, j.ID)
	}
	if diff := cmp.Diff([]string{"A3", "A4", "A5", "A6"}, before); diff != "" {
		t.Errorf("dispatched before A1 (-want +got):\n%s", diff)
	}
}

// TestAgingWaitAfterLookaheadRequeue: with aging, A1's wait as head does
// not restart because a job picked past it was refused and requeued.
func TestAgingWaitAfterLookaheadRequeue(t *testing.T) {
	q := New(Config{Quantum: 100, Lookahead: 8, MaxBypass: 4, MaxWaitTokens: 1000})
	mustEnqueue(t, q, now0, job("A1", "A", 10), job("A2", "A", 10), job("B1", "B", 500), job("B2", "B", 500), job("B3", "B", 500))
	el := blocked("A1")
	for range 3 { // B is served 1,000 tokens while A1 is A's head
		q.DequeueWith(now0, func(tn string, j *Job) Eligibility {
			if tn == "A" {
				return Ineligible
			}
			return Eligible
		})
	}
	a := q.tenants["A"]
	waited := q.served - a.headAt
	j, _ := q.DequeueWith(now0, el)
	if j == nil || j.ID != "A2" {
		t.Fatalf("dispatched %v, want A2", j)
	}
	q.Requeue(j)
	j, _ = q.DequeueWith(now0, el) // A1 still cannot start
	if j == nil || j.ID != "A2" || a.first() == nil || a.first().ID != "A1" {
		t.Fatalf("head %v", a.first())
	}
	if got := q.served - a.headAt; got != waited+10 {
		t.Errorf("A1's wait as head %d tokens after the requeue and %s's dispatch, want %d (%d before, and A2's 10)", got, j.ID, waited+10, waited)
	}
}

// TestLateRequeueOfLookaheadPick: a job Lookahead dispatched past the head
// and requeued later (after a 429 from the provider, other dispatches in
// between) goes back behind that head, not in front of it; the head's
// bypass count stands (the call was sent), and the head's wait as head is
// kept.
func TestLateRequeueOfLookaheadPick(t *testing.T) {
	q := New(Config{Quantum: 10000, Lookahead: 8, MaxBypass: 4})
	mustEnqueue(t, q, now0, job("A1", "A", 10), job("A2", "A", 10), job("B1", "B", 10))
	a1Blocked := blocked("A1")
	a2, _ := q.DequeueWith(now0, a1Blocked)
	if a2 == nil || a2.ID != "A2" {
		t.Fatalf("dispatched %v, want A2", a2)
	}
	a := q.tenants["A"]
	headAt := a.headAt
	if b1, _ := q.DequeueWith(now0, a1Blocked); b1 == nil || b1.ID != "B1" {
		t.Fatalf("dispatched %v, want B1", b1)
	}
	q.Requeue(a2)
	if h := a.first(); h.ID != "A1" || h.bypassed != 1 || a.headAt != headAt {
		t.Errorf("head %s bypassed %d, head since %d; want A1 bypassed 1, head since %d", h.ID, h.bypassed, a.headAt, headAt)
	}
	if diff := cmp.Diff([]string{"A1", "A2"}, ids(drain(t, q, now0))); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
}

// blocked is an eligibility test under which only the job id cannot start.
func blocked(id string) func(string, *Job) Eligibility {
	return func(_ string, j *Job) Eligibility {
		if j.ID == id {
			return Ineligible
		}
		return Eligible
	}
}

// TestRequeueOfLookaheadPickAfterItsHeadLeft: A2 is dispatched past A1
// through Lookahead; while A2 is out (at the provider), A1 leaves the queue
// (cancelled by its tenant, or dispatched once it fits). A2 is then
// requeued (the provider answered 429): the job it passed is gone, so A2
// goes back to its tenant's head, in front of A3, which came after it;
// going "behind the head" would put it behind a younger job.
func TestRequeueOfLookaheadPickAfterItsHeadLeft(t *testing.T) {
	for _, tc := range []struct {
		name  string
		leave func(q *Queue, a1 *Job)
	}{
		{"cancelled", func(q *Queue, a1 *Job) {
			if !q.Cancel(a1) {
				t.Fatal("A1 was not queued")
			}
		}},
		{"dispatched", func(q *Queue, _ *Job) {
			if j, _ := q.DequeueWith(now0, nil); j == nil || j.ID != "A1" {
				t.Fatalf("dispatched %v, want A1", j)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := New(Config{Quantum: 10000, Lookahead: 8, MaxBypass: 4})
			a1 := job("A1", "A", 10)
			mustEnqueue(t, q, now0, a1, job("A2", "A", 10), job("A3", "A", 10))
			a2, _ := q.DequeueWith(now0, blocked("A1"))
			if a2 == nil || a2.ID != "A2" {
				t.Fatalf("dispatched %v, want A2", a2)
			}
			tc.leave(q, a1)
			q.Requeue(a2)
			if diff := cmp.Diff([]string{"A2", "A3"}, ids(drain(t, q, now0))); diff != "" {
				t.Errorf("order after the requeue (-want +got):\n%s", diff)
			}
		})
	}
}
