package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/metrics"
	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/throttle"
)

// call is one admitted upstream call: the limiter reservation, an upstream
// concurrency slot and a throttle permit. Settle it exactly once (settle is
// guarded by a sync.Once; the limiter reservation is idempotent too), on
// every exit path.
type call struct {
	g      *Gateway
	tenant *registry.Tenant
	model  *registry.Model
	res    limiter.Reservation // filled by Tenant.AdmitInto; a call is never copied
	budget *registry.BudgetReservation
	permit throttle.Permit
	once   sync.Once
	// wrote is set once the transport has written the whole upstream
	// request (traced: httptrace.ClientTrace.WroteRequest).
	wrote atomic.Bool
	// answered is set by the call's own goroutine once the provider answered
	// with a 2xx status (settleUnsettled).
	answered bool
}

// traced returns ctx with a client trace that records in c.wrote when the
// upstream request has been written in full: a call that times out after
// that reached the provider (failedSettlement).
func (c *call) traced(ctx context.Context) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: func(i httptrace.WroteRequestInfo) {
		if i.Err == nil {
			c.wrote.Store(true)
		}
	}})
}

// failedSettlement is how a call whose upstream round trip returned err
// (no response) is settled: settleAbandoned when the request was written in
// full and then timed out waiting for the provider (it reached the
// provider, which counts the request and may bill its tokens: the request
// stays charged, as for a client that leaves then; a refund would let calls
// that always outlast the timeout use the pool's quota without moving the
// tenant's request rate), else settleRefund (not sent, a refused or reset
// connection: BC-22).
func (c *call) failedSettlement(err error) settleKind {
	if isTimeout(err) && c.wrote.Load() {
		return settleAbandoned
	}
	return settleRefund
}

// settleUnsettled is the safety net deferred by a call's handler (an
// interactive call's, a batch job's execute): it settles a call that a
// panic or a forgotten path left unsettled, and is a no-op for one already
// settled. A call the provider answered with a 2xx status is settled as one
// whose usage is unknown (settleUsage without usage: the charge stands,
// BC-28a), since the provider processed it and bills its tokens; any other
// is refunded in full (BC-22: not sent, or an answer the provider does not
// count).
func (c *call) settleUnsettled() {
	if c.answered {
		c.settle(settleUsage, limiter.Usage{})
		return
	}
	c.settle(settleRefund, limiter.Usage{})
}

// settlement kinds.
type settleKind int

const (
	// settleUsage completes the reservation from the provider's usage
	// (Known false keeps the charge, BC-28a) and tells the throttle the
	// prompt and output tokens used (the output refund, Anthropic OTPM).
	settleUsage settleKind = iota
	// settleRefund cancels the reservation (full refund, BC-22): the call
	// failed before the provider processed it, or the provider answered an
	// error (5xx, 4xx) that it does not count.
	settleRefund
	// settleThrottled cancels the reservation after an upstream 429; the
	// caller has already called OnTooManyRequests.
	settleThrottled
	// settleRejected cancels the reservation of a call the provider refused
	// as too large for its limit (BC-10): the provider counted no tokens, so
	// the throttle is told 0 were used and the model is not paused.
	settleRejected
	// settleAbandoned settles a call whose client went away after it was
	// sent and before the provider's first byte, or that timed out waiting
	// for the provider's answer after it was sent (failedSettlement;
	// limiter.Reservation.Abandon): its tokens are refunded, its request
	// stays charged (the provider counted it).
	settleAbandoned
)

// admit runs admission for a call of prompt + maxOut tokens: the model's
// provider token limit (a call above it can never succeed: 413
// request_too_large, BC-10), the tenant's budget (a reservation of the
// weighted cost, BC-20), its limiter (charge prompt + max output, seed 002
// section 3), an upstream concurrency slot, the model's throttle with
// priority p (prompt to input tokens, max output to output tokens, their sum
// to provider tokens: throttle.Throttle.TryStartCost) (batch priority for a call admitted over a soft limit). A
// refusal after a charge gives it back in full (BC-22).
//
// For a DryRun tenant nothing of the tenant's own is refused: the budget
// holds the charge even over the limit (its spend stays true), and a call
// Enforce would refuse (wouldRefuse, a refusal code decided before admit
// such as max_tokens_too_large; else the budget; else the limiter) gets a
// shadow reservation that charges the limiter nothing; the refusal is
// counted once, under the code Enforce would have answered.
func (g *Gateway) admit(now time.Time, t *registry.Tenant, pool *registry.PoolPolicy, m *registry.Model, prompt, maxOut int64, p throttle.Priority, wouldRefuse string) (*call, *apiError) {
	class := metrics.ClassInteractive
	if p == throttle.Batch {
		class = metrics.ClassBatch
	} else {
		g.lastInteractive.Store(now.UnixNano())
	}
	cost := pool.CostModel.Cost(prompt, maxOut)
	if lim := m.TokenLimit(); lim > 0 && cost.ProviderTokens > lim {
		return nil, providerTooLargeError(m.Name, cost.ProviderTokens, lim)
	}
	// The reservation lives in the call: admission allocates nothing.
	cl := &call{g: g, tenant: t, model: m}
	res := &cl.res
	if pol := t.Policy(); pol.DryRun {
		br, fits := t.ForceReserveBudget(now, cost.Weighted)
		cl.budget = br
		if wouldRefuse == "" && !fits {
			wouldRefuse = budgetRefusalCode(pol.Budget, cost.Weighted)
		}
		if wouldRefuse != "" {
			t.Limiter.ShadowInto(cost, limiter.Reason(wouldRefuse), res)
		} else {
			_ = t.Limiter.AdmitInto(now, cost, res) // never refuses under DryRun
		}
	} else {
		br, ok, resetIn, st := t.ReserveBudget(now, cost.Weighted)
		if !ok {
			return nil, budgetError(resetIn, st, pol.Budget, cost.Weighted)
		}
		cl.budget = br
		if rej := t.Limiter.AdmitInto(now, cost, res); rej != nil {
			br.Settle(now, 0)
			return nil, rejectionError(rej)
		}
	}
	br := cl.budget
	if dr := res.DryRunRejection(); dr != nil {
		// A shadow reservation charges nothing (DryRun).
		g.dryRunRejection(t, string(dr.Reason))
	} else {
		g.metrics.Tenant(t).Charged().Add(cost.Weighted)
	}
	if !g.tryAcquire() {
		g.refunded(t, res.Cancel(now))
		br.Settle(now, 0)
		g.refusedInteractive(class)
		return nil, &apiError{status: http.StatusServiceUnavailable, typ: typeRateLimit, code: codePoolConcurrency,
			retryAfter: time.Second, retryable: true, message: "The pool has too many calls in flight to the provider. Retry in 1s."}
	}
	if res.OverLimit() {
		// Admitted over a soft limit: no access to the interactive reserve
		// (TenantQuota enforcement Soft; seed 002 section 5).
		p = throttle.Batch
	}
	// The throttle charges the prompt to input tokens, max output to output
	// tokens (Anthropic ITPM and OTPM) and their sum to provider tokens.
	permit, ok, wait := m.Throttle.TryStartCost(now, throttle.Cost{Prompt: cost.PromptTokens, MaxOutput: cost.MaxOutputTokens}, p)
	if !ok {
		g.refunded(t, res.Cancel(now))
		br.Settle(now, 0)
		g.releaseQuiet()
		g.refusedInteractive(class)
		return nil, upstreamQuotaError(wait)
	}
	cl.permit = permit
	g.metrics.Tenant(t).Admitted(class).Inc()
	return cl, nil
}

// refusedInteractive wakes the dispatcher, while jobs are queued, after an
// interactive call refused past its tenant's admission gave back its
// tenant concurrency and KV blocks: a job of the tenant held back by them
// may start now. A refused batch start does not wake it (it would retry
// in a busy loop).
func (g *Gateway) refusedInteractive(class string) {
	if class == metrics.ClassInteractive {
		g.dispatch.wakeIfWaiting()
	}
}

// dryRunRejection counts a request or job of a DryRun tenant that Enforce
// would have refused with code (TenantQuota spec.mode DryRun): in the
// tenant's status figures and in fairshare_scheduler_dry_run_rejections_total.
// A call admitted after its tenant's removal counts nothing, so the
// series ForgetTenant deleted do not come back (as in refunded).
func (g *Gateway) dryRunRejection(t *registry.Tenant, code string) {
	if t.Removed() {
		return
	}
	t.AddDryRunRejection()
	g.metrics.DryRunRejections.WithLabelValues(t.ID, code).Inc()
}

// refunded counts a settlement's refund and use in
// refunded_weighted_tokens_total and used_weighted_tokens_total. A call that
// outlives its tenant's removal counts nothing, so the series ForgetTenant
// deleted do not come back.
func (g *Gateway) refunded(t *registry.Tenant, s limiter.Settlement) {
	if t.Removed() {
		return
	}
	if s.RefundedWeighted > 0 {
		g.metrics.Tenant(t).Refunded().Add(s.RefundedWeighted)
	}
	if s.UsedWeighted > 0 {
		g.metrics.Tenant(t).Used().Add(s.UsedWeighted)
	}
}

// settle settles the call once; later calls are no-ops. It returns the
// limiter settlement (zero when already settled).
func (c *call) settle(kind settleKind, u limiter.Usage) (s limiter.Settlement) {
	c.once.Do(func() {
		g := c.g
		now := g.clock.Now()
		if u.Known && !u.Valid() {
			// A negative count from the provider is malformed: the usage is
			// unknown to the limiter, the throttle and the usage window
			// alike, so the charge stands (BC-28(a)).
			u = limiter.Usage{}
		}
		switch kind {
		case settleUsage:
			s = c.res.Complete(now, u)
			c.model.Throttle.DoneTokens(now, c.permit, u.PromptTokens, u.OutputTokens, u.Known)
		case settleRefund:
			s = c.res.Cancel(now)
			c.model.Throttle.Done(now, c.permit, 0, false)
		case settleThrottled:
			s = c.res.Cancel(now)
		case settleRejected:
			s = c.res.Cancel(now)
			c.model.Throttle.Done(now, c.permit, 0, true)
		case settleAbandoned:
			s = c.res.Abandon(now)
			c.model.Throttle.Done(now, c.permit, 0, false)
		}
		g.refunded(c.tenant, s)
		c.recordUsage(now, kind, u, s)
		// The budget reservation settles to the same use as the limiter
		// (the charge, refunded to the actual usage), exactly once.
		c.budget.Settle(now, s.UsedWeighted)
		g.release()
	})
	return s
}

// recordUsage counts the settled call in the tenant's usage window
// (registry.Tenant.RecordCall; seed 002 section 7, cost per tenant): the
// weighted tokens it used and its provider tokens (the provider's usage, or
// the charge when the usage is unknown; none for a call refunded in full).
func (c *call) recordUsage(now time.Time, kind settleKind, u limiter.Usage, s limiter.Settlement) {
	var in, out int64
	if kind == settleUsage {
		if u.Known {
			in, out = u.PromptTokens, u.OutputTokens
		} else {
			cost := c.res.Cost()
			in, out = cost.PromptTokens, cost.MaxOutputTokens
		}
	}
	c.tenant.RecordCall(now, s.UsedWeighted, in, out)
}

// usageJSON is the OpenAI usage object.
type usageJSON struct {
	PromptTokens     *int64 `json:"prompt_tokens"`
	CompletionTokens *int64 `json:"completion_tokens"`
	// TotalTokens is read only when it is an integer: any other value is
	// ignored rather than failing the decoding of the whole usage.
	TotalTokens json.RawMessage `json:"total_tokens"`
}

func (u *usageJSON) usage() limiter.Usage {
	if u == nil {
		return limiter.Usage{}
	}
	var total *int64
	if v, err := strconv.ParseInt(string(u.TotalTokens), 10, 64); err == nil {
		total = &v
	}
	return usageOf(u.PromptTokens, u.CompletionTokens, total)
}

// usageOf is the usage of a usage object's prompt_tokens, completion_tokens
// and total_tokens (nil: absent or null). Without prompt_tokens it is
// unknown. Without completion_tokens the output is total_tokens minus
// prompt_tokens when total_tokens is at least prompt_tokens (OpenAI:
// total = prompt + completion; an embeddings usage has no
// completion_tokens and total = prompt, so 0), else 0: a provider that
// sends only the prompt and the total is charged its output, not refunded
// it.
func usageOf(prompt, completion, total *int64) limiter.Usage {
	if prompt == nil {
		return limiter.Usage{}
	}
	out := limiter.Usage{PromptTokens: *prompt, Known: true}
	switch {
	case completion != nil:
		out.OutputTokens = *completion
	case total != nil && *total >= *prompt:
		out.OutputTokens = *total - *prompt
	}
	return out
}

// parseBodyUsage reads the usage of a non-streaming JSON response body.
func parseBodyUsage(b []byte) limiter.Usage {
	var v struct {
		Usage *usageJSON `json:"usage"`
	}
	if json.Unmarshal(b, &v) != nil {
		return limiter.Usage{}
	}
	return v.Usage.usage()
}

// readQuota counts a provider response (upstream_responses_total by model
// and status) and reads its rate-limit headers in the pool's dialect
// (ProviderPool spec.upstream.dialect, via the model's throttle: Auto reads
// every dialect, most restrictive wins). Values ignored as malformed are
// counted in upstream_headers_malformed_total; the model's token limit is
// noted for the too-large check (BC-10).
func (g *Gateway) readQuota(now time.Time, m *registry.Model, resp *http.Response) throttle.Quota {
	g.metrics.UpstreamResponse(m.Name, resp.StatusCode).Inc()
	q := m.Throttle.ParseHeaders(resp.Header, now)
	if q.Malformed > 0 {
		g.metrics.UpstreamHeadersMalformed.WithLabelValues(m.Name).Add(float64(q.Malformed))
	}
	if q.Tokens.Limit > 0 {
		m.ObserveTokenLimit(q.Tokens.Limit)
	} else if q.Input.Limit > 0 && q.Output.Limit > 0 {
		// Anthropic without a tokens triplet: a call above ITPM + OTPM can
		// never fit (provider header reference, Anthropic section).
		m.ObserveTokenLimit(q.Input.Limit + q.Output.Limit)
	}
	return q
}
