package kube

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/throttle"
	"github.com/fairshare-dev/fairshare/internal/usage"
)

// TestReviewPoolStatusUnder4KBWithLongestNames: the CRD allows model names of
// 256 characters (spec.models[].name) and tier names of 63; the scheduler's
// part of the ProviderPool status alone must stay under the 4 KB status
// budget (docs/api.md: "keep the pool's status under 4 KB with 64 models and
// 16 tiers") whatever names the spec holds.
func TestReviewPoolStatusUnder4KBWithLongestNames(t *testing.T) {
	reset := time.Date(2026, 11, 30, 22, 0, 0, 0, time.UTC)
	snap := registry.Snapshot{Pool: &registry.PoolPolicy{Generation: 3}, Backlog: 1234, InFlight: 56, UpstreamThrottled: 78}
	for i := range 64 {
		st := throttle.Status{TokensLimit: 30_000_000, TokensRemaining: 29_000_000, RequestsLimit: 10_000, RequestsRemaining: 9_999,
			TokensReset: reset, RequestsReset: reset, Dialect: "openai"}
		snap.Models = append(snap.Models, registry.ModelSnapshot{Name: fmt.Sprintf("%s-%02d", strings.Repeat("m", 253), i), Status: st})
	}
	for i := range 16 * 5 {
		tier := fmt.Sprintf("%s-%02d", strings.Repeat("t", 60), i/5)
		snap.Tenants = append(snap.Tenants, registry.TenantSnapshot{ID: fmt.Sprintf("t-%03d", i), Usage: usage.Evaluation{
			Tier: tier, TierActive: 5, TierMedian: 12_345_678, HasMedian: true}})
	}
	ps := (&StatusWriter{}).poolStatus(snap)
	at := metav1.NewTime(reset)
	for i := range ps.Conditions {
		ps.Conditions[i].LastTransitionTime = at
	}
	ps.LastReportTime = &at
	b, err := json.Marshal(ps)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("scheduler's part: %d B, %d models shown, %d tiers", len(b), len(ps.Models), len(ps.UsageTiers))
	if len(b) >= maxStatusBytes {
		t.Errorf("scheduler's part of the ProviderPool status is %d B with the longest legal names, want < %d", len(b), maxStatusBytes)
	}
}

// TestReviewShortNamesStillListed: the byte caps keep 8 models of 22-byte
// names and 16 tiers of 18-byte names (manyModelsSnapshot) listed.
func TestReviewShortNamesStillListed(t *testing.T) {
	ps := (&StatusWriter{}).poolStatus(manyModelsSnapshot())
	if len(ps.Models) != 8 || ps.ModelsNotShown == nil || *ps.ModelsNotShown != 56 || len(ps.UsageTiers) != 16 {
		t.Errorf("%d models (%v not shown), %d tiers; want 8, 56, 16", len(ps.Models), ps.ModelsNotShown, len(ps.UsageTiers))
	}
}
