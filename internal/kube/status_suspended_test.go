package kube

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

func tenantConditions(t *testing.T, c client.Client, ns, name string) []metav1.Condition {
	t.Helper()
	var tq v1alpha1.TenantQuota
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &tq); err != nil {
		t.Fatal(err)
	}
	return tq.Status.Conditions
}

// TestThrottledSuspended: a tenant with a limit of 0 is Throttled True with
// reason Suspended and a message naming the limits that are 0 (the gateway
// answers 403 tenant_suspended), not TenantLimited; in DryRun mode the
// message says requests are admitted; with the limits raised it is within
// limits again.
func TestThrottledSuspended(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	ns, pool, tq := fixture(t, c)
	fc := clocktesting.NewFakeClock(time.Now().UTC().Truncate(time.Second))
	reg := registry.New(fc)
	if err := reg.SetPool(PoolPolicy(pool)); err != nil {
		t.Fatal(err)
	}
	w := &StatusWriter{Client: c, Registry: reg, State: &State{}, Namespace: ns, PoolName: "pool", Clock: fc}
	zero, zero32 := int64(0), int32(0)
	check := func(what string, fn func(*v1alpha1.TenantQuotaSpec), status metav1.ConditionStatus, reason, msg string) {
		t.Helper()
		if err := c.Get(ctx, client.ObjectKeyFromObject(tq), tq); err != nil {
			t.Fatal(err)
		}
		fn(&tq.Spec)
		if err := c.Update(ctx, tq); err != nil {
			t.Fatal(err)
		}
		if err := reg.UpsertTenant(TenantPolicy(tq)); err != nil {
			t.Fatal(err)
		}
		fc.Step(10 * time.Second)
		if _, err := w.WriteOnce(ctx); err != nil {
			t.Fatal(err)
		}
		wantCondition(t, what, tenantConditions(t, c, ns, "tq-a"), v1alpha1.ConditionThrottled, status, reason, msg)
	}
	check("weightedPerMinute 0", func(s *v1alpha1.TenantQuotaSpec) { s.Tokens.WeightedPerMinute = &zero },
		metav1.ConditionTrue, ReasonSuspended,
		"A limit of 0 suspends the tenant: spec.tokens.weightedPerMinute is 0; requests are refused with 403 tenant_suspended.")
	check("requests and concurrency 0", func(s *v1alpha1.TenantQuotaSpec) {
		s.Tokens = nil
		s.Requests = &v1alpha1.RequestLimits{PerMinute: &zero}
		s.MaxConcurrentRequests = &zero32
	}, metav1.ConditionTrue, ReasonSuspended,
		"A limit of 0 suspends the tenant: spec.requests.perMinute and spec.maxConcurrentRequests are 0; requests are refused with 403 tenant_suspended.")
	check("DryRun", func(s *v1alpha1.TenantQuotaSpec) {
		s.Requests, s.MaxConcurrentRequests = nil, nil
		s.MaxKVBlocks = &zero
		s.Mode = v1alpha1.ModeDryRun
	}, metav1.ConditionTrue, ReasonSuspended,
		"A limit of 0 suspends the tenant: spec.maxKVBlocks is 0; in DryRun mode requests are admitted and counted in status.dryRunRejections (tenant_suspended).")
	check("limits raised", func(s *v1alpha1.TenantQuotaSpec) {
		one := int64(1)
		s.MaxKVBlocks, s.Mode = &one, v1alpha1.ModeEnforce
	}, metav1.ConditionFalse, v1alpha1.ReasonWithinLimits, "No limit binds.")
}

func TestSuspendedMessageListsEveryZeroLimit(t *testing.T) {
	got := suspendedMessage([]string{"spec.tokens.inputPerMinute", "spec.tokens.outputPerMinute", "spec.maxKVBlocks"}, false)
	want := "A limit of 0 suspends the tenant: spec.tokens.inputPerMinute, spec.tokens.outputPerMinute and spec.maxKVBlocks are 0; requests are refused with 403 tenant_suspended."
	if got != want {
		t.Errorf("message %q, want %q", got, want)
	}
}
