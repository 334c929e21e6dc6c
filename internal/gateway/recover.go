package gateway

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fairshare-dev/fairshare/internal/fairqueue"
	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// recoverPoll is how often recovery re-checks that the registry has the
// pool and the tenants loaded before it queues the stored jobs again.
const recoverPoll = 100 * time.Millisecond

// errJobNotRunning refuses to recover a job whose record is no longer
// running.
var errJobNotRunning = errors.New("job is no longer running")

// recoveryStats counts what recover did with the stored jobs (logged).
type recoveryStats struct {
	requeued, recovered, expired, failed int
}

// recover queues again the jobs a previous run of the scheduler left queued
// or running in a durable store (issue "Durable job store": on restart
// queues are rebuilt in order with their deadlines; jobs that were running
// are requeued and marked as retried). It runs in Run before the
// dispatcher starts, once the registry is Ready (pool policy set and the
// initial TenantQuotas synced), on the jobs New found in the store, so a
// job submitted since New is never queued twice.
//
// Rules, job by job in submission order:
//   - the tenant is unknown (its TenantQuota was removed while the
//     scheduler was down): failed with code tenant_removed;
//   - the deadline has passed: expired (deadline_exceeded), counted as an
//     expiry and never charged (BC-35);
//   - the model is no longer served by the pool: failed with code
//     model_not_found, unsent;
//   - running when the process stopped: back to queued with Attempts kept
//     and Recovered set. Delivery toward the provider is at-least-once: the
//     interrupted call may have been processed by the provider, and the job
//     is sent again;
//   - otherwise queued at the end of its tenant's queue with the cost of its
//     stored estimate under the current cost model, as submitJob does. The
//     tenant's count bound does not apply (the job was admitted before the
//     restart): it is lifted for the enqueue and set back from the tenant's
//     policy under the same queue lock. A job refused by the pool-wide
//     bound or the tenant's token bound is failed with code queue_full.
//
// Jobs submitted between New and the end of recovery are queued ahead of
// the recovered ones of the same tenant.
func (g *Gateway) recover(ctx context.Context) error {
	pending := g.pending
	g.pending = nil
	if len(pending) == 0 && len(g.undelivered) == 0 {
		return nil
	}
	// Also with no job to queue again: the webhooks Run delivers again
	// after recover need their tenants (their signing secrets), and a
	// tenant not loaded yet reads as removed (the delivery would fail for
	// good).
	for !g.reg.Ready() {
		t := g.clock.NewTimer(recoverPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			g.pending = pending
			return ctx.Err()
		case <-t.C():
		}
	}
	if len(pending) == 0 {
		return nil
	}
	d := g.dispatch
	now := g.clock.Now()
	pool := g.reg.Pool()
	var st recoveryStats
	for _, j := range pending {
		t := g.reg.Tenant(j.Tenant)
		if t == nil {
			st.failed++
			d.finish(now, j.ID, j.Tenant, jobs.StatusFailed, unsentError(jobCodeTenantRemoved,
				"The tenant's TenantQuota was removed while the scheduler was restarting", j.Attempts))
			continue
		}
		if !now.Before(j.Deadline) {
			st.expired++
			d.finish(now, j.ID, j.Tenant, jobs.StatusExpired, deadlineError(j.Attempts))
			continue
		}
		if g.reg.Model(j.Model) == nil {
			// Taken out of the pool while the scheduler was down: failed
			// now, as a live removal fails its queued jobs (modelRemoved),
			// rather than queued to take its tenant's turn and fail at
			// start.
			st.failed++
			d.finish(now, j.ID, j.Tenant, jobs.StatusFailed, unsentError(jobCodeModelRemoved,
				fmt.Sprintf("The model %q is no longer served by the pool", j.Model), j.Attempts))
			continue
		}
		if j.Status == jobs.StatusRunning {
			if _, err := g.store.Update(j.ID, func(s *jobs.Job) error {
				if s.Status != jobs.StatusRunning {
					return errJobNotRunning
				}
				s.Status, s.Recovered = jobs.StatusQueued, true
				return nil
			}); err != nil {
				if errors.Is(err, errJobNotRunning) || errors.Is(err, jobs.ErrNotFound) {
					continue
				}
				// A failed write (a full volume): queued again all the same,
				// its record still saying running (the dispatcher starts
				// such a job: see dispatcher.start), rather than left
				// running until the next restart.
				g.log.Error(err, "recording a recovered job queued again failed; it is queued all the same", "job", j.ID)
			}
			st.recovered++
		}
		pol := t.Policy()
		cost := pool.CostModel.Cost(j.PromptTokens, j.MaxOutputTokens)
		qd := &queued{model: j.Model, cost: cost, wouldRefuse: wouldRefuseOf(j, pol.MaxOutputTokensPerRequest, pol.DryRun, pool)}
		fj := &fairqueue.Job{ID: j.ID, Tenant: j.Tenant, Deadline: j.Deadline, Value: qd}
		var err error
		g.reg.WithQueue(func(q *fairqueue.Queue) {
			fj.Cost = d.queueCostLocked(qd, pool)
			q.SetTenant(j.Tenant, pol.Weight, -1)
			if err = q.Enqueue(now, fj); err == nil {
				d.trackLocked(fj)
			}
			q.SetTenant(j.Tenant, pol.Weight, pol.MaxQueued)
		})
		switch {
		case err == nil:
			st.requeued++
		case errors.Is(err, fairqueue.ErrExpired):
			st.expired++
			d.expire(now, []*fairqueue.Job{fj})
		case errors.Is(err, fairqueue.ErrDuplicateID):
			// Already queued (cannot happen: pending jobs are queued only here).
		default:
			st.failed++
			d.finish(now, j.ID, j.Tenant, jobs.StatusFailed, jobs.Error{Code: codeQueueFull,
				Message: fmt.Sprintf("The job could not be queued again after a restart: %v.", err)})
		}
	}
	g.log.Info("recovered stored jobs", "requeued", st.requeued, "wereRunning", st.recovered,
		"expired", st.expired, "failed", st.failed)
	d.wake()
	return nil
}

// wouldRefuseOf recomputes queued.wouldRefuse of a stored job (not stored):
// the refusal a DryRun tenant's job over its output cap would have had.
// Only a DryRun tenant with a cap can have one, so other jobs are not
// parsed again.
func wouldRefuseOf(j jobs.Job, capTokens int64, dryRun bool, pool *registry.PoolPolicy) string {
	if !dryRun || capTokens <= 0 || j.Endpoint == endpointEmbeddings {
		return ""
	}
	req, aerr := parseRequest(j.Endpoint, j.Body, pool, promptCounter{})
	if aerr != nil {
		return ""
	}
	if aerr := req.applyPlanCap(capTokens, dryRun); aerr != nil {
		return ""
	}
	return req.wouldRefuse
}
