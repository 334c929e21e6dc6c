package jobs

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func ids(list []Job) []string {
	out := []string{}
	for _, j := range list {
		out = append(out, j.ID)
	}
	return out
}

// testStore is a Store under the conformance suite: Prune and Pending as
// MemStore's, and reopen, which for a durable store closes it and opens
// the same file again (for MemStore it prunes and returns the same store).
type testStore interface {
	Store
	PendingLister
	Prune(now time.Time)
}

// storeKinds are the implementations the conformance suite runs against.
var storeKinds = []struct {
	name string
	open func(t *testing.T, clk clock.PassiveClock, retention time.Duration, maxFinished int) (s testStore, reopen func() testStore)
}{
	{"MemStore", func(t *testing.T, clk clock.PassiveClock, retention time.Duration, maxFinished int) (testStore, func() testStore) {
		s := NewMemStore(clk, retention, maxFinished)
		// A durable store prunes at load; the in-memory one at its next prune.
		return s, func() testStore { s.Prune(clk.Now()); return s }
	}},
	{"BoltStore", func(t *testing.T, clk clock.PassiveClock, retention time.Duration, maxFinished int) (testStore, func() testStore) {
		path := filepath.Join(t.TempDir(), "jobs.db")
		open := func() *BoltStore {
			s, err := OpenBolt(path, clk, retention, maxFinished, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
		cur := open()
		t.Cleanup(func() { _ = cur.Close() })
		return cur, func() testStore {
			if err := cur.Close(); err != nil {
				t.Fatal(err)
			}
			cur = open()
			return cur
		}
	}},
}

// forEachStore runs test against every store kind.
func forEachStore(t *testing.T, test func(t *testing.T, open func(clk clock.PassiveClock, retention time.Duration, maxFinished int) (testStore, func() testStore))) {
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) {
			test(t, func(clk clock.PassiveClock, retention time.Duration, maxFinished int) (testStore, func() testStore) {
				return k.open(t, clk, retention, maxFinished)
			})
		})
	}
}

func TestStoreListPagesByTenantAndStatus(t *testing.T) {
	forEachStore(t, func(t *testing.T, open func(clock.PassiveClock, time.Duration, int) (testStore, func() testStore)) {
		s, reopen := open(clocktesting.NewFakeClock(t0), 0, 0)
		var a, all []string // a's ids; every id in submission order
		for i := range 5 {
			j, err := s.Create(Job{Tenant: "a", Status: StatusQueued, CreatedAt: t0})
			if err != nil {
				t.Fatal(err)
			}
			a = append(a, j.ID)
			jb, err := s.Create(Job{Tenant: "b", Status: StatusQueued})
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, j.ID, jb.ID)
			if i%2 == 1 {
				if _, err := s.Update(j.ID, func(j *Job) error { j.Status = StatusSucceeded; j.FinishedAt = t0; return nil }); err != nil {
					t.Fatal(err)
				}
			}
		}
		s = reopen()
		page, more, err := s.List("a", Filter{Limit: 2})
		if err != nil || !more {
			t.Fatalf("page 1: more %v, %v", more, err)
		}
		if d := cmp.Diff(a[:2], ids(page)); d != "" {
			t.Errorf("page 1 (-want +got):\n%s", d)
		}
		page, more, _ = s.List("a", Filter{Limit: 2, After: page[1].ID})
		if d := cmp.Diff(a[2:4], ids(page)); d != "" || !more {
			t.Errorf("page 2 (-want +got):\n%s", d)
		}
		page, more, _ = s.List("a", Filter{Limit: 2, After: page[1].ID})
		if d := cmp.Diff(a[4:], ids(page)); d != "" || more {
			t.Errorf("page 3 (-want +got):\n%s more %v", d, more)
		}
		done, _, _ := s.List("a", Filter{Status: StatusSucceeded})
		if d := cmp.Diff([]string{a[1], a[3]}, ids(done)); d != "" {
			t.Errorf("succeeded (-want +got):\n%s", d)
		}
		if _, _, err := s.List("a", Filter{After: "bogus"}); !errors.Is(err, ErrInvalidCursor) {
			t.Errorf("bogus cursor: %v", err)
		}
		if d := cmp.Diff(map[Status]int{StatusQueued: 8, StatusSucceeded: 2}, s.Counts()); d != "" {
			t.Errorf("counts (-want +got):\n%s", d)
		}
		if err := s.Delete(a[0]); err != nil {
			t.Fatal(err)
		}
		s = reopen()
		if _, err := s.Get(a[0]); !errors.Is(err, ErrNotFound) {
			t.Errorf("deleted job: %v", err)
		}
		// A cursor that no longer exists still pages.
		page, _, _ = s.List("a", Filter{After: a[0]})
		if d := cmp.Diff(a[1:], ids(page)); d != "" {
			t.Errorf("after a deleted id (-want +got):\n%s", d)
		}
		// Pending: queued and running jobs of all tenants in submission order.
		var wantPend []string
		for _, id := range all {
			if id != a[0] && id != a[1] && id != a[3] { // deleted, succeeded, succeeded
				wantPend = append(wantPend, id)
			}
		}
		if d := cmp.Diff(wantPend, ids(s.Pending())); d != "" {
			t.Errorf("pending (-want +got):\n%s", d)
		}
		// The sequence goes on after a reopen: a new job lists after all
		// others, and pages after the last one before it.
		j, err := s.Create(Job{Tenant: "a", Status: StatusQueued})
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(append(a[1:len(a):len(a)], j.ID), ids(must(s.List("a", Filter{})))); d != "" {
			t.Errorf("after a new job (-want +got):\n%s", d)
		}
		if d := cmp.Diff([]string{j.ID}, ids(must(s.List("a", Filter{After: a[4]})))); d != "" {
			t.Errorf("after the last job before the reopen (-want +got):\n%s", d)
		}
	})
}

func TestStoreRetention(t *testing.T) {
	forEachStore(t, func(t *testing.T, open func(clock.PassiveClock, time.Duration, int) (testStore, func() testStore)) {
		fc := clocktesting.NewFakeClock(t0)
		s, reopen := open(fc, time.Hour, 2)
		var fin []string
		for range 3 {
			j, _ := s.Create(Job{Tenant: "a", Status: StatusQueued})
			_, _ = s.Update(j.ID, func(j *Job) error { j.Status, j.FinishedAt = StatusFailed, fc.Now(); return nil })
			fin = append(fin, j.ID)
			fc.Step(time.Minute)
		}
		queued, _ := s.Create(Job{Tenant: "a", Status: StatusQueued})
		s = reopen()
		if _, err := s.Get(fin[0]); !errors.Is(err, ErrNotFound) {
			t.Errorf("oldest finished job kept beyond the bound of 2: %v", err)
		}
		if d := cmp.Diff(map[Status]int{StatusQueued: 1, StatusFailed: 2}, s.Counts()); d != "" {
			t.Errorf("counts (-want +got):\n%s", d)
		}
		// fin[1] finished at t0+1m: gone at t0+1h+1m; fin[2] at t0+2m stays.
		fc.SetTime(t0.Add(time.Hour + time.Minute))
		s.Prune(fc.Now())
		s = reopen()
		if _, err := s.Get(fin[1]); !errors.Is(err, ErrNotFound) {
			t.Errorf("finished job %s kept beyond the retention: %v", fin[1], err)
		}
		if _, err := s.Get(fin[2]); err != nil {
			t.Errorf("finished job %s pruned before the retention: %v", fin[2], err)
		}
		// Pruned while closed: reopening after the retention prunes at load.
		fc.Step(time.Hour)
		s = reopen()
		if _, err := s.Get(fin[2]); !errors.Is(err, ErrNotFound) {
			t.Errorf("finished job %s kept beyond the retention after a reopen: %v", fin[2], err)
		}
		if _, err := s.Get(queued.ID); err != nil {
			t.Errorf("queued job pruned: %v", err)
		}
		if d := cmp.Diff(map[Status]int{StatusQueued: 1}, s.Counts()); d != "" {
			t.Errorf("counts (-want +got):\n%s", d)
		}
	})
}

func TestStoreUpdate(t *testing.T) {
	forEachStore(t, func(t *testing.T, open func(clock.PassiveClock, time.Duration, int) (testStore, func() testStore)) {
		s, reopen := open(clocktesting.NewFakeClock(t0), 0, 0)
		j, _ := s.Create(Job{Tenant: "a", Status: StatusQueued})
		boom := errors.New("boom")
		if got, err := s.Update(j.ID, func(j *Job) error { j.Status = StatusRunning; return boom }); !errors.Is(err, boom) || got.Status != StatusQueued {
			t.Errorf("aborted update: %v, status %s", err, got.Status)
		}
		got, err := s.Update(j.ID, func(x *Job) error { x.ID, x.Tenant, x.Status, x.Attempts = "job_x", "b", StatusRunning, 1; return nil })
		if err != nil || got.ID != j.ID || got.Tenant != "a" || got.Status != StatusRunning {
			t.Errorf("update: %+v, %v", got, err)
		}
		s = reopen()
		if got, _ := s.Get(j.ID); got.Status != StatusRunning || got.Attempts != 1 || got.Tenant != "a" {
			t.Errorf("after reopen: %+v", got)
		}
		if _, err := s.Update("job_0000000000000099deadbeef", func(*Job) error { return nil }); !errors.Is(err, ErrNotFound) {
			t.Errorf("update of an unknown id: %v", err)
		}
		if err := s.Delete("job_0000000000000099deadbeef"); !errors.Is(err, ErrNotFound) {
			t.Errorf("delete of an unknown id: %v", err)
		}
		if d := cmp.Diff(map[Status]int{StatusRunning: 1}, s.Counts()); d != "" {
			t.Errorf("counts (-want +got):\n%s", d)
		}
	})
}

// must returns the jobs of a List that must succeed.
func must(jobs []Job, _ bool, err error) []Job {
	if err != nil {
		panic(err)
	}
	return jobs
}

// Job ids do not show the pool-wide sequence: a tenant that submits two
// jobs cannot tell from their ids how many jobs other tenants submitted
// in between (ids were "job_" + the sequence in hex + 8 random digits, so
// consecutive ids differed by the count). They still page (Filter.After),
// another store's ids or a changed digit are no cursor, and a legacy id
// (a durable store written by an earlier version) still pages after its
// job.
func TestJobIDsHideTheSequence(t *testing.T) {
	forEachStore(t, func(t *testing.T, open func(clock.PassiveClock, time.Duration, int) (testStore, func() testStore)) {
		s, _ := open(clocktesting.NewFakeClock(t0), 0, 0)
		var a []string
		inOrder := true
		for i := range 200 {
			j, err := s.Create(Job{Tenant: "a", Status: StatusQueued})
			if err != nil {
				t.Fatal(err)
			}
			if len(j.ID) != len("job_")+32 || !strings.HasPrefix(j.ID, "job_") {
				t.Fatalf("id %q: want job_ and 32 hex digits", j.ID)
			}
			if strings.Contains(j.ID, fmt.Sprintf("%016x", i+1)) {
				t.Errorf("id %s shows its sequence number %d", j.ID, i+1)
			}
			if i > 0 && j.ID < a[i-1] {
				inOrder = false
			}
			a = append(a, j.ID)
		}
		if inOrder {
			t.Errorf("200 ids sort in submission order: they carry the sequence")
		}
		if d := cmp.Diff(a[101:], ids(must(s.List("a", Filter{After: a[100]})))); d != "" {
			t.Errorf("after the 101st id (-want +got):\n%s", d)
		}
		other := NewMemStore(clocktesting.NewFakeClock(t0), 0, 0)
		if id := other.newID(1); id == a[0] {
			t.Errorf("two stores gave the same id %s to sequence number 1", id)
		}
		forged := []byte(a[100])
		forged[10] ^= 1 // a hex digit changed into another
		for _, c := range []string{other.newID(101), string(forged), "job_", "job_" + strings.Repeat("z", 32)} {
			if _, _, err := s.List("a", Filter{After: c}); !errors.Is(err, ErrInvalidCursor) {
				t.Errorf("cursor %q: %v, want ErrInvalidCursor", c, err)
			}
		}
		// An id of the earlier form is a cursor only in a store that held
		// such ids (TestBoltStoreOpensAFileWithLegacyIDs): here it would
		// show the sequence number of the tenant's own jobs.
		if _, _, err := s.List("a", Filter{After: fmt.Sprintf("job_%016x%s", 150, "deadbeef")}); !errors.Is(err, ErrInvalidCursor) {
			t.Errorf("legacy-form cursor of sequence number 150 in a store without legacy ids: %v, want ErrInvalidCursor", err)
		}
	})
}

// TestForgedLegacyCursorsShowNoSequence: a tenant cannot learn the pool-wide
// sequence numbers of its jobs (so how many jobs other tenants submitted in
// between) by listing after forged cursors of the earlier id form
// ("job_" + 16 hex digits of a sequence number + 8 hex digits): in a store
// that never held such ids they are refused. They used to be accepted by
// every store, so a binary search over them placed each of the tenant's
// jobs in the sequence exactly.
func TestForgedLegacyCursorsShowNoSequence(t *testing.T) {
	forEachStore(t, func(t *testing.T, open func(clock.PassiveClock, time.Duration, int) (testStore, func() testStore)) {
		s, reopen := open(clocktesting.NewFakeClock(t0), 0, 0)
		for _, tenant := range []string{"b", "b", "a", "b", "a"} {
			if _, err := s.Create(Job{Tenant: tenant, Status: StatusQueued}); err != nil {
				t.Fatal(err)
			}
		}
		for range 2 {
			for seq := range uint64(6) {
				cursor := fmt.Sprintf("job_%016x%08x", seq, 0)
				if list, _, err := s.List("a", Filter{After: cursor}); !errors.Is(err, ErrInvalidCursor) {
					t.Errorf("forged cursor of sequence number %d: %d jobs, %v; want ErrInvalidCursor", seq, len(list), err)
				}
			}
			s = reopen()
		}
	})
}

// TestStoreRetentionWithoutWrites: a finished job is gone once its
// retention has passed also when nothing was written since (an idle
// pool): Get answers ErrNotFound, List and Counts leave it out. Retention
// used to be applied only by writes, so an idle store served finished jobs
// past their retention for as long as no job was submitted or updated.
func TestStoreRetentionWithoutWrites(t *testing.T) {
	forEachStore(t, func(t *testing.T, open func(clock.PassiveClock, time.Duration, int) (testStore, func() testStore)) {
		fc := clocktesting.NewFakeClock(t0)
		s, _ := open(fc, time.Hour, 0)
		j, _ := s.Create(Job{Tenant: "a", Status: StatusQueued})
		if _, err := s.Update(j.ID, func(j *Job) error { j.Status, j.FinishedAt = StatusSucceeded, fc.Now(); return nil }); err != nil {
			t.Fatal(err)
		}
		fc.Step(time.Hour - time.Nanosecond)
		if _, err := s.Get(j.ID); err != nil {
			t.Fatalf("finished job pruned before its retention: %v", err)
		}
		fc.Step(time.Nanosecond)
		if _, err := s.Get(j.ID); !errors.Is(err, ErrNotFound) {
			t.Errorf("Get of a finished job past its retention: %v, want ErrNotFound", err)
		}
		if list, _, _ := s.List("a", Filter{}); len(list) != 0 {
			t.Errorf("List past the retention: %v, want none", ids(list))
		}
		if d := cmp.Diff(map[Status]int{}, s.Counts()); d != "" {
			t.Errorf("counts past the retention (-want +got):\n%s", d)
		}
	})
}
