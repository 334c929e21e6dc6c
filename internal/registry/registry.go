// Package registry holds the scheduler's live policy snapshot and runtime
// state: the pool policy, one Tenant per TenantQuota (its limiter, counters
// and budget), one Model per served model (its adaptive throttle) and the
// pool's fair queue.
//
// Reconfiguration is validate-then-commit (style: APF BeginConfigChange /
// Complete): a policy is validated and defaulted first, and only a valid one
// is applied, in place, to the live objects: limiter.Tenant.Update keeps the
// bucket levels, throttle.Throttle.Reconfigure keeps the provider figures and
// pause, fairqueue.Queue.SetTenant keeps queued jobs and deficits. Nothing
// queued is dropped by a policy change; a removed tenant is reported to the
// OnTenantRemoved hooks so that its queued jobs can be failed with a clear
// error.
//
// The package knows neither HTTP nor Kubernetes: internal/kube feeds it
// policies, internal/gateway reads it on every request, the status writer
// and the metrics collector read Snapshot.
//
// Locking: one RWMutex guards the policy maps (read on every request,
// written on reconcile); one Mutex guards the fair queue, which is not
// goroutine-safe (WithQueue). The queue lock may be held while reading the
// maps (the dispatcher's eligibility test looks tenants up), never the
// other way round.
package registry

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"github.com/fairshare-dev/fairshare/internal/fairqueue"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/throttle"
	"github.com/fairshare-dev/fairshare/internal/usage"
)

// Errors of UpsertTenant.
var (
	// ErrDuplicateTenantID: another TenantQuota of the pool has the same tenant id.
	ErrDuplicateTenantID = errors.New("duplicate tenant id")
	// ErrDuplicateKey: another tenant has the same API key.
	ErrDuplicateKey = errors.New("API key already used by another tenant")
)

// Throttle timing shared by every model (seed 000 "The adaptive throttle").
const (
	// throttleBackoff is the pause after a 429 without Retry-After or reset.
	throttleBackoff = time.Second
	// throttleJitter spreads callers released after a pause (BC-11).
	throttleJitter = 500 * time.Millisecond
)

// Tenant is one tenant's runtime state. Its fields are safe for concurrent
// use; Policy returns the immutable policy in force.
type Tenant struct {
	// ID is the tenant id.
	ID string
	// Limiter is the tenant's limiter (buckets, concurrency, KV blocks).
	Limiter *limiter.Tenant

	policy  atomic.Pointer[TenantPolicy]
	removed atomic.Bool

	// The cumulative counters (Counters); see countersSeeded.
	completed, expired, rejections, tokensUsed, dryRunRejections atomic.Int64

	// clock stamps the rejections counted into usage; usage is the ring of
	// the tenant's consumption over the pool's usage window (replaced when
	// the window changes: SetPool).
	clock clock.PassiveClock
	usage atomic.Pointer[usage.Ring]

	drainMu      sync.Mutex
	lastDispatch time.Time     // the tenant's latest job dispatch
	backlogFrom  time.Time     // when its queue last got a job while empty
	drainEvery   time.Duration // EWMA of the interval between its dispatches
	drainKnown   bool          // drainEvery holds at least one interval (it may be 0)

	budgetMu    sync.Mutex
	budgetStart time.Time
	budgetUsed  int64 // settled use of the period
	budgetHeld  int64 // reservations of calls in flight

	// attached is a value the data plane keeps with the tenant (Attach).
	attached atomic.Pointer[attachment]

	// qref is the tenant's handle on the pool's fair queue, taken when
	// UpsertTenant configures the queue (guarded by the queue's lock,
	// Registry.qmu; zero until then).
	qref fairqueue.TenantRef

	// countersSeeded: SeedCounters added a base to the counters;
	// counterMu serialises SeedCounters and resetCounters (the data plane
	// adds to the counters without it).
	countersSeeded atomic.Bool
	counterMu      sync.Mutex
}

// Enqueue queues j, a job of this tenant, on q, the pool's fair queue as
// Registry.WithQueue passes it; call it only inside WithQueue's fn. It is
// fairqueue.Queue.Enqueue through the tenant's handle on the queue
// (fairqueue.Queue.EnqueueTo: no lookup of the tenant by name under the
// queue's lock), and Enqueue by name in the moment between the tenant's
// admission and its queue's configuration. Either way it sets j.Tenant to
// the tenant's ID. Errors: those of fairqueue.Queue.Enqueue.
func (t *Tenant) Enqueue(q *fairqueue.Queue, now time.Time, j *fairqueue.Job) error {
	if t.qref.Valid() {
		return q.EnqueueTo(now, t.qref, j)
	}
	j.Tenant = t.ID
	return q.Enqueue(now, j)
}

// attachment boxes the value of Tenant.Attach.
type attachment struct{ v any }

// Attached returns the value attached to the tenant by Attach, or nil.
func (t *Tenant) Attached() any {
	if a := t.attached.Load(); a != nil {
		return a.v
	}
	return nil
}

// Attach attaches v to the tenant unless a value is attached already, and
// returns the value in force (v, or the earlier one). The data plane keeps
// per-tenant state there that lives and dies with the Tenant (the metric
// series handles of internal/metrics.Metrics.Tenant): a removed tenant's
// Tenant is dropped by the registry, so nothing keyed by tenant grows
// without bound.
func (t *Tenant) Attach(v any) any {
	if t.attached.CompareAndSwap(nil, &attachment{v: v}) {
		return v
	}
	return t.Attached()
}

// Policy returns the tenant's policy in force (do not modify it).
func (t *Tenant) Policy() *TenantPolicy { return t.policy.Load() }

// Removed reports whether the tenant's TenantQuota was deleted.
func (t *Tenant) Removed() bool { return t.removed.Load() }

// AddCompleted counts one finished batch job.
func (t *Tenant) AddCompleted() { t.completed.Add(1) }

// AddExpired counts one batch job that reached its deadline unsent.
func (t *Tenant) AddExpired() { t.expired.Add(1) }

// AddRejection counts one request or job refused by a limit of the
// tenant's own (rate, concurrency, KV blocks, budget, queue bound,
// suspension): the rejections figure, and a refusal in the usage window at
// the registry clock's now (the "limit violations" signal of seed 002
// section 7).
func (t *Tenant) AddRejection() {
	t.rejections.Add(1)
	if r := t.usage.Load(); r != nil {
		r.Record(t.clock.Now(), usage.Counts{Refused: 1})
	}
}

// RecordCall counts one admitted call settled at now in the usage window:
// weighted tokens used (as settled, the figure of
// used_weighted_tokens_total) and provider input and output tokens used
// (the provider's usage, or the charge when it is unknown; 0 for a call
// refunded in full). Call it once per admitted call, at settlement
// (the cost-per-tenant signal of seed 002 section 7). O(1), no allocation.
func (t *Tenant) RecordCall(now time.Time, weighted, input, output int64) {
	if r := t.usage.Load(); r != nil {
		r.Record(now, usage.Counts{WeightedTokens: max(weighted, 0), InputTokens: max(input, 0), OutputTokens: max(output, 0), Admitted: 1})
	}
}

// UsageWindow returns the tenant's totals over the pool's usage window
// ending at now.
func (t *Tenant) UsageWindow(now time.Time) usage.Counts {
	if r := t.usage.Load(); r != nil {
		return r.Window(now)
	}
	return usage.Counts{}
}

// drainWeight is the weight of the newest interval in the drain-rate EWMA.
const drainWeight = 0.25

// ObserveDispatch records that one of the tenant's jobs was sent at now,
// for DrainInterval. The interval it adds to the average runs from the
// previous dispatch, or from when the tenant's queue last went from empty to
// holding a job (ObserveBacklog) when that is later: a time in which the
// tenant had nothing queued is idleness, not drain time.
func (t *Tenant) ObserveDispatch(now time.Time) {
	t.drainMu.Lock()
	defer t.drainMu.Unlock()
	if !t.lastDispatch.IsZero() {
		if d := now.Sub(t.drainFromLocked(now)); d >= 0 {
			if !t.drainKnown {
				t.drainEvery, t.drainKnown = d, true
			} else {
				t.drainEvery = time.Duration(float64(t.drainEvery)*(1-drainWeight) + float64(d)*drainWeight)
			}
		}
	}
	t.lastDispatch = now
}

// ObserveBacklog records that a job was queued at now for the tenant while
// it had none queued: the time since its last dispatch was idle, and its
// queue's drain time counts from now (ObserveDispatch, DrainInterval).
func (t *Tenant) ObserveBacklog(now time.Time) {
	t.drainMu.Lock()
	defer t.drainMu.Unlock()
	if now.After(t.backlogFrom) {
		t.backlogFrom = now
	}
}

// drainFromLocked is the instant the drain interval running at now runs
// from: the latest dispatch, or the start of the backlog when that is later
// (and not after now).
func (t *Tenant) drainFromLocked(now time.Time) time.Time {
	if t.backlogFrom.After(t.lastDispatch) && !t.backlogFrom.After(now) {
		return t.backlogFrom
	}
	return t.lastDispatch
}

// DrainInterval estimates the time until the tenant's queue drains one
// more job at now: the moving average (EWMA, newest interval weighing
// 0.25) of the intervals between its dispatches while it had jobs queued,
// stretched to the time already waited since the last one (or since its
// queue last filled from empty, when later) when that is longer (a stalled
// queue drains slower than it used to). ok is false before two dispatches.
func (t *Tenant) DrainInterval(now time.Time) (d time.Duration, ok bool) {
	t.drainMu.Lock()
	defer t.drainMu.Unlock()
	if !t.drainKnown {
		return 0, false
	}
	return max(t.drainEvery, now.Sub(t.drainFromLocked(now))), true
}

// AddDryRunRejection counts one request or job that Enforce would have
// refused and DryRun admitted.
func (t *Tenant) AddDryRunRejection() { t.dryRunRejections.Add(1) }

// AddUsed records weighted tokens spent at now outside a budget
// reservation: the tokensUsed figure and the budget of the current period.
// Calls admitted through ReserveBudget settle with BudgetReservation.Settle
// instead (never both).
func (t *Tenant) AddUsed(now time.Time, weighted int64) {
	if weighted <= 0 {
		return
	}
	t.tokensUsed.Add(weighted)
	t.budgetMu.Lock()
	t.rollBudgetLocked(now)
	t.budgetUsed += weighted
	t.budgetMu.Unlock()
}

// BudgetReservation is the weighted-token charge a call holds against its
// tenant's budget between admission and completion (BC-20: the budget is
// charged atomically at admission, like the limiter, so concurrent calls
// cannot all pass a check before any of them is counted). Settle it exactly
// once; later calls are no-ops; nil is a no-op.
type BudgetReservation struct {
	t        *Tenant
	start    time.Time // the period the charge belongs to
	weighted int64     // weighted tokens held
	settled  atomic.Bool
}

// ReserveBudget charges weighted tokens against the tenant's budget at now
// when they fit the remaining budget of the current period (settled use plus
// the reservations of calls in flight). It returns the reservation, or ok
// false with the time until the period resets (the Retry-After of 429
// budget_exhausted) and the budget figures. A tenant without a budget always
// gets a reservation (which holds nothing). Source: brief "data plane
// contract" (budget_exhausted), BC-20.
func (t *Tenant) ReserveBudget(now time.Time, weighted int64) (r *BudgetReservation, ok bool, resetIn time.Duration, st BudgetStatus) {
	weighted = max(weighted, 0)
	b := t.Policy().Budget
	t.budgetMu.Lock()
	defer t.budgetMu.Unlock()
	t.rollBudgetLocked(now)
	if b == nil {
		// Nothing held; the use is still counted in the period, as AddUsed
		// does, so that a budget added later sees the period's spend.
		return &BudgetReservation{t: t, start: t.budgetStart}, true, 0, BudgetStatus{}
	}
	st = t.budgetStatusLocked(b)
	if weighted > st.Remaining {
		return nil, false, st.ResetTime.Sub(now), st
	}
	t.budgetHeld += weighted
	st = t.budgetStatusLocked(b)
	return &BudgetReservation{t: t, start: t.budgetStart, weighted: weighted}, true, 0, st
}

// ForceReserveBudget is ReserveBudget for a tenant in DryRun: it always
// returns a reservation, holding the weighted tokens even when they do not
// fit (Remaining then reads 0), so that the period's spend stays true.
// ok reports whether the charge fitted, as ReserveBudget would have
// answered.
func (t *Tenant) ForceReserveBudget(now time.Time, weighted int64) (r *BudgetReservation, ok bool) {
	weighted = max(weighted, 0)
	b := t.Policy().Budget
	t.budgetMu.Lock()
	defer t.budgetMu.Unlock()
	t.rollBudgetLocked(now)
	if b == nil {
		return &BudgetReservation{t: t, start: t.budgetStart}, true
	}
	ok = weighted <= t.budgetStatusLocked(b).Remaining
	t.budgetHeld += weighted
	return &BudgetReservation{t: t, start: t.budgetStart, weighted: weighted}, ok
}

// seedBudget raises the period's settled use to seed.Used when seed
// describes the current period (its ResetTime is the end of the period
// holding now). Taking the larger of the two keeps a replica's own spend
// (always at least what it last reported) and lets a replica that has not
// served the tenant (a restarted scheduler, a standby taking over) start
// from the reported figure. Spend between the last report and a crash is
// lost: at most one status interval.
func (t *Tenant) seedBudget(now time.Time, seed *BudgetSeed) {
	b := t.Policy().Budget
	if seed == nil || b == nil {
		return
	}
	t.budgetMu.Lock()
	defer t.budgetMu.Unlock()
	t.rollBudgetLocked(now)
	if seed.ResetTime.Equal(periodEnd(t.budgetStart, b.Period)) {
		t.budgetUsed = max(t.budgetUsed, seed.Used)
	}
}

// Settle replaces the reservation by usedWeighted, the weighted tokens the
// call actually cost (0 for a call the provider did not process: a full
// refund), at now. The difference is given back to (or, for a call that
// cost more than reserved, taken from) the budget of the period the
// reservation was made in; when that period has ended, the reservation is
// dropped with it and the use is not moved into the new period (BC-23: a
// refund never lands in the wrong window). tokensUsed grows by usedWeighted
// either way. Settle is idempotent: only the first call counts.
func (r *BudgetReservation) Settle(now time.Time, usedWeighted int64) {
	if r == nil || r.t == nil || !r.settled.CompareAndSwap(false, true) {
		return
	}
	t := r.t
	usedWeighted = max(usedWeighted, 0)
	if usedWeighted > 0 {
		t.tokensUsed.Add(usedWeighted)
	}
	t.budgetMu.Lock()
	defer t.budgetMu.Unlock()
	t.rollBudgetLocked(now)
	if !t.budgetStart.Equal(r.start) {
		return // reset since (the period roll cleared what was held)
	}
	t.budgetHeld = max(t.budgetHeld-r.weighted, 0)
	t.budgetUsed += usedWeighted
}

// periodStart returns the start of the UTC calendar period holding now.
func periodStart(now time.Time, period string) time.Time {
	u := now.UTC()
	if period == BudgetDay {
		return time.Date(u.Year(), u.Month(), u.Day(), 0, 0, 0, 0, time.UTC)
	}
	return time.Date(u.Year(), u.Month(), 1, 0, 0, 0, 0, time.UTC)
}

// periodEnd returns the end of the period that starts at start.
func periodEnd(start time.Time, period string) time.Time {
	if period == BudgetDay {
		return start.AddDate(0, 0, 1)
	}
	return start.AddDate(0, 1, 0)
}

func (t *Tenant) rollBudgetLocked(now time.Time) {
	period := BudgetMonth
	if b := t.Policy().Budget; b != nil {
		period = b.Period
	}
	if s := periodStart(now, period); !s.Equal(t.budgetStart) {
		t.budgetStart, t.budgetUsed, t.budgetHeld = s, 0, 0
	}
}

func (t *Tenant) budgetStatusLocked(b *BudgetPolicy) BudgetStatus {
	return BudgetStatus{
		Used:      t.budgetUsed,
		Reserved:  t.budgetHeld,
		Remaining: max(0, b.WeightedTokens-t.budgetUsed-t.budgetHeld),
		ResetTime: periodEnd(t.budgetStart, b.Period),
	}
}

// BudgetStatus is the spend of the current budget period, in weighted
// tokens: Used by settled calls, Reserved by calls in flight (their
// admission charge, BC-20), Remaining = budget - Used - Reserved (never
// negative), and the instant the period resets.
type BudgetStatus struct {
	Used, Reserved, Remaining int64
	ResetTime                 time.Time
}

// Budget returns the tenant's budget figures at now, or ok false when the
// tenant has no budget.
func (t *Tenant) Budget(now time.Time) (BudgetStatus, bool) {
	b := t.Policy().Budget
	if b == nil {
		return BudgetStatus{}, false
	}
	t.budgetMu.Lock()
	defer t.budgetMu.Unlock()
	t.rollBudgetLocked(now)
	return t.budgetStatusLocked(b), true
}

// CheckBudget reports whether a request of weighted tokens fits the
// tenant's remaining budget at now (settled use and in-flight reservations
// both count); when it does not, it returns the time until the period
// resets (the Retry-After of 429 budget_exhausted). It charges nothing: the
// dispatcher's eligibility test and job submission use it, admission uses
// ReserveBudget.
func (t *Tenant) CheckBudget(now time.Time, weighted int64) (ok bool, resetIn time.Duration, st BudgetStatus) {
	st, has := t.Budget(now)
	if !has || weighted <= st.Remaining {
		return true, 0, st
	}
	return false, st.ResetTime.Sub(now), st
}

// Model is one served model and its adaptive throttle.
type Model struct {
	// Name of the model.
	Name string
	// Throttle paces calls to the provider for this model. Models of one
	// rate-limit group share it (ModelPolicy.RateLimitGroup); it is fixed
	// for the life of the Model: a model that changes group is replaced by
	// a new Model (SetPool).
	Throttle *throttle.Throttle

	// throttleKey is the key of the throttle in SetPool: "group:<group>"
	// or "model:<name>". Guarded by Registry.mu.
	throttleKey string

	throttled atomic.Int64
	// tokensHint is the ProviderPool's tokensPerMinute hint; hdrTokens the
	// provider's token limit from its last response headers or refusal
	// (0 unknown), in provider tokens.
	tokensHint, hdrTokens atomic.Int64
}

// AddThrottled counts one upstream 429 for the model.
func (m *Model) AddThrottled() { m.throttled.Add(1) }

// TokenLimit returns the provider's token limit of the model, in provider
// tokens per minute: the limit from the provider's headers when seen, else
// the ProviderPool's tokensPerMinute hint, else 0 (unknown). A request whose
// prompt + max output exceeds it can never succeed (the provider answers
// "Request too large", BC-10).
func (m *Model) TokenLimit() int64 {
	if n := m.hdrTokens.Load(); n > 0 {
		return n
	}
	return m.tokensHint.Load()
}

// ObserveTokenLimit records the provider's token limit of the model, in
// provider tokens per minute (x-ratelimit-limit-tokens and equivalents, or
// the limit named by a "Request too large" refusal). Values <= 0 are
// ignored.
func (m *Model) ObserveTokenLimit(limit int64) {
	if limit > 0 {
		m.hdrTokens.Store(limit)
	}
}

// objectState is what the registry knows of one TenantQuota object.
type objectState struct {
	id, uid    string
	generation int64
	err        error
}

// Registry is the live policy snapshot and runtime state of one pool.
type Registry struct {
	clock clock.PassiveClock

	mu            sync.RWMutex
	pool          atomic.Pointer[PoolPolicy]
	tenants       map[string]*Tenant
	objects       map[string]*objectState
	keys          map[KeyHash]*Tenant
	models        map[string]*Model
	tenantsSynced bool
	onRemove      []func(*Tenant)
	// onModelRemove are the OnModelRemoved hooks.
	onModelRemove []func(string)
	onChange      []func()

	qmu   sync.Mutex
	queue *fairqueue.Queue
	qcfg  fairqueue.Config
	// queuedOut (guarded by qmu) reports the queued jobs outside the fair
	// queue (SetQueuedOutside); nil: none.
	queuedOut func() (perTenant map[string]int, total int)

	inFlight          atomic.Int64
	upstreamThrottled atomic.Int64
	// throttledMu guards throttledSeeded and throttledUID: whether
	// SeedUpstreamThrottled has seeded upstreamThrottled, and for which
	// ProviderPool UID.
	throttledMu     sync.Mutex
	throttledSeeded bool
	throttledUID    string
}

// New returns an empty registry reading time from clk, with a fair queue of
// the default quantum, bound and queueing strategy until a pool policy is
// set.
func New(clk clock.PassiveClock) *Registry {
	cfg := queueConfig(&PoolPolicy{Quantum: DefaultQuantum, MaxQueuedJobs: DefaultMaxQueuedJobs, QueueingStrategy: QueueingBestEffortFIFO})
	return &Registry{
		clock:   clk,
		tenants: map[string]*Tenant{},
		objects: map[string]*objectState{},
		keys:    map[KeyHash]*Tenant{},
		models:  map[string]*Model{},
		queue:   fairqueue.New(cfg),
		qcfg:    cfg,
	}
}

// OnTenantRemoved registers fn, called (without locks held) with each tenant
// whose TenantQuota was removed.
func (r *Registry) OnTenantRemoved(fn func(*Tenant)) {
	r.mu.Lock()
	r.onRemove = append(r.onRemove, fn)
	r.mu.Unlock()
}

// OnModelRemoved registers fn, called (without locks held) with the name of
// each model a new pool policy no longer serves (SetPool).
func (r *Registry) OnModelRemoved(fn func(name string)) {
	r.mu.Lock()
	r.onModelRemove = append(r.onModelRemove, fn)
	r.mu.Unlock()
}

// OnChange registers fn, called (without locks held) after every committed
// policy change, so that waiters can re-check eligibility.
func (r *Registry) OnChange(fn func()) {
	r.mu.Lock()
	r.onChange = append(r.onChange, fn)
	r.mu.Unlock()
}

func (r *Registry) notify() {
	r.mu.RLock()
	fns := r.onChange
	r.mu.RUnlock()
	for _, fn := range fns {
		fn()
	}
}

// throttleConfig is the throttle configuration of the pool p for the
// models ms sharing one throttle (one model, or the members of a rate-limit
// group): each hint is the smallest a member states (0 when none does).
func throttleConfig(p *PoolPolicy, ms []ModelPolicy) throttle.Config {
	var tpm, rpm int64
	for _, m := range ms {
		if m.TokensPerMinute > 0 && (tpm == 0 || m.TokensPerMinute < tpm) {
			tpm = m.TokensPerMinute
		}
		if m.RequestsPerMinute > 0 && (rpm == 0 || m.RequestsPerMinute < rpm) {
			rpm = m.RequestsPerMinute
		}
	}
	return throttle.Config{
		ReservePercent:        p.ReservePercent,
		TokensPerMinuteHint:   tpm,
		RequestsPerMinuteHint: rpm,
		DefaultBackoff:        throttleBackoff,
		JitterWindow:          throttleJitter,
		BorrowAfter:           p.BorrowAfter,
		Dialect:               p.Dialect,
	}
}

// throttleKey is the key of the throttle serving m: the models of one
// rate-limit group share "group:<group>", a model without a group has
// "model:<name>" (the prefixes keep a group named like a model apart).
func throttleKey(m ModelPolicy) string {
	if m.RateLimitGroup != "" {
		return "group:" + m.RateLimitGroup
	}
	return "model:" + m.Name
}

// SetPool validates p and commits it: models are added, reconfigured in
// place (provider figures and pauses kept) or removed; the queue's quantum,
// bound and aging apply live to the queue as it stands (no job dropped,
// deficits kept: fairqueue.Queue.SetConfig). Models of one rate-limit group
// share one throttle (ModelPolicy.RateLimitGroup). A throttle that served
// the same key before is kept; a new group takes over the throttle of its
// first listed member that had one not kept by another key, so a model
// joining or forming a group keeps its figures and pause; a model whose
// throttle changes is replaced by a new Model (its 429 count and provider
// token limit carried over), calls in flight settling on the one they
// started with. It returns the validation error and changes nothing when p
// is invalid.
func (r *Registry) SetPool(p PoolPolicy) error {
	if err := p.Validate(); err != nil {
		return err
	}
	p.Models = append([]ModelPolicy(nil), p.Models...)
	now := r.clock.Now()
	members := map[string][]ModelPolicy{}
	var keys []string
	for _, m := range p.Models {
		k := throttleKey(m)
		if members[k] == nil {
			keys = append(keys, k)
		}
		members[k] = append(members[k], m)
	}
	r.mu.Lock()
	// The throttle of each key: the one that served the key, else the first
	// member's if no key keeps it (taken), else a new one.
	prev := map[string]*throttle.Throttle{}
	for _, cur := range r.models {
		prev[cur.throttleKey] = cur.Throttle
	}
	taken := map[*throttle.Throttle]bool{}
	chosen := map[string]*throttle.Throttle{}
	for _, k := range keys {
		if th := prev[k]; th != nil {
			chosen[k], taken[th] = th, true
		}
	}
	for _, k := range keys {
		if chosen[k] != nil {
			continue
		}
		for _, m := range members[k] {
			if cur, ok := r.models[m.Name]; ok && !taken[cur.Throttle] {
				chosen[k], taken[cur.Throttle] = cur.Throttle, true
				break
			}
		}
	}
	live := map[string]bool{}
	for _, k := range keys {
		cfg := throttleConfig(&p, members[k])
		th := chosen[k]
		if th == nil {
			th = throttle.New(cfg, now)
		} else {
			th.Reconfigure(now, cfg)
		}
		for _, m := range members[k] {
			live[m.Name] = true
			cur, ok := r.models[m.Name]
			if ok && cur.Throttle == th {
				cur.throttleKey = k
				cur.tokensHint.Store(max(m.TokensPerMinute, 0))
				continue
			}
			nm := &Model{Name: m.Name, Throttle: th, throttleKey: k}
			nm.tokensHint.Store(max(m.TokensPerMinute, 0))
			if ok {
				nm.throttled.Store(cur.throttled.Load())
				nm.hdrTokens.Store(cur.hdrTokens.Load())
			}
			r.models[m.Name] = nm
		}
	}
	var gone []string
	for name := range r.models {
		if !live[name] {
			delete(r.models, name)
			gone = append(gone, name)
		}
	}
	modelHooks := r.onModelRemove
	r.pool.Store(&p)
	// A new usage window resizes every tenant's ring, keeping the buckets
	// that fall in the new window (a call recorded during the swap may be
	// lost: the figures are a signal, not an account).
	for _, t := range r.tenants {
		if old := t.usage.Load(); old != nil && old.Span() != p.Usage.Window {
			t.usage.Store(old.Resized(now, p.Usage.Window))
		}
	}
	r.mu.Unlock()

	want := queueConfig(&p)
	r.qmu.Lock()
	if want != r.qcfg {
		// Live: queued jobs, deficits and the round are kept.
		r.queue.SetConfig(want)
		r.qcfg = want
	}
	r.qmu.Unlock()
	for _, name := range gone {
		for _, fn := range modelHooks {
			fn(name)
		}
	}
	r.notify()
	return nil
}

// queueConfig is the fair queue's configuration for the validated pool
// policy p: its quantum, bound and aging, every tenant at weight 1 and
// without a bound until its TenantQuota sets them, and the Lookahead of its
// queueing strategy.
func queueConfig(p *PoolPolicy) fairqueue.Config {
	cfg := fairqueue.Config{Quantum: p.Quantum, MaxTotal: p.MaxQueuedJobs, DefaultWeight: 1, DefaultMaxQueued: 0, MaxWaitTokens: max(p.MaxWaitTokens, 0)}
	if p.QueueingStrategy == QueueingBestEffortFIFO {
		cfg.Lookahead, cfg.MaxBypass = LookaheadJobs, MaxBypass
	}
	return cfg
}

// usageConfig returns the pool's usage-monitoring settings, or the
// defaults before a pool policy is set.
func (r *Registry) usageConfig() usage.Config {
	if p := r.pool.Load(); p != nil {
		return p.Usage
	}
	return usage.DefaultConfig()
}

// ClearPool forgets the pool policy (the ProviderPool was deleted): Ready
// turns false and requests are refused until a policy is set again.
func (r *Registry) ClearPool() {
	r.pool.Store(nil)
	r.notify()
}

// Pool returns the pool policy in force, or nil before one is set. The
// returned policy is immutable.
func (r *Registry) Pool() *PoolPolicy { return r.pool.Load() }

// Model returns the served model named name, or nil.
func (r *Registry) Model(name string) *Model {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.models[name]
}

// UpsertTenant validates p and commits it: a new tenant gets a fresh
// limiter; an existing one is updated in place (limiter.Tenant.Update keeps
// its bucket levels, in-flight calls and KV blocks; the fair queue keeps its
// jobs and deficit). Errors: the validation error, ErrDuplicateTenantID,
// ErrDuplicateKey; on error nothing changes except that the error is
// remembered for the object's status. Of two TenantQuotas claiming one
// tenant id or one API key, the one created first (then by name,
// createdBefore) gets it whatever the order they are applied in: p takes
// it over from a later one, which then reports the error.
func (r *Registry) UpsertTenant(p TenantPolicy) error {
	if err := p.Validate(); err != nil {
		r.setObjectError(p.Name, p.ID, p.UID, p.Generation, err)
		return err
	}
	p.KeyHashes = append([]KeyHash(nil), p.KeyHashes...)
	now := r.clock.Now()
	r.mu.Lock()
	cur := r.tenants[p.ID]
	// displaced is the TenantQuota that served the tenant id until p, which
	// holds it before it (createdBefore), takes it over.
	var displaced *TenantPolicy
	if cur != nil && cur.Policy().Name != p.Name {
		if !createdBefore(&p, cur.Policy()) {
			r.mu.Unlock()
			err := fmt.Errorf("%w: %q is already served for TenantQuota %q", ErrDuplicateTenantID, p.ID, cur.Policy().Name)
			r.setObjectError(p.Name, p.ID, p.UID, p.Generation, err)
			return err
		}
		displaced = cur.Policy()
	}
	var taken []*Tenant // tenants p takes a key from, in KeyHashes order
	for _, h := range p.KeyHashes {
		if owner, ok := r.keys[h]; ok && owner.ID != p.ID {
			if createdBefore(&p, owner.Policy()) {
				taken = append(taken, owner)
				continue
			}
			r.mu.Unlock()
			err := fmt.Errorf("%w (tenant %q of TenantQuota %q)", ErrDuplicateKey, owner.ID, owner.Policy().Name)
			r.setObjectError(p.Name, p.ID, p.UID, p.Generation, err)
			return err
		}
	}
	for _, owner := range taken {
		r.dropKeysLocked(owner, &p)
	}
	if cur == nil {
		cur = &Tenant{ID: p.ID, Limiter: limiter.NewTenant(p.Limits, now), clock: r.clock}
		cur.usage.Store(usage.NewRing(r.usageConfig().Window))
		r.tenants[p.ID] = cur
	} else {
		if !sameObject(cur.Policy(), &p) {
			// Another TenantQuota from now on (deleted and created again
			// under the name, or one created earlier taking the tenant id
			// over): its counters start from 0, and from its own status.
			cur.resetCounters()
		}
		cur.Limiter.Update(now, p.Limits)
		for _, h := range cur.Policy().KeyHashes {
			delete(r.keys, h)
		}
	}
	for _, h := range p.KeyHashes {
		r.keys[h] = cur
	}
	cur.policy.Store(&p)
	cur.seedBudget(now, p.BudgetSeed)
	r.objects[p.Name] = &objectState{id: p.ID, uid: p.UID, generation: p.Generation}
	if displaced != nil {
		err := fmt.Errorf("%w: %q is already served for TenantQuota %q", ErrDuplicateTenantID, p.ID, p.Name)
		r.objects[displaced.Name] = &objectState{id: displaced.ID, uid: displaced.UID, generation: displaced.Generation, err: err}
	}
	r.mu.Unlock()

	r.qmu.Lock()
	r.queue.SetTenant(p.ID, p.Weight, p.MaxQueued)
	cur.qref = r.queue.Tenant(p.ID)
	r.qmu.Unlock()
	r.notify()
	return nil
}

// createdBefore reports whether the TenantQuota of p holds an API key or a
// tenant id before that of q when both claim it: the one created first,
// then the lower name (the operator's rule for DuplicateTenantID). A policy
// without a creation time (unknown) never takes over from another: the one
// loaded first keeps it.
func createdBefore(p, q *TenantPolicy) bool {
	if p.Created.IsZero() || q.Created.IsZero() {
		return false
	}
	if !p.Created.Equal(q.Created) {
		return p.Created.Before(q.Created)
	}
	return p.Name < q.Name
}

// dropKeysLocked takes from the served tenant t every API key p claims
// (p's TenantQuota holds them before t's, createdBefore): t stays served
// without them, and its TenantQuota reports ErrDuplicateKey naming p until
// it is applied again (when it meets the same conflict, or none once p is
// gone). Called with r.mu held.
func (r *Registry) dropKeysLocked(t *Tenant, p *TenantPolicy) {
	claimed := make(map[KeyHash]bool, len(p.KeyHashes))
	for _, h := range p.KeyHashes {
		claimed[h] = true
	}
	old := t.Policy()
	np := *old
	np.KeyHashes = nil
	for _, h := range old.KeyHashes {
		if claimed[h] {
			delete(r.keys, h)
			continue
		}
		np.KeyHashes = append(np.KeyHashes, h)
	}
	t.policy.Store(&np)
	err := fmt.Errorf("%w (tenant %q of TenantQuota %q)", ErrDuplicateKey, p.ID, p.Name)
	r.objects[old.Name] = &objectState{id: old.ID, uid: old.UID, generation: old.Generation, err: err}
}

func (r *Registry) setObjectError(name, id, uid string, gen int64, err error) {
	if name == "" {
		name = id
	}
	r.mu.Lock()
	r.objects[name] = &objectState{id: id, uid: uid, generation: gen, err: err}
	r.mu.Unlock()
}

// RemoveTenant forgets the TenantQuota named name: when it owned a tenant,
// the tenant stops being admitted (Tenant returns nil, Removed is true) and
// the OnTenantRemoved hooks run so that its queued jobs are failed. It
// returns the removed tenant, or nil.
func (r *Registry) RemoveTenant(name string) *Tenant {
	r.mu.Lock()
	obj, ok := r.objects[name]
	delete(r.objects, name)
	var t *Tenant
	if ok {
		if cur := r.tenants[obj.id]; cur != nil && cur.Policy().Name == name {
			t = cur
			delete(r.tenants, obj.id)
			for _, h := range t.Policy().KeyHashes {
				delete(r.keys, h)
			}
			t.removed.Store(true)
		}
	}
	hooks := r.onRemove
	r.mu.Unlock()
	if t == nil {
		return nil
	}
	r.qmu.Lock()
	r.queue.RemoveTenant(t.ID)
	r.qmu.Unlock()
	for _, fn := range hooks {
		fn(t)
	}
	r.notify()
	return t
}

// Tenant returns the tenant with that id, or nil.
func (r *Registry) Tenant(id string) *Tenant {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.tenants[id]
}

// TenantByKey returns the tenant whose API key is key, or nil. Keys are
// held only as SHA-256 hashes; the hash found by the map lookup is confirmed
// with a constant-time comparison (crypto/subtle), and a lookup by hash
// reveals through its timing nothing usable about the key itself.
func (r *Registry) TenantByKey(key string) *Tenant {
	h := HashKey(key)
	r.mu.RLock()
	t := r.keys[h]
	r.mu.RUnlock()
	if t == nil {
		return nil
	}
	for _, k := range t.Policy().KeyHashes {
		if subtle.ConstantTimeCompare(k[:], h[:]) == 1 {
			return t
		}
	}
	return nil
}

// Tenants returns the live tenants, sorted by id.
func (r *Registry) Tenants() []*Tenant {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.tenantListLocked()
}

func (r *Registry) tenantListLocked() []*Tenant {
	out := make([]*Tenant, 0, len(r.tenants))
	for _, t := range r.tenants {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// WithQueue runs fn with the fair queue locked. fn must not call back into
// the registry's queue methods.
func (r *Registry) WithQueue(fn func(q *fairqueue.Queue)) {
	r.qmu.Lock()
	defer r.qmu.Unlock()
	fn(r.queue)
}

// SetQueuedOutside registers fn, which reports the jobs that are queued
// (their status is queued, and they count toward the queue bounds) but are
// not in the fair queue at the moment, such as jobs waiting for a retry
// backoff, per tenant and in all. fn runs with the queue lock held (as
// WithQueue's fn does), must not call back into the registry, and must not
// keep or change the map it returns. Snapshot adds them to the tenants'
// Queued and the pool's Backlog.
func (r *Registry) SetQueuedOutside(fn func() (perTenant map[string]int, total int)) {
	r.qmu.Lock()
	r.queuedOut = fn
	r.qmu.Unlock()
}

// SetTenantsSynced records that the initial list of TenantQuotas has been
// applied (readiness).
func (r *Registry) SetTenantsSynced() {
	r.mu.Lock()
	r.tenantsSynced = true
	r.mu.Unlock()
}

// Ready reports whether the pool policy is set and the tenants are loaded.
func (r *Registry) Ready() bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.tenantsSynced && r.pool.Load() != nil
}

// AddInFlight adds delta to the number of upstream calls in flight.
func (r *Registry) AddInFlight(delta int64) { r.inFlight.Add(delta) }

// AddUpstreamThrottled counts one upstream 429 for the pool.
func (r *Registry) AddUpstreamThrottled() { r.upstreamThrottled.Add(1) }
