package gateway

import (
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fairshare-dev/fairshare/internal/fairqueue"
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
	// A pass still running at the step sets its timer from the stepped
	// clock (1 ms ahead, which the frozen clock never reaches): wake it.
	e.gw.dispatch.wake()
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

// failingStartStore fails the next fails writes that start a queued job, as
// a store whose volume is full does.
type failingStartStore struct {
	*jobs.MemStore
	fails *atomic.Int64
}

func (s failingStartStore) Update(id string, fn func(*jobs.Job) error) (jobs.Job, error) {
	if j, err := s.MemStore.Get(id); err == nil && j.Status == jobs.StatusQueued && s.fails.Add(-1) >= 0 {
		return j, errors.New("write /var/lib/fairshare/jobs.db: no space left on device")
	}
	return s.MemStore.Update(id, fn)
}

// TestJobStartNotRecordedStaysQueued: a job whose start the store fails to
// record is not sent and stays queued, and a pass storeRetry later sends it
// (not a busy loop of failing writes before that). It used
// to leave the fair queue while its record still said queued: never sent,
// never expired, and refused cancellation ("has just left the queue") until a
// restart.
func TestJobStartNotRecordedStaysQueued(t *testing.T) {
	up := newUpstream(t, okJSON(10, 20))
	var fails atomic.Int64
	fails.Store(1)
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})},
		withStore(func(m *jobs.MemStore, _ *clocktesting.FakeClock) jobs.Store {
			return failingStartStore{MemStore: m, fails: &fails}
		}))
	id := e.submit("key-a", jobBody(10, 100, "")).ID
	waitFor(t, "the failed start", func() bool { return fails.Load() == 0 })
	waitFor(t, "the job back in the queue", func() bool {
		var queued bool
		e.reg.WithQueue(func(q *fairqueue.Queue) { queued = q.Queued(e.gw.dispatch.byID[id]) })
		return queued
	})
	if n := up.calls.Load(); n != 0 {
		t.Fatalf("upstream calls after the failed start: %d, want 0", n)
	}
	e.gw.dispatch.wake()
	waitFor(t, "a pass after the failed start", func() bool { return e.gw.dispatch.passes.Load() >= 3 })
	if n := fails.Load(); n != 0 {
		t.Fatalf("store writes tried before storeRetry: %d, want 1", 1-n)
	}
	if s := e.reg.Tenant("a").Limiter.Snapshot(e.clock.Now()); s.InFlight != 0 {
		t.Errorf("tenant in flight after the failed start: %d, want 0", s.InFlight)
	}
	e.clock.Step(storeRetry) // the next pass may start it
	e.gw.dispatch.wake()     // (a pass running at the step timed its wake from the stepped clock)
	waitFor(t, "the job to succeed", func() bool { return e.storeStatus(id) == jobs.StatusSucceeded })
	if n := up.calls.Load(); n != 1 {
		t.Errorf("upstream calls: %d, want 1", n)
	}
}

// failingRequeueStore fails the next fails writes that take a running job
// back to queued, as a store whose volume is full does.
type failingRequeueStore struct {
	*jobs.MemStore
	fails *atomic.Int64
}

func (s failingRequeueStore) Update(id string, fn func(*jobs.Job) error) (jobs.Job, error) {
	if j, err := s.MemStore.Get(id); err == nil && j.Status == jobs.StatusRunning {
		probe := j
		if fn(&probe) == nil && probe.Status == jobs.StatusQueued && s.fails.Add(-1) >= 0 {
			return j, errors.New("write /var/lib/fairshare/jobs.db: no space left on device")
		}
	}
	return s.MemStore.Update(id, fn)
}

// TestJobRequeueNotRecordedIsStillSent: a job that the provider answers
// with 429 (or 5xx) and whose return to the queue the store fails to record
// is queued again all the same and sent once the pause (or backoff) ends.
// It used to be dropped from the dispatcher with its record saying
// running, until a restart.
func TestJobRequeueNotRecordedIsStillSent(t *testing.T) {
	for _, status := range []int{http.StatusTooManyRequests, http.StatusInternalServerError} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			var calls atomic.Int64
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				if calls.Add(1) == 1 {
					w.Header().Set("Retry-After", "1")
					w.WriteHeader(status)
					return
				}
				okJSON(10, 20)(w, r, body)
			})
			var fails atomic.Int64
			fails.Store(1)
			e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})},
				withStore(func(m *jobs.MemStore, _ *clocktesting.FakeClock) jobs.Store {
					return failingRequeueStore{MemStore: m, fails: &fails}
				}))
			id := e.submit("key-a", jobBody(10, 100, "")).ID
			waitFor(t, "the failed write", func() bool { return fails.Load() == 0 })
			for i := 0; e.storeStatus(id) != jobs.StatusSucceeded; i++ {
				if i == 100 {
					t.Fatalf("job %s: status %s after %d upstream calls, want succeeded", id, e.storeStatus(id), calls.Load())
				}
				e.clock.Step(time.Second)
				e.gw.dispatch.wake()
				time.Sleep(10 * time.Millisecond)
			}
			if n := calls.Load(); n != 2 {
				t.Errorf("upstream calls: %d, want 2", n)
			}
		})
	}
}

// TestRecoveredJobNotRecordedIsStillSent: a job left running by the last
// run whose return to the queue the store fails to record at restart is
// queued again all the same and sent, instead of staying running until the
// next restart.
func TestRecoveredJobNotRecordedIsStillSent(t *testing.T) {
	up := newUpstream(t, okJSON(10, 20))
	var fails atomic.Int64
	fails.Store(1)
	var id string
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})},
		withStore(func(m *jobs.MemStore, c *clocktesting.FakeClock) jobs.Store {
			j, err := m.Create(jobs.Job{Tenant: "a", Status: jobs.StatusRunning, Endpoint: endpointCompletions, Model: testModel,
				Body: []byte(completionsBody(10, 100, "")), PromptTokens: 10, MaxOutputTokens: 100,
				CreatedAt: c.Now(), StartedAt: c.Now(), Deadline: c.Now().Add(time.Hour), Attempts: 1})
			if err != nil {
				t.Fatal(err)
			}
			id = j.ID
			return failingRequeueStore{MemStore: m, fails: &fails}
		}))
	waitFor(t, "the recovered job to succeed", func() bool { return e.storeStatus(id) == jobs.StatusSucceeded })
	if n, f := up.calls.Load(), fails.Load(); n != 1 || f != 0 {
		t.Errorf("upstream calls %d, failed writes %d; want 1 and 1", n, 1-f)
	}
}
