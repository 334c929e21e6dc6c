package gateway

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairshare-dev/fairshare/internal/fairqueue"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// A batch backlog fills at most the upstream slots outside the pool's
// reserve (4 slots, reserve 25%: 3), so an interactive call still finds a
// slot instead of a 503 pool_concurrency_limit; once no interactive call has
// arrived for BorrowAfter, batch fills the reserved slot too.
func TestBatchLeavesReservedSlotsToInteractive(t *testing.T) {
	release := make(chan struct{})
	var inUpstream atomic.Int64
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		inUpstream.Add(1)
		<-release
		okJSON(10, 5)(w, r, body)
	})
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{}), tenant("b", limiter.Limits{})},
		withConcurrency(4), withPool(func(p *registry.PoolPolicy) {
			p.ReservePercent = 25
			p.BorrowAfter = time.Minute
		}))
	for range 6 {
		e.submit("key-a", jobBody(10, 5, ""))
	}
	waitFor(t, "3 jobs upstream", func() bool { return inUpstream.Load() == 3 })
	time.Sleep(50 * time.Millisecond) // a fourth start would be upstream by now (evidence only; asserted below)
	if got := inUpstream.Load(); got != 3 {
		t.Fatalf("%d batch calls upstream, want 3 (one of 4 slots reserved)", got)
	}

	done := make(chan *http.Response)
	go func() { done <- e.do("POST", "/v1/completions", "key-b", completionsBody(10, 5, "")) }()
	waitFor(t, "the interactive call upstream", func() bool { return inUpstream.Load() == 4 })
	release <- struct{}{} // one call answers: either may be first
	close(release)
	resp := <-done
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("interactive call: %d %s, want 200", resp.StatusCode, readAll(t, resp))
	}
	readAll(t, resp)
	waitFor(t, "the backlog drained", func() bool { return inUpstream.Load() == 7 })
}

// After BorrowAfter without an interactive call, batch fills every slot.
func TestBatchBorrowsReservedSlots(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	var inUpstream atomic.Int64
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		inUpstream.Add(1)
		<-release
		okJSON(10, 5)(w, r, body)
	})
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})},
		withConcurrency(4), withPool(func(p *registry.PoolPolicy) {
			p.ReservePercent = 25
			p.BorrowAfter = time.Minute
		}))
	for range 6 {
		e.submit("key-a", jobBody(10, 5, ""))
	}
	waitFor(t, "3 jobs upstream", func() bool { return inUpstream.Load() == 3 })
	e.clock.Step(time.Minute)
	waitFor(t, "the reserved slot borrowed", func() bool { return inUpstream.Load() == 4 })
}

// An interactive call that ends while no job is queued does not wake the
// dispatcher: its freed slot can start nothing, and a pass per call (a
// goroutine wake-up) was the largest part of the gateway's own cost per
// small call. Once a job is queued, the end of a call wakes it again.
func TestInteractiveCallWakesDispatcherOnlyWhenJobsWait(t *testing.T) {
	up := newUpstream(t, okJSON(10, 5))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
	d := e.gw.dispatch
	waitFor(t, "the dispatcher's first pass", func() bool { return d.passes.Load() >= 1 && !d.jobsWaiting.Load() })
	before := d.passes.Load()
	for range 20 {
		resp := e.do("POST", "/v1/completions", "key-a", completionsBody(10, 5, ""))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("interactive call: %d %s", resp.StatusCode, readAll(t, resp))
		}
		readAll(t, resp)
	}
	time.Sleep(20 * time.Millisecond) // a pass woken by the last call would have run by now (evidence only)
	if got := d.passes.Load() - before; got != 0 {
		t.Fatalf("%d dispatcher passes after 20 interactive calls with no job queued, want 0", got)
	}
	if !d.jobsWaiting.CompareAndSwap(false, true) {
		t.Fatal("jobsWaiting set with an empty queue")
	}
	before = d.passes.Load()
	resp := e.do("POST", "/v1/completions", "key-a", completionsBody(10, 5, ""))
	readAll(t, resp)
	waitFor(t, "a pass woken by the call's end", func() bool { return d.passes.Load() > before })
}

// A job that waits for its tenant's concurrency (an interactive call of the
// same tenant holds it) starts as soon as that call ends, without the
// clock moving: the end of the call wakes the dispatcher because the job is
// queued.
func TestJobStartsWhenTenantCallEnds(t *testing.T) {
	release := make(chan struct{})
	var inUpstream atomic.Int64
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		inUpstream.Add(1)
		<-release
		okJSON(10, 5)(w, r, body)
	})
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{MaxConcurrent: i64(1)})})
	done := make(chan *http.Response)
	go func() { done <- e.do("POST", "/v1/completions", "key-a", completionsBody(10, 5, "")) }()
	waitFor(t, "the interactive call upstream", func() bool { return inUpstream.Load() == 1 })
	job := e.submit("key-a", jobBody(10, 5, ""))
	waitFor(t, "a pass that leaves the job queued", func() bool { return e.gw.dispatch.jobsWaiting.Load() })
	time.Sleep(20 * time.Millisecond) // the job would be upstream by now (evidence only; asserted below)
	if got := inUpstream.Load(); got != 1 {
		t.Fatalf("%d calls upstream while the tenant's one concurrency slot is held, want 1", got)
	}
	release <- struct{}{}
	resp := <-done
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("interactive call: %d %s", resp.StatusCode, readAll(t, resp))
	}
	readAll(t, resp)
	waitFor(t, "the job upstream", func() bool { return inUpstream.Load() == 2 })
	close(release)
	waitFor(t, "the job succeeded", func() bool { return e.storeStatus(job.ID) == "succeeded" })
}

// An interactive call refused after its tenant's admission (here by the
// paused model's throttle) gives back the tenant's concurrency it held for
// a moment, which a queued job of the tenant may have been refused for:
// while jobs are queued the refusal wakes the dispatcher.
func TestInteractiveRefusalWakesDispatcherWhileJobsWait(t *testing.T) {
	up := newUpstream(t, okJSON(10, 5))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{MaxConcurrent: i64(1)})})
	d := e.gw.dispatch
	e.pause(time.Minute)
	e.submit("key-a", jobBody(10, 5, ""))
	waitFor(t, "a pass that leaves the job queued", func() bool {
		var total int
		e.reg.WithQueue(func(q *fairqueue.Queue) { total = q.Total() })
		return total == 1 && d.jobsWaiting.Load() && len(d.wakeCh) == 0
	})
	time.Sleep(20 * time.Millisecond) // let that pass end (evidence only)
	before := d.passes.Load()
	resp := e.do("POST", "/v1/completions", "key-a", completionsBody(10, 5, ""))
	if b := readAll(t, resp); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("interactive call: %d %s, want 503 while the model is paused", resp.StatusCode, b)
	}
	waitFor(t, "a pass woken by the refusal", func() bool { return d.passes.Load() > before })
}
