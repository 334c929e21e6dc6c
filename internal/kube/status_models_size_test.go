package kube

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/throttle"
	"github.com/fairshare-dev/fairshare/internal/usage"
)

// manyModelsSnapshot is a pool with the 64 models spec.models allows
// (names of 22 bytes, OpenAI-sized limits, both reset times; models 40 and
// 50 paused) and 16 tiers of 5 tenants each (tier names of 18 bytes, a
// median of 8 digits).
func manyModelsSnapshot() registry.Snapshot {
	reset := time.Date(2026, 11, 30, 22, 0, 0, 0, time.UTC)
	snap := registry.Snapshot{Pool: &registry.PoolPolicy{Generation: 3}, Backlog: 1234, InFlight: 56, UpstreamThrottled: 78}
	for i := range 64 {
		st := throttle.Status{TokensLimit: 30_000_000, TokensRemaining: 29_000_000, RequestsLimit: 10_000, RequestsRemaining: 9_999,
			TokensReset: reset, RequestsReset: reset, Dialect: "openai"}
		if i == 40 || i == 50 {
			st.Paused, st.PausedUntil = true, reset.Add(time.Minute)
		}
		snap.Models = append(snap.Models, registry.ModelSnapshot{Name: fmt.Sprintf("gpt-4o-mini-2024-07-%02d", i), Status: st})
	}
	for i := range 16 * 5 {
		tier := fmt.Sprintf("enterprise-plus-%02d", i/5)
		snap.Tenants = append(snap.Tenants, registry.TenantSnapshot{ID: fmt.Sprintf("t-%03d", i), Usage: usage.Evaluation{
			Tier: tier, TierActive: 5, TierMedian: 12_345_678, HasMedian: true}})
	}
	return snap
}

// TestPoolStatusUnder4KBWith64Models: the CRD allows 64 models per pool and
// a pool's tenants may name many tiers; status.models lists at most 8
// (paused first, then by name) with the rest counted in modelsNotShown, and
// status.usageTiers at most 16, so that the pool's status, as the API
// server returns it with the operator's conditions, stays under the 4 KB
// of issue 6.
func TestPoolStatusUnder4KBWith64Models(t *testing.T) {
	w := &StatusWriter{}
	ps := w.poolStatus(manyModelsSnapshot())

	var names []string
	for _, m := range ps.Models {
		names = append(names, m.Name)
	}
	want := []string{"gpt-4o-mini-2024-07-40", "gpt-4o-mini-2024-07-50", "gpt-4o-mini-2024-07-00", "gpt-4o-mini-2024-07-01",
		"gpt-4o-mini-2024-07-02", "gpt-4o-mini-2024-07-03", "gpt-4o-mini-2024-07-04", "gpt-4o-mini-2024-07-05"}
	if fmt.Sprint(names) != fmt.Sprint(want) {
		t.Errorf("status.models = %v, want %v", names, want)
	}
	if ps.ModelsNotShown == nil || *ps.ModelsNotShown != 56 {
		t.Errorf("status.modelsNotShown = %v, want 56", ps.ModelsNotShown)
	}
	if len(ps.UsageTiers) != 16 || ps.UsageTiers[0].Tier != "enterprise-plus-00" || ps.UsageTiers[15].Tier != "enterprise-plus-15" {
		t.Errorf("status.usageTiers: %d tiers (%+v), want 16 by name", len(ps.UsageTiers), ps.UsageTiers)
	}
	// Pool-wide figures still cover every model: the paused ones and the
	// smallest remaining quota.
	if ps.PausedUntil == nil || ps.RemainingTokens == nil || *ps.RemainingTokens != 29_000_000 {
		t.Errorf("pausedUntil %v, remainingTokens %v", ps.PausedUntil, ps.RemainingTokens)
	}
	at := metav1.NewTime(time.Date(2026, 11, 30, 22, 0, 0, 0, time.UTC))
	for i := range ps.Conditions {
		ps.Conditions[i].LastTransitionTime = at
	}
	ps.LastReportTime = &at
	b, err := json.Marshal(ps)
	if err != nil {
		t.Fatal(err)
	}

	// As the API server holds it: with the operator's Accepted and Ready
	// conditions and observedGeneration.
	c := newClient(t)
	ns, _, _ := fixture(t, c)
	op := v1alpha1.ProviderPoolStatus{ObservedGeneration: 3, Conditions: []metav1.Condition{
		{Type: "Accepted", Status: metav1.ConditionTrue, ObservedGeneration: 3, Reason: "Accepted", Message: "The spec is valid.", LastTransitionTime: at},
		{Type: "Ready", Status: metav1.ConditionTrue, ObservedGeneration: 3, Reason: "SchedulerReady", Message: "The scheduler Deployment is available.", LastTransitionTime: at}}}
	size, object := statusSizes(t, c, "ProviderPool", ns, "pool", &ps, &op)
	t.Logf("ProviderPool with 64 models and 16 tiers: scheduler's part %d B; status %d B, object %d B", len(b), size, object)
	if size >= maxStatusBytes {
		t.Errorf("ProviderPool status with 64 models and 16 tiers: %d B, want < %d", size, maxStatusBytes)
	}
}
