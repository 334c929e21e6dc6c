package v1alpha1

// Condition types. Accepted and Ready are owned by the operator (field manager
// FieldManagerController); Serving and Throttled by the pool's scheduler
// (field manager FieldManagerScheduler). Conditions are a list map keyed by
// type, so the two writers never overwrite each other's entries.
const (
	// ConditionAccepted: the object's spec is consistent and its references
	// resolve (for a TenantQuota: the pool exists in the namespace).
	ConditionAccepted = "Accepted"
	// ConditionReady: for a pool, its scheduler Deployment is available; for a
	// tenant, it is Accepted and its pool is Ready.
	ConditionReady = "Ready"
	// ConditionServing: the scheduler has loaded the object and serves it.
	ConditionServing = "Serving"
	// ConditionThrottled: True while calls are held back: for a pool, paused
	// after an upstream 429 or at its reserve; for a tenant, at one of its limits.
	ConditionThrottled = "Throttled"
	// ConditionUsageOutlier (TenantQuota, scheduler): True, a warning, while
	// the tenant's usage over the pool's usage window is far above its
	// tier's (reason CostAboveTier) or many of its requests are refused by
	// its own limits (LimitViolations); False with WithinTier otherwise.
	// It only reports (seed 002 section 7: monitor cost per tenant against
	// tier, investigate outliers).
	ConditionUsageOutlier = "UsageOutlier"
)

// Condition reasons (CamelCase, documented in docs/api.md).
const (
	// ReasonAccepted: the spec was accepted.
	ReasonAccepted = "Accepted"
	// ReasonPoolNotFound: the TenantQuota's spec.poolRef names no ProviderPool in its namespace.
	ReasonPoolNotFound = "PoolNotFound"
	// ReasonDuplicateTenantID: another TenantQuota of the same pool has the same tenant id.
	ReasonDuplicateTenantID = "DuplicateTenantID"
	// ReasonInvalidSpec: the spec passed API validation but cannot be served (a message says why).
	ReasonInvalidSpec = "InvalidSpec"
	// ReasonRenderFailed: the operator could not render or apply the scheduler objects.
	ReasonRenderFailed = "RenderFailed"
	// ReasonSchedulerAvailable: the scheduler Deployment has its replicas available.
	ReasonSchedulerAvailable = "SchedulerAvailable"
	// ReasonProviderSecretNotFound (ProviderPool Ready False, and a Warning
	// event): the Secret spec.upstream.credentialsSecretRef names does not
	// exist, so the scheduler's pods cannot start (their provider key is
	// mounted from it). The message names the Secret and the key. While a
	// replica still runs (Ready True), Ready's message says so instead.
	ReasonProviderSecretNotFound = "ProviderSecretNotFound"
	// ReasonProviderSecretKeyMissing (ProviderPool Ready False, and a
	// Warning event): the Secret spec.upstream.credentialsSecretRef names
	// exists but has no value under its key: the key is absent (the
	// scheduler's pods cannot mount it and do not start) or its value is
	// empty or only whitespace (the scheduler has no provider key). The
	// message names the Secret and the key, never a value. While a replica
	// still runs (Ready True), Ready's message says so instead.
	ReasonProviderSecretKeyMissing = "ProviderSecretKeyMissing"
	// ReasonSchedulerProgressing: the scheduler Deployment is not yet available.
	ReasonSchedulerProgressing = "SchedulerProgressing"
	// ReasonJobStoreNotShared (Warning event on the pool): replicas > 1 with a
	// ReadWriteOnce job store claim, as a pool stored before jobStore existed
	// gets by default; a standby on another node cannot mount the claim, so
	// failover may not happen. Switch the store to Memory, then to Volume with
	// accessMode ReadWriteMany (docs/operations.md, "The job store").
	ReasonJobStoreNotShared = "JobStoreNotShared"
	// ReasonSchedulerRolled (Normal event on the pool, never a condition
	// reason): the operator changed the pod template of an existing scheduler
	// Deployment (settings hash annotation AnnotationSettingsHash or image),
	// so the Deployment rolls its pods; the message names what changed.
	ReasonSchedulerRolled = "SchedulerRolled"
	// ReasonPoolReady: the tenant's pool is Ready.
	ReasonPoolReady = "PoolReady"
	// ReasonPoolNotReady: the tenant's pool is not Ready.
	ReasonPoolNotReady = "PoolNotReady"
	// ReasonNotAccepted: Ready is False because Accepted is False.
	ReasonNotAccepted = "NotAccepted"
	// ReasonLoaded: the scheduler has loaded the object's current generation.
	ReasonLoaded = "Loaded"
	// ReasonWithinLimits: nothing is being held back.
	ReasonWithinLimits = "WithinLimits"
	// ReasonUpstreamPaused: the provider answered 429; all starts wait for its reset.
	ReasonUpstreamPaused = "UpstreamPaused"
	// ReasonAtReserve: batch work is held at the interactive reserve.
	ReasonAtReserve = "AtReserve"
	// ReasonTenantLimited: the tenant is at its token, request, concurrency or KV-block limit.
	ReasonTenantLimited = "TenantLimited"
	// ReasonCostAboveTier (UsageOutlier True): weighted tokens over the
	// window at least usageMonitoring.costRatioThreshold times the median of
	// the tenant's tier.
	ReasonCostAboveTier = "CostAboveTier"
	// ReasonLimitViolations (UsageOutlier True): at least
	// usageMonitoring.rejectionPercentThreshold percent of the tenant's
	// requests in the window, and at least usageMonitoring.minRejections,
	// refused by its own limits (probing).
	ReasonLimitViolations = "LimitViolations"
	// ReasonWithinTier (UsageOutlier False): neither signal.
	ReasonWithinTier = "WithinTier"
)

// Field managers of the two status writers (server-side apply).
const (
	// FieldManagerController is the operator's field manager.
	FieldManagerController = "fairshare-controller"
	// FieldManagerScheduler is the scheduler's field manager.
	FieldManagerScheduler = "fairshare-scheduler"
)

// Labels and annotations the operator sets on the objects it renders.
const (
	// LabelPool holds the ProviderPool name on rendered objects.
	LabelPool = "quota.fairshare.dev/pool"
	// AnnotationSettingsHash on the scheduler pod template is the SHA-256 of
	// the rendered settings; a change rolls the Deployment.
	AnnotationSettingsHash = "quota.fairshare.dev/settings-hash"
)
