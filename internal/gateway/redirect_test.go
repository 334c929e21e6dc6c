package gateway

import (
	"net/http"
	"strings"
	"testing"

	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// A provider's redirect is not followed (the gateway calls the transport
// directly, as httputil.ReverseProxy does): an interactive caller gets the
// 3xx with its Location and body and a full refund, a batch job fails with
// the status, and the redirect target is never called, so a redirected
// call is neither sent twice nor sent somewhere the pool does not name.
func TestProviderRedirectIsRelayedNotFollowed(t *testing.T) {
	for _, status := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		target := newUpstream(t, okJSON(10, 5))
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
			w.Header().Set("Location", target.srv.URL+r.URL.Path)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = w.Write([]byte(`{"error":{"message":"moved","type":"invalid_request_error"}}`))
		})
		e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(6000)})})
		before := e.tokensLeft("a")
		req, err := http.NewRequest("POST", e.srv.URL+"/v1/completions", strings.NewReader(completionsBody(10, 20, "")))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer key-a")
		// The caller does not follow it either, so what the gateway
		// answered is what is checked.
		noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := noFollow.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b := readAll(t, resp)
		if resp.StatusCode != status {
			t.Errorf("%d: status %d %s, want %d relayed", status, resp.StatusCode, b, status)
		}
		if got, want := resp.Header.Get("Location"), target.srv.URL+"/v1/completions"; got != want {
			t.Errorf("%d: Location %q, want %q", status, got, want)
		}
		if string(b) != `{"error":{"message":"moved","type":"invalid_request_error"}}` {
			t.Errorf("%d: body %s, want the provider's", status, b)
		}
		if got := e.tokensLeft("a"); got != before {
			t.Errorf("%d: tokens left %d, want %d (full refund)", status, got, before)
		}

		j := e.submit("key-a", jobBody(10, 20, ""))
		var v jobView
		waitFor(t, "the job to finish", func() bool {
			v = e.job("key-a", j.ID)
			return v.Status == jobs.StatusFailed || v.Status == jobs.StatusSucceeded
		})
		if v.Status != jobs.StatusFailed || v.Error == nil || v.Error.Code != jobCodeUpstream {
			t.Errorf("%d: job %s %+v, want failed with %s", status, v.Status, v.Error, jobCodeUpstream)
		}
		if got := up.calls.Load(); got != 2 {
			t.Errorf("%d: %d calls to the provider, want 2 (one each, no retry)", status, got)
		}
		if got := target.calls.Load(); got != 0 {
			t.Errorf("%d: the redirect target was called %d times, want 0", status, got)
		}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A transport's response without a body is read as empty, and a
// transport that returns neither a response nor an error fails the call,
// as http.Client does (Options.Transport may be any RoundTripper).
func TestRoundTripNilBodyAndNilResponse(t *testing.T) {
	req, err := http.NewRequest("POST", "http://127.0.0.1:1/v1/completions", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	g := &Gateway{transport: roundTripFunc(func(*http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusBadGateway, Header: http.Header{}}, nil
	})}
	resp, err := g.roundTrip(req)
	if err != nil || resp.Body != http.NoBody {
		t.Fatalf("nil body: %v, body %v; want http.NoBody", err, resp)
	}
	g.transport = roundTripFunc(func(*http.Request) (*http.Response, error) { return nil, nil })
	if resp, err := g.roundTrip(req); err == nil || resp != nil {
		t.Fatalf("nil response: %v, %v; want an error", resp, err)
	}
}
