package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairshare-dev/fairshare/internal/fairqueue"
	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/throttle"
)

// Dispatcher timing.
const (
	// sweepInterval is how often, while jobs are queued, the dispatcher
	// wakes to expire jobs past their deadline (BC-35, BC-37: expiry is
	// noticed within one interval).
	sweepInterval = time.Second
	// retryBase and retryCap bound the exponential backoff of a job after an
	// upstream 5xx or timeout: base * 2^(attempts-1), capped, then jittered
	// into [d/2, d].
	retryBase = time.Second
	retryCap  = time.Minute
	// storeRetry is how long the dispatcher holds the starts of a model
	// after the job store failed to record one.
	storeRetry = time.Second
)

// Job error codes.
const (
	jobCodeDeadline      = "deadline_exceeded"
	jobCodeTenantRemoved = "tenant_removed"
	jobCodeModelRemoved  = "model_not_found"
	jobCodeUpstream      = "upstream_error"
	jobCodeCancelled     = "cancelled"
	// jobCodeInternal: the scheduler failed while running the job (a
	// recovered panic); the job is not retried, since it would fail again.
	jobCodeInternal = "internal_error"
)

// errJobNotQueued refuses to start a job whose record is no longer queued.
var errJobNotQueued = errors.New("job is no longer queued")

// errJobFinished refuses to change the terminal status of a finished job.
var errJobFinished = errors.New("job is already finished")

// retry is a job waiting for its backoff to pass before it is put back at
// its tenant's head.
type retry struct {
	job *fairqueue.Job
	at  time.Time
}

// dispatcher drains the fair queue to the provider (seed 000 "Two paths,
// one quota", batch half). One goroutine runs passes; each upstream call
// runs in its own goroutine and wakes the loop when it ends.
type dispatcher struct {
	g      *Gateway
	wakeCh chan struct{}
	seq    atomic.Int64
	wg     sync.WaitGroup

	// jobsWaiting is true from the start of a pass until a pass ends with
	// the fair queue empty. A call that ends (Gateway.release) wakes the
	// loop only while it is true: its freed upstream slot or tenant
	// concurrency can start nothing when no job is queued, and a pass per
	// interactive call (a goroutine wake-up, often a thread's) was the
	// largest part of the gateway's own cost per small call. A job queued
	// later wakes the loop itself (Gateway.submit, requeue, retry, recover).
	// Stored at a pass's start, before it reads the free slots, and loaded
	// by release after it frees one, so a slot freed during a pass is
	// either seen by that pass or followed by a wake.
	jobsWaiting atomic.Bool
	// passes counts the loop's passes (tests).
	passes atomic.Int64

	mu      sync.Mutex
	retries map[string]retry

	// unrecorded holds, by job ID (or "webhook " and the job ID), the store
	// writes that failed and must not be lost (a job's terminal status, the
	// removal of a refused submission, a webhook's state), and unrecordedAt when the next pass writes them again
	// (storeRetry after the oldest of them failed); guarded by mu. A job whose
	// terminal status is not recorded yet has left the dispatcher and
	// reads as before (running, queued) until the write succeeds.
	unrecorded   map[string]kept
	unrecordedAt time.Time

	// held counts, per tenant, the jobs the loop has taken out of the fair
	// queue and not yet sent, finished or put back (and the jobs a
	// cancellation took out until it is recorded); guarded by the queue
	// lock (read and written only inside Registry.WithQueue). They still
	// count toward the tenant's queue bound: a submission that found the
	// slot of a dequeued job free would otherwise push the tenant over its
	// bound when the job is put back (Requeue ignores bounds).
	held map[string]int

	// retrying counts, per tenant, the jobs waiting for a retry backoff
	// (in retries), and retryingTotal all of them; guarded by the queue
	// lock like held. They are queued jobs (their status says so) and
	// count toward the tenant's and the pool's queue bounds: a tenant's
	// submissions during a provider outage would otherwise pile up without
	// bound while its earlier jobs wait to be retried. Incremented before
	// the job enters retries and decremented after it leaves, so the count
	// is never below the jobs waiting.
	retrying      map[string]int
	retryingTotal int

	// byID holds every job handed to the fair queue and not yet finished
	// (queued, dequeued, running or waiting for a retry), by job ID, so that
	// a cancellation by ID finds the *fairqueue.Job (the queue keeps no ID
	// index). Guarded by the queue lock, like held; entries are added when
	// the job is enqueued and dropped when it reaches a terminal status.
	byID map[string]*fairqueue.Job

	// pricedWith is the cost model (normalized) in whose weighted tokens
	// the jobs in the fair queue are priced, zero before the first pass;
	// guarded by the queue lock. A pass that finds the pool's cost model
	// changed reprices every queued job (repriceLocked), so that the queue
	// shares by the cost model in force, as the limiter charges at
	// dispatch, not by each job's cost at submission.
	pricedWith limiter.CostModel

	// dequeuedHook, when set (tests), runs in the loop right after a job is
	// taken out of the queue, before it is started; no lock is held.
	dequeuedHook atomic.Pointer[func(*fairqueue.Job)]

	// blocked: model -> time until which its throttle refuses batch starts
	// (paused after a 429, or at the reserve). Only the loop goroutine uses
	// it; it spares a Dequeue/Requeue per pass while a model is paused.
	blocked map[string]time.Time
}

func newDispatcher(g *Gateway) *dispatcher {
	d := &dispatcher{g: g, wakeCh: make(chan struct{}, 1), retries: map[string]retry{}, unrecorded: map[string]kept{}, held: map[string]int{}, retrying: map[string]int{}, byID: map[string]*fairqueue.Job{}, blocked: map[string]time.Time{}}
	d.jobsWaiting.Store(true) // until the first pass looks
	return d
}

// unholdLocked releases the bound slot of one job of tenant taken out by
// the loop; the queue lock must be held.
func (d *dispatcher) unholdLocked(tenant string) {
	if d.held[tenant] <= 1 {
		delete(d.held, tenant)
		return
	}
	d.held[tenant]--
}

// heldTotalLocked is the number of jobs of all tenants counted in held;
// the queue lock must be held.
func (d *dispatcher) heldTotalLocked() int {
	n := 0
	for _, c := range d.held {
		n += c
	}
	return n
}

// trackLocked records a job just enqueued in the fair queue; the queue lock
// must be held.
func (d *dispatcher) trackLocked(fj *fairqueue.Job) { d.byID[fj.ID] = fj }

// cancelLocked removes the job with the given ID from the fair queue and
// reports whether it was queued there (false: unknown, dequeued, running or
// waiting for a retry); the queue lock must be held.
func (d *dispatcher) cancelLocked(q *fairqueue.Queue, id string) bool {
	fj := d.byID[id]
	if fj == nil || !q.Cancel(fj) {
		return false
	}
	delete(d.byID, id)
	return true
}

// queueCostLocked is the fair-queue Cost of a job about to be queued: its
// weighted tokens under the cost model the queued jobs are priced in (the
// pool's, before the first pass). The queue lock must be held.
func (d *dispatcher) queueCostLocked(qd *queued, pool *registry.PoolPolicy) int64 {
	if d.pricedWith != (limiter.CostModel{}) {
		return qd.queueCost(d.pricedWith)
	}
	return qd.queueCost(pool.CostModel)
}

// repriceLocked prices every queued job in the pool's cost model when it is
// not the one they are priced in: two identical jobs then cost the same in
// the fair queue whichever came first. O(jobs), once per change of the cost
// model; jobs out of the queue keep the cost they were charged until they
// are put back (requeueLocked). The queue lock must be held.
func (d *dispatcher) repriceLocked(q *fairqueue.Queue, pool *registry.PoolPolicy) {
	m := pool.CostModel.Normalized()
	if m == d.pricedWith {
		return
	}
	for _, fj := range d.byID {
		q.SetCost(fj, fj.Value.(*queued).queueCost(m))
	}
	d.pricedWith = m
}

// requeueLocked puts a job taken out of the queue back at its tenant's head
// (fairqueue.Queue.Requeue gives back the deficit it was charged) and
// prices it in the queue's cost model, which may have changed while it was
// out. The queue lock must be held.
func (d *dispatcher) requeueLocked(q *fairqueue.Queue, fj *fairqueue.Job) {
	q.Requeue(fj)
	if d.pricedWith != (limiter.CostModel{}) {
		q.SetCost(fj, fj.Value.(*queued).queueCost(d.pricedWith))
	}
}

// removal is why a job out of the queue may not go back (removedWhy).
type removal struct{ code, why string }

// removedWhy reports whether the tenant or the model of a job that is out
// of the queue (being started, sent, or waiting to go back) was removed
// meanwhile, and why. The removal's scan (tenantRemoved, modelRemoved)
// runs after the registry has committed the removal and sees only the jobs
// in the queue, waiting for a retry or stored queued at that instant, so
// each path that puts a job back (a requeue, the end of a retry backoff, a
// retry scheduled) checks the registry once the job is where the scan
// looks, and fails the job itself (failRemoved) when it finds the removal.
// It reads only the registry: callers may hold the queue lock.
func (d *dispatcher) removedWhy(fj *fairqueue.Job) (removal, bool) {
	if d.g.reg.Tenant(fj.Tenant) == nil {
		return removal{jobCodeTenantRemoved, "The tenant's TenantQuota was removed"}, true
	}
	if model := fj.Value.(*queued).model; d.g.reg.Model(model) == nil {
		return removal{jobCodeModelRemoved, fmt.Sprintf("The model %q is no longer served by the pool", model)}, true
	}
	return removal{}, false
}

// failRemoved fails a job whose tenant or model was removed while it was
// out of the queue (removedWhy), unsent (again).
func (d *dispatcher) failRemoved(now time.Time, fj *fairqueue.Job, r removal) {
	d.finish(now, fj.ID, fj.Tenant, jobs.StatusFailed, unsentError(r.code, r.why, d.attemptsOf(fj.ID)))
}

// forget drops a finished job from byID.
func (d *dispatcher) forget(id string) {
	d.g.reg.WithQueue(func(*fairqueue.Queue) { delete(d.byID, id) })
}

// queuedLocked is the number of the tenant's jobs that count toward its
// queue bound: queued plus taken out by the loop and not yet sent. The
// queue lock must be held.
func (d *dispatcher) queuedLocked(q *fairqueue.Queue, tenant string) int {
	return q.Len(tenant) + d.held[tenant] + d.retrying[tenant]
}

// queuedOutsideLocked reports the jobs waiting for a retry backoff, per
// tenant and in all: queued jobs (their status says so) that are not in the
// fair queue, for the backlog figures (Registry.SetQueuedOutside). The
// queue lock must be held.
func (d *dispatcher) queuedOutsideLocked() (map[string]int, int) {
	return d.retrying, d.retryingTotal
}

// unretryLocked releases the bound slot of a job of tenant that left
// retries (requeued, cancelled or failed); the queue lock must be held.
func (d *dispatcher) unretryLocked(tenant string) {
	if d.retrying[tenant] <= 1 {
		delete(d.retrying, tenant)
	} else {
		d.retrying[tenant]--
	}
	d.retryingTotal = max(d.retryingTotal-1, 0)
}

// wakeIfWaiting wakes the loop when jobs may be waiting for what a call
// just released (a slot, tenant concurrency): see jobsWaiting.
func (d *dispatcher) wakeIfWaiting() {
	if d.jobsWaiting.Load() {
		d.wake()
	}
}

// wake asks the loop for a pass (non-blocking, coalesced).
func (d *dispatcher) wake() {
	select {
	case d.wakeCh <- struct{}{}:
	default:
	}
}

// run loops until ctx is cancelled: a pass, then sleep until woken or until
// the earliest time something can change (a tenant's refill, a model's
// pause end, a retry backoff, the next sweep).
//
// When that time has already come by the clock once the pass is over, or
// comes while the timer is being made (the clock read and the timer's own
// start are two steps), the next pass runs at once instead of after a
// timer: a timer started after its time is due fires a millisecond, or the
// whole wait, after that time, which a clock that moves only by steps (the
// injected clock of tests) may never reach. At most one such pass runs in a row,
// then the timer waits at least a millisecond, so a pass that keeps
// returning a time already due cannot spin.
func (d *dispatcher) run(ctx context.Context) error {
	defer func() {
		d.wg.Wait()
		// Last chance for the store writes kept for a retry (the store is
		// closed after Run returns): a terminal status lost here leaves
		// the job running in the store, sent again by the next scheduler.
		d.writeUnrecorded(time.Time{})
	}()
	immediate := false
	for {
		next := d.pass(ctx)
		var timer <-chan time.Time
		var stop func() bool
		if !next.IsZero() {
			if !immediate && !next.After(d.g.clock.Now()) {
				immediate = true
				continue
			}
			t := d.g.clock.NewTimer(max(next.Sub(d.g.clock.Now()), time.Millisecond))
			if !immediate && !next.After(d.g.clock.Now()) {
				t.Stop()
				immediate = true
				continue
			}
			timer, stop = t.C(), t.Stop
		}
		immediate = false
		select {
		case <-ctx.Done():
			if stop != nil {
				stop()
			}
			return nil
		case <-d.wakeCh:
		case <-timer:
		}
		if stop != nil {
			stop()
		}
	}
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// doomed is a job taken out of the queue during a pass without being sent.
type doomed struct {
	job    *fairqueue.Job
	status jobs.Status
	err    jobs.Error
}

// pass runs one dispatch pass at the clock's now and returns when the loop
// should wake up by itself (zero: only when woken).
func (d *dispatcher) pass(ctx context.Context) (wakeAt time.Time) {
	g := d.g
	d.passes.Add(1)
	d.jobsWaiting.Store(true)
	g.slotsFreed.Load() // orders this pass's reads of len(g.sem) after the store (Gateway.slotsFreed)
	now := g.clock.Now()

	// Store writes that failed, written again once storeRetry has passed.
	wakeAt = d.writeUnrecorded(now)

	// Backoffs that have passed: back at the tenant's head.
	d.mu.Lock()
	var due []*fairqueue.Job
	for id, rt := range d.retries {
		if !rt.at.After(now) {
			due = append(due, rt.job)
			delete(d.retries, id)
		} else {
			wakeAt = earliest(wakeAt, rt.at)
		}
	}
	d.mu.Unlock()
	if len(due) > 0 {
		type gone struct {
			job *fairqueue.Job
			why removal
		}
		var removed []gone
		g.reg.WithQueue(func(q *fairqueue.Queue) {
			for _, j := range due {
				d.unretryLocked(j.Tenant)
				if r, ok := d.removedWhy(j); ok {
					removed = append(removed, gone{j, r})
					continue
				}
				d.requeueLocked(q, j)
			}
		})
		for _, r := range removed {
			d.failRemoved(now, r.job, r.why)
		}
	}

	var expired []*fairqueue.Job
	pool := g.reg.Pool()
	g.reg.WithQueue(func(q *fairqueue.Queue) {
		expired = q.Sweep(now)
		if pool != nil {
			d.repriceLocked(q, pool)
		}
	})
	d.expire(now, expired)
	if pool == nil {
		// No pool policy (not loaded yet, or the ProviderPool was deleted):
		// jobs wait, and still expire at their deadline.
		return earliest(wakeAt, now.Add(sweepInterval))
	}

	blocked := d.blocked
	for m, until := range blocked {
		if !until.After(now) {
			delete(blocked, m)
		} else {
			wakeAt = earliest(wakeAt, until)
		}
	}
	skip := map[string]bool{} // tenants whose admission raced this pass
	for ctx.Err() == nil {
		// Each job is admitted, started and timed (StartedAt, queue wait)
		// at its own time: one pass may start many jobs, each with a store
		// write, and the pass's start would be early by the pass's length.
		now = g.clock.Now()
		if slots, borrowAt := d.batchSlots(now); len(g.sem) >= slots {
			// Woken when a slot is released, or when borrowing the
			// reserved slots begins.
			wakeAt = earliest(wakeAt, borrowAt)
			break
		}
		var out []doomed
		eligible := func(tenant string, head *fairqueue.Job) fairqueue.Eligibility {
			qd := head.Value.(*queued)
			// The job's charge under the cost model in force, as admit
			// will charge it (not its charge at submission).
			cost := qd.costUnder(pool.CostModel)
			if _, ok := blocked[qd.model]; ok {
				// The model's throttle refuses batch starts until then. A
				// job whose deadline comes first stays queued and expires
				// at its deadline, unsent (BC-37), not before: unless the
				// provider paused the model the wait is an estimate, which
				// refunds and the end of the interactive reserve shorten.
				return fairqueue.Ineligible
			}
			// TenantIneligible where no job of the tenant could start
			// either (its concurrency or request rate binds: the limiter
			// checks them after the job's size, KV blocks and tokens), so
			// that the queue's lookahead (queueingStrategy BestEffortFIFO)
			// does not test its next jobs in vain; Ineligible where a
			// smaller job, or one for another model, might. A refusal that
			// is not retryable (suspension, a job larger than the bucket)
			// fails the job, and the lookahead goes on to the next, which
			// fails as well under suspension.
			if skip[tenant] {
				return fairqueue.TenantIneligible
			}
			t := g.reg.Tenant(tenant)
			if t == nil {
				out = append(out, doomed{head, jobs.StatusFailed, jobs.Error{Code: jobCodeTenantRemoved, Message: "The tenant's TenantQuota was removed."}})
				return fairqueue.TenantIneligible
			}
			if ok, resetIn, st := t.CheckBudget(now, cost.Weighted); !ok && !t.Policy().DryRun {
				if b := t.Policy().Budget; b != nil && cost.Weighted > b.WeightedTokens {
					// Larger than the whole budget (lowered since the job
					// was queued): no period will ever admit it (BC-10), as
					// submission would now answer.
					e := budgetError(resetIn, st, b, cost.Weighted)
					out = append(out, doomed{head, jobs.StatusFailed, jobs.Error{Code: e.code, Message: e.message}})
					return fairqueue.Ineligible
				}
				wakeAt = earliest(wakeAt, now.Add(resetIn))
				return fairqueue.Ineligible
			}
			if ok, over := t.Limiter.Eligible(now, cost); ok {
				if over {
					// Over a soft limit: it may start, with a quarter of its
					// share (TenantQuota enforcement Soft; seed 002 section 5).
					return fairqueue.Deprioritised
				}
				return fairqueue.Eligible
			}
			rej := t.Limiter.Check(now, cost)
			if rej == nil {
				return fairqueue.Eligible // a refill between the two calls
			}
			if !rej.Retryable {
				out = append(out, doomed{head, jobs.StatusFailed, jobs.Error{Code: string(rej.Reason),
					Message: "The job can no longer be admitted under the tenant's limits."}})
				return fairqueue.Ineligible
			}
			if rej.RetryAfter > 0 {
				wakeAt = earliest(wakeAt, now.Add(rej.RetryAfter))
			}
			switch rej.Reason {
			case limiter.ReasonConcurrency, limiter.ReasonRequestRate:
				return fairqueue.TenantIneligible
			}
			return fairqueue.Ineligible
		}
		var next *fairqueue.Job
		g.reg.WithQueue(func(q *fairqueue.Queue) {
			next, expired = q.DequeueWith(now, eligible)
			if next != nil {
				d.held[next.Tenant]++ // released by start
			}
			// A job examined twice in one DequeueWith is doomed once.
			kept := out[:0]
			for _, o := range out {
				if q.Cancel(o.job) {
					kept = append(kept, o)
				}
			}
			out = kept
		})
		if h := d.dequeuedHook.Load(); h != nil && next != nil {
			(*h)(next)
		}
		d.expire(now, expired)
		for _, o := range out {
			d.finish(now, o.job.ID, o.job.Tenant, o.status, o.err)
		}
		if next == nil {
			if len(out) > 0 || len(expired) > 0 {
				continue
			}
			break
		}
		if wait, ok := d.start(ctx, now, next); !ok {
			qd := next.Value.(*queued)
			switch {
			case wait > 0:
				blocked[qd.model] = now.Add(wait)
				wakeAt = earliest(wakeAt, now.Add(wait))
			case wait == 0:
				skip[next.Tenant] = true
			default: // the job left the queue (failed or expired)
			}
		}
	}
	var total int
	g.reg.WithQueue(func(q *fairqueue.Queue) {
		// Under the queue lock: a job enqueued after this read wakes the
		// loop itself.
		total = q.Total()
		d.jobsWaiting.Store(total > 0)
	})
	if total > 0 {
		wakeAt = earliest(wakeAt, now.Add(sweepInterval))
	}
	return wakeAt
}

// start admits and sends one dequeued job. When it cannot start now it
// either puts the job back at its tenant's head and returns ok false with
// wait > 0 (the model's throttle refused for wait) or wait == 0 (the tenant
// or the pool is at a limit), or finishes the job and returns wait < 0.
func (d *dispatcher) start(ctx context.Context, now time.Time, fj *fairqueue.Job) (time.Duration, bool) {
	g := d.g
	qd := fj.Value.(*queued)
	// The job holds its tenant's bound slot until it is sent, finished or
	// put back (put back and released under one lock, so a submission never
	// sees the slot free in between).
	held := true
	defer func() {
		if held {
			g.reg.WithQueue(func(*fairqueue.Queue) { d.unholdLocked(fj.Tenant) })
		}
	}()
	// requeue puts the job back at the head of its tenant's queue, unless
	// its tenant or its model was removed while the job was out of the
	// queue: the removal's scan (tenantRemoved, modelRemoved) could not see
	// it then, so it is failed here. The check runs under the queue lock,
	// which the scan also takes, so every job is either seen by the scan or
	// failed here.
	requeue := func() {
		held = false
		var r removal
		gone := false
		g.reg.WithQueue(func(q *fairqueue.Queue) {
			d.unholdLocked(fj.Tenant)
			if r, gone = d.removedWhy(fj); !gone {
				d.requeueLocked(q, fj)
			}
		})
		if gone {
			d.failRemoved(now, fj, r)
		}
	}
	// BC-37: the deadline is re-checked at dispatch; a late job is not sent.
	if !now.Before(fj.Deadline) {
		d.expire(now, []*fairqueue.Job{fj})
		return -1, false
	}
	t, m, pool := g.reg.Tenant(fj.Tenant), g.reg.Model(qd.model), g.reg.Pool()
	switch {
	case t == nil:
		d.finish(now, fj.ID, fj.Tenant, jobs.StatusFailed, unsentError(jobCodeTenantRemoved,
			"The tenant's TenantQuota was removed", d.attemptsOf(fj.ID)))
		return -1, false
	case m == nil || pool == nil:
		d.finish(now, fj.ID, fj.Tenant, jobs.StatusFailed, unsentError(jobCodeModelRemoved,
			fmt.Sprintf("The model %q is no longer served by the pool", qd.model), d.attemptsOf(fj.ID)))
		return -1, false
	}
	c, aerr := g.admit(now, t, pool, m, qd.cost.PromptTokens, qd.cost.MaxOutputTokens, throttle.Batch, qd.wouldRefuse)
	if aerr != nil {
		switch aerr.code {
		case codeUpstreamQuotaExhausted:
			// Back at its tenant's head; it expires at its deadline if the
			// throttle still refuses then (BC-37), never earlier.
			requeue()
			return aerr.retryAfter, false
		case string(limiter.ReasonTooLarge), string(limiter.ReasonSuspended):
			d.finish(now, fj.ID, fj.Tenant, jobs.StatusFailed, jobs.Error{Code: aerr.code, Message: aerr.message})
			return -1, false
		}
		requeue()
		return 0, false
	}
	seq := d.seq.Add(1)
	first := false
	job, err := g.store.Update(fj.ID, func(j *jobs.Job) error {
		// A job taken from the fair queue whose record says running is one
		// whose return to the queue the store failed to record
		// (requeueWith, retryLaterAfter): it is the dispatcher's to start.
		if j.Status != jobs.StatusQueued && j.Status != jobs.StatusRunning {
			return errJobNotQueued
		}
		j.Status, j.Attempts, j.DispatchSeq = jobs.StatusRunning, j.Attempts+1, seq
		if first = j.StartedAt.IsZero(); first {
			// Never negative: a job stored by a scheduler whose clock
			// was ahead of this one's waited 0, not less.
			j.StartedAt, j.QueueWait = now, max(now.Sub(j.CreatedAt), 0)
		}
		return nil
	})
	if err == nil && first {
		// Observed once the start is recorded: a start the store failed
		// to record is made again, and observed then.
		g.metrics.ObserveQueueWait(job.QueueWait)
	}
	if err != nil {
		c.settle(settleRefund, limiter.Usage{})
		if errors.Is(err, errJobNotQueued) || errors.Is(err, jobs.ErrNotFound) {
			// Finished or removed meanwhile: nothing left to send.
			d.forget(fj.ID)
			return -1, false
		}
		// The store could not record the start (a failed write: a full
		// volume): the job is not sent, and goes back to its tenant's head
		// rather than leaving the queue while its record still says queued
		// (it was then never sent, never expired and could not be
		// cancelled until a restart). Starts of its model are held for
		// storeRetry, so that a store that keeps failing is not retried in
		// a busy loop (the call's release wakes the loop at once).
		g.log.Error(err, "recording a job's start failed; the job stays queued", "job", fj.ID)
		requeue()
		return storeRetry, false
	}
	t.ObserveDispatch(now)
	// Sent: the job stops counting toward its tenant's bound before its
	// call can end. Released after the call was started (by the deferred
	// release), a job could finish while still counted, and a submission
	// in that instant found the tenant's queue not empty (queue_full at the
	// bound, and an idle tenant's backlog not observed, so its Retry-After
	// counted the idle time since its last dispatch: a day).
	held = false
	g.reg.WithQueue(func(*fairqueue.Queue) { d.unholdLocked(fj.Tenant) })
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer d.recoverExecute(fj)
		d.execute(ctx, fj, c, job, pool)
	}()
	return 0, true
}

// recoverExecute, deferred around execute, turns a panic while a job runs
// into that job failing with internal_error, logged with its stack, instead
// of a crash of the scheduler that stopped every tenant's calls and lost
// the jobs of a Memory store. The call is settled by execute's own deferred
// safety net (call.settleUnsettled: a panic before the provider answered
// costs the tenant nothing; one after a 2xx answer keeps the charge, the
// usage being unknown; one after execute settled keeps that). The job is not retried:
// the same input would panic again, in a loop. A job execute had already
// finished keeps its outcome (finishWith changes no finished job).
func (d *dispatcher) recoverExecute(fj *fairqueue.Job) {
	v := recover()
	if v == nil {
		return
	}
	g := d.g
	g.log.Error(fmt.Errorf("panic: %v", v), "A batch job's execution failed; the job fails without a retry", "job", fj.ID, "tenant", fj.Tenant, "stack", string(debug.Stack()))
	d.finish(g.clock.Now(), fj.ID, fj.Tenant, jobs.StatusFailed, jobs.Error{Code: jobCodeInternal,
		Message: "The scheduler failed while running the job; it was not retried."})
}

// execute makes the upstream call of a running job and records its outcome.
func (d *dispatcher) execute(ctx context.Context, fj *fairqueue.Job, c *call, job jobs.Job, pool *registry.PoolPolicy) {
	g := d.g
	defer c.settleUnsettled() // safety net; no-op once settled
	cctx, cancel := context.WithTimeout(ctx, pool.UpstreamTimeout)
	defer cancel()
	req, err := g.newUpstreamRequest(c.traced(cctx), pool, job.Endpoint, job.Body, http.Header{})
	if err != nil {
		c.settle(settleRefund, limiter.Usage{})
		d.finish(g.clock.Now(), job.ID, job.Tenant, jobs.StatusFailed, jobs.Error{Code: jobCodeUpstream, Message: "The provider URL is invalid."})
		return
	}
	g.upstreamCalls.Add(1)
	sent := g.clock.Now()
	resp, err := g.roundTrip(req)
	now := g.clock.Now()
	g.metrics.ObserveUpstream(c.model.Name, now.Sub(sent))
	if err != nil {
		if ctx.Err() != nil {
			c.settle(settleRefund, limiter.Usage{})
		} else {
			c.settle(c.failedSettlement(err), limiter.Usage{})
		}
		g.metrics.UpstreamResponses.WithLabelValues(c.model.Name, "error").Inc()
		if ctx.Err() != nil {
			// Shutting down with the call in flight: the provider may have
			// received and processed it, so the job goes back to the queue
			// as a recovered one with the attempt counted, as recover marks
			// a job found running at restart (at-least-once delivery).
			d.requeueRecovered(fj)
			return
		}
		msg := "The provider could not be reached."
		if isTimeout(err) {
			msg = "The provider did not answer in time."
		}
		d.retryLater(now, fj, job, msg)
		return
	}
	defer resp.Body.Close()
	c.answered = resp.StatusCode >= 200 && resp.StatusCode <= 299
	q := g.readQuota(now, c.model, resp)
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusRequestEntityTooLarge {
		eb, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		if lim, ok := upstreamTooLarge(resp.StatusCode, q, eb); ok {
			// Larger than the provider's limit: retrying it unchanged can
			// never succeed, and it is no reason to pause the model (BC-10).
			g.providerRefusedTooLarge(now, c, q, lim)
			e := upstreamTooLargeError(c.model.Name, c.model.TokenLimit())
			d.finishWith(now, job.ID, job.Tenant, jobs.StatusFailed, jobs.Error{Code: e.code, Message: e.message}, jsonOrNil(g.key.Redact(eb)), nil)
			return
		}
	}
	if resp.StatusCode == http.StatusTooManyRequests {
		// Pause the model, put the job back at its tenant's head without
		// charging it (the reservation is cancelled).
		g.upstreamThrottled(now, c, q)
		c.settle(settleThrottled, limiter.Usage{})
		d.requeueNow(fj, job.Attempts)
		return
	}
	if q.Known() {
		c.model.Throttle.Observe(now, c.permit, q)
	}
	body, readErr := io.ReadAll(io.LimitReader(resp.Body, g.maxResp+1))
	switch {
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusRequestTimeout:
		// Retried with backoff, never sooner than the provider's
		// Retry-After (brief "data plane contract": 5xx retry until the
		// deadline).
		c.settle(settleRefund, limiter.Usage{})
		var notBefore time.Duration
		if q.HasRetryAfter {
			notBefore = q.RetryAfter
		}
		d.retryLaterAfter(now, fj, job, fmt.Sprintf("The provider answered %d.", resp.StatusCode), notBefore)
	case isAuthRefusal(resp.StatusCode):
		// The provider refused the pool's key: the job fails without the
		// provider's body, which may quote the key.
		c.settle(settleRefund, limiter.Usage{})
		d.finishWith(now, job.ID, job.Tenant, jobs.StatusFailed, jobs.Error{Code: codeUpstreamAuthentication,
			Message: fmt.Sprintf("The provider refused the pool's credentials (%d).", resp.StatusCode)}, nil, nil)
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		// The provider refused the request itself (400, 413, ...): retrying
		// it unchanged can never succeed (BC-10). Its body is kept with
		// the provider key redacted.
		c.settle(settleRefund, limiter.Usage{})
		d.finishWith(now, job.ID, job.Tenant, jobs.StatusFailed, jobs.Error{Code: jobCodeUpstream,
			Message: fmt.Sprintf("The provider refused the request with %d.", resp.StatusCode)}, jsonOrNil(g.key.Redact(body)), nil)
	case readErr != nil || int64(len(body)) > g.maxResp:
		c.settle(settleUsage, limiter.Usage{})
		d.finishWith(now, job.ID, job.Tenant, jobs.StatusFailed, jobs.Error{Code: jobCodeUpstream,
			Message: "The provider's response broke off or was too large."}, nil, nil)
	case !json.Valid(body):
		// The provider processed the call (200) but its body is not JSON:
		// no result to record, usage unknown, the charge stands (BC-28a);
		// not retried, since a retry would be charged again.
		c.settle(settleUsage, limiter.Usage{})
		d.finishWith(now, job.ID, job.Tenant, jobs.StatusFailed, jobs.Error{Code: jobCodeUpstream,
			Message: "The provider's response was not valid JSON."}, nil, nil)
	default:
		u := parseBodyUsage(body)
		c.settle(settleUsage, u)
		var usage *jobs.Usage
		// A negative count is malformed: the charge stands (settle), and
		// the job records no usage rather than the provider's figures.
		if u.Known && u.Valid() {
			usage = &jobs.Usage{PromptTokens: u.PromptTokens, CompletionTokens: u.OutputTokens}
		}
		d.finishWith(now, job.ID, job.Tenant, jobs.StatusSucceeded, jobs.Error{}, jsonOrNil(body), usage)
	}
}

func jsonOrNil(b []byte) json.RawMessage {
	if len(b) == 0 || !json.Valid(b) {
		return nil
	}
	return json.RawMessage(b)
}

// requeueNow puts a job back at its tenant's head at once (after an
// upstream 429; the throttle's pause keeps it from being sent early).
func (d *dispatcher) requeueNow(fj *fairqueue.Job, attempts int) {
	d.requeueWith(fj, func(j *jobs.Job) { j.Status, j.Attempts = jobs.StatusQueued, max(attempts, 0) })
}

// requeueRecovered puts a job whose upstream call was cut off by the
// scheduler's shutdown back at its tenant's head, queued, with its
// attempts kept and Recovered set (the call may have reached the provider).
func (d *dispatcher) requeueRecovered(fj *fairqueue.Job) {
	d.requeueWith(fj, func(j *jobs.Job) { j.Status, j.Recovered = jobs.StatusQueued, true })
}

// requeueWith records the job queued again (set changes its stored record)
// and puts it back at its tenant's head; a job gone from the store is
// forgotten instead.
func (d *dispatcher) requeueWith(fj *fairqueue.Job, set func(j *jobs.Job)) {
	g := d.g
	if _, err := g.store.Update(fj.ID, func(j *jobs.Job) error {
		set(j)
		return nil
	}); err != nil {
		if errors.Is(err, jobs.ErrNotFound) {
			d.forget(fj.ID) // the job is gone from the store
			return
		}
		// A failed write (a full volume): the job is queued again all the
		// same, with its record still saying running, rather than lost
		// until a restart.
		g.log.Error(err, "recording a job queued again failed; it is queued all the same", "job", fj.ID)
	}
	var r removal
	gone := false
	g.reg.WithQueue(func(q *fairqueue.Queue) {
		if r, gone = d.removedWhy(fj); !gone {
			d.requeueLocked(q, fj)
		}
	})
	if gone {
		d.failRemoved(g.clock.Now(), fj, r)
	}
	d.wake()
}

// retryLater schedules a retry after exponential backoff with jitter, or
// fails the job when the retry would fall after its deadline.
func (d *dispatcher) retryLater(now time.Time, fj *fairqueue.Job, job jobs.Job, msg string) {
	d.retryLaterAfter(now, fj, job, msg, 0)
}

// retryLaterAfter is retryLater with a floor on the wait: notBefore, the
// provider's Retry-After of a 5xx (0: none).
func (d *dispatcher) retryLaterAfter(now time.Time, fj *fairqueue.Job, job jobs.Job, msg string, notBefore time.Duration) {
	g := d.g
	backoff := retryBase << min(max(job.Attempts-1, 0), 10)
	backoff = min(backoff, retryCap)
	r := rand.Float64
	if g.rand != nil {
		r = g.rand
	}
	backoff = backoff/2 + time.Duration(r()*float64(backoff/2))
	at := now.Add(max(backoff, notBefore))
	if !at.Before(fj.Deadline) {
		d.finish(now, job.ID, job.Tenant, jobs.StatusFailed, jobs.Error{Code: jobCodeUpstream,
			Message: msg + " The deadline passed before another attempt."})
		return
	}
	if _, err := g.store.Update(fj.ID, func(j *jobs.Job) error {
		j.Status = jobs.StatusQueued
		j.Error = &jobs.Error{Code: jobCodeUpstream, Message: msg + " Retrying."}
		return nil
	}); err != nil {
		if errors.Is(err, jobs.ErrNotFound) {
			d.forget(fj.ID) // the job is gone from the store
			return
		}
		// A failed write: retried all the same (see requeueWith).
		g.log.Error(err, "recording a job's retry failed; it is retried all the same", "job", fj.ID)
	}
	g.reg.WithQueue(func(*fairqueue.Queue) {
		d.retrying[fj.Tenant]++
		d.retryingTotal++
	})
	d.mu.Lock()
	d.retries[fj.ID] = retry{job: fj, at: at}
	d.mu.Unlock()
	// A removal committed before the job was in retries was not seen by
	// its scan; one committed after is (removedWhy). Whichever takes the
	// job out of retries fails it.
	if r, gone := d.removedWhy(fj); gone {
		d.mu.Lock()
		_, mine := d.retries[fj.ID]
		delete(d.retries, fj.ID)
		d.mu.Unlock()
		if mine {
			g.reg.WithQueue(func(*fairqueue.Queue) { d.unretryLocked(fj.Tenant) })
			d.failRemoved(now, fj, r)
		}
	}
	d.wake()
}

// expire marks jobs that reached their deadline unsent: status expired,
// never charged, counted (BC-35).
func (d *dispatcher) expire(now time.Time, list []*fairqueue.Job) {
	for _, fj := range list {
		d.finish(now, fj.ID, fj.Tenant, jobs.StatusExpired, deadlineError(d.attemptsOf(fj.ID)))
	}
}

// attemptsOf is the number of upstream calls made for the stored job (0
// when it is not stored).
func (d *dispatcher) attemptsOf(id string) int {
	if j, err := d.g.store.Get(id); err == nil {
		return j.Attempts
	}
	return 0
}

// unsentError is the error of a job that fails with code before it could
// be sent (again), for the reason why: "the job was not sent." for a job
// never sent, "the job was not sent again (attempts: N)." for one the
// provider was sent already (a retried 5xx or timeout, a provider 429, a
// call cut off by a restart), which the provider may have processed.
func unsentError(code, why string, attempts int) jobs.Error {
	if attempts == 0 {
		return jobs.Error{Code: code, Message: why + "; the job was not sent."}
	}
	return jobs.Error{Code: code, Message: fmt.Sprintf("%s; the job was not sent again (attempts: %d).", why, attempts)}
}

// deadlineError is the error of a job that reached its deadline while
// queued, after attempts upstream calls: none ("before it could be sent")
// or some, whose outcome the job's earlier record gave (a retried 5xx or
// timeout, a provider 429, a call cut off by a restart).
func deadlineError(attempts int) jobs.Error {
	if attempts == 0 {
		return jobs.Error{Code: jobCodeDeadline, Message: "The job reached its deadline before it could be sent."}
	}
	return jobs.Error{Code: jobCodeDeadline, Message: fmt.Sprintf("The job reached its deadline before it could be sent again (attempts: %d).", attempts)}
}

// finish records a terminal status without a response.
func (d *dispatcher) finish(now time.Time, id, tenant string, st jobs.Status, e jobs.Error) {
	d.finishWith(now, id, tenant, st, e, nil, nil)
}

// finishWith records a terminal status, the response and usage, and counts
// it for the tenant and the metrics.
func (d *dispatcher) finishWith(now time.Time, id, tenant string, st jobs.Status, e jobs.Error, resp json.RawMessage, u *jobs.Usage) {
	g := d.g
	d.forget(id)
	job, err := g.store.Update(id, func(j *jobs.Job) error {
		if j.Status.Finished() {
			return errJobFinished
		}
		j.Status, j.FinishedAt, j.Response, j.Usage = st, now, resp, u
		j.Error = nil
		markWebhookPending(j)
		if e.Code != "" {
			ee := e
			j.Error = &ee
		}
		return nil
	})
	if err != nil {
		if !errors.Is(err, errJobFinished) && !errors.Is(err, jobs.ErrNotFound) {
			// A failed write (a full volume): the job has left the
			// dispatcher, and its record still says running or queued.
			// The same terminal status (finish time, response, usage) is
			// written again later, counted and notified once written.
			g.log.Error(err, "recording a job's terminal status failed; it is written again later", "job", id, "status", st)
			d.writeLater(id, func() { d.finishWith(now, id, tenant, st, e, resp, u) })
		}
		return
	}
	g.metrics.JobsFinished.WithLabelValues(string(st)).Inc()
	t := g.reg.Tenant(tenant)
	switch st {
	case jobs.StatusExpired:
		if t != nil { // a removed tenant's series stay forgotten
			g.metrics.JobsExpired.WithLabelValues(tenant).Inc()
			t.AddExpired()
		}
	case jobs.StatusSucceeded, jobs.StatusFailed:
		if t != nil {
			t.AddCompleted()
		}
	}
	g.notifyWebhook(job)
}

// kept is a store write kept for a retry: w makes it again; rank orders
// the writes kept under one key (a webhook's states: a later state has a
// higher rank), so that an earlier one never replaces or drops it.
type kept struct {
	w    func()
	rank int
}

// writeUnrecorded makes again the store writes kept for a retry when their
// time has come at now (all of them when now is zero); a write that fails
// again is kept again by its function. It returns when the writes kept are
// due (zero when none is kept or they were all made).
func (d *dispatcher) writeUnrecorded(now time.Time) time.Time {
	d.mu.Lock()
	if len(d.unrecorded) == 0 {
		d.mu.Unlock()
		return time.Time{}
	}
	if !now.IsZero() && d.unrecordedAt.After(now) {
		at := d.unrecordedAt
		d.mu.Unlock()
		return at
	}
	writes := make([]func(), 0, len(d.unrecorded))
	for id, k := range d.unrecorded {
		writes = append(writes, k.w)
		delete(d.unrecorded, id)
	}
	d.mu.Unlock()
	for _, w := range writes {
		w()
	}
	return time.Time{}
}

// writeLater keeps a store write that failed (w makes it again, and calls
// writeLater again when it fails again) for the first pass storeRetry after
// the oldest write kept (so that failures that keep coming do not put the
// retries off), and wakes the loop so that its wait covers it.
func (d *dispatcher) writeLater(id string, w func()) { d.writeLaterRank(id, 0, w) }

// writeLaterRank is writeLater for a write of the given rank: a write of a
// higher rank kept under the same key (kept meanwhile, while this one was
// being made again) is kept instead.
func (d *dispatcher) writeLaterRank(id string, rank int, w func()) {
	d.mu.Lock()
	if k, ok := d.unrecorded[id]; ok && k.rank > rank {
		d.mu.Unlock()
		return
	}
	if len(d.unrecorded) == 0 {
		d.unrecordedAt = d.g.clock.Now().Add(storeRetry)
	}
	d.unrecorded[id] = kept{w: w, rank: rank}
	d.mu.Unlock()
	d.wake()
}

// dropLater forgets the write kept for a retry under key, if any, when its
// rank is at most rank (a write of that rank just made, or found out of
// date, makes it out of date).
func (d *dispatcher) dropLater(key string, rank int) {
	d.mu.Lock()
	if k, ok := d.unrecorded[key]; ok && k.rank <= rank {
		delete(d.unrecorded, key)
	}
	d.mu.Unlock()
}

// removeRefused removes from the store a submission stored and then
// refused (a full queue); when the store fails to, the removal is made
// again later rather than leaving a queued record of a job the client was
// told was refused (listed, never sent, and queued by the next restart).
// removed, when not nil, is called once the record is gone (now, or when
// the removal made again succeeds): a keyed submission's idempotency key
// stays in flight until then, so a retry meanwhile is not answered with
// the refused job.
func (d *dispatcher) removeRefused(id string, removed func()) {
	if err := d.g.store.Delete(id); err != nil && !errors.Is(err, jobs.ErrNotFound) {
		d.g.log.Error(err, "removing a refused submission from the job store failed; it is removed again later", "job", id)
		d.writeLater(id, func() { d.removeRefused(id, removed) })
		return
	}
	if removed != nil {
		removed()
	}
}

// markWebhookPending records, in the write that finishes job j, that its
// completion webhook is to be delivered: a restart delivers the webhooks
// still pending (jobs.WebhookLister), so a process that stops right after
// the finishing write (before the notifier's own write, or once the
// notifier has stopped) still delivers it.
func markWebhookPending(j *jobs.Job) {
	if j.WebhookURL != "" && j.WebhookStatus == "" {
		j.WebhookStatus = webhookPending
	}
}

// cancel cancels a queued job (in the fair queue or waiting for a retry
// backoff). It returns the job and false when the job is not queued, and
// an error when the store failed to record the cancellation: the job is
// then queued again (at the end of its tenant's queue, or waiting for its
// retry as before), so that it is still sent, expires or can be cancelled
// again, instead of leaving the queue with its record saying queued.
func (d *dispatcher) cancel(id string) (jobs.Job, bool, error) {
	g := d.g
	var fj *fairqueue.Job
	g.reg.WithQueue(func(q *fairqueue.Queue) {
		if f := d.byID[id]; f != nil && q.Cancel(f) {
			fj = f
			// Its slot of the tenant's bound is held until the
			// cancellation is recorded or the job is queued again.
			d.held[f.Tenant]++
		}
	})
	var rt retry
	retrying := false
	if fj == nil {
		// Still counted in retrying (its bound slot) and byID until the
		// cancellation is recorded.
		d.mu.Lock()
		if rt, retrying = d.retries[id]; retrying {
			delete(d.retries, id)
		}
		d.mu.Unlock()
	}
	if fj == nil && !retrying {
		j, _ := g.store.Get(id)
		return j, false, nil
	}
	now := g.clock.Now()
	j, err := g.store.Update(id, func(j *jobs.Job) error {
		if j.Status.Finished() {
			return errJobFinished
		}
		j.Status, j.FinishedAt = jobs.StatusCancelled, now
		j.Error = &jobs.Error{Code: jobCodeCancelled, Message: "The job was cancelled by the tenant."}
		markWebhookPending(j)
		return nil
	})
	if err != nil && !errors.Is(err, errJobFinished) && !errors.Is(err, jobs.ErrNotFound) {
		g.log.Error(err, "recording a job's cancellation failed; the job stays queued", "job", id)
		if retrying {
			d.mu.Lock()
			d.retries[id] = rt
			d.mu.Unlock()
		} else {
			d.enqueueAgain(now, fj)
		}
		d.wake()
		return j, false, err
	}
	g.reg.WithQueue(func(*fairqueue.Queue) {
		if retrying {
			d.unretryLocked(rt.job.Tenant)
		} else {
			d.unholdLocked(fj.Tenant)
		}
		delete(d.byID, id)
	})
	if err != nil {
		// Finished or removed meanwhile (a record the dispatcher no longer
		// owned): nothing left to cancel.
		return j, false, nil
	}
	g.metrics.JobsFinished.WithLabelValues(string(jobs.StatusCancelled)).Inc()
	g.notifyWebhook(j)
	d.wake()
	return j, true, nil
}

// enqueueAgain puts a job taken out of the fair queue by a cancellation
// the store failed to record back at the end of its tenant's queue,
// releasing the bound slot cancel held for it (the tenant's count bound is
// lifted for it: the job was admitted before). A job past its deadline
// expires; a tenant or a model removed meanwhile fails it.
func (d *dispatcher) enqueueAgain(now time.Time, fj *fairqueue.Job) {
	g := d.g
	var err error
	var r removal
	gone := false
	g.reg.WithQueue(func(q *fairqueue.Queue) {
		d.unholdLocked(fj.Tenant)
		if r, gone = d.removedWhy(fj); gone {
			return
		}
		t := g.reg.Tenant(fj.Tenant)
		if d.pricedWith != (limiter.CostModel{}) {
			// Priced in the queue's cost model, which may have changed
			// while the job was out (repriceLocked skips it then).
			fj.Cost = fj.Value.(*queued).queueCost(d.pricedWith)
		}
		pol := t.Policy()
		q.SetTenant(fj.Tenant, pol.Weight, -1)
		err = q.Enqueue(now, fj)
		q.SetTenant(fj.Tenant, pol.Weight, pol.MaxQueued)
	})
	switch {
	case gone:
		d.failRemoved(now, fj, r)
	case err == nil:
	case errors.Is(err, fairqueue.ErrExpired):
		d.expire(now, []*fairqueue.Job{fj})
	default:
		d.finish(now, fj.ID, fj.Tenant, jobs.StatusFailed, jobs.Error{Code: codeQueueFull,
			Message: fmt.Sprintf("The job could not be queued again: %v.", err)})
	}
}

// tenantRemoved fails the queued jobs of a tenant whose TenantQuota was
// deleted (the tenant stops being admitted; its jobs are not left to
// expire silently) and forgets its metric series.
func (g *Gateway) tenantRemoved(t *registry.Tenant) {
	d := g.dispatch
	now := g.clock.Now()
	after, failed := "", 0
	for {
		list, more, err := g.store.List(t.ID, jobs.Filter{Status: jobs.StatusQueued, After: after, Limit: 1000})
		if err != nil {
			break
		}
		for _, j := range list {
			var removed bool
			g.reg.WithQueue(func(q *fairqueue.Queue) { removed = d.cancelLocked(q, j.ID) })
			d.mu.Lock()
			rt, ok := d.retries[j.ID]
			if ok {
				delete(d.retries, j.ID)
				removed = true
			}
			d.mu.Unlock()
			if ok {
				g.reg.WithQueue(func(*fairqueue.Queue) { d.unretryLocked(rt.job.Tenant) })
			}
			if removed {
				failed++
				d.finish(now, j.ID, t.ID, jobs.StatusFailed, unsentError(jobCodeTenantRemoved,
					"The tenant's TenantQuota was removed", j.Attempts))
			}
		}
		if !more || len(list) == 0 {
			break
		}
		after = list[len(list)-1].ID
	}
	g.metrics.ForgetTenant(t.ID)
	g.log.Info("TenantQuota removed: the tenant is no longer admitted and its queued jobs failed", "tenant", t.ID, "failedJobs", failed)
	d.wake()
}

// modelRemoved fails the queued jobs (in the fair queue or waiting for a
// retry backoff) of a model taken out of the pool's spec.models, at once
// and unsent, as tenantRemoved does for a removed tenant. Left queued, each
// was dispatched in its tenant's turn, charged its deficit and failed at
// start (model_not_found), so a tenant's jobs for the models still served
// waited a visit of the round per doomed job ahead of them (as expired
// jobs must not, BC-35). Jobs being sent finish as their call ends; a job
// taken out of the queue meanwhile fails at start.
func (g *Gateway) modelRemoved(model string) {
	d := g.dispatch
	var gone []*fairqueue.Job
	g.reg.WithQueue(func(q *fairqueue.Queue) {
		for id, fj := range d.byID {
			if fj.Value.(*queued).model == model && q.Cancel(fj) {
				delete(d.byID, id)
				gone = append(gone, fj)
			}
		}
	})
	var retried []*fairqueue.Job
	d.mu.Lock()
	for id, rt := range d.retries {
		if rt.job.Value.(*queued).model == model {
			delete(d.retries, id)
			retried = append(retried, rt.job)
		}
	}
	d.mu.Unlock()
	if len(retried) > 0 {
		g.reg.WithQueue(func(*fairqueue.Queue) {
			for _, fj := range retried {
				d.unretryLocked(fj.Tenant)
			}
		})
	}
	now := g.clock.Now()
	for _, fj := range append(gone, retried...) {
		d.finish(now, fj.ID, fj.Tenant, jobs.StatusFailed, unsentError(jobCodeModelRemoved,
			fmt.Sprintf("The model %q is no longer served by the pool", model), d.attemptsOf(fj.ID)))
	}
	if len(gone)+len(retried) > 0 {
		g.log.Info("Model removed from the pool: its queued jobs failed", "model", model, "failedJobs", len(gone)+len(retried))
		d.wake()
	}
}

// batchSlots is how many of the pool's upstream concurrency slots batch jobs
// may fill: all but the pool's reserve share of them, ceil(slots x
// ReservePercent / 100) and at most all but one, so that an interactive call
// finds a free slot while a batch backlog drains (the reserve for
// interactive traffic, seed 000 "two paths", applied to concurrency as the
// throttle applies it to quota). Once no interactive call has arrived for
// the pool's BorrowAfter, batch may fill every slot, as it may borrow the
// throttle's reserve. borrowAt is when that borrowing would begin (zero
// when it has, or never will).
func (d *dispatcher) batchSlots(now time.Time) (slots int, borrowAt time.Time) {
	g := d.g
	total := cap(g.sem)
	pool := g.reg.Pool()
	if pool == nil || pool.ReservePercent <= 0 || total <= 1 {
		return total, time.Time{}
	}
	reserved := min((total*int(pool.ReservePercent)+99)/100, total-1)
	if pool.BorrowAfter > 0 {
		at := time.Unix(0, g.lastInteractive.Load()).Add(pool.BorrowAfter)
		if !now.Before(at) {
			return total, time.Time{}
		}
		borrowAt = at
	}
	return total - reserved, borrowAt
}
