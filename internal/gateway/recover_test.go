package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/metrics"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// durableEnv is an env whose jobs live in a BoltStore at path; stop cancels
// Run (as a scheduler shutdown does), closes the HTTP server and the store.
type durableEnv struct {
	*env
	bolt *jobs.BoltStore
	stop func()
}

// newDurableEnv starts a gateway like newEnv, on a fake clock at now, with
// the job store at path. synced false leaves the registry not Ready.
func newDurableEnv(t *testing.T, up *upstream, tenants []registry.TenantPolicy, path string, now time.Time, synced bool) *durableEnv {
	t.Helper()
	fc := clocktesting.NewFakeClock(now)
	reg := registry.New(fc)
	pool := registry.PoolPolicy{Name: "pool", BaseURL: up.srv.URL, Models: []registry.ModelPolicy{{Name: testModel, TokensPerMinute: 1000000, RequestsPerMinute: 10000}},
		CostModel: limiter.CostModel{InputWeight: 1, OutputWeight: 1}, DefaultMaxOutputTokens: 4096, UpstreamTimeout: 10 * time.Second}
	if err := reg.SetPool(pool); err != nil {
		t.Fatal(err)
	}
	for _, tp := range tenants {
		if err := reg.UpsertTenant(tp); err != nil {
			t.Fatal(err)
		}
	}
	if synced {
		reg.SetTenantsSynced()
	}
	store, err := jobs.OpenBolt(path, fc, 0, 0, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	prom := prometheus.NewRegistry()
	gw := New(Options{Registry: reg, Clock: fc, Store: store, Rand: func() float64 { return 0 },
		Metrics: metrics.New(prom, func() registry.Snapshot { return reg.Snapshot(fc.Now()) })})
	srv := httptest.NewServer(gw)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = gw.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		<-done
		srv.Close()
		if err := store.Close(); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(stop)
	return &durableEnv{env: &env{t: t, clock: fc, reg: reg, gw: gw, srv: srv, up: up, store: store.MemStore, prom: prom}, bolt: store, stop: stop}
}

// TestRecoverRequeuesInOrderAndCompletesOnce: jobs submitted while the
// model is paused are stored; the scheduler stops; a new one on the same
// file queues them again in submission order with their deadlines, a job
// that was running comes back queued with Recovered set and its attempts
// kept, and every job is sent exactly once.
func TestRecoverRequeuesInOrderAndCompletesOnce(t *testing.T) {
	up := newUpstream(t, okJSON(10, 5))
	tenants := []registry.TenantPolicy{tenant("a", limiter.Limits{}), tenant("b", limiter.Limits{})}
	path := filepath.Join(t.TempDir(), "jobs.db")

	e1 := newDurableEnv(t, up, tenants, path, t0, true)
	e1.pause(10 * time.Second)
	var a, b []string
	for i := range 3 {
		a = append(a, e1.submit("key-a", jobBody(10, 20, "")).ID)
		if i < 2 {
			b = append(b, e1.submit("key-b", jobBody(10, 20, "")).ID)
		}
	}
	for _, id := range append(slices.Clone(a), b...) {
		if !e1.inQueue(id) {
			t.Fatalf("job %s not queued before the restart", id)
		}
	}
	// a[1] was being sent when the process stopped.
	if _, err := e1.bolt.Update(a[1], func(j *jobs.Job) error {
		j.Status, j.Attempts, j.StartedAt, j.DispatchSeq = jobs.StatusRunning, 1, t0, 1
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	e1.stop()
	if n := up.calls.Load(); n != 0 {
		t.Fatalf("%d upstream calls while paused", n)
	}

	e2 := newDurableEnv(t, up, tenants, path, t0.Add(time.Minute), true)
	waitFor(t, "all jobs succeeded", func() bool { return e2.store.Counts()[jobs.StatusSucceeded] == 5 })
	if n := up.calls.Load(); n != 5 {
		t.Errorf("upstream calls: got %d, want 5 (each job exactly once)", n)
	}
	for _, ids := range [][]string{a, b} {
		var seqs []int64
		for _, id := range ids {
			j, err := e2.store.Get(id)
			if err != nil {
				t.Fatal(err)
			}
			seqs = append(seqs, j.DispatchSeq)
			if j.Deadline != t0.Add(time.Hour) {
				t.Errorf("job %s deadline %v, want %v", id, j.Deadline, t0.Add(time.Hour))
			}
		}
		if !slices.IsSortedFunc(seqs, func(x, y int64) int { return int(x - y) }) || slices.Contains(seqs, 0) || len(slices.Compact(slices.Clone(seqs))) != len(seqs) {
			t.Errorf("dispatch order of %v: %v, want increasing", ids, seqs)
		}
	}
	rec, _ := e2.store.Get(a[1])
	if !rec.Recovered || rec.Attempts != 2 || rec.StartedAt != t0 {
		t.Errorf("job running at the stop: recovered %v, attempts %d (want true, 2: one before the stop, one after), started %v",
			rec.Recovered, rec.Attempts, rec.StartedAt)
	}
	for _, id := range []string{a[0], a[2], b[0], b[1]} {
		if j, _ := e2.store.Get(id); j.Recovered || j.Attempts != 1 {
			t.Errorf("job %s: recovered %v, attempts %d, want false, 1", id, j.Recovered, j.Attempts)
		}
	}
	// A second restart finds nothing to do: finished jobs stay finished.
	e2.stop()
	e3 := newDurableEnv(t, up, tenants, path, t0.Add(2*time.Minute), true)
	if d := e3.store.Counts(); d[jobs.StatusSucceeded] != 5 || len(d) != 1 {
		t.Errorf("counts after a second restart: %v", d)
	}
	e3.stop()
	if n := up.calls.Load(); n != 5 {
		t.Errorf("upstream calls after a second restart: %d, want 5", n)
	}
}

// TestRecoverExpiresAndFailsUnknownTenants: at restart a job past its
// deadline is expired (never sent, counted), and a job whose tenant is gone
// is failed with tenant_removed.
func TestRecoverExpiresAndFailsUnknownTenants(t *testing.T) {
	up := newUpstream(t, okJSON(10, 5))
	path := filepath.Join(t.TempDir(), "jobs.db")
	e1 := newDurableEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{}), tenant("c", limiter.Limits{})}, path, t0, true)
	e1.pause(10 * time.Second)
	short := e1.submit("key-a", jobBody(10, 20, `,"deadlineSeconds":30`)).ID
	gone := e1.submit("key-c", jobBody(10, 20, "")).ID
	e1.stop()

	e2 := newDurableEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})}, path, t0.Add(time.Minute), true)
	waitFor(t, "both jobs finished", func() bool { return e2.storeStatus(short).Finished() && e2.storeStatus(gone).Finished() })
	if j, _ := e2.store.Get(short); j.Status != jobs.StatusExpired || j.Error == nil || j.Error.Code != jobCodeDeadline ||
		j.Error.Message != "The job reached its deadline before it could be sent." {
		t.Errorf("short-deadline job: %s %+v", j.Status, j.Error)
	}
	if j, _ := e2.store.Get(gone); j.Status != jobs.StatusFailed || j.Error == nil || j.Error.Code != jobCodeTenantRemoved {
		t.Errorf("job of a removed tenant: %s %+v", j.Status, j.Error)
	}
	if got := e2.reg.Snapshot(e2.clock.Now()).Tenants; len(got) != 1 || got[0].Expired != 1 {
		t.Errorf("tenant snapshot: %+v, want a with 1 expired", got)
	}
	if n := up.calls.Load(); n != 0 {
		t.Errorf("upstream calls: %d, want 0", n)
	}
}

// TestRecoverWaitsForTenantsAndIgnoresLoweredBound: recovery does not
// judge a job's tenant before the registry has synced the TenantQuotas, and
// queues every stored job even when the tenant's bound was lowered meanwhile
// (queued work is never dropped); the bound applies again to new jobs.
func TestRecoverWaitsForTenantsAndIgnoresLoweredBound(t *testing.T) {
	up := newUpstream(t, okJSON(10, 5))
	path := filepath.Join(t.TempDir(), "jobs.db")
	e1 := newDurableEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})}, path, t0, true)
	e1.pause(10 * time.Second)
	var ids []string
	for range 3 {
		ids = append(ids, e1.submit("key-a", jobBody(10, 20, "")).ID)
	}
	e1.stop()

	lowered := tenant("a", limiter.Limits{})
	lowered.MaxQueued = 2
	e2 := newDurableEnv(t, up, []registry.TenantPolicy{lowered}, path, t0.Add(time.Minute), false)
	e2.pause(10 * time.Second)
	waitFor(t, "recovery polling", e2.clock.HasWaiters)
	for _, id := range ids {
		if e2.inQueue(id) || e2.storeStatus(id) != jobs.StatusQueued {
			t.Fatalf("job %s judged before the tenants were synced: in queue %v, status %s", id, e2.inQueue(id), e2.storeStatus(id))
		}
	}
	select {
	case <-e2.gw.Recovered():
		t.Fatal("Recovered closed before the jobs were queued again")
	default:
	}
	e2.reg.SetTenantsSynced()
	e2.clock.Step(recoverPoll)
	waitFor(t, "jobs queued again", func() bool { return e2.inQueue(ids[0]) && e2.inQueue(ids[1]) && e2.inQueue(ids[2]) })
	select {
	case <-e2.gw.Recovered():
	case <-time.After(10 * time.Second):
		t.Fatal("Recovered not closed after the jobs were queued again")
	}
	resp := e2.do("POST", "/v1/jobs", "key-a", jobBody(10, 20, ""))
	if body := readAll(t, resp); resp.StatusCode != 429 || !strings.Contains(string(body), codeQueueFull) {
		t.Errorf("new job over the lowered bound: %d %s, want 429 %s", resp.StatusCode, body, codeQueueFull)
	}
	if n := up.calls.Load(); n != 0 {
		t.Errorf("upstream calls: %d, want 0", n)
	}
}

// TestUndeliveredWebhookDeliveredAfterRestart: a job that finished while
// its completion webhook was still being delivered when the scheduler
// stopped (webhook status pending in the store) is delivered by the next
// scheduler on the same file, once; a delivered one is not sent again.
func TestUndeliveredWebhookDeliveredAfterRestart(t *testing.T) {
	up := newUpstream(t, okJSON(10, 5))
	h := newHookServer(t, 200)
	tenants := []registry.TenantPolicy{tenant("a", limiter.Limits{})}
	path := filepath.Join(t.TempDir(), "jobs.db")

	e1 := newDurableEnv(t, up, tenants, path, t0, true)
	cut, err := e1.bolt.Create(jobs.Job{Tenant: "a", Status: jobs.StatusSucceeded, Endpoint: endpointCompletions, Model: testModel,
		CreatedAt: t0, FinishedAt: t0, Deadline: t0.Add(time.Hour), WebhookURL: h.srv.URL, WebhookStatus: jobs.WebhookPending, WebhookAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	done, err := e1.bolt.Create(jobs.Job{Tenant: "a", Status: jobs.StatusSucceeded, Endpoint: endpointCompletions, Model: testModel,
		CreatedAt: t0, FinishedAt: t0, Deadline: t0.Add(time.Hour), WebhookURL: h.srv.URL, WebhookStatus: "delivered", WebhookAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	e1.stop()

	e2 := newDurableEnv(t, up, tenants, path, t0.Add(time.Minute), true)
	waitWebhook(t, e2.env, cut.ID, "delivered")
	calls := h.calls()
	if len(calls) != 1 || calls[0].jobID != cut.ID {
		t.Errorf("webhook calls %+v, want exactly one for %s (not %s)", calls, cut.ID, done.ID)
	}
}

// TestUndeliveredWebhookWaitsForTenantsAfterRestart: a scheduler that
// restarts with no job to queue again but a completion webhook still to
// deliver waits for its tenants to be loaded before delivering it: a
// delivery tried before the TenantQuotas were synced found no tenant, took
// it as removed and marked the webhook failed for good.
func TestUndeliveredWebhookWaitsForTenantsAfterRestart(t *testing.T) {
	up := newUpstream(t, okJSON(10, 5))
	h := newHookServer(t, 200)
	tenants := []registry.TenantPolicy{tenant("a", limiter.Limits{})}
	path := filepath.Join(t.TempDir(), "jobs.db")

	e1 := newDurableEnv(t, up, tenants, path, t0, true)
	cut, err := e1.bolt.Create(jobs.Job{Tenant: "a", Status: jobs.StatusSucceeded, Endpoint: endpointCompletions, Model: testModel,
		CreatedAt: t0, FinishedAt: t0, Deadline: t0.Add(time.Hour), WebhookURL: h.srv.URL, WebhookStatus: jobs.WebhookPending, WebhookAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	e1.stop()

	e2 := newDurableEnv(t, up, nil, path, t0.Add(time.Minute), false) // TenantQuotas not synced yet
	webhookStatus := func() string {
		j, _ := e2.store.Get(cut.ID)
		return j.WebhookStatus
	}
	waitFor(t, "recovery polling or a delivery attempt", func() bool {
		return e2.clock.HasWaiters() || webhookStatus() != jobs.WebhookPending
	})
	if j, err := e2.store.Get(cut.ID); err != nil || j.WebhookStatus != jobs.WebhookPending {
		t.Fatalf("webhook status before the tenants were loaded: %q, %v; want %q", j.WebhookStatus, err, jobs.WebhookPending)
	}
	if err := e2.reg.UpsertTenant(tenants[0]); err != nil {
		t.Fatal(err)
	}
	e2.reg.SetTenantsSynced()
	e2.clock.Step(recoverPoll)
	waitWebhook(t, e2.env, cut.ID, "delivered")
	if calls := h.calls(); len(calls) != 1 || calls[0].jobID != cut.ID {
		t.Errorf("webhook calls %+v, want exactly one for %s", calls, cut.ID)
	}
}

// TestWebhookOfJobFinishedAtShutdownDeliveredAfterRestart: a job finished
// (here cancelled) while the scheduler stops, after its webhook notifier has
// stopped, has its webhook delivered by the next scheduler: the finishing
// write records it pending. It used to be left without a webhook status,
// which a restart does not deliver (and which the API showed as pending
// for ever).
func TestWebhookOfJobFinishedAtShutdownDeliveredAfterRestart(t *testing.T) {
	up := newUpstream(t, okJSON(10, 5))
	h := newHookServer(t, 200)
	tenants := []registry.TenantPolicy{tenant("a", limiter.Limits{})}
	path := filepath.Join(t.TempDir(), "jobs.db")

	e1 := newDurableEnv(t, up, tenants, path, t0, true)
	e1.pause(time.Minute)
	dequeued := e1.trackDequeued()
	id := e1.submit("key-a", jobBody(10, 20, `,"webhookURL":"`+h.srv.URL+`"`)).ID
	e1.waitPutBack(t, dequeued, id)
	e1.gw.hooks.stop() // the scheduler is stopping
	if resp := e1.do("DELETE", "/v1/jobs/"+id, "key-a", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("cancel: %d", resp.StatusCode)
	}
	e1.stop()
	if n := len(h.calls()); n != 0 {
		t.Fatalf("webhook calls before the restart: %d", n)
	}

	e2 := newDurableEnv(t, up, tenants, path, t0.Add(time.Minute), true)
	waitWebhook(t, e2.env, id, "delivered")
	if calls := h.calls(); len(calls) != 1 || calls[0].jobID != id || calls[0].view.Status != jobs.StatusCancelled {
		t.Errorf("webhook calls %+v, want one for the cancelled job %s", calls, id)
	}
}

// TestShutdownMidCallRequeuesAsRecovered: a job whose upstream call is in
// flight when the scheduler stops goes back to the store queued, with the
// attempt counted and Recovered set: the provider may have processed the
// call, and the next scheduler sends it again (at-least-once). It was once
// stored as never attempted and not recovered, so a job the provider got
// twice looked as if it had been sent once.
func TestShutdownMidCallRequeuesAsRecovered(t *testing.T) {
	entered := make(chan struct{}, 1)
	var first atomic.Bool
	first.Store(true)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if first.Swap(false) {
			entered <- struct{}{}
			<-r.Context().Done() // until the stopping scheduler gives up the call
			return
		}
		okJSON(10, 5)(w, r, body)
	})
	tenants := []registry.TenantPolicy{tenant("a", limiter.Limits{})}
	path := filepath.Join(t.TempDir(), "jobs.db")
	e1 := newDurableEnv(t, up, tenants, path, t0, true)
	id := e1.submit("key-a", jobBody(10, 20, "")).ID
	<-entered
	e1.stop()
	j, err := e1.store.Get(id)
	if err != nil || j.Status != jobs.StatusQueued || j.Attempts != 1 || !j.Recovered {
		t.Fatalf("stored after the stop: %+v, %v; want queued, 1 attempt, recovered", j, err)
	}
	e2 := newDurableEnv(t, up, tenants, path, t0.Add(time.Second), true)
	waitFor(t, "the job to succeed", func() bool { return e2.storeStatus(id) == jobs.StatusSucceeded })
	got := e2.job("key-a", id)
	if n := up.calls.Load(); n != 2 || got.Attempts != 2 || !got.Recovered {
		t.Errorf("upstream calls %d, job attempts %d, recovered %v; want 2, 2, true", n, got.Attempts, got.Recovered)
	}
}

// TestRecoverExpiredAfterAnAttemptSaysSo: a job whose call a stopping
// scheduler cut off, restarted after its deadline, is expired with a
// message that counts its attempt (it once said the job had never been
// sent).
func TestRecoverExpiredAfterAnAttemptSaysSo(t *testing.T) {
	entered := make(chan struct{}, 1)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		entered <- struct{}{}
		<-r.Context().Done()
	})
	tenants := []registry.TenantPolicy{tenant("a", limiter.Limits{})}
	path := filepath.Join(t.TempDir(), "jobs.db")
	e1 := newDurableEnv(t, up, tenants, path, t0, true)
	id := e1.submit("key-a", jobBody(10, 20, `,"deadlineSeconds":30`)).ID
	<-entered
	e1.stop()
	e2 := newDurableEnv(t, up, tenants, path, t0.Add(time.Minute), true)
	waitFor(t, "the job to finish", func() bool { return e2.storeStatus(id).Finished() })
	want := "The job reached its deadline before it could be sent again (attempts: 1)."
	if j, _ := e2.store.Get(id); j.Status != jobs.StatusExpired || j.Error == nil || j.Error.Code != jobCodeDeadline || j.Error.Message != want {
		t.Errorf("job: %s %+v, want expired %q", j.Status, j.Error, want)
	}
}

// TestDispatchSeqContinuesAfterRestart: a scheduler restarted on a durable
// job store numbers its dispatches after the largest dispatch_seq stored,
// so that dispatch_seq orders the pool's calls across the restart; it
// started again at 1.
func TestDispatchSeqContinuesAfterRestart(t *testing.T) {
	up := newUpstream(t, okJSON(10, 5))
	tenants := []registry.TenantPolicy{tenant("a", limiter.Limits{})}
	path := filepath.Join(t.TempDir(), "jobs.db")

	e1 := newDurableEnv(t, up, tenants, path, t0, true)
	var first []string
	for range 3 {
		first = append(first, e1.submit("key-a", jobBody(10, 20, "")).ID)
	}
	waitFor(t, "three jobs succeeded", func() bool { return e1.store.Counts()[jobs.StatusSucceeded] == 3 })
	e1.stop()

	e2 := newDurableEnv(t, up, tenants, path, t0.Add(time.Minute), true)
	id := e2.submit("key-a", jobBody(10, 20, "")).ID
	waitFor(t, "the fourth job succeeded", func() bool { return e2.store.Counts()[jobs.StatusSucceeded] == 4 })
	var seqs []int64
	for _, id := range append(first, id) {
		j, err := e2.store.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, j.DispatchSeq)
	}
	if want := []int64{1, 2, 3, 4}; !slices.Equal(seqs, want) {
		t.Errorf("dispatch_seq of the jobs before and after the restart: %v, want %v", seqs, want)
	}
}
