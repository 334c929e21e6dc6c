package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/fairshare-dev/fairshare/internal/jobs"
)

// Completion webhook delivery, with retries (docs/api.md "Batch jobs").
const (
	// webhookMaxAttempts bounds delivery attempts per job.
	webhookMaxAttempts = 5
	// webhookRetryBase and webhookRetryCap bound the backoff between
	// attempts: base * 2^(attempt-1), capped, then jittered into [d/2, d]
	// (so 0.5-1 s, 1-2 s, 2-4 s, 4-8 s with the defaults; never over 60 s).
	webhookRetryBase = time.Second
	webhookRetryCap  = time.Minute
	// webhookTimeout bounds one delivery attempt (connect to last byte).
	webhookTimeout = 10 * time.Second
	// webhookConcurrency bounds webhook POSTs in flight per gateway.
	webhookConcurrency = 16
	// webhookMaxPending bounds deliveries in progress (in flight or waiting
	// for a backoff) per gateway; a finished job beyond it is not notified
	// (webhook_status "failed", counted as dropped) rather than let
	// goroutines grow without bound.
	webhookMaxPending = 1024
	// webhookMaxURLLen bounds the length of a webhookURL, in bytes.
	webhookMaxURLLen = 2048
	// webhookJobHeader names the job in every delivery. Deliveries of a
	// tenant with a signing secret are also signed (Standard Webhooks
	// headers, see signWebhook).
	webhookJobHeader = "X-Fairshare-Job-Id"
	// webhookAttemptHeader is the 1-based attempt number of a delivery.
	webhookAttemptHeader = "X-Fairshare-Delivery-Attempt"
)

// Webhook delivery states (jobs.Job.WebhookStatus) and outcomes.
const (
	webhookPending   = jobs.WebhookPending
	webhookDelivered = "delivered"
	webhookFailed    = "failed"

	// Outcomes counted per attempt or delivery (webhookNotifier.count):
	// delivered (2xx), retried (an attempt failed, another follows),
	// failed (attempts exhausted or a permanent refusal), dropped (more
	// than webhookMaxPending deliveries in progress).
	webhookOutcomeDelivered = "delivered"
	webhookOutcomeRetried   = "retried"
	webhookOutcomeFailed    = "failed"
	webhookOutcomeDropped   = "dropped"
)

// validWebhookURL returns "" when s is acceptable as a webhookURL, else the
// refusal message: an absolute http or https URL with a host, without
// user info, at most webhookMaxURLLen bytes.
func validWebhookURL(s string) string {
	const msg = "\"webhookURL\" must be an absolute http or https URL of at most 2048 bytes, without user info."
	if len(s) > webhookMaxURLLen {
		return msg
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || u.User != nil || u.Opaque != "" {
		return msg
	}
	return ""
}

// webhookNotifier delivers completion webhooks of one gateway. Deliveries
// run in their own goroutines (at most webhookMaxPending, webhookConcurrency
// POSTs at once), so the dispatcher never waits for a tenant's endpoint.
type webhookNotifier struct {
	g      *Gateway
	client *http.Client
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	posts  chan struct{} // POSTs in flight
	slots  chan struct{} // deliveries in progress

	// backoffs counts backoff timers started, incremented once the timer
	// exists (tests step a fake clock after it).
	backoffs atomic.Int64
	// outcomes counts deliveries by outcome (tests; the metric is
	// fairshare_..._webhook_deliveries_total{outcome}).
	mu       sync.Mutex
	outcomes map[string]int
}

// webhooks returns g's notifier (created by New, stopped when Run returns).
func (g *Gateway) webhooks() *webhookNotifier { return g.hooks }

func newWebhookNotifier(g *Gateway) *webhookNotifier {
	ctx, cancel := context.WithCancel(context.Background())
	dialer := &net.Dialer{Timeout: webhookTimeout, KeepAlive: 30 * time.Second, Control: webhookDialControl}
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           dialer.DialContext,
		MaxIdleConns:          webhookConcurrency,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   webhookTimeout,
		ResponseHeaderTimeout: webhookTimeout,
	}
	return &webhookNotifier{
		g: g, ctx: ctx, cancel: cancel,
		client: &http.Client{Transport: tr, Timeout: webhookTimeout,
			// Redirects are not followed: a 3xx is a refusal.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		posts:    make(chan struct{}, webhookConcurrency),
		slots:    make(chan struct{}, webhookMaxPending),
		outcomes: map[string]int{},
	}
}

// webhookDialControl refuses connections to link-local addresses (cloud
// metadata endpoints such as 169.254.169.254, fe80::/10), the other cloud
// metadata endpoints (metadataIPs), unspecified and multicast addresses
// with errWebhookAddress; it runs after name
// resolution, so a name resolving there is refused too.
func webhookDialControl(_, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(host); ip == nil || refusedWebhookIP(ip) {
		return fmt.Errorf("%w: %s", errWebhookAddress, host)
	}
	return nil
}

// metadataIPs are cloud instance-metadata endpoints outside the link-local
// ranges: AWS's IPv6 endpoint (Nitro instances), Alibaba Cloud's, and
// Oracle Cloud's legacy one. Webhooks are refused there as at
// 169.254.169.254 (link-local, refused by range).
var metadataIPs = []net.IP{
	net.ParseIP("fd00:ec2::254"),
	net.ParseIP("100.100.100.200"),
	net.ParseIP("192.0.0.192"),
}

// refusedWebhookIP reports whether ip is an address webhooks are never
// sent to: link-local (cloud metadata endpoints among them), a cloud
// metadata endpoint outside the link-local ranges (metadataIPs),
// unspecified or multicast.
func refusedWebhookIP(ip net.IP) bool {
	if ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsUnspecified() || ip.IsMulticast() ||
		ip.IsInterfaceLocalMulticast() {
		return true
	}
	for _, m := range metadataIPs {
		if ip.Equal(m) {
			return true
		}
	}
	return false
}

// stop cancels deliveries in progress (their jobs stay "pending") and
// waits for their goroutines.
func (n *webhookNotifier) stop() {
	n.cancel()
	n.wg.Wait()
}

func (n *webhookNotifier) count(outcome string) {
	n.mu.Lock()
	n.outcomes[outcome]++
	n.mu.Unlock()
	n.g.metrics.WebhookDeliveries.WithLabelValues(outcome).Inc()
}

// counts returns the outcome counts so far.
func (n *webhookNotifier) counts() map[string]int {
	n.mu.Lock()
	defer n.mu.Unlock()
	m := make(map[string]int, len(n.outcomes))
	for k, v := range n.outcomes {
		m[k] = v
	}
	return m
}

// notifyWebhook starts the completion webhook of a job that has just
// reached a terminal status; a job without webhookURL is ignored. It never
// blocks.
func (g *Gateway) notifyWebhook(j jobs.Job) {
	if j.WebhookURL == "" || !j.Status.Finished() {
		return
	}
	g.webhooks().enqueue(j)
}

func (n *webhookNotifier) enqueue(j jobs.Job) {
	if n.ctx.Err() != nil {
		return
	}
	select {
	case n.slots <- struct{}{}:
	default:
		n.count(webhookOutcomeDropped)
		n.setState(j.ID, webhookFailed, false)
		n.g.log.Info("completion webhook dropped: too many deliveries in progress", "job", j.ID, "max", webhookMaxPending)
		return
	}
	n.setState(j.ID, webhookPending, false)
	j.WebhookStatus = webhookPending
	body, err := json.Marshal(viewOf(j))
	if err != nil {
		<-n.slots
		n.count(webhookOutcomeFailed)
		n.setState(j.ID, webhookFailed, false)
		return
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		defer func() { <-n.slots }()
		attempts := j.WebhookAttempts // of earlier schedulers, then of this delivery
		defer n.recoverDeliver(j.ID, &attempts)
		n.deliver(j.ID, j.Tenant, j.WebhookURL, body, &attempts)
	}()
}

// recoverDeliver, deferred around deliver, turns a panic while a completion
// webhook is delivered (in signing, in the HTTP client or its transport)
// into that delivery failing, logged with its stack and counted as failed,
// instead of a crash of the scheduler that stopped every tenant's calls and
// lost the jobs of a Memory store, as recoverExecute does for a job's call.
// The delivery is not retried: the same input would panic again. attempts
// is the count deliver had reached, the attempt that panicked included.
func (n *webhookNotifier) recoverDeliver(id string, attempts *int) {
	v := recover()
	if v == nil {
		return
	}
	n.g.log.Error(fmt.Errorf("panic: %v", v), "A completion webhook's delivery failed; it is not retried", "job", id, "stack", string(debug.Stack()))
	n.writeState(id, webhookFailed, *attempts)
	n.count(webhookOutcomeFailed)
}

// errStaleWebhookState refuses a webhook state older than the one stored.
var errStaleWebhookState = errors.New("a later webhook state is stored")

// setState records the delivery state in the store (counting an attempt
// when attempted is true). A write the store fails is made again later
// (dispatcher.writeLater), as the job's terminal status is: dropped, the
// job would show its webhook pending after its delivery, and the next
// scheduler would deliver it again.
func (n *webhookNotifier) setState(id, state string, attempted bool) {
	j, err := n.g.store.Get(id)
	if err != nil {
		return // pruned
	}
	attempts := j.WebhookAttempts
	if attempted {
		attempts++
	}
	n.writeState(id, state, attempts)
}

// writeState writes the delivery state and the attempts made so far. A
// job's deliveries are made one after another, so a state is stale (and
// not written) when the stored one has more attempts, or as many and a
// final state where this one is pending: a write made again later never
// undoes a later one.
func (n *webhookNotifier) writeState(id, state string, attempts int) {
	key := "webhook " + id
	_, err := n.g.store.Update(id, func(j *jobs.Job) error {
		if j.WebhookAttempts > attempts || (j.WebhookAttempts == attempts && state == webhookPending &&
			(j.WebhookStatus == webhookDelivered || j.WebhookStatus == webhookFailed)) {
			return errStaleWebhookState
		}
		j.WebhookStatus, j.WebhookAttempts = state, attempts
		return nil
	})
	d := n.g.dispatch
	// A later state is one with more attempts, or as many and final: a
	// state kept for a retry is replaced or dropped only by one as late
	// (a delivery's write failing while an earlier state kept for a retry
	// is being written again must not be undone by it).
	rank := 2 * attempts
	if state != webhookPending {
		rank++
	}
	if err == nil || errors.Is(err, errStaleWebhookState) || errors.Is(err, jobs.ErrNotFound) {
		d.dropLater(key, rank) // an earlier state kept for a retry is out of date
		return
	}
	n.g.log.Error(err, "recording a completion webhook's state failed; it is written again later", "job", id, "state", state)
	d.writeLaterRank(key, rank, func() { n.writeState(id, state, attempts) })
}

// deliver POSTs body to target until a 2xx, a permanent refusal, the last
// attempt or stop. tenant is the job's tenant, whose signing secret (read
// at each attempt, so a rotated secret applies) signs the body. made holds
// the attempts made by earlier schedulers (stored before this delivery) and
// is raised to include each attempt as it starts: each state is recorded
// with that count, not with the stored count plus one, which lags while a
// state the store failed to write waits for its retry (and recoverDeliver
// records it after a panic).
func (n *webhookNotifier) deliver(id, tenant, target string, body []byte, made *int) {
	base := *made
	for attempt := 1; ; attempt++ {
		*made = base + attempt // counted before the POST: an attempt that panics is one
		retry, err := n.post(id, tenant, target, body, attempt)
		if n.ctx.Err() != nil {
			return // stopped: the job stays pending
		}
		if err == nil {
			n.writeState(id, webhookDelivered, base+attempt)
			n.count(webhookOutcomeDelivered)
			return
		}
		if !retry || attempt >= webhookMaxAttempts {
			n.writeState(id, webhookFailed, base+attempt)
			n.count(webhookOutcomeFailed)
			n.g.log.Info("completion webhook failed", "job", id, "attempts", attempt, "error", err.Error())
			return
		}
		n.writeState(id, webhookPending, base+attempt)
		n.count(webhookOutcomeRetried)
		if !n.sleep(n.backoff(attempt)) {
			return
		}
	}
}

// backoff is the wait after the given failed attempt (1-based).
func (n *webhookNotifier) backoff(attempt int) time.Duration {
	d := min(webhookRetryBase<<min(attempt-1, 10), webhookRetryCap)
	r := rand.Float64
	if n.g.rand != nil {
		r = n.g.rand
	}
	return d/2 + time.Duration(r()*float64(d/2))
}

// sleep waits d on the gateway's clock; false when stopped meanwhile.
func (n *webhookNotifier) sleep(d time.Duration) bool {
	t := n.g.clock.NewTimer(d)
	defer t.Stop()
	n.backoffs.Add(1)
	select {
	case <-t.C():
		return true
	case <-n.ctx.Done():
		return false
	}
}

// errWebhookStatus is a non-2xx answer of the webhook endpoint.
var errWebhookStatus = errors.New("webhook endpoint answered")

// errWebhookAddress: the webhook URL's host is, or resolves to, an address
// webhookDialControl refuses. Permanent: the delivery is not retried.
var errWebhookAddress = errors.New("webhook address not allowed (link-local, unspecified or multicast)")

// errWebhookSigning: the tenant's signing secret cannot be used; the
// delivery fails without being sent.
var errWebhookSigning = errors.New("webhook signing secret unusable")

// signWebhook sets the Standard Webhooks headers
// (https://www.standardwebhooks.com/, "Signature scheme"): webhook-id (the
// job ID: the same on every attempt and after a restart, so receivers can
// deduplicate), webhook-timestamp (now, Unix seconds) and
// webhook-signature ("v1," + base64 of HMAC-SHA256 over
// "id.timestamp.body" with key). Receivers verify with any Standard
// Webhooks library and the tenant's secret, rejecting timestamps older
// than their tolerance (5 minutes in the reference libraries).
func signWebhook(h http.Header, key []byte, id string, now time.Time, body []byte) error {
	wh, err := standardwebhooks.NewWebhookRaw(key)
	if err != nil {
		return fmt.Errorf("%w: %w", errWebhookSigning, err)
	}
	sig, err := wh.Sign(id, now, body)
	if err != nil {
		return fmt.Errorf("%w: %w", errWebhookSigning, err)
	}
	h.Set(standardwebhooks.HeaderWebhookID, id)
	h.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(now.Unix(), 10))
	h.Set(standardwebhooks.HeaderWebhookSignature, sig)
	return nil
}

// post makes one attempt; retry reports whether a failure may succeed
// later (network errors, timeouts, 408, 429 and 5xx; other statuses,
// redirects included, and an address refused by webhookDialControl are
// permanent).
func (n *webhookNotifier) post(id, tenant, target string, body []byte, attempt int) (retry bool, err error) {
	t := n.g.reg.Tenant(tenant)
	if t == nil {
		// Whether the tenant signed its webhooks is unknown: never send
		// a body that may have to be signed unsigned.
		return false, fmt.Errorf("%w: tenant %q is not loaded (TenantQuota removed)", errWebhookSigning, tenant)
	}
	signing := t.Policy().WebhookSigning
	if signing != nil && signing.Invalid != "" {
		// Signing was asked for: never send the body unsigned. Retried
		// (the Secret may be in the middle of a delete-and-recreate
		// rotation), so the delivery fails only after every attempt.
		return true, fmt.Errorf("%w: %s", errWebhookSigning, signing.Invalid)
	}
	req, err := http.NewRequestWithContext(n.ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return false, err
	}
	if ip := net.ParseIP(req.URL.Hostname()); ip != nil && refusedWebhookIP(ip) {
		// Checked here too: through an HTTP proxy (HTTPS_PROXY) the
		// dialer sees only the proxy's address.
		return false, fmt.Errorf("%w: %s", errWebhookAddress, ip)
	}
	select {
	case n.posts <- struct{}{}:
	case <-n.ctx.Done():
		return false, n.ctx.Err()
	}
	defer func() { <-n.posts }()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "fairshare-webhook")
	req.Header.Set(webhookJobHeader, id)
	req.Header.Set(webhookAttemptHeader, strconv.Itoa(attempt))
	if signing != nil {
		if err := signWebhook(req.Header, signing.Key, id, n.g.clock.Now(), body); err != nil {
			return false, err
		}
	}
	resp, err := n.client.Do(req)
	if err != nil {
		return !errors.Is(err, errWebhookAddress), err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode <= 299 {
		return false, nil
	}
	err = fmt.Errorf("%w %d", errWebhookStatus, resp.StatusCode)
	return resp.StatusCode >= 500 || resp.StatusCode == http.StatusRequestTimeout || resp.StatusCode == http.StatusTooManyRequests, err
}
