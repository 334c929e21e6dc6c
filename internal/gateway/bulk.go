package gateway

import (
	"bytes"
	"fmt"
	"net/http"
	"strconv"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// maxBulkLines bounds the jobs of one POST /v1/jobs/bulk (non-blank lines);
// the body is also bounded by the gateway's body limit (8 MiB by default).
const maxBulkLines = 10000

// codeTooManyJobs refuses a bulk upload of more than maxBulkLines jobs.
const codeTooManyJobs = "too_many_jobs"

// bulkLineError is the error of one refused line: the OpenAI error object
// POST /v1/jobs would have answered, its HTTP status, and for a retryable
// refusal the Retry-After in whole seconds.
type bulkLineError struct {
	errorDetail
	Status     int    `json:"status"`
	RetryAfter *int64 `json:"retry_after"`
}

// bulkLine is the result of one non-blank line: Job when queued, Error when
// refused (exactly one is set).
type bulkLine struct {
	Line int      `json:"line"`
	Job  *jobView `json:"job,omitempty"`
	// Replayed: the line's idempotencyKey is held by the tenant's job of
	// the same submission, which Job is; no job was created.
	Replayed bool           `json:"replayed,omitempty"`
	Error    *bulkLineError `json:"error,omitempty"`
}

// bulkResponse is the JSON shape of POST /v1/jobs/bulk.
type bulkResponse struct {
	Object  string     `json:"object"`
	Queued  int        `json:"queued"`
	Refused int        `json:"refused"`
	Data    []bulkLine `json:"data"`
}

// submitBulk serves POST /v1/jobs/bulk: an NDJSON body, one POST /v1/jobs
// object per line, each validated and queued independently in line order
// with the rules of a single submission (queueJob). The answer is 200 with
// one result per non-blank line, in order. Once a line is refused for a
// full queue (queue_full, pool_queue_full), every later line is refused
// with the same error without being tried, so an upload is never queued
// with holes the client did not see (a later line whose idempotencyKey
// the tenant's job of the same submission holds is still answered with
// that job); Retry-After is then set on the response too. A line may carry
// its own idempotencyKey, with the rules of POST /v1/jobs's
// Idempotency-Key (queueJob): a line already queued under its key is
// answered with its job and "replayed": true. The whole upload is refused
// (nothing queued) when it is not identified, exceeds the body limit (413
// body_too_large), carries an Idempotency-Key field (400
// invalid_idempotency_key: keys are per line), has no job (400
// invalid_request) or more than maxBulkLines (413 too_many_jobs).
func (g *Gateway) submitBulk(w http.ResponseWriter, r *http.Request) {
	t, pool, raw, ok := g.identifyAndRead(w, r)
	if !ok {
		return
	}
	if len(r.Header.Values(headerIdempotencyKey)) > 0 {
		g.refuse(w, t, badIdempotencyKey(headerIdempotencyKey, "POST /v1/jobs/bulk takes no Idempotency-Key field: give each line its own \"idempotencyKey\" member."))
		return
	}
	type line struct {
		n    int
		text []byte
	}
	var lines []line
	for i, l := range bytes.Split(raw, []byte("\n")) {
		l = bytes.TrimSpace(l)
		if len(l) == 0 {
			continue
		}
		if len(lines) == maxBulkLines {
			g.refuse(w, t, &apiError{status: http.StatusRequestEntityTooLarge, typ: typeInvalidRequest, code: codeTooManyJobs,
				message: fmt.Sprintf("A bulk upload holds at most %d jobs (non-blank lines).", maxBulkLines)})
			return
		}
		lines = append(lines, line{n: i + 1, text: l})
	}
	if len(lines) == 0 {
		g.refuse(w, t, badRequest(codeInvalidRequest, "The upload holds no job: send one job object per line (NDJSON)."))
		return
	}
	resp := bulkResponse{Object: "bulk", Data: make([]bulkLine, 0, len(lines))}
	var full *apiError // a full queue refuses every later line
	for _, l := range lines {
		var job jobView
		e, replayed := g.bulkOne(t, pool, l.text, full, &job)
		if e == nil {
			if !replayed {
				resp.Queued++
			}
			resp.Data = append(resp.Data, bulkLine{Line: l.n, Job: &job, Replayed: replayed})
			continue
		}
		if full == nil && (e.code == codeQueueFull || e.code == codePoolQueueFull) {
			full = e
		}
		g.countRefusal(t, e)
		resp.Refused++
		le := &bulkLineError{errorDetail: e.detail(), Status: e.status}
		if e.retryable {
			s := retryAfterSeconds(e.retryAfter)
			le.RetryAfter = &s
		}
		resp.Data = append(resp.Data, bulkLine{Line: l.n, Error: le})
	}
	if full != nil {
		w.Header().Set("Retry-After", strconv.FormatInt(retryAfterSeconds(full.retryAfter), 10))
	}
	writeJSON(w, http.StatusOK, resp)
}

// bulkOne parses and queues one line into *out; replayed says the line's
// idempotency key was held by its job. Once a line was refused for a full
// queue (full), a line is only answered with the job its key holds for
// the same submission, and otherwise refused with full untried.
func (g *Gateway) bulkOne(t *registry.Tenant, pool *registry.PoolPolicy, text []byte, full *apiError, out *jobView) (*apiError, bool) {
	if full != nil {
		if sr, aerr := parseSubmit(text); aerr == nil && sr.IdempotencyKey != "" {
			if j, ok := g.store.ByIdempotencyKey(t.ID, sr.IdempotencyKey); ok && j.IdempotencyFingerprint == submitFingerprint(sr) {
				*out = viewOf(j)
				return nil, true
			}
		}
		return full, false
	}
	sr, aerr := parseSubmit(text)
	if aerr != nil {
		return aerr, false
	}
	job, replayed, aerr := g.queueJob(t, pool, sr, paramLineKey)
	if aerr != nil {
		return aerr, false
	}
	*out = viewOf(job)
	return nil, replayed
}

// countRefusal counts a refused bulk line as refuse counts a refused
// request: the request metric by code, and the tenant's rejections for
// 429, 403 and a 413 against its limits.
func (g *Gateway) countRefusal(t *registry.Tenant, e *apiError) {
	if e.status == http.StatusTooManyRequests || e.status == http.StatusForbidden ||
		(e.status == http.StatusRequestEntityTooLarge && e.code == string(limiter.ReasonTooLarge)) {
		t.AddRejection()
	}
	g.metrics.Tenant(t).Requests(e.code).Inc()
}
