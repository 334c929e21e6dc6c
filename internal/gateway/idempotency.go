package gateway

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fairshare-dev/fairshare/internal/jobs"
)

// Idempotent submission (docs/api.md "Idempotent submission"), after the
// IETF draft "The Idempotency-Key HTTP Header Field"
// (draft-ietf-httpapi-idempotency-key-header, current revision -09): a
// retried submission with the key and the request of a job the store still
// holds creates no second job. The field's syntax (a Structured Field
// String, one field per request), 422 for a key reused with another request
// and 409 for a request while the first is processed are the draft's; the
// fingerprint, the key's lifetime (its job's) and the replayed answer are
// left to the server by the draft and documented in docs/api.md.

// headerIdempotencyKey is the request field of POST /v1/jobs that carries
// the key; headerIdempotentReplayed ("true") marks an answer that replays
// the job an earlier request with the same key created (Stripe's name).
const (
	headerIdempotencyKey     = "Idempotency-Key"
	headerIdempotentReplayed = "Idempotent-Replayed"
)

// maxIdempotencyKeyLen bounds a key: 255 characters.
const maxIdempotencyKeyLen = 255

// Error codes of idempotent submission.
const (
	// codeInvalidIdempotencyKey: the Idempotency-Key field (or a bulk
	// line's idempotencyKey) is malformed, repeated, or given where it
	// does not apply (400).
	codeInvalidIdempotencyKey = "invalid_idempotency_key"
	// codeIdempotencyKeyReused: the key is held by a job of the tenant
	// submitted with a different request (422, the draft's "Idempotency
	// Key is already used").
	codeIdempotencyKeyReused = "idempotency_key_reused"
	// codeIdempotencyKeyInUse: a submission with the same key is being
	// processed right now (409, the draft's concurrent request); retry.
	codeIdempotencyKeyInUse = "idempotency_key_in_use"
)

// badIdempotencyKey is the 400 invalid_idempotency_key refusal with
// message msg; param names the field at fault.
func badIdempotencyKey(param, msg string) *apiError {
	return badParam(codeInvalidIdempotencyKey, param, msg)
}

// parseIdempotencyKeyHeader returns the key of the request's
// Idempotency-Key field: "" when the request has none, or a 400
// invalid_idempotency_key. The draft makes the field a Structured Field
// String (RFC 9651 section 3.3.3: a double-quoted string of printable
// ASCII where only \" and \\ are escapes), and one field per request.
// Parameters after the string are refused. For clients that send it bare
// (Stripe's and OpenAI's SDK users), an unquoted value of visible ASCII
// without '"', '\' or ',' is read as the key itself: abc and "abc" are
// the same key. The key is 1 to maxIdempotencyKeyLen characters.
func parseIdempotencyKeyHeader(h http.Header) (string, *apiError) {
	vals := h.Values(headerIdempotencyKey)
	if len(vals) == 0 {
		return "", nil
	}
	if len(vals) > 1 {
		return "", badIdempotencyKey(headerIdempotencyKey, "Send one Idempotency-Key field, not several.")
	}
	v := strings.Trim(vals[0], " \t")
	var key string
	if strings.HasPrefix(v, `"`) {
		var b strings.Builder
		i := 1
		closed := false
		for ; i < len(v); i++ {
			c := v[i]
			switch {
			case c == '\\':
				if i+1 >= len(v) || (v[i+1] != '"' && v[i+1] != '\\') {
					return "", badIdempotencyKey(headerIdempotencyKey, `The Idempotency-Key string has an escape other than \" or \\.`)
				}
				i++
				b.WriteByte(v[i])
			case c == '"':
				closed = true
			case c < 0x20 || c > 0x7e:
				return "", badIdempotencyKey(headerIdempotencyKey, "The Idempotency-Key holds a character that is not printable ASCII.")
			default:
				b.WriteByte(c)
			}
			if closed {
				break
			}
		}
		if !closed {
			return "", badIdempotencyKey(headerIdempotencyKey, "The Idempotency-Key string has no closing quote.")
		}
		if i+1 != len(v) {
			return "", badIdempotencyKey(headerIdempotencyKey, "The Idempotency-Key must be one string, with nothing after it (no parameters).")
		}
		key = b.String()
	} else {
		for i := 0; i < len(v); i++ {
			if c := v[i]; c <= 0x20 || c > 0x7e || c == '"' || c == '\\' || c == ',' {
				return "", badIdempotencyKey(headerIdempotencyKey, `An unquoted Idempotency-Key is visible ASCII without spaces, '"', '\' or ','; send it as a quoted string ("...").`)
			}
		}
		key = v
	}
	if aerr := checkIdempotencyKey(headerIdempotencyKey, key); aerr != nil {
		return "", aerr
	}
	return key, nil
}

// checkIdempotencyKey refuses a key that is empty, longer than
// maxIdempotencyKeyLen or holds a character outside printable ASCII
// (0x20-0x7E), naming param.
func checkIdempotencyKey(param, key string) *apiError {
	if key == "" || len(key) > maxIdempotencyKeyLen {
		return badIdempotencyKey(param, "The idempotency key must be 1 to "+strconv.Itoa(maxIdempotencyKeyLen)+" characters.")
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return badIdempotencyKey(param, "The idempotency key holds a character that is not printable ASCII.")
		}
	}
	return nil
}

// submitFingerprint is the hex SHA-256 of what defines a submitted job,
// compared between requests under one key: the endpoint (the default one
// when omitted), the body, the deadlineSeconds, the metadata and the
// webhookURL, each length-prefixed. The body and the metadata count as
// their compacted JSON (whitespace between tokens does not count, member
// order does); a null or omitted metadata counts as none. Other members of
// the submission, and the way it was sent (POST /v1/jobs or a bulk line),
// do not count.
func submitFingerprint(sr submitRequest) string {
	h := sha256.New()
	put := func(b []byte) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	compact := func(raw json.RawMessage) []byte {
		if t := bytes.TrimSpace(raw); len(t) == 0 || bytes.Equal(t, []byte("null")) {
			return nil
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, raw); err != nil {
			return raw
		}
		return buf.Bytes()
	}
	ep := sr.Endpoint
	if ep == "" {
		ep = endpointChat
	}
	put([]byte(ep))
	put(compact(sr.Body))
	if sr.DeadlineSeconds != nil {
		put([]byte(strconv.FormatFloat(*sr.DeadlineSeconds, 'g', -1, 64)))
	} else {
		put(nil)
	}
	put(compact(sr.Metadata))
	put([]byte(sr.WebhookURL))
	return hex.EncodeToString(h.Sum(nil))
}

// inFlight are the (tenant, key) pairs of the keyed submissions being
// processed by this gateway, between the lookup of their key and their
// answer; a second submission with a pair held meanwhile is answered 409
// idempotency_key_in_use (the draft's concurrent request) rather than
// waiting. The job store's Create is the guard across processes.
type inFlight struct {
	mu   sync.Mutex
	keys map[[2]string]struct{}
}

// acquire marks (tenant, key) in flight; false when it already was.
func (f *inFlight) acquire(tenant, key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := [2]string{tenant, key}
	if _, held := f.keys[k]; held {
		return false
	}
	if f.keys == nil {
		f.keys = map[[2]string]struct{}{}
	}
	f.keys[k] = struct{}{}
	return true
}

// release ends what acquire began.
func (f *inFlight) release(tenant, key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.keys, [2]string{tenant, key})
}

// keyInUseError is the 409 idempotency_key_in_use refusal: Retry-After 1 s.
func keyInUseError() *apiError {
	return &apiError{status: http.StatusConflict, typ: typeInvalidRequest, code: codeIdempotencyKeyInUse,
		retryAfter: time.Second, retryable: true,
		message: "A submission with the same Idempotency-Key is being processed. Retry in 1s."}
}

// keyReusedError is the 422 idempotency_key_reused refusal.
func keyReusedError(param string) *apiError {
	return &apiError{status: http.StatusUnprocessableEntity, typ: typeInvalidRequest, code: codeIdempotencyKeyReused, param: param,
		message: "The idempotency key was used for a different job of this tenant; use a new key for a new job."}
}

// replayOf answers a submission under a key the tenant's job j holds: the
// job when fp is the fingerprint it was submitted with, else 422
// idempotency_key_reused.
func replayOf(j jobs.Job, fp, param string) (jobs.Job, *apiError) {
	if j.IdempotencyFingerprint != fp {
		return jobs.Job{}, keyReusedError(param)
	}
	return j, nil
}
