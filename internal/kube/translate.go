package kube

import (
	"encoding/base64"
	"fmt"
	"strings"
	"time"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/usage"
)

// API defaults, applied here when a field is unset (the API server applies
// the same defaults; objects built without them, as in tests, behave alike).
const (
	defaultReservePercent  = 20
	defaultTimeoutSeconds  = 120
	defaultDeadlineSeconds = 3600
)

// PoolPolicy translates a ProviderPool spec into the registry's pool policy:
// the one seam between the API types and the data plane for pools (style
// 2.3, "translate API -> domain at one seam").
func PoolPolicy(p *v1alpha1.ProviderPool) registry.PoolPolicy {
	s := &p.Spec
	out := registry.PoolPolicy{
		Name:                   p.Name,
		Generation:             p.Generation,
		BaseURL:                s.Upstream.BaseURL,
		Dialect:                string(s.Upstream.Dialect),
		StreamUsage:            string(s.Upstream.StreamUsage),
		ReservePercent:         defaultReservePercent,
		CostModel:              limiter.CostModel{InputWeight: int64(s.CostModel.InputTokenWeight), OutputWeight: int64(s.CostModel.OutputTokenWeight), KVBlockTokens: int64(s.CostModel.KVBlockTokens)},
		DefaultMaxOutputTokens: int64(s.CostModel.DefaultMaxOutputTokens),
		IdentMode:              string(s.TenantIdentification.Mode),
		IdentHeader:            s.TenantIdentification.Header,
		Quantum:                s.Scheduler.QuantumTokens,
		MaxWaitTokens:          derefInt64(s.Scheduler.MaxWaitTokens),
		QueueingStrategy:       string(s.Scheduler.QueueingStrategy),
		MaxQueuedJobs:          int(s.Scheduler.MaxQueuedJobs),
		UpstreamTimeout:        time.Duration(defaultTimeoutSeconds) * time.Second,
	}
	if s.Upstream.TimeoutSeconds > 0 {
		out.UpstreamTimeout = time.Duration(s.Upstream.TimeoutSeconds) * time.Second
	}
	if s.Reserve.InteractivePercent != nil {
		out.ReservePercent = int64(*s.Reserve.InteractivePercent)
	}
	if s.Reserve.BatchBorrowAfterSeconds != nil {
		out.BorrowAfter = time.Duration(*s.Reserve.BatchBorrowAfterSeconds) * time.Second
	}
	out.Usage = UsageConfig(&s.UsageMonitoring)
	for _, m := range s.Models {
		mp := registry.ModelPolicy{Name: m.Name, RateLimitGroup: m.RateLimitGroup}
		if m.TokensPerMinute != nil {
			mp.TokensPerMinute = *m.TokensPerMinute
		}
		if m.RequestsPerMinute != nil {
			mp.RequestsPerMinute = *m.RequestsPerMinute
		}
		out.Models = append(out.Models, mp)
	}
	return out
}

// UsageConfig translates a ProviderPool's spec.usageMonitoring into the
// usage package's settings, unset fields taking the API defaults
// (usage.DefaultConfig).
func UsageConfig(u *v1alpha1.UsageMonitoringSpec) usage.Config {
	c := usage.DefaultConfig()
	if u.WindowSeconds > 0 {
		c.Window = time.Duration(u.WindowSeconds) * time.Second
	}
	if u.CostRatioThreshold > 0 {
		c.CostRatio = int64(u.CostRatioThreshold)
	}
	if u.MinTierSize > 0 {
		c.MinTierSize = int(u.MinTierSize)
	}
	if u.MinWeightedTokens != nil {
		c.MinWeightedTokens = *u.MinWeightedTokens
	}
	if u.RejectionPercentThreshold > 0 {
		c.RejectionPercent = int64(u.RejectionPercentThreshold)
	}
	if u.MinRejections > 0 {
		c.MinRejections = int64(u.MinRejections)
	}
	return c.Normalized()
}

// TenantPolicy translates a TenantQuota spec into the registry's tenant
// policy (without key hashes or KeyIssue: the caller, TenantReconciler,
// adds those from the referenced Secret). Limits: an unset rate is
// unlimited, 0 suspends (limiter.Limits); enforcement Soft sets
// Limits.Soft; mode DryRun sets DryRun; the status's budget figures become
// BudgetSeed.
func TenantPolicy(tq *v1alpha1.TenantQuota) registry.TenantPolicy {
	s := &tq.Spec
	out := registry.TenantPolicy{
		ID:              tq.TenantIDOrName(),
		Name:            tq.Name,
		UID:             string(tq.UID),
		Created:         tq.CreationTimestamp.Time,
		Generation:      tq.Generation,
		Weight:          int64(s.Weight),
		Tier:            s.Tier,
		MaxQueued:       registry.DefaultMaxQueuedPerTenant,
		DefaultDeadline: defaultDeadlineSeconds * time.Second,
	}
	l := limiter.Limits{Soft: s.Enforcement == v1alpha1.EnforcementSoft}
	if t := s.Tokens; t != nil {
		l.WeightedPerMinute, l.WeightedBurst = copyInt64(t.WeightedPerMinute), copyInt64(t.Burst)
		l.InputPerMinute, l.OutputPerMinute = copyInt64(t.InputPerMinute), copyInt64(t.OutputPerMinute)
	}
	if r := s.Requests; r != nil {
		l.RequestsPerMinute, l.RequestBurst = copyInt64(r.PerMinute), copyInt64(r.Burst)
	}
	if s.MaxConcurrentRequests != nil {
		v := int64(*s.MaxConcurrentRequests)
		l.MaxConcurrent = &v
	}
	l.MaxKVBlocks = copyInt64(s.MaxKVBlocks)
	out.Limits = l
	if s.Batch.MaxQueuedJobs != nil {
		out.MaxQueued = int(*s.Batch.MaxQueuedJobs)
	}
	if s.Batch.DefaultDeadlineSeconds != nil {
		out.DefaultDeadline = time.Duration(*s.Batch.DefaultDeadlineSeconds) * time.Second
	}
	if b := s.Budget; b != nil {
		out.Budget = &registry.BudgetPolicy{WeightedTokens: b.WeightedTokens, Period: string(b.Period)}
		// The period's spend as last reported carries the budget across
		// scheduler restarts and leader changes.
		if st := tq.Status.Budget; st != nil && st.Used != nil && st.ResetTime != nil {
			out.BudgetSeed = &registry.BudgetSeed{Used: *st.Used, ResetTime: st.ResetTime.Time}
		}
	}
	if s.MaxOutputTokensPerRequest != nil {
		out.MaxOutputTokensPerRequest = *s.MaxOutputTokensPerRequest
	}
	out.DryRun = s.Mode == v1alpha1.ModeDryRun
	return out
}

// suspendingLimits returns the spec paths of the limits in l that suspend
// the tenant (a value of 0, or below: limiter.Limits), in spec order; nil
// when none does. It is TenantPolicy's translation of the limits read
// backwards, for the tenant's status.
func suspendingLimits(l limiter.Limits) []string {
	var out []string
	for _, f := range []struct {
		v    *int64
		path string
	}{
		{l.WeightedPerMinute, "spec.tokens.weightedPerMinute"},
		{l.InputPerMinute, "spec.tokens.inputPerMinute"},
		{l.OutputPerMinute, "spec.tokens.outputPerMinute"},
		{l.RequestsPerMinute, "spec.requests.perMinute"},
		{l.MaxConcurrent, "spec.maxConcurrentRequests"},
		{l.MaxKVBlocks, "spec.maxKVBlocks"},
	} {
		if f.v != nil && *f.v <= 0 {
			out = append(out, f.path)
		}
	}
	return out
}

func copyInt64(p *int64) *int64 {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// derefInt64 returns *p, or 0 when p is nil.
func derefInt64(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

// WebhookSigning decodes a Standard Webhooks signing secret as stored in a
// Secret (spec.credentials.webhookSigningKey): "whsec_" followed by base64,
// or the base64 alone, surrounding whitespace ignored; the result's Invalid
// says why a value cannot be used (missing or empty, not base64, under 16
// bytes once decoded). Never returns nil.
func WebhookSigning(raw []byte) *registry.WebhookSigning {
	v := strings.TrimPrefix(strings.TrimSpace(string(raw)), "whsec_")
	if v == "" {
		return &registry.WebhookSigning{Invalid: "the Secret has no value under webhookSigningKey"}
	}
	key, err := base64.StdEncoding.DecodeString(v)
	if err != nil {
		return &registry.WebhookSigning{Invalid: "the value is not base64 (expected whsec_<base64>)"}
	}
	if len(key) < minWebhookKeyBytes {
		return &registry.WebhookSigning{Invalid: fmt.Sprintf("the key is %d bytes; at least %d are required", len(key), minWebhookKeyBytes)}
	}
	return &registry.WebhookSigning{Key: key}
}

// minWebhookKeyBytes is the shortest signing key accepted, in bytes (128
// bits; the Standard Webhooks specification recommends 24 to 64).
const minWebhookKeyBytes = 16
