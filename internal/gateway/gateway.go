// Package gateway is the scheduler's HTTP data plane: the OpenAI-compatible
// interactive API (POST /v1/chat/completions, /v1/completions,
// /v1/embeddings, streaming and not), the batch job API (/v1/jobs) and the
// dispatcher that drains the fair queue to the provider.
//
// Two paths, one quota (seed 000 "Two paths, one quota"):
//
//   - Interactive calls are admitted at once or refused at once: the tenant
//     limiter (seed 002 section 3: weighted tokens, input/output tokens,
//     requests, concurrency, KV blocks; charge prompt + max output), the
//     tenant budget, the pool's upstream concurrency, then the model's
//     throttle with interactive priority (which may use the reserve).
//     Refusals never queue: 429 for the tenant's own limits, 503 for the
//     pool's capacity, 413 for a request that can never fit (BC-10), each
//     with Retry-After rounded up (BC-09) and quota headers.
//   - Batch jobs wait in the fair queue (deficit round robin by weighted
//     cost). The dispatcher takes the next job whose tenant is within its
//     limits, asks the throttle with batch priority (which leaves the
//     reserve alone), and sends it; upstream 429 pauses the model and puts
//     the job back at its tenant's head, 5xx and timeouts retry with
//     exponential backoff and jitter until the deadline.
//   - A request larger than the model's provider token limit can never
//     succeed (BC-10): it is refused at admission with 413
//     request_too_large when the limit is known (headers or the pool's
//     hint), and a provider refusal saying so (413, or a "Request too
//     large" 429) neither pauses the model nor is retried.
//   - The tenant's budget is a reservation like the limiter's buckets:
//     charged at admission, settled to the actual usage (BC-20).
//   - Only allow-listed client headers reach the provider; the provider key
//     is the only credential sent.
//
// Every admitted call is settled exactly once on every exit path: the
// limiter reservation is completed from the provider's usage (or cancelled
// with a full refund when the provider did not process the call), the
// concurrency slot and KV blocks are released, and the throttle learns the
// outcome (Observe, OnTooManyRequests or Done).
//
// The gateway does not talk to Kubernetes: it reads policy from
// internal/registry and stores jobs in an internal/jobs.Store.
package gateway

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/metrics"
	"github.com/fairshare-dev/fairshare/internal/providerkey"
	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/tokencount"
)

// Defaults of Options.
const (
	// DefaultMaxBodyBytes bounds a request body: 8 MiB.
	DefaultMaxBodyBytes = 8 << 20
	// DefaultMaxResponseBytes bounds a non-streaming response body read for
	// its usage: 32 MiB (a larger body is passed through without usage).
	DefaultMaxResponseBytes = 32 << 20
	// DefaultUpstreamConcurrency bounds upstream calls in flight.
	DefaultUpstreamConcurrency = 64
	// DefaultBodyReadTimeout bounds the reading of one request body: 60 s
	// (8 MiB at about 1 Mbit/s). A client that sends its body slower is cut
	// off and answered 400 invalid_request (docs/operations.md "Client
	// timeouts and limits").
	DefaultBodyReadTimeout = 60 * time.Second
	// DefaultWriteStallTimeout bounds one write of a response to the client
	// (a streamed event, a chunk of a body): 30 s. A client that reads
	// nothing for that long is cut off, so a stalled reader cannot hold an
	// upstream call, its concurrency slot and KV blocks (docs/operations.md
	// "Client timeouts and limits").
	DefaultWriteStallTimeout = 30 * time.Second
)

// Limits of the data plane's HTTP server (NewServer; docs/operations.md
// "Client timeouts and limits").
const (
	// DefaultReadHeaderTimeout bounds the reading of a request's headers
	// (slowloris): 10 s.
	DefaultReadHeaderTimeout = 10 * time.Second
	// DefaultIdleTimeout closes a keep-alive connection idle this long:
	// 120 s.
	DefaultIdleTimeout = 120 * time.Second
	// DefaultMaxHeaderBytes bounds a request's header block: 64 KiB
	// (net/http answers 431 beyond it).
	DefaultMaxHeaderBytes = 64 << 10
)

// ServerOptions are the limits of NewServer; a zero field takes its
// default.
type ServerOptions struct {
	// ReadHeaderTimeout bounds reading the request line and headers;
	// <= 0 means DefaultReadHeaderTimeout.
	ReadHeaderTimeout time.Duration
	// IdleTimeout bounds a keep-alive connection's idle time; <= 0 means
	// DefaultIdleTimeout.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds the header block; <= 0 means
	// DefaultMaxHeaderBytes.
	MaxHeaderBytes int
}

// NewServer returns the HTTP server of the data plane (and of the metrics
// endpoint) serving h, with the limits of o. ReadTimeout and WriteTimeout
// stay 0 on purpose: they are connection deadlines over a whole request,
// and a read deadline that passes while a response streams cancels the
// request's context (net/http's background read), so a stream would be cut
// at that age. The gateway bounds instead the reading of each body
// (Options.BodyReadTimeout) and each write to the client
// (Options.WriteStallTimeout); a stream lasts at most the pool's upstream
// timeout.
func NewServer(h http.Handler, o ServerOptions) *http.Server {
	if o.ReadHeaderTimeout <= 0 {
		o.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.MaxHeaderBytes <= 0 {
		o.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	return &http.Server{Handler: h, ReadHeaderTimeout: o.ReadHeaderTimeout, IdleTimeout: o.IdleTimeout, MaxHeaderBytes: o.MaxHeaderBytes}
}

// Options configure a Gateway.
type Options struct {
	// Registry is the live policy and runtime state (required).
	Registry *registry.Registry
	// Store holds batch jobs; nil uses an in-memory store. When it is a
	// jobs.PendingLister (MemStore, BoltStore), the queued and running jobs
	// it holds at New are queued again by Run (see recover).
	Store jobs.Store
	// Clock drives admission times and the dispatcher's timers; nil is the
	// real clock. Tests inject k8s.io/utils/clock/testing.FakeClock.
	Clock clock.WithTicker
	// Metrics receives counters; nil registers them on a private registry.
	Metrics *metrics.Metrics
	// ProviderKey, when not empty, is sent upstream as
	// `Authorization: Bearer <key>`, and nowhere else. Ignored when
	// LiveProviderKey is set.
	ProviderKey string
	// LiveProviderKey, when set, is the provider key read on every
	// upstream call, which its owner may replace at any time (a rotated
	// key, providerkey.File); nil holds ProviderKey for good.
	LiveProviderKey *providerkey.Key
	// UpstreamConcurrency bounds calls in flight to the provider,
	// interactive and batch together; <= 0 means 64.
	UpstreamConcurrency int
	// Transport makes the calls to the provider; nil uses a pooled
	// http.Transport sized to UpstreamConcurrency. The gateway calls its
	// RoundTrip directly, as a reverse proxy does (httputil.ReverseProxy):
	// a provider's redirect is not followed but answered like any other
	// non-2xx status (relayed to an interactive caller with a full refund;
	// a batch job fails with it), and no request headers are copied per
	// call for a redirect.
	Transport http.RoundTripper
	// Log receives operational messages (never keys or bodies).
	Log logr.Logger
	// MaxBodyBytes bounds request bodies; <= 0 means 8 MiB.
	MaxBodyBytes int64
	// MaxResponseBytes bounds non-streaming bodies read for usage (a larger
	// one is passed through unread) and each server-sent event of a stream
	// (a larger one, such as a provider that never ends a line, breaks the
	// stream off as a provider failure); <= 0 means 32 MiB.
	MaxResponseBytes int64
	// Rand returns a number in [0, 1) for retry jitter; nil uses math/rand/v2.
	Rand func() float64
	// BodyReadTimeout bounds the reading of one request body (real time);
	// <= 0 means DefaultBodyReadTimeout.
	BodyReadTimeout time.Duration
	// WriteStallTimeout bounds each write of a response to the client
	// (real time); <= 0 means DefaultWriteStallTimeout.
	WriteStallTimeout time.Duration
}

// Gateway serves the data plane of one pool.
type Gateway struct {
	reg   *registry.Registry
	store jobs.Store
	// keys are the idempotency keys of the submissions in flight.
	keys      inFlight
	clock     clock.WithTicker
	metrics   *metrics.Metrics
	key       *providerkey.Key
	transport http.RoundTripper
	log       logr.Logger
	maxBody   int64
	maxResp   int64
	rand      func() float64
	// bodyRead bounds reading a request body; writeStall each write of a
	// response (real time).
	bodyRead, writeStall time.Duration
	sem                  chan struct{}
	// lastInteractive is when the last interactive call arrived, in Unix
	// nanoseconds of clock (batchSlots lends the reserved slots to batch
	// after the pool's BorrowAfter without one).
	lastInteractive atomic.Int64
	mux             *http.ServeMux
	dispatch        *dispatcher
	// pending are the store's unfinished jobs at New, queued again by Run.
	pending []jobs.Job
	// hooks delivers completion webhooks; stopped when Run returns.
	hooks *webhookNotifier
	// counts is the cache of prompt token counts, scoped by tenant
	// (tokencount.Cache, DefaultCacheSlots texts).
	counts *tokencount.Cache
	// undelivered are the store's finished jobs at New whose webhook was
	// still pending; Run delivers them again.
	undelivered []jobs.Job
	// recovered is closed once Run has re-queued the store's jobs (or
	// returned before that).
	recovered     chan struct{}
	recoveredOnce sync.Once

	// upstreamCalls counts calls made to the provider (tests, status).
	upstreamCalls atomic.Int64
	// slotsFreed counts the upstream slots released. A dispatcher pass
	// loads it right after it stores dispatcher.jobsWaiting and before it
	// reads len(sem); a release adds to it after it frees a slot and before
	// it loads jobsWaiting. Sequentially consistent atomics on both sides
	// make that pairing hold by the memory model, whatever len of a
	// channel compiles to (it is no synchronising read).
	slotsFreed atomic.Int64
}

// New returns a Gateway. Call Run to start the dispatcher and Handler to
// serve HTTP.
func New(o Options) *Gateway {
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Store == nil {
		o.Store = jobs.NewMemStore(o.Clock, 0, 0)
	}
	if o.Metrics == nil {
		o.Metrics = metrics.New(prometheus.NewRegistry(), nil)
	}
	if o.UpstreamConcurrency <= 0 {
		o.UpstreamConcurrency = DefaultUpstreamConcurrency
	}
	if o.Transport == nil {
		o.Transport = newTransport(o.UpstreamConcurrency)
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.MaxResponseBytes <= 0 {
		o.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if o.LiveProviderKey == nil {
		o.LiveProviderKey = providerkey.New(o.ProviderKey)
	}
	if o.BodyReadTimeout <= 0 {
		o.BodyReadTimeout = DefaultBodyReadTimeout
	}
	if o.WriteStallTimeout <= 0 {
		o.WriteStallTimeout = DefaultWriteStallTimeout
	}
	g := &Gateway{
		reg: o.Registry, store: o.Store, clock: o.Clock, metrics: o.Metrics, key: o.LiveProviderKey,
		transport: o.Transport, log: o.Log, maxBody: o.MaxBodyBytes, maxResp: o.MaxResponseBytes, rand: o.Rand,
		bodyRead: o.BodyReadTimeout, writeStall: o.WriteStallTimeout,
		sem:    make(chan struct{}, o.UpstreamConcurrency),
		counts: tokencount.NewCache(tokencount.DefaultCacheSlots),
	}
	g.lastInteractive.Store(g.clock.Now().UnixNano())
	g.dispatch = newDispatcher(g)
	g.reg.SetQueuedOutside(g.dispatch.queuedOutsideLocked)
	g.hooks = newWebhookNotifier(g)
	g.recovered = make(chan struct{})
	if wl, ok := o.Store.(jobs.WebhookLister); ok {
		g.undelivered = wl.UndeliveredWebhooks()
	}
	if pl, ok := o.Store.(jobs.PendingLister); ok {
		g.pending = pl.Pending()
	}
	if sl, ok := o.Store.(jobs.DispatchSeqLister); ok {
		// dispatch_seq goes on from the stored jobs' after a restart.
		g.dispatch.seq.Store(sl.MaxDispatchSeq())
	}
	g.reg.OnChange(g.dispatch.wake)
	g.reg.OnTenantRemoved(g.tenantRemoved)
	g.reg.OnModelRemoved(g.metrics.ForgetModel)
	g.reg.OnModelRemoved(g.modelRemoved)
	g.mux = http.NewServeMux()
	g.mux.HandleFunc("POST "+endpointChat, g.interactive(endpointChat))
	g.mux.HandleFunc("POST "+endpointCompletions, g.interactive(endpointCompletions))
	g.mux.HandleFunc("POST "+endpointEmbeddings, g.interactive(endpointEmbeddings))
	g.mux.HandleFunc("GET /v1/models", g.listModels)
	g.mux.HandleFunc("GET /v1/models/{model...}", g.getModel)
	g.mux.HandleFunc("POST /v1/jobs", g.submitJob)
	g.mux.HandleFunc("POST "+endpointBulk, g.submitBulk)
	g.mux.HandleFunc("GET /v1/jobs", g.listJobs)
	g.mux.HandleFunc("GET /v1/jobs/{id}", g.getJob)
	g.mux.HandleFunc("DELETE /v1/jobs/{id}", g.cancelJob)
	// /v1/jobs/bulk takes POST only: without these two routes a GET or
	// DELETE of it matched /v1/jobs/{id} and was answered 404
	// job_not_found.
	g.mux.HandleFunc("GET "+endpointBulk, bulkOnlyPost)
	g.mux.HandleFunc("DELETE "+endpointBulk, bulkOnlyPost)
	return g
}

// endpointBulk is the bulk submission path (POST only).
const endpointBulk = "/v1/jobs/bulk"

// bulkOnlyPost answers a method other than POST on endpointBulk: 405
// method_not_allowed with `Allow: POST` (RFC 9110 section 15.5.6).
func bulkOnlyPost(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Allow", http.MethodPost)
	writeError(w, &apiError{status: http.StatusMethodNotAllowed, typ: typeInvalidRequest, code: codeMethodNotAllowed,
		message: "Method " + r.Method + " is not allowed on " + endpointBulk + "; allowed: POST."})
}

func newTransport(conc int) *http.Transport {
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          max(100, conc*2),
		MaxIdleConnsPerHost:   max(100, conc*2),
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
}

// Handler returns the HTTP handler of the data plane.
func (g *Gateway) Handler() http.Handler { return g }

// ServeHTTP implements http.Handler: the routes of the package doc; other
// paths get an OpenAI-style 404. Every write of the response to the client
// is bounded by the write stall timeout (stallWriter).
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sw := &stallWriter{ResponseWriter: w, rc: http.NewResponseController(w), stall: g.writeStall}
	// The deadline left on a keep-alive connection by its previous response
	// must not cut this one before its first write: it is set stall ahead
	// now, which also arms the first write of a response that starts
	// within stall/16 (one deadline change per response, not two).
	sw.arm()
	defer sw.arm() // bounds the server's final flush after the handler
	if _, pattern := g.mux.Handler(r); pattern == "" {
		if allow := g.allowedMethods(r); allow != "" {
			sw.Header().Set("Allow", allow)
			writeError(sw, &apiError{status: http.StatusMethodNotAllowed, typ: typeInvalidRequest, code: codeMethodNotAllowed,
				message: "Method " + r.Method + " is not allowed on " + r.URL.Path + "; allowed: " + allow + "."})
			return
		}
		writeError(sw, &apiError{status: http.StatusNotFound, typ: typeNotFound, code: "not_found",
			message: "Unknown path " + r.URL.Path + "."})
		return
	}
	g.mux.ServeHTTP(sw, r)
}

// allowedMethods returns the methods the routes serve for r's path, as an
// Allow header value ("POST", "GET, HEAD, DELETE"), or "" when no route has the
// path (RFC 9110 section 15.5.6: a 405 lists them in Allow).
func (g *Gateway) allowedMethods(r *http.Request) string {
	if r.URL.Path == endpointBulk {
		return http.MethodPost // its GET and DELETE routes only refuse (bulkOnlyPost)
	}
	var allow []string
	for _, m := range [...]string{http.MethodGet, http.MethodPost, http.MethodDelete} {
		probe := &http.Request{Method: m, URL: r.URL, Host: r.Host, Header: http.Header{}}
		if _, pattern := g.mux.Handler(probe); pattern != "" {
			allow = append(allow, m)
			if m == http.MethodGet {
				allow = append(allow, http.MethodHead) // served by the GET routes
			}
		}
	}
	return strings.Join(allow, ", ")
}

// stallWriter bounds each write and flush of a response with a write
// deadline stall ahead (real time). Without it a client that stops reading
// a stream blocks the gateway's write for ever once the TCP buffers are
// full, holding the upstream call, the tenant's concurrency slot and KV
// blocks and a pool slot. The blocked write then fails, the stream is
// settled from the deltas sent (proxyStream) and everything is released.
// Unwrap lets http.ResponseController reach the connection.
type stallWriter struct {
	http.ResponseWriter
	rc    *http.ResponseController
	stall time.Duration
	// armed is when the write deadline was last set (zero: not yet).
	armed time.Time
}

// arm sets the connection's write deadline stall from now (ignored when the
// writer has none, as httptest.ResponseRecorder), unless it was set less
// than stall/16 ago: a stream writes and flushes every frame, and resetting
// the deadline (a runtime timer change) each time cost about 5% of the
// gateway's CPU on streams. The deadline therefore stays between 15/16 of
// stall and stall ahead of every write (28.1 to 30 s with the default).
func (s *stallWriter) arm() {
	now := time.Now()
	if !s.armed.IsZero() && now.Sub(s.armed) < s.stall/16 {
		return
	}
	s.armed = now
	_ = s.rc.SetWriteDeadline(now.Add(s.stall))
}

// Write implements http.ResponseWriter.
func (s *stallWriter) Write(b []byte) (int, error) {
	s.arm()
	return s.ResponseWriter.Write(b)
}

// FlushError flushes buffered data to the client within the stall bound
// (http.ResponseController.Flush calls it).
func (s *stallWriter) FlushError() error {
	s.arm()
	return s.rc.Flush()
}

// Unwrap returns the underlying writer (http.ResponseController).
func (s *stallWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// Run queues again the jobs left in the store by a previous run (recover),
// then runs the dispatcher until ctx is cancelled; it waits for the
// upstream calls it started to finish before returning.
func (g *Gateway) Run(ctx context.Context) error {
	// Deliveries in progress stop with Run; their jobs keep the webhook
	// status "pending". A delivery's state whose write failed in the
	// meantime gets one more write (FlushStoreWrites).
	defer func() {
		g.hooks.stop()
		g.FlushStoreWrites()
	}()
	err := g.recover(ctx)
	g.recoveredOnce.Do(func() { close(g.recovered) })
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	// Webhooks cut off by the last stop are delivered again, from their
	// first attempt (at-least-once, like the jobs), once recover has seen
	// the registry loaded: a delivery needs its tenant's signing secret.
	for _, j := range g.undelivered {
		g.notifyWebhook(j)
	}
	g.undelivered = nil
	return g.dispatch.run(ctx)
}

// FlushStoreWrites makes once more the job store writes kept for a retry
// after the store refused them (a job's terminal status, a webhook's
// delivery state, the removal of a refused submission), as the dispatcher
// does every second while Run runs. Run calls it as it returns; the owner
// of the store calls it again once the HTTP server has drained its
// handlers (which may have kept writes while Run was stopping), before it
// closes the store. A write that fails again is left as it was recorded.
func (g *Gateway) FlushStoreWrites() { g.dispatch.writeUnrecorded(time.Time{}) }

// Recovered is closed once Run has queued again the jobs a previous run
// left in the store (after the pool and tenants are loaded), or has
// returned before that: the scheduler's readiness waits for it, so that no
// client traffic arrives while the recovered backlog is being rebuilt.
func (g *Gateway) Recovered() <-chan struct{} { return g.recovered }

// UpstreamCalls returns the number of calls sent to the provider so far.
func (g *Gateway) UpstreamCalls() int64 { return g.upstreamCalls.Load() }

// tryAcquire takes an upstream concurrency slot without waiting.
func (g *Gateway) tryAcquire() bool {
	select {
	case g.sem <- struct{}{}:
		g.reg.AddInFlight(1)
		return true
	default:
		return false
	}
}

// release returns an upstream concurrency slot and wakes the dispatcher
// when jobs may be waiting for it (dispatcher.jobsWaiting).
func (g *Gateway) release() {
	g.releaseQuiet()
	g.dispatch.wakeIfWaiting()
}

// releaseQuiet returns a slot taken by an admission that was refused right
// after (nothing changed for the dispatcher, so it is not woken: waking it
// would make a refused batch start retry in a busy loop).
func (g *Gateway) releaseQuiet() {
	<-g.sem
	g.reg.AddInFlight(-1)
	g.slotsFreed.Add(1)
}

// roundTrip makes one call to the provider through the transport. As
// http.Client does, a response without a body is read as empty, and a
// transport that returns neither a response nor an error fails the call.
func (g *Gateway) roundTrip(req *http.Request) (*http.Response, error) {
	resp, err := g.transport.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if resp == nil {
		return nil, errors.New("the transport returned neither a response nor an error")
	}
	if resp.Body == nil {
		resp.Body = http.NoBody
	}
	return resp, nil
}

// hopHeaders are not copied from provider responses (RFC 9110 section
// 7.6.1); requests forward only forwardHeaders.
var hopHeaders = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
	"Proxy-Connection": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
}

// accountHeaders are provider response headers that describe the pool's
// provider account or session rather than the call (the organization and
// project the provider key belongs to, and cookies the provider sets for
// the pool's client): they are not passed to tenants, who share the pool
// and must learn nothing of its account. Keys are in canonical form, as Go
// reads response headers.
var accountHeaders = map[string]bool{
	"Openai-Organization":       true,
	"Openai-Project":            true,
	"Anthropic-Organization-Id": true,
	"Set-Cookie":                true,
}

// providerQuotaHeader reports whether an upstream response header describes
// the provider account's quota; those are replaced by the tenant's own.
// The comparison ignores ASCII case without lowering k (which allocated a
// string per response header).
func providerQuotaHeader(k string) bool {
	return hasPrefixFold(k, "x-ratelimit") || hasPrefixFold(k, "ratelimit") ||
		hasPrefixFold(k, "anthropic-ratelimit") || hasPrefixFold(k, "retry-after") ||
		strings.EqualFold(k, "x-ms-retry-after-ms")
}

// hasPrefixFold reports whether s begins with prefix, ignoring case as
// strings.EqualFold does.
func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// forwardHeaders are the client request headers passed to the provider:
// an allow-list, because the provider call carries the pool's provider key
// and a tenant must not be able to add credentials or select another
// account (OpenAI-Organization, OpenAI-Project, X-Api-Key, api-key, ...).
// Accept-Encoding is not forwarded: the gateway reads the response's usage,
// and Go's transport negotiates and decodes compression itself. Keys are in
// canonical form (http.CanonicalHeaderKey).
var forwardHeaders = map[string]bool{
	"Accept":           true,
	"User-Agent":       true,
	"Openai-Beta":      true, // OpenAI-Beta: opt-in API features
	"Traceparent":      true, // W3C Trace Context
	"Tracestate":       true,
	"X-Request-Id":     true,
	"X-Correlation-Id": true,
}

// newUpstreamRequest builds the provider request: the allow-listed client
// headers (forwardHeaders), Content-Type application/json, and
// Authorization only from the provider key when configured.
func (g *Gateway) newUpstreamRequest(ctx context.Context, pool *registry.PoolPolicy, path string, body []byte, in http.Header) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(pool.BaseURL, "/")+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, vs := range in {
		if ck := http.CanonicalHeaderKey(k); forwardHeaders[ck] {
			req.Header[ck] = append([]string(nil), vs...)
		}
	}
	req.Header.Set("Content-Type", "application/json")
	if auth := g.key.Authorization(); auth != "" {
		req.Header.Set("Authorization", auth)
	}
	return req, nil
}

// copyResponseHeaders copies the provider's response headers except
// hop-by-hop fields, Content-Length, the provider's quota fields and the
// fields that describe the pool's provider account (accountHeaders).
func copyResponseHeaders(dst, src http.Header) {
	n := 0
	for _, vs := range src {
		n += len(vs)
	}
	// One backing array for every value copied (a copy per field
	// otherwise); each field's slice is capped, so appending to one never
	// writes into the next.
	all := make([]string, 0, n)
	for k, vs := range src {
		if hopHeaders[k] || accountHeaders[k] || k == "Content-Length" || providerQuotaHeader(k) {
			continue
		}
		start := len(all)
		all = append(all, vs...)
		dst[k] = all[start:len(all):len(all)]
	}
}

// isTimeout reports whether err is a deadline or timeout.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
