package gateway

import (
	"errors"
	"io"
	"net/http"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fairshare-dev/fairshare/internal/fairqueue"
	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

var errVolumeFull = errors.New("write /var/lib/fairshare/jobs.db: no space left on device")

// faultStore fails the next finishFails writes that give an unfinished job
// a terminal status, the next startFails writes that start a queued job
// and the next deleteFails deletions, as a store whose volume is full does
// (after applying fn to a copy of the job, as BoltStore encodes it before
// the write fails).
type faultStore struct {
	*jobs.MemStore
	finishFails, deleteFails *atomic.Int64
	startFails               *atomic.Int64
	// webhookFails fails the next writes that give a finished job's
	// webhook a final state (delivered, failed).
	webhookFails *atomic.Int64
	// beforeCreate, when set, is taken and run before the next Create.
	beforeCreate *atomic.Pointer[func()]
}

func (s faultStore) Create(j jobs.Job) (jobs.Job, error) {
	if s.beforeCreate != nil {
		if f := s.beforeCreate.Swap(nil); f != nil {
			(*f)()
		}
	}
	return s.MemStore.Create(j)
}

func (s faultStore) Update(id string, fn func(*jobs.Job) error) (jobs.Job, error) {
	j, err := s.MemStore.Get(id)
	if err != nil {
		return s.MemStore.Update(id, fn)
	}
	// fn runs once, on a copy, as BoltStore encodes the changed job before
	// its write can fail.
	probe := j
	if err := fn(&probe); err != nil {
		return j, err
	}
	if j.Status.Finished() && probe.WebhookStatus != j.WebhookStatus && (probe.WebhookStatus == webhookDelivered || probe.WebhookStatus == webhookFailed) &&
		s.webhookFails != nil && s.webhookFails.Add(-1) >= 0 {
		return j, errVolumeFull
	}
	if !j.Status.Finished() && probe.Status.Finished() && s.finishFails.Add(-1) >= 0 {
		return j, errVolumeFull
	}
	if j.Status == jobs.StatusQueued && probe.Status == jobs.StatusRunning && s.startFails != nil && s.startFails.Add(-1) >= 0 {
		return j, errVolumeFull
	}
	return s.MemStore.Update(id, func(cur *jobs.Job) error {
		if reflect.DeepEqual(*cur, j) {
			*cur = probe
			return nil
		}
		return fn(cur) // changed meanwhile
	})
}

func (s faultStore) Delete(id string) error {
	if s.deleteFails.Add(-1) >= 0 {
		return errVolumeFull
	}
	return s.MemStore.Delete(id)
}

func newFaultEnv(t *testing.T, up *upstream, tenants []registry.TenantPolicy, opts ...envOption) (*env, *atomic.Int64, *atomic.Int64) {
	e, fs := newFaultStoreEnv(t, up, tenants, opts...)
	return e, fs.finishFails, fs.deleteFails
}

func newFaultStoreEnv(t *testing.T, up *upstream, tenants []registry.TenantPolicy, opts ...envOption) (*env, faultStore) {
	fs := faultStore{finishFails: new(atomic.Int64), deleteFails: new(atomic.Int64), startFails: new(atomic.Int64),
		webhookFails: new(atomic.Int64), beforeCreate: new(atomic.Pointer[func()])}
	opts = append(opts, withStore(func(m *jobs.MemStore, _ *clocktesting.FakeClock) jobs.Store {
		fs.MemStore = m
		return fs
	}))
	return newEnv(t, up, tenants, opts...), fs
}

// TestCancelNotRecordedKeepsTheJobQueued: a DELETE whose cancellation the
// store fails to record answers 500 store_error and leaves the job queued
// (in the fair queue, or waiting for its retry), so that it is still sent,
// expires or can be cancelled by the next DELETE. It used to take the job
// out of the queue while its record still said queued, and answer 409
// "being dispatched": never sent, never expired, and no DELETE could cancel
// it until a restart.
func TestCancelNotRecordedKeepsTheJobQueued(t *testing.T) {
	t.Run("queued", func(t *testing.T) {
		up := newUpstream(t, okJSON(10, 20))
		e, finishFails, _ := newFaultEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
		e.pause(60 * time.Second)
		id := e.submit("key-a", jobBody(10, 100, "")).ID
		// The first pass tries the job, the paused model refuses it, and
		// it goes back to the queue; no pass takes it out again before the
		// pause ends (a DELETE meanwhile is 409 "has just left the queue").
		waitFor(t, "the dispatcher to wait with the job queued", func() bool {
			var queued bool
			e.reg.WithQueue(func(q *fairqueue.Queue) { queued = q.Queued(e.gw.dispatch.byID[id]) })
			return queued && e.clock.HasWaiters()
		})
		finishFails.Store(1)
		resp := e.do("DELETE", "/v1/jobs/"+id, "key-a", "")
		if body := decode[errorBody](t, resp); resp.StatusCode != http.StatusInternalServerError || body.Error.Code != "store_error" {
			t.Fatalf("DELETE with the store failing: %d %+v, want 500 store_error", resp.StatusCode, body.Error)
		}
		if st := e.storeStatus(id); st != jobs.StatusQueued {
			t.Fatalf("status after the failed cancel: %s, want queued", st)
		}
		var queued bool
		e.reg.WithQueue(func(q *fairqueue.Queue) { queued = q.Queued(e.gw.dispatch.byID[id]) })
		if !queued {
			t.Fatal("the job left the fair queue although its cancellation was not recorded")
		}
		resp = e.do("DELETE", "/v1/jobs/"+id, "key-a", "")
		if v := decode[jobView](t, resp); resp.StatusCode != http.StatusOK || v.Status != jobs.StatusCancelled {
			t.Fatalf("second DELETE: %d %s, want 200 cancelled", resp.StatusCode, v.Status)
		}
		e.clock.Step(61 * time.Second)
		e.gw.dispatch.wake()
		waitFor(t, "a pass after the pause", func() bool { return e.gw.dispatch.passes.Load() >= 4 })
		if n := up.calls.Load(); n != 0 {
			t.Errorf("upstream calls of the cancelled job: %d, want 0", n)
		}
	})
	t.Run("retrying", func(t *testing.T) {
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
			w.WriteHeader(http.StatusInternalServerError)
		})
		tp := tenant("a", limiter.Limits{})
		tp.MaxQueued = 1
		e, finishFails, _ := newFaultEnv(t, up, []registry.TenantPolicy{tp})
		id := e.submit("key-a", jobBody(10, 100, "")).ID
		waitFor(t, "the first attempt to fail and wait for its retry", func() bool {
			j, err := e.store.Get(id)
			return err == nil && j.Attempts == 1 && j.Status == jobs.StatusQueued
		})
		waitFor(t, "the job in its backoff", func() bool {
			e.gw.dispatch.mu.Lock()
			defer e.gw.dispatch.mu.Unlock()
			_, ok := e.gw.dispatch.retries[id]
			return ok
		})
		finishFails.Store(1)
		resp := e.do("DELETE", "/v1/jobs/"+id, "key-a", "")
		if body := decode[errorBody](t, resp); resp.StatusCode != http.StatusInternalServerError || body.Error.Code != "store_error" {
			t.Fatalf("DELETE with the store failing: %d %+v, want 500 store_error", resp.StatusCode, body.Error)
		}
		// Still a queued job: it holds its slot of maxQueuedJobs.
		resp = e.do("POST", "/v1/jobs", "key-a", jobBody(10, 20, ""))
		if body := decode[errorBody](t, resp); resp.StatusCode != http.StatusTooManyRequests || body.Error.Code != codeQueueFull {
			t.Fatalf("submission beside the job still retrying: %d %+v, want 429 %s", resp.StatusCode, body.Error, codeQueueFull)
		}
		resp = e.do("DELETE", "/v1/jobs/"+id, "key-a", "")
		if v := decode[jobView](t, resp); resp.StatusCode != http.StatusOK || v.Status != jobs.StatusCancelled {
			t.Fatalf("second DELETE: %d %s, want 200 cancelled", resp.StatusCode, v.Status)
		}
		e.submit("key-a", jobBody(10, 20, "")) // the slot is free again
	})
}

// TestJobFinishNotRecordedIsRecordedLater: a terminal status (succeeded
// after the provider's answer, expired at the deadline) that the store
// fails to record is written again storeRetry later, with the job's finish
// time, usage and response, and counted once. It used to be dropped: the
// job's record said running (or queued) until a restart, which then sent a
// succeeded job to the provider again.
func TestJobFinishNotRecordedIsRecordedLater(t *testing.T) {
	t.Run("succeeded", func(t *testing.T) {
		up := newUpstream(t, okJSON(10, 20))
		e, finishFails, _ := newFaultEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
		finishFails.Store(1)
		id := e.submit("key-a", jobBody(10, 100, "")).ID
		waitFor(t, "the failed finish", func() bool { return finishFails.Load() == 0 })
		if st := e.storeStatus(id); st != jobs.StatusRunning {
			t.Fatalf("status after the failed finish: %s, want running (not recorded yet)", st)
		}
		e.clock.Step(storeRetry)
		e.gw.dispatch.wake()
		waitFor(t, "the finish to be recorded", func() bool { return e.storeStatus(id) == jobs.StatusSucceeded })
		j, _ := e.store.Get(id)
		if !j.FinishedAt.Equal(t0) || j.Usage == nil || *j.Usage != (jobs.Usage{PromptTokens: 10, CompletionTokens: 20}) || len(j.Response) == 0 || j.Attempts != 1 {
			t.Errorf("job %+v: want finished at %v, usage {10 20}, a response, 1 attempt", j, t0)
		}
		if n := testutil.ToFloat64(e.gw.metrics.JobsFinished.WithLabelValues("succeeded")); n != 1 {
			t.Errorf("jobs finished succeeded: %v, want 1", n)
		}
		if n := up.calls.Load(); n != 1 {
			t.Errorf("upstream calls: %d, want 1", n)
		}
	})
	t.Run("expired", func(t *testing.T) {
		up := newUpstream(t, okJSON(10, 20))
		e, finishFails, _ := newFaultEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
		e.pause(60 * time.Second)
		id := e.submit("key-a", jobBody(10, 100, `,"deadlineSeconds":2`)).ID
		finishFails.Store(1)
		e.clock.Step(2 * time.Second)
		e.gw.dispatch.wake()
		waitFor(t, "the failed expiry", func() bool { return finishFails.Load() == 0 })
		e.clock.Step(storeRetry)
		e.gw.dispatch.wake()
		waitFor(t, "the expiry to be recorded", func() bool { return e.storeStatus(id) == jobs.StatusExpired })
		j, _ := e.store.Get(id)
		if want := t0.Add(2 * time.Second); !j.FinishedAt.Equal(want) || j.Error == nil || j.Error.Code != jobCodeDeadline {
			t.Errorf("job finished at %v error %+v, want %v %s", j.FinishedAt, j.Error, want, jobCodeDeadline)
		}
		if n := e.tenantSnap("a").Expired; n != 1 {
			t.Errorf("tenant expired jobs: %d, want 1", n)
		}
	})
}

// TestRefusedSubmissionDeleteNotRecordedIsRetried: a submission refused
// after it was stored (the tenant's queue filled up while it was being
// stored) whose removal the store fails is removed storeRetry later. It
// used to stay in the store as a queued job the client had been told was
// refused: listed, never sent, never expired, and queued again (then sent)
// by the next restart.
func TestRefusedSubmissionDeleteNotRecordedIsRetried(t *testing.T) {
	up := newUpstream(t, okJSON(10, 20))
	tp := tenant("a", limiter.Limits{})
	tp.MaxQueued = 1
	e, fs := newFaultStoreEnv(t, up, []registry.TenantPolicy{tp})
	e.pause(60 * time.Second)
	var first string
	fill := func() { first = e.submit("key-a", jobBody(10, 100, "")).ID }
	fs.beforeCreate.Store(&fill)
	fs.deleteFails.Store(1)
	resp := e.do("POST", "/v1/jobs", "key-a", jobBody(10, 100, ""))
	if body := decode[errorBody](t, resp); resp.StatusCode != http.StatusTooManyRequests || body.Error.Code != codeQueueFull {
		t.Fatalf("second submission: %d %+v, want 429 %s", resp.StatusCode, body.Error, codeQueueFull)
	}
	if n := fs.deleteFails.Load(); n != 0 {
		t.Fatalf("removals of the refused job tried: %d, want 1 (failed)", 1-n)
	}
	e.clock.Step(storeRetry)
	e.gw.dispatch.wake()
	waitFor(t, "the refused job to be removed", func() bool {
		list, _, _ := e.store.List("a", jobs.Filter{})
		return len(list) == 1
	})
	list, _, _ := e.store.List("a", jobs.Filter{})
	if len(list) != 1 || list[0].ID != first {
		t.Fatalf("stored jobs %v, want only %s", list, first)
	}
}

// queueWaitSamples is the sample count and sum of the queue wait histogram.
func (e *env) queueWaitSamples() (uint64, float64) {
	e.t.Helper()
	var m dto.Metric
	if err := e.gw.metrics.QueueWait.Write(&m); err != nil {
		e.t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

// TestQueueWaitObservedOnceWhenTheStartIsNotRecorded: a job whose first
// start the store fails to record, then started 1 s later, is observed
// once in the queue wait histogram, with the wait of the start that was
// recorded (1 s). The start that failed used to be observed too.
func TestQueueWaitObservedOnceWhenTheStartIsNotRecorded(t *testing.T) {
	up := newUpstream(t, okJSON(10, 20))
	e, fs := newFaultStoreEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
	fs.startFails.Store(1)
	id := e.submit("key-a", jobBody(10, 100, "")).ID
	waitFor(t, "the failed start", func() bool { return fs.startFails.Load() == 0 })
	e.clock.Step(storeRetry)
	e.gw.dispatch.wake()
	waitFor(t, "the job to succeed", func() bool { return e.storeStatus(id) == jobs.StatusSucceeded })
	if n, sum := e.queueWaitSamples(); n != 1 || sum != 1 {
		t.Errorf("queue wait samples %d, sum %gs; want 1 and 1s", n, sum)
	}
	if v := e.job("key-a", id); v.QueueWaitMS == nil || *v.QueueWaitMS != 1000 {
		t.Errorf("queue_wait_ms %v, want 1000", v.QueueWaitMS)
	}
}

// TestQueueWaitNeverNegative: a job stored by a scheduler whose clock was
// ahead (created at t0+1h) and started by one at t0 waited 0 ms, not
// -3,600,000 ms (queue_wait_ms, X-Queue-Wait-Ms and the histogram).
func TestQueueWaitNeverNegative(t *testing.T) {
	up := newUpstream(t, okJSON(10, 20))
	var id string
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})},
		withStore(func(m *jobs.MemStore, c *clocktesting.FakeClock) jobs.Store {
			created := c.Now().Add(time.Hour)
			j, err := m.Create(jobs.Job{Tenant: "a", Status: jobs.StatusQueued, Endpoint: endpointCompletions, Model: testModel,
				Body: []byte(completionsBody(10, 100, "")), PromptTokens: 10, MaxOutputTokens: 100,
				CreatedAt: created, Deadline: created.Add(time.Hour)})
			if err != nil {
				t.Fatal(err)
			}
			id = j.ID
			return m
		}))
	waitFor(t, "the job to succeed", func() bool { return e.storeStatus(id) == jobs.StatusSucceeded })
	resp := e.do("GET", "/v1/jobs/"+id, "key-a", "")
	if h := resp.Header.Get("X-Queue-Wait-Ms"); h != "0" {
		t.Errorf("X-Queue-Wait-Ms %q, want 0", h)
	}
	if v := decode[jobView](t, resp); v.QueueWaitMS == nil || *v.QueueWaitMS != 0 {
		t.Errorf("queue_wait_ms %v, want 0", v.QueueWaitMS)
	}
	if n, sum := e.queueWaitSamples(); n != 1 || sum != 0 {
		t.Errorf("queue wait samples %d, sum %gs; want 1 and 0s", n, sum)
	}
}

// countingStore counts the store's writes.
type countingStore struct {
	*jobs.MemStore
	creates, deletes *atomic.Int64
}

func (s countingStore) Create(j jobs.Job) (jobs.Job, error) {
	s.creates.Add(1)
	return s.MemStore.Create(j)
}

func (s countingStore) Delete(id string) error {
	s.deletes.Add(1)
	return s.MemStore.Delete(id)
}

// TestFullQueueRefusalWritesNothing: a submission refused because the
// tenant's queue (or the pool's) is full costs the job store no write. Each
// used to be stored and then deleted: two fsync'ed writes of a Volume store
// per refusal, so a tenant retrying against its full queue took the disk's
// write rate from every other tenant's submissions, starts and finishes.
func TestFullQueueRefusalWritesNothing(t *testing.T) {
	up := newUpstream(t, okJSON(10, 20))
	var creates, deletes atomic.Int64
	tp := tenant("a", limiter.Limits{})
	tp.MaxQueued = 1
	e := newEnv(t, up, []registry.TenantPolicy{tp, tenant("b", limiter.Limits{})},
		withPool(func(p *registry.PoolPolicy) { p.MaxQueuedJobs = 2 }),
		withStore(func(m *jobs.MemStore, _ *clocktesting.FakeClock) jobs.Store {
			return countingStore{MemStore: m, creates: &creates, deletes: &deletes}
		}))
	e.pause(60 * time.Second)
	e.submit("key-a", jobBody(10, 100, ""))
	e.submit("key-b", jobBody(10, 100, ""))
	waitFor(t, "the dispatcher to wait with both jobs queued", func() bool {
		var n int
		e.reg.WithQueue(func(q *fairqueue.Queue) { n = q.Total() })
		return n == 2 && e.clock.HasWaiters()
	})
	for range 3 {
		resp := e.do("POST", "/v1/jobs", "key-a", jobBody(10, 100, ""))
		if body := decode[errorBody](t, resp); resp.StatusCode != http.StatusTooManyRequests || body.Error.Code != codeQueueFull {
			t.Fatalf("submission over the tenant's bound: %d %+v, want 429 %s", resp.StatusCode, body.Error, codeQueueFull)
		}
		resp = e.do("POST", "/v1/jobs", "key-b", jobBody(10, 100, ""))
		if body := decode[errorBody](t, resp); resp.StatusCode != http.StatusServiceUnavailable || body.Error.Code != codePoolQueueFull {
			t.Fatalf("submission over the pool's bound: %d %+v, want 503 %s", resp.StatusCode, body.Error, codePoolQueueFull)
		}
	}
	resp := e.bulk("key-a", jobBody(10, 100, "")+"\n"+jobBody(10, 100, "")+"\n")
	if b := decode[bulkResponse](t, resp); b.Refused != 2 {
		t.Fatalf("bulk: %+v, want 2 refused", b)
	}
	if c, d := creates.Load(), deletes.Load(); c != 2 || d != 0 {
		t.Errorf("store creates %d, deletes %d; want 2 (the queued jobs) and 0", c, d)
	}
}

// TestUnrecordedWritesAreNotPutOffByLaterFailures: a terminal status the
// store failed to write is written again storeRetry after its failure even
// when other writes fail meanwhile (a store failing now and then); each new
// failure used to put every retry off by another storeRetry.
func TestUnrecordedWritesAreNotPutOffByLaterFailures(t *testing.T) {
	up := newUpstream(t, okJSON(10, 20))
	e, finishFails, _ := newFaultEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
	finishFails.Store(2)
	first := e.submit("key-a", jobBody(10, 100, "")).ID
	waitFor(t, "the first failed finish", func() bool { return finishFails.Load() == 1 })
	e.clock.Step(storeRetry / 2)
	e.submit("key-a", jobBody(10, 100, ""))
	waitFor(t, "the second failed finish", func() bool { return finishFails.Load() == 0 })
	e.clock.Step(storeRetry / 2)
	e.gw.dispatch.wake()
	waitFor(t, "the first finish to be recorded", func() bool { return e.storeStatus(first) == jobs.StatusSucceeded })
}

// TestUnrecordedFinishWrittenAtShutdown: a terminal status the store failed
// to write is written once more when the scheduler stops, before the store
// is closed, instead of being lost with the process: the job's record
// said running, and the next scheduler sent the succeeded job again.
func TestUnrecordedFinishWrittenAtShutdown(t *testing.T) {
	up := newUpstream(t, okJSON(10, 20))
	e, finishFails, _ := newFaultEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
	finishFails.Store(1)
	id := e.submit("key-a", jobBody(10, 100, "")).ID
	waitFor(t, "the failed finish", func() bool { return finishFails.Load() == 0 })
	e.stopRun()
	if st := e.storeStatus(id); st != jobs.StatusSucceeded {
		t.Errorf("status after the stop: %s, want succeeded", st)
	}
}

// TestWebhookStateNotRecordedIsRecordedLater: a completion webhook's final
// state (delivered, failed) that the store fails to write is written again
// storeRetry later, with its attempts; it was dropped, so the job showed
// webhook_status "pending" (0 attempts) after its delivery, and the next
// scheduler delivered it again.
func TestWebhookStateNotRecordedIsRecordedLater(t *testing.T) {
	for _, tc := range []struct {
		status int
		want   string
	}{{204, webhookDelivered}, {400, webhookFailed}} {
		t.Run(tc.want, func(t *testing.T) {
			up := newUpstream(t, okJSON(10, 20))
			e, fs := newFaultStoreEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
			t.Cleanup(func() { stopWebhooks(e.gw) })
			h := newHookServer(t, tc.status)
			fs.webhookFails.Store(1)
			id := e.submit("key-a", jobBody(10, 100, `,"webhookURL":"`+h.srv.URL+`"`)).ID
			waitFor(t, "the failed webhook state write", func() bool { return fs.webhookFails.Load() == 0 })
			if st, n := e.webhookState(id); st != webhookPending || n != 0 {
				t.Fatalf("webhook state after the failed write: %s %d, want pending 0 (not recorded yet)", st, n)
			}
			e.clock.Step(storeRetry)
			e.gw.dispatch.wake()
			if n := waitWebhook(t, e, id, tc.want); n != 1 {
				t.Errorf("webhook attempts %d, want 1", n)
			}
			if n := len(h.calls()); n != 1 {
				t.Errorf("deliveries %d, want 1", n)
			}
		})
	}
}

// TestPoolBoundCountsJobsBeingDispatched: a job the dispatcher has taken
// out of the queue and not yet sent holds its place in the pool's
// maxQueuedJobs, as it does in its tenant's bound: another tenant's
// submission in that instant is refused 503 pool_queue_full, and when the
// paused model sends the job back to the queue the pool holds 1 job, its
// bound. It used to be accepted, leaving the pool one job over its bound.
func TestPoolBoundCountsJobsBeingDispatched(t *testing.T) {
	up := newUpstream(t, okJSON(10, 20))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{}), tenant("b", limiter.Limits{})},
		withPool(func(p *registry.PoolPolicy) { p.MaxQueuedJobs = 1 }))
	e.pause(60 * time.Second)
	codes := make(chan int, 1)
	var once sync.Once
	hook := func(*fairqueue.Job) {
		once.Do(func() {
			resp, err := http.DefaultClient.Do(mustJobRequestAs(e, "key-b", jobBody(10, 100, "")))
			if err != nil {
				codes <- -1
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes <- resp.StatusCode
		})
	}
	e.gw.dispatch.dequeuedHook.Store(&hook)
	e.submit("key-a", jobBody(10, 100, ""))
	if code := <-codes; code != http.StatusServiceUnavailable {
		t.Errorf("submission while the pool's only job is being dispatched: %d, want 503", code)
	}
	waitFor(t, "the job to be put back", func() bool {
		var held int
		e.reg.WithQueue(func(q *fairqueue.Queue) { held = e.gw.dispatch.held["a"] })
		return held == 0
	})
	var n int
	e.reg.WithQueue(func(q *fairqueue.Queue) { n = q.Total() })
	if n != 1 {
		t.Errorf("jobs queued in the pool: %d, want 1 (its bound)", n)
	}
}

func mustJobRequestAs(e *env, key, body string) *http.Request {
	req := mustJobRequest(e, body)
	req.Header.Set("Authorization", "Bearer "+key)
	return req
}

// TestFlushStoreWritesAfterRun: a store write kept for a retry after Run
// has returned (a handler still draining while the scheduler stops keeps
// the removal of a refused submission) is made by FlushStoreWrites, which
// the scheduler calls once the HTTP server has drained, before it closes
// the store; without it the queued record of a refused job stayed and the
// next scheduler ran it.
func TestFlushStoreWritesAfterRun(t *testing.T) {
	up := newUpstream(t, okJSON(10, 20))
	e, _, deleteFails := newFaultEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
	e.stopRun()
	j, err := e.store.Create(jobs.Job{Tenant: "a", Status: jobs.StatusQueued, Endpoint: endpointCompletions, Model: testModel,
		CreatedAt: e.clock.Now(), Deadline: e.clock.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	deleteFails.Store(1)
	e.gw.dispatch.removeRefused(j.ID, nil) // fails: kept for a retry
	if _, err := e.store.Get(j.ID); err != nil {
		t.Fatalf("record after the failed removal: %v, want still there", err)
	}
	e.gw.FlushStoreWrites()
	if _, err := e.store.Get(j.ID); !errors.Is(err, jobs.ErrNotFound) {
		t.Errorf("record after FlushStoreWrites: %v, want %v", err, jobs.ErrNotFound)
	}
}
