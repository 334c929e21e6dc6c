package fairqueue

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// TestChurnWithLookaheadAndDeadlines: few deadline buckets, heavy churn of every kind
// (cancel in any order, dequeue with lookahead, requeue, sweep); after each
// step the invariants hold, Sweep returns exactly the queued jobs expired
// at now, and no queued job is expired after a Sweep.
func TestChurnWithLookaheadAndDeadlines(t *testing.T) {
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 99))
		q := New(Config{Quantum: 50, Lookahead: 3, MaxBypass: 2})
		model := map[string]*Job{}
		var all []*Job
		now := now0
		n := 0
		for step := range 4000 {
			switch op := rng.IntN(10); {
			case op < 4:
				n++
				d := now.Add(time.Duration(rng.IntN(3000)+1) * time.Millisecond)
				j := &Job{ID: fmt.Sprint("j", n), Tenant: fmt.Sprint("t", rng.IntN(4)), Cost: int64(rng.IntN(60) + 1), Deadline: d}
				if err := q.Enqueue(now, j); err == nil {
					model[j.ID] = j
					all = append(all, j)
				}
			case op < 6:
				if len(all) > 0 {
					j := all[rng.IntN(len(all))]
					if q.Cancel(j) != (model[j.ID] == j) {
						t.Fatalf("seed %d step %d: Cancel(%s) disagrees with the model", seed, step, j.ID)
					}
					delete(model, j.ID)
				}
			case op < 8:
				j, exp := q.DequeueWith(now, func(_ string, j *Job) Eligibility {
					if j.Cost%3 == 0 {
						return Ineligible
					}
					return Eligible
				})
				for _, e := range exp {
					if model[e.ID] != e || !e.expiredAt(now) {
						t.Fatalf("seed %d step %d: expired %s wrongly", seed, step, e.ID)
					}
					delete(model, e.ID)
				}
				if j != nil {
					if model[j.ID] != j || j.expiredAt(now) {
						t.Fatalf("seed %d step %d: dequeued %s wrongly", seed, step, j.ID)
					}
					delete(model, j.ID)
					if rng.IntN(3) == 0 {
						q.Requeue(j)
						model[j.ID] = j
					}
				}
			case op < 9:
				now = now.Add(time.Duration(rng.IntN(400)) * time.Millisecond)
				got := q.Sweep(now)
				want := 0
				for _, j := range model {
					if j.expiredAt(now) {
						want++
					}
				}
				for _, j := range got {
					if model[j.ID] != j || !j.expiredAt(now) {
						t.Fatalf("seed %d step %d: swept %s wrongly", seed, step, j.ID)
					}
					delete(model, j.ID)
				}
				if len(got) != want {
					t.Fatalf("seed %d step %d: swept %d, %d queued jobs were expired", seed, step, len(got), want)
				}
			default:
				checkInvariants(t, q, model, []string{"t0", "t1", "t2", "t3"})
			}
			if q.Total() != len(model) {
				t.Fatalf("seed %d step %d: total %d, model %d", seed, step, q.Total(), len(model))
			}
		}
	}
}
