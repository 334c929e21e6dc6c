package fairqueue

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// backlog keeps a tenant backlogged with n queued jobs of cost, reusing each
// dispatched job (requeue refills), so that a simulation of millions of
// dispatches needs no more than n jobs.
type backlog struct {
	tenant string
	cost   int64
	tokens int64 // dispatched
	jobs   int   // dispatched
}

func (b *backlog) fill(tb testing.TB, q *Queue, n int) {
	tb.Helper()
	for i := range n {
		mustEnqueue(tb, q, now0, job(b.tenant+"-"+strconv.Itoa(i), b.tenant, b.cost))
	}
}

// TestSharesByCostTinyVsHugeJobs: DRR shares weighted tokens by cost and
// weight even when one tenant's jobs cost 1 token and another's cost
// 100,000, a hundred quanta (seed 000, "fair by cost, not by count"). With
// quantum 1000:
//
//   - weights 3:1, jobs of 1 and 100,000 tokens: the 100,000-token job goes
//     on its tenant's 100th visit, right after the other tenant's 3,000 jobs
//     of that round, so the k-th large job is dispatch k*300,001 and at that
//     moment the tokens are exactly 3:1;
//   - weights 1:1:1, jobs of 1, 1,000 and 100,000 tokens: every 100 rounds
//     (100,101 dispatches) the three have exactly 100,000 tokens each.
//
// The tenants stay backlogged (each dispatched job is queued again), so no
// deficit is reset on the way.
func TestSharesByCostTinyVsHugeJobs(t *testing.T) {
	t.Run("3:1", func(t *testing.T) {
		q := New(Config{Quantum: 1000})
		q.SetTenant("S", 3, -1)
		q.SetTenant("L", 1, -1)
		by := map[string]*backlog{"S": {tenant: "S", cost: 1}, "L": {tenant: "L", cost: 100_000}}
		by["S"].fill(t, q, 4)
		by["L"].fill(t, q, 2)
		for n := 1; n <= 2*300_001; n++ {
			j, exp := q.Dequeue(now0, nil)
			if j == nil || len(exp) > 0 {
				t.Fatalf("dispatch %d: %v, %d expired", n, j, len(exp))
			}
			b := by[j.Tenant]
			b.tokens += j.Cost
			b.jobs++
			mustEnqueue(t, q, now0, j)
			if j.Tenant == "L" {
				k := int64(by["L"].jobs)
				if n != int(k)*300_001 {
					t.Fatalf("large job %d dispatched at %d, want %d", k, n, k*300_001)
				}
				if s, l := by["S"].tokens, by["L"].tokens; s != 300_000*k || l != 100_000*k {
					t.Fatalf("at large job %d: S %d tokens, L %d; want %d and %d (exactly 3:1)", k, s, l, 300_000*k, 100_000*k)
				}
				if d := q.Deficit("L"); d != 0 {
					t.Fatalf("L's deficit after its job %d, want 0 (100 quanta of 1000 spent exactly)", d)
				}
			}
		}
		if by["L"].jobs != 2 {
			t.Fatalf("L dispatched %d large jobs, want 2", by["L"].jobs)
		}
	})
	t.Run("1:1:1", func(t *testing.T) {
		q := New(Config{Quantum: 1000})
		names := []string{"tiny", "mid", "huge"}
		by := map[string]*backlog{"tiny": {tenant: "tiny", cost: 1}, "mid": {tenant: "mid", cost: 1000}, "huge": {tenant: "huge", cost: 100_000}}
		for _, n := range names {
			by[n].fill(t, q, 3)
		}
		for n := 1; n <= 2*100_101; n++ {
			j, _ := q.Dequeue(now0, nil)
			by[j.Tenant].tokens += j.Cost
			by[j.Tenant].jobs++
			mustEnqueue(t, q, now0, j)
			if n%100_101 == 0 {
				k := int64(n / 100_101)
				got := []int64{by["tiny"].tokens, by["mid"].tokens, by["huge"].tokens}
				if diff := cmp.Diff([]int64{100_000 * k, 100_000 * k, 100_000 * k}, got); diff != "" {
					t.Fatalf("after %d dispatches (100 rounds x %d) tokens tiny, mid, huge (-want +got):\n%s", n, k, diff)
				}
				if j.Tenant != "huge" {
					t.Fatalf("dispatch %d is %s's, want the huge job (last of the 100th round)", n, j.Tenant)
				}
			}
		}
	})
}

// TestNoCreditBankedByAnAbandonedLargeJob (BC-34): a tenant half way to a
// job of 100 quanta banks 50,000 weighted tokens of deficit; when that job
// leaves the queue unsent (cancelled, swept at its deadline, or dropped
// expired at the head by Dequeue) and the tenant's queue is empty, the
// deficit is 0, so a new job of the same size waits the full 100 visits
// again instead of 50.
func TestNoCreditBankedByAnAbandonedLargeJob(t *testing.T) {
	for _, tc := range []struct {
		name  string
		leave func(q *Queue, big *Job) []*Job // returns what the queue reported expired
	}{
		{"cancelled", func(q *Queue, big *Job) []*Job {
			if !q.Cancel(big) {
				t.Fatal("the large job was not queued")
			}
			return nil
		}},
		{"swept", func(q *Queue, _ *Job) []*Job { return q.Sweep(at(time.Minute)) }},
		{"dropped by Dequeue", func(q *Queue, _ *Job) []*Job {
			j, exp := q.Dequeue(at(time.Minute), nil)
			if j == nil || j.Tenant != "S" {
				t.Fatalf("dispatched %v, want a job of S", j)
			}
			mustEnqueue(t, q, at(time.Minute), j)
			return exp
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := New(Config{Quantum: 1000})
			s := &backlog{tenant: "S", cost: 1000}
			s.fill(t, q, 3)
			big := jobAt("big", "L", 100_000, at(30*time.Second))
			mustEnqueue(t, q, now0, big)
			// S's first job, then 50 dispatches of S's each after a visit
			// of L (one quantum).
			for range 51 {
				j, _ := q.Dequeue(now0, nil)
				mustEnqueue(t, q, now0, j)
			}
			if d := q.Deficit("L"); d != 50_000 {
				t.Fatalf("L's deficit after 50 rounds %d, want 50000", d)
			}
			exp := tc.leave(q, big)
			if tc.name != "cancelled" && (len(exp) != 1 || exp[0] != big) {
				t.Fatalf("reported expired %v, want [big]", ids(exp))
			}
			if d := q.Deficit("L"); d != 0 || q.Len("L") != 0 {
				t.Fatalf("L's deficit %d with %d queued once its queue emptied, want 0 and 0", d, q.Len("L"))
			}
			again := job("again", "L", 100_000)
			mustEnqueue(t, q, at(time.Minute), again)
			for n := 1; ; n++ {
				j, exp := q.Dequeue(at(time.Minute), nil)
				if len(exp) > 0 {
					t.Fatalf("dispatch %d: %v expired again (expiry counted twice)", n, ids(exp))
				}
				if j == again {
					if n != 100 { // L's 100th visit; 50 with the credit banked
						t.Fatalf("the new large job went at dispatch %d, want 100 (no banked credit)", n)
					}
					break
				}
				if n > 100 {
					t.Fatal("the new large job did not go within 100 rounds")
				}
				mustEnqueue(t, q, at(time.Minute), j)
			}
		})
	}
}

// TestTenantJoiningMidBacklog: a tenant that starts queuing while others
// are backlogged joins at the end of the round with a deficit of 0, also
// when it joins in the middle of another tenant's visit, and then takes its
// equal share.
func TestTenantJoiningMidBacklog(t *testing.T) {
	q := New(Config{Quantum: 1000})
	fill(t, q, "A", 5, 250)
	fill(t, q, "B", 5, 1000)
	if j, _ := q.Dequeue(now0, nil); j.ID != "A-0" || q.Deficit("A") != 750 {
		t.Fatalf("first: %s, A's deficit %d; want A-0 and 750", j.ID, q.Deficit("A"))
	}
	fill(t, q, "C", 3, 500) // during A's visit
	if d := q.Deficit("C"); d != 0 {
		t.Fatalf("C's deficit on joining %d, want 0", d)
	}
	got := ids(drain(t, q, now0))[:10]
	want := []string{"A-1", "A-2", "A-3", "B-0", "C-0", "C-1", "A-4", "B-1", "C-2", "B-2"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("order after C joined (-want +got):\n%s", diff)
	}
}

// TestWeightChangeAndRemovalWhileQueued: a weight raised during the
// tenant's visit applies from its next quantum, not to the quantum it is
// spending; a removed TenantQuota (RemoveTenant) falls back to the default
// weight at the next quantum, keeps its queued jobs, and is forgotten once
// they are gone. Weights below 1 (the CRD's minimum is 1) mean the default.
func TestWeightChangeAndRemovalWhileQueued(t *testing.T) {
	q := New(Config{Quantum: 1000})
	fill(t, q, "A", 40, 500)
	fill(t, q, "B", 40, 500)
	if j, _ := q.Dequeue(now0, nil); j.Tenant != "A" {
		t.Fatalf("first: %s", j.ID)
	}
	q.SetTenant("A", 3, -1) // mid-visit: A still holds 500 of its weight-1 quantum
	var got []string
	for range 12 {
		j, _ := q.Dequeue(now0, nil)
		got = append(got, j.Tenant)
	}
	// A's second job of its first visit, B's two, then six of A's (3000), B's two.
	want := []string{"A", "B", "B", "A", "A", "A", "A", "A", "A", "B", "B", "A"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("order after the weight change (-want +got):\n%s", diff)
	}
	q.RemoveTenant("A") // A holds 2500 of its weight-3 quantum
	got = got[:0]
	for range 11 {
		j, _ := q.Dequeue(now0, nil)
		got = append(got, j.Tenant)
	}
	want = []string{"A", "A", "A", "A", "A", "B", "B", "A", "A", "B", "B"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("order after RemoveTenant (-want +got):\n%s", diff)
	}
	if q.Len("A") != 40-1-8-7 {
		t.Fatalf("A has %d queued, want %d (RemoveTenant drops no job)", q.Len("A"), 40-1-8-7)
	}
	drain(t, q, now0)
	for _, ts := range q.Tenants() {
		if ts.Tenant == "A" {
			t.Fatalf("removed tenant A still known once empty: %+v", ts)
		}
	}
	for _, w := range []int64{0, -5} {
		q.SetTenant("z", w, -1)
		if got := q.Tenants(); len(got) != 1 || got[0].Weight != 1 {
			t.Fatalf("weight %d: %+v, want the default weight 1", w, got)
		}
	}
}

// TestExtremeBoundsDoNotOverflow: at the CRD bounds (weight 10,000,
// quantumTokens 10^8, so 10^12 weighted tokens a visit) and a job of 2^62
// weighted tokens (the largest cost the cost model yields: 2^40 tokens at
// weight 2^20, twice), the fast-forward of rounds that only accumulate
// deficit credits each tenant exactly k-1 quanta (k the fewest rounds any
// eligible tenant needs) without overflowing, and the job goes on the exact
// visit it pays for.
func TestExtremeBoundsDoNotOverflow(t *testing.T) {
	const need = int64(1) << 62 // 4,611,686,018,427,387,904
	q := New(Config{Quantum: 100_000_000})
	q.SetTenant("W", 10_000, -1)
	q.SetTenant("Z", 1, -1)
	mustEnqueue(t, q, now0, job("W-huge", "W", need), job("W-next", "W", 1), job("Z-huge", "Z", need))
	calls := 0
	j, _ := q.Dequeue(now0, func(string, *Job) bool { calls++; return true })
	if j == nil || j.ID != "W-huge" || calls > 4 {
		t.Fatalf("dispatched %v after %d eligibility calls, want W-huge within 4", j, calls)
	}
	// W: 4,611,687 visits of 10^12; Z: one visit and 4,611,685 fast-forwarded.
	if d := q.Deficit("W"); d != 4_611_687*1_000_000_000_000-need {
		t.Errorf("W's deficit %d, want %d", d, 4_611_687*1_000_000_000_000-need)
	}
	if d := q.Deficit("Z"); d != 4_611_686*100_000_000 {
		t.Errorf("Z's deficit %d, want %d", d, 4_611_686*100_000_000)
	}
	if j, _ := q.Dequeue(now0, nil); j == nil || j.ID != "W-next" {
		t.Fatalf("next %v, want W-next (W's visit goes on)", j)
	}
	if j, _ := q.Dequeue(now0, nil); j == nil || j.ID != "Z-huge" {
		t.Fatalf("next %v, want Z-huge", j)
	}
	if q.Total() != 0 || q.Deficit("Z") != 0 || q.Deficit("W") != 0 {
		t.Errorf("after the drain: total %d, deficits W %d Z %d; want 0", q.Total(), q.Deficit("W"), q.Deficit("Z"))
	}
}

// TestDeadlinePassesWhileTenantSkipped (BC-35, BC-37): a tenant passed over
// as ineligible keeps its deficit; its head job's deadline passes meanwhile:
// the job is reported expired exactly once (by Dequeue or by Sweep,
// whichever comes first), is never dispatched, and costs the tenant nothing;
// the tenant's next job goes on its next eligible visit with the deficit it
// kept.
func TestDeadlinePassesWhileTenantSkipped(t *testing.T) {
	for _, bySweep := range []bool{false, true} {
		t.Run("sweep="+strconv.FormatBool(bySweep), func(t *testing.T) {
			q := New(Config{Quantum: 1000})
			mustEnqueue(t, q, now0, job("A-0", "A", 600), jobAt("A-late", "A", 600, at(5*time.Second)), job("A-2", "A", 600))
			fill(t, q, "B", 10, 1000)
			if j, _ := q.Dequeue(now0, nil); j.ID != "A-0" || q.Deficit("A") != 400 {
				t.Fatalf("first %s, A's deficit %d; want A-0, 400", j.ID, q.Deficit("A"))
			}
			skipA := func(tn string, _ *Job) bool { return tn != "A" }
			for i := range 3 {
				if j, exp := q.Dequeue(at(time.Duration(2*i)*time.Second), skipA); j == nil || j.Tenant != "B" || len(exp) != 0 {
					t.Fatalf("while A is skipped: %v, %d expired", j, len(exp))
				}
			}
			now := at(6 * time.Second)
			var expired []*Job
			if bySweep {
				expired = q.Sweep(now)
			}
			j, exp := q.Dequeue(now, skipA)
			expired = append(expired, exp...)
			if j == nil || j.Tenant != "B" {
				t.Fatalf("with A still skipped: %v", j)
			}
			if diff := cmp.Diff([]string{"A-late"}, ids(expired)); diff != "" {
				t.Fatalf("expired (-want +got):\n%s", diff)
			}
			if s := q.Sweep(now); len(s) != 0 {
				t.Fatalf("swept %v again", ids(s))
			}
			if d := q.Deficit("A"); d != 400 {
				t.Fatalf("A's deficit %d, want 400 (the expired job charged nothing)", d)
			}
			// A's turn: 400 + 1000 covers A-2 (600) with 800 left.
			for {
				j, exp := q.Dequeue(now, nil)
				if len(exp) != 0 {
					t.Fatalf("expired again: %v", ids(exp))
				}
				if j.Tenant == "A" {
					if j.ID != "A-2" || q.Deficit("A") != 0 {
						t.Fatalf("A dispatched %s, deficit %d; want A-2 and 0 (emptied)", j.ID, q.Deficit("A"))
					}
					break
				}
			}
		})
	}
}

// TestBoundExactAndRequeueOverBound: the tenant bound is exact at the
// boundary (maxQueued jobs are accepted, the next is ErrTenantFull), and
// Requeue of jobs already dispatched is not refused by it: a tenant at its
// bound with k jobs out may have maxQueued+k queued after they are put back
// (a 429 from the provider), and new jobs are refused until it is below the
// bound again.
func TestBoundExactAndRequeueOverBound(t *testing.T) {
	q := New(Config{Quantum: 1000})
	q.SetTenant("A", 1, 3)
	fill(t, q, "A", 3, 100)
	out := []*Job{}
	for range 2 {
		j, _ := q.Dequeue(now0, nil)
		out = append(out, j)
	}
	mustEnqueue(t, q, now0, job("A-3", "A", 100), job("A-4", "A", 100))
	if err := q.Enqueue(now0, job("A-5", "A", 100)); !errors.Is(err, ErrTenantFull) {
		t.Fatalf("4th queued job: %v, want ErrTenantFull", err)
	}
	for _, j := range out {
		q.Requeue(j)
	}
	if q.Len("A") != 5 {
		t.Fatalf("after the requeue: %d queued, want 5 (3 + the 2 put back)", q.Len("A"))
	}
	for range 2 {
		if err := q.Enqueue(now0, job("A-x", "A", 100)); !errors.Is(err, ErrTenantFull) {
			t.Fatalf("over the bound: %v, want ErrTenantFull", err)
		}
		q.Dequeue(now0, nil)
	}
	if q.Len("A") != 3 {
		t.Fatalf("%d queued, want 3", q.Len("A"))
	}
	if err := q.Enqueue(now0, job("A-x", "A", 100)); !errors.Is(err, ErrTenantFull) {
		t.Fatalf("at the bound: %v, want ErrTenantFull", err)
	}
	q.Dequeue(now0, nil)
	mustEnqueue(t, q, now0, job("A-y", "A", 100))
}
