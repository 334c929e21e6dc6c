package gateway

import (
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// steppingStore lets step pass on the clock before each write that starts a
// queued job, as a slow store write (one fsync each) lets time pass within
// one dispatch pass.
type steppingStore struct {
	*jobs.MemStore
	clock *clocktesting.FakeClock
	step  time.Duration
}

func (s steppingStore) Update(id string, fn func(*jobs.Job) error) (jobs.Job, error) {
	if j, err := s.MemStore.Get(id); err == nil && j.Status == jobs.StatusQueued {
		s.clock.Step(s.step)
	}
	return s.MemStore.Update(id, fn)
}

// TestJobStartedAtIsItsOwnDispatch: jobs started by one dispatch pass get
// the time each was started, not the time the pass began, so StartedAt and
// the queue wait follow the dispatch order.
func TestJobStartedAtIsItsOwnDispatch(t *testing.T) {
	up := newUpstream(t, okJSON(10, 20))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})},
		withStore(func(m *jobs.MemStore, c *clocktesting.FakeClock) jobs.Store {
			return steppingStore{MemStore: m, clock: c, step: time.Second}
		}))
	e.pause(60 * time.Second)
	var ids []string
	for range 3 {
		ids = append(ids, e.submit("key-a", jobBody(10, 100, "")).ID)
	}
	e.clock.Step(61 * time.Second) // one pass starts all three
	waitFor(t, "the jobs to succeed", func() bool {
		for _, id := range ids {
			if e.storeStatus(id) != jobs.StatusSucceeded {
				return false
			}
		}
		return true
	})
	started := map[int64]time.Time{}
	for _, id := range ids {
		j, err := e.store.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		started[j.DispatchSeq] = j.StartedAt
		if j.QueueWait != j.StartedAt.Sub(j.CreatedAt) {
			t.Errorf("job %d: queue wait %v, want StartedAt - CreatedAt %v", j.DispatchSeq, j.QueueWait, j.StartedAt.Sub(j.CreatedAt))
		}
	}
	if len(started) != 3 {
		t.Fatalf("dispatch positions %v, want 1..3", started)
	}
	for seq := int64(2); seq <= 3; seq++ {
		if !started[seq].After(started[seq-1]) {
			t.Errorf("job dispatched %d-th started at %v, not after the %d-th (%v)", seq, started[seq], seq-1, started[seq-1])
		}
	}
}
