package kube

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/throttle"
)

// wantCondition fails the test unless conds holds a condition typ with
// exactly that status, reason and message.
func wantCondition(t *testing.T, what string, conds []metav1.Condition, typ string, status metav1.ConditionStatus, reason, msg string) {
	t.Helper()
	c := meta.FindStatusCondition(conds, typ)
	if c == nil {
		t.Errorf("%s: no %s condition in %+v", what, typ, conds)
		return
	}
	if c.Status != status || c.Reason != reason || c.Message != msg {
		t.Errorf("%s: %s = %s %s %q;\n want %s %s %q", what, typ, c.Status, c.Reason, c.Message, status, reason, msg)
	}
}

// TestPausedUntilClearedWhenPauseEnds: after a provider 429 the pool's
// status.pausedUntil (and the model's) shows the end of the pause, rounded
// up to the second, with Throttled True UpstreamPaused; once the pause is
// over the writer's next periodic pass, with nothing else changing, removes
// both (omitted from the apply) and turns Throttled False. The writer runs
// as in the scheduler (Start, a pass per Interval) on a fake clock.
func TestPausedUntilClearedWhenPauseEnds(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	ns, pool, tq := fixture(t, c)
	t0 := time.Now().UTC().Truncate(time.Second)
	fc := clocktesting.NewFakeClock(t0)
	reg := registry.New(fc)
	if err := reg.SetPool(PoolPolicy(pool)); err != nil {
		t.Fatal(err)
	}
	if err := reg.UpsertTenant(TenantPolicy(tq)); err != nil {
		t.Fatal(err)
	}
	m := reg.Model("gpt-test")
	p, ok, _ := m.Throttle.TryStart(t0, 1, throttle.Interactive)
	if !ok {
		t.Fatal("probe refused")
	}
	m.Throttle.OnTooManyRequests(t0, p, throttle.Quota{RetryAfter: 24500 * time.Millisecond, HasRetryAfter: true})

	const interval = 10 * time.Second
	w := &StatusWriter{Client: c, Registry: reg, State: &State{}, Namespace: ns, PoolName: "pool", Clock: fc, Interval: interval}
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Start(sctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	waitPool := func(what string, ok func(*v1alpha1.ProviderPoolStatus) bool) v1alpha1.ProviderPoolStatus {
		t.Helper()
		var got v1alpha1.ProviderPool
		deadline := time.Now().Add(10 * time.Second)
		for {
			if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pool"}, &got); err == nil && ok(&got.Status) {
				return got.Status
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s: %+v", what, got.Status)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	end := metav1.NewTime(t0.Add(25 * time.Second))
	st := waitPool("the pause", func(s *v1alpha1.ProviderPoolStatus) bool { return s.PausedUntil != nil })
	if !st.PausedUntil.Equal(&end) {
		t.Errorf("pausedUntil = %v, want %v (t0 + 24.5 s rounded up)", st.PausedUntil, end)
	}
	if len(st.Models) != 1 || st.Models[0].PausedUntil == nil || !st.Models[0].PausedUntil.Equal(&end) {
		t.Errorf("models = %+v, want gpt-test paused until %v", st.Models, end)
	}
	wantCondition(t, "paused pool", st.Conditions, v1alpha1.ConditionThrottled, metav1.ConditionTrue,
		v1alpha1.ReasonUpstreamPaused, "The provider answered 429; every start waits for its reset.")

	// Passes at t0+10 s and t0+20 s: still paused, still shown.
	fc.Step(interval)
	fc.Step(interval)
	if st := waitPool("a pass during the pause", func(*v1alpha1.ProviderPoolStatus) bool { return true }); st.PausedUntil == nil {
		t.Errorf("pausedUntil removed at %v, before the pause ends at %v", fc.Now(), end)
	}

	// The pause ends at t0+25 s; the pass at t0+30 s clears it, one
	// Interval at most after its end, without any other change.
	fc.Step(interval)
	st = waitPool("pausedUntil to be removed", func(s *v1alpha1.ProviderPoolStatus) bool { return s.PausedUntil == nil })
	if len(st.Models) != 1 || st.Models[0].PausedUntil != nil {
		t.Errorf("models = %+v, want gpt-test without pausedUntil", st.Models)
	}
	wantCondition(t, "pool after the pause", st.Conditions, v1alpha1.ConditionThrottled, metav1.ConditionFalse,
		v1alpha1.ReasonWithinLimits, "Nothing is held back.")
}
