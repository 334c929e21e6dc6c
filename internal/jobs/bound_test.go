package jobs

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
)

// finishJob submits a job of tenant and finishes it (succeeded) at the
// clock's now, then steps the clock by a second; it returns the job's id.
func finishJob(t *testing.T, s Store, fc *clocktesting.FakeClock, tenant string) string {
	t.Helper()
	j, err := s.Create(Job{Tenant: tenant, Status: StatusQueued, CreatedAt: fc.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Update(j.ID, func(j *Job) error { j.Status, j.FinishedAt = StatusSucceeded, fc.Now(); return nil }); err != nil {
		t.Fatal(err)
	}
	fc.Step(time.Second)
	return j.ID
}

// kept returns the ids each tenant lists, in submission order (tenants
// listing none are left out).
func kept(t *testing.T, s Store, tenants ...string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, tn := range tenants {
		list, _, err := s.List(tn, Filter{})
		if err != nil {
			t.Fatal(err)
		}
		if len(list) > 0 {
			out[tn] = ids(list)
		}
	}
	return out
}

// TestStoreBoundPrunesTheFullestTenant: over the bound of finished jobs,
// the oldest finished job of the tenant holding the most goes, so a tenant
// holding few keeps all of its results. The bound used to prune the oldest
// finished job of the pool, so a tenant finishing a large import pushed
// out every other tenant's results before their retention.
func TestStoreBoundPrunesTheFullestTenant(t *testing.T) {
	forEachStore(t, func(t *testing.T, open func(clock.PassiveClock, time.Duration, int) (testStore, func() testStore)) {
		t.Run("A then B", func(t *testing.T) {
			fc := clocktesting.NewFakeClock(t0)
			s, reopen := open(fc, 0, 10)
			var a, b []string
			for range 10 {
				a = append(a, finishJob(t, s, fc, "a"))
			}
			for range 2 {
				b = append(b, finishJob(t, s, fc, "b"))
			}
			want := map[string][]string{"a": a[2:], "b": b}
			if d := gocmp.Diff(want, kept(t, s, "a", "b")); d != "" {
				t.Errorf("kept (-want +got):\n%s", d)
			}
			s = reopen()
			if d := gocmp.Diff(want, kept(t, s, "a", "b")); d != "" {
				t.Errorf("kept after a reopen (-want +got):\n%s", d)
			}
			if d := gocmp.Diff(map[Status]int{StatusSucceeded: 10}, s.Counts()); d != "" {
				t.Errorf("counts (-want +got):\n%s", d)
			}
		})
		t.Run("B then A", func(t *testing.T) {
			// B's results are the oldest of the pool: they stay all the same.
			fc := clocktesting.NewFakeClock(t0)
			s, reopen := open(fc, 0, 10)
			var a, b []string
			for range 2 {
				b = append(b, finishJob(t, s, fc, "b"))
			}
			for range 10 {
				a = append(a, finishJob(t, s, fc, "a"))
			}
			want := map[string][]string{"a": a[2:], "b": b}
			if d := gocmp.Diff(want, kept(t, s, "a", "b")); d != "" {
				t.Errorf("kept (-want +got):\n%s", d)
			}
			for _, id := range b {
				if _, err := s.Get(id); err != nil {
					t.Errorf("Get of B's job %s: %v", id, err)
				}
			}
			for _, id := range a[:2] {
				if _, err := s.Get(id); !errors.Is(err, ErrNotFound) {
					t.Errorf("Get of A's pruned job %s: %v, want ErrNotFound", id, err)
				}
			}
			s = reopen()
			if d := gocmp.Diff(want, kept(t, s, "a", "b")); d != "" {
				t.Errorf("kept after a reopen (-want +got):\n%s", d)
			}
		})
	})
}

// TestStoreBoundTies: among the tenants holding the most finished jobs, the
// one whose oldest finished job finished first loses it; each step is
// checked against the exact set of jobs kept.
func TestStoreBoundTies(t *testing.T) {
	forEachStore(t, func(t *testing.T, open func(clock.PassiveClock, time.Duration, int) (testStore, func() testStore)) {
		fc := clocktesting.NewFakeClock(t0)
		s, _ := open(fc, 0, 4)
		a1 := finishJob(t, s, fc, "a")
		b1 := finishJob(t, s, fc, "b")
		a2 := finishJob(t, s, fc, "a")
		b2 := finishJob(t, s, fc, "b")
		// a and b hold 2 each; a's oldest finished first.
		c1 := finishJob(t, s, fc, "c")
		if d := gocmp.Diff(map[string][]string{"a": {a2}, "b": {b1, b2}, "c": {c1}}, kept(t, s, "a", "b", "c")); d != "" {
			t.Errorf("after c's first (-want +got):\n%s", d)
		}
		_ = a1
		// b and c hold 2 each; b's oldest (b1) finished before c's (c1).
		c2 := finishJob(t, s, fc, "c")
		if d := gocmp.Diff(map[string][]string{"a": {a2}, "b": {b2}, "c": {c1, c2}}, kept(t, s, "a", "b", "c")); d != "" {
			t.Errorf("after c's second (-want +got):\n%s", d)
		}
		// c holds the most (2): it loses c1, although a2 and b2 are older.
		d1 := finishJob(t, s, fc, "d")
		if d := gocmp.Diff(map[string][]string{"a": {a2}, "b": {b2}, "c": {c2}, "d": {d1}}, kept(t, s, "a", "b", "c", "d")); d != "" {
			t.Errorf("after d's first (-want +got):\n%s", d)
		}
		// Four tenants of one job each: the pool's oldest goes (a2).
		e1 := finishJob(t, s, fc, "e")
		if d := gocmp.Diff(map[string][]string{"b": {b2}, "c": {c2}, "d": {d1}, "e": {e1}}, kept(t, s, "a", "b", "c", "d", "e")); d != "" {
			t.Errorf("after e's first (-want +got):\n%s", d)
		}
	})
}

// TestStoreBoundInterleaved: finishes of three and four tenants
// interleaved, with the exact jobs kept after each.
func TestStoreBoundInterleaved(t *testing.T) {
	forEachStore(t, func(t *testing.T, open func(clock.PassiveClock, time.Duration, int) (testStore, func() testStore)) {
		fc := clocktesting.NewFakeClock(t0)
		s, reopen := open(fc, 0, 6)
		got := map[string]string{} // name (a1, b2, ...) -> id
		steps := []struct {
			tenant string
			want   []string // names kept after the step, by tenant then finish
		}{
			{"b", []string{"b1"}},
			{"c", []string{"b1", "c1"}},
			{"a", []string{"a1", "b1", "c1"}},
			{"a", []string{"a1", "a2", "b1", "c1"}},
			{"a", []string{"a1", "a2", "a3", "b1", "c1"}},
			{"a", []string{"a1", "a2", "a3", "a4", "b1", "c1"}},
			{"b", []string{"a2", "a3", "a4", "b1", "b2", "c1"}}, // a holds 4
			{"a", []string{"a3", "a4", "a5", "b1", "b2", "c1"}}, // a holds 4
			{"c", []string{"a4", "a5", "b1", "b2", "c1", "c2"}}, // a holds 3
			{"d", []string{"a4", "a5", "b2", "c1", "c2", "d1"}}, // 2 each: b1 finished first
			{"b", []string{"a4", "a5", "b2", "b3", "c2", "d1"}}, // 2 each: c1 finished first
			{"d", []string{"a5", "b2", "b3", "c2", "d1", "d2"}}, // 2 each: a4 finished first
			{"d", []string{"a5", "b2", "b3", "c2", "d2", "d3"}}, // d holds 3
		}
		n := map[string]int{}
		for i, st := range steps {
			n[st.tenant]++
			got[fmt.Sprintf("%s%d", st.tenant, n[st.tenant])] = finishJob(t, s, fc, st.tenant)
			want := map[string][]string{}
			for _, name := range st.want {
				want[name[:1]] = append(want[name[:1]], got[name])
			}
			if i == 8 {
				s = reopen()
			}
			if d := gocmp.Diff(want, kept(t, s, "a", "b", "c", "d")); d != "" {
				t.Errorf("step %d (%s's job %d), want %v (-want +got):\n%s", i+1, st.tenant, n[st.tenant], st.want, d)
			}
		}
	})
}

// TestBoltStoreBoundAtOpen: a file written under a large bound and opened
// under a smaller one is pruned at open by the same rule: the oldest
// finished jobs (by FinishedAt) of the tenant holding the most go, and are
// deleted from the file.
func TestBoltStoreBoundAtOpen(t *testing.T) {
	fc := clocktesting.NewFakeClock(t0)
	path := filepath.Join(t.TempDir(), "jobs.db")
	openBolt := func(maxFinished int) *BoltStore {
		s, err := OpenBolt(path, fc, 0, maxFinished, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := openBolt(100)
	finishAt := func(tenant string, at time.Time) string {
		j, err := s.Create(Job{Tenant: tenant, Status: StatusSucceeded, FinishedAt: at})
		if err != nil {
			t.Fatal(err)
		}
		return j.ID
	}
	b1 := finishAt("b", t0.Add(-20*time.Minute))
	c1 := finishAt("c", t0.Add(-19*time.Minute))
	b2 := finishAt("b", t0.Add(-18*time.Minute))
	// a's 8 jobs are submitted in the reverse of their finish order: a8
	// finished first; a queued job of a's is never pruned.
	var a []string // a[0] finished last
	for i := range 8 {
		a = append(a, finishAt("a", t0.Add(-time.Duration(i+1)*time.Minute)))
	}
	queued, err := s.Create(Job{Tenant: "a", Status: StatusQueued})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// 11 finished jobs under a bound of 6: a's 5 first finished go (a[7]
	// to a[3], submitted last), b's and c's stay.
	s = openBolt(6)
	want := map[string][]string{"a": {a[0], a[1], a[2], queued.ID}, "b": {b1, b2}, "c": {c1}}
	if d := gocmp.Diff(want, kept(t, s, "a", "b", "c")); d != "" {
		t.Errorf("kept at open (-want +got):\n%s", d)
	}
	if d := gocmp.Diff(map[Status]int{StatusSucceeded: 6, StatusQueued: 1}, s.Counts()); d != "" {
		t.Errorf("counts (-want +got):\n%s", d)
	}
	// The order loaded goes on: a's next finish prunes a's oldest (a[2]).
	a9 := finishAt("a", t0)
	want["a"] = []string{a[0], a[1], queued.ID, a9}
	if d := gocmp.Diff(want, kept(t, s, "a", "b", "c")); d != "" {
		t.Errorf("kept after a's next finish (-want +got):\n%s", d)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// The pruned jobs were deleted from the file.
	s = openBolt(100)
	defer s.Close()
	if d := gocmp.Diff(want, kept(t, s, "a", "b", "c")); d != "" {
		t.Errorf("kept after a reopen under a large bound (-want +got):\n%s", d)
	}
	checkIndex(t, s.MemStore)
}

// TestStoreRetentionIgnoresTenants: past its retention a finished job goes,
// oldest finished first, whichever tenant holds it and however few; the
// bound's rule applies only within the retention.
func TestStoreRetentionIgnoresTenants(t *testing.T) {
	forEachStore(t, func(t *testing.T, open func(clock.PassiveClock, time.Duration, int) (testStore, func() testStore)) {
		fc := clocktesting.NewFakeClock(t0)
		s, reopen := open(fc, time.Hour, 3)
		fin := func(tenant string, at time.Duration) string {
			fc.SetTime(t0.Add(at))
			j, err := s.Create(Job{Tenant: tenant, Status: StatusFailed, FinishedAt: fc.Now()})
			if err != nil {
				t.Fatal(err)
			}
			return j.ID
		}
		a1 := fin("a", 0)
		b1 := fin("b", 30*time.Second)
		a2 := fin("a", time.Minute)
		a3 := fin("a", 2*time.Minute) // a holds 3 of 4: a1 goes
		if d := gocmp.Diff(map[string][]string{"a": {a2, a3}, "b": {b1}}, kept(t, s, "a", "b")); d != "" {
			t.Errorf("at the bound (-want +got):\n%s", d)
		}
		_ = a1
		// b1, b's only job, is the first past its retention.
		fc.SetTime(t0.Add(time.Hour + 30*time.Second))
		if d := gocmp.Diff(map[string][]string{"a": {a2, a3}}, kept(t, s, "a", "b")); d != "" {
			t.Errorf("past b1's retention (-want +got):\n%s", d)
		}
		fc.SetTime(t0.Add(time.Hour + time.Minute))
		s = reopen()
		if d := gocmp.Diff(map[string][]string{"a": {a3}}, kept(t, s, "a", "b")); d != "" {
			t.Errorf("past a2's retention (-want +got):\n%s", d)
		}
		if d := gocmp.Diff(map[Status]int{StatusFailed: 1}, s.Counts()); d != "" {
			t.Errorf("counts (-want +got):\n%s", d)
		}
	})
}

// checkIndex checks the finish-order index of s against its jobs: the
// pool's finished list holds every finished job, each tenant's list holds
// its finished jobs in finish order, the heap orders the tenants holding
// finished jobs, and no tenant holding no job is indexed.
func checkIndex(t *testing.T, s *MemStore) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	nFin := 0
	for _, e := range s.byID {
		if e.job.Status.Finished() != (e.finished != nil) {
			t.Fatalf("job %s %s: in the finished list %v", e.job.ID, e.job.Status, e.finished != nil)
		}
		if e.finished != nil {
			nFin++
		}
	}
	if nFin != s.finished.Len() {
		t.Fatalf("%d finished jobs, %d in the finished list", nFin, s.finished.Len())
	}
	sum, inHeap := 0, 0
	for name, tj := range s.byTenant {
		if tj.gone == len(tj.items) {
			t.Fatalf("tenant %s holds no job and is indexed", name)
		}
		n := 0
		var prev *entry
		for e := tj.finHead; e != nil; prev, e = e, e.finNext {
			if e.finPrev != prev || e.job.Tenant != name || e.finished == nil || (prev != nil && prev.finSeq >= e.finSeq) {
				t.Fatalf("tenant %s: finished list broken at %s", name, e.job.ID)
			}
			n++
		}
		if n != tj.nFinished || tj.finTail != prev {
			t.Fatalf("tenant %s: %d finished linked, nFinished %d", name, n, tj.nFinished)
		}
		sum += n
		if (n > 0) != (tj.heapIdx >= 0) || (tj.heapIdx >= 0 && s.fullest[tj.heapIdx] != tj) {
			t.Fatalf("tenant %s: heap index %d with %d finished", name, tj.heapIdx, n)
		}
		if tj.heapIdx >= 0 {
			inHeap++
		}
	}
	if sum != nFin || inHeap != len(s.fullest) {
		t.Fatalf("tenants' finished %d of %d; %d tenants in the heap of %d", sum, nFin, inHeap, len(s.fullest))
	}
	for i := 1; i < len(s.fullest); i++ {
		if s.fullest.Less(i, (i-1)/2) {
			t.Fatalf("heap out of order at %d", i)
		}
	}
}

// refJob is a job of the reference model of TestStoreBoundAgainstModel.
type refJob struct {
	id, tenant string
	seq        int // submission order
	status     Status
	finishedAt time.Time
	finOrder   int // finish order; 0 when not finished
}

// refStore is the reference model of the pruning rules, by scans: the
// finished jobs past retention go oldest finished first, then, over the
// bound, the oldest finished job of the tenant holding the most (ties: the
// tenant whose oldest finished first).
type refStore struct {
	retention   time.Duration
	maxFinished int
	jobs        []*refJob // kept, in submission order
	finOrder    int
}

func (r *refStore) finished() []*refJob {
	var out []*refJob
	for _, j := range r.jobs {
		if j.finOrder > 0 {
			out = append(out, j)
		}
	}
	slices.SortFunc(out, func(a, b *refJob) int { return cmp.Compare(a.finOrder, b.finOrder) })
	return out
}

func (r *refStore) remove(j *refJob) {
	r.jobs = slices.DeleteFunc(r.jobs, func(x *refJob) bool { return x == j })
}

func (r *refStore) prune(now time.Time) {
	for {
		fin := r.finished()
		if len(fin) == 0 {
			return
		}
		if now.Sub(fin[0].finishedAt) >= r.retention {
			r.remove(fin[0])
			continue
		}
		if len(fin) <= r.maxFinished {
			return
		}
		count := map[string]int{}
		oldest := map[string]*refJob{}
		for _, j := range fin {
			count[j.tenant]++
			if oldest[j.tenant] == nil {
				oldest[j.tenant] = j
			}
		}
		var victim *refJob
		for tn, o := range oldest {
			if victim == nil || count[tn] > count[victim.tenant] || (count[tn] == count[victim.tenant] && o.finOrder < victim.finOrder) {
				victim = o
			}
		}
		r.remove(victim)
	}
}

func (r *refStore) finish(j *refJob, now time.Time) {
	r.finOrder++
	j.status, j.finishedAt, j.finOrder = StatusSucceeded, now, r.finOrder
}

// reload orders the finish order as an open does: by FinishedAt, ties in
// submission order.
func (r *refStore) reload() {
	fin := r.finished()
	slices.SortStableFunc(fin, func(a, b *refJob) int {
		if c := a.finishedAt.Compare(b.finishedAt); c != 0 {
			return c
		}
		return cmp.Compare(a.seq, b.seq)
	})
	for i, j := range fin {
		j.finOrder = i + 1
	}
	r.finOrder = len(fin)
}

// TestStoreBoundAgainstModel runs random submissions, finishes, requeues,
// updates, deletes and clock steps of several tenants (one of them
// submitting most jobs) and checks after each the exact jobs kept against
// a reference model that scans every job and tenant.
func TestStoreBoundAgainstModel(t *testing.T) {
	forEachStore(t, func(t *testing.T, open func(clock.PassiveClock, time.Duration, int) (testStore, func() testStore)) {
		ops := 4000
		if t.Name() == "TestStoreBoundAgainstModel/BoltStore" {
			ops = 600 // one fsync'ed write each
		}
		for _, seed := range []uint64{1, 2, 3} {
			t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 0))
				fc := clocktesting.NewFakeClock(t0)
				const retention, maxFinished = 200 * time.Second, 12
				s, reopen := open(fc, retention, maxFinished)
				ref := &refStore{retention: retention, maxFinished: maxFinished}
				tenants := []string{"big", "a", "b", "c", "d"}
				seq := 0
				pick := func(ok func(*refJob) bool) *refJob {
					var c []*refJob
					for _, j := range ref.jobs {
						if ok(j) {
							c = append(c, j)
						}
					}
					if len(c) == 0 {
						return nil
					}
					return c[rng.IntN(len(c))]
				}
				for op := range ops {
					now := fc.Now()
					var what string
					switch r := rng.IntN(100); {
					case r < 40: // submit, "big" most often; some already finished
						tn := tenants[0]
						if rng.IntN(2) == 0 {
							tn = tenants[rng.IntN(len(tenants))]
						}
						seq++
						rj := &refJob{tenant: tn, seq: seq, status: StatusQueued}
						j := Job{Tenant: tn, Status: StatusQueued}
						if rng.IntN(4) == 0 {
							j.Status, j.FinishedAt = StatusCancelled, now
						}
						got, err := s.Create(j)
						if err != nil {
							t.Fatal(err)
						}
						rj.id = got.ID
						ref.jobs = append(ref.jobs, rj)
						if j.Status.Finished() {
							ref.finish(rj, now)
							rj.status = StatusCancelled
						}
						what = "create " + tn
					case r < 70: // finish a queued job
						rj := pick(func(j *refJob) bool { return j.finOrder == 0 })
						if rj == nil {
							continue
						}
						if _, err := s.Update(rj.id, func(j *Job) error { j.Status, j.FinishedAt = StatusSucceeded, now; return nil }); err != nil {
							t.Fatal(err)
						}
						ref.finish(rj, now)
						what = "finish " + rj.tenant
					case r < 74: // a finished job queued again
						rj := pick(func(j *refJob) bool { return j.finOrder > 0 })
						if rj == nil {
							continue
						}
						if _, err := s.Update(rj.id, func(j *Job) error { j.Status, j.FinishedAt = StatusQueued, time.Time{}; return nil }); err != nil {
							t.Fatal(err)
						}
						rj.status, rj.finOrder, rj.finishedAt = StatusQueued, 0, time.Time{}
						what = "requeue " + rj.tenant
					case r < 80: // an update that keeps the status
						rj := pick(func(*refJob) bool { return true })
						if rj == nil {
							continue
						}
						if _, err := s.Update(rj.id, func(j *Job) error { j.WebhookAttempts++; return nil }); err != nil {
							t.Fatal(err)
						}
						what = "touch " + rj.tenant
					case r < 85:
						rj := pick(func(*refJob) bool { return true })
						if rj == nil {
							continue
						}
						if err := s.Delete(rj.id); err != nil {
							t.Fatal(err)
						}
						ref.remove(rj)
						what = "delete " + rj.tenant
					case r < 98:
						fc.Step(time.Duration(rng.IntN(20)) * time.Second)
						what = "step"
					default:
						s = reopen()
						if _, ok := s.(*BoltStore); ok {
							ref.reload()
						}
						what = "reopen"
					}
					ref.prune(fc.Now())
					want := map[string][]string{}
					counts := map[Status]int{}
					for _, j := range ref.jobs {
						want[j.tenant] = append(want[j.tenant], j.id)
						counts[j.status]++
					}
					if d := gocmp.Diff(want, kept(t, s, tenants...)); d != "" {
						t.Fatalf("op %d (%s) (-want +got):\n%s", op, what, d)
					}
					if d := gocmp.Diff(counts, s.Counts()); d != "" {
						t.Fatalf("op %d (%s): counts (-want +got):\n%s", op, what, d)
					}
				}
				switch s := s.(type) {
				case *MemStore:
					checkIndex(t, s)
				case *BoltStore:
					checkIndex(t, s.MemStore)
				}
			})
		}
	})
}

// TestStoreBoundReleasesTenants: a tenant whose jobs are all pruned or
// deleted takes no room in the store's index any more, and the heap of
// tenants shrinks once most of them are gone.
func TestStoreBoundReleasesTenants(t *testing.T) {
	fc := clocktesting.NewFakeClock(t0)
	s := NewMemStore(fc, time.Hour, 3)
	for i := range 10 {
		finishJob(t, s, fc, fmt.Sprint("t", i))
	}
	j, _ := s.Create(Job{Tenant: "q", Status: StatusQueued})
	checkIndex(t, s)
	s.mu.Lock()
	nt, nh := len(s.byTenant), len(s.fullest)
	s.mu.Unlock()
	if nt != 4 || nh != 3 {
		t.Errorf("%d tenants indexed, %d in the heap; want 4 (t7, t8, t9, q) and 3", nt, nh)
	}
	if err := s.Delete(j.ID); err != nil {
		t.Fatal(err)
	}
	fc.Step(time.Hour)
	s.Prune(fc.Now())
	checkIndex(t, s)
	s.mu.Lock()
	nt, nh = len(s.byTenant), len(s.fullest)
	s.mu.Unlock()
	if nt != 0 || nh != 0 {
		t.Errorf("%d tenants indexed, %d in the heap; want none", nt, nh)
	}
	s = NewMemStore(fc, time.Hour, 0)
	for i := range 1000 {
		if _, err := s.Create(Job{Tenant: fmt.Sprint("u", i), Status: StatusSucceeded, FinishedAt: fc.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	s.mu.Lock()
	hc := cap(s.fullest)
	s.mu.Unlock()
	if hc < 1000 {
		t.Fatalf("heap capacity %d with 1,000 tenants", hc)
	}
	fc.Step(time.Hour)
	s.Prune(fc.Now())
	checkIndex(t, s)
	s.mu.Lock()
	nt, hc = len(s.byTenant), cap(s.fullest)
	s.mu.Unlock()
	if nt != 0 || hc > 128 {
		t.Errorf("after 1,000 tenants pruned: %d tenants indexed, heap capacity %d; want none and at most 128", nt, hc)
	}
}
