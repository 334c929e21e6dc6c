package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/throttle"
)

// codeRequestTooLarge is the code of a request that can never be admitted
// unchanged: above a bucket of the tenant (limiter.ReasonTooLarge) or above
// the provider's token limit of the model (BC-10).
const codeRequestTooLarge = string(limiter.ReasonTooLarge)

// maxRequestTokens bounds max output x n and every token count of a request
// (2^40, the bound of the cost model): a larger request is refused with 413
// request_too_large before any arithmetic can overflow.
const maxRequestTokens int64 = 1 << 40

// maxErrorBody bounds the bytes of an upstream refusal read to classify it.
const maxErrorBody = 64 << 10

// providerTooLargeError is the 413 of a request whose provider tokens
// (prompt + max output) exceed the model's provider token limit: the
// provider would answer "Request too large" however long the client waits
// (BC-10), so it is refused at once, without Retry-After.
func providerTooLargeError(model string, providerTokens, limit int64) *apiError {
	return &apiError{status: http.StatusRequestEntityTooLarge, typ: typeInvalidRequest, code: codeRequestTooLarge, providerLimit: true,
		message: fmt.Sprintf("Request too large for model %q: prompt + max output = %d tokens exceeds the provider's limit of %d tokens per minute, so it can never succeed. Reduce the prompt or max_tokens.",
			model, providerTokens, limit)}
}

// upstreamTooLargeError is the 413 of a request the provider refused as too
// large for its limit (limit 0: not stated).
func upstreamTooLargeError(model string, limit int64) *apiError {
	msg := fmt.Sprintf("Request too large for model %q: the provider refused it as larger than its token limit, so it can never succeed unchanged. Reduce the prompt or max_tokens.", model)
	if limit > 0 {
		msg = fmt.Sprintf("Request too large for model %q: the provider refused it as larger than its limit of %d tokens per minute, so it can never succeed unchanged. Reduce the prompt or max_tokens.", model, limit)
	}
	return &apiError{status: http.StatusRequestEntityTooLarge, typ: typeInvalidRequest, code: codeRequestTooLarge, providerLimit: true, message: msg}
}

var (
	limitRE     = regexp.MustCompile(`(?i)\blimit[:=]?\s*(\d+)`)
	requestedRE = regexp.MustCompile(`(?i)\brequested[:=]?\s*(\d+)`)
)

// firstInt returns the first integer re captures in s, or -1.
func firstInt(re *regexp.Regexp, s string) int64 {
	m := re.FindStringSubmatch(s)
	if m == nil {
		return -1
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// upstreamTooLarge classifies a provider refusal: ok when it says the
// request itself exceeds the provider's limit and can never succeed
// unchanged (BC-10), with the token limit it names (0 unknown: only a
// message naming both a Limit and a larger Requested count is believed). That is an HTTP
// 413, or a 429 whose OpenAI-style error says so: a message starting with
// "Request too large", the code request_too_large, or the type "tokens"
// without Retry-After and a message whose Requested exceeds its Limit
// (OpenAI: "Request too large for gpt-4o on tokens per min (TPM): Limit
// 30000, Requested 45000."). Such a 429 is not a quota exhaustion: it must
// not pause the model for every tenant, nor be retried.
func upstreamTooLarge(status int, q throttle.Quota, body []byte) (limit int64, ok bool) {
	if status != http.StatusRequestEntityTooLarge && status != http.StatusTooManyRequests {
		return 0, false
	}
	var eb struct {
		Error struct {
			Message string          `json:"message"`
			Type    string          `json:"type"`
			Code    json.RawMessage `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(bytes.TrimSpace(body), &eb)
	msg := eb.Error.Message
	var code string
	_ = json.Unmarshal(eb.Error.Code, &code)
	lim, req := firstInt(limitRE, msg), firstInt(requestedRE, msg)
	if lim > 0 && req > lim {
		limit = lim // a token limit the request exceeds, not a body size
	}
	if status == http.StatusRequestEntityTooLarge {
		return limit, true
	}
	switch {
	case strings.HasPrefix(strings.ToLower(strings.TrimSpace(msg)), "request too large"),
		code == codeRequestTooLarge:
		return limit, true
	case eb.Error.Type == "tokens" && !q.HasRetryAfter && lim > 0 && req > lim:
		return limit, true
	}
	return 0, false
}
