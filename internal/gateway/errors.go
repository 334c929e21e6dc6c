package gateway

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/throttle"
)

// OpenAI error types used in our error bodies.
const (
	typeRateLimit      = "rate_limit_error"
	typeInvalidRequest = "invalid_request_error"
	typeAuthentication = "authentication_error"
	typePermission     = "permission_error"
	typeNotFound       = "not_found_error"
	typeAPI            = "api_error"
)

// Error codes of our own responses (the "code" of the JSON error), besides
// the limiter reasons (token_rate_limit, request_rate_limit,
// concurrency_limit, memory_limit, request_too_large, tenant_suspended, ...).
const (
	codeInvalidAPIKey          = "invalid_api_key"
	codeUnknownTenant          = "unknown_tenant"
	codeBodyTooLarge           = "body_too_large"
	codeInvalidJSON            = "invalid_json"
	codeInvalidRequest         = "invalid_request"
	codeModelNotFound          = "model_not_found"
	codeQueueFull              = "queue_full"
	codePoolQueueFull          = "pool_queue_full"
	codeBudgetExhausted        = "budget_exhausted"
	codeUpstreamQuotaExhausted = "upstream_quota_exhausted"
	codePoolConcurrency        = "pool_concurrency_limit"
	codeUpstreamUnavailable    = "upstream_unavailable"
	codeUpstreamTimeout        = "upstream_timeout"
	// codeUpstreamInvalidResponse: the provider answered 200 with a body
	// that is not valid JSON (502).
	codeUpstreamInvalidResponse = "upstream_invalid_response"
	// codeUpstreamAuthentication: the provider refused the pool's own
	// credentials (401 or 403); the provider's body, which may quote the
	// key, is never passed on (502).
	codeUpstreamAuthentication = "upstream_authentication_failed"
	codeNotReady               = "not_ready"
	codeJobNotFound            = "job_not_found"
	codeJobNotCancellable      = "job_not_cancellable"
	codeInvalidEndpoint        = "invalid_endpoint"
	codeInvalidDeadline        = "invalid_deadline"
	codeStreamNotSupported     = "stream_not_supported"
	codeMethodNotAllowed       = "method_not_allowed"
	codeMaxTokensTooLarge      = "max_tokens_too_large"
	// codeBatchDisabled: the tenant's plan allows no batch jobs
	// (spec.batch.maxQueuedJobs is 0): 403, not retryable.
	codeBatchDisabled = "batch_disabled"
)

// Quota units of quotaDim. unitTokens and unitRequests name the
// X-RateLimit-*-Tokens and X-RateLimit-*-Requests fields (OpenAI's
// convention) and the IETF policies "tokens" and "requests";
// unitConcurrent has no X-RateLimit-* name and is written only as the IETF
// policy "concurrency" with the registered quota unit "concurrent-requests"
// (draft-ietf-httpapi-ratelimit-headers-11 section 3.1.2).
const (
	unitTokens     = "tokens"
	unitRequests   = "requests"
	unitConcurrent = "concurrent-requests"
)

// quotaDim describes one rate dimension for the X-RateLimit-* and IETF
// RateLimit / RateLimit-Policy response fields: unit (unitTokens,
// unitRequests or unitConcurrent), the published limit (per minute for
// tokens and requests, requests in flight for concurrency), what is left,
// and the time until the bucket is full again (for a refusal: its
// Retry-After). policy names the IETF quota policy; empty means the unit's
// default name ("tokens", "requests", "concurrency").
type quotaDim struct {
	unit             string
	policy           string
	limit, remaining int64
	reset            time.Duration
}

// apiError is one of our error responses: status, OpenAI-style type and
// code, message, the Retry-After (0: none) and the quota dimension that
// tripped (nil: none).
type apiError struct {
	status     int
	typ, code  string
	message    string
	retryAfter time.Duration
	retryable  bool
	dim        *quotaDim
	// providerLimit: a 413 request_too_large against the provider's limit
	// of the model rather than one of the tenant's limits.
	providerLimit bool
	// param names the request parameter at fault ("model", "max_tokens",
	// "deadlineSeconds"), as OpenAI's error "param" does; "" writes null.
	param string
}

// detail is e's JSON error object: message, type, param (null when e names
// no parameter) and code.
func (e *apiError) detail() errorDetail {
	d := errorDetail{Message: e.message, Type: e.typ, Code: e.code}
	if e.param != "" {
		d.Param = &e.param
	}
	return d
}

// retryAfterSeconds rounds d up to whole seconds, at least 1 (RFC 9110
// section 10.2.3 takes whole seconds; BC-09: 13 s gives 13, 0.1 s gives 1).
func retryAfterSeconds(d time.Duration) int64 {
	s := int64(math.Ceil(d.Seconds()))
	return max(s, 1)
}

// ceilSeconds rounds d up to whole seconds, at least 0.
func ceilSeconds(d time.Duration) int64 {
	return max(int64(math.Ceil(d.Seconds())), 0)
}

// quotaWindowSeconds is the "w" (time window, seconds) of the tokens and
// requests policies: their limits are per minute.
const quotaWindowSeconds = 60

// sfMaxInteger is the largest Structured Field Integer (RFC 9651 section
// 3.3.1: at most 15 decimal digits); larger figures are clamped to it so
// that the field stays valid.
const sfMaxInteger = 999_999_999_999_999

// sfInteger clamps v to a non-negative Structured Field Integer: the q, w,
// r and t parameters of the IETF fields are non-negative Integers
// (draft-ietf-httpapi-ratelimit-headers-11 sections 3.1.1, 3.1.3, 4.1.1,
// 4.1.2).
func sfInteger(v int64) int64 { return min(max(v, 0), sfMaxInteger) }

// appendSFString appends s as a Structured Field String (RFC 9651 section
// 3.3.3 and 4.1.6): DQUOTE, printable ASCII with `"` and `\` escaped,
// DQUOTE. Other characters cannot occur in a String and are dropped (our
// policy names are fixed ASCII words).
func appendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c >= 0x20 && c <= 0x7e:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// policyName is the IETF policy name of d.
func (d quotaDim) policyName() string {
	switch {
	case d.policy != "":
		return d.policy
	case d.unit == unitConcurrent:
		return "concurrency"
	}
	return d.unit
}

// setQuotaHeaders writes the quota fields of dims (brief "data plane
// contract"), one dimension per quota policy, in the order given; a later
// dimension with the policy name of an earlier one is skipped.
//
// OpenAI's fields, for tokens and requests: X-RateLimit-Limit-{Tokens|
// Requests} (the limit per minute), X-RateLimit-Remaining-… (what is left
// now, at least 0) and X-RateLimit-Reset-… (whole seconds until the bucket
// is full again, rounded up).
//
// The IETF fields of draft-ietf-httpapi-ratelimit-headers-11 (sections 3 and
// 4): RateLimit-Policy and RateLimit are Structured Field Lists (RFC 9651)
// of Items whose bare item is a String, the policy name, with one member per
// dimension:
//
//	RateLimit-Policy: "tokens";q=60000;qu="tokens";w=60, "requests";q=600;w=60
//	RateLimit: "tokens";r=9850;t=1, "requests";r=99;t=1
//
// q is the limit and w the window in seconds (60: the limits are per
// minute); r is what is left and t the seconds until the bucket is full
// again (for a refusal: its wait rounded up like Retry-After but without
// the floor of 1, so Retry-After never names a time before the end of t,
// section 6).
// Quota units (section 3.1.2): "requests" is the draft's default and is not
// written; tokens are not a registered unit (the draft registers requests,
// content-bytes and concurrent-requests, section 10.3), and leaving qu out
// would make clients read a token quota as requests, so the tokens policy
// carries qu="tokens" as an unregistered unit. Tokens are the tenant's
// weighted tokens of the pool's cost model. Concurrency (unitConcurrent) is
// the policy "concurrency" with the registered unit
// qu="concurrent-requests", no window and no t, and has no X-RateLimit-*
// fields.
func setQuotaHeaders(h http.Header, dims ...quotaDim) {
	if len(dims) == 0 {
		return
	}
	// All values are appended to one buffer and cut from one string, and
	// the fields are stored under their canonical keys (what h.Set would
	// do, with one allocation instead of one per field).
	type xField struct {
		key        string
		start, end int
	}
	xs := make([]xField, 0, 6)
	buf := make([]byte, 0, 256)
	var polBuf, rlBuf [160]byte
	pol, rl := polBuf[:0], rlBuf[:0]
	for i, d := range dims {
		name := d.policyName()
		dup := false
		for _, prev := range dims[:i] {
			if prev.policyName() == name {
				dup = true
				break
			}
		}
		if dup {
			continue
		}
		reset := ceilSeconds(d.reset)
		if keys := xRateLimitKeys(d.unit); keys[0] != "" {
			for k, v := range [3]int64{max(d.limit, 0), max(d.remaining, 0), reset} {
				start := len(buf)
				buf = strconv.AppendInt(buf, v, 10)
				xs = append(xs, xField{keys[k], start, len(buf)})
			}
		}
		if len(rl) > 0 {
			rl = append(rl, ", "...)
			pol = append(pol, ", "...)
		}
		pol = appendSFString(pol, name)
		pol = append(pol, ";q="...)
		pol = strconv.AppendInt(pol, sfInteger(d.limit), 10)
		switch d.unit {
		case unitTokens, unitConcurrent:
			pol = append(pol, ";qu="...)
			pol = appendSFString(pol, d.unit)
		}
		rl = appendSFString(rl, name)
		rl = append(rl, ";r="...)
		rl = strconv.AppendInt(rl, sfInteger(d.remaining), 10)
		if d.unit != unitConcurrent {
			pol = append(pol, ";w="...)
			pol = strconv.AppendInt(pol, quotaWindowSeconds, 10)
			rl = append(rl, ";t="...)
			rl = strconv.AppendInt(rl, sfInteger(reset), 10)
		}
	}
	polStart := len(buf)
	buf = append(buf, pol...)
	rlStart := len(buf)
	buf = append(buf, rl...)
	all := string(buf)
	nx := len(xs)
	vals := make([]string, nx+2)
	for i, f := range xs {
		// In dimension order, so that a later dimension of the same unit
		// wins as with h.Set.
		vals[i] = all[f.start:f.end]
		h[f.key] = vals[i : i+1 : i+1]
	}
	vals[nx], vals[nx+1] = all[polStart:rlStart], all[rlStart:]
	h["Ratelimit-Policy"] = vals[nx : nx+1 : nx+1]
	h["Ratelimit"] = vals[nx+1 : nx+2 : nx+2]
}

// xRateLimitKeys returns the canonical keys (http.CanonicalHeaderKey) of
// the X-RateLimit-Limit-, -Remaining- and -Reset- fields of a unit, or
// empty keys when OpenAI has none (xRateLimitSuffix).
func xRateLimitKeys(unit string) [3]string {
	switch unit {
	case unitTokens:
		return [3]string{"X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens"}
	case unitRequests:
		return [3]string{"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests"}
	}
	if suffix := xRateLimitSuffix(unit); suffix != "" {
		return [3]string{http.CanonicalHeaderKey("X-RateLimit-Limit-" + suffix),
			http.CanonicalHeaderKey("X-RateLimit-Remaining-" + suffix), http.CanonicalHeaderKey("X-RateLimit-Reset-" + suffix)}
	}
	return [3]string{}
}

// xRateLimitSuffix is the suffix of OpenAI's X-RateLimit-* fields for a
// unit, or "" when OpenAI has none (concurrency).
func xRateLimitSuffix(unit string) string {
	switch unit {
	case unitTokens:
		return "Tokens"
	case unitRequests:
		return "Requests"
	}
	return ""
}

type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

// writeError writes e as an OpenAI-style JSON error with its Retry-After
// (whole seconds, rounded up, at least 1: BC-09) and quota headers.
//
// Retry-After-Ms is deliberately not written: the OpenAI SDKs (Go, Python,
// Node) read it before Retry-After, so it would replace the contract's
// whole-second, at-least-1 wait with a sub-second one and bring retries
// back before the floor of 1 s. With Retry-After alone the SDKs' built-in
// retry waits exactly the advertised seconds (openai-go v3
// internal/requestconfig: Retry-After-Ms, then Retry-After, then backoff;
// 408, 409, 429 and 5xx are retried, other statuses are not).
func writeError(w http.ResponseWriter, e *apiError) {
	h := w.Header()
	if e.retryable {
		h.Set("Retry-After", strconv.FormatInt(retryAfterSeconds(e.retryAfter), 10))
	}
	if e.dim != nil {
		setQuotaHeaders(h, *e.dim)
	}
	writeJSON(w, e.status, errorBody{Error: e.detail()})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":{"message":"encoding the response failed","type":"api_error","param":null,"code":"internal_error"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// badRequest is a 400 invalid_request_error with code and message and no
// param.
func badRequest(code, msg string) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: typeInvalidRequest, code: code, message: msg}
}

// badParam is badRequest naming the request parameter at fault in the
// error's "param" (OpenAI's error format: "model", "max_tokens", a job's
// "deadlineSeconds"), so that a client can tell which field to fix without
// parsing the message.
func badParam(code, param, msg string) *apiError {
	e := badRequest(code, msg)
	e.param = param
	return e
}

// rejectionError maps a limiter refusal to our response (brief "data plane
// contract"; seed 002 section 8): 413 request_too_large when the request can
// never fit (BC-10: no Retry-After), 403 tenant_suspended for a zero limit,
// else 429 with the reason as code, Retry-After rounded up (BC-09) and the
// quota fields of the dimension that tripped.
func rejectionError(rej *limiter.Rejection) *apiError {
	switch rej.Reason {
	case limiter.ReasonTooLarge:
		msg := "Request too large: its cost exceeds the tenant's limit and can never be admitted. Reduce the prompt or max_tokens."
		if rej.Unit != "" {
			msg = fmt.Sprintf("Request too large: it needs %d %s, more than the %d the tenant's plan grants at once, "+
				"so it can never be admitted. Reduce the prompt or max_tokens.", rej.Need, rej.Unit, rej.Capacity)
		}
		return &apiError{status: http.StatusRequestEntityTooLarge, typ: typeInvalidRequest, code: string(rej.Reason), message: msg}
	case limiter.ReasonSuspended:
		return &apiError{status: http.StatusForbidden, typ: typePermission, code: string(rej.Reason),
			message: "The tenant is suspended: one of its limits is 0. Ask the pool's operator to raise it in the tenant's TenantQuota."}
	}
	secs := retryAfterSeconds(rej.RetryAfter)
	e := &apiError{status: http.StatusTooManyRequests, typ: typeRateLimit, code: string(rej.Reason),
		retryAfter: rej.RetryAfter, retryable: true}
	switch rej.Reason {
	case limiter.ReasonTokenRate:
		e.message = fmt.Sprintf("Rate limit exceeded: %d weighted tokens per minute. Retry in %ds.", rej.Limit, secs)
		e.dim = &quotaDim{unit: "tokens", limit: rej.Limit, remaining: rej.Remaining, reset: rej.RetryAfter}
	case limiter.ReasonInputTokenRate:
		e.message = fmt.Sprintf("Rate limit exceeded: %d input tokens per minute. Retry in %ds.", rej.Limit, secs)
		e.dim = &quotaDim{unit: "tokens", policy: "input-tokens", limit: rej.Limit, remaining: rej.Remaining, reset: rej.RetryAfter}
	case limiter.ReasonOutputTokenRate:
		e.message = fmt.Sprintf("Rate limit exceeded: %d output tokens per minute. Retry in %ds.", rej.Limit, secs)
		e.dim = &quotaDim{unit: "tokens", policy: "output-tokens", limit: rej.Limit, remaining: rej.Remaining, reset: rej.RetryAfter}
	case limiter.ReasonRequestRate:
		e.message = fmt.Sprintf("Rate limit exceeded: %d requests per minute. Retry in %ds.", rej.Limit, secs)
		e.dim = &quotaDim{unit: "requests", limit: rej.Limit, remaining: rej.Remaining, reset: rej.RetryAfter}
	case limiter.ReasonConcurrency:
		e.message = fmt.Sprintf("Concurrency limit exceeded: the tenant may have %d requests in flight at a time. Retry in %ds.", rej.Limit, secs)
		e.dim = &quotaDim{unit: unitConcurrent, limit: rej.Limit, remaining: 0}
	case limiter.ReasonMemory:
		e.message = fmt.Sprintf("KV-cache limit exceeded: %d blocks. Retry in %ds.", rej.Limit, secs)
	default:
		e.message = fmt.Sprintf("Rate limit exceeded (%s). Retry in %ds.", rej.Reason, secs)
	}
	return e
}

// budgetError is the refusal of a request of cost weighted tokens that does
// not fit the remaining budget st of the tenant's budget b: 429
// budget_exhausted with Retry-After at the period's reset (resetIn), or,
// when cost exceeds the whole budget so that no reset can help, a
// non-retryable 413 request_too_large (BC-10).
// budgetRefusalCode is the code of budgetError for a request of cost
// weighted tokens that does not fit budget b.
func budgetRefusalCode(b *registry.BudgetPolicy, cost int64) string {
	if b == nil || cost > b.WeightedTokens {
		return codeRequestTooLarge
	}
	return codeBudgetExhausted
}

func budgetError(resetIn time.Duration, st registry.BudgetStatus, b *registry.BudgetPolicy, cost int64) *apiError {
	budget, period := int64(0), "period"
	if b != nil {
		budget, period = b.WeightedTokens, b.Period
	}
	if cost > budget {
		// Larger than the whole budget: no reset will ever admit it.
		return &apiError{status: http.StatusRequestEntityTooLarge, typ: typeInvalidRequest, code: codeRequestTooLarge,
			message: fmt.Sprintf("Request too large: it costs %d weighted tokens, more than the tenant's whole budget of %d per %s, "+
				"so it can never be admitted. Reduce the prompt or max_tokens.", cost, budget, period)}
	}
	return &apiError{status: http.StatusTooManyRequests, typ: typeRateLimit, code: codeBudgetExhausted,
		retryAfter: resetIn, retryable: true,
		message: fmt.Sprintf("Budget exhausted: %d of the tenant's %d weighted tokens per %s are used, %d left. "+
			"Retry after %s (in %ds) or ask for a larger budget.",
			st.Used+st.Reserved, budget, period, st.Remaining, st.ResetTime.UTC().Format(time.RFC3339), retryAfterSeconds(resetIn))}
}

// upstreamRetryAfter is the Retry-After passed to the client with a
// provider's 5xx (or 408): the provider's Retry-After (delay-seconds or an
// HTTP-date), retry-after-ms or x-ms-retry-after-ms as the throttle's parser
// read them (the millisecond forms first), in whole seconds rounded up, at
// least 1 (BC-09); ok false when the provider sent none or the status is
// not a server error.
func upstreamRetryAfter(status int, q throttle.Quota) (string, bool) {
	if (status < 500 && status != http.StatusRequestTimeout) || !q.HasRetryAfter {
		return "", false
	}
	return strconv.FormatInt(retryAfterSeconds(q.RetryAfter), 10), true
}

// upstreamQuotaError is the 503 of a call the pool cannot start now: the
// provider's quota is paused after a 429 or held at the reserve.
func upstreamQuotaError(wait time.Duration) *apiError {
	return &apiError{status: http.StatusServiceUnavailable, typ: typeRateLimit, code: codeUpstreamQuotaExhausted,
		retryAfter: wait, retryable: true,
		message: fmt.Sprintf("The provider's quota for this pool is exhausted. Retry in %ds.", retryAfterSeconds(wait))}
}

// tenantQuotaDims returns the tenant's current quota dimensions for the
// headers of a successful response: tokens (weighted) and requests, each
// only when limited.
func tenantQuotaDims(t *registry.Tenant, snap limiter.Snapshot) []quotaDim {
	var dims []quotaDim
	l := t.Policy().Limits
	// The reset is the limiter's own time until the bucket is full, debt
	// included (a soft-limited tenant may be below 0).
	if snap.TokensLimitPerMinute > 0 && l.WeightedPerMinute != nil {
		dims = append(dims, quotaDim{unit: "tokens", limit: snap.TokensLimitPerMinute, remaining: snap.TokensRemaining,
			reset: snap.TokensReset})
	}
	if snap.RequestsRemaining >= 0 && l.RequestsPerMinute != nil && *l.RequestsPerMinute > 0 {
		dims = append(dims, quotaDim{unit: "requests", limit: *l.RequestsPerMinute, remaining: snap.RequestsRemaining,
			reset: snap.RequestsReset})
	}
	return dims
}

// refillTime is the time to refill missing units at perMinute per 60 s.
func refillTime(missing, perMinute int64) time.Duration {
	if missing <= 0 || perMinute <= 0 {
		return 0
	}
	d := float64(missing) / float64(perMinute) * float64(time.Minute)
	if d >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(d)
}

// upstreamAuthError is the answer to a call the provider refused with 401 or
// 403: the pool's credentials are wrong, not the tenant's request, so the
// tenant gets a 502 naming the pool's credentials and never the provider's
// body (providers quote the key they refused, e.g. "Incorrect API key
// provided: sk-...").
func upstreamAuthError() *apiError {
	return &apiError{status: http.StatusBadGateway, typ: typeAPI, code: codeUpstreamAuthentication,
		message: "The provider refused the pool's credentials; the pool's operator must fix spec.upstream.credentialsSecretRef."}
}

// isAuthRefusal reports whether an upstream status says the provider
// refused the pool's credentials (RFC 9110 sections 15.5.2 and 15.5.4).
func isAuthRefusal(status int) bool {
	return status == http.StatusUnauthorized || status == http.StatusForbidden
}
