package providersim

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ceilSeconds renders a non-negative duration as whole seconds, rounded up
// (a reset or wait is never announced earlier than it is), with the 1 µs
// float tolerance of retryAfterSeconds; 0 stays 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= time.Microsecond {
		return 0
	}
	return int64(math.Ceil((d - time.Microsecond).Seconds()))
}

// ceilTime rounds t up to a multiple of unit since the Unix epoch.
func ceilTime(t time.Time, unit time.Duration) time.Time {
	if tr := t.Truncate(unit); tr.Before(t) {
		return tr.Add(unit)
	}
	return t
}

// anthropicRemaining rounds a tokens remaining v (of a bucket of capacity
// limit) to the step (Config.AnthropicRemainingStep): down in the
// AnthropicHeadersTokens mode; to the nearest multiple, ties up, capped at
// limit, in the AnthropicHeadersInOut mode (provider-headers.md, Anthropic:
// "rounded to the nearest thousand"), which can exceed v by up to half a
// step.
func anthropicRemaining(v, limit int64, cfg Config) int64 {
	step := cfg.AnthropicRemainingStep
	if step <= 0 {
		step = DefaultAnthropicRemainingStep
	}
	if cfg.AnthropicHeaders == AnthropicHeadersTokens {
		return v / step * step
	}
	return min((v+step/2)/step*step, limit)
}

// writeQuotaHeaders sets the dialect's rate-limit headers from the snapshot
// q. An unlimited dimension sends no headers. Per dialect
// (provider-headers.md):
//
//   - openai: x-ratelimit-{limit,remaining,reset}-{requests,tokens}; limits
//     and remaining as integers (remaining floored), resets as Go durations
//     until the bucket is full, rounded to the millisecond ("6m0s", "1.5s",
//     "250ms", "0s").
//   - anthropic: anthropic-ratelimit-requests-{limit,remaining,reset}
//     (remaining exact) and, per Config.AnthropicHeaders, either (the
//     default AnthropicHeadersInOut) anthropic-ratelimit-input-tokens-*
//     for the InputTokensPerMinute bucket, anthropic-ratelimit-output-tokens-*
//     for the OutputTokensPerMinute bucket and anthropic-ratelimit-tokens-*
//     for the TokensPerMinute bucket (Anthropic's "most restrictive limit in
//     effect"), each when its limit is set, remaining rounded to the nearest
//     multiple of Config.AnthropicRemainingStep (default 1000: "rounded to
//     the nearest thousand"), ties up, capped at the limit — so 600 left
//     reads 1000; or (AnthropicHeadersTokens) the tokens triplet only,
//     remaining rounded down. Resets are RFC 3339 UTC times when the bucket
//     is full, rounded up to the second ("2026-01-01T00:00:06Z").
//   - azure: x-ratelimit-remaining-requests and x-ratelimit-remaining-tokens
//     (the per-minute buckets, floored), x-ratelimit-limit-tokens (TPM) and
//     x-ratelimit-reset-tokens, the time until the tokens bucket is full in
//     integer seconds, rounded up (provider-headers.md, Azure: "the reset is
//     observed as integer seconds"); no requests limit or reset.
//   - classic: X-RateLimit-Limit (requests per window), X-RateLimit-Remaining,
//     X-RateLimit-Reset: the window end as whole delta seconds (rounded up),
//     epoch seconds or epoch milliseconds (rounded up) per
//     Config.ClassicResetForm. The tokens quota, if any, is enforced but not
//     described (the classic fields count requests).
//   - ietf: RateLimit-Policy `"requests";q=N;w=S, "tokens";q=N;qu="tokens";w=S`
//     and RateLimit `"requests";r=N;t=S, "tokens";r=N;t=S` (draft-10/11 syntax;
//     no tokens unit is registered, so qu="tokens" is a vendor unit); t is the
//     window end in whole seconds, rounded up.
//   - ietf-legacy: RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset
//     (delta seconds, rounded up) and RateLimit-Policy "N;w=S" (draft-03..06),
//     for the requests quota only.
func writeQuotaHeaders(h http.Header, cfg Config, q quota) {
	itoa := func(v int64) string { return strconv.FormatInt(v, 10) }
	// The simulator's clock is the provider's: its Date goes with the
	// absolute resets (Anthropic, classic epoch), which clients read
	// against it when their clock differs.
	h.Set("Date", q.now.UTC().Format(http.TimeFormat))
	switch cfg.dialect() {
	case DialectOpenAI:
		if q.reqLimit > 0 {
			h.Set("x-ratelimit-limit-requests", itoa(q.reqLimit))
			h.Set("x-ratelimit-remaining-requests", itoa(q.reqRemaining))
			h.Set("x-ratelimit-reset-requests", q.reqReset.Round(time.Millisecond).String())
		}
		if q.tokLimit > 0 {
			h.Set("x-ratelimit-limit-tokens", itoa(q.tokLimit))
			h.Set("x-ratelimit-remaining-tokens", itoa(q.tokRemaining))
			h.Set("x-ratelimit-reset-tokens", q.tokReset.Round(time.Millisecond).String())
		}
	case DialectAnthropic:
		at := func(d time.Duration) string { return ceilTime(q.now.Add(d), time.Second).UTC().Format(time.RFC3339) }
		if q.reqLimit > 0 {
			h.Set("anthropic-ratelimit-requests-limit", itoa(q.reqLimit))
			h.Set("anthropic-ratelimit-requests-remaining", itoa(q.reqRemaining))
			h.Set("anthropic-ratelimit-requests-reset", at(q.reqReset))
		}
		triplet := func(name string, limit, remaining int64, reset time.Duration) {
			if limit > 0 {
				h.Set("anthropic-ratelimit-"+name+"-limit", itoa(limit))
				h.Set("anthropic-ratelimit-"+name+"-remaining", itoa(anthropicRemaining(remaining, limit, cfg)))
				h.Set("anthropic-ratelimit-"+name+"-reset", at(reset))
			}
		}
		triplet("tokens", q.tokLimit, q.tokRemaining, q.tokReset)
		if cfg.AnthropicHeaders != AnthropicHeadersTokens {
			triplet("input-tokens", q.inLimit, q.inRemaining, q.inReset)
			triplet("output-tokens", q.outLimit, q.outRemaining, q.outReset)
		}
	case DialectAzure:
		if q.reqLimit > 0 {
			h.Set("x-ratelimit-remaining-requests", itoa(q.reqRemaining))
		}
		if q.tokLimit > 0 {
			h.Set("x-ratelimit-limit-tokens", itoa(q.tokLimit))
			h.Set("x-ratelimit-remaining-tokens", itoa(q.tokRemaining))
			h.Set("x-ratelimit-reset-tokens", itoa(ceilSeconds(q.tokReset)))
		}
	case DialectClassic:
		if q.reqLimit > 0 {
			h.Set("X-RateLimit-Limit", itoa(q.reqLimit))
			h.Set("X-RateLimit-Remaining", itoa(q.reqRemaining))
			var reset string
			switch cfg.ClassicResetForm {
			case ClassicResetEpoch:
				reset = itoa(ceilTime(q.now.Add(q.reqReset), time.Second).Unix())
			case ClassicResetEpochMillis:
				reset = itoa(ceilTime(q.now.Add(q.reqReset), time.Millisecond).UnixMilli())
			default:
				reset = itoa(ceilSeconds(q.reqReset))
			}
			h.Set("X-RateLimit-Reset", reset)
		}
	case DialectIETF:
		w := int64(cfg.fixedWindow() / time.Second)
		var policy, limit []string
		if q.reqLimit > 0 {
			policy = append(policy, fmt.Sprintf(`"requests";q=%d;w=%d`, q.reqLimit, w))
			limit = append(limit, fmt.Sprintf(`"requests";r=%d;t=%d`, q.reqRemaining, ceilSeconds(q.reqReset)))
		}
		if q.tokLimit > 0 {
			policy = append(policy, fmt.Sprintf(`"tokens";q=%d;qu="tokens";w=%d`, q.tokLimit, w))
			limit = append(limit, fmt.Sprintf(`"tokens";r=%d;t=%d`, q.tokRemaining, ceilSeconds(q.tokReset)))
		}
		if len(policy) > 0 {
			h.Set("RateLimit-Policy", strings.Join(policy, ", "))
			h.Set("RateLimit", strings.Join(limit, ", "))
		}
	case DialectIETFLegacy:
		if q.reqLimit > 0 {
			h.Set("RateLimit-Limit", itoa(q.reqLimit))
			h.Set("RateLimit-Remaining", itoa(q.reqRemaining))
			h.Set("RateLimit-Reset", itoa(ceilSeconds(q.reqReset)))
			h.Set("RateLimit-Policy", fmt.Sprintf("%d;w=%d", q.reqLimit, int64(cfg.fixedWindow()/time.Second)))
		}
	}
}

// setRetryAfter sets Retry-After for a wait: delay-seconds rounded up, at
// least 1 (retryAfterSeconds), or with Config.RetryAfterHTTPDate the
// IMF-fixdate of now plus those seconds (RFC 9110 section 10.2.3).
func setRetryAfter(h http.Header, cfg Config, now time.Time, wait time.Duration) {
	secs := retryAfterSeconds(wait)
	if cfg.RetryAfterHTTPDate {
		h.Set("Retry-After", now.Truncate(time.Second).Add(time.Duration(secs)*time.Second).UTC().Format(http.TimeFormat))
		return
	}
	h.Set("Retry-After", strconv.FormatInt(secs, 10))
}

// writeThrottled sends the 429 for a request the quota cannot admit, in the
// dialect's form. A request larger than the tokens capacity (of the minute,
// the window or the Azure sub-window) can never fit: it gets the dialect's
// 429 body without any retry header ("Request too large" in OpenAI's words).
// Otherwise, per dialect:
//
//   - openai, classic: Retry-After (see setRetryAfter) and OpenAI's body
//     {"error":{"message","type","param","code":"rate_limit_exceeded"}}.
//   - anthropic: retry-after and Anthropic's body
//     {"type":"error","error":{"type":"rate_limit_error","message"}}, the
//     message naming the limit exceeded (provider-headers.md: "A 429 names
//     the limit that was exceeded").
//   - azure: retry-after (whole seconds, rounded up), retry-after-ms and
//     x-ms-retry-after-ms (milliseconds, rounded up) and Azure's body
//     {"error":{"code":"429","message":"Requests to the ChatCompletions_Create
//     Operation ... Please retry after N seconds. ..."}}.
//   - ietf, ietf-legacy: Retry-After and an application/problem+json body of
//     the draft's quota-exceeded problem type with violated-policies.
func writeThrottled(w http.ResponseWriter, model string, a admission) {
	requested := a.requested
	cfg, h := a.cfg, w.Header()
	unit := map[string]string{"requests": "RPM", "tokens": "TPM"}[a.dimension]
	if model == "" {
		model = "the model"
	}
	dialect := cfg.dialect()
	if !a.neverFits {
		setRetryAfter(h, cfg, a.q.now, a.wait)
		if dialect == DialectAzure {
			ms := strconv.FormatInt(int64(math.Ceil(float64(a.wait-time.Microsecond)/float64(time.Millisecond))), 10)
			if a.wait <= time.Microsecond {
				ms = "0"
			}
			h.Set("retry-after-ms", ms)
			h.Set("x-ms-retry-after-ms", ms)
			h.Set("Retry-After", strconv.FormatInt(retryAfterSeconds(a.wait), 10))
		}
	}
	switch dialect {
	case DialectAnthropic:
		msg := fmt.Sprintf("This request would exceed your organization's rate limit of %d %s per minute. "+
			"For details, refer to the rate limits documentation.", a.limit, a.dimension)
		if a.neverFits {
			msg = fmt.Sprintf("This request (%d %s) exceeds your organization's rate limit of %d %s per minute "+
				"and can never be served; reduce the prompt or max_tokens.", requested, a.dimension, a.limit, a.dimension)
		}
		writeJSON(w, http.StatusTooManyRequests, anthropicError("rate_limit_error", msg))
	case DialectAzure:
		var e struct {
			Error struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		e.Error.Code = "429"
		e.Error.Message = fmt.Sprintf("Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-10-21 "+
			"have exceeded %s rate limit of your current OpenAI S0 pricing tier. Please retry after %d seconds. "+
			"Please go here: https://aka.ms/oai/quotaincrease if you would like to further increase the default rate limit.",
			strings.TrimSuffix(a.dimension, "s"), retryAfterSeconds(a.wait))
		writeJSON(w, http.StatusTooManyRequests, e)
	case DialectIETF, DialectIETFLegacy:
		policy := a.dimension
		if dialect == DialectIETFLegacy {
			policy = "default"
		}
		b, _ := json.Marshal(map[string]any{
			"type":              "https://iana.org/assignments/http-problem-types#quota-exceeded",
			"title":             "Quota Exceeded",
			"status":            http.StatusTooManyRequests,
			"detail":            fmt.Sprintf("The %s quota of %d per window is used up.", a.dimension, a.limit),
			"violated-policies": []string{policy},
		})
		h.Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write(append(b, '\n'))
	default:
		var msg string
		if a.neverFits {
			msg = fmt.Sprintf("Request too large for %s on tokens per min (TPM): Limit %d, Requested %d. "+
				"The input or output tokens must be reduced in order to run successfully.", model, a.limit, requested)
		} else {
			req := requested
			if a.dimension == "requests" {
				req = 1
			}
			msg = fmt.Sprintf("Rate limit reached for %s on %s per min (%s): Limit %d, Used %d, Requested %d. "+
				"Please try again in %s.", model, a.dimension, unit, a.limit, a.used, req, a.wait.Round(time.Millisecond))
		}
		writeError(w, dialect, http.StatusTooManyRequests, a.dimension, "rate_limit_exceeded", msg)
	}
}

// apiError is OpenAI's error body: {"error":{"message","type","param","code"}}.
type apiError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// anthropicErrorBody is Anthropic's error body:
// {"type":"error","error":{"type","message"}}.
type anthropicErrorBody struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

func anthropicError(typ, msg string) anthropicErrorBody {
	e := anthropicErrorBody{Type: "error"}
	e.Error.Type, e.Error.Message = typ, msg
	return e
}

// writeError writes a non-429 error body: Anthropic's shape in the anthropic
// dialect (type invalid_request_error or not_found_error), OpenAI's in every
// other (the API served is OpenAI's chat completions); code "" is null.
func writeError(w http.ResponseWriter, dialect string, status int, typ, code, msg string) {
	if dialect == DialectAnthropic {
		if status == http.StatusNotFound {
			typ = "not_found_error"
		}
		writeJSON(w, status, anthropicError(typ, msg))
		return
	}
	var e apiError
	e.Error.Message, e.Error.Type = msg, typ
	if code != "" {
		e.Error.Code = &code
	}
	writeJSON(w, status, e)
}
