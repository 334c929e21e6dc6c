package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/metrics"
	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/throttle"
)

func (g *Gateway) interactive(endpoint string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { g.serveInteractive(w, r, endpoint) }
}

// refuse writes e and counts it against the tenant (t may be nil).
func (g *Gateway) refuse(w http.ResponseWriter, t *registry.Tenant, e *apiError) {
	switch {
	case t == nil:
		g.metrics.Unattributed(e.code).Inc()
	case t.Removed():
		// Removed while the request ran: its series were forgotten.
	default:
		if e.status == http.StatusTooManyRequests || e.status == http.StatusForbidden ||
			(e.status == http.StatusRequestEntityTooLarge && e.code == string(limiter.ReasonTooLarge)) {
			t.AddRejection()
		}
		g.metrics.Tenant(t).Requests(e.code).Inc()
	}
	writeError(w, e)
}

// serveInteractive serves one OpenAI request: identify, parse and estimate,
// admit (never queue), proxy, settle.
func (g *Gateway) serveInteractive(w http.ResponseWriter, r *http.Request, endpoint string) {
	t, pool, body, ok := g.identifyAndRead(w, r)
	if !ok {
		return
	}
	req, aerr := parseRequest(endpoint, body, pool, g.promptCounter(t))
	if aerr != nil {
		g.refuse(w, t, aerr)
		return
	}
	if aerr := req.applyPlanCap(t.Policy().MaxOutputTokensPerRequest, t.Policy().DryRun); aerr != nil {
		g.refuse(w, t, aerr)
		return
	}
	m := g.reg.Model(req.model)
	if m == nil {
		g.refuse(w, t, badParam(codeModelNotFound, "model", "The model "+strconv.Quote(req.model)+" is not served by this pool."))
		return
	}
	c, aerr := g.admit(g.clock.Now(), t, pool, m, req.promptTokens, req.maxOutput, throttle.Interactive, req.wouldRefuse)
	if aerr != nil {
		g.refuse(w, t, req.explainDefault(aerr, pool))
		return
	}
	// Safety net: a panic or a forgotten path still releases everything.
	defer c.settleUnsettled()

	upBody, injected, err := req.upstreamBody()
	if err != nil {
		c.settle(settleRefund, limiter.Usage{})
		g.refuse(w, t, badRequest(codeInvalidRequest, "The request could not be re-encoded."))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), pool.UpstreamTimeout)
	defer cancel()
	upReq, err := g.newUpstreamRequest(c.traced(ctx), pool, endpoint, upBody, r.Header)
	if err != nil {
		c.settle(settleRefund, limiter.Usage{})
		g.refuse(w, t, &apiError{status: http.StatusBadGateway, typ: typeAPI, code: codeUpstreamUnavailable, message: "The provider URL is invalid."})
		return
	}
	g.upstreamCalls.Add(1)
	sent := g.clock.Now()
	resp, err := g.roundTrip(upReq)
	now := g.clock.Now()
	g.metrics.ObserveUpstream(m.Name, now.Sub(sent))
	if err != nil {
		if r.Context().Err() != nil {
			c.settle(settleAbandoned, limiter.Usage{})
		} else {
			c.settle(c.failedSettlement(err), limiter.Usage{})
		}
		g.metrics.UpstreamResponses.WithLabelValues(m.Name, "error").Inc()
		switch {
		case r.Context().Err() != nil:
			g.countRequest(t, metrics.OutcomeClientGone)
		case isTimeout(err):
			g.refuse(w, t, &apiError{status: http.StatusGatewayTimeout, typ: typeAPI, code: codeUpstreamTimeout,
				message: "The provider did not answer in time."})
		default:
			g.refuse(w, t, &apiError{status: http.StatusBadGateway, typ: typeAPI, code: codeUpstreamUnavailable,
				message: "The provider could not be reached."})
		}
		return
	}
	defer resp.Body.Close()
	c.answered = resp.StatusCode >= 200 && resp.StatusCode <= 299
	q := g.readQuota(now, m, resp)

	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusRequestEntityTooLarge {
		eb, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		if lim, ok := upstreamTooLarge(resp.StatusCode, q, eb); ok {
			// The request exceeds the provider's limit: not a quota
			// exhaustion, so the model is not paused for every tenant, and
			// it is not worth a retry (BC-10).
			g.providerRefusedTooLarge(now, c, q, lim)
			g.refuse(w, t, upstreamTooLargeError(m.Name, m.TokenLimit()))
			return
		}
	}
	if resp.StatusCode == http.StatusTooManyRequests {
		g.upstreamThrottled(now, c, q)
		c.settle(settleThrottled, limiter.Usage{})
		g.refuse(w, t, upstreamQuotaError(m.Throttle.PausedUntil().Sub(now)))
		return
	}
	if q.Known() {
		m.Throttle.Observe(now, c.permit, q)
	}
	if isAuthRefusal(resp.StatusCode) {
		// The provider refused the pool's key: the tenant gets the
		// gateway's own error, never the provider's body (which may quote
		// the key); full refund.
		c.settle(settleRefund, limiter.Usage{})
		g.countRequest(t, metrics.OutcomeUpstreamError)
		g.refuse(w, t, upstreamAuthError())
		return
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		// The provider refused or failed the call: full refund (BC-22), the
		// status and body (its first maxErrorBody bytes, the provider key
		// redacted) are passed through, with a 5xx's Retry-After
		// normalised to whole seconds (upstreamRetryAfter). The call is
		// not retried: the client decides (brief "data plane contract":
		// only batch jobs retry).
		c.settle(settleRefund, limiter.Usage{})
		g.countRequest(t, metrics.OutcomeUpstreamError)
		if ra, ok := upstreamRetryAfter(resp.StatusCode, q); ok {
			w.Header().Set("Retry-After", ra)
		}
		eb, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		g.writeUpstreamBody(w, t, resp, g.key.Redact(eb))
		return
	}
	if req.stream && isEventStream(resp.Header.Get("Content-Type")) {
		g.proxyStream(w, r, resp, c, injected, req.choices > 1)
		return
	}
	b, err := readResponseBody(resp.Body, resp.ContentLength, g.maxResp)
	if err != nil {
		// The body broke off: the provider did process the call, keep the charge.
		c.settle(settleUsage, limiter.Usage{})
		g.refuse(w, t, &apiError{status: http.StatusBadGateway, typ: typeAPI, code: codeUpstreamUnavailable,
			message: "The provider's response broke off."})
		return
	}
	var u limiter.Usage
	if int64(len(b)) <= g.maxResp {
		// One pass validates the body and reads its usage
		// (scanResponseJSON: json.Valid and parseBodyUsage in one).
		var valid bool
		if u, valid = scanResponseJSON(b); !valid {
			// A 200 whose body is not JSON (RFC 9110 section 15.6.3: an
			// invalid response from the inbound server is a 502). The
			// provider did process the call and its usage is unknown: the
			// charge stands (BC-28a).
			c.settle(settleUsage, limiter.Usage{})
			putRespBuf(b)
			g.refuse(w, t, &apiError{status: http.StatusBadGateway, typ: typeAPI, code: codeUpstreamInvalidResponse,
				message: "The provider's response was not valid JSON."})
			return
		}
	}
	// Settle before the body is written, so a client that sends its next
	// request after reading this response sees the refund (BC-24).
	c.settle(settleUsage, u)
	g.countRequest(t, metrics.OutcomeOK)
	if int64(len(b)) <= g.maxResp {
		// The whole body was read (readResponseBody stopped at EOF): it is
		// written as is, without a copy loop and its 32 KiB buffer.
		g.writeUpstreamBody(w, t, resp, b)
	} else {
		g.writeUpstream(w, t, resp, b)
	}
	putRespBuf(b)
}

// readResponseBody reads a non-streaming response body as
// io.ReadAll(io.LimitReader(body, limit+1)) does: at most limit+1 bytes
// (limit: the gateway's MaxResponseBytes; more means the body is passed
// through without reading its usage), until EOF or the first error, which
// is returned with the bytes read. When the provider announced a
// contentLength (bytes, -1 when unknown) within limit, the buffer is
// allocated once at that size plus one byte for the final EOF read, instead
// of regrowing (brief "performance targets": usage extraction CPU).
func readResponseBody(body io.Reader, contentLength, limit int64) ([]byte, error) {
	size := 512
	if contentLength >= 0 && contentLength <= limit {
		size = int(contentLength) + 1
	}
	b := getRespBuf(size)
	r := io.LimitReader(body, limit+1)
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)] // grow as append does
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err != nil {
			if err == io.EOF {
				err = nil
			}
			return b, err
		}
	}
}

// maxPooledRespBuf bounds the capacity (bytes) of the response buffers
// kept for reuse: larger bodies are rare and are left to the garbage
// collector, so the pool never pins more than a few MiB per buffer.
const maxPooledRespBuf = 4 << 20

// respBufPool holds *[]byte buffers of non-streaming response bodies
// (readResponseBody), returned by putRespBuf once the body is written.
var respBufPool sync.Pool

// getRespBuf returns an empty buffer with room for at least size bytes: a
// pooled one when it is large enough, else a new one.
func getRespBuf(size int) []byte {
	if size <= maxPooledRespBuf {
		if p, _ := respBufPool.Get().(*[]byte); p != nil {
			if cap(*p) >= size {
				return (*p)[:0]
			}
			respBufPool.Put(p)
		}
	}
	return make([]byte, 0, size)
}

// putRespBuf gives b back for reuse; b must not be used afterwards.
func putRespBuf(b []byte) {
	if cap(b) == 0 || cap(b) > maxPooledRespBuf {
		return
	}
	b = b[:0]
	respBufPool.Put(&b)
}

// providerRefusedTooLarge records a provider refusal of a call as larger
// than the model's limit (BC-10): the limit it names is remembered so that
// the next such request is refused at admission, the figures of the
// response are observed, and the call is settled with a full refund without
// pausing the model.
func (g *Gateway) providerRefusedTooLarge(now time.Time, c *call, q throttle.Quota, limit int64) {
	c.model.ObserveTokenLimit(limit)
	if q.Known() {
		c.model.Throttle.Observe(now, c.permit, q)
	}
	c.settle(settleRejected, limiter.Usage{})
}

// upstreamThrottled records an upstream 429: the model's throttle pauses
// every start until the provider's Retry-After or reset.
func (g *Gateway) upstreamThrottled(now time.Time, c *call, q throttle.Quota) {
	c.model.Throttle.OnTooManyRequests(now, c.permit, q)
	c.model.AddThrottled()
	g.reg.AddUpstreamThrottled()
	g.metrics.UpstreamThrottled.WithLabelValues(c.model.Name).Inc()
}

// writeUpstream writes a provider response: its headers (without the
// provider's quota fields), the tenant's quota headers, the status and the
// body read so far (prefix), then the rest of the body.
func (g *Gateway) writeUpstream(w http.ResponseWriter, t *registry.Tenant, resp *http.Response, prefix []byte) {
	h := w.Header()
	copyResponseHeaders(h, resp.Header)
	setQuotaHeaders(h, tenantQuotaDims(t, t.Limiter.Snapshot(g.clock.Now()))...)
	w.WriteHeader(resp.StatusCode)
	if prefix != nil {
		if _, err := w.Write(prefix); err != nil {
			return
		}
	}
	buf := copyBufPool.Get().(*[]byte)
	_, _ = io.CopyBuffer(w, resp.Body, *buf)
	copyBufPool.Put(buf)
}

// copyBufPool holds the 32 KiB buffers (*[]byte) of writeUpstream's copy of
// a body larger than the gateway's MaxResponseBytes (io.Copy would allocate
// one per call: the stallWriter hides the connection's ReadFrom).
var copyBufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// writeUpstreamBody writes a provider response like writeUpstream with body
// as its whole body (the rest of resp.Body is not read).
func (g *Gateway) writeUpstreamBody(w http.ResponseWriter, t *registry.Tenant, resp *http.Response, body []byte) {
	h := w.Header()
	copyResponseHeaders(h, resp.Header)
	setQuotaHeaders(h, tenantQuotaDims(t, t.Limiter.Snapshot(g.clock.Now()))...)
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(body)
}

// proxyStream forwards a server-sent-events stream event by event, flushing
// each. Admission was decided before the first byte (BC-29). The stream is
// settled from the LAST usage it carried (BC-24): OpenAI sends one usage
// chunk at the end, but vLLM's stream_options.continuous_usage_stats puts a
// running usage in every chunk, so the first one seen is far below the
// final count. Settlement happens when the stream ends, before its closing
// "data: [DONE]" is forwarded (so a client that sends its next request after
// reading the stream sees the refund). When the gateway injected
// include_usage the usage-only chunk is not forwarded, since the client did
// not ask for it. A stream that ends without usage, or a client that
// goes away (which ends the upstream call), is settled from the prompt
// charged plus the output tokens counted from the deltas forwarded
// (streamText: their text joined, tokenized only when the stream ends
// without usage; BC-23, BC-28a), so what was not generated is refunded.
// Each event is read by scanEvent (one strict pass, encoding/json for
// anything unusual).
//
// With more than one choice (n > 1, perEvent) the choices' deltas
// interleave, and the provider bills each choice's text on its own: each
// event's text is then counted by itself (a piece of one choice is never
// joined with the next choice's piece into one token).
func (g *Gateway) proxyStream(w http.ResponseWriter, r *http.Request, resp *http.Response, c *call, injected, perEvent bool) {
	h := w.Header()
	copyResponseHeaders(h, resp.Header)
	setQuotaHeaders(h, tenantQuotaDims(c.tenant, c.tenant.Limiter.Snapshot(g.clock.Now()))...)
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	_ = rc.Flush()

	st := getStreamState(resp.Body)
	defer putStreamState(st)
	br := st.br
	event := st.event[:0]
	defer func() { st.event = event }() // kept for reuse, grown or not
	var last limiter.Usage              // the latest usage seen (Known false: none)
	text := &st.text                    // output text of the deltas forwarded, counted when needed
	// usage is what the stream is settled from: the provider's last usage,
	// else the prompt charged and the output counted from the deltas the
	// client was sent (BC-23: a disconnect after 400 of 1000 tokens is
	// charged prompt + 400; BC-28a: a stream without usage is charged from
	// its counted deltas).
	usage := func() limiter.Usage {
		if last.Known {
			return last
		}
		return limiter.Usage{PromptTokens: c.res.Cost().PromptTokens, OutputTokens: text.count(), Known: true}
	}
	// A panic while the stream is relayed settles it as a cut stream, from
	// what the client was sent (a no-op once settled), instead of by the
	// handler's safety net, which knows nothing of the deltas.
	defer func() { c.settle(settleUsage, usage()) }()
	clientOK := true
	var readErr error // the provider's stream broke off (not a clean EOF)
	emit := func() {
		if len(event) == 0 {
			return
		}
		forward := true
		// Once a usage was seen the stream is settled from the last one:
		// the text of later deltas is not kept.
		var tp *[]byte
		if !last.Known {
			tp = &text.buf
		}
		mark := len(text.buf)
		info := scanEvent(event, tp)
		if info.usage.Known {
			last = info.usage
			forward = !(injected && info.usageOnly)
			if info.usageOnly {
				text.buf = text.buf[:mark]
			}
		} else if isDoneEvent(event) {
			text.buf = text.buf[:mark]
			c.settle(settleUsage, usage())
		}
		switch {
		case last.Known:
			text.buf = text.buf[:0]
		case perEvent:
			text.flush()
		default:
			text.add()
		}
		if forward && clientOK {
			if _, err := w.Write(event); err != nil {
				clientOK = false
			} else if !completeEventBuffered(br) {
				// Flushed unless the next event is already buffered in
				// full: it is written at once, and flushed with it (a
				// reverse proxy flushes per read in the same way), so
				// no frame waits on the provider unflushed.
				if err := rc.Flush(); err != nil {
					clientOK = false
				}
			}
		}
		event = event[:0]
	}
	for clientOK {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// The slice ReadSlice returned is only valid until the next
			// read: copy it before reading the rest of the line, at most
			// up to the event bound.
			head := append([]byte(nil), line...)
			for errors.Is(err, bufio.ErrBufferFull) && int64(len(event)+len(head)) <= g.maxResp {
				line, err = br.ReadSlice('\n')
				head = append(head, line...)
			}
			line = head
		}
		if int64(len(event)+len(line)) > g.maxResp {
			// One event beyond MaxResponseBytes (a provider that sends no
			// line or event end): the stream is broken off as if the
			// provider had failed, instead of buffering without bound.
			event = event[:0]
			readErr = errStreamEventTooLarge
			break
		}
		event = append(event, line...)
		if isBlankLine(line) {
			emit()
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				readErr = err
			}
			break
		}
	}
	if clientOK {
		emit()
	}
	if clientOK {
		// A frame whose flush was left to the next event (emit) is sent
		// now, before the stream is settled and counted.
		if err := rc.Flush(); err != nil {
			clientOK = false
		}
	}
	c.settle(settleUsage, usage()) // no-op when settled at [DONE]
	outcome := metrics.OutcomeOK
	switch {
	case !clientOK || r.Context().Err() != nil:
		outcome = metrics.OutcomeClientGone
	case readErr != nil:
		outcome = metrics.OutcomeUpstreamError
	}
	g.countRequest(c.tenant, outcome)
	if outcome == metrics.OutcomeUpstreamError {
		// The provider's stream broke off (reset, timeout): end the
		// client's response abruptly too, as a reverse proxy does, so the
		// client reads a truncated response (no terminating chunk) rather
		// than a stream that looks complete without its [DONE].
		panic(http.ErrAbortHandler)
	}
}

// isEventStream reports whether a Content-Type value names the
// text/event-stream media type, whose type and subtype are
// case-insensitive (RFC 9110 section 8.3.1), parameters and spaces
// around it aside ("Text/Event-Stream; charset=utf-8").
func isEventStream(ct string) bool {
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	return strings.EqualFold(strings.TrimSpace(ct), "text/event-stream")
}

// errStreamEventTooLarge ends a stream one of whose server-sent events
// (its lines up to the blank line) exceeds the gateway's MaxResponseBytes.
var errStreamEventTooLarge = errors.New("a server-sent event from the provider exceeds the response size bound")

// countRequest counts a request's outcome in requests_total, unless its
// tenant was removed while it ran (ForgetTenant deleted its series).
func (g *Gateway) countRequest(t *registry.Tenant, outcome string) {
	if !t.Removed() {
		g.metrics.Tenant(t).Requests(outcome).Inc()
	}
}

// trimEOL removes a line's trailing "\n" and every "\r" before it (the
// line as splitting the event on "\n" and trimming "\r" gives it; SSE
// lines end in "\n" or "\r\n").
func trimEOL(line []byte) []byte {
	n := len(line)
	if n > 0 && line[n-1] == '\n' {
		n--
	}
	for n > 0 && line[n-1] == '\r' {
		n--
	}
	return line[:n]
}

// completeEventBuffered reports whether br already holds a complete next
// SSE event (a blank line ends it), which proxyStream can read without
// waiting on the provider. It only looks at the buffered bytes.
func completeEventBuffered(br *bufio.Reader) bool {
	n := br.Buffered()
	if n == 0 {
		return false
	}
	buf, _ := br.Peek(n)
	return bytes.Contains(buf, []byte("\n\n")) || bytes.Contains(buf, []byte("\n\r\n"))
}

// streamChunk is the part of an OpenAI streaming chunk that carries
// generated text.
type streamChunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content          string `json:"content"`
			Refusal          string `json:"refusal"`
			ReasoningContent string `json:"reasoning_content"`
			ToolCalls        []struct {
				Function struct {
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
			// FunctionCall is the legacy functions API's call (the
			// request's "functions"): its arguments are generated output.
			FunctionCall struct {
				Arguments string `json:"arguments"`
			} `json:"function_call"`
		} `json:"delta"`
	} `json:"choices"`
}

// isDoneEvent reports whether an SSE event is the closing "data: [DONE]".
func isDoneEvent(event []byte) bool {
	if !bytes.Contains(event, []byte("[DONE]")) {
		return false
	}
	for line := range bytes.Lines(event) {
		data, found := bytes.CutPrefix(trimEOL(line), []byte("data:"))
		if found && bytes.Equal(bytes.TrimSpace(data), []byte("[DONE]")) {
			return true
		}
	}
	return false
}

// isBlankLine reports whether line (as ReadSlice returns it) holds only
// "\r" and "\n" bytes: the blank line that ends an SSE event.
func isBlankLine(line []byte) bool {
	for _, c := range line {
		if c != '\r' && c != '\n' {
			return false
		}
	}
	return len(line) > 0
}
