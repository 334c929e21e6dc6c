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
	codeNotReady               = "not_ready"
	codeJobNotFound            = "job_not_found"
	codeJobNotCancellable      = "job_not_cancellable"
	codeInvalidEndpoint        = "invalid_endpoint"
	codeInvalidDeadline        = "invalid_deadline"
	codeStreamNotSupported     = "stream_not_supported"
	codeMethodNotAllowed       = "method_not_allowed"
)

// quotaDim describes one rate dimension for the X-RateLimit-* and IETF
// RateLimit / RateLimit-Policy response fields: unit "tokens" or
// "requests", the published limit per minute, what is left, and the time
// until the client should expect room (for a refusal: its Retry-After).
type quotaDim struct {
	unit             string
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

// setQuotaHeaders writes X-RateLimit-{Limit,Remaining,Reset}-{Tokens|Requests}
// (reset in whole seconds) for each dimension, and the IETF
// draft-ietf-httpapi-ratelimit-headers fields `RateLimit: "tokens";r=R;t=T`
// and `RateLimit-Policy: "tokens";q=Q;w=60`.
func setQuotaHeaders(h http.Header, dims ...quotaDim) {
	var rl, pol string
	for i, d := range dims {
		suffix := "Tokens"
		if d.unit == "requests" {
			suffix = "Requests"
		}
		reset := ceilSeconds(d.reset)
		h.Set("X-RateLimit-Limit-"+suffix, strconv.FormatInt(d.limit, 10))
		h.Set("X-RateLimit-Remaining-"+suffix, strconv.FormatInt(d.remaining, 10))
		h.Set("X-RateLimit-Reset-"+suffix, strconv.FormatInt(reset, 10))
		if i > 0 {
			rl += ", "
			pol += ", "
		}
		rl += fmt.Sprintf("%q;r=%d;t=%d", d.unit, d.remaining, reset)
		pol += fmt.Sprintf("%q;q=%d;w=60", d.unit, d.limit)
	}
	if rl != "" {
		h.Set("RateLimit", rl)
		h.Set("RateLimit-Policy", pol)
	}
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
// and quota headers.
func writeError(w http.ResponseWriter, e *apiError) {
	h := w.Header()
	if e.retryable {
		h.Set("Retry-After", strconv.FormatInt(retryAfterSeconds(e.retryAfter), 10))
	}
	if e.dim != nil {
		setQuotaHeaders(h, *e.dim)
	}
	writeJSON(w, e.status, errorBody{Error: errorDetail{Message: e.message, Type: e.typ, Code: e.code}})
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

func badRequest(code, msg string) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: typeInvalidRequest, code: code, message: msg}
}

// rejectionError maps a limiter refusal to our response (brief "data plane
// contract"; seed 002 section 8): 413 request_too_large when the request can
// never fit (BC-10: no Retry-After), 403 tenant_suspended for a zero limit,
// else 429 with the reason as code, Retry-After rounded up (BC-09) and the
// quota fields of the dimension that tripped.
func rejectionError(rej *limiter.Rejection) *apiError {
	switch rej.Reason {
	case limiter.ReasonTooLarge:
		return &apiError{status: http.StatusRequestEntityTooLarge, typ: typeInvalidRequest, code: string(rej.Reason),
			message: "Request too large: its cost exceeds the tenant's limit and can never be admitted. Reduce the prompt or max_tokens."}
	case limiter.ReasonSuspended:
		return &apiError{status: http.StatusForbidden, typ: typePermission, code: string(rej.Reason),
			message: "The tenant is suspended: one of its limits is 0."}
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
		e.dim = &quotaDim{unit: "tokens", limit: rej.Limit, remaining: rej.Remaining, reset: rej.RetryAfter}
	case limiter.ReasonOutputTokenRate:
		e.message = fmt.Sprintf("Rate limit exceeded: %d output tokens per minute. Retry in %ds.", rej.Limit, secs)
		e.dim = &quotaDim{unit: "tokens", limit: rej.Limit, remaining: rej.Remaining, reset: rej.RetryAfter}
	case limiter.ReasonRequestRate:
		e.message = fmt.Sprintf("Rate limit exceeded: %d requests per minute. Retry in %ds.", rej.Limit, secs)
		e.dim = &quotaDim{unit: "requests", limit: rej.Limit, remaining: rej.Remaining, reset: rej.RetryAfter}
	case limiter.ReasonConcurrency:
		e.message = fmt.Sprintf("Concurrency limit exceeded: %d requests in flight. Retry in %ds.", rej.Limit, secs)
	case limiter.ReasonMemory:
		e.message = fmt.Sprintf("KV-cache limit exceeded: %d blocks. Retry in %ds.", rej.Limit, secs)
	default:
		e.message = fmt.Sprintf("Rate limit exceeded (%s). Retry in %ds.", rej.Reason, secs)
	}
	return e
}

// budgetError is the 429 of a request over the tenant's budget: retry when
// the period resets.
func budgetError(resetIn time.Duration, st registry.BudgetStatus) *apiError {
	return &apiError{status: http.StatusTooManyRequests, typ: typeRateLimit, code: codeBudgetExhausted,
		retryAfter: resetIn, retryable: true,
		message: fmt.Sprintf("Budget exhausted: %d weighted tokens used this period, %d left; it resets at %s.",
			st.Used, st.Remaining, st.ResetTime.UTC().Format(time.RFC3339))}
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
	if snap.TokensLimitPerMinute > 0 && l.WeightedPerMinute != nil {
		burst := *l.WeightedPerMinute / 6
		if l.WeightedBurst != nil && *l.WeightedBurst >= 1 {
			burst = *l.WeightedBurst
		}
		burst = max(burst, 1)
		dims = append(dims, quotaDim{unit: "tokens", limit: snap.TokensLimitPerMinute, remaining: snap.TokensRemaining,
			reset: refillTime(burst-snap.TokensRemaining, snap.TokensLimitPerMinute)})
	}
	if snap.RequestsRemaining >= 0 && l.RequestsPerMinute != nil && *l.RequestsPerMinute > 0 {
		burst := max(*l.RequestsPerMinute/6, 1)
		if l.RequestBurst != nil && *l.RequestBurst >= 1 {
			burst = *l.RequestBurst
		}
		dims = append(dims, quotaDim{unit: "requests", limit: *l.RequestsPerMinute, remaining: snap.RequestsRemaining,
			reset: refillTime(burst-snap.RequestsRemaining, *l.RequestsPerMinute)})
	}
	return dims
}

// refillTime is the time to refill missing units at perMinute per 60 s.
func refillTime(missing, perMinute int64) time.Duration {
	if missing <= 0 || perMinute <= 0 {
		return 0
	}
	return time.Duration(float64(missing) / float64(perMinute) * float64(time.Minute))
}
