package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Dialect names the rate-limit header dialect an upstream speaks.
// +kubebuilder:validation:Enum=Auto;OpenAI;Anthropic;Azure;Classic;IETF
type Dialect string

// Dialects of provider rate-limit headers (see docs/api.md and provider-headers reference).
const (
	// DialectAuto reads every dialect and keeps the most restrictive figure.
	DialectAuto Dialect = "Auto"
	// DialectOpenAI is x-ratelimit-{limit,remaining,reset}-{requests,tokens}, resets as Go durations.
	DialectOpenAI Dialect = "OpenAI"
	// DialectAnthropic is anthropic-ratelimit-*-{limit,remaining,reset}, resets as RFC 3339 times.
	DialectAnthropic Dialect = "Anthropic"
	// DialectAzure is x-ratelimit-remaining-* with retry-after-ms / x-ms-retry-after-ms.
	DialectAzure Dialect = "Azure"
	// DialectClassic is X-RateLimit-{Limit,Remaining,Reset}, reset as delta or epoch seconds.
	DialectClassic Dialect = "Classic"
	// DialectIETF is the draft-ietf-httpapi-ratelimit-headers RateLimit / RateLimit-Policy fields.
	DialectIETF Dialect = "IETF"
)

// StreamUsage says how the scheduler learns the tokens a streamed call used.
// +kubebuilder:validation:Enum=IncludeUsage;CountDeltas
type StreamUsage string

// Stream usage modes (see docs/api.md).
const (
	// StreamUsageIncludeUsage asks the provider for its usage chunk
	// (stream_options.include_usage) on a streamed call whose client did not.
	StreamUsageIncludeUsage StreamUsage = "IncludeUsage"
	// StreamUsageCountDeltas sends the client's body unchanged and settles a
	// stream that brings no usage from the tokenizer's count of its deltas.
	StreamUsageCountDeltas StreamUsage = "CountDeltas"
)

// QueueingStrategy says in which order a tenant's batch jobs may start (the
// names of Kueue's ClusterQueue queueingStrategy).
// +kubebuilder:validation:Enum=BestEffortFIFO;StrictFIFO
type QueueingStrategy string

// Queueing strategies (see docs/api.md).
const (
	// QueueingBestEffortFIFO lets a tenant's later job that can start go
	// before its oldest job that cannot, a bounded number of times.
	QueueingBestEffortFIFO QueueingStrategy = "BestEffortFIFO"
	// QueueingStrictFIFO starts a tenant's jobs in the order they came.
	QueueingStrictFIFO QueueingStrategy = "StrictFIFO"
)

// TenantIdentificationMode says how the scheduler learns which tenant sent a request.
// +kubebuilder:validation:Enum=APIKey;TrustedHeader
type TenantIdentificationMode string

const (
	// IdentifyByAPIKey authenticates `Authorization: Bearer <key>` against the
	// keys in the Secrets that TenantQuotas reference (compared by hash).
	IdentifyByAPIKey TenantIdentificationMode = "APIKey"
	// IdentifyByTrustedHeader takes the tenant id from a request header set by
	// an authenticating gateway in front of the scheduler. Only safe when no
	// client can reach the scheduler directly.
	IdentifyByTrustedHeader TenantIdentificationMode = "TrustedHeader"
)

// SecretKeyRef selects one key of a Secret in the object's own namespace.
type SecretKeyRef struct {
	// name is the Secret's name, in the same namespace as the referring
	// object: a DNS-1123 subdomain (lowercase letters, digits, '-' and '.')
	// of at most 253 characters, as every Secret name is.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name"`

	// key is the data key in the Secret that holds the value: letters,
	// digits, '-', '_' and '.', as every Secret data key is. Defaults to
	// "api-key".
	// +optional
	// +kubebuilder:default=api-key
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	Key string `json:"key,omitempty"`
}

// LocalSecretReference names a Secret in the object's own namespace.
type LocalSecretReference struct {
	// name is the Secret's name: a DNS-1123 subdomain (lowercase letters,
	// digits, '-' and '.') of at most 253 characters, as every Secret name is.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name"`
}

// UpstreamSpec is the provider account the pool shares.
type UpstreamSpec struct {
	// baseURL is the provider's OpenAI-compatible base URL: an http:// or
	// https:// URL with a host, at most 2048 characters, without the
	// `/v1/...` path, for example `https://api.openai.com`. The scheduler
	// appends `/v1/chat/completions` and the like itself, so a URL whose path
	// ends in `/v1`, with or without trailing slashes
	// (`https://api.openai.com/v1`, `.../v1/`), is refused, and so is a space
	// (percent-encode it as `%20`), and
	// so are a query (`?...`) and a fragment (`#...`), which would end up
	// before the appended path, and
	// credentials in the URL (`user:password@`), which belong in
	// credentialsSecretRef's Secret.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.matches('^(?i:https?)://')",message="spec.upstream.baseURL must start with http:// or https://"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^(?i:https?)://') || isURL(self)",message="spec.upstream.baseURL must be a valid URL, for example https://api.openai.com"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^(?i:https?)://') || !isURL(self) || url(self).getHostname() != ''",message="spec.upstream.baseURL must have a host, for example https://api.openai.com"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^(?i:https?)://') || !isURL(self) || !self.contains(' ')",message="spec.upstream.baseURL must not contain a space: percent-encode it (%20)"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^(?i:https?)://') || !isURL(self) || !self.matches('^(?i:https?)://[^/]+/(.*/)?v1/*$')",message="spec.upstream.baseURL must not end in /v1: the scheduler appends /v1/... (for example /v1/chat/completions) itself, so use https://api.openai.com, not https://api.openai.com/v1"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^(?i:https?)://') || !isURL(self) || !self.contains('#')",message="spec.upstream.baseURL must not have a fragment (#...): the scheduler appends the API path (/v1/chat/completions) to the URL, so a fragment would end up before it"
	// +kubebuilder:validation:XValidation:rule="!self.contains('?')",message="spec.upstream.baseURL must not have a query (?...): the scheduler appends the API path (/v1/chat/completions) to the URL, so a query would end up before it"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^(?i:https?)://[^/?#]*@')",message="spec.upstream.baseURL must not carry credentials (user:password@): put the provider's key in the Secret of spec.upstream.credentialsSecretRef"
	BaseURL string `json:"baseURL"`

	// dialect is a hint for the provider's rate-limit header dialect.
	// Auto (the default) reads all of them and keeps the most restrictive figure.
	// +optional
	// +kubebuilder:default=Auto
	Dialect Dialect `json:"dialect,omitempty"`

	// credentialsSecretRef names the Secret holding the provider API key. The
	// scheduler sends it upstream as `Authorization: Bearer <key>` and nowhere
	// else. Omit it for providers that need no key (the simulator).
	// +optional
	CredentialsSecretRef *SecretKeyRef `json:"credentialsSecretRef,omitempty"`

	// timeoutSeconds bounds one upstream call, in seconds. Defaults to 120.
	// +optional
	// +kubebuilder:default=120
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	TimeoutSeconds int32 `json:"timeoutSeconds,omitempty"`

	// streamUsage says how the scheduler learns the tokens a streamed call
	// used, to settle the tenant's charge. IncludeUsage (the default): on a
	// streamed call whose client did not ask for usage, the scheduler adds
	// stream_options.include_usage to the body it sends upstream, settles
	// from the provider's usage chunk and does not forward that chunk.
	// CountDeltas: the body goes upstream as the client sent it, and a
	// stream that ends without a usage chunk is settled from the tokenizer's
	// count (cl100k_base) of its delta text; for OpenAI-compatible servers
	// with strict request validation that refuse stream_options (a 400 or 422
	// naming it on every streamed call: "Unknown parameter", "Extra inputs
	// are not permitted").
	// +optional
	// +kubebuilder:default=IncludeUsage
	StreamUsage StreamUsage `json:"streamUsage,omitempty"`
}

// ModelSpec is one model the pool serves, with optional quota hints used
// until the provider's own rate-limit headers are seen.
type ModelSpec struct {
	// name is the model name as clients send it in `model`.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Name string `json:"name"`

	// tokensPerMinute is the provider's tokens-per-minute quota for this
	// model, in provider tokens (prompt + max output), in [1, 10^15] (the
	// largest quota figure the scheduler reads from provider headers). A
	// hint: the provider's headers override it once seen.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000000000000
	TokensPerMinute *int64 `json:"tokensPerMinute,omitempty"`

	// requestsPerMinute is the provider's requests-per-minute quota for this
	// model, in [1, 10^15]. A hint, like tokensPerMinute.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000000000000
	RequestsPerMinute *int64 `json:"requestsPerMinute,omitempty"`

	// rateLimitGroup names the provider rate limit this model shares with
	// the pool's other models of the same group, for providers that count
	// several models against one quota (Anthropic's limits per model class,
	// OpenAI's shared limits across a model's snapshots). The scheduler keeps
	// one adaptive throttle per group: a response or a 429 for any member
	// paces and pauses every member, so the members together start no more
	// than the one quota. The group's hints are the smallest tokensPerMinute
	// and requestsPerMinute its members state. Unset: the model has a
	// throttle of its own. 1 to 63 characters: lowercase letters, digits,
	// '-', '.' and '_', starting and ending with a letter or digit.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9._]*[a-z0-9])?$`
	RateLimitGroup string `json:"rateLimitGroup,omitempty"`
}

// ReserveSpec keeps part of the upstream quota for interactive traffic.
type ReserveSpec struct {
	// interactivePercent is the share of each model's quota, in percent of the
	// limit, that batch jobs may not use: batch starts only while the provider's
	// remaining quota stays above it. Interactive calls may use all of it.
	// Must be in [0, 100); defaults to 20.
	// +optional
	// +kubebuilder:default=20
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=99
	InteractivePercent *int32 `json:"interactivePercent,omitempty"`

	// batchBorrowAfterSeconds lets batch jobs borrow the reserve once no
	// interactive call has arrived for this many seconds; the reserve returns
	// at the next interactive call. Unset: batch never borrows.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	BatchBorrowAfterSeconds *int32 `json:"batchBorrowAfterSeconds,omitempty"`
}

// CostModel converts provider tokens into weighted tokens, the unit of tenant
// buckets, budgets and fair-queue cost: weighted = input*inputTokenWeight +
// output*outputTokenWeight.
type CostModel struct {
	// inputTokenWeight is the weight of one prompt token. Defaults to 1.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	InputTokenWeight int32 `json:"inputTokenWeight,omitempty"`

	// outputTokenWeight is the weight of one generated token. Defaults to 4.
	// +optional
	// +kubebuilder:default=4
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	OutputTokenWeight int32 `json:"outputTokenWeight,omitempty"`

	// kvBlockTokens is the size of one KV-cache block, in tokens: a request
	// holds ceil((prompt + max output) / kvBlockTokens) blocks. Defaults to 16.
	// +optional
	// +kubebuilder:default=16
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65536
	KVBlockTokens int32 `json:"kvBlockTokens,omitempty"`

	// defaultMaxOutputTokens is charged as the output reservation of a request
	// that sets neither max_tokens nor max_completion_tokens. Defaults to 4096.
	// +optional
	// +kubebuilder:default=4096
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1048576
	DefaultMaxOutputTokens int32 `json:"defaultMaxOutputTokens,omitempty"`
}

// TenantIdentification says how requests are mapped to tenants.
type TenantIdentification struct {
	// mode is APIKey (default: `Authorization: Bearer <key>` checked against
	// TenantQuota key Secrets) or TrustedHeader (the tenant id is read from
	// `header`, for deployments behind an authenticating gateway).
	// +optional
	// +kubebuilder:default=APIKey
	Mode TenantIdentificationMode `json:"mode,omitempty"`

	// header is the request header holding the tenant id in TrustedHeader
	// mode. Defaults to X-Fairshare-Tenant.
	// +optional
	// +kubebuilder:default=X-Fairshare-Tenant
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9-]+$`
	Header string `json:"header,omitempty"`
}

// JobStoreType says where the scheduler keeps batch jobs.
// +kubebuilder:validation:Enum=Volume;Memory
type JobStoreType string

const (
	// JobStoreVolume keeps batch jobs in a bbolt file on a
	// PersistentVolumeClaim the operator creates for the pool: queued and
	// finished jobs survive a scheduler restart or a leader change.
	JobStoreVolume JobStoreType = "Volume"
	// JobStoreMemory keeps batch jobs in the scheduler's memory only: they
	// are lost when the scheduler restarts (tests and development).
	JobStoreMemory JobStoreType = "Memory"
)

// JobStoreAccessMode is the access mode of the job store's claim.
// +kubebuilder:validation:Enum=ReadWriteOnce;ReadWriteMany
type JobStoreAccessMode string

const (
	// JobStoreReadWriteOnce: the claim is mounted by one node at a time.
	JobStoreReadWriteOnce JobStoreAccessMode = "ReadWriteOnce"
	// JobStoreReadWriteMany: the claim can be mounted on several nodes, so a
	// standby replica on another node can open the store when it is elected.
	JobStoreReadWriteMany JobStoreAccessMode = "ReadWriteMany"
)

// JobStoreSpec is the durable store of the pool's batch jobs. With type
// Volume the operator creates a PersistentVolumeClaim "<pool>-scheduler",
// owned by the pool (deleting the pool deletes the claim and its jobs), and
// the scheduler opens the store only once it is the elected leader.
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.storageClassName) || (has(oldSelf.type) && oldSelf.type == 'Memory') || (has(self.storageClassName) && self.storageClassName == oldSelf.storageClassName)",message="spec.scheduler.jobStore.storageClassName is immutable once set (while the type is Volume)"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.accessMode) || (has(oldSelf.type) && oldSelf.type == 'Memory') || (has(self.accessMode) && self.accessMode == oldSelf.accessMode)",message="spec.scheduler.jobStore.accessMode is immutable once set (while the type is Volume)"
type JobStoreSpec struct {
	// type is Volume (the default: jobs are kept on a PersistentVolumeClaim
	// and survive restarts) or Memory (jobs are lost when the scheduler
	// restarts; for tests and development). Switching from Volume to Memory
	// deletes the pool's claim and the jobs on it.
	// +optional
	// +kubebuilder:default=Volume
	Type JobStoreType `json:"type,omitempty"`

	// size is the storage request of the claim. Defaults to 1Gi. Sizing
	// (jobs.BoltStore): about (0.6 KiB + request body + response) per
	// retained job, times 2 for bbolt page fill, for the queued and running
	// jobs plus the retained finished ones (100,000 by default); 100,000
	// jobs with 2 KiB bodies and 2 KiB responses take about 0.9 GB. Size
	// the volume at twice the estimate. May grow (when the storage class
	// allows volume expansion); a size below the claim's is ignored (a
	// claim never shrinks), so a refused growth can be set back.
	// +optional
	// +kubebuilder:default="1Gi"
	// +kubebuilder:validation:XValidation:rule="isQuantity(string(self)) && quantity(string(self)).isGreaterThan(quantity('0'))",message="spec.scheduler.jobStore.size must be a positive quantity",messageExpression="'spec.scheduler.jobStore.size must be a positive quantity, not \"' + string(self) + '\"'"
	Size *resource.Quantity `json:"size,omitempty"`

	// storageClassName of the claim: a StorageClass name, a DNS-1123
	// subdomain (lowercase letters, digits, '-' and '.') of at most 253
	// characters, as the API server requires of a claim's class. Unset: the
	// cluster's default StorageClass. Immutable once set. Set later, it
	// reaches a claim that has no class yet (Pending, in a cluster without a
	// default class); one that differs from the existing claim's class is
	// reported in the pool's Ready condition (a claim's class cannot change).
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	StorageClassName *string `json:"storageClassName,omitempty"`

	// accessMode of the claim: ReadWriteOnce (the default) or ReadWriteMany.
	// More than one scheduler replica needs ReadWriteMany. Immutable once set.
	// +optional
	// +kubebuilder:default=ReadWriteOnce
	AccessMode JobStoreAccessMode `json:"accessMode,omitempty"`
}

// SchedulerSpec configures the scheduler Deployment the operator renders for the pool.
// +kubebuilder:validation:XValidation:rule="!has(self.replicas) || self.replicas <= 1 || !has(self.jobStore) || (has(self.jobStore.type) && self.jobStore.type == 'Memory') || (has(self.jobStore.accessMode) && self.jobStore.accessMode == 'ReadWriteMany')",message="spec.scheduler.jobStore.accessMode must be ReadWriteMany when spec.scheduler.replicas > 1 with a Volume job store: a standby replica on another node cannot mount a ReadWriteOnce claim when it is elected"
type SchedulerSpec struct {
	// replicas of the scheduler. Above 1, replicas elect a leader (a Lease) and
	// only the leader serves. Defaults to 1.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=5
	Replicas *int32 `json:"replicas,omitempty"`

	// image of the scheduler container, a full image reference such as
	// registry.example.com/fairshare:v0.1.0 or ...@sha256:<digest> (the form
	// the Helm chart's operator.schedulerImage accepts: no spaces, a
	// lower-case repository path). Defaults to the operator's
	// --scheduler-image.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:Pattern=`^(([a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)*(:[0-9]+)?/)?[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*(/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*)*(:[a-zA-Z0-9_][a-zA-Z0-9_.-]{0,127})?(@[a-z0-9]+([+._-][a-z0-9]+)*:[a-zA-Z0-9=_-]+)?)?$`
	Image string `json:"image,omitempty"`

	// imagePullSecrets names the Secrets (of type
	// kubernetes.io/dockerconfigjson, in the pool's namespace) the scheduler
	// pods pull their image with, for an image in a registry that needs
	// credentials; at most 8. The Helm chart's imagePullSecrets are the
	// operator pod's only: a Secret lives in one namespace, and each pool's
	// scheduler pods run in the pool's.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=8
	ImagePullSecrets []LocalSecretReference `json:"imagePullSecrets,omitempty"`

	// resources of the scheduler container. A cpu or memory limit below its
	// request, a negative quantity, a name that is not a container resource,
	// an extended or hugepages request without a limit equal to it, or
	// claims, is refused (the Deployment's Pods would be): the pool is
	// Accepted=False InvalidSpec.
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`

	// upstreamConcurrency bounds the calls in flight to the provider from this
	// pool, interactive and batch together. Defaults to 64.
	// +optional
	// +kubebuilder:default=64
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	UpstreamConcurrency int32 `json:"upstreamConcurrency,omitempty"`

	// quantumTokens is the deficit-round-robin quantum, in weighted tokens:
	// what a weight-1 tenant may dispatch per round. Defaults to 4096.
	// +optional
	// +kubebuilder:default=4096
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000000
	QuantumTokens int64 `json:"quantumTokens,omitempty"`

	// maxWaitTokens turns on aging in the fair queue, in weighted tokens: once
	// this many weighted tokens have been dispatched pool-wide since a
	// tenant's job reached the head of its queue, the tenant's next eligible
	// turn dispatches it, whatever its weight. It bounds the wait of a
	// low-weight tenant's large job (docs/architecture.md gives the bound).
	// Unset: no aging (plain deficit round robin, which bounds the wait by
	// weight and cost alone).
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000000000
	MaxWaitTokens *int64 `json:"maxWaitTokens,omitempty"`

	// queueingStrategy is the order in which a tenant's batch jobs may start.
	// BestEffortFIFO: when the tenant's oldest job cannot start (its model is
	// paused after a 429, or it needs more KV blocks or tokens than the
	// tenant has free now), one of its next 8 jobs that can start goes first;
	// the oldest job is passed over at most 4 times, then the tenant waits
	// for it, so its wait stays bounded. StrictFIFO: the oldest job blocks
	// the tenant's later jobs until it starts. Defaults to BestEffortFIFO.
	// +optional
	// +kubebuilder:default=BestEffortFIFO
	QueueingStrategy QueueingStrategy `json:"queueingStrategy,omitempty"`

	// maxQueuedJobs bounds the jobs queued in the pool across all tenants: the
	// memory guard behind the per-tenant bounds. Defaults to 100000.
	// +optional
	// +kubebuilder:default=100000
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000000
	MaxQueuedJobs int64 `json:"maxQueuedJobs,omitempty"`

	// statusIntervalSeconds is how often the scheduler writes live figures to
	// the pool and tenant status, in seconds; unchanged status is not written.
	// Defaults to 10.
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=300
	StatusIntervalSeconds int32 `json:"statusIntervalSeconds,omitempty"`

	// jobStore is where the scheduler keeps batch jobs: by default a
	// 1Gi ReadWriteOnce PersistentVolumeClaim (type Volume). Defaults to {}
	// (each field at its own default).
	// +optional
	// +kubebuilder:default={}
	JobStore JobStoreSpec `json:"jobStore,omitempty,omitzero"`
}

// ProviderPoolSpec is one upstream provider account shared by the tenants
// whose TenantQuotas reference this pool.
type ProviderPoolSpec struct {
	// upstream is the provider endpoint and its credentials.
	// +required
	Upstream UpstreamSpec `json:"upstream"`

	// models served by the pool. Requests for a model not listed are refused
	// with 400 `model_not_found`.
	// +required
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	Models []ModelSpec `json:"models"`

	// reserve keeps part of the quota for interactive calls. Defaults to {}
	// (each field at its own default).
	// +optional
	// +kubebuilder:default={}
	Reserve ReserveSpec `json:"reserve,omitempty,omitzero"`

	// costModel converts provider tokens into weighted tokens. Defaults to
	// {} (each field at its own default).
	// +optional
	// +kubebuilder:default={}
	CostModel CostModel `json:"costModel,omitempty,omitzero"`

	// tenantIdentification says how requests are mapped to tenants. Defaults
	// to {} (each field at its own default).
	// +optional
	// +kubebuilder:default={}
	TenantIdentification TenantIdentification `json:"tenantIdentification,omitempty,omitzero"`

	// scheduler configures the rendered scheduler Deployment. Defaults to {}
	// (each field at its own default).
	// +optional
	// +kubebuilder:default={}
	Scheduler SchedulerSpec `json:"scheduler,omitempty,omitzero"`

	// usageMonitoring sets the window and thresholds that flag a tenant
	// whose usage is far above its tier's or that keeps hitting its limits
	// (TenantQuota condition UsageOutlier). Defaults to {} (each field at its
	// own default).
	// +optional
	// +kubebuilder:default={}
	UsageMonitoring UsageMonitoringSpec `json:"usageMonitoring,omitempty,omitzero"`
}

// UsageMonitoringSpec configures the cost-per-tenant and limit-violation
// signals (seed 002 section 7, "Detecting abuse": monitor cost per tenant
// against tier, investigate outliers manually). A flagged tenant gets the
// condition UsageOutlier True, a Warning event and the metric
// fairshare_scheduler_tenant_usage_outlier; nothing is refused. The
// reasoning behind the defaults is in docs/operations.md ("Cost per tenant
// and usage outliers").
type UsageMonitoringSpec struct {
	// windowSeconds is the sliding window the figures cover, in seconds, a
	// whole number of minutes. Defaults to 3600.
	// +optional
	// +kubebuilder:default=3600
	// +kubebuilder:validation:Minimum=300
	// +kubebuilder:validation:Maximum=86400
	// +kubebuilder:validation:XValidation:rule="self % 60 == 0",message="usageMonitoring.windowSeconds must be a whole number of minutes"
	WindowSeconds int32 `json:"windowSeconds,omitempty"`

	// costRatioThreshold flags a tenant whose weighted tokens over the
	// window are at least this multiple of the median of its tier's active
	// tenants (reason CostAboveTier). Defaults to 10.
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=2
	// +kubebuilder:validation:Maximum=10000
	CostRatioThreshold int32 `json:"costRatioThreshold,omitempty"`

	// minTierSize is the number of tenants of a tier with traffic in the
	// window below which the tier has no median and nobody in it is a cost
	// outlier. Defaults to 5.
	// +optional
	// +kubebuilder:default=5
	// +kubebuilder:validation:Minimum=3
	// +kubebuilder:validation:Maximum=10000
	MinTierSize int32 `json:"minTierSize,omitempty"`

	// minWeightedTokens is the floor, in weighted tokens over the window,
	// below which a tenant is never a cost outlier. Defaults to 100000.
	// +optional
	// +kubebuilder:default=100000
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000000000000
	MinWeightedTokens *int64 `json:"minWeightedTokens,omitempty"`

	// rejectionPercentThreshold flags a tenant when at least this percentage
	// of its requests and jobs in the window were refused by its own limits
	// (reason LimitViolations), an integer percent. Defaults to 50.
	// +optional
	// +kubebuilder:default=50
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	RejectionPercentThreshold int32 `json:"rejectionPercentThreshold,omitempty"`

	// minRejections is the fewest refusals in the window that flag limit
	// violations. Defaults to 100.
	// +optional
	// +kubebuilder:default=100
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000000
	MinRejections int32 `json:"minRejections,omitempty"`
}

// ModelQuotaStatus is what the provider last said about one model's quota.
type ModelQuotaStatus struct {
	// name of the model.
	// +required
	// +kubebuilder:validation:MaxLength=256
	Name string `json:"name"`

	// dialect of rate-limit headers detected on the model's responses
	// (empty until a response carried one).
	// +optional
	// +kubebuilder:validation:MaxLength=32
	Dialect string `json:"dialect,omitempty"`

	// limitTokens is the provider's token limit per window, in provider tokens.
	// +optional
	LimitTokens *int64 `json:"limitTokens,omitempty"`

	// remainingTokens is the provider's remaining token quota, in provider tokens.
	// +optional
	RemainingTokens *int64 `json:"remainingTokens,omitempty"`

	// tokensResetTime is when the token quota is fully replenished.
	// +optional
	TokensResetTime *metav1.Time `json:"tokensResetTime,omitempty"`

	// limitRequests is the provider's request limit per window.
	// +optional
	LimitRequests *int64 `json:"limitRequests,omitempty"`

	// remainingRequests is the provider's remaining request quota.
	// +optional
	RemainingRequests *int64 `json:"remainingRequests,omitempty"`

	// requestsResetTime is when the request quota is fully replenished.
	// +optional
	RequestsResetTime *metav1.Time `json:"requestsResetTime,omitempty"`

	// pausedUntil is set while the model is paused after an upstream 429.
	// +optional
	PausedUntil *metav1.Time `json:"pausedUntil,omitempty"`
}

// TierUsageStatus is one tier's usage over the pool's usage window
// (spec.usageMonitoring.windowSeconds). Its field names are short because
// the pool's status lists up to 16 tiers and stays under 4 KB.
type TierUsageStatus struct {
	// tier is the tier's name (spec.tier of its TenantQuotas; "" for the
	// tenants that set none).
	// +required
	// +kubebuilder:validation:MaxLength=63
	Tier string `json:"tier"`

	// active is the number of the tier's tenants with traffic in the
	// window; absent when none has.
	// +optional
	Active int64 `json:"active,omitempty"`

	// median is the median of the weighted tokens the tier's active
	// tenants used in the window, in weighted tokens (the mean of the two
	// middle values, rounded down, for an even number); absent while the
	// tier has fewer than spec.usageMonitoring.minTierSize active tenants.
	// A tenant whose usage reaches spec.usageMonitoring.costRatioThreshold
	// times it is flagged (TenantQuota condition UsageOutlier).
	// +optional
	Median *int64 `json:"median,omitempty"`
}

// ProviderPoolStatus is the observed state of a pool. Conditions Accepted and
// Ready are written by the operator (field manager fairshare-controller);
// Serving, Throttled and the live figures by the pool's scheduler (field
// manager fairshare-scheduler).
type ProviderPoolStatus struct {
	// conditions: Accepted, Ready (operator); Serving, Throttled (scheduler).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// observedGeneration is the spec generation the operator last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// remainingTokens is the smallest remaining token quota across the
	// pool's models, in provider tokens (the REMAINING column).
	// +optional
	RemainingTokens *int64 `json:"remainingTokens,omitempty"`

	// pausedUntil is the latest pause of any model after an upstream 429.
	// +optional
	PausedUntil *metav1.Time `json:"pausedUntil,omitempty"`

	// backlog is the number of batch jobs queued in the pool.
	// +optional
	Backlog *int64 `json:"backlog,omitempty"`

	// inFlight is the number of upstream calls in flight.
	// +optional
	InFlight *int64 `json:"inFlight,omitempty"`

	// tenants is the number of TenantQuotas the scheduler has loaded.
	// +optional
	Tenants *int64 `json:"tenants,omitempty"`

	// upstreamThrottled is the number of 429 responses from the provider since
	// the ProviderPool was created: a scheduler that restarts, or a standby
	// that takes the Lease, carries on from the figure in status (what the
	// previous one counted after its last status write is lost).
	// +optional
	UpstreamThrottled *int64 `json:"upstreamThrottled,omitempty"`

	// models is the provider's quota per model, for at most 8 models (so
	// that the status stays under 4 KB with the 64 models spec.models
	// allows): the paused models first, then the others, each
	// group by name. The metrics cover every model.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=8
	Models []ModelQuotaStatus `json:"models,omitempty"`

	// modelsNotShown is the number of the pool's models left out of models
	// (beyond its 8 entries); absent when every model is listed.
	// +optional
	ModelsNotShown *int64 `json:"modelsNotShown,omitempty"`

	// usageTiers is, per tier of the pool's tenants (spec.tier of their
	// TenantQuotas), the figures usage monitoring compares each tenant's
	// usage with (seed 002 section 7), by tier name; at most 16 tiers, those
	// after the 16th by name are not listed. It is here rather than in each
	// TenantQuota's status so that a tenant's status does not change with
	// its peers' traffic.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	UsageTiers []TierUsageStatus `json:"usageTiers,omitempty"`

	// lastReportTime is when the scheduler last wrote these figures; it is
	// rewritten at least every 5 minutes while the scheduler runs (its
	// heartbeat), so an older time means the scheduler is not writing.
	// +optional
	LastReportTime *metav1.Time `json:"lastReportTime,omitempty"`
}

// ProviderPool is one upstream LLM provider account (endpoint, credentials,
// models, quota hints) shared fairly by the tenants whose TenantQuotas
// reference it. The operator runs one scheduler Deployment per pool, and
// names it and the pool's other objects "<pool>-scheduler": a pool's name
// must therefore be a DNS-1035 label (lowercase letters, digits and '-',
// starting with a letter and ending with a letter or digit) of at most 53
// characters.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=pool;pools,categories=fairshare
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 53 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name of a ProviderPool must be a DNS-1035 label of at most 53 characters (lowercase letters, digits and '-', starting with a letter and ending with a letter or digit): the operator names the pool's objects <name>-scheduler"
// +kubebuilder:printcolumn:name="Remaining",type=integer,JSONPath=`.status.remainingTokens`,description="Smallest remaining provider token quota across models"
// +kubebuilder:printcolumn:name="Paused-Until",type=string,JSONPath=`.status.pausedUntil`,description="End of the pause after an upstream 429 (RFC 3339, UTC)"
// +kubebuilder:printcolumn:name="Backlog",type=integer,JSONPath=`.status.backlog`,description="Queued batch jobs"
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Serving",type=string,JSONPath=`.status.conditions[?(@.type=="Serving")].status`,description="Serving condition: the pool's scheduler has loaded the pool and serves it"
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1,description="Reason of the Ready condition (ProviderSecretKeyMissing, RenderFailed, ...)"
// +kubebuilder:printcolumn:name="Upstream",type=string,JSONPath=`.spec.upstream.baseURL`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ProviderPool struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired pool.
	// +required
	Spec ProviderPoolSpec `json:"spec"`

	// status is the observed pool.
	// +optional
	Status ProviderPoolStatus `json:"status,omitempty,omitzero"`
}

// ProviderPoolList is a list of ProviderPools.
//
// +kubebuilder:object:root=true
type ProviderPoolList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ProviderPool `json:"items"`
}
