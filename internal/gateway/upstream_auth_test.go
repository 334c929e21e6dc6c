package gateway

import (
	"bytes"
	"net/http"
	"testing"

	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// A provider that refuses the pool's key quotes it back (OpenAI: "Incorrect
// API key provided: sk-..."). The tenant must never receive the provider key:
// an interactive call gets the gateway's own 502 upstream_authentication_failed
// with a full refund, a job fails with that code and no stored response, and
// any other provider error body passed on has the key redacted (issue 7,
// "the provider key never appears in any response").
func TestProviderKeyNeverReachesTenants(t *testing.T) {
	const key = "sk-provider-secret"
	for _, status := range []int{http.StatusUnauthorized, http.StatusForbidden, http.StatusBadRequest} {
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = w.Write([]byte(`{"error":{"message":"Incorrect API key provided: ` + key + `.","type":"invalid_request_error","code":"invalid_api_key"}}`))
		})
		e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(6000)})})
		before := e.tokensLeft("a")
		resp := e.do("POST", "/v1/completions", "key-a", completionsBody(10, 20, ""))
		b := readAll(t, resp)
		if bytes.Contains(b, []byte(key)) {
			t.Errorf("%d: the response quotes the provider key: %s", status, b)
		}
		wantStatus := status
		if isAuthRefusal(status) {
			wantStatus = http.StatusBadGateway
			if !bytes.Contains(b, []byte(`"code":"upstream_authentication_failed"`)) {
				t.Errorf("%d: body %s, want code upstream_authentication_failed", status, b)
			}
		} else if !bytes.Contains(b, []byte("[REDACTED]")) {
			t.Errorf("%d: body %s, want the key redacted", status, b)
		}
		if resp.StatusCode != wantStatus {
			t.Errorf("%d: status %d, want %d", status, resp.StatusCode, wantStatus)
		}
		if got := e.tokensLeft("a"); got != before {
			t.Errorf("%d: tokens left %d after the refusal, want %d (full refund)", status, got, before)
		}

		j := e.submit("key-a", jobBody(10, 20, ""))
		var v jobView
		waitFor(t, "the job to finish", func() bool {
			v = e.job("key-a", j.ID)
			return v.Status == jobs.StatusFailed
		})
		if bytes.Contains(v.Response, []byte(key)) || (v.Error != nil && bytes.Contains([]byte(v.Error.Message), []byte(key))) {
			t.Errorf("%d: the job record quotes the provider key: %+v %s", status, v.Error, v.Response)
		}
		if isAuthRefusal(status) && (v.Error == nil || v.Error.Code != codeUpstreamAuthentication || (len(v.Response) != 0 && string(v.Response) != "null")) {
			t.Errorf("%d: job error %+v response %s, want %s and no response", status, v.Error, v.Response, codeUpstreamAuthentication)
		}
	}
}
