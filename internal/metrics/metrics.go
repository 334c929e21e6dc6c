// Package metrics defines the scheduler's Prometheus metrics, all named
// fairshare_scheduler_* with their unit in the name (style 2.6).
//
// Counters and the queue-wait histogram are updated by the gateway as
// things happen. The per-tenant counters (requests, charged, refunded and
// used weighted tokens, admissions) are TenantCounters kept on the tenant
// and written as samples only at scrape time (tenantCollector), so an
// active tenant costs a few plain numbers instead of a client_golang child
// per series. Per-tenant and per-model gauges are not stored at all: a
// custom Collector reads a registry.Snapshot at scrape time, so a deleted
// tenant leaves no stale series. Metrics are registered on an injected
// prometheus.Registerer, so tests use a fresh registry.
//
// Tenant ids are label values: their number is bounded by the TenantQuotas
// of the pool. Requests that cannot be attributed to a tenant are counted
// under tenant="" (unauthenticated).
package metrics

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fairshare-dev/fairshare/internal/registry"
)

const namespace, subsystem = "fairshare", "scheduler"

// Request outcomes (label "outcome" of fairshare_scheduler_requests_total)
// other than the error codes of refused requests.
const (
	// OutcomeOK: answered by the provider with 2xx.
	OutcomeOK = "ok"
	// OutcomeQueued: a batch job was accepted into the queue.
	OutcomeQueued = "queued"
	// OutcomeUpstreamError: the provider answered non-2xx (not 429) or could
	// not be reached.
	OutcomeUpstreamError = "upstream_error"
	// OutcomeClientGone: the client went away before the answer was sent.
	OutcomeClientGone = "client_gone"
)

// Admission classes (label "class" of
// fairshare_scheduler_admitted_requests_total).
const (
	// ClassInteractive: an interactive request admitted for its upstream call.
	ClassInteractive = "interactive"
	// ClassBatch: a batch job admitted at dispatch for an upstream attempt.
	ClassBatch = "batch"
)

// UpstreamDurationBuckets are the bucket bounds of
// fairshare_scheduler_upstream_request_duration_seconds, in seconds: LLM
// calls answer their headers in tens of milliseconds (a refusal, the first
// chunk of a stream) up to minutes (a long non-streaming completion), so the
// bounds run from 50 ms to 10 min.
var UpstreamDurationBuckets = []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600}

// Metrics holds the scheduler's counters and histograms.
type Metrics struct {
	// UpstreamResponses counts provider responses by model and HTTP status
	// code ("error" when no response was received).
	UpstreamResponses *prometheus.CounterVec
	// UpstreamThrottled counts provider 429 responses by model.
	UpstreamThrottled *prometheus.CounterVec
	// UpstreamDuration observes, by model, the time from sending an
	// upstream call to its response headers (or to the transport error), in
	// seconds, measured with the gateway's clock.
	UpstreamDuration *prometheus.HistogramVec
	// JobsExpired counts batch jobs that reached their deadline unsent, by tenant.
	JobsExpired *prometheus.CounterVec
	// JobsFinished counts batch jobs by terminal status (no tenant label).
	JobsFinished *prometheus.CounterVec
	// DryRunRejections counts requests and jobs of DryRun tenants that
	// Enforce would have refused, by tenant and reason (the error code
	// Enforce would have answered).
	DryRunRejections *prometheus.CounterVec
	// WebhookDeliveries counts completion-webhook outcomes: delivered,
	// retried, failed, dropped (no tenant label, to bound series).
	WebhookDeliveries *prometheus.CounterVec
	// QueueWait observes the time a batch job waited before its first
	// upstream call, in seconds (no tenant label).
	QueueWait prometheus.Histogram
	// UpstreamHeadersMalformed counts provider rate-limit header values
	// ignored as malformed (throttle.Quota.Malformed), by model.
	UpstreamHeadersMalformed *prometheus.CounterVec
	// JobStoreQuarantined is the number of records the durable job
	// store's file holds in its quarantine bucket (records that could not
	// be loaded as jobs, jobs.BoltStore.QuarantinedHeld), set when the
	// store is opened; 0 until then and with jobs kept in memory.
	JobStoreQuarantined prometheus.Gauge

	// upstreamDuration (model to prometheus.Observer) and upstreamResponses
	// (upstreamKey to prometheus.Counter) cache the per-model series.
	upstreamDuration, upstreamResponses sync.Map

	// mu guards series: the TenantSeries of each tenant id, whose counters
	// of charged, refunded and used weighted tokens and of admitted calls
	// (charged_weighted_tokens_total, refunded_weighted_tokens_total,
	// used_weighted_tokens_total, admitted_requests_total) are exported
	// by tenantCollector at scrape time.
	mu     sync.Mutex
	series map[string]*TenantSeries
	// unattributed counts the requests_total of requests no tenant is
	// known for (tenant="").
	unattributed *TenantSeries
}

// New builds the metrics and registers them, with a scrape-time collector
// of per-tenant and per-model gauges reading snapshot, on reg. snapshot may
// be nil (no gauges).
func New(reg prometheus.Registerer, snapshot func() registry.Snapshot) *Metrics {
	opts := func(name, help string) prometheus.CounterOpts {
		return prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: name, Help: help}
	}
	m := &Metrics{
		UpstreamResponses: prometheus.NewCounterVec(opts("upstream_responses_total",
			"Provider responses by model and HTTP status code (\"error\" when no response arrived)."),
			[]string{"model", "code"}),
		UpstreamThrottled: prometheus.NewCounterVec(opts("upstream_throttled_total",
			"Provider 429 responses by model; each pauses the model's throttle."),
			[]string{"model"}),
		UpstreamDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "upstream_request_duration_seconds",
			Help: "Time from sending an upstream call to its response headers, by model, in seconds; " +
				"every call (interactive and batch) is observed, including 429s, errors and transport failures " +
				"(measured to the failure).",
			Buckets: UpstreamDurationBuckets,
		}, []string{"model"}),
		JobsExpired: prometheus.NewCounterVec(opts("jobs_expired_total",
			"Batch jobs that reached their deadline before being sent (never charged), by tenant."),
			[]string{"tenant"}),
		JobsFinished: prometheus.NewCounterVec(opts("jobs_finished_total",
			"Batch jobs that reached a terminal status: succeeded, failed, expired or cancelled."),
			[]string{"status"}),
		DryRunRejections: prometheus.NewCounterVec(opts("dry_run_rejections_total",
			"Requests and jobs of tenants in mode DryRun that Enforce would have refused (they were admitted), "+
				"by tenant and reason (the error code Enforce would have answered)."),
			[]string{"tenant", "reason"}),
		WebhookDeliveries: prometheus.NewCounterVec(opts("webhook_deliveries_total",
			"Completion webhook outcomes: delivered (2xx), retried (an attempt failed and another follows), "+
				"failed (attempts exhausted or a final refusal), dropped (too many deliveries in progress)."),
			[]string{"outcome"}),
		QueueWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "queue_wait_seconds",
			Help:    "Time a batch job waited in the fair queue before its first upstream call, in seconds.",
			Buckets: []float64{0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600},
		}),
		UpstreamHeadersMalformed: prometheus.NewCounterVec(opts("upstream_headers_malformed_total",
			"Provider rate-limit header values (or structured-field members) ignored as malformed, by model: "+
				"negative, NaN, out of range or unparsable; the throttle falls back to its other figures or defaults."),
			[]string{"model"}),
		JobStoreQuarantined: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "job_store_quarantined_records",
			Help: "Records the job store file holds in its quarantine bucket: records that could not be loaded " +
				"as jobs, moved there unchanged when the store was opened (docs/operations.md, \"The job store\").",
		}),
	}
	m.series = map[string]*TenantSeries{}
	m.unattributed = &TenantSeries{m: m}
	reg.MustRegister(m.UpstreamResponses, m.UpstreamThrottled, tenantCollector{m}, m.UpstreamDuration, m.JobsExpired, m.JobsFinished, m.DryRunRejections, m.WebhookDeliveries, m.QueueWait,
		m.UpstreamHeadersMalformed, m.JobStoreQuarantined)
	if snapshot != nil {
		reg.MustRegister(&collector{snapshot: snapshot})
	}
	return m
}

// ForgetTenant deletes every counter series labelled with the tenant (its
// TenantQuota was removed, registry.Registry.RemoveTenant), so a deleted
// tenant leaves no series behind; its gauges go with it since they are
// read from the snapshot. The TenantCounters go only if the tenant they
// belong to was removed: a tenant added again under the id before a late
// ForgetTenant keeps its new series.
func (m *Metrics) ForgetTenant(tenant string) {
	m.mu.Lock()
	if s := m.series[tenant]; s != nil && s.removed() {
		delete(m.series, tenant)
	}
	m.mu.Unlock()
	l := prometheus.Labels{"tenant": tenant}
	for _, v := range []*prometheus.CounterVec{m.JobsExpired, m.DryRunRejections} {
		v.DeletePartialMatch(l)
	}
}

// TenantCounter is one tenant's counter series of a whole number (weighted
// tokens, calls), kept in the tenant's TenantSeries and exported by the
// Metrics' collector at scrape time: a CounterVec child per tenant and
// series (its label pairs, created timestamp and vector map entry: about
// 270 bytes of pointers for the collector to trace, and a dozen
// allocations on the tenant's first call) costs more than the count
// itself. The series appears with its first count, as a vector's child
// does, with the time of that count as its created timestamp. Safe for
// concurrent use.
type TenantCounter struct {
	n atomic.Int64
	// created is the Unix time in nanoseconds of the first count (the
	// wall clock, as a vector's child takes it); 0 until then (the series
	// is not exported).
	created atomic.Int64
}

// Add adds n >= 0 (a negative n is ignored: a counter never decreases).
func (c *TenantCounter) Add(n int64) {
	if n < 0 {
		return
	}
	if c.created.Load() == 0 {
		c.created.CompareAndSwap(0, time.Now().UnixNano())
	}
	c.n.Add(n)
}

// Inc adds 1.
func (c *TenantCounter) Inc() { c.Add(1) }

// Value returns the count and whether the series exists (counted at least
// once).
func (c *TenantCounter) Value() (int64, bool) {
	return c.n.Load(), c.created.Load() != 0
}

// TenantSeries holds one tenant's counter series of a Metrics, kept with
// the tenant (registry.Tenant.Attach) so a call finds them without a
// lookup: charged, refunded and used weighted tokens, admitted calls and
// requests by outcome, each a TenantCounter. A removed tenant's counts are
// dropped: ForgetTenant forgets its series, and a count after that creates
// none. Safe for concurrent use.
type TenantSeries struct {
	m *Metrics
	// t is the tenant (nil for Metrics.unattributed).
	t  *registry.Tenant
	id string
	// Weighted tokens charged, refunded and used; calls admitted by class;
	// requests answered OutcomeOK.
	charged, refunded, used, admittedInteractive, admittedBatch, requestsOK TenantCounter
	// outcomes holds the requests of the other outcomes (refusal codes,
	// errors, queued), made on first use.
	outcomesMu sync.Mutex
	outcomes   map[string]*TenantCounter
}

// removed reports whether the tenant was removed (never for the
// unattributed series).
func (s *TenantSeries) removed() bool { return s.t != nil && s.t.Removed() }

// Tenant returns the series of tenant t, cached on t. A removed tenant
// (ForgetTenant forgot its series) gets series that count into nothing.
func (m *Metrics) Tenant(t *registry.Tenant) *TenantSeries {
	if s, ok := t.Attached().(*TenantSeries); ok && s.m == m {
		return s
	}
	if t.Removed() {
		return m.newSeries(t)
	}
	m.mu.Lock()
	if t.Removed() {
		// Removed since the check above: ForgetTenant (which takes m.mu)
		// ran or will run after this; adding the series would leak it.
		m.mu.Unlock()
		return m.newSeries(t)
	}
	s := m.series[t.ID]
	if s == nil || s.t != t {
		// First use, or the id's tenant was removed and added again.
		s = m.newSeries(t)
		m.series[t.ID] = s
	}
	m.mu.Unlock()
	if cur, ok := t.Attach(s).(*TenantSeries); ok && cur.m == m {
		return cur
	}
	// Another Metrics attached first (several gateways on one registry,
	// tests): this one's series are found in m.series.
	return s
}

func (m *Metrics) newSeries(t *registry.Tenant) *TenantSeries {
	return &TenantSeries{m: m, t: t, id: t.ID}
}

// Charged is the tenant's charged_weighted_tokens_total.
func (s *TenantSeries) Charged() *TenantCounter { return &s.charged }

// Refunded is the tenant's refunded_weighted_tokens_total.
func (s *TenantSeries) Refunded() *TenantCounter { return &s.refunded }

// Used is the tenant's used_weighted_tokens_total.
func (s *TenantSeries) Used() *TenantCounter { return &s.used }

// Requests is the tenant's requests_total for outcome (an Outcome or the
// error code of a refusal).
func (s *TenantSeries) Requests(outcome string) *TenantCounter {
	if outcome == OutcomeOK {
		return &s.requestsOK
	}
	s.outcomesMu.Lock()
	defer s.outcomesMu.Unlock()
	c := s.outcomes[outcome]
	if c == nil {
		if s.outcomes == nil {
			s.outcomes = map[string]*TenantCounter{}
		}
		c = &TenantCounter{}
		s.outcomes[outcome] = c
	}
	return c
}

// Unattributed is requests_total{tenant=""} for outcome: requests that no
// tenant is known for (no or an unknown API key).
func (m *Metrics) Unattributed(outcome string) *TenantCounter {
	return m.unattributed.Requests(outcome)
}

// Admitted is the tenant's admitted_requests_total for class: ClassBatch,
// else ClassInteractive.
func (s *TenantSeries) Admitted(class string) *TenantCounter {
	if class == ClassBatch {
		return &s.admittedBatch
	}
	return &s.admittedInteractive
}

// ObserveQueueWait records one job's queue wait.
func (m *Metrics) ObserveQueueWait(d time.Duration) { m.QueueWait.Observe(d.Seconds()) }

// ObserveUpstream records the time from sending one upstream call of model
// to its response headers or its transport error.
func (m *Metrics) ObserveUpstream(model string, d time.Duration) {
	o, ok := m.upstreamDuration.Load(model)
	if !ok {
		o, _ = m.upstreamDuration.LoadOrStore(model, m.UpstreamDuration.WithLabelValues(model))
	}
	o.(prometheus.Observer).Observe(d.Seconds())
}

// ForgetModel deletes every series labelled with model (the pool no longer
// serves it: registry.Registry.OnModelRemoved), so that models taken out of
// the pool leave no series behind. A call of the model still in flight
// counts into nothing, or, when it looks its series up after this, makes
// it again (until the model is next forgotten or the scheduler restarts).
func (m *Metrics) ForgetModel(model string) {
	m.upstreamDuration.Delete(model)
	m.upstreamResponses.Range(func(k, _ any) bool {
		if k.(upstreamKey).model == model {
			m.upstreamResponses.Delete(k)
		}
		return true
	})
	l := prometheus.Labels{"model": model}
	m.UpstreamResponses.DeletePartialMatch(l)
	m.UpstreamThrottled.DeletePartialMatch(l)
	m.UpstreamDuration.DeletePartialMatch(l)
	m.UpstreamHeadersMalformed.DeletePartialMatch(l)
}

// upstreamKey labels a series of upstream_responses_total.
type upstreamKey struct {
	model  string
	status int
}

// UpstreamResponse returns the upstream_responses_total series of model
// and HTTP status, looked up once per (model, status): the pool's models
// and the statuses a provider answers are few; a model's series are
// deleted when the pool stops serving it (ForgetModel).
func (m *Metrics) UpstreamResponse(model string, status int) prometheus.Counter {
	k := upstreamKey{model, status}
	if c, ok := m.upstreamResponses.Load(k); ok {
		return c.(prometheus.Counter)
	}
	c, _ := m.upstreamResponses.LoadOrStore(k, m.UpstreamResponses.WithLabelValues(model, strconv.Itoa(status)))
	return c.(prometheus.Counter)
}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(namespace, subsystem, name), help, labels, nil)
}

var (
	descTenantQueued    = desc("tenant_queued_jobs", "Batch jobs queued, by tenant.", "tenant")
	descTenantInFlight  = desc("tenant_in_flight_requests", "Upstream calls in flight, by tenant.", "tenant")
	descTenantKV        = desc("tenant_kv_blocks", "KV-cache blocks held by in-flight calls, by tenant.", "tenant")
	descTenantRemaining = desc("tenant_remaining_weighted_tokens", "Weighted tokens left in the tenant's token bucket (absent when unlimited).", "tenant")
	descTenantReqs      = desc("tenant_remaining_requests", "Requests left in the tenant's request bucket (absent when unlimited).", "tenant")
	descBudgetUsed      = desc("tenant_budget_used_weighted_tokens", "Weighted tokens spent in the tenant's current budget period (absent without a budget).", "tenant")
	descBudgetRemaining = desc("tenant_budget_remaining_weighted_tokens", "Weighted tokens left in the tenant's current budget period (absent without a budget).", "tenant")
	descTenantLimited   = desc("tenant_limited", "1 while one of the tenant's limits binds, else 0.", "tenant")
	descTenants         = desc("tenants", "Tenants loaded by the scheduler.")
	// descUsageOutlier and descWindowWeighted: usage monitoring (seed 002
	// section 7; ProviderPool spec.usageMonitoring, docs/operations.md
	// "Cost per tenant and usage outliers").
	descUsageOutlier = desc("tenant_usage_outlier",
		"1 while the tenant is flagged by usage monitoring, by tenant and reason (CostAboveTier: weighted tokens over the window "+
			"at least costRatioThreshold times its tier's median; LimitViolations: a high share of its requests refused by its own limits); "+
			"absent otherwise.", "tenant", "reason")
	descWindowWeighted = desc("tenant_window_weighted_tokens",
		"Weighted tokens the tenant used over the pool's usage window (spec.usageMonitoring.windowSeconds), by tenant.", "tenant")
	descQueued         = desc("queued_jobs", "Batch jobs queued in the pool.")
	descInFlight       = desc("upstream_in_flight_requests", "Upstream calls in flight from the pool.")
	descModelRemaining = desc("upstream_remaining_tokens", "Provider tokens the provider's quota has left for the model (estimate; absent when unknown).", "model")
	descModelLimit     = desc("upstream_limit_tokens", "Provider token limit per window for the model (absent when unknown).", "model")
	descModelReqs      = desc("upstream_remaining_requests", "Provider requests the provider's quota has left for the model (estimate; absent when unknown).", "model")
	descModelReqLimit  = desc("upstream_limit_requests", "Provider request limit per window for the model (absent when unknown).", "model")
	descModelPaused    = desc("upstream_paused", "1 while the model is paused after an upstream 429, else 0.", "model")
)

// Descriptors of the per-tenant counters kept in TenantCounters.
var (
	descCharged = desc("charged_weighted_tokens_total",
		"Weighted tokens charged at admission (prompt*w_in + max output*w_out), by tenant.", "tenant")
	descRefunded = desc("refunded_weighted_tokens_total",
		"Weighted tokens refunded at settlement (charge minus usage, or the full charge of a call "+
			"that failed before the provider counted it), by tenant.", "tenant")
	descUsed = desc("used_weighted_tokens_total",
		"Weighted tokens used, as settled (the provider's usage prompt*w_in + completion*w_out, or the charge "+
			"when the usage is unknown; 0 for a call refunded in full), by tenant.", "tenant")
	descRequests = desc("requests_total",
		"Interactive requests and job submissions, by tenant and outcome "+
			"(ok, queued, upstream_error, client_gone, or the error code of a refusal such as token_rate_limit, "+
			"request_rate_limit, concurrency_limit, memory_limit, queue_full, budget_exhausted, "+
			"upstream_quota_exhausted, request_too_large, tenant_suspended).", "outcome", "tenant")
	descAdmitted = desc("admitted_requests_total",
		"Upstream calls admitted by the tenant's limits, budget and the pool's throttle, by tenant and class "+
			"(interactive, or batch: once per dispatch attempt of a job).", "tenant", "class")
)

// tenantCollector exports the TenantCounters of every tenant with series
// (Metrics.series) at scrape time: each counter counted at least once, as
// a counter with its created timestamp.
type tenantCollector struct{ m *Metrics }

// Describe implements prometheus.Collector.
func (c tenantCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descCharged, descRefunded, descUsed, descAdmitted, descRequests} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. The samples of one tenant are
// allocated together and share their label pairs (built once per tenant
// and scrape): a prometheus.MustNewConstMetric per series built its own,
// 650 bytes of garbage per series and 33 MB per scrape of 10,000 tenants
// (BenchmarkGatherTenantCounters).
func (c tenantCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	all := make([]*TenantSeries, 0, len(c.m.series)+1)
	for _, s := range c.m.series {
		all = append(all, s)
	}
	c.m.mu.Unlock()
	all = append(all, c.m.unattributed)
	tenantName, className, outcomeName := "tenant", "class", "outcome"
	interactive, batch, ok := ClassInteractive, ClassBatch, OutcomeOK
	classI := &dto.LabelPair{Name: &className, Value: &interactive}
	classB := &dto.LabelPair{Name: &className, Value: &batch}
	outcomeOK := &dto.LabelPair{Name: &outcomeName, Value: &ok}
	for _, s := range all {
		if s.removed() {
			continue // a count racing ForgetTenant
		}
		t := &tenantSamples{}
		t.tenant = dto.LabelPair{Name: &tenantName, Value: &s.id}
		// The label pairs of each series, sorted by name (class < outcome
		// < tenant).
		t.labels = [7]*dto.LabelPair{&t.tenant, classI, &t.tenant, classB, &t.tenant, outcomeOK, &t.tenant}
		only, withI, withB, withOK := t.labels[0:1:1], t.labels[1:3:3], t.labels[3:5:5], t.labels[5:7:7]
		for i, e := range [...]struct {
			desc   *prometheus.Desc
			c      *TenantCounter
			labels []*dto.LabelPair
		}{
			{descCharged, &s.charged, only}, {descRefunded, &s.refunded, only}, {descUsed, &s.used, only},
			{descAdmitted, &s.admittedInteractive, withI}, {descAdmitted, &s.admittedBatch, withB},
			{descRequests, &s.requestsOK, withOK},
		} {
			if x := t.samples[i].set(e.desc, e.c, e.labels); x != nil {
				ch <- x
			}
		}
		s.outcomesMu.Lock()
		outcomes := make([]string, 0, len(s.outcomes))
		counters := make([]*TenantCounter, 0, len(s.outcomes))
		for o, tc := range s.outcomes {
			outcomes = append(outcomes, o)
			counters = append(counters, tc)
		}
		s.outcomesMu.Unlock()
		for i := range outcomes {
			labels := []*dto.LabelPair{{Name: &outcomeName, Value: &outcomes[i]}, &t.tenant}
			if x := new(counterSample).set(descRequests, counters[i], labels); x != nil {
				ch <- x
			}
		}
	}
}

// tenantSamples are the samples of one tenant's TenantCounters at a
// scrape, allocated together (requests of outcomes other than OutcomeOK,
// rarer, each on its own).
type tenantSamples struct {
	tenant  dto.LabelPair
	labels  [7]*dto.LabelPair
	samples [6]counterSample
}

// set fills x with c's value and created timestamp and returns it, or nil
// when c was never counted (no series).
func (x *counterSample) set(d *prometheus.Desc, c *TenantCounter, labels []*dto.LabelPair) *counterSample {
	n, ok := c.Value()
	if !ok {
		return nil
	}
	x.desc, x.labels, x.value = d, labels, float64(n)
	created := c.created.Load()
	x.created.Seconds, x.created.Nanos = created/1e9, int32(created%1e9)
	return x
}

// counterSample is one TenantCounter's value at a scrape (a
// prometheus.Metric): a counter with its label pairs and created timestamp.
type counterSample struct {
	desc    *prometheus.Desc
	labels  []*dto.LabelPair
	value   float64
	counter dto.Counter
	created timestamppb.Timestamp
}

// Desc implements prometheus.Metric.
func (x *counterSample) Desc() *prometheus.Desc { return x.desc }

// Write implements prometheus.Metric.
func (x *counterSample) Write(out *dto.Metric) error {
	out.Label = x.labels
	x.counter.Value = &x.value
	x.counter.CreatedTimestamp = &x.created
	out.Counter = &x.counter
	return nil
}

// collector exports gauges from a snapshot taken at scrape time.
type collector struct {
	snapshot func() registry.Snapshot
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descTenantQueued, descTenantInFlight, descTenantKV, descTenantRemaining,
		descTenantReqs, descBudgetUsed, descBudgetRemaining, descTenantLimited, descUsageOutlier, descWindowWeighted, descTenants, descQueued, descInFlight, descModelRemaining, descModelLimit,
		descModelReqs, descModelReqLimit, descModelPaused} {
		ch <- d
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Collect implements prometheus.Collector: one snapshot per scrape.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.snapshot()
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	g(descTenants, float64(len(s.Tenants)))
	g(descQueued, float64(s.Backlog))
	g(descInFlight, float64(s.InFlight))
	for _, t := range s.Tenants {
		g(descTenantQueued, float64(t.Queued), t.ID)
		g(descTenantInFlight, float64(t.Limiter.InFlight), t.ID)
		g(descTenantKV, float64(t.Limiter.KVBlocks), t.ID)
		if t.Limiter.TokensRemaining >= 0 {
			g(descTenantRemaining, float64(t.Limiter.TokensRemaining), t.ID)
		}
		if t.Limiter.RequestsRemaining >= 0 {
			g(descTenantReqs, float64(t.Limiter.RequestsRemaining), t.ID)
		}
		if b := t.Budget; b != nil {
			g(descBudgetUsed, float64(b.Used), t.ID)
			g(descBudgetRemaining, float64(b.Remaining), t.ID)
		}
		g(descTenantLimited, b2f(t.Limiter.Limited), t.ID)
		g(descWindowWeighted, float64(t.Usage.Counts.WeightedTokens), t.ID)
		if t.Usage.Signal.Outlier {
			g(descUsageOutlier, 1, t.ID, t.Usage.Signal.Reason)
		}
	}
	for _, m := range s.Models {
		if m.Status.TokensRemaining >= 0 {
			g(descModelRemaining, float64(m.Status.TokensRemaining), m.Name)
		}
		if m.Status.TokensLimit > 0 {
			g(descModelLimit, float64(m.Status.TokensLimit), m.Name)
		}
		if m.Status.RequestsRemaining >= 0 {
			g(descModelReqs, float64(m.Status.RequestsRemaining), m.Name)
		}
		if m.Status.RequestsLimit > 0 {
			g(descModelReqLimit, float64(m.Status.RequestsLimit), m.Name)
		}
		g(descModelPaused, b2f(m.Status.Paused), m.Name)
	}
}
