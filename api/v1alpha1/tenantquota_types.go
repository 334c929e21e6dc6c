package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// EnforcementMode says what happens when a tenant exceeds its token rate.
// +kubebuilder:validation:Enum=Hard;Soft
type EnforcementMode string

const (
	// EnforcementHard rejects interactive calls over the limit with 429 and
	// holds batch jobs in the queue until the bucket refills.
	EnforcementHard EnforcementMode = "Hard"
	// EnforcementSoft admits over the limit but deprioritises: a lower
	// effective weight in the fair queue and no access to the interactive
	// reserve (seed 002 section 5, "soft limit").
	EnforcementSoft EnforcementMode = "Soft"
)

// Mode says whether a tenant's limits are enforced or only evaluated.
// +kubebuilder:validation:Enum=Enforce;DryRun
type Mode string

const (
	// ModeEnforce applies every limit: a request over a limit is refused
	// (Hard) or deprioritised (Soft).
	ModeEnforce Mode = "Enforce"
	// ModeDryRun computes every decision as Enforce would but refuses
	// nothing: a request Enforce would refuse is admitted without being
	// charged to the tenant's limiter and is counted in
	// status.dryRunRejections and the scheduler's metrics by reason. Use it
	// to try a plan on live traffic before enforcing it. The budget still
	// counts what the tenant actually spends.
	ModeDryRun Mode = "DryRun"
)

// BudgetPeriod is the period of a tenant budget.
// +kubebuilder:validation:Enum=Day;Month
type BudgetPeriod string

const (
	// BudgetDay resets at 00:00 UTC every day.
	BudgetDay BudgetPeriod = "Day"
	// BudgetMonth resets at 00:00 UTC on the first day of every month.
	BudgetMonth BudgetPeriod = "Month"
)

// PoolRef names a ProviderPool in the TenantQuota's own namespace.
type PoolRef struct {
	// name of the ProviderPool: a DNS-1035 label of at most 53 characters,
	// as every ProviderPool name is (a name no pool can have is refused
	// rather than left waiting for a pool that cannot exist).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=53
	// +kubebuilder:validation:Pattern=`^[a-z]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
}

// TokenLimits are a tenant's token rates. Rates are published per minute and
// enforced smoothly by token buckets refilled every instant (rate/60 per
// second), so a plan of 60,000 per minute cannot spend 60,000 in its first
// second unless its burst allows it. An unset rate is unlimited; a rate of 0
// suspends the tenant.
//
// +kubebuilder:validation:XValidation:rule="!has(self.burst) || !has(self.weightedPerMinute) || self.burst * 60 >= self.weightedPerMinute",message="spec.tokens.burst must be at least one second of spec.tokens.weightedPerMinute (weightedPerMinute/60 weighted tokens)"
// +kubebuilder:validation:XValidation:rule="!has(self.burst) || has(self.weightedPerMinute)",message="spec.tokens.burst needs spec.tokens.weightedPerMinute"
type TokenLimits struct {
	// weightedPerMinute is the sustained rate of the tenant's token bucket, in
	// weighted tokens per minute (input*inputTokenWeight + output*outputTokenWeight,
	// see the pool's costModel). Admission charges prompt + max output and the
	// response's usage refunds the difference.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000000000000
	WeightedPerMinute *int64 `json:"weightedPerMinute,omitempty"`

	// burst is the capacity of the weighted token bucket, in weighted tokens:
	// the most a tenant may spend at once after being idle. Defaults to one
	// sixth of weightedPerMinute (ten seconds of refill). Needs
	// weightedPerMinute and must be at least one second of it
	// (weightedPerMinute/60). A request whose cost exceeds it can never be
	// admitted and is refused with 413 `request_too_large`.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000000000000
	Burst *int64 `json:"burst,omitempty"`

	// inputPerMinute limits prompt tokens per minute, in provider tokens.
	// Its bucket holds ten seconds of refill.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000000000000
	InputPerMinute *int64 `json:"inputPerMinute,omitempty"`

	// outputPerMinute limits generated tokens per minute, in provider tokens
	// (charged with max output, refunded from usage). Its bucket holds ten
	// seconds of refill.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000000000000
	OutputPerMinute *int64 `json:"outputPerMinute,omitempty"`
}

// RequestLimits are a tenant's request rate.
//
// +kubebuilder:validation:XValidation:rule="!has(self.burst) || !has(self.perMinute) || self.burst * 60 >= self.perMinute",message="spec.requests.burst must be at least one second of spec.requests.perMinute (perMinute/60 requests)"
// +kubebuilder:validation:XValidation:rule="!has(self.burst) || has(self.perMinute)",message="spec.requests.burst needs spec.requests.perMinute"
type RequestLimits struct {
	// perMinute is the sustained request rate, in requests per minute. Unset
	// is unlimited; 0 suspends the tenant.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000000000000
	PerMinute *int64 `json:"perMinute,omitempty"`

	// burst is the capacity of the request bucket, in requests. Defaults to
	// one sixth of perMinute, at least 1. Needs perMinute and must be at
	// least one second of it (perMinute/60).
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000000000000
	Burst *int64 `json:"burst,omitempty"`
}

// BatchSpec configures a tenant's batch jobs.
type BatchSpec struct {
	// maxQueuedJobs bounds the tenant's queued jobs; above it submissions get
	// 429 `queue_full`. 0 turns batch off for the tenant: every submission
	// gets 403 `batch_disabled`. Defaults to 1000.
	// +optional
	// +kubebuilder:default=1000
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000000
	MaxQueuedJobs *int64 `json:"maxQueuedJobs,omitempty"`

	// defaultDeadlineSeconds is the deadline of a job that sets none, in
	// seconds after submission; a job may only shorten it. Defaults to 3600.
	// +optional
	// +kubebuilder:default=3600
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=2592000
	DefaultDeadlineSeconds *int64 `json:"defaultDeadlineSeconds,omitempty"`
}

// Budget is a tenant's spend per calendar period, in weighted tokens.
type Budget struct {
	// weightedTokens is the tenant's budget per period, in weighted tokens,
	// in [0, 10^15].
	// +required
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000000000000
	WeightedTokens int64 `json:"weightedTokens"`

	// period is Day or Month (UTC calendar). Defaults to Month.
	// +optional
	// +kubebuilder:default=Month
	Period BudgetPeriod `json:"period,omitempty"`
}

// TenantCredentials references the tenant's API keys.
type TenantCredentials struct {
	// secretRef names a Secret (same namespace) whose key holds the tenant's
	// API key; clients send it as `Authorization: Bearer <key>`. Used when the
	// pool's tenantIdentification.mode is APIKey.
	// +required
	SecretRef SecretKeyRef `json:"secretRef"`

	// webhookSigningKey, when set, is the data key in the same Secret holding
	// the secret that signs the tenant's completion webhooks, in the Standard
	// Webhooks form ("whsec_" followed by base64 of 24 to 64 random bytes, or
	// the base64 alone). Signed deliveries carry webhook-id, webhook-timestamp
	// and webhook-signature headers (https://www.standardwebhooks.com/). A
	// value that is missing or not base64 makes deliveries fail rather than go
	// out unsigned. Unset: deliveries are not signed.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	WebhookSigningKey string `json:"webhookSigningKey,omitempty"`
}

// TenantQuotaSpec is one tenant's plan on a ProviderPool.
//
// +kubebuilder:validation:XValidation:rule="has(self.tenantID) == has(oldSelf.tenantID)",message="spec.tenantID is immutable (it cannot be added or removed either)"
type TenantQuotaSpec struct {
	// poolRef names the ProviderPool in this namespace. Immutable.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.poolRef is immutable"
	PoolRef PoolRef `json:"poolRef"`

	// tenantID is the tenant's identity in requests (the trusted header value,
	// metrics label, job owner). Defaults to the TenantQuota's name.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.tenantID is immutable"
	TenantID string `json:"tenantID,omitempty"`

	// weight is the tenant's share in the fair queue relative to the others:
	// weight 3 gets three times the tokens of weight 1 while both are
	// backlogged. Must be > 0; defaults to 1.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	Weight int32 `json:"weight,omitempty"`

	// tier names the tenant's plan tier (for example free, pro, enterprise).
	// Usage monitoring compares the tenant's weighted tokens over the pool's
	// window with the median of the pool's tenants of the same tier and
	// flags a tenant far above it (status condition UsageOutlier; the pool's
	// spec.usageMonitoring; seed 002 section 7). Unset is the tier "", a
	// tier like any other. It changes no limit.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$`
	Tier string `json:"tier,omitempty"`

	// tokens are the tenant's token rates.
	// +optional
	Tokens *TokenLimits `json:"tokens,omitempty"`

	// requests is the tenant's request rate.
	// +optional
	Requests *RequestLimits `json:"requests,omitempty"`

	// maxConcurrentRequests bounds the tenant's upstream calls in flight
	// (interactive and batch), at most 1,000,000. Unset is unlimited.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000
	MaxConcurrentRequests *int32 `json:"maxConcurrentRequests,omitempty"`

	// maxKVBlocks bounds the KV-cache blocks the tenant's in-flight calls hold
	// (see costModel.kvBlockTokens). Unset is unlimited.
	// +optional
	// +kubebuilder:validation:Minimum=0
	MaxKVBlocks *int64 `json:"maxKVBlocks,omitempty"`

	// batch configures the tenant's batch jobs. Defaults to {} (each field
	// at its own default).
	// +optional
	// +kubebuilder:default={}
	Batch BatchSpec `json:"batch,omitempty,omitzero"`

	// budget is an optional spend limit per calendar period.
	// +optional
	Budget *Budget `json:"budget,omitempty"`

	// enforcement is Hard (default: reject over the limit) or Soft (admit but
	// deprioritise).
	// +optional
	// +kubebuilder:default=Hard
	Enforcement EnforcementMode `json:"enforcement,omitempty"`

	// mode is Enforce (default: limits apply) or DryRun (every decision is
	// computed, counted in status.dryRunRejections and in metrics, and
	// nothing is refused).
	// +optional
	// +kubebuilder:default=Enforce
	Mode Mode `json:"mode,omitempty"`

	// maxOutputTokensPerRequest caps the output tokens one request may ask
	// for, in provider tokens. A request whose max_completion_tokens or
	// max_tokens exceeds it is refused with 400 max_tokens_too_large; a
	// request that sets neither is charged min(this, the pool's
	// costModel.defaultMaxOutputTokens) and the gateway sends that limit
	// upstream. Unset: no cap beyond the pool's.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000000
	MaxOutputTokensPerRequest *int64 `json:"maxOutputTokensPerRequest,omitempty"`

	// credentials reference the tenant's API key (APIKey identification mode).
	// +optional
	Credentials *TenantCredentials `json:"credentials,omitempty"`
}

// BudgetStatus is the tenant's spend in the current budget period.
type BudgetStatus struct {
	// used is the weighted tokens spent in the current period.
	// +optional
	Used *int64 `json:"used,omitempty"`
	// remaining is the weighted tokens left in the current period.
	// +optional
	Remaining *int64 `json:"remaining,omitempty"`
	// resetTime is when the current period ends.
	// +optional
	ResetTime *metav1.Time `json:"resetTime,omitempty"`
}

// TenantUsageStatus is the tenant's consumption over the pool's usage
// window (spec.usageMonitoring.windowSeconds). It holds the tenant's own
// figures only, so that an idle tenant's status does not change with its
// peers' traffic; its tier's median is in the ProviderPool's
// status.usageTiers.
type TenantUsageStatus struct {
	// windowSeconds is the span the figures cover, in seconds.
	// +optional
	WindowSeconds int64 `json:"windowSeconds,omitempty"`
	// weightedTokens is the weighted tokens the tenant used in the window.
	// +optional
	WeightedTokens int64 `json:"weightedTokens,omitempty"`
	// requests is the tenant's requests and jobs in the window: admitted
	// calls plus refusedRequests.
	// +optional
	Requests int64 `json:"requests,omitempty"`
	// refusedRequests is the tenant's requests and jobs refused by its own
	// limits in the window.
	// +optional
	RefusedRequests int64 `json:"refusedRequests,omitempty"`
}

// TenantQuotaStatus is the observed state of a tenant. Conditions Accepted and
// Ready are written by the operator; Serving, Throttled and the live figures
// by the pool's scheduler.
//
// The counters completedJobs, expiredJobs, rejections, tokensUsed and
// dryRunRejections are cumulative from the TenantQuota's creation: a
// scheduler that restarts, or a standby that takes the pool's Lease, carries
// on from the figures in status, so they never go backwards; what the
// previous scheduler counted after its last status write is lost. They are
// kept while the spec cannot be served and while the pool is deleted. A
// TenantQuota deleted and created again under its name starts from 0.
type TenantQuotaStatus struct {
	// conditions: Accepted, Ready (operator); Serving, Throttled,
	// UsageOutlier (scheduler).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// observedGeneration is the spec generation the operator last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// backlog is the tenant's queued batch jobs.
	// +optional
	Backlog *int64 `json:"backlog,omitempty"`

	// inFlight is the tenant's upstream calls in flight.
	// +optional
	InFlight *int64 `json:"inFlight,omitempty"`

	// kvBlocksInUse is the KV blocks the tenant's in-flight calls hold.
	// +optional
	KVBlocksInUse *int64 `json:"kvBlocksInUse,omitempty"`

	// tokensRemaining is the weighted tokens left in the tenant's bucket.
	// +optional
	TokensRemaining *int64 `json:"tokensRemaining,omitempty"`

	// requestsRemaining is the requests left in the tenant's request bucket,
	// when spec.requests.perMinute is set.
	// +optional
	RequestsRemaining *int64 `json:"requestsRemaining,omitempty"`

	// dryRunRejections is the tenant's requests and jobs that Enforce would
	// have refused (spec.mode DryRun), since the TenantQuota was created.
	// +optional
	DryRunRejections *int64 `json:"dryRunRejections,omitempty"`

	// completedJobs is the tenant's batch jobs that finished (succeeded or
	// failed), since the TenantQuota was created.
	// +optional
	CompletedJobs *int64 `json:"completedJobs,omitempty"`

	// expiredJobs is the tenant's batch jobs that reached their deadline
	// unsent, since the TenantQuota was created.
	// +optional
	ExpiredJobs *int64 `json:"expiredJobs,omitempty"`

	// rejections is the tenant's requests and jobs refused by its own
	// limits, since the TenantQuota was created.
	// +optional
	Rejections *int64 `json:"rejections,omitempty"`

	// tokensUsed is the weighted tokens the tenant spent (after refunds),
	// since the TenantQuota was created.
	// +optional
	TokensUsed *int64 `json:"tokensUsed,omitempty"`

	// budget is the spend in the current budget period, when a budget is set.
	// +optional
	Budget *BudgetStatus `json:"budget,omitempty"`

	// usage is the tenant's consumption over the pool's usage window,
	// compared with its tier (condition UsageOutlier).
	// +optional
	Usage *TenantUsageStatus `json:"usage,omitempty"`

	// lastReportTime is when the scheduler last wrote these figures: a
	// TenantQuota status is written only when its figures or conditions
	// change, so this is the time of the last change written.
	// +optional
	LastReportTime *metav1.Time `json:"lastReportTime,omitempty"`
}

// TenantQuota is one tenant's plan on a ProviderPool: weight in the fair
// queue, token / request / concurrency / KV-block limits, queue bound, default
// job deadline and budget.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=tq,categories=fairshare
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.spec.poolRef.name`
// +kubebuilder:printcolumn:name="Weight",type=integer,JSONPath=`.spec.weight`
// +kubebuilder:printcolumn:name="Tier",type=string,JSONPath=`.spec.tier`,priority=1
// +kubebuilder:printcolumn:name="Backlog",type=integer,JSONPath=`.status.backlog`
// +kubebuilder:printcolumn:name="In-Flight",type=integer,JSONPath=`.status.inFlight`
// +kubebuilder:printcolumn:name="Tokens-Left",type=integer,JSONPath=`.status.tokensRemaining`
// +kubebuilder:printcolumn:name="Expired",type=integer,JSONPath=`.status.expiredJobs`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Serving",type=string,JSONPath=`.status.conditions[?(@.type=="Serving")].status`,description="Serving condition: the pool's scheduler has loaded the tenant's plan and serves it"
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1,description="Reason of the Ready condition (PoolNotFound, DuplicateTenantID, ...)"
// +kubebuilder:printcolumn:name="Completed",type=integer,JSONPath=`.status.completedJobs`,priority=1
// +kubebuilder:printcolumn:name="Rejections",type=integer,JSONPath=`.status.rejections`,priority=1
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.spec.mode`,priority=1
// +kubebuilder:printcolumn:name="Budget-Left",type=integer,JSONPath=`.status.budget.remaining`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type TenantQuota struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the tenant's plan.
	// +required
	Spec TenantQuotaSpec `json:"spec"`

	// status is the observed tenant.
	// +optional
	Status TenantQuotaStatus `json:"status,omitempty,omitzero"`
}

// TenantQuotaList is a list of TenantQuotas.
//
// +kubebuilder:object:root=true
type TenantQuotaList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TenantQuota `json:"items"`
}

// TenantIDOrName returns spec.tenantID, or the object's name when unset.
func (t *TenantQuota) TenantIDOrName() string {
	if t.Spec.TenantID != "" {
		return t.Spec.TenantID
	}
	return t.Name
}
