package fairqueue

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// now0 is the regression cases' NOW: 2026-01-01T00:00:00Z.
var now0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return now0.Add(d) }

func job(id, tenant string, cost int64) *Job {
	return &Job{ID: id, Tenant: tenant, Cost: cost}
}

func jobAt(id, tenant string, cost int64, deadline time.Time) *Job {
	return &Job{ID: id, Tenant: tenant, Cost: cost, Deadline: deadline}
}

func mustEnqueue(tb testing.TB, q *Queue, now time.Time, jobs ...*Job) {
	tb.Helper()
	for _, j := range jobs {
		if err := q.Enqueue(now, j); err != nil {
			tb.Fatalf("Enqueue(%s): %v", j.ID, err)
		}
	}
}

// fill enqueues n jobs of cost for tenant, with IDs tenant-0, tenant-1, ...
func fill(tb testing.TB, q *Queue, tenant string, n int, cost int64) {
	tb.Helper()
	for i := range n {
		mustEnqueue(tb, q, now0, job(tenant+"-"+strconv.Itoa(i), tenant, cost))
	}
}

// drain dequeues every job at now with everything eligible and returns them.
func drain(tb testing.TB, q *Queue, now time.Time) []*Job {
	tb.Helper()
	var out []*Job
	for {
		j, exp := q.Dequeue(now, nil)
		if len(exp) > 0 {
			tb.Fatalf("unexpected expired jobs: %d", len(exp))
		}
		if j == nil {
			return out
		}
		out = append(out, j)
	}
}

func tenantsOf(jobs []*Job) []string {
	out := make([]string, len(jobs))
	for i, j := range jobs {
		out[i] = j.Tenant
	}
	return out
}

func ids(jobs []*Job) []string {
	out := make([]string, len(jobs))
	for i, j := range jobs {
		out[i] = j.ID
	}
	return out
}

// TestSeed000_SmallTenantInterleaved: 500 jobs for a large tenant, then 3 for
// a small one, each costing one quantum: the small tenant's jobs run second,
// fourth and sixth, not after the backlog.
func TestSeed000_SmallTenantInterleaved(t *testing.T) {
	q := New(Config{Quantum: 1000})
	fill(t, q, "large", 500, 1000)
	fill(t, q, "small", 3, 1000)
	got := drain(t, q, now0)
	if len(got) != 503 {
		t.Fatalf("dispatched %d, want 503", len(got))
	}
	var pos []int
	for i, j := range got {
		if j.Tenant == "small" {
			pos = append(pos, i+1)
		}
	}
	if diff := cmp.Diff([]int{2, 4, 6}, pos); diff != "" {
		t.Errorf("small tenant positions (-want +got):\n%s", diff)
	}
	if q.Total() != 0 || q.Len("large") != 0 {
		t.Errorf("after drain: total %d, large %d", q.Total(), q.Len("large"))
	}
}

// TestSeed000_FairByCostNotCount: 1,000-token jobs against 100-token jobs,
// both backlogged: token totals stay within one large job of each other over
// every prefix, and are equal after every whole round.
func TestSeed000_FairByCostNotCount(t *testing.T) {
	q := New(Config{Quantum: 1000})
	fill(t, q, "big", 300, 1000)
	fill(t, q, "small", 3000, 100)
	tokens := map[string]int64{}
	for i := range 2000 {
		j, _ := q.Dequeue(now0, nil)
		tokens[j.Tenant] += j.Cost
		if d := tokens["big"] - tokens["small"]; d > 1000 || d < -1000 {
			t.Fatalf("after %d dispatches: big %d, small %d tokens; want within 1000", i+1, tokens["big"], tokens["small"])
		}
		if (i+1)%11 == 0 && tokens["big"] != tokens["small"] {
			t.Fatalf("after round %d: big %d, small %d; want equal", (i+1)/11, tokens["big"], tokens["small"])
		}
	}
}

// TestSeed000_WeightThree: a weight of three gets exactly three times the
// tokens over whole rounds.
func TestSeed000_WeightThree(t *testing.T) {
	q := New(Config{Quantum: 1000})
	q.SetTenant("gold", 3, -1)
	fill(t, q, "gold", 2000, 250)  // 12 jobs per round
	fill(t, q, "basic", 1000, 500) // 2 jobs per round
	tokens := map[string]int64{}
	for i := range 14 * 50 {
		j, _ := q.Dequeue(now0, nil)
		tokens[j.Tenant] += j.Cost
		if (i+1)%14 == 0 && tokens["gold"] != 3*tokens["basic"] {
			t.Fatalf("after round %d: gold %d, basic %d; want exactly 3x", (i+1)/14, tokens["gold"], tokens["basic"])
		}
	}
	if tokens["gold"] != 150000 || tokens["basic"] != 50000 {
		t.Errorf("tokens %v, want gold 150000 and basic 50000", tokens)
	}
}

// TestSeed000_FullTenantDoesNotBlockOthers: a tenant at its bound is refused
// with ErrTenantFull while others enqueue; the pool bound is separate.
func TestSeed000_FullTenantDoesNotBlockOthers(t *testing.T) {
	q := New(Config{MaxTotal: 5, DefaultMaxQueued: 2})
	mustEnqueue(t, q, now0, job("a1", "a", 1), job("a2", "a", 1))
	if err := q.Enqueue(now0, job("a3", "a", 1)); !errors.Is(err, ErrTenantFull) {
		t.Fatalf("a3: %v, want ErrTenantFull", err)
	}
	mustEnqueue(t, q, now0, job("b1", "b", 1), job("b2", "b", 1), job("c1", "c", 1))
	if err := q.Enqueue(now0, job("c2", "c", 1)); !errors.Is(err, ErrPoolFull) {
		t.Fatalf("c2: %v, want ErrPoolFull", err)
	}
	if q.Total() != 5 || q.Len("a") != 2 || q.Len("b") != 2 || q.Len("c") != 1 {
		t.Errorf("lengths: total %d a %d b %d c %d", q.Total(), q.Len("a"), q.Len("b"), q.Len("c"))
	}
}

func TestEnqueueErrors(t *testing.T) {
	q := New(Config{})
	dup := job("x", "a", 5)
	mustEnqueue(t, q, now0, dup)
	for name, tc := range map[string]struct {
		j    *Job
		want error
	}{
		"nil":           {nil, ErrInvalidJob},
		"empty id":      {job("", "a", 1), ErrInvalidJob},
		"zero cost":     {job("z", "a", 0), ErrInvalidJob},
		"duplicate":     {dup, ErrDuplicateID},
		"past deadline": {jobAt("p", "a", 1, at(-time.Second)), ErrExpired},
		"deadline now":  {jobAt("p", "a", 1, now0), ErrExpired},
	} {
		if err := q.Enqueue(now0, tc.j); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	if q.Total() != 1 {
		t.Errorf("total %d, want 1", q.Total())
	}
}

// TestSeed000_ExpiredDroppedReportedNotCharged: the expired head is dropped
// and reported, the tenant's deficit is charged only for the live job, which
// runs next.
func TestSeed000_ExpiredDroppedReportedNotCharged(t *testing.T) {
	q := New(Config{Quantum: 1500})
	mustEnqueue(t, q, now0, jobAt("old", "a", 1000, at(time.Second)), jobAt("live", "a", 1000, at(time.Minute)))
	next, expired := q.Dequeue(at(2*time.Second), nil)
	if next == nil || next.ID != "live" {
		t.Fatalf("next = %v, want live", next)
	}
	if diff := cmp.Diff([]string{"old"}, ids(expired)); diff != "" {
		t.Errorf("expired (-want +got):\n%s", diff)
	}
	// 1500 - 1000 would be -500 with the expired job charged too; the queue
	// emptied, so the deficit is 0 either way: check before it empties.
	q2 := New(Config{Quantum: 1500})
	mustEnqueue(t, q2, now0, jobAt("old", "a", 1000, at(time.Second)), jobAt("live", "a", 1000, at(time.Minute)), job("more", "a", 1000))
	if next, _ := q2.Dequeue(at(2*time.Second), nil); next.ID != "live" {
		t.Fatalf("next = %s, want live", next.ID)
	}
	if d := q2.Deficit("a"); d != 500 {
		t.Errorf("deficit %d, want 500 (only the live job charged)", d)
	}
}

// TestBC34_NoCreditWhileIdle: A's deficit is 0 when its queue empties and
// when it re-activates; afterwards A and B alternate, A with at most one
// quantum of head start.
func TestBC34_NoCreditWhileIdle(t *testing.T) {
	q := New(Config{Quantum: 1000})
	fill(t, q, "B", 200, 1000)
	mustEnqueue(t, q, now0, job("A-early", "A", 1500)) // needs two visits, 500 left over
	var seenA bool
	for i := range 60 { // only B (and A's one job) for 60 s
		j, _ := q.Dequeue(at(time.Duration(i)*time.Second), nil)
		if j.Tenant == "A" {
			seenA = true
			if d := q.Deficit("A"); d != 0 {
				t.Fatalf("A's deficit %d when its queue emptied, want 0 (500 must not be banked)", d)
			}
		}
	}
	if !seenA {
		t.Fatal("A's early job was never dispatched")
	}
	for i := range 50 {
		mustEnqueue(t, q, at(60*time.Second), job("A-"+strconv.Itoa(i), "A", 1000))
		if i == 0 {
			if d := q.Deficit("A"); d != 0 {
				t.Fatalf("A's deficit %d at re-activation, want 0", d)
			}
		}
	}
	count := map[string]int{}
	for i := range 60 {
		j, _ := q.Dequeue(at(60*time.Second), nil)
		count[j.Tenant]++
		if d := count["A"] - count["B"]; d > 1 || d < -1 {
			t.Fatalf("after %d dispatches: A %d, B %d; want alternation", i+1, count["A"], count["B"])
		}
	}
}

// TestBC35_ExpiredJobsFreeTheBoundAtOnce follows the case: A has 5 expired and
// 5 valid jobs, B 10 valid, bound 10, equal weights, quantum 1000.
func TestBC35_ExpiredJobsFreeTheBoundAtOnce(t *testing.T) {
	q := New(Config{Quantum: 1000, DefaultMaxQueued: 10})
	for i := range 5 {
		mustEnqueue(t, q, now0, jobAt("A-exp-"+strconv.Itoa(i), "A", 1000, at(time.Second)))
	}
	for i := range 5 {
		mustEnqueue(t, q, now0, jobAt("A-"+strconv.Itoa(i), "A", 1000, at(time.Hour)))
	}
	fill(t, q, "B", 10, 1000)
	now := at(2 * time.Second)
	if err := q.Enqueue(now, job("A-new-x", "A", 1000)); !errors.Is(err, ErrTenantFull) {
		t.Fatalf("before the sweep: %v, want ErrTenantFull", err)
	}
	swept := q.Sweep(now)
	if diff := cmp.Diff([]string{"A-exp-0", "A-exp-1", "A-exp-2", "A-exp-3", "A-exp-4"}, ids(swept)); diff != "" {
		t.Errorf("swept (-want +got):\n%s", diff)
	}
	if q.Len("A") != 5 || q.Deficit("A") != 0 {
		t.Errorf("after sweep: A len %d deficit %d, want 5 and 0 (untouched)", q.Len("A"), q.Deficit("A"))
	}
	for i := range 5 {
		mustEnqueue(t, q, now, job("A-new-"+strconv.Itoa(i), "A", 1000))
	}
	if err := q.Enqueue(now, job("A-over", "A", 1000)); !errors.Is(err, ErrTenantFull) {
		t.Errorf("11th: %v, want ErrTenantFull", err)
	}
	got := tenantsOf(drain(t, q, now))
	want := []string{"A", "B", "A", "B", "A", "B", "A", "B", "A", "B", "A", "B", "A", "B", "A", "B", "A", "B", "A", "B"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("dispatch order (-want +got):\n%s", diff)
	}

	// Without a sweep, Dequeue drops them at the head and charges nothing.
	q = New(Config{Quantum: 1000, DefaultMaxQueued: 10})
	for i := range 5 {
		mustEnqueue(t, q, now0, jobAt("A-exp-"+strconv.Itoa(i), "A", 1000, at(time.Second)))
	}
	fill(t, q, "A", 5, 1000)
	fill(t, q, "B", 10, 1000)
	next, expired := q.Dequeue(now, nil)
	if next.ID != "A-0" || len(expired) != 5 || q.Deficit("A") != 0 {
		t.Errorf("dequeue: next %s, %d expired, A deficit %d; want A-0, 5, 0", next.ID, len(expired), q.Deficit("A"))
	}
}

// TestBC37_DeadlineRecheckedAtDispatch: a job reached 1 ms after its deadline
// is not returned; it is reported expired.
func TestBC37_DeadlineRecheckedAtDispatch(t *testing.T) {
	q := New(Config{})
	deadline := at(30 * time.Second)
	mustEnqueue(t, q, now0, jobAt("j", "a", 100, deadline))
	next, expired := q.Dequeue(deadline.Add(time.Millisecond), nil)
	if next != nil {
		t.Fatalf("dispatched %s after its deadline", next.ID)
	}
	if diff := cmp.Diff([]string{"j"}, ids(expired)); diff != "" {
		t.Errorf("expired (-want +got):\n%s", diff)
	}
	if q.Total() != 0 {
		t.Errorf("total %d, want 0", q.Total())
	}
	// Exactly at the deadline counts as expired; a nanosecond before does not.
	mustEnqueue(t, q, now0, jobAt("k", "a", 100, deadline), jobAt("l", "a", 100, deadline.Add(time.Nanosecond)))
	next, expired = q.Dequeue(deadline, nil)
	if next == nil || next.ID != "l" || len(expired) != 1 || expired[0].ID != "k" {
		t.Errorf("at the deadline: next %v expired %v", next, ids(expired))
	}
}

// TestBC38_BoundsExact: bound 3 by count: the 4th is refused; a dequeue and
// an expiry (after a sweep) each make room. By tokens: 10000.
func TestBC38_BoundsExact(t *testing.T) {
	q := New(Config{})
	q.SetTenant("t", 1, 3)
	mustEnqueue(t, q, now0, job("1", "t", 10), jobAt("2", "t", 10, at(time.Second)), job("3", "t", 10))
	if err := q.Enqueue(now0, job("4", "t", 10)); !errors.Is(err, ErrTenantFull) {
		t.Fatalf("4th: %v, want ErrTenantFull", err)
	}
	if j, _ := q.Dequeue(now0, nil); j.ID != "1" {
		t.Fatalf("dequeued %s, want 1", j.ID)
	}
	mustEnqueue(t, q, now0, job("4", "t", 10))
	if err := q.Enqueue(now0, job("5", "t", 10)); !errors.Is(err, ErrTenantFull) {
		t.Fatalf("5th: %v, want ErrTenantFull", err)
	}
	if got := ids(q.Sweep(at(time.Second))); !cmp.Equal(got, []string{"2"}) {
		t.Fatalf("swept %v, want [2]", got)
	}
	mustEnqueue(t, q, at(time.Second), job("5", "t", 10))
	if q.Len("t") != 3 {
		t.Errorf("len %d, want 3", q.Len("t"))
	}

	q.SetTenantMaxTokens("tok", 10000)
	mustEnqueue(t, q, now0, job("a", "tok", 4000), job("b", "tok", 4000))
	if err := q.Enqueue(now0, job("c", "tok", 3000)); !errors.Is(err, ErrTenantFull) {
		t.Fatalf("10000-token bound: %v, want ErrTenantFull", err)
	}
	mustEnqueue(t, q, now0, job("c", "tok", 2000))

	// Zero means no job may be queued; below zero means no bound.
	q.SetTenant("none", 1, 0)
	if err := q.Enqueue(now0, job("n", "none", 1)); !errors.Is(err, ErrTenantFull) {
		t.Errorf("maxQueued 0: %v, want ErrTenantFull", err)
	}
	q.SetTenant("none", 1, -1)
	mustEnqueue(t, q, now0, job("n", "none", 1))
}

// TestBC38_PropertyCountsNeverDrift runs random operation sequences against a
// model: after every operation Len and Total equal the real counts, the
// internal lists agree with the counters, no job is lost or returned twice,
// and an empty tenant has no deficit.
func TestBC38_PropertyCountsNeverDrift(t *testing.T) {
	for seed := range uint64(40) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 0xfa1))
			q := New(Config{Quantum: 700, MaxTotal: 60, DefaultMaxQueued: 15, Lookahead: int(seed % 3), MaxBypass: 2})
			tenants := []string{"a", "b", "c", "d", "e"}
			model := map[string]*Job{} // queued, by ID
			all := map[string]*Job{}   // every job created, by ID (the caller's records)
			var out []*Job             // dequeued and not yet settled
			next := 0
			now := now0
			returned := func(op string, jobs ...*Job) {
				for _, j := range jobs {
					if model[j.ID] != j {
						t.Fatalf("%s returned %s, which is not queued", op, j.ID)
					}
					delete(model, j.ID)
				}
			}
			for step := range 3000 {
				switch op := rng.IntN(10); {
				case op < 4:
					j := job("j"+strconv.Itoa(next), tenants[rng.IntN(len(tenants))], 1+rng.Int64N(2000))
					next++
					all[j.ID] = j
					if rng.IntN(2) == 0 {
						j.Deadline = now.Add(time.Duration(rng.IntN(5000)) * time.Millisecond)
					}
					if err := q.Enqueue(now, j); err == nil {
						model[j.ID] = j
					} else if !errors.Is(err, ErrTenantFull) && !errors.Is(err, ErrPoolFull) && !errors.Is(err, ErrExpired) {
						t.Fatalf("step %d: %v", step, err)
					}
				case op < 7:
					blocked := tenants[rng.IntN(len(tenants))]
					j, exp := q.Dequeue(now, func(tn string, h *Job) bool { return tn != blocked || h.Cost < 500 })
					returned("Dequeue expired", exp...)
					for _, e := range exp {
						if now.Before(e.Deadline) {
							t.Fatalf("step %d: %s reported expired before its deadline", step, e.ID)
						}
					}
					if j != nil {
						if j.Deadline.IsZero() == false && !now.Before(j.Deadline) {
							t.Fatalf("step %d: dispatched %s after its deadline", step, j.ID)
						}
						returned("Dequeue", j)
						out = append(out, j)
					}
				case op == 7:
					if len(model) > 0 {
						id := "j" + strconv.Itoa(rng.IntN(next))
						j := all[id]
						ok := q.Cancel(j)
						if ok != (model[id] != nil) || q.Queued(j) {
							t.Fatalf("step %d: Cancel(%s) = %v, model has %v", step, id, ok, model[id] != nil)
						}
						if ok {
							returned("Cancel", j)
						}
					}
				case op == 8:
					now = now.Add(time.Duration(rng.IntN(800)) * time.Millisecond)
					returned("Sweep", q.Sweep(now)...)
					for _, j := range model {
						if j.expiredAt(now) {
							t.Fatalf("step %d: %s expired but not swept", step, j.ID)
						}
					}
				default:
					if len(out) > 0 {
						i := rng.IntN(len(out))
						j := out[i]
						out = append(out[:i], out[i+1:]...)
						if rng.IntN(2) == 0 {
							q.Requeue(j)
							model[j.ID] = j
						}
					}
					if rng.IntN(4) == 0 {
						q.SetTenant(tenants[rng.IntN(len(tenants))], 1+rng.Int64N(4), 5+rng.IntN(15))
					}
				}
				checkInvariants(t, q, model, tenants)
			}
			// Drain: every queued job comes out exactly once.
			now = now.Add(time.Hour)
			returned("final Sweep", q.Sweep(now)...)
			for {
				j, exp := q.Dequeue(now, nil)
				returned("final Dequeue expired", exp...)
				if j == nil {
					break
				}
				returned("final Dequeue", j)
				checkInvariants(t, q, model, tenants)
			}
			if len(model) != 0 || q.Total() != 0 {
				t.Fatalf("after final sweep: %d in model, total %d", len(model), q.Total())
			}
		})
	}
}

func checkInvariants(t *testing.T, q *Queue, model map[string]*Job, tenants []string) {
	t.Helper()
	want := map[string]int{}
	wantTokens := map[string]int64{}
	for _, j := range model {
		want[j.Tenant]++
		wantTokens[j.Tenant] += j.Cost
	}
	if q.Total() != len(model) {
		t.Fatalf("Total %d, model %d", q.Total(), len(model))
	}
	for id, j := range model {
		if !q.Queued(j) {
			t.Fatalf("%s not marked queued", id)
		}
	}
	active := 0
	for _, name := range tenants {
		if q.Len(name) != want[name] {
			t.Fatalf("Len(%s) = %d, model %d", name, q.Len(name), want[name])
		}
		tq := q.tenants[name]
		if tq == nil {
			if want[name] != 0 {
				t.Fatalf("tenant %s forgotten with %d jobs", name, want[name])
			}
			continue
		}
		n := 0
		if used := int(tq.tail - tq.head); used > len(tq.ring) || tq.n > 0 && (tq.ring[tq.head&tq.mask()] == nil || tq.ring[(tq.tail-1)&tq.mask()] == nil) {
			t.Fatalf("tenant %s: %d slots used of %d, or a tombstone at an end", name, used, len(tq.ring))
		}
		if tombs := int(tq.tail-tq.head) - tq.n; tombs > max(tq.n, minRing) {
			t.Fatalf("tenant %s: %d tombstones for %d jobs", name, tombs, tq.n)
		}
		for s := tq.head; s != tq.tail; s++ {
			j := tq.ring[s&tq.mask()]
			if j == nil {
				continue
			}
			if model[j.ID] != j || j.pos != s {
				t.Fatalf("tenant %s lists %s at %d (pos %d), not in the model", name, j.ID, s, j.pos)
			}
			n++
		}
		if n != tq.n || tq.tokens != wantTokens[name] {
			t.Fatalf("tenant %s: list %d, counter %d, tokens %d (model %d)", name, n, tq.n, tq.tokens, wantTokens[name])
		}
		if tq.active != (tq.n > 0) {
			t.Fatalf("tenant %s: active %v with %d jobs", name, tq.active, tq.n)
		}
		if tq.n == 0 && tq.deficit != 0 {
			t.Fatalf("tenant %s: empty with deficit %d", name, tq.deficit)
		}
		if tq.active {
			active++
		}
	}
	if active != q.nActive {
		t.Fatalf("nActive %d, counted %d", q.nActive, active)
	}
	if q.cur != nil {
		ring := 0
		for tq := q.cur; ; tq = tq.next {
			ring++
			if tq.next.prev != tq {
				t.Fatal("ring links broken")
			}
			if tq.next == q.cur {
				break
			}
		}
		if ring != q.nActive {
			t.Fatalf("ring %d, nActive %d", ring, q.nActive)
		}
	} else if q.nActive != 0 {
		t.Fatalf("no current tenant with %d active", q.nActive)
	}
	indexed := 0
	for _, b := range q.bheap {
		live := 0
		if b.head > len(b.tickets) || (b.head < len(b.tickets) && b.tickets[b.head] == nil) {
			t.Fatalf("bucket %d: head %d of %d tickets is not a live ticket", b.key, b.head, len(b.tickets))
		}
		for i, j := range b.tickets {
			if j == nil {
				continue
			}
			if i < b.head {
				t.Fatalf("bucket %d: ticket of %s at %d, before the head %d", b.key, j.ID, i, b.head)
			}
			if model[j.ID] != j || !j.ticketed {
				t.Fatalf("deadline index holds %s, not queued (ticketed %v)", j.ID, j.ticketed)
			}
			if k, _ := bucketKey(j.Deadline); k != b.key || j.dpos != b.base+uint32(i) {
				t.Fatalf("job %s in bucket %d position %d, want bucket %d position %d", j.ID, b.key, b.base+uint32(i), k, j.dpos)
			}
			live++
		}
		if live != b.live || live == 0 || q.buckets[b.key] != b {
			t.Fatalf("bucket %d: %d live tickets, live %d, %d tickets", b.key, live, b.live, len(b.tickets))
		}
		indexed += live
	}
	if len(q.buckets) != len(q.bheap) {
		t.Fatalf("%d buckets in the map, %d in the heap", len(q.buckets), len(q.bheap))
	}
	withDeadline := 0
	for _, j := range model {
		if !j.Deadline.IsZero() {
			withDeadline++
		}
	}
	if indexed != withDeadline {
		t.Fatalf("deadline index holds %d jobs, %d have deadlines", indexed, withDeadline)
	}
}

// jain returns Jain's fairness index of xs: (sum x)^2 / (n * sum x^2).
func jain(xs []float64) float64 {
	var s, s2 float64
	for _, x := range xs {
		s += x
		s2 += x * x
	}
	return s * s / (float64(len(xs)) * s2)
}

// TestFairnessSimulation: weights 1:2:4 (and equal weights), mixed job costs,
// all tenants backlogged: each tenant's token share is within 5% of its ideal
// share and Jain's index of tokens/weight is at least 0.99 (brief
// "Performance targets").
func TestFairnessSimulation(t *testing.T) {
	for _, weights := range [][]int64{{1, 2, 4}, {1, 1, 1}} {
		t.Run(fmt.Sprint(weights), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, 7))
			q := New(Config{Quantum: 1000})
			for i, w := range weights {
				name := "t" + strconv.Itoa(i)
				q.SetTenant(name, w, -1)
				for k := range 20000 {
					mustEnqueue(t, q, now0, job(name+"-"+strconv.Itoa(k), name, 100+rng.Int64N(2900)))
				}
			}
			tokens := make([]float64, len(weights))
			var total float64
			for total < 5_000_000 {
				j, _ := q.Dequeue(now0, nil)
				i, _ := strconv.Atoi(j.Tenant[1:])
				tokens[i] += float64(j.Cost)
				total += float64(j.Cost)
			}
			checkShares(t, weights, tokens)
		})
	}
}

// TestLargeJobEventuallyServed: a job costing ten quanta is served once its
// tenant has accumulated ten quanta; a lone tenant's huge job is dispatched by
// a single Dequeue call (no spinning round by round).
func TestLargeJobEventuallyServed(t *testing.T) {
	q := New(Config{Quantum: 1000})
	mustEnqueue(t, q, now0, job("huge", "A", 10000))
	fill(t, q, "B", 100, 1000)
	for i := 1; ; i++ {
		j, _ := q.Dequeue(now0, nil)
		if j.ID == "huge" {
			if i != 10 { // B gets one job in each of the first 9 rounds
				t.Errorf("huge dispatched at position %d, want 10", i)
			}
			break
		}
		if i > 20 {
			t.Fatal("huge job starved")
		}
	}
	q = New(Config{Quantum: 1000})
	mustEnqueue(t, q, now0, job("enormous", "A", 1e12), job("after", "A", 1))
	calls := 0
	j, _ := q.Dequeue(now0, func(string, *Job) bool { calls++; return true })
	if j == nil || j.ID != "enormous" || calls > 3 {
		t.Errorf("got %v after %d eligibility calls, want enormous within 3", j, calls)
	}
	if d := q.Deficit("A"); d < 0 || d >= 1000 {
		t.Errorf("deficit after fast-forward %d, want within [0, quantum)", d)
	}
}

// TestEligibilitySkipKeepsPlaceAndDeficit: an ineligible tenant keeps its
// position in the round and its deficit, gains no quanta while skipped, and
// a pass in which nobody is eligible returns nil after one visit each.
func TestEligibilitySkipKeepsPlaceAndDeficit(t *testing.T) {
	q := New(Config{Quantum: 1000})
	fill(t, q, "A", 20, 600)
	fill(t, q, "B", 20, 1000)
	fill(t, q, "C", 20, 1000)
	if j, _ := q.Dequeue(now0, nil); j.Tenant != "A" || q.Deficit("A") != 400 {
		t.Fatalf("first: %s, A deficit %d; want A, 400", j.Tenant, q.Deficit("A"))
	}
	blockA := func(tn string, _ *Job) bool { return tn != "A" }
	var order []string
	for range 6 {
		j, _ := q.Dequeue(now0, blockA)
		order = append(order, j.Tenant)
		if d := q.Deficit("A"); d != 400 {
			t.Fatalf("A's deficit %d while skipped, want 400", d)
		}
	}
	if diff := cmp.Diff([]string{"B", "C", "B", "C", "B", "C"}, order); diff != "" {
		t.Errorf("order with A blocked (-want +got):\n%s", diff)
	}
	// A is eligible again and its turn comes in its place, after C: one new
	// quantum on top of the 400 it kept covers two 600-token jobs.
	order = order[:0]
	for range 4 {
		j, _ := q.Dequeue(now0, nil)
		order = append(order, j.Tenant)
	}
	if diff := cmp.Diff([]string{"A", "A", "B", "C"}, order); diff != "" {
		t.Errorf("order after unblocking (-want +got):\n%s", diff)
	}
	if d := q.Deficit("A"); d != 200 {
		t.Errorf("A's deficit %d, want 200", d)
	}

	calls := 0
	before := q.Tenants()
	j, exp := q.Dequeue(now0, func(string, *Job) bool { calls++; return false })
	if j != nil || exp != nil || calls != 3 {
		t.Errorf("nobody eligible: %v, %v after %d calls; want nil after 3", j, exp, calls)
	}
	if diff := cmp.Diff(before, q.Tenants()); diff != "" {
		t.Errorf("an all-ineligible pass changed state (-before +after):\n%s", diff)
	}
	// Work-conserving: the only eligible tenant gets every dispatch.
	for range 10 {
		if j, _ := q.Dequeue(now0, func(tn string, _ *Job) bool { return tn == "C" }); j == nil || j.Tenant != "C" {
			t.Fatalf("lone eligible tenant C not served: %v", j)
		}
	}
}

// TestRequeueRestoresDeficit: a job put back after an upstream 429 is at its
// tenant's head again and its cost is returned to the deficit.
func TestRequeueRestoresDeficit(t *testing.T) {
	q := New(Config{Quantum: 1000})
	fill(t, q, "A", 3, 400)
	fill(t, q, "B", 3, 400)
	j, _ := q.Dequeue(now0, nil)
	if j.ID != "A-0" || q.Deficit("A") != 600 {
		t.Fatalf("got %s, A deficit %d", j.ID, q.Deficit("A"))
	}
	q.Requeue(j)
	if q.Deficit("A") != 1000 || q.Len("A") != 3 || q.Total() != 6 {
		t.Errorf("after requeue: deficit %d len %d total %d; want 1000, 3, 6", q.Deficit("A"), q.Len("A"), q.Total())
	}
	q.Requeue(j) // already queued: no-op
	if q.Len("A") != 3 {
		t.Errorf("double requeue: len %d", q.Len("A"))
	}
	if got := ids(drain(t, q, now0)); !cmp.Equal(got, []string{"A-0", "A-1", "B-0", "B-1", "A-2", "B-2"}) {
		t.Errorf("order after requeue: %v", got)
	}
	// A tenant that had left the round comes back at the turn with the deficit
	// it had before the Dequeue (the Dequeue is undone exactly).
	q = New(Config{Quantum: 1000})
	mustEnqueue(t, q, now0, job("only", "A", 700))
	j, _ = q.Dequeue(now0, nil)
	if q.Deficit("A") != 0 {
		t.Fatalf("deficit after emptying %d", q.Deficit("A"))
	}
	q.Requeue(j)
	if q.Deficit("A") != 1000 || q.Len("A") != 1 {
		t.Errorf("requeue into an empty tenant: deficit %d len %d; want 1000, 1", q.Deficit("A"), q.Len("A"))
	}
}

func TestCancelAndQueued(t *testing.T) {
	q := New(Config{Quantum: 1000})
	a2 := jobAt("a2", "A", 300, at(time.Hour))
	mustEnqueue(t, q, now0, job("a1", "A", 300), a2, job("b1", "B", 300))
	a1, _ := q.Dequeue(now0, nil) // A: deficit 700
	if a1.ID != "a1" || q.Queued(a1) || q.Cancel(a1) {
		t.Fatalf("dequeued %s still queued or cancellable", a1.ID)
	}
	if !q.Queued(a2) {
		t.Fatal("a2 not queued")
	}
	if !q.Cancel(a2) {
		t.Fatal("Cancel(a2) = false")
	}
	if q.Cancel(a2) {
		t.Error("second Cancel(a2) succeeded")
	}
	if q.Queued(a2) || q.Cancel(nil) || q.Cancel(job("a3", "A", 1)) {
		t.Error("Queued after Cancel, or Cancel of a job never queued succeeded")
	}
	if q.Len("A") != 0 || q.Deficit("A") != 0 || q.Total() != 1 {
		t.Errorf("A len %d deficit %d total %d; want 0, 0, 1", q.Len("A"), q.Deficit("A"), q.Total())
	}
	if swept := q.Sweep(at(2 * time.Hour)); len(swept) != 0 {
		t.Errorf("sweep found the cancelled job: %v", ids(swept))
	}
	// The job may be queued again.
	mustEnqueue(t, q, now0, a2)
}

// TestBC32_LookaheadWithBoundedBypass: with 950 of 1000 KV blocks held, R1
// (200 blocks) cannot start but R2 and R3 (10 each) can and do; after
// MaxBypass overtakes R1 blocks its tenant, so its wait is bounded, and it
// runs first once blocks are released.
func TestBC32_LookaheadWithBoundedBypass(t *testing.T) {
	q := New(Config{Quantum: 10000, Lookahead: 4, MaxBypass: 2})
	held := int64(950)
	kv := map[string]int64{"R1": 200, "R2": 10, "R3": 10, "R4": 10}
	mustEnqueue(t, q, now0, job("R1", "T", 200), job("R2", "T", 10), job("R3", "T", 10), job("R4", "T", 10))
	fits := func(_ string, j *Job) bool { return held+kv[j.ID] <= 1000 }
	var got []string
	for range 3 {
		j, _ := q.Dequeue(now0, fits)
		if j == nil {
			got = append(got, "-")
			continue
		}
		held += kv[j.ID]
		got = append(got, j.ID)
	}
	if diff := cmp.Diff([]string{"R2", "R3", "-"}, got); diff != "" {
		t.Errorf("with 950 held (-want +got):\n%s", diff)
	}
	held = 760 // R2, R3 and others finished
	got = ids(append([]*Job(nil), must(q.Dequeue(now0, fits)), must(q.Dequeue(now0, fits))))
	if diff := cmp.Diff([]string{"R1", "R4"}, got); diff != "" {
		t.Errorf("after release (-want +got):\n%s", diff)
	}
	// Without Lookahead the head blocks its tenant (strict FIFO).
	q = New(Config{Quantum: 10000})
	held = 950
	mustEnqueue(t, q, now0, job("R1", "T", 200), job("R2", "T", 10))
	if j, _ := q.Dequeue(now0, fits); j != nil {
		t.Errorf("strict FIFO dispatched %s", j.ID)
	}
}

func must(j *Job, _ []*Job) *Job { return j }

// TestTenantIneligibleStopsLookahead: a head job the test calls
// TenantIneligible (no job of the tenant could start: its concurrency binds)
// ends the tenant's visit without testing its later jobs, and without
// counting as a bypass; a later job called TenantIneligible ends the
// lookahead there, so a job behind it is not considered; Ineligible keeps
// looking (up to Lookahead jobs).
func TestTenantIneligibleStopsLookahead(t *testing.T) {
	q := New(Config{Quantum: 10000, Lookahead: 4, MaxBypass: 2})
	mustEnqueue(t, q, now0, job("A1", "A", 10), job("A2", "A", 10), job("A3", "A", 10), job("A4", "A", 10))
	answer := map[string]Eligibility{"A1": TenantIneligible, "A2": Eligible, "A3": Eligible, "A4": Eligible}
	var tested []string
	test := func(_ string, j *Job) Eligibility {
		tested = append(tested, j.ID)
		return answer[j.ID]
	}
	if j, _ := q.DequeueWith(now0, test); j != nil {
		t.Fatalf("dispatched %s while the head is TenantIneligible", j.ID)
	}
	if diff := cmp.Diff([]string{"A1"}, tested); diff != "" {
		t.Errorf("jobs tested (-want +got):\n%s", diff)
	}
	answer["A1"], answer["A2"] = Ineligible, TenantIneligible
	tested = nil
	if j, _ := q.DequeueWith(now0, test); j != nil {
		t.Fatalf("dispatched %s past a TenantIneligible job", j.ID)
	}
	if diff := cmp.Diff([]string{"A1", "A2"}, tested); diff != "" {
		t.Errorf("jobs tested (-want +got):\n%s", diff)
	}
	answer["A2"] = Ineligible
	tested = nil
	if j, _ := q.DequeueWith(now0, test); j == nil || j.ID != "A3" {
		t.Fatalf("dispatched %v, want A3 (A1 and A2 Ineligible)", j)
	}
	if diff := cmp.Diff([]string{"A1", "A2", "A3"}, tested); diff != "" {
		t.Errorf("jobs tested (-want +got):\n%s", diff)
	}
	if q.tenants["A"].first().bypassed != 1 {
		t.Errorf("A1 bypassed %d times, want 1 (the TenantIneligible visits are not bypasses)", q.tenants["A"].first().bypassed)
	}
}

// TestSetTenantLive: lowering a bound never drops queued jobs; a new weight
// applies from the next quantum.
func TestSetTenantLive(t *testing.T) {
	q := New(Config{Quantum: 100})
	fill(t, q, "A", 5, 100)
	fill(t, q, "B", 20, 100)
	q.SetTenant("A", 1, 2)
	if q.Len("A") != 5 {
		t.Fatalf("lowering the bound dropped jobs: %d", q.Len("A"))
	}
	if err := q.Enqueue(now0, job("A-x", "A", 100)); !errors.Is(err, ErrTenantFull) {
		t.Errorf("over the lowered bound: %v", err)
	}
	q.SetTenant("B", 3, -1)
	if got := tenantsOf(drain(t, q, now0))[:8]; !cmp.Equal(got, []string{"A", "B", "B", "B", "A", "B", "B", "B"}) {
		t.Errorf("order after weight change: %v", got)
	}
	q.RemoveTenant("B")
	want := []TenantStats{{Tenant: "A", Weight: 1}}
	if diff := cmp.Diff(want, q.Tenants()); diff != "" {
		t.Errorf("Tenants (-want +got):\n%s", diff)
	}
}

func TestTenants(t *testing.T) {
	q := New(Config{Quantum: 1000, DefaultWeight: 2})
	q.SetTenant("z", 5, 10)
	mustEnqueue(t, q, now0, job("1", "b", 300), job("2", "b", 300), job("3", "a", 50))
	q.Dequeue(now0, nil)
	want := []TenantStats{
		{Tenant: "a", Queued: 1, Tokens: 50, Weight: 2},
		{Tenant: "b", Queued: 1, Tokens: 300, Deficit: 1700, Weight: 2},
		{Tenant: "z", Weight: 5},
	}
	if diff := cmp.Diff(want, q.Tenants()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestBucketKey(t *testing.T) {
	for _, tc := range []struct {
		d    time.Time
		want int64
		ok   bool
	}{
		{now0, 1767225600, true},
		{now0.Add(999 * time.Millisecond), 1767225600, true},
		{now0.Add(time.Second), 1767225601, true},
		{time.Unix(-1, 500), -1, true},
		{time.Unix(-2, 0), -2, true},
		{time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC), 0, false},
	} {
		if got, ok := bucketKey(tc.d); got != tc.want || ok != tc.ok {
			t.Errorf("bucketKey(%v) = %d, %v; want %d, %v", tc.d, got, ok, tc.want, tc.ok)
		}
	}
	// A job with a deadline beyond the index still expires at dispatch.
	q := New(Config{})
	far := time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)
	mustEnqueue(t, q, now0, jobAt("far", "a", 1, far))
	if got := q.Sweep(far.Add(time.Hour)); len(got) != 0 {
		t.Errorf("swept %v", ids(got))
	}
	if j, exp := q.Dequeue(far, nil); j != nil || len(exp) != 1 {
		t.Errorf("at the far deadline: %v, %d expired", j, len(exp))
	}
}

// checkShares asserts that each tenant's dispatched tokens are within 5% of
// its weighted share of the total and that Jain's index of tokens/weight is
// at least 0.99.
func checkShares(t *testing.T, weights []int64, tokens []float64) {
	t.Helper()
	var total, sumW float64
	for i, w := range weights {
		total += tokens[i]
		sumW += float64(w)
	}
	norm := make([]float64, len(weights))
	for i, w := range weights {
		ideal := total * float64(w) / sumW
		if dev := math.Abs(tokens[i]-ideal) / ideal; dev > 0.05 {
			t.Errorf("tenant %d (weight %d): %.0f tokens, ideal %.0f (%.2f%% off)", i, w, tokens[i], ideal, dev*100)
		}
		norm[i] = tokens[i] / float64(w)
	}
	if j := jain(norm); j < 0.99 {
		t.Errorf("Jain index %.4f, want >= 0.99", j)
	}
}

// TestTenantRefEnqueueTo: EnqueueTo with a TenantRef queues exactly as
// Enqueue by name (same FIFO, same bounds), sets the job's Tenant, and a
// ref kept across RemoveTenant (which forgot the empty tenant) still works.
func TestTenantRefEnqueueTo(t *testing.T) {
	q := New(Config{Quantum: 1000})
	ref := q.Tenant("A")
	if ref.Name() != "A" || len(q.Tenants()) != 1 {
		t.Fatalf("ref %q, tenants %v", ref.Name(), q.Tenants())
	}
	j1, j2 := job("a1", "", 300), job("a2", "other", 300)
	if err := q.EnqueueTo(now0, ref, j1); err != nil {
		t.Fatal(err)
	}
	mustEnqueue(t, q, now0, job("a3", "A", 300))
	if err := q.EnqueueTo(now0, ref, j2); err != nil {
		t.Fatal(err)
	}
	if j1.Tenant != "A" || j2.Tenant != "A" || q.Len("A") != 3 || q.Len("other") != 0 {
		t.Fatalf("tenants %q %q, len A %d other %d", j1.Tenant, j2.Tenant, q.Len("A"), q.Len("other"))
	}
	if got := ids(drain(t, q, now0)); fmt.Sprint(got) != "[a1 a3 a2]" {
		t.Fatalf("order %v, want [a1 a3 a2]", got)
	}
	if err := q.EnqueueTo(now0, TenantRef{}, job("z", "A", 1)); !errors.Is(err, ErrInvalidJob) {
		t.Errorf("zero ref: %v, want ErrInvalidJob", err)
	}
	q.SetTenant("A", 1, 1)
	mustEnqueue(t, q, now0, job("b1", "A", 1))
	if err := q.EnqueueTo(now0, ref, job("b2", "A", 1)); !errors.Is(err, ErrTenantFull) {
		t.Errorf("bound via ref: %v, want ErrTenantFull", err)
	}
	drain(t, q, now0)
	q.RemoveTenant("A") // empty and unconfigured: forgotten
	if len(q.Tenants()) != 0 {
		t.Fatalf("tenants after RemoveTenant: %v", q.Tenants())
	}
	if err := q.EnqueueTo(now0, ref, job("c1", "A", 1)); err != nil || q.Len("A") != 1 || q.Total() != 1 {
		t.Fatalf("stale ref: %v, len %d total %d", err, q.Len("A"), q.Total())
	}
	if j, _ := q.Dequeue(now0, nil); j == nil || j.ID != "c1" {
		t.Fatalf("dequeued %v, want c1", j)
	}
	// As Enqueue by name: the state the stale ref recreated is unconfigured,
	// so it is forgotten again once empty.
	if got := q.Tenants(); len(got) != 0 {
		t.Fatalf("tenants after the stale ref's job left: %v, want none", got)
	}
	// A tenant configured again after it was forgotten: the stale ref
	// queues into the new state, under its bound.
	q.SetTenant("A", 3, 1)
	if err := q.EnqueueTo(now0, ref, job("d1", "A", 1)); err != nil {
		t.Fatal(err)
	}
	if err := q.EnqueueTo(now0, ref, job("d2", "A", 1)); !errors.Is(err, ErrTenantFull) {
		t.Errorf("stale ref over the new bound: %v, want ErrTenantFull", err)
	}
	if got := q.Tenants(); len(got) != 1 || got[0].Queued != 1 || got[0].Weight != 3 {
		t.Fatalf("tenants: %+v, want A with weight 3 and 1 job", got)
	}
}

// TestRingsAndTicketsUnderChurn drives two tenants with hundreds of jobs
// each through enqueues, cancellations from the middle, dispatches,
// requeues and sweeps, so that rings grow, compact their tombstones and
// shrink, and deadline buckets compact their stale tickets; after every
// step each tenant's jobs come out of its ring in the model's FIFO order
// and the invariants hold.
func TestRingsAndTicketsUnderChurn(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	q := New(Config{Quantum: 100})
	tenants := []string{"a", "b"}
	fifo := map[string][]*Job{}
	model := map[string]*Job{}
	now := now0
	next := 0
	drop := func(j *Job) {
		s := fifo[j.Tenant]
		for i, x := range s {
			if x == j {
				fifo[j.Tenant] = append(s[:i:i], s[i+1:]...)
				delete(model, j.ID)
				return
			}
		}
		t.Fatalf("%s not in the model", j.ID)
	}
	for step := range 20000 {
		phase := step / 2500 % 2 // grow, then shrink
		switch op := rng.IntN(10); {
		case op < 5-phase*2 && len(model) < 1500 || len(model) == 0:
			tn := tenants[rng.IntN(2)]
			j := job("j"+strconv.Itoa(next), tn, 1+rng.Int64N(150))
			next++
			if rng.IntN(3) > 0 {
				j.Deadline = now.Add(time.Duration(500+rng.IntN(3000)) * time.Millisecond)
			}
			mustEnqueue(t, q, now, j)
			fifo[tn] = append(fifo[tn], j)
			model[j.ID] = j
		case op < 7:
			s := fifo[tenants[rng.IntN(2)]]
			if len(s) > 0 {
				j := s[rng.IntN(len(s))]
				if !q.Cancel(j) {
					t.Fatalf("step %d: Cancel(%s) false", step, j.ID)
				}
				drop(j)
			}
		case op < 9:
			j, exp := q.Dequeue(now, nil)
			for _, e := range exp {
				drop(e)
			}
			if j != nil {
				if s := fifo[j.Tenant]; len(s) == 0 || s[0] != j {
					t.Fatalf("step %d: dispatched %s, not its tenant's head", step, j.ID)
				}
				drop(j)
				if rng.IntN(4) == 0 {
					q.Requeue(j)
					fifo[j.Tenant] = append([]*Job{j}, fifo[j.Tenant]...)
					model[j.ID] = j
				}
			}
		default:
			now = now.Add(time.Duration(rng.IntN(200)) * time.Millisecond)
			for _, j := range q.Sweep(now) {
				drop(j)
			}
		}
		if step%97 == 0 {
			checkInvariants(t, q, model, tenants)
			for _, tn := range tenants {
				var got []*Job
				if tq := q.tenants[tn]; tq != nil {
					for s := tq.head; s != tq.tail; s++ {
						if j := tq.ring[s&tq.mask()]; j != nil {
							got = append(got, j)
						}
					}
				}
				if fmt.Sprint(ids(got)) != fmt.Sprint(ids(fifo[tn])) {
					t.Fatalf("step %d: tenant %s ring %v, model %v", step, tn, ids(got), ids(fifo[tn]))
				}
			}
		}
	}
}

// TestDeadlineBucketDropsClearedPrefix: jobs that leave in the order they
// came (one deadline bucket, each dispatched job queued again) keep the
// bucket's slice at a bounded size by dropping its cleared prefix: the
// positions stay absolute (base rises), every queued job's ticket is where
// its position says, and the slice never grows past twice the jobs (the
// earlier compaction kept it at that size too, but rewrote every job's
// position to do so).
func TestDeadlineBucketDropsClearedPrefix(t *testing.T) {
	q := New(Config{Quantum: 1})
	deadline := now0.Add(time.Hour)
	model := map[string]*Job{}
	for i := range 8 {
		j := &Job{ID: fmt.Sprint("j", i), Tenant: fmt.Sprint("t", i%4), Cost: 1, Deadline: deadline}
		mustEnqueue(t, q, now0, j)
		model[j.ID] = j
	}
	for range 1000 {
		j, _ := q.Dequeue(now0, nil)
		mustEnqueue(t, q, now0, j)
	}
	checkInvariants(t, q, model, []string{"t0", "t1", "t2", "t3"})
	if len(q.bheap) != 1 {
		t.Fatalf("%d buckets, want 1", len(q.bheap))
	}
	b := q.bheap[0]
	// 1,008 tickets given in all: the next one's position is 1008.
	if next := b.base + uint32(len(b.tickets)); next != 1008 || cap(b.tickets) > 16 || b.live != 8 {
		t.Fatalf("bucket's next position %d (want 1008), cap %d (want at most 16), live %d", next, cap(b.tickets), b.live)
	}
	for _, j := range model {
		if b.tickets[j.dpos-b.base] != j {
			t.Fatalf("job %s not at its position %d", j.ID, j.dpos)
		}
	}
}
