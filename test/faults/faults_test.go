package faults

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fairshare-dev/fairshare/internal/gateway"
	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/providersim"
	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/tokencount"
)

// t0 is the gateway's fake clock at start.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

const (
	model    = "gpt-4o-mini"
	tenantID = "acme"
	key      = "key-acme"
	// maxTokens is the requests' max_tokens; generated the simulator's
	// output per response (below maxTokens).
	maxTokens = 100
	generated = 20
	// wIn and wOut are the pool's weights (the product's defaults).
	wIn, wOut = 1, 4
	// capacity is the tenant's weighted bucket capacity; its rate of 1 per
	// minute refills less than one token over a row's fake time (at most
	// 8 s), so the bucket level, floored, moves only by charges and
	// refunds.
	capacity = 1_000_000
	// requestCapacity is the tenant's request bucket capacity (refilled
	// at 1 a minute, likewise).
	requestCapacity = 1_000
	// upstreamTimeout is the pool's bound of one upstream call.
	upstreamTimeout = time.Second
	content         = "Tell me about upstream faults."
)

// promptTokens is the prompt of every request, as the gateway estimates it
// and the simulator counts it (cl100k_base with OpenAI's chat overheads).
func promptTokens(t *testing.T) int64 {
	t.Helper()
	c, _ := json.Marshal(content)
	n, err := tokencount.Chat([]tokencount.Message{{Content: c}})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// rig is one gateway on a fake clock in front of one simulator.
type rig struct {
	t     *testing.T
	fc    *clocktesting.FakeClock
	reg   *registry.Registry
	store *jobs.MemStore
	gw    *httptest.Server
	sim   *providersim.Server
}

func newRig(t *testing.T, fault providersim.Fault) *rig {
	t.Helper()
	sim := providersim.New(providersim.Config{TokensPerMinute: 10_000_000, RequestsPerMinute: 100_000, OutputTokens: generated, Fault: fault})
	simSrv := httptest.NewServer(sim)
	t.Cleanup(simSrv.Close)

	fc := clocktesting.NewFakeClock(t0)
	reg := registry.New(fc)
	if err := reg.SetPool(registry.PoolPolicy{Name: "pool", BaseURL: simSrv.URL,
		Models:    []registry.ModelPolicy{{Name: model, TokensPerMinute: 10_000_000, RequestsPerMinute: 100_000}},
		CostModel: limiter.CostModel{InputWeight: wIn, OutputWeight: wOut, KVBlockTokens: 16}, DefaultMaxOutputTokens: 4096,
		UpstreamTimeout: upstreamTimeout}); err != nil {
		t.Fatal(err)
	}
	i64 := func(v int64) *int64 { return &v }
	if err := reg.UpsertTenant(registry.TenantPolicy{ID: tenantID, Name: tenantID, Weight: 1, MaxQueued: 10, DefaultDeadline: time.Hour,
		Limits: limiter.Limits{WeightedPerMinute: i64(1), WeightedBurst: i64(capacity), MaxConcurrent: i64(4), MaxKVBlocks: i64(1000),
			RequestsPerMinute: i64(1), RequestBurst: i64(requestCapacity)},
		KeyHashes: []registry.KeyHash{registry.HashKey(key)}}); err != nil {
		t.Fatal(err)
	}
	reg.SetTenantsSynced()
	store := jobs.NewMemStore(fc, 0, 0)
	g := gateway.New(gateway.Options{Registry: reg, Clock: fc, ProviderKey: "sk-provider", Store: store, UpstreamConcurrency: 4,
		Rand: func() float64 { return 0 }})
	srv := httptest.NewServer(g)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		srv.Close()
	})
	return &rig{t: t, fc: fc, reg: reg, store: store, gw: srv, sim: sim}
}

func chatBody(stream bool) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d,"stream":%t}`, model, content, maxTokens, stream)
}

var client = &http.Client{Timeout: 15 * time.Second}

func (r *rig) post(path, body string) *http.Response {
	r.t.Helper()
	req, err := http.NewRequest(http.MethodPost, r.gw.URL+path, strings.NewReader(body))
	if err != nil {
		r.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	return resp
}

// level is the tenant's weighted bucket level.
func (r *rig) level() int64 {
	return r.reg.Tenant(tenantID).Limiter.Snapshot(r.fc.Now()).TokensRemaining
}

// runJob submits a batch job and drives the fake clock while the job waits
// for a retry backoff or the end of a pause (status queued) until it ends.
func (r *rig) runJob() jobs.Job {
	r.t.Helper()
	resp := r.post("/v1/jobs", `{"endpoint":"/v1/chat/completions","body":`+chatBody(false)+`}`)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		r.t.Fatalf("submit: %d %s", resp.StatusCode, b)
	}
	var v struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		r.t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		j, err := r.store.Get(v.ID)
		if err != nil {
			r.t.Fatal(err)
		}
		if j.Status.Finished() {
			return j
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("job still %s after 20 s (fake now %s)", j.Status, r.fc.Now().Sub(t0))
		}
		if j.Status == jobs.StatusQueued && j.Attempts > 0 && r.fc.HasWaiters() {
			r.fc.Step(250 * time.Millisecond)
		}
		time.Sleep(time.Millisecond)
	}
}

// sseResult is what a client read of a stream.
type sseResult struct {
	contents []string // delta contents, in order
	done     bool     // "data: [DONE]" seen
	usage    bool     // a usage chunk seen
	err      error    // the read error (nil: clean end)
}

func readSSE(body io.Reader) sseResult {
	var res sseResult
	br := bufio.NewReader(body)
	for {
		line, err := br.ReadBytes('\n')
		if data, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:")); ok {
			data = bytes.TrimSpace(data)
			if string(data) == "[DONE]" {
				res.done = true
			} else {
				var ch struct {
					Choices []struct {
						Delta struct {
							Content string `json:"content"`
						} `json:"delta"`
					} `json:"choices"`
					Usage json.RawMessage `json:"usage"`
				}
				if json.Unmarshal(data, &ch) == nil {
					for _, c := range ch.Choices {
						if c.Delta.Content != "" {
							res.contents = append(res.contents, c.Delta.Content)
						}
					}
					if len(ch.Usage) > 0 && string(ch.Usage) != "null" {
						res.usage = true
					}
				}
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				res.err = err
			}
			return res
		}
	}
}

// countedTokens is the output the gateway counts from the deltas a client
// was sent: each delta's text through the tokenizer.
func countedTokens(t *testing.T, contents []string) int64 {
	var n int64
	for _, c := range contents {
		k, err := tokencount.Text(c)
		if err != nil {
			t.Fatal(err)
		}
		n += k
	}
	return n
}

type errBody struct {
	Error struct {
		Type string `json:"type"`
		Code string `json:"code"`
	} `json:"error"`
}

// mode is the path of a row.
type mode string

const (
	interactive mode = "interactive"
	streaming   mode = "stream"
	batch       mode = "batch"
)

// settle is how a row's charge ends.
type settle int

const (
	refundAll    settle = iota // the full charge refunded: used 0
	usageKnown                 // settled to the provider's usage
	chargeStands               // usage unknown: the full charge kept
	fromDeltas                 // prompt + the output counted from the deltas sent
)

// row is one fault x path.
type row struct {
	name  string
	fault providersim.Fault
	mode  mode
	// Interactive: the client's status, error type and code ("" type: a
	// 200, or a provider body passed through), Retry-After ("" none).
	status     int
	typ, code  string
	retryAfter string
	// Streaming: the client reads a truncated stream (unexpected EOF) /
	// the stream ends with [DONE].
	truncated, done bool
	// Batch: the job's final status, error code, attempts and when it
	// ended (fake time since start; -1: not asserted).
	jobStatus jobs.Status
	jobCode   string
	attempts  int
	finished  time.Duration
	// Every path: how the charge is settled, the simulator's requests
	// (upstream attempts), and the model's pause end (0: never paused).
	settle   settle
	upstream int64
	paused   time.Duration
	// timedOut is the number of attempts sent in full that then timed out:
	// their tokens are refunded, their requests stay charged. The request
	// bucket keeps those and the last attempt's unless settle is
	// refundAll.
	timedOut int64
}

func status(code int, retryAfter string) providersim.Fault {
	return providersim.Fault{Kind: providersim.FaultStatus, Status: code, RetryAfter: retryAfter}
}

func rows() []row {
	s500 := status(500, "")
	s503 := status(503, "7")
	s502ms := providersim.Fault{Kind: providersim.FaultStatus, Status: 502, RetryAfterMs: "2500"}
	reset := providersim.Fault{Kind: providersim.FaultReset}
	hang := providersim.Fault{Kind: providersim.FaultHang, Hang: 10 * time.Second}
	malformed := providersim.Fault{Kind: providersim.FaultMalformed}
	cut := providersim.Fault{Kind: providersim.FaultCut, Frames: 3}
	noUsage := providersim.Fault{Kind: providersim.FaultNoUsage}
	throttled := providersim.Fault{Kind: providersim.FaultThrottle}
	once := func(f providersim.Fault, n int64) providersim.Fault { f.Count = n; return f }
	return []row{
		// 5xx: passed through with the provider's body, refunded in full,
		// not retried; Retry-After normalised to whole seconds. Batch:
		// retried with backoff (0.5 s, 1 s with jitter 0), never sooner
		// than the provider's Retry-After.
		{name: "500", fault: s500, mode: interactive, status: 500, settle: refundAll, upstream: 1},
		{name: "500", fault: s500, mode: streaming, status: 500, settle: refundAll, upstream: 1},
		{name: "500x2", fault: once(s500, 2), mode: batch, jobStatus: jobs.StatusSucceeded, attempts: 3, finished: 1500 * time.Millisecond, settle: usageKnown, upstream: 3},
		{name: "503-retry-after-7", fault: s503, mode: interactive, status: 503, retryAfter: "7", settle: refundAll, upstream: 1},
		{name: "503-retry-after-7", fault: s503, mode: streaming, status: 503, retryAfter: "7", settle: refundAll, upstream: 1},
		{name: "503-retry-after-7", fault: once(s503, 1), mode: batch, jobStatus: jobs.StatusSucceeded, attempts: 2, finished: 7 * time.Second, settle: usageKnown, upstream: 2},
		{name: "502-retry-after-ms-2500", fault: s502ms, mode: interactive, status: 502, retryAfter: "3", settle: refundAll, upstream: 1},
		{name: "502-retry-after-ms-2500", fault: s502ms, mode: streaming, status: 502, retryAfter: "3", settle: refundAll, upstream: 1},
		{name: "502-retry-after-ms-2500", fault: once(s502ms, 1), mode: batch, jobStatus: jobs.StatusSucceeded, attempts: 2, finished: 2500 * time.Millisecond, settle: usageKnown, upstream: 2},
		// Connection reset before the response: 502, refunded, batch retried.
		{name: "reset", fault: reset, mode: interactive, status: 502, typ: "api_error", code: "upstream_unavailable", settle: refundAll, upstream: 1},
		{name: "reset", fault: reset, mode: streaming, status: 502, typ: "api_error", code: "upstream_unavailable", settle: refundAll, upstream: 1},
		{name: "reset", fault: once(reset, 1), mode: batch, jobStatus: jobs.StatusSucceeded, attempts: 2, finished: 500 * time.Millisecond, settle: usageKnown, upstream: 2},
		// A hang past the pool's timeout: 504, refunded, batch retried.
		// The request stays charged: the provider received it.
		{name: "hang", fault: hang, mode: interactive, status: 504, typ: "api_error", code: "upstream_timeout", settle: refundAll, upstream: 1, timedOut: 1},
		{name: "hang", fault: hang, mode: streaming, status: 504, typ: "api_error", code: "upstream_timeout", settle: refundAll, upstream: 1, timedOut: 1},
		{name: "hang", fault: once(hang, 1), mode: batch, jobStatus: jobs.StatusSucceeded, attempts: 2, finished: 500 * time.Millisecond, settle: usageKnown, upstream: 2, timedOut: 1},
		// A 200 whose body is not JSON: 502, the provider did the work and
		// its usage is unknown, so the charge stands; never retried.
		{name: "malformed", fault: malformed, mode: interactive, status: 502, typ: "api_error", code: "upstream_invalid_response", settle: chargeStands, upstream: 1},
		{name: "malformed", fault: malformed, mode: streaming, status: 502, typ: "api_error", code: "upstream_invalid_response", settle: chargeStands, upstream: 1},
		{name: "malformed", fault: malformed, mode: batch, jobStatus: jobs.StatusFailed, jobCode: "upstream_error", attempts: 1, finished: 0, settle: chargeStands, upstream: 1},
		// Cut mid-way: a JSON body broken off is a 502 with the charge
		// kept; a stream cut after 3 frames reaches the client truncated
		// and is settled from the deltas sent.
		{name: "cut", fault: cut, mode: interactive, status: 502, typ: "api_error", code: "upstream_unavailable", settle: chargeStands, upstream: 1},
		{name: "cut-after-3-frames", fault: cut, mode: streaming, status: 200, truncated: true, settle: fromDeltas, upstream: 1},
		{name: "cut", fault: cut, mode: batch, jobStatus: jobs.StatusFailed, jobCode: "upstream_error", attempts: 1, finished: 0, settle: chargeStands, upstream: 1},
		// A 200 without usage: JSON keeps the charge, a stream is settled
		// from its deltas.
		{name: "no-usage", fault: noUsage, mode: interactive, status: 200, settle: chargeStands, upstream: 1},
		{name: "no-usage", fault: noUsage, mode: streaming, status: 200, done: true, settle: fromDeltas, upstream: 1},
		{name: "no-usage", fault: noUsage, mode: batch, jobStatus: jobs.StatusSucceeded, attempts: 1, finished: 0, settle: chargeStands, upstream: 1},
		// A bare 429: the model pauses for the default 1 s; the client gets
		// our 503 with Retry-After 1; the job goes back to its tenant's
		// head and is sent again after the pause (jittered, so its end is
		// not asserted), charged once.
		{name: "429-bare", fault: throttled, mode: interactive, status: 503, typ: "rate_limit_error", code: "upstream_quota_exhausted", retryAfter: "1", settle: refundAll, upstream: 1, paused: time.Second},
		{name: "429-bare", fault: throttled, mode: streaming, status: 503, typ: "rate_limit_error", code: "upstream_quota_exhausted", retryAfter: "1", settle: refundAll, upstream: 1, paused: time.Second},
		{name: "429-bare", fault: once(throttled, 1), mode: batch, jobStatus: jobs.StatusSucceeded, attempts: 2, finished: -1, settle: usageKnown, upstream: 2, paused: time.Second},
	}
}

func TestUpstreamFaults(t *testing.T) {
	for _, rw := range rows() {
		t.Run(rw.name+"/"+string(rw.mode), func(t *testing.T) {
			t.Parallel()
			runRow(t, rw)
		})
	}
}

func runRow(t *testing.T, rw row) {
	r := newRig(t, rw.fault)
	prompt := promptTokens(t)
	charge := prompt*wIn + maxTokens*wOut
	var sent []string // stream deltas the client received
	switch rw.mode {
	case interactive, streaming:
		resp := r.post("/v1/chat/completions", chatBody(rw.mode == streaming))
		if resp.StatusCode != rw.status {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			t.Fatalf("status %d, want %d: %s", resp.StatusCode, rw.status, b)
		}
		if got := resp.Header.Get("Retry-After"); got != rw.retryAfter {
			t.Errorf("Retry-After %q, want %q", got, rw.retryAfter)
		}
		if rw.mode == streaming && rw.status == 200 {
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
				t.Errorf("Content-Type %q", ct)
			}
			res := readSSE(resp.Body)
			resp.Body.Close()
			sent = res.contents
			if rw.truncated != (res.err != nil) || (rw.truncated && !errors.Is(res.err, io.ErrUnexpectedEOF) && !errors.Is(res.err, syscall.ECONNRESET)) {
				t.Errorf("stream read error %v, want truncated %t", res.err, rw.truncated)
			}
			if res.done != rw.done || res.usage {
				t.Errorf("stream [DONE] %t usage %t, want [DONE] %t, no usage", res.done, res.usage, rw.done)
			}
			if rw.fault.Kind == providersim.FaultCut && int64(len(sent)) != rw.fault.Frames {
				t.Errorf("client got %d deltas, want %d", len(sent), rw.fault.Frames)
			}
			if rw.fault.Kind == providersim.FaultNoUsage && len(sent) != generated {
				t.Errorf("client got %d deltas, want %d", len(sent), generated)
			}
			break
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if !json.Valid(b) {
			t.Errorf("client body is not JSON: %q", b)
		}
		var eb errBody
		_ = json.Unmarshal(b, &eb)
		switch {
		case rw.typ != "":
			if eb.Error.Type != rw.typ || eb.Error.Code != rw.code {
				t.Errorf("error type %q code %q, want %q %q", eb.Error.Type, eb.Error.Code, rw.typ, rw.code)
			}
		case rw.status >= 500:
			// The provider's own error body, passed through.
			if eb.Error.Type != "server_error" {
				t.Errorf("passed-through error type %q, want server_error: %s", eb.Error.Type, b)
			}
		default:
			var ok struct {
				Object string          `json:"object"`
				Usage  json.RawMessage `json:"usage"`
			}
			_ = json.Unmarshal(b, &ok)
			if ok.Object != "chat.completion" || ok.Usage != nil {
				t.Errorf("200 body object %q usage %s, want a chat.completion without usage", ok.Object, ok.Usage)
			}
		}
	case batch:
		j := r.runJob()
		if j.Status != rw.jobStatus || j.Attempts != rw.attempts {
			t.Errorf("job %s after %d attempts (error %+v), want %s after %d", j.Status, j.Attempts, j.Error, rw.jobStatus, rw.attempts)
		}
		code := ""
		if j.Error != nil {
			code = j.Error.Code
		}
		if code != rw.jobCode {
			t.Errorf("job error code %q, want %q", code, rw.jobCode)
		}
		if rw.finished >= 0 {
			if got := j.FinishedAt.Sub(t0); got != rw.finished {
				t.Errorf("job finished at +%s, want +%s", got, rw.finished)
			}
		} else if got := j.FinishedAt.Sub(t0); got < rw.paused {
			t.Errorf("job finished at +%s, before the pause ended (+%s)", got, rw.paused)
		}
		switch {
		case rw.settle == usageKnown && (j.Usage == nil || j.Usage.PromptTokens != prompt || j.Usage.CompletionTokens != generated):
			t.Errorf("job usage %+v, want %d + %d", j.Usage, prompt, generated)
		case rw.settle == chargeStands && j.Usage != nil:
			t.Errorf("job usage %+v, want none", j.Usage)
		}
		if j.Status == jobs.StatusSucceeded && !json.Valid(j.Response) {
			t.Errorf("succeeded job without a JSON response: %q", j.Response)
		}
	}

	// The refund: the tenant's bucket and usage counters.
	var used, usedIn, usedOut int64
	switch rw.settle {
	case usageKnown:
		usedIn, usedOut = prompt, generated
	case chargeStands:
		usedIn, usedOut = prompt, maxTokens
	case fromDeltas:
		usedIn, usedOut = prompt, countedTokens(t, sent)
		if usedOut == 0 {
			t.Errorf("no output counted from the deltas sent")
		}
	}
	used = usedIn*wIn + usedOut*wOut
	now := r.fc.Now()
	// Settlement runs before the response is written, and a job ends after
	// it; a stream cut by the provider is settled before the client's
	// connection is aborted. Poll briefly for the handler's return.
	deadline := time.Now().Add(5 * time.Second)
	for {
		snap := r.reg.Tenant(tenantID).Limiter.Snapshot(now)
		if (snap.InFlight == 0 && snap.KVBlocks == 0 && r.reg.Snapshot(now).InFlight == 0) || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if got, want := r.level(), int64(capacity)-used; got != want {
		t.Errorf("bucket %d, want %d (capacity %d, charge %d, used %d, refund %d)", got, want, capacity, charge, used, charge-used)
	}
	keptRequests := rw.timedOut
	if rw.settle != refundAll {
		keptRequests++ // the last attempt's
	}
	if got, want := r.reg.Tenant(tenantID).Limiter.Snapshot(now).RequestsRemaining, int64(requestCapacity)-keptRequests; got != want {
		t.Errorf("request bucket %d, want %d (capacity %d, %d requests kept)", got, want, requestCapacity, keptRequests)
	}
	u := r.reg.Tenant(tenantID).UsageWindow(now)
	if u.WeightedTokens != used || u.InputTokens != usedIn || u.OutputTokens != usedOut {
		t.Errorf("usage counters %d weighted (%d in, %d out), want %d (%d, %d)", u.WeightedTokens, u.InputTokens, u.OutputTokens, used, usedIn, usedOut)
	}
	snap := r.reg.Tenant(tenantID).Limiter.Snapshot(now)
	if snap.InFlight != 0 || snap.KVBlocks != 0 {
		t.Errorf("tenant holds %d calls and %d KV blocks, want 0", snap.InFlight, snap.KVBlocks)
	}
	if n := r.reg.Snapshot(now).InFlight; n != 0 {
		t.Errorf("pool has %d upstream calls in flight, want 0", n)
	}
	// Attempts and the pause.
	st := r.sim.Stats()
	pause := "never paused"
	if pu := r.reg.Model(model).Throttle.PausedUntil(); !pu.IsZero() {
		pause = "paused until +" + pu.Sub(t0).String()
	}
	t.Logf("figures %s: charge %d, used %d (%d in, %d out), refund %d, bucket %d, upstream attempts %d, %s",
		strings.TrimPrefix(t.Name(), "TestUpstreamFaults/"), charge, used, usedIn, usedOut, charge-used, r.level(), st.Requests, pause)
	if st.Requests != rw.upstream {
		t.Errorf("upstream attempts %d, want %d", st.Requests, rw.upstream)
	}
	wantFaults := rw.upstream
	if rw.mode == batch && rw.jobStatus == jobs.StatusSucceeded && rw.settle == usageKnown {
		wantFaults = rw.upstream - 1 // the last attempt succeeded
	}
	if st.Faults != wantFaults {
		t.Errorf("faulted attempts %d, want %d", st.Faults, wantFaults)
	}
	var wantPause time.Time
	if rw.paused > 0 {
		wantPause = t0.Add(rw.paused)
	}
	if got := r.reg.Model(model).Throttle.PausedUntil(); !got.Equal(wantPause) {
		t.Errorf("model paused until %s, want %s", got, wantPause)
	}
}
