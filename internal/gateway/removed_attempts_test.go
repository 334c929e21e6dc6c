package gateway

import (
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fairshare-dev/fairshare/internal/fairqueue"
	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// TestRemovalFailuresCountTheAttempts: a job failed because its tenant or
// its model was removed after the provider had already been sent it (here
// once: a 500, the job waiting for its retry) says so, as an expiry does
// ("not sent again (attempts: 1)"); it said "the job was not sent", which
// the provider's own records and the job's attempts contradicted. A job
// never sent still says it was not sent.
func TestRemovalFailuresCountTheAttempts(t *testing.T) {
	for _, tc := range []struct {
		name, code, want string
		remove           func(e *env)
	}{
		{"tenant", jobCodeTenantRemoved, "The tenant's TenantQuota was removed; the job was not sent again (attempts: 1).",
			func(e *env) { e.reg.RemoveTenant("a") }},
		{"model", jobCodeModelRemoved, `The model "` + testModel + `" is no longer served by the pool; the job was not sent again (attempts: 1).`,
			func(e *env) {
				pol := *e.reg.Pool()
				pol.Models = []registry.ModelPolicy{{Name: "gpt-other", TokensPerMinute: 1000000, RequestsPerMinute: 10000}}
				if err := e.reg.SetPool(pol); err != nil {
					e.t.Fatal(err)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				w.WriteHeader(http.StatusInternalServerError)
			})
			e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
			sent := e.submit("key-a", jobBody(10, 100, "")).ID
			waitFor(t, "the first attempt to fail and wait for its retry", func() bool {
				j, err := e.store.Get(sent)
				return err == nil && j.Attempts == 1 && j.Status == jobs.StatusQueued
			})
			e.pause(time.Hour) // the second job is never sent (nor the first again: the clock stands still)
			unsent := e.submit("key-a", jobBody(10, 100, "")).ID
			tc.remove(e)
			waitFor(t, "the sent job to fail", func() bool { return e.storeStatus(sent) == jobs.StatusFailed })
			if j, _ := e.store.Get(sent); j.Error == nil || j.Error.Code != tc.code || j.Error.Message != tc.want {
				t.Errorf("sent job's error %+v, want %s %q", j.Error, tc.code, tc.want)
			}
			waitFor(t, "the unsent job to fail", func() bool { return e.storeStatus(unsent) == jobs.StatusFailed })
			if j, _ := e.store.Get(unsent); j.Error == nil || j.Attempts != 0 || !strings.HasSuffix(j.Error.Message, "; the job was not sent.") {
				t.Errorf("unsent job's error %+v (attempts %d), want one saying it was not sent", j.Error, j.Attempts)
			}
		})
	}
}

// TestRecoveredJobOfRemovedTenantCountsTheAttempts: a job running when the
// scheduler stopped, whose tenant was removed before the restart, fails
// saying it was not sent again after its attempt, not that it was not sent.
func TestRecoveredJobOfRemovedTenantCountsTheAttempts(t *testing.T) {
	up := newUpstream(t, okJSON(10, 20))
	var id string
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})},
		withStore(func(m *jobs.MemStore, c *clocktesting.FakeClock) jobs.Store {
			j, err := m.Create(jobs.Job{Tenant: "gone", Status: jobs.StatusRunning, Endpoint: endpointCompletions, Model: testModel,
				Body: []byte(completionsBody(10, 100, "")), PromptTokens: 10, MaxOutputTokens: 100,
				CreatedAt: c.Now(), StartedAt: c.Now(), Deadline: c.Now().Add(time.Hour), Attempts: 1})
			if err != nil {
				t.Fatal(err)
			}
			id = j.ID
			return m
		}))
	waitFor(t, "the recovered job to fail", func() bool { return e.storeStatus(id) == jobs.StatusFailed })
	want := "The tenant's TenantQuota was removed while the scheduler was restarting; the job was not sent again (attempts: 1)."
	if j, _ := e.store.Get(id); j.Error == nil || j.Error.Code != jobCodeTenantRemoved || j.Error.Message != want {
		t.Errorf("error %+v, want %s %q", j.Error, jobCodeTenantRemoved, want)
	}
}

// TestRecoveredJobsOfRemovedModelCostNoTurn: a stored job for a model the
// pool no longer serves (taken out while the scheduler was down) fails at
// recovery with model_not_found, unsent, as a live removal fails it
// (TestRemovedModelJobsCostNoTurn), instead of being queued: queued, it was
// dispatched in its tenant's turn, charged the tenant's deficit and failed
// at start, so the tenant's next job went after the other tenant's. Tenant
// a has the stale job then one for gpt-test, tenant b one for gpt-test;
// each job is one quantum: a's gpt-test job is sent first.
func TestRecoveredJobsOfRemovedModelCostNoTurn(t *testing.T) {
	up := newUpstream(t, okJSON(10, 10))
	var stale, ax, bx string
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{}), tenant("b", limiter.Limits{})},
		withPool(func(p *registry.PoolPolicy) { p.Quantum = 20 }),
		withStore(func(m *jobs.MemStore, c *clocktesting.FakeClock) jobs.Store {
			create := func(tenant, model string) string {
				j, err := m.Create(jobs.Job{Tenant: tenant, Status: jobs.StatusQueued, Endpoint: endpointCompletions, Model: model,
					Body: []byte(strings.Replace(completionsBody(10, 10, ""), testModel, model, 1)), PromptTokens: 10, MaxOutputTokens: 10,
					CreatedAt: c.Now(), Deadline: c.Now().Add(time.Hour)})
				if err != nil {
					t.Fatal(err)
				}
				return j.ID
			}
			stale, ax, bx = create("a", "gpt-gone"), create("a", testModel), create("b", testModel)
			return m
		}))
	waitFor(t, "every job to finish", func() bool {
		return e.storeStatus(stale).Finished() && e.storeStatus(ax).Finished() && e.storeStatus(bx).Finished()
	})
	want := `The model "gpt-gone" is no longer served by the pool; the job was not sent.`
	if j, _ := e.store.Get(stale); j.Status != jobs.StatusFailed || j.Error == nil || j.Error.Code != jobCodeModelRemoved || j.Error.Message != want {
		t.Errorf("stale job: %s %+v, want failed %s %q", j.Status, j.Error, jobCodeModelRemoved, want)
	}
	if j, _ := e.store.Get(ax); j.DispatchSeq != 1 {
		t.Errorf("a's gpt-test job was sent %d-th, want first (its stale job took no turn)", j.DispatchSeq)
	}
}

// TestRemovalDuringCallFailsAtItsEnd: a job whose upstream call is in
// flight when its tenant or its model is removed, and which the provider
// answers with a 500 (a retry) or a 429 (back to the queue), fails as the
// call ends, unsent again, with the removal's code: the removal's scan
// could not see it (it was neither queued nor waiting for a retry), and
// the job used to be put back all the same, so it waited for its backoff
// (forever under this test's clock, which stands still) or for the pause
// and then failed at start, its message not saying it had been sent.
func TestRemovalDuringCallFailsAtItsEnd(t *testing.T) {
	for _, answer := range []int{http.StatusInternalServerError, http.StatusTooManyRequests} {
		for _, tc := range []struct {
			name, code, want string
			remove           func(e *env)
		}{
			{"tenant", jobCodeTenantRemoved, "The tenant's TenantQuota was removed; the job was not sent again (attempts: 1).",
				func(e *env) { e.reg.RemoveTenant("a") }},
			{"model", jobCodeModelRemoved, `The model "` + testModel + `" is no longer served by the pool; the job was not sent again (attempts: 1).`,
				func(e *env) {
					pol := *e.reg.Pool()
					pol.Models = []registry.ModelPolicy{{Name: "gpt-other", TokensPerMinute: 1000000, RequestsPerMinute: 10000}}
					if err := e.reg.SetPool(pol); err != nil {
						e.t.Fatal(err)
					}
				}},
		} {
			t.Run(http.StatusText(answer)+"/"+tc.name, func(t *testing.T) {
				in, release := make(chan struct{}, 4), make(chan struct{})
				var calls atomic.Int32
				up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
					calls.Add(1)
					in <- struct{}{}
					<-release
					if answer == http.StatusTooManyRequests {
						w.Header().Set("Retry-After", "60")
					}
					w.WriteHeader(answer)
				})
				e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
				id := e.submit("key-a", jobBody(10, 100, "")).ID
				select {
				case <-in:
				case <-time.After(10 * time.Second):
					t.Fatal("the job was not sent")
				}
				tc.remove(e)
				close(release)
				waitFor(t, "the job to fail", func() bool { return e.storeStatus(id) == jobs.StatusFailed })
				j, _ := e.store.Get(id)
				if j.Error == nil || j.Error.Code != tc.code || j.Error.Message != tc.want || j.Attempts != 1 {
					t.Errorf("error %+v, attempts %d; want %s %q, attempts 1", j.Error, j.Attempts, tc.code, tc.want)
				}
				var queued, retrying int
				e.reg.WithQueue(func(q *fairqueue.Queue) {
					queued, retrying = q.Len("a"), e.gw.dispatch.retryingTotal
				})
				if queued != 0 || retrying != 0 || calls.Load() != 1 {
					t.Errorf("after the failure: %d queued, %d waiting for a retry, %d calls; want 0, 0, 1", queued, retrying, calls.Load())
				}
			})
		}
	}
}

// TestFinishedJobNoLongerCountsTowardTheBound: once a job's record says it
// succeeded, it no longer counts toward its tenant's queue bound. The
// dispatcher released the job's slot after it had started the call, so a
// fast call could finish first: a submission in that instant was refused
// at the bound, or, for a tenant idle since its last dispatch, was told to
// retry after the whole idle time (TestQueueFullRetryAfterIgnoresIdleTime
// failed that way, with Retry-After 86400). The window is short, so the
// test runs many jobs and checks each at once, with more threads than the
// machine's 2 cores so that the call runs while the dispatcher is still in
// start (without the fix it failed within 100 jobs under -race).
func TestFinishedJobNoLongerCountsTowardTheBound(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(max(4, runtime.GOMAXPROCS(0))))
	up := newUpstream(t, okJSON(1, 1))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
	for i := range 300 {
		id := e.submit("key-a", jobBody(10, 20, "")).ID
		var counted int
		for deadline := time.Now().Add(10 * time.Second); e.storeStatus(id) != jobs.StatusSucceeded; runtime.Gosched() {
			if time.Now().After(deadline) {
				t.Fatalf("job %d did not succeed within 10 s", i)
			}
		}
		e.reg.WithQueue(func(q *fairqueue.Queue) { counted = e.gw.dispatch.queuedLocked(q, "a") })
		if counted != 0 {
			t.Fatalf("job %d succeeded while %d jobs of its tenant counted toward the bound, want 0", i, counted)
		}
	}
}
