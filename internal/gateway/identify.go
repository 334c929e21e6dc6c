package gateway

import (
	"net/http"
	"strings"
	"time"

	"github.com/fairshare-dev/fairshare/internal/registry"
)

// identify maps a request to its tenant (brief "data plane contract"):
//
//   - APIKey mode: `Authorization: Bearer <tenant key>`, looked up by
//     SHA-256 (registry.TenantByKey). A missing or unknown key is 401
//     invalid_api_key; the key is never echoed.
//   - TrustedHeader mode: the tenant id in the pool's header, set by an
//     authenticating gateway in front of the scheduler. A missing or unknown
//     id is 401 unknown_tenant.
//
// Before a pool policy is loaded every request is 503 not_ready.
func (g *Gateway) identify(r *http.Request) (*registry.Tenant, *registry.PoolPolicy, *apiError) {
	pool := g.reg.Pool()
	if pool == nil {
		return nil, nil, &apiError{status: http.StatusServiceUnavailable, typ: typeAPI, code: codeNotReady,
			message: "The scheduler has not loaded its pool yet.", retryable: true}
	}
	if pool.IdentMode == registry.IdentifyTrustedHeader {
		id := strings.TrimSpace(r.Header.Get(pool.IdentHeader))
		if id == "" {
			return nil, pool, &apiError{status: http.StatusUnauthorized, typ: typeAuthentication, code: codeUnknownTenant,
				message: "Missing tenant header " + pool.IdentHeader + "."}
		}
		t := g.reg.Tenant(id)
		if t == nil {
			return nil, pool, &apiError{status: http.StatusUnauthorized, typ: typeAuthentication, code: codeUnknownTenant,
				message: "Unknown tenant."}
		}
		return t, pool, nil
	}
	key, ok := bearer(r.Header.Get("Authorization"))
	var t *registry.Tenant
	if ok {
		t = g.reg.TenantByKey(key)
	}
	if t == nil {
		return nil, pool, &apiError{status: http.StatusUnauthorized, typ: typeAuthentication, code: codeInvalidAPIKey,
			message: "Incorrect or missing API key."}
	}
	return t, pool, nil
}

// identifyAndRead identifies the tenant of r and reads its body (at most
// the gateway's body limit, within its body read timeout: a read deadline
// set for the body, cleared once it is read so that it cannot cancel a
// response that streams longer, kept when the body is refused); on failure
// it writes the refusal and reports ok false.
func (g *Gateway) identifyAndRead(w http.ResponseWriter, r *http.Request) (t *registry.Tenant, pool *registry.PoolPolicy, body []byte, ok bool) {
	t, pool, aerr := g.identify(r)
	if aerr != nil {
		g.refuse(w, nil, aerr)
		return nil, nil, nil, false
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(g.bodyRead)) // ignored without a connection (tests)
	body, aerr = readBody(r, g.maxBody)
	if aerr != nil {
		// The deadline stays: net/http drains up to 256 KiB of an unread
		// body after the handler, and must not wait on a silent client.
		g.refuse(w, t, aerr)
		return nil, nil, nil, false
	}
	_ = rc.SetReadDeadline(time.Time{})
	return t, pool, body, true
}

// bearer extracts the token of an `Authorization: Bearer <token>` value.
func bearer(v string) (string, bool) {
	const prefix = "bearer "
	if len(v) <= len(prefix) || !strings.EqualFold(v[:len(prefix)], prefix) {
		return "", false
	}
	tok := strings.TrimSpace(v[len(prefix):])
	return tok, tok != ""
}
