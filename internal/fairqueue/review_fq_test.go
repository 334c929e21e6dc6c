package fairqueue

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
)

// TestReviewModelBased drives every public operation (including RemoveTenant,
// TenantRef/EnqueueTo, SetTenantMaxTokens, SetConfig and DequeueWith with
// Deprioritised) against a reference map and checks: counts and tokens agree,
// a job is returned at most once, never while not queued, never expired, and
// Dequeue with nil eligibility is work-conserving.
func TestReviewModelBased(t *testing.T) {
	for seed := range uint64(60) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 0xbeef))
			cfg := Config{Quantum: 1 + rng.Int64N(1500), MaxTotal: 80, DefaultMaxQueued: 20, Lookahead: int(seed % 4), MaxBypass: int(seed % 3), MaxWaitTokens: int64(seed%2) * 3000}
			q := New(cfg)
			tenants := []string{"a", "b", "c", "d", "e", "f"}
			refs := map[string]TenantRef{}
			model := map[string]*Job{}
			all := map[string]*Job{}
			var out []*Job
			next := 0
			now := now0
			take := func(step int, op string, jobs ...*Job) {
				for _, j := range jobs {
					if model[j.ID] != j {
						t.Fatalf("step %d: %s returned %s, not queued", step, op, j.ID)
					}
					delete(model, j.ID)
				}
			}
			for step := range 4000 {
				switch op := rng.IntN(16); {
				case op < 5:
					tn := tenants[rng.IntN(len(tenants))]
					j := &Job{ID: "j" + strconv.Itoa(next), Tenant: tn, Cost: 1 + rng.Int64N(3000)}
					next++
					all[j.ID] = j
					if rng.IntN(2) == 0 {
						j.Deadline = now.Add(time.Duration(rng.IntN(4000)) * time.Millisecond)
					}
					var err error
					if r, ok := refs[tn]; ok && rng.IntN(2) == 0 {
						err = q.EnqueueTo(now, r, j)
					} else {
						err = q.Enqueue(now, j)
					}
					if err == nil {
						model[j.ID] = j
					} else if !errors.Is(err, ErrTenantFull) && !errors.Is(err, ErrPoolFull) && !errors.Is(err, ErrExpired) {
						t.Fatalf("step %d: %v", step, err)
					}
				case op < 9:
					blocked := tenants[rng.IntN(len(tenants))]
					soft := tenants[rng.IntN(len(tenants))]
					var el func(string, *Job) Eligibility
					if rng.IntN(3) > 0 {
						el = func(tn string, h *Job) Eligibility {
							if tn == blocked && h.Cost > 700 {
								return Ineligible
							}
							if tn == soft {
								return Deprioritised
							}
							return Eligible
						}
					}
					live := 0
					for _, j := range model {
						if !j.expiredAt(now) {
							live++
						}
					}
					// Some tenant's first live job is eligible: Dequeue must dispatch.
					headOK := false
					for _, tn := range tenants {
						tq := q.tenants[tn]
						if tq == nil || tq.n == 0 {
							continue
						}
						for s := tq.head; s != tq.tail; s++ {
							h := tq.ring[s&tq.mask()]
							if h == nil || h.expiredAt(now) {
								continue
							}
							if el == nil || el(tn, h) != Ineligible {
								headOK = true
							}
							break
						}
					}
					j, exp := q.DequeueWith(now, el)
					if j == nil && headOK {
						t.Fatalf("step %d: nil although a tenant's live head is eligible", step)
					}
					take(step, "expired", exp...)
					for _, e := range exp {
						if !e.expiredAt(now) {
							t.Fatalf("step %d: %s reported expired early", step, e.ID)
						}
					}
					if j == nil && el == nil && live > 0 {
						t.Fatalf("step %d: nil with %d live jobs and everyone eligible", step, live)
					}
					if j != nil {
						if j.expiredAt(now) {
							t.Fatalf("step %d: dispatched expired %s", step, j.ID)
						}
						take(step, "Dequeue", j)
						out = append(out, j)
					}
				case op == 9:
					if next > 0 {
						j := all["j"+strconv.Itoa(rng.IntN(next))]
						ok := q.Cancel(j)
						if ok != (model[j.ID] == j) {
							t.Fatalf("step %d: Cancel(%s)=%v", step, j.ID, ok)
						}
						if ok {
							take(step, "Cancel", j)
						}
					}
				case op == 10:
					now = now.Add(time.Duration(rng.IntN(900)) * time.Millisecond)
					take(step, "Sweep", q.Sweep(now)...)
				case op == 11:
					if len(out) > 0 {
						i := rng.IntN(len(out))
						j := out[i]
						out = append(out[:i], out[i+1:]...)
						q.Requeue(j)
						model[j.ID] = j
					}
				case op == 12:
					tn := tenants[rng.IntN(len(tenants))]
					switch rng.IntN(4) {
					case 0:
						q.SetTenant(tn, rng.Int64N(5), rng.IntN(25)-2)
					case 1:
						q.SetTenantMaxTokens(tn, rng.Int64N(20000))
					case 2:
						q.RemoveTenant(tn)
					default:
						refs[tn] = q.Tenant(tn)
					}
				case op == 13:
					c := cfg
					c.Quantum = 1 + rng.Int64N(3000)
					c.MaxTotal = rng.IntN(100)
					q.SetConfig(c)
				default:
					// settle some dequeued jobs
					if len(out) > 0 {
						out = out[1:]
					}
				}
				checkInvariants(t, q, model, tenants)
				if q.Total() != len(model) {
					t.Fatalf("step %d: total", step)
				}
			}
			now = now.Add(time.Hour)
			take(-1, "final Sweep", q.Sweep(now)...)
			for {
				j, exp := q.Dequeue(now, nil)
				take(-1, "final expired", exp...)
				if j == nil {
					break
				}
				take(-1, "final", j)
			}
			if len(model) != 0 || q.Total() != 0 {
				t.Fatalf("left %d in model, total %d", len(model), q.Total())
			}
		})
	}
}

// TestReviewWeightsUnderChurn: weights 1:2:4 stay within a few percent when
// the throttle refuses and requeues some dispatches and eligibility flaps.
func TestReviewWeightsUnderChurn(t *testing.T) {
	weights := []int64{1, 2, 4}
	rng := rand.New(rand.NewPCG(3, 9))
	q := New(Config{Quantum: 512, Lookahead: 2})
	for i, w := range weights {
		name := "t" + strconv.Itoa(i)
		q.SetTenant(name, w, -1)
		for k := range 20000 {
			mustEnqueue(t, q, now0, job(name+"-"+strconv.Itoa(k), name, 50+rng.Int64N(4000)))
		}
	}
	tokens := make([]float64, len(weights))
	var total float64
	for total < 8_000_000 {
		j, _ := q.Dequeue(now0, func(tn string, h *Job) bool { return rng.IntN(5) > 0 })
		if j == nil {
			continue
		}
		if rng.IntN(4) == 0 {
			q.Requeue(j)
			continue
		}
		i, _ := strconv.Atoi(j.Tenant[1:])
		tokens[i] += float64(j.Cost)
		total += float64(j.Cost)
	}
	checkShares(t, weights, tokens)
}

type qstate struct {
	cur     string
	granted bool
	served  int64
	tenants string
}

func stateOf(q *Queue) qstate {
	s := qstate{granted: q.granted, served: q.served}
	if q.cur != nil {
		s.cur = q.cur.name
	}
	for _, ts := range q.Tenants() {
		t := q.tenants[ts.Tenant]
		var order []string
		for p := t.head; p != t.tail; p++ {
			if j := t.ring[p&t.mask()]; j != nil {
				order = append(order, j.ID)
			}
		}
		s.tenants += fmt.Sprintf("%s:n=%d tok=%d def=%d act=%v head@%d %v;", ts.Tenant, ts.Queued, ts.Tokens, ts.Deficit, t.active, t.headAt, order)
	}
	return s
}

// TestReviewRequeueUndoesExactly: Requeue of the job the latest Dequeue
// returned, then Dequeue, returns the same job and the same state (turn,
// deficits, order, aging clock): a throttle refusal loop changes nothing.
func TestReviewRequeueUndoesExactly(t *testing.T) {
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 1))
		q := New(Config{Quantum: 1 + rng.Int64N(2000), MaxWaitTokens: int64(seed%2) * 2500})
		tenants := []string{"a", "b", "c"}
		for i := range 30 {
			tn := tenants[rng.IntN(3)]
			if rng.IntN(4) == 0 {
				q.SetTenant(tn, 1+rng.Int64N(4), -1)
			}
			mustEnqueue(t, q, now0, job(fmt.Sprint("j", i), tn, 1+rng.Int64N(3000)))
		}
		for step := range 60 {
			// advance the state a little
			for range rng.IntN(3) {
				q.Dequeue(now0, nil)
			}
			if q.Total() == 0 {
				break
			}
			blocked := tenants[rng.IntN(3)]
			el := func(tn string, _ *Job) bool { return tn != blocked }
			j, _ := q.Dequeue(now0, el)
			if j == nil {
				continue
			}
			first := stateOf(q)
			q.Requeue(j)
			j2, _ := q.Dequeue(now0, el)
			if j2 != j {
				t.Fatalf("seed %d step %d: Dequeue after Requeue(%s) returned %v", seed, step, j.ID, j2)
			}
			if again := stateOf(q); again != first {
				t.Fatalf("seed %d step %d: Requeue(%s)+Dequeue differs:\nfirst %+v\nagain %+v", seed, step, j.ID, first, again)
			}
		}
	}
}
