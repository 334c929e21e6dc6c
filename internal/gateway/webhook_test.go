package gateway

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// hookServer is a webhook endpoint on 127.0.0.1 answering the statuses in
// turn (the last one repeated) and recording each delivery.
type hookServer struct {
	srv      *httptest.Server
	mu       sync.Mutex
	statuses []int
	got      []hookCall
}

type hookCall struct {
	jobID, attempt, contentType string
	view                        jobView
}

func newHookServer(t *testing.T, statuses ...int) *hookServer {
	t.Helper()
	h := &hookServer{statuses: statuses}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var v jobView
		_ = json.Unmarshal(b, &v)
		h.mu.Lock()
		h.got = append(h.got, hookCall{jobID: r.Header.Get(webhookJobHeader), attempt: r.Header.Get(webhookAttemptHeader),
			contentType: r.Header.Get("Content-Type"), view: v})
		st := h.statuses[min(len(h.got), len(h.statuses))-1]
		h.mu.Unlock()
		w.WriteHeader(st)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *hookServer) calls() []hookCall {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]hookCall(nil), h.got...)
}

// stopWebhooks stops the gateway's notifier, if it was ever created.
func stopWebhooks(g *Gateway) { g.hooks.stop() }

func newHookEnv(t *testing.T) *env {
	t.Helper()
	up := newUpstream(t, okJSON(10, 20))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
	t.Cleanup(func() { stopWebhooks(e.gw) })
	return e
}

func (e *env) webhookState(id string) (string, int) {
	j, err := e.store.Get(id)
	if err != nil {
		return "", -1
	}
	return j.WebhookStatus, j.WebhookAttempts
}

// waitWebhook waits until the job's webhook reached state.
func waitWebhook(t *testing.T, e *env, id, state string) int {
	t.Helper()
	waitFor(t, "webhook "+state, func() bool { s, _ := e.webhookState(id); return s == state })
	_, n := e.webhookState(id)
	return n
}

// TestWebhookDeliveredOnce: a succeeded job's view is POSTed once, with
// its id header; the job records the delivery.
func TestWebhookDeliveredOnce(t *testing.T) {
	e := newHookEnv(t)
	h := newHookServer(t, 204)
	j := e.submit("key-a", jobBody(10, 100, `,"webhookURL":"`+h.srv.URL+`/done?x=1"`))
	if j.WebhookURL == nil || *j.WebhookURL != h.srv.URL+"/done?x=1" || j.WebhookStatus == nil || *j.WebhookStatus != webhookPending {
		t.Fatalf("submitted webhook_url %v status %v", j.WebhookURL, j.WebhookStatus)
	}
	if n := waitWebhook(t, e, j.ID, webhookDelivered); n != 1 {
		t.Errorf("attempts = %d, want 1", n)
	}
	calls := h.calls()
	if len(calls) != 1 {
		t.Fatalf("deliveries = %d, want 1", len(calls))
	}
	c := calls[0]
	if c.jobID != j.ID || c.attempt != "1" || c.contentType != "application/json" ||
		c.view.ID != j.ID || c.view.Status != jobs.StatusSucceeded || c.view.Usage == nil || c.view.Usage.CompletionTokens != 20 {
		t.Errorf("delivery %+v", c)
	}
	if got := e.gw.webhooks().counts(); !cmp.Equal(got, map[string]int{webhookOutcomeDelivered: 1}) {
		t.Errorf("outcomes %v", got)
	}
	if v := e.job("key-a", j.ID); v.WebhookStatus == nil || *v.WebhookStatus != webhookDelivered || v.WebhookAttempts != 1 {
		t.Errorf("job view webhook %v %d", v.WebhookStatus, v.WebhookAttempts)
	}
}

// stepBackoff waits for the k-th backoff timer (1-based) to start, then
// moves the fake clock by d (the backoff with jitter 0: half the
// exponential step).
func stepBackoff(t *testing.T, e *env, k int64, d time.Duration) {
	t.Helper()
	n := e.gw.webhooks()
	waitFor(t, "backoff "+strconv.FormatInt(k, 10), func() bool { return n.backoffs.Load() == k })
	e.clock.Step(d)
}

// TestWebhookRetriedOn500ThenDelivered: 500, 500, then 200: three
// attempts after 0.5 s and 1 s (base 1 s doubling, jitter 0 => d/2).
func TestWebhookRetriedOn500ThenDelivered(t *testing.T) {
	e := newHookEnv(t)
	h := newHookServer(t, 500, 500, 200)
	j := e.submit("key-a", jobBody(10, 100, `,"webhookURL":"`+h.srv.URL+`"`))
	stepBackoff(t, e, 1, 500*time.Millisecond)
	stepBackoff(t, e, 2, time.Second)
	if n := waitWebhook(t, e, j.ID, webhookDelivered); n != 3 {
		t.Errorf("attempts = %d, want 3", n)
	}
	var attempts []string
	for _, c := range h.calls() {
		attempts = append(attempts, c.attempt)
	}
	if d := cmp.Diff([]string{"1", "2", "3"}, attempts); d != "" {
		t.Errorf("attempt headers (-want +got):\n%s", d)
	}
	if got := e.gw.webhooks().counts(); !cmp.Equal(got, map[string]int{webhookOutcomeRetried: 2, webhookOutcomeDelivered: 1}) {
		t.Errorf("outcomes %v", got)
	}
}

// TestWebhookGivesUpAfterMaxAttempts: a 503 every time: five attempts
// (backoffs 0.5, 1, 2, 4 s), then failed, no sixth.
func TestWebhookGivesUpAfterMaxAttempts(t *testing.T) {
	e := newHookEnv(t)
	h := newHookServer(t, 503)
	j := e.submit("key-a", jobBody(10, 100, `,"webhookURL":"`+h.srv.URL+`"`))
	for i := range webhookMaxAttempts - 1 {
		stepBackoff(t, e, int64(i+1), (500*time.Millisecond)<<i)
	}
	if n := waitWebhook(t, e, j.ID, webhookFailed); n != webhookMaxAttempts {
		t.Errorf("attempts = %d, want %d", n, webhookMaxAttempts)
	}
	if n := len(h.calls()); n != webhookMaxAttempts {
		t.Errorf("deliveries = %d, want %d", n, webhookMaxAttempts)
	}
	if got := e.gw.webhooks().counts(); !cmp.Equal(got, map[string]int{webhookOutcomeRetried: 4, webhookOutcomeFailed: 1}) {
		t.Errorf("outcomes %v", got)
	}
}

// TestWebhookPermanentRefusalNotRetried: a 400 (or a redirect) is final.
func TestWebhookPermanentRefusalNotRetried(t *testing.T) {
	for _, st := range []int{400, 302} {
		t.Run(strconv.Itoa(st), func(t *testing.T) {
			e := newHookEnv(t)
			h := newHookServer(t, st, 200)
			j := e.submit("key-a", jobBody(10, 100, `,"webhookURL":"`+h.srv.URL+`"`))
			if n := waitWebhook(t, e, j.ID, webhookFailed); n != 1 || len(h.calls()) != 1 {
				t.Errorf("attempts %d deliveries %d, want 1 1", n, len(h.calls()))
			}
		})
	}
}

// TestWebhookRefusedAddressNotRetried: a webhook URL whose address the
// dialer refuses (here the unspecified 0.0.0.0, refused before any
// connection is attempted) fails at its first attempt instead of being
// retried with backoff.
func TestWebhookRefusedAddressNotRetried(t *testing.T) {
	e := newHookEnv(t)
	j := e.submit("key-a", jobBody(10, 100, `,"webhookURL":"http://0.0.0.0:9/hook"`))
	if n := waitWebhook(t, e, j.ID, webhookFailed); n != 1 {
		t.Errorf("attempts = %d, want 1", n)
	}
	if got := e.gw.webhooks().counts(); !cmp.Equal(got, map[string]int{webhookOutcomeFailed: 1}) {
		t.Errorf("outcomes %v, want one failed", got)
	}
}

// TestWebhookRefusedAddressThroughProxy: with an HTTP proxy the dialer
// sees only the proxy's address, so a literal link-local address in the
// webhook URL is refused before the request is sent: the proxy receives
// nothing and the delivery fails at its first attempt.
func TestWebhookRefusedAddressThroughProxy(t *testing.T) {
	e := newHookEnv(t)
	proxy := newHookServer(t, 200)
	u, err := url.Parse(proxy.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	e.gw.webhooks().client.Transport.(*http.Transport).Proxy = http.ProxyURL(u)
	j := e.submit("key-a", jobBody(10, 100, `,"webhookURL":"http://169.254.169.254/latest/meta-data/"`))
	if n := waitWebhook(t, e, j.ID, webhookFailed); n != 1 {
		t.Errorf("attempts = %d, want 1", n)
	}
	if calls := proxy.calls(); len(calls) != 0 {
		t.Errorf("the proxy received %d requests, want none", len(calls))
	}
	// The same proxy does carry an allowed target.
	ok := e.submit("key-a", jobBody(10, 100, `,"webhookURL":"http://127.0.0.1:9/hook"`))
	waitWebhook(t, e, ok.ID, webhookDelivered)
	if calls := proxy.calls(); len(calls) != 1 || calls[0].jobID != ok.ID {
		t.Errorf("proxy calls %+v, want one for %s", calls, ok.ID)
	}
}

// TestWebhookOnlyForJobsThatAskForIt: a cancelled job without webhookURL
// is not notified (and creates no notifier); a cancelled job with one is,
// with status cancelled.
func TestWebhookOnlyForJobsThatAskForIt(t *testing.T) {
	e := newHookEnv(t)
	e.pause(time.Minute)
	h := newHookServer(t, 200)
	dequeued := e.trackDequeued()
	plain := e.submit("key-a", jobBody(10, 100, ""))
	if plain.WebhookURL != nil || plain.WebhookStatus != nil {
		t.Errorf("webhook fields of a plain job: %v %v", plain.WebhookURL, plain.WebhookStatus)
	}
	e.waitPutBack(t, dequeued, plain.ID)
	if resp := e.do("DELETE", "/v1/jobs/"+plain.ID, "key-a", ""); resp.StatusCode != 200 {
		t.Fatalf("cancel: %d", resp.StatusCode)
	}
	if got := e.gw.hooks.counts(); len(got) != 0 {
		t.Errorf("deliveries %v for jobs without webhookURL", got)
	}
	hooked := e.submit("key-a", jobBody(10, 100, `,"webhookURL":"`+h.srv.URL+`"`))
	if resp := e.do("DELETE", "/v1/jobs/"+hooked.ID, "key-a", ""); resp.StatusCode != 200 {
		t.Fatalf("cancel: %d", resp.StatusCode)
	}
	waitWebhook(t, e, hooked.ID, webhookDelivered)
	calls := h.calls()
	if len(calls) != 1 || calls[0].jobID != hooked.ID || calls[0].view.Status != jobs.StatusCancelled {
		t.Errorf("deliveries %+v, want one for %s (cancelled)", calls, hooked.ID)
	}
}

// TestWebhookURLValidated: only absolute http(s) URLs without user info.
func TestWebhookURLValidated(t *testing.T) {
	e := newHookEnv(t)
	for _, u := range []string{"ftp://example.com/x", "/relative", "http://", "https://user:pw@example.com/", "mailto:a@b.c", `1`} {
		extra := `,"webhookURL":"` + u + `"`
		if u == "1" {
			extra = `,"webhookURL":1`
		}
		resp := e.do("POST", "/v1/jobs", "key-a", jobBody(10, 100, extra))
		if body := decode[errorBody](t, resp); resp.StatusCode != 400 || body.Error.Code != codeInvalidRequest {
			t.Errorf("%s: %d %+v, want 400 invalid_request", u, resp.StatusCode, body.Error)
		}
	}
	if msg := validWebhookURL("https://hooks.example.com:8443/a?b=c"); msg != "" {
		t.Errorf("valid URL refused: %s", msg)
	}
}

// TestWebhookDialRefusesLinkLocal: the cloud metadata addresses are
// refused at connect time: link-local ones by range, and AWS's IPv6,
// Alibaba's and Oracle's legacy endpoints, which are not link-local, by
// address (they were once allowed).
func TestWebhookDialRefusesLinkLocal(t *testing.T) {
	for addr, ok := range map[string]bool{"169.254.169.254:80": false, "[::ffff:169.254.169.254]:80": false, "[fe80::1]:80": false,
		"0.0.0.0:80": false, "[fd00:ec2::254]:80": false, "100.100.100.200:80": false, "192.0.0.192:80": false,
		"127.0.0.1:80": true, "10.0.0.1:443": true, "100.100.100.201:80": true, "[fd00:ec2::253]:80": true} {
		if err := webhookDialControl("tcp", addr, nil); (err == nil) != ok || (err != nil && !errors.Is(err, errWebhookAddress)) {
			t.Errorf("%s: err %v, want allowed=%v", addr, err, ok)
		}
	}
}

// TestQueueWaitHeader: GET of a started job carries X-Queue-Wait-Ms equal
// to queue_wait_ms; a job not started yet has neither.
func TestQueueWaitHeader(t *testing.T) {
	e := newHookEnv(t)
	e.pause(30 * time.Second)
	j := e.submit("key-a", jobBody(10, 100, ""))
	resp := e.do("GET", "/v1/jobs/"+j.ID, "key-a", "")
	if v := decode[jobView](t, resp); resp.Header.Get("X-Queue-Wait-Ms") != "" || v.QueueWaitMS != nil {
		t.Errorf("queued job: header %q queue_wait_ms %v", resp.Header.Get("X-Queue-Wait-Ms"), v.QueueWaitMS)
	}
	e.clock.Step(31 * time.Second)
	waitFor(t, "the job to succeed", func() bool { return e.storeStatus(j.ID) == jobs.StatusSucceeded })
	resp = e.do("GET", "/v1/jobs/"+j.ID, "key-a", "")
	if v := decode[jobView](t, resp); resp.Header.Get("X-Queue-Wait-Ms") != "31000" || v.QueueWaitMS == nil || *v.QueueWaitMS != 31000 {
		t.Errorf("started job: header %q queue_wait_ms %v, want 31000", resp.Header.Get("X-Queue-Wait-Ms"), v.QueueWaitMS)
	}
}

// TestWebhookPanicFailsDelivery: a panic while a completion webhook is
// sent (here in the HTTP transport) fails that delivery, once, with one
// attempt recorded and counted as failed, and the scheduler goes on: the
// next job with a webhook is delivered. Before, the delivery goroutine had
// no recovery and the panic ended the process.
func TestWebhookPanicFailsDelivery(t *testing.T) {
	e := newHookEnv(t)
	h := newHookServer(t, 200)
	n := e.gw.webhooks()
	healthy := n.client.Transport
	var panics atomic.Int32
	n.client.Transport = roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if panics.Add(1) == 1 {
			panic("transport fault")
		}
		return healthy.RoundTrip(r)
	})
	j := e.submit("key-a", jobBody(10, 100, `,"webhookURL":"`+h.srv.URL+`"`))
	if n := waitWebhook(t, e, j.ID, webhookFailed); n != 1 {
		t.Errorf("attempts = %d, want 1", n)
	}
	if got := n.counts(); !cmp.Equal(got, map[string]int{webhookOutcomeFailed: 1}) {
		t.Errorf("outcomes %v, want one failed", got)
	}
	if v := e.job("key-a", j.ID); v.Status != jobs.StatusSucceeded {
		t.Errorf("job status %s, want succeeded (the webhook's failure is not the job's)", v.Status)
	}
	next := e.submit("key-a", jobBody(10, 100, `,"webhookURL":"`+h.srv.URL+`"`))
	waitWebhook(t, e, next.ID, webhookDelivered)
	if calls := h.calls(); len(calls) != 1 || calls[0].jobID != next.ID {
		t.Errorf("deliveries %+v, want one for %s", calls, next.ID)
	}
	if p := panics.Load(); p != 2 {
		t.Errorf("transport calls %d, want 2", p)
	}
}
