package registry

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/usage"
)

// Identification modes of a pool (mirrors the API's TenantIdentificationMode).
const (
	// IdentifyAPIKey: `Authorization: Bearer <tenant key>`, compared by SHA-256.
	IdentifyAPIKey = "APIKey"
	// IdentifyTrustedHeader: the tenant id is taken from PoolPolicy.IdentHeader.
	IdentifyTrustedHeader = "TrustedHeader"
)

// Budget periods (mirrors the API's BudgetPeriod).
const (
	// BudgetDay resets at 00:00 UTC every day.
	BudgetDay = "Day"
	// BudgetMonth resets at 00:00 UTC on the first of every month.
	BudgetMonth = "Month"
)

// Defaults applied by Validate to zero fields of PoolPolicy and TenantPolicy
// (they match the API defaults, so a policy built by hand behaves like one
// read from the cluster).
const (
	DefaultQuantum                = 4096
	DefaultMaxQueuedJobs          = 100000
	DefaultMaxQueuedPerTenant     = 1000 // applied by the translation of a TenantQuota, not by Validate
	DefaultDeadline               = time.Hour
	DefaultUpstreamTimeout        = 120 * time.Second
	DefaultDefaultMaxOutputTokens = 4096
	DefaultIdentHeader            = "X-Fairshare-Tenant"
)

// Queueing strategies of a pool's batch jobs (PoolPolicy.QueueingStrategy,
// ProviderPool spec.scheduler.queueingStrategy; the names of Kueue's
// ClusterQueue queueingStrategy).
const (
	// QueueingBestEffortFIFO: when a tenant's oldest job cannot start (its
	// model is paused, or its size does not fit the tenant's KV blocks or
	// token bucket now), one of the tenant's next LookaheadJobs jobs that can
	// start goes first; the oldest job is passed over at most MaxBypass times
	// (BC-32: a large job does not block small ones, and its own wait stays
	// bounded).
	QueueingBestEffortFIFO = "BestEffortFIFO"
	// QueueingStrictFIFO: a tenant's jobs start in the order they came.
	QueueingStrictFIFO = "StrictFIFO"
)

// How a pool learns the usage of a streamed call (PoolPolicy.StreamUsage,
// ProviderPool spec.upstream.streamUsage).
const (
	// StreamUsageIncludeUsage: a streamed call whose client did not ask for
	// usage is sent upstream with stream_options.include_usage set, and
	// settled from the provider's usage chunk (brief "cost model": "the
	// streaming usage chunk the gateway asks for"), which the client is not
	// sent.
	StreamUsageIncludeUsage = "IncludeUsage"
	// StreamUsageCountDeltas: the body is sent as the client sent it; a
	// stream without usage is settled from the count of its delta text
	// (BC-28a), for providers that refuse stream_options.
	StreamUsageCountDeltas = "CountDeltas"
)

// LookaheadJobs and MaxBypass are the fair queue's Lookahead and MaxBypass
// under QueueingBestEffortFIFO (fairqueue.Config).
const (
	LookaheadJobs = 8
	MaxBypass     = 4
)

// KeyHash is the SHA-256 of a tenant API key; the registry never holds keys.
type KeyHash [sha256.Size]byte

// HashKey returns the SHA-256 of key.
func HashKey(key string) KeyHash { return sha256.Sum256([]byte(key)) }

// ModelPolicy is one model of the pool with its provider quota hints
// (provider tokens and requests per minute; 0 unknown) and the provider
// rate limit it shares with other models (ProviderPool
// spec.models[].rateLimitGroup; "" for a limit of its own).
type ModelPolicy struct {
	Name                               string
	TokensPerMinute, RequestsPerMinute int64
	RateLimitGroup                     string
}

// PoolPolicy is the live policy of the pool, translated from the
// ProviderPool spec (internal/kube translate.go).
type PoolPolicy struct {
	// Name and Generation of the ProviderPool the policy was read from.
	Name       string
	Generation int64
	// BaseURL of the provider, without the /v1 path.
	BaseURL string
	// Dialect hint of the provider's rate-limit headers ("Auto", "OpenAI", ...).
	Dialect string
	// StreamUsage is StreamUsageIncludeUsage (the default) or
	// StreamUsageCountDeltas: whether a streamed call is sent upstream with
	// stream_options.include_usage added.
	StreamUsage string
	// Models served; requests for other models get 400 model_not_found.
	Models []ModelPolicy
	// ReservePercent of each model's quota kept for interactive calls, [0, 99].
	ReservePercent int64
	// BorrowAfter lets batch use the reserve after this much interactive
	// silence; 0 never.
	BorrowAfter time.Duration
	// CostModel converts provider tokens to weighted tokens and KV blocks.
	CostModel limiter.CostModel
	// DefaultMaxOutputTokens is charged when a request sets no max output
	// (BC-28c).
	DefaultMaxOutputTokens int64
	// IdentMode is IdentifyAPIKey or IdentifyTrustedHeader; IdentHeader the
	// header of the trusted-header mode.
	IdentMode, IdentHeader string
	// Quantum is the deficit-round-robin quantum, in weighted tokens.
	Quantum int64
	// MaxWaitTokens turns on the fair queue's aging (fairqueue.Config), in
	// weighted tokens dispatched; 0 is off.
	MaxWaitTokens int64
	// QueueingStrategy is QueueingBestEffortFIFO (the default) or
	// QueueingStrictFIFO.
	QueueingStrategy string
	// MaxQueuedJobs bounds the jobs queued across all tenants.
	MaxQueuedJobs int
	// UpstreamTimeout bounds one upstream call.
	UpstreamTimeout time.Duration
	// Usage is the pool's usage monitoring (spec.usageMonitoring): the
	// window and thresholds that flag a tenant far above its tier or with a
	// high rate of limit violations (seed 002 section 7). The zero value
	// takes usage.DefaultConfig.
	Usage usage.Config
}

// Validate fills defaults into zero fields and returns an error naming the
// first invalid field.
func (p *PoolPolicy) Validate() error {
	if p.BaseURL == "" {
		return errors.New("baseURL: required")
	}
	u, err := url.Parse(p.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("baseURL: %q is not an http(s) URL", p.BaseURL)
	}
	// The API's CEL rules (api/v1alpha1 UpstreamSpec.BaseURL), checked again
	// here for a policy that did not come through the API server: the
	// gateway appends /v1/... to the URL.
	switch {
	case u.User != nil: // first, so that no other message repeats a password
		return fmt.Errorf("baseURL: %q carries credentials (user:password@); the provider's key belongs in the credentials Secret", u.Redacted())
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return fmt.Errorf("baseURL: %q has a query or fragment, which would end up before the /v1/... path appended to it", p.BaseURL)
	case strings.HasSuffix(strings.TrimRight(u.EscapedPath(), "/"), "/v1"):
		// Every trailing slash: the gateway trims them all before it
		// appends the path (Gateway.newUpstreamRequest), so /v1// is /v1 too.
		return fmt.Errorf("baseURL: %q ends in /v1, which the gateway appends itself", p.BaseURL)
	}
	if len(p.Models) == 0 {
		return errors.New("models: at least one model is required")
	}
	seen := map[string]bool{}
	for _, m := range p.Models {
		if m.Name == "" {
			return errors.New("models: a model has no name")
		}
		if seen[m.Name] {
			return fmt.Errorf("models: %q is listed twice", m.Name)
		}
		seen[m.Name] = true
	}
	if p.ReservePercent < 0 || p.ReservePercent > 99 {
		return fmt.Errorf("reserve: %d%% is outside [0, 99]", p.ReservePercent)
	}
	p.CostModel = p.CostModel.Normalized()
	if p.DefaultMaxOutputTokens <= 0 {
		p.DefaultMaxOutputTokens = DefaultDefaultMaxOutputTokens
	}
	if err := defaultOneOf("tenantIdentification.mode", &p.IdentMode, IdentifyAPIKey, IdentifyTrustedHeader); err != nil {
		return err
	}
	if p.IdentHeader == "" {
		p.IdentHeader = DefaultIdentHeader
	}
	if p.Quantum <= 0 {
		p.Quantum = DefaultQuantum
	}
	if err := defaultOneOf("upstream.streamUsage", &p.StreamUsage, StreamUsageIncludeUsage, StreamUsageCountDeltas); err != nil {
		return err
	}
	if err := defaultOneOf("scheduler.queueingStrategy", &p.QueueingStrategy, QueueingBestEffortFIFO, QueueingStrictFIFO); err != nil {
		return err
	}
	if p.MaxQueuedJobs <= 0 {
		p.MaxQueuedJobs = DefaultMaxQueuedJobs
	}
	if p.UpstreamTimeout <= 0 {
		p.UpstreamTimeout = DefaultUpstreamTimeout
	}
	if p.Usage == (usage.Config{}) {
		p.Usage = usage.DefaultConfig()
	} else {
		p.Usage = p.Usage.Normalized()
	}
	return nil
}

// HasModel reports whether the pool serves model.
func (p *PoolPolicy) HasModel(model string) bool {
	for i := range p.Models {
		if p.Models[i].Name == model {
			return true
		}
	}
	return false
}

// BudgetPolicy is a tenant's spend limit per calendar period, in weighted
// tokens.
type BudgetPolicy struct {
	WeightedTokens int64
	Period         string // BudgetDay or BudgetMonth
}

// BudgetSeed is a budget period's spend as last reported in status: Used
// weighted tokens in the period that ends at ResetTime.
type BudgetSeed struct {
	Used      int64
	ResetTime time.Time
}

// TenantPolicy is one tenant's live policy, translated from its TenantQuota.
type TenantPolicy struct {
	// ID is the tenant id (spec.tenantID or the object name).
	ID string
	// Name and Generation of the TenantQuota.
	Name       string
	Generation int64
	// UID of the TenantQuota object (metadata.uid; "" when unknown). A
	// TenantQuota deleted and created again under the same name has a new
	// UID: the status writer then forgets what it wrote to the old object.
	UID string
	// Created is the TenantQuota's metadata.creationTimestamp (zero when
	// unknown). Of two TenantQuotas holding the same API key the one
	// created first (then by Name) keeps it, whatever order they are
	// loaded in (see Registry.UpsertTenant).
	Created time.Time
	// Limits of the tenant limiter (weighted tokens, provider tokens,
	// requests, concurrency, KV blocks).
	Limits limiter.Limits
	// Weight in the fair queue (>= 1).
	Weight int64
	// Tier is the tenant's tier (spec.tier; "" when unset, a tier like any
	// other): usage monitoring compares a tenant's usage with the median
	// of the pool's tenants of the same tier (seed 002 section 7).
	Tier string
	// MaxQueued bounds the tenant's queued jobs; 0 refuses every job.
	MaxQueued int
	// DefaultDeadline of a job that sets none; a job may only shorten it.
	DefaultDeadline time.Duration
	// Budget, when not nil, limits spend per period.
	Budget *BudgetPolicy
	// BudgetSeed, when not nil, is the spend of a budget period last
	// reported in the TenantQuota's status (status.budget): it carries the
	// period's use across scheduler restarts and leader changes. See
	// Registry.UpsertTenant.
	BudgetSeed *BudgetSeed
	// MaxOutputTokensPerRequest caps the output tokens one request may ask
	// for (spec.maxOutputTokensPerRequest), in provider tokens; 0 is no cap.
	MaxOutputTokensPerRequest int64
	// DryRun: every decision is computed and counted, nothing is refused
	// (spec.mode DryRun). Limits.DryRun carries it to the limiter.
	DryRun bool
	// KeyHashes are the SHA-256 of the tenant's API keys (APIKey mode).
	KeyHashes []KeyHash
	// KeyIssue, when not nil, says why KeyHashes is empty (no credentials,
	// a key Secret or key that is missing or unreadable), as set by the
	// caller that reads the keys. The registry serves the tenant all the
	// same (a pool in TrustedHeader mode needs no key); the status writer
	// reports it while the pool identifies tenants by API key, since no key
	// then authenticates as the tenant.
	KeyIssue *KeyIssue
	// WebhookSigning, when not nil, signs the tenant's completion webhooks
	// (spec.credentials.webhookSigningKey): see WebhookSigning.
	WebhookSigning *WebhookSigning
}

// KeyIssue is why a tenant has no API key: Reason, a CamelCase condition
// reason (the TenantQuota's Serving condition), and Message, which names
// what to fix.
type KeyIssue struct {
	Reason, Message string
}

// WebhookSigning is a tenant's completion-webhook signing secret, per the
// Standard Webhooks specification (https://www.standardwebhooks.com/):
// every delivery carries webhook-id, webhook-timestamp and
// webhook-signature "v1,<base64 HMAC-SHA256 of id.timestamp.body>".
//
//   - Key is the secret's decoded bytes (the Secret holds "whsec_" followed
//     by base64, or base64 alone, as the Standard Webhooks libraries
//     expect); never logged.
//   - Invalid, when not "", says why the Secret's value could not be used
//     (not base64, empty): deliveries are then refused rather than sent
//     unsigned, and the reason is logged.
type WebhookSigning struct {
	Key     []byte
	Invalid string
}

// String hides the key, so that a policy printed in a log line or an
// error never reveals it.
func (w *WebhookSigning) String() string {
	if w == nil {
		return "<nil>"
	}
	if w.Invalid != "" {
		return "WebhookSigning{invalid: " + w.Invalid + "}"
	}
	return "WebhookSigning{key: <redacted>}"
}

// Validate fills defaults into zero fields, sets Limits.DryRun from DryRun,
// and returns an error naming the first invalid field.
func (t *TenantPolicy) Validate() error {
	if t.ID == "" {
		return errors.New("tenant id: required")
	}
	if t.Name == "" {
		t.Name = t.ID
	}
	if t.Weight <= 0 {
		t.Weight = 1
	}
	if t.MaxQueued < 0 {
		return fmt.Errorf("batch.maxQueuedJobs: %d is negative", t.MaxQueued)
	}
	if t.DefaultDeadline <= 0 {
		t.DefaultDeadline = DefaultDeadline
	}
	// The limiter's shadow mode follows the tenant's mode.
	t.Limits.DryRun = t.DryRun
	if t.MaxOutputTokensPerRequest < 0 {
		return fmt.Errorf("maxOutputTokensPerRequest: %d is negative", t.MaxOutputTokensPerRequest)
	}
	if b := t.Budget; b != nil {
		if b.WeightedTokens < 0 {
			return fmt.Errorf("budget.weightedTokens: %d is negative", b.WeightedTokens)
		}
		if err := defaultOneOf("budget.period", &b.Period, BudgetMonth, BudgetDay); err != nil {
			return err
		}
	}
	return nil
}

// defaultOneOf sets *v to allowed[0], the default, when it is empty, and
// returns an error naming field when it is none of allowed (a setting of
// an enum the API server validates, read again here for callers that
// build a policy by hand).
func defaultOneOf(field string, v *string, allowed ...string) error {
	if *v == "" {
		*v = allowed[0]
		return nil
	}
	if slices.Contains(allowed, *v) {
		return nil
	}
	return fmt.Errorf("%s: unknown value %q (%s)", field, *v, strings.Join(allowed, " or "))
}
