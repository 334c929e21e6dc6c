package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// DefaultForceRefresh is how often the pool's status is rewritten when
// nothing in it changed, so that its lastReportTime shows the scheduler is
// alive: 5 minutes. TenantQuota statuses have no such heartbeat.
const DefaultForceRefresh = 5 * time.Minute

// DefaultMaxWritesPerSecond is the status write budget of one scheduler when
// StatusWriter.MaxWritesPerSecond is unset: 5 writes per second.
const DefaultMaxWritesPerSecond = 5.0

// maxShownModels is the most models the ProviderPool's status.models
// lists (paused models first, then the others, each group by name; the
// rest are counted in status.modelsNotShown, the metrics cover all), so
// that the pool's status stays under 4 KB with the 64 models spec.models
// allows (see TestPoolStatusUnder4KBWith64Models).
const maxShownModels = 8

// maxShownModelNameBytes caps the bytes of model names status.models lists
// (8 names of 32 bytes): spec.models[].name may be 256 bytes long, and 8
// such names alone would take the pool's status past 4 KB. Models beyond
// it are counted in status.modelsNotShown like those beyond
// maxShownModels; the first model is always listed.
const maxShownModelNameBytes = 256

// listedWithin is how many of the first n entries of a status list are
// listed: at most maxCount, and while the entries' name bytes (nameLen)
// add up to at most maxBytes; the first entry is always listed.
func listedWithin(n, maxCount, maxBytes int, nameLen func(i int) int) int {
	shown, bytes := 0, 0
	for shown < n && shown < maxCount {
		bytes += nameLen(shown)
		if shown > 0 && bytes > maxBytes {
			break
		}
		shown++
	}
	return shown
}

// maxMessageBytes caps the message of a condition the scheduler writes (an
// invalid spec's error text can be long), so that a status stays under
// 4 KB (see TestStatusSize).
const maxMessageBytes = 256

// Condition reasons of the scheduler's own, beside those of api/v1alpha1
// (all are listed in docs/api.md, "Conditions").
const (
	// ReasonNoCredentials (TenantQuota Serving False): the pool identifies
	// tenants by API key and the TenantQuota sets no spec.credentials.
	ReasonNoCredentials = "NoCredentials"
	// ReasonCredentialsNotFound (TenantQuota Serving False, APIKey pool):
	// the key Secret does not exist, or has no value under the key.
	ReasonCredentialsNotFound = "CredentialsNotFound"
	// ReasonCredentialsNotReadable (TenantQuota Serving False, APIKey pool):
	// the scheduler may not read the key Secret yet (the operator has not
	// yet added it to the pool's Secret Role); retried every
	// SecretRetryInterval.
	ReasonCredentialsNotReadable = "CredentialsNotReadable"
	// ReasonSuspended (TenantQuota Throttled True): a limit of the tenant
	// is 0, which suspends it (403 tenant_suspended).
	ReasonSuspended = "Suspended"
)

// State is what the sync reconcilers tell the status writer beyond the
// registry: the last pool load error, and whether the ProviderPool was
// found deleted.
type State struct {
	mu         sync.Mutex
	poolErr    error
	poolErrGen int64
	poolGone   bool
}

// setPoolGone records whether the last read of the ProviderPool found it
// deleted (NotFound).
func (s *State) setPoolGone(gone bool) {
	s.mu.Lock()
	s.poolGone = gone
	s.mu.Unlock()
}

// isPoolGone reports whether the last read of the ProviderPool found it
// deleted. A nil State never is.
func (s *State) isPoolGone() bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.poolGone
}

func (s *State) setPoolErr(gen int64, err error) {
	s.mu.Lock()
	s.poolErr, s.poolErrGen = err, gen
	s.mu.Unlock()
}

func (s *State) pool() (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.poolErrGen, s.poolErr
}

// StatusWriter writes the scheduler-owned status of the pool and its
// tenants with server-side apply on the status subresource under field
// manager fairshare-scheduler, sending only the fields it owns. Its load
// on the API server is bounded independently of the tenant count:
//
//   - An object is dirty when its payload (ignoring lastReportTime) differs
//     from the one last written, or, on first sight, from the one the API
//     server holds. A clean TenantQuota is never rewritten: its
//     lastReportTime is when its figures were last written. Only the
//     ProviderPool is rewritten unchanged, every ForceRefresh, as the
//     scheduler's heartbeat (BC-42; style 2.4). An idle scheduler thus writes
//     one object per ForceRefresh whatever the tenant count.
//   - An object clean for ForceRefresh has its status read again (from the
//     cache) and compared as on first sight: one the API server no longer
//     holds as written (another replica leading while this one was cut off
//     from the API server, a hand edit) is dirty again, so such a change is
//     undone within ForceRefresh and a pass, not left for ever.
//   - Every Interval a pass builds every status and writes dirty objects,
//     spaced at least 1/MaxWritesPerSecond apart on Clock (a token bucket of
//     burst 1, so no window of one second holds more than
//     MaxWritesPerSecond writes, pass boundaries included). A pass stops when
//     its next write would start at or after the next pass is due; what it
//     did not write stays dirty and is written by a later pass with its
//     latest payload (coalesced).
//   - Order within a pass: the pool; then objects dirty for ForceRefresh or
//     longer (so nothing starves, even under a storm of flips or of budget
//     spend); then TenantQuotas whose status.budget.used changed (the next
//     scheduler seeds its budgets from it); then objects with a condition
//     whose status flipped (or appeared); then the rest; oldest-dirty first
//     within each class. The worst-case lag of a change is therefore about
//     (dirty objects) / MaxWritesPerSecond plus one Interval: 10,000 dirty
//     tenants at 5 writes/s take 2,000 s. A budget change waits only for
//     the other budget changes (and overdue objects, none while fewer than
//     ForceRefresh x MaxWritesPerSecond objects are dirty): about
//     (budget-dirty objects) / MaxWritesPerSecond plus one Interval, which
//     is what a crash can lose.
//   - At shutdown (final) every object with a pending budget or counter
//     change is written without pacing, a one-off burst bounded by
//     finalWriteTimeout.
//   - A TenantQuota deleted and created again under the same name (a new
//     metadata.uid in the registry) is a new object: what was written to
//     the old one is forgotten, and its status read again. An object the
//     API server no longer has (NotFound on write) is forgotten too, and
//     so is everything while the ProviderPool is found deleted (the
//     operator then removes this writer's fields but the budget and the
//     counters; a pool created again has every status read again).
//   - Cumulative counters (a TenantQuota's completedJobs, expiredJobs,
//     rejections, tokensUsed and dryRunRejections; the pool's
//     upstreamThrottled) go on from what the status held when this writer
//     first read it: the registry's counts, kept from the process's start
//     (or the tenant's creation), are seeded once with it (carry,
//     registry.Tenant.SeedCounters, Registry.SeedUpstreamThrottled) before
//     the object's first write, and an object whose status was not read
//     is not written. A restarted scheduler, or a standby that takes the
//     Lease, thus neither restarts them from 0 nor counts twice what the
//     previous writer wrote; what that one counted after its last write is
//     lost (a crash; at shutdown, what its final pass does not write). A
//     TenantQuota or ProviderPool created again under its name (a new UID)
//     starts from 0 (registry.Registry.UpsertTenant resets the tenant's
//     counters). A tenant in an error state keeps its counters in status,
//     as its budget.
//
// Conditions keep their lastTransitionTime unless their status flips; a
// flip not yet written keeps the time the scheduler first saw it.
type StatusWriter struct {
	// Client writes status (and reads, on first sight of an object, its
	// current status from the cache).
	Client client.Client
	// Registry provides the figures.
	Registry *registry.Registry
	// State provides the pool's load error; may be nil.
	State *State
	// Namespace and PoolName select the objects.
	Namespace, PoolName string
	// Interval between passes; <= 0 means 10 s.
	Interval time.Duration
	// ForceRefresh is the pool's heartbeat: the longest its unchanged
	// status goes unwritten; also the age past which a dirty object goes
	// ahead of condition flips. <= 0 means DefaultForceRefresh.
	ForceRefresh time.Duration
	// MaxWritesPerSecond is the scheduler's status write budget, in writes
	// per second; <= 0 means DefaultMaxWritesPerSecond.
	MaxWritesPerSecond float64
	// Clock drives the ticker, the pacing of writes and timestamps; nil is
	// the real clock.
	Clock clock.WithTicker
	// Log receives write errors.
	Log logr.Logger
	// Recorder, when set, receives Warning events on TenantQuotas, recorded
	// when the status that makes them true is written, once per
	// transition, not per pass:
	//   - UsageOutlier turns True: reason CostAboveTier or LimitViolations,
	//     the condition's message, which carries the figures (seed 002
	//     section 7);
	//   - Serving turns False, or changes reason while False, with reason
	//     InvalidSpec (an API key already used by another tenant
	//     included), NoCredentials or CredentialsNotFound: the condition's
	//     reason and message. Not for DuplicateTenantID (the operator
	//     records it with Accepted False) nor CredentialsNotReadable
	//     (transient: a new TenantQuota's Secret is readable once the
	//     operator has updated the pool's Role, within seconds).
	Recorder record.EventRecorder

	// mu serialises passes and guards the fields below.
	mu   sync.Mutex
	objs map[string]*objState
	// nextWrite is the earliest time the next write may start.
	nextWrite time.Time
}

// objState is what the writer knows of one object: what the API server
// holds of the scheduler's fields, and the latest payload when dirty.
type objState struct {
	kind, name string
	// uid is the object's UID as read on first sight (events name it, so
	// that kubectl describe lists them; the counters are carried for it);
	// empty when unreadable.
	uid types.UID
	// regUID is the object's UID as the registry last had it
	// (ObjectSnapshot.UID); empty for the pool or when unknown.
	regUID string
	// budget is status.budget as the API server holds it (last written,
	// or read on first sight); lastBudget the latest figures built (kept
	// in the status of a tenant in an error state, so that the next
	// scheduler's budget seed survives).
	budget, lastBudget *v1alpha1.BudgetStatus
	// read: the status was read at the last load (first sight, or a
	// check); an unread object is read again at the next pass.
	read bool
	// base is a TenantQuota's cumulative counters as the API server holds
	// them (last read or written): a served tenant whose counters the
	// registry has not seeded yet is seeded from it (carry), so that they
	// go on from what an earlier scheduler, or this one for a tenant the
	// registry has since dropped and loaded again, reported. lastCounts
	// are the counter fields of the status last built for the tenant
	// while served, or read: kept in the status of a tenant in an error
	// state and not served, as lastBudget.
	base       *registry.Counters
	lastCounts statusCounts
	// throttledBase is the ProviderPool's status.upstreamThrottled as last
	// read, not yet given to the registry (SeedUpstreamThrottled, next
	// pass); carried: it was, so the pool's status may be written.
	throttledBase *int64
	carried       bool
	// known: payload, at and conds describe the scheduler's part of the
	// status on the API server (last written, or read on first sight).
	known   bool
	payload []byte
	at      time.Time
	conds   []metav1.Condition
	// server is the status read on first sight, or again at a check
	// (*tenantStatus or *poolStatus), compared once with the next payload
	// built; nil after.
	server any
	// checked is when the status was last read or written: a clean object
	// is read again ForceRefresh after it (see StatusWriter).
	checked time.Time

	// dirtySince is when the object first differed from what was written;
	// zero when clean.
	dirtySince time.Time
	// flip: a condition's status differs from the written one.
	flip bool
	// budgetDirty: the pending status.budget.used differs from budget's.
	budgetDirty bool
	// countsDirty: the pending counters (lastCounts) differ from base's,
	// those the API server holds.
	countsDirty bool
	// pendingBudget is the pending payload's status.budget.
	pendingBudget *v1alpha1.BudgetStatus
	// pending: the latest payload and the function building its status
	// with a given lastReportTime; pendingConds its conditions.
	pending      []byte
	build        func(*metav1.Time) any
	pendingConds []metav1.Condition
}

// PassResult is what one pass did.
type PassResult struct {
	// Writes is the number of status writes that succeeded.
	Writes int
	// Dirty is the number of objects still dirty after the pass.
	Dirty int
}

// NeedLeaderElection: only the leader writes status.
func (w *StatusWriter) NeedLeaderElection() bool { return true }

// Start runs a pass every Interval until ctx is cancelled, then writes
// once more (final).
func (w *StatusWriter) Start(ctx context.Context) error {
	t := w.clock().NewTicker(w.interval())
	defer t.Stop()
	for {
		if _, err := w.WriteOnce(ctx); err != nil && ctx.Err() == nil {
			w.Log.Error(err, "writing status")
		}
		select {
		case <-ctx.Done():
			w.final(ctx)
			return nil
		case <-t.C():
		}
	}
}

// finalWriteTimeout bounds the last status write at shutdown.
const finalWriteTimeout = 5 * time.Second

// finalWriteConcurrency is how many status writes the shutdown burst has
// in flight at once.
const finalWriteConcurrency = 8

// final writes the figures once more at shutdown, so that a graceful
// restart loses none of the period's budget spend (the next scheduler
// seeds its budgets from status.budget) nor of the counters (it carries
// them on from status). It is a pass bounded by finalWriteTimeout on Clock
// and on the wall clock in which the pool and every object whose
// status.budget.used or counters changed are written first without the
// MaxWritesPerSecond pacing, finalWriteConcurrency at a time: a one-off
// burst of one write per such object (accepted at shutdown). Other dirty
// objects are then written paced until the bound; the rest are lost (their
// figures are rebuilt by the next scheduler).
func (w *StatusWriter) final(ctx context.Context) {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalWriteTimeout)
	defer cancel()
	if _, err := w.pass(fctx, finalWriteTimeout, true); err != nil {
		w.Log.Error(err, "writing status at shutdown")
	}
}

func (w *StatusWriter) interval() time.Duration {
	if w.Interval <= 0 {
		return 10 * time.Second
	}
	return w.Interval
}

func (w *StatusWriter) forceRefresh() time.Duration {
	if w.ForceRefresh <= 0 {
		return DefaultForceRefresh
	}
	return w.ForceRefresh
}

// spacing is the least time between two write starts: 1/MaxWritesPerSecond.
func (w *StatusWriter) spacing() time.Duration {
	r := w.MaxWritesPerSecond
	if r <= 0 {
		r = DefaultMaxWritesPerSecond
	}
	return time.Duration(float64(time.Second) / r)
}

func (w *StatusWriter) clock() clock.WithTicker {
	if w.Clock == nil {
		return clock.RealClock{}
	}
	return w.Clock
}

// tenantStatus and poolStatus are what the scheduler applies: the API's own
// status types with only the scheduler-owned fields set. ObservedGeneration
// belongs to the operator; the scheduler leaves it zero, so it is omitted
// from the apply and the operator's ownership of it is untouched.
type (
	tenantStatus = v1alpha1.TenantQuotaStatus
	poolStatus   = v1alpha1.ProviderPoolStatus
)

func ptr(v int64) *int64 { return &v }

func mtime(t time.Time) *metav1.Time {
	if t.IsZero() {
		return nil
	}
	m := metav1.NewTime(t.UTC().Truncate(time.Second))
	return &m
}

// mtimeCeil is mtime rounded up to the second: the end of a pause is never
// shown before it.
func mtimeCeil(t time.Time) *metav1.Time {
	if t.IsZero() {
		return nil
	}
	if u := t.Truncate(time.Second); !u.Equal(t) {
		t = u.Add(time.Second)
	}
	return mtime(t)
}

// suspendedMessage is the Throttled message of a tenant suspended by the
// limits named in zero (spec paths); dryRun: the tenant's mode is DryRun,
// whose requests are admitted all the same.
func suspendedMessage(zero []string, dryRun bool) string {
	names := zero[0]
	verb := "is"
	if n := len(zero); n > 1 {
		names = strings.Join(zero[:n-1], ", ") + " and " + zero[n-1]
		verb = "are"
	}
	msg := fmt.Sprintf("A limit of 0 suspends the tenant: %s %s 0; requests are refused with 403 tenant_suspended.", names, verb)
	if dryRun {
		msg = fmt.Sprintf("A limit of 0 suspends the tenant: %s %s 0; in DryRun mode requests are admitted and counted in status.dryRunRejections (tenant_suspended).", names, verb)
	}
	return msg
}

func cond(typ string, ok bool, gen int64, reason, msg string) metav1.Condition {
	s := metav1.ConditionFalse
	if ok {
		s = metav1.ConditionTrue
	}
	return metav1.Condition{Type: typ, Status: s, ObservedGeneration: gen, Reason: reason, Message: truncateMessage(msg)}
}

// truncateMessage cuts msg to maxMessageBytes on a UTF-8 boundary, ending
// it with "..." when cut.
func truncateMessage(msg string) string {
	if len(msg) <= maxMessageBytes {
		return msg
	}
	cut := maxMessageBytes - len("...")
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + "..."
}

// WriteOnce runs one pass bounded by Interval and returns the number of
// writes.
func (w *StatusWriter) WriteOnce(ctx context.Context) (int, error) {
	r, err := w.Pass(ctx, w.interval())
	return r.Writes, err
}

// Pass builds every object's status from a registry snapshot, marks the
// changed ones dirty and writes dirty objects in priority order, paced at
// MaxWritesPerSecond on Clock, until none is left, ctx is done, or the next
// write would start max or more after the pass began.
func (w *StatusWriter) Pass(ctx context.Context, max time.Duration) (PassResult, error) {
	return w.pass(ctx, max, false)
}

// pass is Pass; burst writes the pool and the budget- and counter-dirty
// objects first, unpaced (final).
func (w *StatusWriter) pass(ctx context.Context, max time.Duration, burst bool) (PassResult, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.State.isPoolGone() {
		// The ProviderPool is deleted and this scheduler with it (its
		// Deployment is garbage-collected): the operator has set the
		// tenants' Serving to False PoolNotFound and removed this
		// writer's fields (but status.budget and the counters), and a
		// write now would bring back a Serving True that nothing would
		// correct. What the writer knew of the objects is forgotten: the
		// operator removes this writer's fields from the tenants
		// meanwhile, so should the pool come back (deleted
		// and created again while this scheduler still runs), every
		// object's status is read again and written where it differs,
		// rather than taken for the one last written here.
		w.objs = nil
		return PassResult{}, nil
	}
	clk := w.clock()
	now := clk.Now()
	deadline := now.Add(max)
	snap := w.Registry.Snapshot(now)
	if w.objs == nil {
		w.objs = map[string]*objState{}
	}
	seen := make(map[string]struct{}, len(snap.Objects)+1)
	var errs []error

	tenants := map[string]registry.TenantSnapshot{}
	for _, t := range snap.Tenants {
		tenants[t.Name] = t
	}
	for _, o := range snap.Objects {
		st := tenantStatus{}
		t, served := tenants[o.Name]
		if o.Err == nil && !served {
			continue
		}
		key := "TenantQuota/" + o.Name
		ob := w.object(ctx, now, "TenantQuota", o.Name, o.UID)
		seen[key] = struct{}{}
		if !ob.read || (served && !w.carry(ob, &t)) {
			// Its counters do not include what its status holds yet
			// (unread, or the registry still serves the object it
			// replaced): written once they do, never below the status.
			ob.clean()
			continue
		}
		if o.Err != nil {
			reason := v1alpha1.ReasonInvalidSpec
			if errors.Is(o.Err, registry.ErrDuplicateTenantID) {
				reason = v1alpha1.ReasonDuplicateTenantID
			}
			st.Conditions = []metav1.Condition{cond(v1alpha1.ConditionServing, false, o.Generation, reason, o.Err.Error())}
			// Keep the budget figures (the live ones while a previous
			// policy is still served, else the last built): the next
			// scheduler seeds its budgets from status.budget, and an
			// apply without it would remove it.
			if served && t.Budget != nil {
				st.Budget = budgetStatus(t.Budget)
			} else if ob.lastBudget != nil {
				st.Budget = ob.lastBudget.DeepCopy()
			}
			// And the counters, so that they neither vanish nor restart
			// from 0 for the next scheduler.
			if served {
				setCounters(&st, &t)
			} else {
				ob.lastCounts.set(&st)
			}
		} else {
			serving := cond(v1alpha1.ConditionServing, true, t.Generation, v1alpha1.ReasonLoaded, fmt.Sprintf("The scheduler serves generation %d.", t.Generation))
			if ki := t.KeyIssue; ki != nil && snap.Pool != nil && snap.Pool.IdentMode == registry.IdentifyAPIKey {
				// Loaded, but no key authenticates as the tenant.
				serving = cond(v1alpha1.ConditionServing, false, t.Generation, ki.Reason, ki.Message)
			}
			limited := cond(v1alpha1.ConditionThrottled, false, t.Generation, v1alpha1.ReasonWithinLimits, "No limit binds.")
			if zero := suspendingLimits(t.Limits); len(zero) > 0 {
				limited = cond(v1alpha1.ConditionThrottled, true, t.Generation, ReasonSuspended, suspendedMessage(zero, t.DryRun))
			} else if t.Limiter.Limited {
				limited = cond(v1alpha1.ConditionThrottled, true, t.Generation, v1alpha1.ReasonTenantLimited,
					"The tenant is at its token, request, concurrency or KV-block limit.")
			}
			st.Conditions = []metav1.Condition{serving, limited}
			st.Backlog, st.InFlight, st.KVBlocksInUse = ptr(t.Queued), ptr(t.Limiter.InFlight), ptr(t.Limiter.KVBlocks)
			if t.Limiter.TokensRemaining >= 0 {
				st.TokensRemaining = ptr(t.Limiter.TokensRemaining)
			}
			if t.Limiter.RequestsRemaining >= 0 {
				st.RequestsRemaining = ptr(t.Limiter.RequestsRemaining)
			}
			setCounters(&st, &t)
			if t.Budget != nil {
				st.Budget = budgetStatus(t.Budget)
			}
			u, uc := usageStatus(t)
			st.Usage = u
			st.Conditions = append(st.Conditions, uc)
		}
		if served {
			ob.lastCounts = countsOf(&st)
		}
		if err := w.stage(now, ob, false, &st.Conditions, st.Budget, func(last *metav1.Time) any {
			st.LastReportTime = last
			return &st
		}); err != nil {
			errs = append(errs, err)
		}
		ob.countsDirty = !ob.dirtySince.IsZero() && ob.base != nil && *ob.lastCounts.base() != *ob.base
	}

	po := w.object(ctx, now, "ProviderPool", w.PoolName, "")
	seen["ProviderPool/"+w.PoolName] = struct{}{}
	if po.throttledBase != nil {
		// The snapshot was taken before: it gets what the seed adds.
		snap.UpstreamThrottled += w.Registry.SeedUpstreamThrottled(string(po.uid), *po.throttledBase)
		po.throttledBase, po.carried = nil, true
	}
	if po.carried {
		ps := w.poolStatus(snap)
		if err := w.stage(now, po, true, &ps.Conditions, nil, func(last *metav1.Time) any {
			ps.LastReportTime = last
			return &ps
		}); err != nil {
			errs = append(errs, err)
		}
	} else {
		po.clean() // status unread: its upstreamThrottled is not carried yet
	}
	for key := range w.objs {
		if _, ok := seen[key]; !ok {
			delete(w.objs, key) // deleted, or no longer this writer's
		}
	}

	res, err := w.writeDirty(ctx, now, deadline, burst)
	if err != nil {
		errs = append(errs, err)
	}
	return res, errors.Join(errs...)
}

// carry makes sure that the counters of t, a served tenant as the pass's
// snapshot holds it, include what the status of its TenantQuota held when
// o (the writer's state of that object) was first read: when the registry
// says they do not yet, it seeds them from o.base
// (registry.Tenant.SeedCounters, once per tenant and object) and adds what
// that added to t's figures (taken before). It reports false when the
// counters cannot include it yet: the status has not been read, or the
// registry's tenant serves another object of that name (not yet the one
// read, created again under the name).
func (w *StatusWriter) carry(o *objState, t *registry.TenantSnapshot) bool {
	if t.CountersSeeded {
		return true
	}
	if o.base == nil {
		return false
	}
	rt := w.Registry.Tenant(t.ID)
	if rt == nil {
		return false
	}
	added, ok := rt.SeedCounters(string(o.uid), *o.base)
	if !ok {
		return false
	}
	t.Completed += added.Completed
	t.Expired += added.Expired
	t.Rejections += added.Rejections
	t.TokensUsed += added.TokensUsed
	t.DryRunRejections += added.DryRunRejections
	t.CountersSeeded = true
	return true
}

// setCounters sets st's cumulative counters from the served tenant t:
// completedJobs, expiredJobs, rejections and tokensUsed always,
// dryRunRejections when the tenant is in DryRun mode or has any.
func setCounters(st *tenantStatus, t *registry.TenantSnapshot) {
	st.CompletedJobs, st.ExpiredJobs, st.Rejections, st.TokensUsed = ptr(t.Completed), ptr(t.Expired), ptr(t.Rejections), ptr(t.TokensUsed)
	if t.DryRun || t.DryRunRejections > 0 {
		st.DryRunRejections = ptr(t.DryRunRejections)
	}
}

// statusCounts are the cumulative counter fields of a TenantQuota status
// (nil: absent), kept for a tenant that is not served (see objState).
type statusCounts struct {
	completed, expired, rejections, tokensUsed, dryRunRejections *int64
}

// countsOf returns the counter fields of st.
func countsOf(st *tenantStatus) statusCounts {
	return statusCounts{st.CompletedJobs, st.ExpiredJobs, st.Rejections, st.TokensUsed, st.DryRunRejections}
}

// set sets the counter fields of st to c.
func (c statusCounts) set(st *tenantStatus) {
	st.CompletedJobs, st.ExpiredJobs, st.Rejections, st.TokensUsed, st.DryRunRejections = c.completed, c.expired, c.rejections, c.tokensUsed, c.dryRunRejections
}

// base returns the counters c holds (absent: 0), as the base a scheduler
// carries on from (registry.Tenant.SeedCounters).
func (c statusCounts) base() *registry.Counters {
	v := func(p *int64) int64 {
		if p == nil {
			return 0
		}
		return *p
	}
	return &registry.Counters{Completed: v(c.completed), Expired: v(c.expired), Rejections: v(c.rejections),
		TokensUsed: v(c.tokensUsed), DryRunRejections: v(c.dryRunRejections)}
}

// budgetStatus is a tenant's status.budget from the registry's figures.
func budgetStatus(b *registry.BudgetStatus) *v1alpha1.BudgetStatus {
	return &v1alpha1.BudgetStatus{Used: ptr(b.Used), Remaining: ptr(b.Remaining), ResetTime: mtime(b.ResetTime)}
}

// object returns the writer's state of the object, created (and its status
// read) on first sight. uid is the object's UID in the registry (""
// unknown): when it differs from the one the state was built for, or from
// the UID read from the API server, the object was deleted and created
// again under the same name, and its state is built afresh.
func (w *StatusWriter) object(ctx context.Context, now time.Time, kind, name, uid string) *objState {
	key := kind + "/" + name
	o := w.objs[key]
	if o != nil && uid != "" && ((o.regUID != "" && o.regUID != uid) || (o.uid != "" && string(o.uid) != uid)) {
		o = nil
	}
	if o == nil {
		o = &objState{kind: kind, name: name}
		w.load(ctx, o)
		o.checked = now
		w.objs[key] = o
	} else if !o.read || (o.dirtySince.IsZero() && now.Sub(o.checked) >= w.forceRefresh()) {
		// Clean for ForceRefresh: check that the API server still holds
		// what was written (another replica leading during a partition,
		// or a hand edit, may have changed it since). Unread: the counters
		// cannot be carried on before it is read.
		w.load(ctx, o)
		o.checked = now
	}
	if uid != "" {
		o.regUID = uid
	}
	return o
}

func (w *StatusWriter) poolStatus(snap registry.Snapshot) poolStatus {
	ps := poolStatus{}
	var gen int64
	var loadErr error
	if w.State != nil {
		gen, loadErr = w.State.pool()
	}
	switch {
	case loadErr != nil:
		ps.Conditions = append(ps.Conditions, cond(v1alpha1.ConditionServing, false, gen, v1alpha1.ReasonInvalidSpec, loadErr.Error()))
	case snap.Pool == nil:
		ps.Conditions = append(ps.Conditions, cond(v1alpha1.ConditionServing, false, 0, v1alpha1.ReasonSchedulerProgressing, "The scheduler has not loaded the pool."))
	default:
		gen = snap.Pool.Generation
		ps.Conditions = append(ps.Conditions, cond(v1alpha1.ConditionServing, true, gen, v1alpha1.ReasonLoaded,
			fmt.Sprintf("The scheduler serves generation %d.", gen)))
	}
	var paused, atReserve bool
	var pausedUntil time.Time
	remaining := int64(-1)
	var pausedModels, otherModels []v1alpha1.ModelQuotaStatus
	for _, m := range snap.Models {
		s := m.Status
		paused = paused || s.Paused
		atReserve = atReserve || s.AtReserve
		// Only a pause in force: an ended one leaves status.pausedUntil
		// (omitted from the apply, which removes it).
		if s.Paused && s.PausedUntil.After(pausedUntil) {
			pausedUntil = s.PausedUntil
		}
		if s.TokensRemaining >= 0 && (remaining < 0 || s.TokensRemaining < remaining) {
			remaining = s.TokensRemaining
		}
		mq := v1alpha1.ModelQuotaStatus{Name: m.Name, Dialect: s.Dialect, TokensResetTime: mtime(s.TokensReset), RequestsResetTime: mtime(s.RequestsReset)}
		if s.TokensLimit > 0 {
			mq.LimitTokens = ptr(s.TokensLimit)
		}
		if s.TokensRemaining >= 0 {
			mq.RemainingTokens = ptr(s.TokensRemaining)
		}
		if s.RequestsLimit > 0 {
			mq.LimitRequests = ptr(s.RequestsLimit)
		}
		if s.RequestsRemaining >= 0 {
			mq.RemainingRequests = ptr(s.RequestsRemaining)
		}
		if s.Paused {
			mq.PausedUntil = mtimeCeil(s.PausedUntil)
			pausedModels = append(pausedModels, mq)
		} else {
			otherModels = append(otherModels, mq)
		}
	}
	// snap.Models is sorted by name: paused models first, then the others,
	// each by name, at most maxShownModels and maxShownModelNameBytes of
	// names.
	ps.Models = append(pausedModels, otherModels...)
	shown := listedWithin(len(ps.Models), maxShownModels, maxShownModelNameBytes, func(i int) int { return len(ps.Models[i].Name) })
	if n := len(ps.Models); n > shown {
		ps.Models = ps.Models[:shown:shown]
		ps.ModelsNotShown = ptr(int64(n - shown))
	}
	switch {
	case paused:
		ps.Conditions = append(ps.Conditions, cond(v1alpha1.ConditionThrottled, true, gen, v1alpha1.ReasonUpstreamPaused,
			"The provider answered 429; every start waits for its reset."))
	case atReserve:
		ps.Conditions = append(ps.Conditions, cond(v1alpha1.ConditionThrottled, true, gen, v1alpha1.ReasonAtReserve,
			"Batch work is held at the interactive reserve."))
	default:
		ps.Conditions = append(ps.Conditions, cond(v1alpha1.ConditionThrottled, false, gen, v1alpha1.ReasonWithinLimits, "Nothing is held back."))
	}
	if remaining >= 0 {
		ps.RemainingTokens = ptr(remaining)
	}
	ps.PausedUntil = mtimeCeil(pausedUntil)
	ps.Backlog, ps.InFlight = ptr(snap.Backlog), ptr(snap.InFlight)
	ps.Tenants, ps.UpstreamThrottled = ptr(int64(len(snap.Tenants))), ptr(snap.UpstreamThrottled)
	ps.UsageTiers = usageTiers(snap.Tenants)
	return ps
}

// stage completes conds with lastTransitionTime and marks the object o
// dirty when its payload differs from what the API server holds (or, for
// the pool, when ForceRefresh passed since it was written); clean
// otherwise. budget is the payload's status.budget (nil for the pool);
// build returns the status with the given lastReportTime.
func (w *StatusWriter) stage(now time.Time, o *objState, heartbeat bool, conds *[]metav1.Condition, budget *v1alpha1.BudgetStatus, build func(*metav1.Time) any) error {
	if budget != nil {
		o.lastBudget = budget.DeepCopy()
	}
	stamp := metav1.NewTime(now.UTC().Truncate(time.Second))
	flip := false
	for i := range *conds {
		c := &(*conds)[i]
		c.LastTransitionTime = stamp
		if old := meta.FindStatusCondition(o.conds, c.Type); old != nil && old.Status == c.Status {
			c.LastTransitionTime = old.LastTransitionTime
			continue
		}
		flip = true
		if p := meta.FindStatusCondition(o.pendingConds, c.Type); p != nil && p.Status == c.Status {
			c.LastTransitionTime = p.LastTransitionTime
		}
	}
	payload, err := json.Marshal(build(nil))
	if err != nil {
		return err
	}
	if o.server != nil {
		sp, err := serverPayload(o.server, *conds)
		o.known = err == nil && bytes.Equal(sp, payload)
		if o.known {
			o.payload = sp
		}
		o.server = nil
	}
	if o.known && bytes.Equal(payload, o.payload) && (!heartbeat || now.Sub(o.at) < w.forceRefresh()) {
		o.clean()
		return nil
	}
	if o.dirtySince.IsZero() {
		o.dirtySince = now
	}
	o.budgetDirty = budget != nil && budget.Used != nil && (o.budget == nil || o.budget.Used == nil || *o.budget.Used != *budget.Used)
	o.pendingBudget = budget
	o.flip, o.pending, o.build = flip, payload, build
	o.pendingConds = append(o.pendingConds[:0], *conds...)
	return nil
}

// clean marks o as holding nothing to write.
func (o *objState) clean() {
	o.dirtySince, o.flip, o.budgetDirty, o.pending, o.build, o.pendingConds, o.pendingBudget = time.Time{}, false, false, nil, nil, nil, nil
	o.countsDirty = false
}

// serverPayload is the payload of the scheduler's part of a status read
// from the API server: its conditions of the types in conds (in that order),
// every other field but observedGeneration (the operator's) and
// lastReportTime.
func serverPayload(server any, conds []metav1.Condition) ([]byte, error) {
	pick := func(have []metav1.Condition) []metav1.Condition {
		var out []metav1.Condition
		for _, c := range conds {
			if h := meta.FindStatusCondition(have, c.Type); h != nil {
				out = append(out, *h)
			}
		}
		return out
	}
	switch s := server.(type) {
	case *tenantStatus:
		c := *s
		c.Conditions, c.ObservedGeneration, c.LastReportTime = pick(s.Conditions), 0, nil
		return json.Marshal(c)
	case *poolStatus:
		c := *s
		c.Conditions, c.ObservedGeneration, c.LastReportTime = pick(s.Conditions), 0, nil
		return json.Marshal(c)
	}
	return nil, fmt.Errorf("unexpected status %T", server)
}

// Write priority classes, first written first.
const (
	classPool = iota
	classOverdue
	classBudget
	classFlip
	classRest
)

// writeDirty writes dirty objects in priority order, paced on the clock,
// until none is left, ctx is done, or the next write would start at or
// after deadline. With burst (final), the pool and every budget- or
// counter-dirty object go first and are written without pacing,
// finalWriteConcurrency at a time, bounded only by ctx.
func (w *StatusWriter) writeDirty(ctx context.Context, now, deadline time.Time, burst bool) (PassResult, error) {
	overdue := w.forceRefresh()
	type item struct {
		class int
		key   string
		o     *objState
	}
	var dirty []item
	for key, o := range w.objs {
		if o.dirtySince.IsZero() {
			continue
		}
		it := item{class: classRest, key: key, o: o}
		switch {
		case o.kind == "ProviderPool":
			it.class = classPool
		case burst && (o.budgetDirty || o.countsDirty):
			it.class = classBudget
		case now.Sub(o.dirtySince) >= overdue:
			it.class = classOverdue
		case o.budgetDirty:
			it.class = classBudget
		case o.flip:
			it.class = classFlip
		}
		if burst && it.class == classOverdue {
			it.class = classFlip // after the burst, paced
		}
		dirty = append(dirty, it)
	}
	sort.Slice(dirty, func(i, j int) bool {
		a, b := dirty[i], dirty[j]
		if a.class != b.class {
			return a.class < b.class
		}
		if !a.o.dirtySince.Equal(b.o.dirtySince) {
			return a.o.dirtySince.Before(b.o.dirtySince)
		}
		return a.key < b.key
	})
	clk := w.clock()
	var res PassResult
	var errs []error
	if burst {
		n := 0
		for n < len(dirty) && dirty[n].class <= classBudget {
			n++
		}
		at := clk.Now()
		applied := make([]error, n)
		sem := make(chan struct{}, finalWriteConcurrency)
		var wg sync.WaitGroup
		for i := range n {
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				applied[i] = w.apply(ctx, at, dirty[i].o)
			}()
		}
		wg.Wait()
		for i := range n {
			ok, err := w.commit(dirty[i].key, dirty[i].o, at, applied[i])
			if err != nil {
				errs = append(errs, err)
			}
			if ok {
				res.Writes++
			}
		}
		w.nextWrite = at.Add(w.spacing())
		dirty = dirty[n:]
	}
	for _, it := range dirty {
		if ctx.Err() != nil {
			break
		}
		t := clk.Now()
		if t.Before(w.nextWrite) {
			if !w.nextWrite.Before(deadline) {
				break
			}
			clk.Sleep(w.nextWrite.Sub(t))
			t = clk.Now()
		} else if !t.Before(deadline) {
			break
		}
		w.nextWrite = t.Add(w.spacing())
		ok, err := w.commit(it.key, it.o, t, w.apply(ctx, t, it.o))
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			res.Writes++
		}
	}
	for _, o := range w.objs {
		if !o.dirtySince.IsZero() {
			res.Dirty++
		}
	}
	return res, errors.Join(errs...)
}

// apply sends one dirty object's latest status with lastReportTime at. It
// reads o and changes nothing, so that the shutdown burst may run several
// at once.
func (w *StatusWriter) apply(ctx context.Context, at time.Time, o *objState) error {
	// ToUnstructured keeps integers int64 (a JSON round trip through a map
	// would turn them into float64, wrong above 2^53).
	status, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o.build(mtime(at)))
	if err != nil {
		return err
	}
	u := &unstructured.Unstructured{Object: map[string]any{"status": status}}
	u.SetAPIVersion(v1alpha1.GroupVersion.String())
	u.SetKind(o.kind)
	u.SetNamespace(w.Namespace)
	u.SetName(o.name)
	return w.Client.Status().Patch(ctx, u, client.Apply, client.FieldOwner(v1alpha1.FieldManagerScheduler), client.ForceOwnership)
}

// commit records the outcome err of apply for the object o under key. It
// reports whether the API server took the write; an object not found is
// forgotten (it is deleted; the registry drops it soon, and a new object
// of the same name starts afresh).
func (w *StatusWriter) commit(key string, o *objState, at time.Time, err error) (bool, error) {
	if err != nil {
		if apierrors.IsNotFound(err) {
			delete(w.objs, key)
			return false, nil
		}
		return false, fmt.Errorf("applying %s status: %w", key, err)
	}
	w.recordTransitions(o)
	o.known, o.payload, o.at, o.checked, o.budget = true, o.pending, at, at, o.pendingBudget
	if o.kind == "TenantQuota" {
		o.base = o.lastCounts.base() // the counters of the payload written
	}
	o.conds = append(o.conds[:0], o.pendingConds...)
	o.clean()
	return true, nil
}

// load reads the object's current status on first sight (to keep its
// conditions' lastTransitionTime across a scheduler restart, to carry its
// counters on, and to skip writing a status the API server already holds);
// nothing but o.read false when unreadable.
func (w *StatusWriter) load(ctx context.Context, o *objState) {
	key := client.ObjectKey{Namespace: w.Namespace, Name: o.name}
	switch o.kind {
	case "TenantQuota":
		var obj v1alpha1.TenantQuota
		o.read = w.Client.Get(ctx, key, &obj) == nil
		if o.read {
			o.conds, o.server, o.uid = obj.Status.Conditions, &obj.Status, obj.UID
			o.budget, o.lastBudget = obj.Status.Budget, obj.Status.Budget
			o.lastCounts = countsOf(&obj.Status)
			o.base = o.lastCounts.base()
			if t := obj.Status.LastReportTime; t != nil {
				o.at = t.Time
			}
		}
	case "ProviderPool":
		var obj v1alpha1.ProviderPool
		o.read = w.Client.Get(ctx, key, &obj) == nil
		if o.read {
			o.conds, o.server, o.uid = obj.Status.Conditions, &obj.Status, obj.UID
			var throttled int64
			if p := obj.Status.UpstreamThrottled; p != nil {
				throttled = *p
			}
			o.throttledBase = &throttled
			if t := obj.Status.LastReportTime; t != nil {
				o.at = t.Time
			}
		}
	}
}

// servingEventReasons are the reasons of a TenantQuota's Serving False
// that are recorded as Warning events (see StatusWriter.Recorder).
var servingEventReasons = map[string]bool{
	v1alpha1.ReasonInvalidSpec: true,
	ReasonNoCredentials:        true,
	ReasonCredentialsNotFound:  true,
}

// recordTransitions emits the Warning events of a TenantQuota whose
// UsageOutlier condition turns True, or whose Serving condition turns False
// (or changes reason while False) with a reason of servingEventReasons,
// with the status about to be marked written (o.pendingConds against
// o.conds, the last written).
func (w *StatusWriter) recordTransitions(o *objState) {
	if w.Recorder == nil || o.kind != "TenantQuota" {
		return
	}
	obj := &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Namespace: w.Namespace, Name: o.name, UID: o.uid}}
	if now := meta.FindStatusCondition(o.pendingConds, v1alpha1.ConditionServing); now != nil &&
		now.Status == metav1.ConditionFalse && servingEventReasons[now.Reason] {
		if was := meta.FindStatusCondition(o.conds, v1alpha1.ConditionServing); was == nil ||
			was.Status != metav1.ConditionFalse || was.Reason != now.Reason {
			w.Recorder.Event(obj, corev1.EventTypeWarning, now.Reason, now.Message)
		}
	}
	now := meta.FindStatusCondition(o.pendingConds, v1alpha1.ConditionUsageOutlier)
	if now == nil || now.Status != metav1.ConditionTrue {
		return
	}
	if was := meta.FindStatusCondition(o.conds, v1alpha1.ConditionUsageOutlier); was != nil && was.Status == metav1.ConditionTrue {
		return
	}
	w.Recorder.Event(obj, corev1.EventTypeWarning, now.Reason, now.Message)
}
