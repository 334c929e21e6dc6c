package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// DefaultForceRefresh is the longest an unchanged status goes without a
// write (so lastReportTime shows the scheduler is alive): 5 minutes.
const DefaultForceRefresh = 5 * time.Minute

// State is what the sync reconcilers tell the status writer beyond the
// registry: the last pool load error.
type State struct {
	mu         sync.Mutex
	poolErr    error
	poolErrGen int64
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
// tenants every Interval with server-side apply on the status subresource
// under field manager fairshare-scheduler, sending only the fields it owns.
// An object whose payload (ignoring lastReportTime) equals the last one
// written is skipped, unless ForceRefresh has passed since (BC-42;
// style 2.4). Conditions keep their lastTransitionTime unless their status
// flips.
type StatusWriter struct {
	// Client writes status (and reads the current conditions from the cache).
	Client client.Client
	// Registry provides the figures.
	Registry *registry.Registry
	// State provides the pool's load error; may be nil.
	State *State
	// Namespace and PoolName select the objects.
	Namespace, PoolName string
	// Interval between passes; <= 0 means 10 s.
	Interval time.Duration
	// ForceRefresh bounds how long an unchanged status goes unwritten; <= 0
	// means DefaultForceRefresh.
	ForceRefresh time.Duration
	// Clock drives the ticker and timestamps; nil is the real clock.
	Clock clock.WithTicker
	// Log receives write errors.
	Log logr.Logger

	mu   sync.Mutex
	last map[string]written
}

// written is the last payload applied to one object.
type written struct {
	payload []byte
	at      time.Time
	conds   []metav1.Condition
}

// NeedLeaderElection: only the leader writes status.
func (w *StatusWriter) NeedLeaderElection() bool { return true }

// Start writes status every Interval until ctx is cancelled.
func (w *StatusWriter) Start(ctx context.Context) error {
	clk := w.clock()
	interval := w.Interval
	if interval <= 0 {
		interval = 10 * time.Second
	}
	t := clk.NewTicker(interval)
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

// final writes the figures once more at shutdown, so that a graceful
// restart loses none of the period's budget spend (the next scheduler
// seeds its budgets from status.budget). It is bounded by
// finalWriteTimeout.
func (w *StatusWriter) final(ctx context.Context) {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalWriteTimeout)
	defer cancel()
	if _, err := w.WriteOnce(fctx); err != nil {
		w.Log.Error(err, "writing status at shutdown")
	}
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

func cond(typ string, ok bool, gen int64, reason, msg string) metav1.Condition {
	s := metav1.ConditionFalse
	if ok {
		s = metav1.ConditionTrue
	}
	return metav1.Condition{Type: typ, Status: s, ObservedGeneration: gen, Reason: reason, Message: msg}
}

// WriteOnce builds every object's status from a registry snapshot and
// applies the changed ones. It returns the number of writes.
func (w *StatusWriter) WriteOnce(ctx context.Context) (int, error) {
	now := w.clock().Now()
	snap := w.Registry.Snapshot(now)
	w.mu.Lock()
	if w.last == nil {
		w.last = map[string]written{}
	}
	w.mu.Unlock()
	var errs []error
	writes := 0

	tenants := map[string]registry.TenantSnapshot{}
	for _, t := range snap.Tenants {
		tenants[t.Name] = t
	}
	for _, o := range snap.Objects {
		st := tenantStatus{}
		if o.Err != nil {
			reason := v1alpha1.ReasonInvalidSpec
			if errors.Is(o.Err, registry.ErrDuplicateTenantID) {
				reason = v1alpha1.ReasonDuplicateTenantID
			}
			st.Conditions = []metav1.Condition{cond(v1alpha1.ConditionServing, false, o.Generation, reason, o.Err.Error())}
		} else if t, ok := tenants[o.Name]; ok {
			limited := cond(v1alpha1.ConditionThrottled, false, t.Generation, v1alpha1.ReasonWithinLimits, "No limit binds.")
			if t.Limiter.Limited {
				limited = cond(v1alpha1.ConditionThrottled, true, t.Generation, v1alpha1.ReasonTenantLimited,
					"The tenant is at its token, request, concurrency or KV-block limit.")
			}
			st.Conditions = []metav1.Condition{
				cond(v1alpha1.ConditionServing, true, t.Generation, v1alpha1.ReasonLoaded, fmt.Sprintf("The scheduler serves generation %d.", t.Generation)),
				limited,
			}
			st.Backlog, st.InFlight, st.KVBlocksInUse = ptr(t.Queued), ptr(t.Limiter.InFlight), ptr(t.Limiter.KVBlocks)
			if t.Limiter.TokensRemaining >= 0 {
				st.TokensRemaining = ptr(t.Limiter.TokensRemaining)
			}
			if t.Limiter.RequestsRemaining >= 0 {
				st.RequestsRemaining = ptr(t.Limiter.RequestsRemaining)
			}
			st.CompletedJobs, st.ExpiredJobs, st.Rejections, st.TokensUsed = ptr(t.Completed), ptr(t.Expired), ptr(t.Rejections), ptr(t.TokensUsed)
			if t.DryRun || t.DryRunRejections > 0 {
				st.DryRunRejections = ptr(t.DryRunRejections)
			}
			if b := t.Budget; b != nil {
				st.Budget = &v1alpha1.BudgetStatus{Used: ptr(b.Used), Remaining: ptr(b.Remaining), ResetTime: mtime(b.ResetTime)}
			}
		} else {
			continue
		}
		n, err := w.apply(ctx, now, "TenantQuota", o.Name, &st.Conditions, func(last *metav1.Time) any {
			st.LastReportTime = last
			return st
		})
		writes += n
		if err != nil {
			errs = append(errs, err)
		}
	}

	ps := w.poolStatus(snap)
	n, err := w.apply(ctx, now, "ProviderPool", w.PoolName, &ps.Conditions, func(last *metav1.Time) any {
		ps.LastReportTime = last
		return ps
	})
	writes += n
	if err != nil {
		errs = append(errs, err)
	}
	return writes, errors.Join(errs...)
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
	for _, m := range snap.Models {
		s := m.Status
		paused = paused || s.Paused
		atReserve = atReserve || s.AtReserve
		if s.PausedUntil.After(pausedUntil) {
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
			mq.PausedUntil = mtime(s.PausedUntil)
		}
		ps.Models = append(ps.Models, mq)
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
	ps.PausedUntil = mtime(pausedUntil)
	ps.Backlog, ps.InFlight = ptr(snap.Backlog), ptr(snap.InFlight)
	ps.Tenants, ps.UpstreamThrottled = ptr(int64(len(snap.Tenants))), ptr(snap.UpstreamThrottled)
	return ps
}

// apply writes one object's status when its payload changed (or
// ForceRefresh passed). conds is completed with lastTransitionTime (kept
// from the last write, or from the object in the cache, unless the status
// flipped). build returns the status with the given lastReportTime.
func (w *StatusWriter) apply(ctx context.Context, now time.Time, kind, name string, conds *[]metav1.Condition, build func(*metav1.Time) any) (int, error) {
	key := kind + "/" + name
	w.mu.Lock()
	prev, hadPrev := w.last[key]
	w.mu.Unlock()

	existing := prev.conds
	if !hadPrev {
		existing = w.currentConditions(ctx, kind, name)
	}
	for i := range *conds {
		c := &(*conds)[i]
		c.LastTransitionTime = metav1.NewTime(now.UTC().Truncate(time.Second))
		if old := meta.FindStatusCondition(existing, c.Type); old != nil && old.Status == c.Status {
			c.LastTransitionTime = old.LastTransitionTime
		}
	}
	payload, err := json.Marshal(build(nil))
	if err != nil {
		return 0, err
	}
	force := w.ForceRefresh
	if force <= 0 {
		force = DefaultForceRefresh
	}
	if hadPrev && bytes.Equal(payload, prev.payload) && now.Sub(prev.at) < force {
		return 0, nil
	}
	body, err := json.Marshal(build(mtime(now)))
	if err != nil {
		return 0, err
	}
	var status map[string]any
	if err := json.Unmarshal(body, &status); err != nil {
		return 0, err
	}
	u := &unstructured.Unstructured{Object: map[string]any{"status": status}}
	u.SetAPIVersion(v1alpha1.GroupVersion.String())
	u.SetKind(kind)
	u.SetNamespace(w.Namespace)
	u.SetName(name)
	if err := w.Client.Status().Patch(ctx, u, client.Apply, client.FieldOwner(v1alpha1.FieldManagerScheduler), client.ForceOwnership); err != nil {
		if apierrors.IsNotFound(err) {
			w.mu.Lock()
			delete(w.last, key)
			w.mu.Unlock()
			return 0, nil
		}
		return 0, fmt.Errorf("applying %s status: %w", key, err)
	}
	w.mu.Lock()
	w.last[key] = written{payload: payload, at: now, conds: append([]metav1.Condition(nil), (*conds)...)}
	w.mu.Unlock()
	return 1, nil
}

// currentConditions reads the object's conditions (to keep their
// lastTransitionTime across a scheduler restart); nil when unreadable.
func (w *StatusWriter) currentConditions(ctx context.Context, kind, name string) []metav1.Condition {
	key := client.ObjectKey{Namespace: w.Namespace, Name: name}
	switch kind {
	case "TenantQuota":
		var o v1alpha1.TenantQuota
		if w.Client.Get(ctx, key, &o) == nil {
			return o.Status.Conditions
		}
	case "ProviderPool":
		var o v1alpha1.ProviderPool
		if w.Client.Get(ctx, key, &o) == nil {
			return o.Status.Conditions
		}
	}
	return nil
}
