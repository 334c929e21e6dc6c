package jobs

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
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

func TestMemStoreListPagesByTenantAndStatus(t *testing.T) {
	s := NewMemStore(clocktesting.NewFakeClock(t0), 0, 0)
	var a []string
	for i := range 5 {
		j, err := s.Create(Job{Tenant: "a", Status: StatusQueued, CreatedAt: t0})
		if err != nil {
			t.Fatal(err)
		}
		a = append(a, j.ID)
		if _, err := s.Create(Job{Tenant: "b", Status: StatusQueued}); err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			if _, err := s.Update(j.ID, func(j *Job) error { j.Status = StatusSucceeded; j.FinishedAt = t0; return nil }); err != nil {
				t.Fatal(err)
			}
		}
	}
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
	if _, err := s.Get(a[0]); !errors.Is(err, ErrNotFound) {
		t.Errorf("deleted job: %v", err)
	}
	// A cursor that no longer exists still pages.
	page, _, _ = s.List("a", Filter{After: a[0]})
	if d := cmp.Diff(a[1:], ids(page)); d != "" {
		t.Errorf("after a deleted id (-want +got):\n%s", d)
	}
}

func TestMemStoreRetention(t *testing.T) {
	fc := clocktesting.NewFakeClock(t0)
	s := NewMemStore(fc, time.Hour, 2)
	var fin []string
	for range 3 {
		j, _ := s.Create(Job{Tenant: "a", Status: StatusQueued})
		_, _ = s.Update(j.ID, func(j *Job) error { j.Status, j.FinishedAt = StatusFailed, fc.Now(); return nil })
		fin = append(fin, j.ID)
	}
	queued, _ := s.Create(Job{Tenant: "a", Status: StatusQueued})
	if _, err := s.Get(fin[0]); !errors.Is(err, ErrNotFound) {
		t.Errorf("oldest finished job kept beyond the bound of 2: %v", err)
	}
	fc.Step(time.Hour)
	s.Prune(fc.Now())
	for _, id := range fin[1:] {
		if _, err := s.Get(id); !errors.Is(err, ErrNotFound) {
			t.Errorf("finished job %s kept beyond the retention: %v", id, err)
		}
	}
	if _, err := s.Get(queued.ID); err != nil {
		t.Errorf("queued job pruned: %v", err)
	}
}
