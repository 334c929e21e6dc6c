package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/fairshare-dev/fairshare/internal/fairqueue"
	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/metrics"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// codeStoreError: the job store failed to record a submission or a
// cancellation (500).
const codeStoreError = "store_error"

// Paging bounds of GET /v1/jobs.
const (
	defaultListLimit = 20
	maxListLimit     = 1000
)

// jobView is the JSON shape of a job in the job API. Times are RFC 3339
// (UTC, nanoseconds), null while unset.
type jobView struct {
	ID         string      `json:"id"`
	Object     string      `json:"object"`
	Tenant     string      `json:"tenant"`
	Status     jobs.Status `json:"status"`
	Endpoint   string      `json:"endpoint"`
	Model      string      `json:"model"`
	CreatedAt  *time.Time  `json:"created_at"`
	StartedAt  *time.Time  `json:"started_at"`
	FinishedAt *time.Time  `json:"finished_at"`
	Deadline   *time.Time  `json:"deadline"`
	Attempts   int         `json:"attempts"`
	// Recovered: the job was running when its scheduler stopped and was
	// queued again at restart (at-least-once toward the provider).
	Recovered   bool            `json:"recovered"`
	DispatchSeq int64           `json:"dispatch_seq"`
	QueueWaitMS *int64          `json:"queue_wait_ms"`
	Usage       *jobs.Usage     `json:"usage"`
	Response    json.RawMessage `json:"response"`
	Error       *jobs.Error     `json:"error"`
	Metadata    json.RawMessage `json:"metadata"`
	// WebhookURL is the completion webhook's URL, null when none was given.
	WebhookURL *string `json:"webhook_url"`
	// WebhookStatus is null without a webhook, else "pending" until the job
	// is finished and delivered, then "delivered" or "failed".
	WebhookStatus *string `json:"webhook_status"`
	// WebhookAttempts is the number of delivery attempts made so far.
	WebhookAttempts int `json:"webhook_attempts"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func viewOf(j jobs.Job) jobView {
	v := jobView{
		ID: j.ID, Object: "job", Tenant: j.Tenant, Status: j.Status, Endpoint: j.Endpoint, Model: j.Model,
		CreatedAt: timePtr(j.CreatedAt), StartedAt: timePtr(j.StartedAt), FinishedAt: timePtr(j.FinishedAt),
		Deadline: timePtr(j.Deadline), Attempts: j.Attempts, Recovered: j.Recovered, DispatchSeq: j.DispatchSeq,
		Usage: j.Usage, Response: j.Response, Error: j.Error, Metadata: j.Metadata,
	}
	if !j.StartedAt.IsZero() {
		ms := j.QueueWait.Milliseconds()
		v.QueueWaitMS = &ms
	}
	if j.WebhookURL != "" {
		u, st := j.WebhookURL, j.WebhookStatus
		if st == "" {
			st = webhookPending
		}
		v.WebhookURL, v.WebhookStatus, v.WebhookAttempts = &u, &st, j.WebhookAttempts
	}
	if v.Response == nil {
		v.Response = json.RawMessage("null")
	}
	if v.Metadata == nil {
		v.Metadata = json.RawMessage("null")
	}
	return v
}

// submitRequest is the body of POST /v1/jobs.
type submitRequest struct {
	Endpoint        string          `json:"endpoint"`
	Body            json.RawMessage `json:"body"`
	DeadlineSeconds *float64        `json:"deadlineSeconds"`
	Metadata        json.RawMessage `json:"metadata"`
	// WebhookURL is the optional completion webhook (validated by
	// validWebhookURL).
	WebhookURL string `json:"webhookURL"`
	// IdempotencyKey is the member idempotencyKey (checked by
	// checkIdempotencyKey), which only a bulk line may carry; keyGiven says
	// the member was present.
	IdempotencyKey string `json:"idempotencyKey"`
	keyGiven       bool
}

// minDeadline is the shortest deadline a job may ask for: 1 ms (a shorter
// one has passed before the job could be queued).
const minDeadline = time.Millisecond

// parseSubmit parses the body of POST /v1/jobs field by field, so that a
// refusal names the field at fault: 400 invalid_json when the body is not a
// JSON object, 400 invalid_request for an ill-typed endpoint or body, 400
// invalid_deadline for a deadlineSeconds that is not a number of seconds of
// at least 0.001, 400 invalid_request for a webhookURL that is not an
// absolute http or https URL, 400 invalid_idempotency_key for an
// idempotencyKey that is not a string of 1 to 255 printable ASCII
// characters.
func parseSubmit(raw []byte) (submitRequest, *apiError) {
	var sr submitRequest
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return sr, badRequest(codeInvalidJSON, "The request body is not a valid JSON object.")
	}
	if err := decodeField(fields["endpoint"], &sr.Endpoint); err != nil {
		return sr, badParam(codeInvalidEndpoint, "endpoint", "\"endpoint\" must be a string.")
	}
	sr.Body = fields["body"]
	if v, ok := fields["metadata"]; ok {
		sr.Metadata = v
	}
	var d *float64
	if err := decodeField(fields["deadlineSeconds"], &d); err != nil {
		return sr, badParam(codeInvalidDeadline, "deadlineSeconds", "\"deadlineSeconds\" must be a number of seconds.")
	}
	if d != nil {
		if math.IsNaN(*d) || *d < minDeadline.Seconds() {
			return sr, badParam(codeInvalidDeadline, "deadlineSeconds", fmt.Sprintf("\"deadlineSeconds\" must be at least %g seconds.", minDeadline.Seconds()))
		}
		sr.DeadlineSeconds = d
	}
	if err := decodeField(fields["webhookURL"], &sr.WebhookURL); err != nil {
		return sr, badParam(codeInvalidRequest, "webhookURL", "\"webhookURL\" must be a string.")
	}
	if sr.WebhookURL != "" {
		if msg := validWebhookURL(sr.WebhookURL); msg != "" {
			return sr, badParam(codeInvalidRequest, "webhookURL", msg)
		}
	}
	if v, ok := fields["idempotencyKey"]; ok {
		sr.keyGiven = true
		if err := decodeField(v, &sr.IdempotencyKey); err != nil {
			return sr, badIdempotencyKey(paramLineKey, "\"idempotencyKey\" must be a string.")
		}
		if aerr := checkIdempotencyKey(paramLineKey, sr.IdempotencyKey); aerr != nil {
			return sr, aerr
		}
	}
	return sr, nil
}

// paramLineKey is the member of a bulk line that carries its idempotency
// key.
const paramLineKey = "idempotencyKey"

// queued is the fair-queue payload of a job: what the dispatcher needs
// without a store lookup.
type queued struct {
	model string
	// cost is the job's charge under the cost model in force at submission.
	// Its provider tokens (prompt, max output) do not change; its weighted
	// tokens and KV blocks are computed again under the pool's cost model
	// at dispatch (costUnder), for the eligibility test and the admission.
	cost limiter.Cost
	// wouldRefuse: the code Enforce would have refused the job with at
	// submission (a DryRun tenant's job over its output cap); admission at
	// dispatch then charges the limiter nothing and counts it once.
	wouldRefuse string
}

// costUnder is the job's charge under the cost model m (the pool's in
// force): weighted tokens and KV blocks of its prompt and max output tokens.
func (qd *queued) costUnder(m limiter.CostModel) limiter.Cost {
	return m.Cost(qd.cost.PromptTokens, qd.cost.MaxOutputTokens)
}

// queueCost is the job's Cost in the fair queue under the cost model m, in
// weighted tokens (at least 1).
func (qd *queued) queueCost(m limiter.CostModel) int64 {
	return max(qd.costUnder(m).Weighted, 1)
}

// submitJob serves POST /v1/jobs: 202 with the job and its Location, or a
// refusal (see queueJob). With an Idempotency-Key (parseIdempotencyKeyHeader)
// a retry of a submission whose job the store still holds is answered as
// the first one was, 202 with Location and the job's current view, plus
// Idempotent-Replayed: true; no job is created. A body member
// idempotencyKey is refused (400 invalid_idempotency_key): here the key is
// the header's.
func (g *Gateway) submitJob(w http.ResponseWriter, r *http.Request) {
	t, pool, raw, ok := g.identifyAndRead(w, r)
	if !ok {
		return
	}
	key, aerr := parseIdempotencyKeyHeader(r.Header)
	if aerr != nil {
		g.refuse(w, t, aerr)
		return
	}
	sr, aerr := parseSubmit(raw)
	if aerr == nil && sr.keyGiven {
		aerr = badIdempotencyKey(paramLineKey, "POST /v1/jobs takes its idempotency key in the Idempotency-Key header; \"idempotencyKey\" is a member of a POST /v1/jobs/bulk line.")
	}
	if aerr != nil {
		g.refuse(w, t, aerr)
		return
	}
	sr.IdempotencyKey = key
	job, replayed, aerr := g.queueJob(t, pool, sr, headerIdempotencyKey)
	if aerr != nil {
		g.refuse(w, t, aerr)
		return
	}
	if replayed {
		w.Header().Set(headerIdempotentReplayed, "true")
	}
	w.Header().Set("Location", "/v1/jobs/"+job.ID)
	writeJSON(w, http.StatusAccepted, viewOf(job))
}

// queueJob validates one parsed submission of tenant t, stores it and puts
// it in the fair queue; it returns the stored job or the refusal (not yet
// written or counted). A job that can never fit the tenant's limits is
// refused now (413 request_too_large, BC-10) instead of sitting at the head
// of the tenant's queue; a full tenant queue is 429 queue_full with a
// Retry-After estimated from the tenant's token rate; a tenant whose plan
// allows no queued job (spec.batch.maxQueuedJobs 0) gets 403 batch_disabled
// at once, with no Retry-After, since waiting would not help. POST /v1/jobs
// and each line of POST /v1/jobs/bulk go through it.
//
// With sr.IdempotencyKey set (keyParam names where it came from, for the
// errors), a key the tenant's stored job holds is looked up before
// anything else: the same fingerprint (submitFingerprint) returns that job
// and replayed true, whatever its status and whatever the queue, limits or
// policy say now; another fingerprint is 422 idempotency_key_reused; a
// submission with the same key in flight is 409 idempotency_key_in_use. A
// new job is stored with the key and its fingerprint; a refused one is not
// stored (or removed), so its key stays free.
func (g *Gateway) queueJob(t *registry.Tenant, pool *registry.PoolPolicy, sr submitRequest, keyParam string) (job jobs.Job, replayed bool, aerr *apiError) {
	var fp string
	var handOver func() func()
	if key := sr.IdempotencyKey; key != "" {
		if !g.keys.acquire(t.ID, key) {
			return jobs.Job{}, false, keyInUseError()
		}
		release := func() { g.keys.release(t.ID, key) }
		defer func() {
			if release != nil {
				release()
			}
		}()
		fp = submitFingerprint(sr)
		if j, ok := g.store.ByIdempotencyKey(t.ID, key); ok {
			j, aerr := replayOf(j, fp, keyParam)
			return j, aerr == nil, aerr
		}
		// A job stored and then refused hands the key's release to its
		// removal (dispatcher.removeRefused).
		removed := release
		handOver = func() func() { release = nil; return removed }
	}
	job, aerr = g.createJob(t, pool, sr, fp, handOver)
	if aerr == errKeyHeld {
		// Created meanwhile by another process on the same store.
		j, aerr := replayOf(job, fp, keyParam)
		return j, aerr == nil, aerr
	}
	return job, false, aerr
}

// errKeyHeld is the *apiError createJob returns with the job that holds
// the submission's idempotency key (jobs.ErrIdempotencyKeyHeld).
var errKeyHeld = &apiError{status: http.StatusConflict, typ: typeInvalidRequest, code: codeIdempotencyKeyInUse, message: "The idempotency key is held by a stored job."}

// createJob validates, stores and queues a submission for queueJob; fp is
// its fingerprint when it has an idempotency key. handOver, when not nil,
// takes over the release of the key's in-flight mark, for a job stored
// and then refused: it is released once the job's record is removed.
func (g *Gateway) createJob(t *registry.Tenant, pool *registry.PoolPolicy, sr submitRequest, fp string, handOver func() func()) (jobs.Job, *apiError) {
	if t.Policy().MaxQueued == 0 {
		return jobs.Job{}, &apiError{status: http.StatusForbidden, typ: typePermission, code: codeBatchDisabled,
			message: "The tenant's plan allows no batch jobs (its TenantQuota sets spec.batch.maxQueuedJobs to 0)."}
	}
	if sr.Endpoint == "" {
		sr.Endpoint = endpointChat
	}
	if sr.Endpoint != endpointChat && sr.Endpoint != endpointCompletions && sr.Endpoint != endpointEmbeddings {
		return jobs.Job{}, badParam(codeInvalidEndpoint, "endpoint", fmt.Sprintf("endpoint must be %s, %s or %s.", endpointChat, endpointCompletions, endpointEmbeddings))
	}
	if len(sr.Metadata) > 0 && !bytes.Equal(sr.Metadata, []byte("null")) && bytes.TrimSpace(sr.Metadata)[0] != '{' {
		return jobs.Job{}, badParam(codeInvalidRequest, "metadata", "metadata must be a JSON object.")
	}
	if b := bytes.TrimSpace(sr.Body); len(b) == 0 || b[0] != '{' {
		return jobs.Job{}, badParam(codeInvalidRequest, "body", "The job needs a \"body\" object (an OpenAI request).")
	}
	req, aerr := parseRequest(sr.Endpoint, sr.Body, pool, g.promptCounter(t))
	if aerr != nil {
		if aerr.param != "" {
			// The parameter is a member of the job's body, named from the
			// submission as body.stream is.
			aerr.param = "body." + aerr.param
		}
		return jobs.Job{}, aerr
	}
	if req.stream {
		return jobs.Job{}, badParam(codeStreamNotSupported, "body.stream", "Batch jobs cannot stream; remove \"stream\".")
	}
	pol := t.Policy()
	if aerr := req.applyPlanCap(pol.MaxOutputTokensPerRequest, pol.DryRun); aerr != nil {
		return jobs.Job{}, aerr
	}
	if req.injectMax {
		// The job is stored with the output limit the plan charged it.
		b, _, err := req.upstreamBody()
		if err != nil {
			return jobs.Job{}, badRequest(codeInvalidRequest, "The request could not be re-encoded.")
		}
		sr.Body = b
	}
	deadline := pol.DefaultDeadline
	if sr.DeadlineSeconds != nil {
		// A job may only shorten the tenant's default deadline.
		if d := *sr.DeadlineSeconds; d < deadline.Seconds() {
			deadline = time.Duration(d * float64(time.Second))
		}
	}
	now := g.clock.Now()
	cost := pool.CostModel.Cost(req.promptTokens, req.maxOutput)
	if m := g.reg.Model(req.model); m != nil {
		if lim := m.TokenLimit(); lim > 0 && cost.ProviderTokens > lim {
			return jobs.Job{}, req.explainDefault(providerTooLargeError(req.model, cost.ProviderTokens, lim), pool)
		}
	}
	if rej := t.Limiter.Check(now, cost); rej != nil && !rej.Retryable {
		return jobs.Job{}, req.explainDefault(rejectionError(rej), pool)
	}
	// A DryRun tenant's job over its budget is accepted; its admission at
	// dispatch counts the would-be refusal, once.
	if ok, resetIn, st := t.CheckBudget(now, cost.Weighted); !ok && !pol.DryRun {
		return jobs.Job{}, budgetError(resetIn, st, pol.Budget, cost.Weighted)
	}
	// ahead is how many of the tenant's jobs must leave its queue before a
	// submission fits: 1 at the bound, more when jobs were put back over it
	// (a provider 429) or the bound was lowered under the queue.
	ahead := 1
	// fullLocked is the refusal of a full tenant or pool queue, or nil; the
	// queue lock must be held.
	fullLocked := func(q *fairqueue.Queue) error {
		// Jobs the dispatcher has taken out and not yet sent still count
		// (they may be put back, and Requeue ignores bounds).
		if n := g.dispatch.queuedLocked(q, t.ID); n >= pol.MaxQueued {
			ahead = n - pol.MaxQueued + 1
			return fmt.Errorf("%w: tenant %q has %d jobs queued or about to be sent (max %d)", fairqueue.ErrTenantFull, t.ID, n, pol.MaxQueued)
		}
		// Jobs waiting for a retry backoff are queued too (the fair queue
		// counts only the rest against Config.MaxTotal), and so are jobs
		// taken out and not yet sent, as for the tenant's bound.
		if n := q.Total() + g.dispatch.retryingTotal + g.dispatch.heldTotalLocked(); pool.MaxQueuedJobs > 0 && n >= pool.MaxQueuedJobs {
			return fmt.Errorf("%w: %d jobs queued (max %d)", fairqueue.ErrPoolFull, n, pool.MaxQueuedJobs)
		}
		return nil
	}
	// A full queue refuses before the job is stored, so that a refusal
	// costs the store no write (two fsync'ed ones with a Volume store: a
	// tenant retrying against its full queue would take the disk's write
	// rate from every tenant). Checked again when the job is queued: jobs
	// may have been queued meanwhile.
	var err error
	g.reg.WithQueue(func(q *fairqueue.Queue) { err = fullLocked(q) })
	var job jobs.Job
	if err == nil {
		var serr error
		job, serr = g.store.Create(jobs.Job{
			Tenant: t.ID, Status: jobs.StatusQueued, Endpoint: sr.Endpoint, Model: req.model, Body: sr.Body,
			PromptTokens: req.promptTokens, MaxOutputTokens: req.maxOutput, Metadata: sr.Metadata,
			CreatedAt: now, Deadline: now.Add(deadline), WebhookURL: sr.WebhookURL,
			IdempotencyKey: sr.IdempotencyKey, IdempotencyFingerprint: fp,
		})
		if errors.Is(serr, jobs.ErrIdempotencyKeyHeld) {
			return job, errKeyHeld
		}
		if serr != nil {
			g.log.Error(serr, "storing a submitted job failed", "tenant", t.ID)
			return jobs.Job{}, &apiError{status: http.StatusInternalServerError, typ: typeAPI, code: codeStoreError, message: "The job could not be stored."}
		}
		g.reg.WithQueue(func(q *fairqueue.Queue) {
			if err = fullLocked(q); err != nil {
				return
			}
			idle := g.dispatch.queuedLocked(q, t.ID) == 0
			qd := &queued{model: req.model, cost: cost, wouldRefuse: req.wouldRefuse}
			// Priced like the jobs already queued (the dispatcher reprices
			// them all when the pool's cost model changes).
			fj := &fairqueue.Job{ID: job.ID, Tenant: t.ID, Cost: g.dispatch.queueCostLocked(qd, pool), Deadline: job.Deadline, Value: qd}
			if err = t.Enqueue(q, now, fj); err == nil {
				g.dispatch.trackLocked(fj)
				if idle {
					// The time since the tenant's last dispatch was idle,
					// not a slow drain (queue_full's Retry-After).
					t.ObserveBacklog(now)
				}
			}
		})
		if err != nil {
			var removed func()
			if handOver != nil {
				removed = handOver()
			}
			g.dispatch.removeRefused(job.ID, removed)
		}
	}
	if err != nil {
		switch {
		case errors.Is(err, fairqueue.ErrTenantFull):
			// A slot frees when the tenant's queue has drained ahead jobs:
			// ahead times its measured drain interval, else the time its
			// token rate takes to pay for ahead jobs like this one, at
			// least 1 s.
			wait := time.Second
			if d, ok := t.DrainInterval(now); ok {
				wait = max(wait, scaleDuration(d, ahead))
			} else if l := pol.Limits.WeightedPerMinute; l != nil && *l > 0 {
				wait = max(wait, refillTime(satMul(cost.Weighted, int64(ahead)), *l))
			}
			return jobs.Job{}, &apiError{status: http.StatusTooManyRequests, typ: typeRateLimit, code: codeQueueFull,
				retryAfter: wait, retryable: true,
				message: fmt.Sprintf("The tenant's job queue is full (%d jobs). Retry in %ds.", pol.MaxQueued, retryAfterSeconds(wait))}
		case errors.Is(err, fairqueue.ErrPoolFull):
			return jobs.Job{}, &apiError{status: http.StatusServiceUnavailable, typ: typeRateLimit, code: codePoolQueueFull,
				retryAfter: time.Second, retryable: true, message: "The pool's job queue is full. Retry in 1s."}
		case errors.Is(err, fairqueue.ErrExpired):
			return jobs.Job{}, badParam(codeInvalidDeadline, "deadlineSeconds", "deadlineSeconds is too short: the job's deadline has already passed.")
		default:
			return jobs.Job{}, badRequest(codeInvalidRequest, "The job could not be queued.")
		}
	}
	g.metrics.Tenant(t).Requests(metrics.OutcomeQueued).Inc()
	g.dispatch.wake()
	return job, nil
}

// scaleDuration returns d*n, saturating at the largest Duration.
func scaleDuration(d time.Duration, n int) time.Duration {
	return time.Duration(satMul(int64(d), int64(n)))
}

// satMul returns a*b for a, b >= 0, saturating at math.MaxInt64.
func satMul(a, b int64) int64 {
	if a > 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}

// ownJob returns the tenant's job, or a 404 for a job that does not exist
// or belongs to another tenant (indistinguishable on purpose).
func (g *Gateway) ownJob(tenant, id string) (jobs.Job, *apiError) {
	j, err := g.store.Get(id)
	if err != nil || j.Tenant != tenant {
		return jobs.Job{}, &apiError{status: http.StatusNotFound, typ: typeNotFound, code: codeJobNotFound, message: "No such job."}
	}
	return j, nil
}

// getJob serves GET /v1/jobs/{id}.
func (g *Gateway) getJob(w http.ResponseWriter, r *http.Request) {
	t, _, aerr := g.identify(r)
	if aerr != nil {
		g.refuse(w, nil, aerr)
		return
	}
	j, aerr := g.ownJob(t.ID, r.PathValue("id"))
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	if !j.StartedAt.IsZero() {
		// The queue wait of a started job (docs/api.md "Batch jobs").
		w.Header().Set("X-Queue-Wait-Ms", strconv.FormatInt(j.QueueWait.Milliseconds(), 10))
	}
	writeJSON(w, http.StatusOK, viewOf(j))
}

// listResponse is the JSON shape of GET /v1/jobs.
type listResponse struct {
	Object  string    `json:"object"`
	Data    []jobView `json:"data"`
	HasMore bool      `json:"has_more"`
	FirstID *string   `json:"first_id"`
	LastID  *string   `json:"last_id"`
}

// listJobs serves GET /v1/jobs?status=&limit=&after=: the tenant's jobs in
// submission order, keyset-paged (pass last_id as after for the next page).
func (g *Gateway) listJobs(w http.ResponseWriter, r *http.Request) {
	t, _, aerr := g.identify(r)
	if aerr != nil {
		g.refuse(w, nil, aerr)
		return
	}
	q := r.URL.Query()
	f := jobs.Filter{Status: jobs.Status(q.Get("status")), After: q.Get("after"), Limit: defaultListLimit}
	if f.Status != "" && !f.Status.Valid() {
		writeError(w, badParam(codeInvalidRequest, "status", "status must be queued, running, succeeded, failed, expired or cancelled."))
		return
	}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxListLimit {
			writeError(w, badParam(codeInvalidRequest, "limit", fmt.Sprintf("limit must be an integer in [1, %d].", maxListLimit)))
			return
		}
		f.Limit = n
	}
	list, more, err := g.store.List(t.ID, f)
	if err != nil {
		writeError(w, badParam(codeInvalidRequest, "after", "after is not a job id."))
		return
	}
	resp := listResponse{Object: "list", Data: make([]jobView, len(list)), HasMore: more}
	for i, j := range list {
		resp.Data[i] = viewOf(j)
	}
	if len(list) > 0 {
		resp.FirstID, resp.LastID = &list[0].ID, &list[len(list)-1].ID
	}
	writeJSON(w, http.StatusOK, resp)
}

// cancelJob serves DELETE /v1/jobs/{id}: a queued job is cancelled (200
// with the job); a running or finished one is 409 job_not_cancellable.
func (g *Gateway) cancelJob(w http.ResponseWriter, r *http.Request) {
	t, _, aerr := g.identify(r)
	if aerr != nil {
		g.refuse(w, nil, aerr)
		return
	}
	j, aerr := g.ownJob(t.ID, r.PathValue("id"))
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	j, ok, err := g.dispatch.cancel(j.ID)
	if err != nil {
		writeError(w, &apiError{status: http.StatusInternalServerError, typ: typeAPI, code: codeStoreError,
			message: "The job's cancellation could not be stored; the job is still queued."})
		return
	}
	if !ok {
		writeError(w, &apiError{status: http.StatusConflict, typ: typeInvalidRequest, code: codeJobNotCancellable,
			message: "The job " + notCancellableState(j.Status) + " and can no longer be cancelled."})
		return
	}
	writeJSON(w, http.StatusOK, viewOf(j))
}

// notCancellableState says why a job of status st cannot be cancelled, for
// the 409 job_not_cancellable message ("The job has succeeded and can no
// longer be cancelled."). A job whose record still says queued has left
// the queue an instant ago, its record not yet changed: the dispatcher took
// it out to send it (marked running next), to expire or fail it (its
// deadline passed, its tenant or model was removed), or another DELETE is
// recording its cancellation.
func notCancellableState(st jobs.Status) string {
	switch st {
	case jobs.StatusQueued:
		return "has just left the queue (to be sent or finished)"
	case jobs.StatusRunning:
		return "is running"
	case jobs.StatusCancelled:
		return "is already cancelled"
	default: // succeeded, failed, expired
		return "has " + string(st)
	}
}
