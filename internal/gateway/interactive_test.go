package gateway

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/throttle"
)

// TestBC09_RetryAfterAndTokenHeaders: bucket capacity 10 000, refill 100/s
// (6000 per minute), 200 left; a request of 500 + 1000 = 1500 gets 429 with
// Retry-After 13 (deficit 1300 / 100) and the token dimension's headers; with
// 1490 left the 0.1 s deficit gives Retry-After 1, never 0.
func TestBC09_RetryAfterAndTokenHeaders(t *testing.T) {
	for _, tc := range []struct {
		name           string
		available      int64
		wantRetry      string
		wantRemaining  string
		wantRateLimit  string
		wantMessageEnd string
	}{
		{"deficit 13s", 200, "13", "200", `"tokens";r=200;t=13`, "Retry in 13s."},
		{"deficit 0.1s rounds up to 1", 1490, "1", "1490", `"tokens";r=1490;t=1`, "Retry in 1s."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, okJSON(1, 1))
			e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{
				WeightedPerMinute: i64(6000), WeightedBurst: i64(10000), RequestsPerMinute: i64(6000)})})
			// Drain the bucket down to tc.available with a held reservation.
			if _, rej := e.reg.Tenant("a").Limiter.Admit(t0, limiter.CostModel{InputWeight: 1, OutputWeight: 1}.Cost(10000-tc.available, 0)); rej != nil {
				t.Fatalf("draining: %+v", rej)
			}
			resp := e.do("POST", "/v1/completions", "key-a", completionsBody(500, 1000, ""))
			body := decode[errorBody](t, resp)
			if resp.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("status = %d, want 429", resp.StatusCode)
			}
			got := map[string]string{}
			for _, k := range []string{"Retry-After", "X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens",
				"X-Ratelimit-Limit-Requests", "Ratelimit", "Ratelimit-Policy"} {
				got[k] = resp.Header.Get(k)
			}
			want := map[string]string{
				"Retry-After": tc.wantRetry, "X-Ratelimit-Limit-Tokens": "6000", "X-Ratelimit-Remaining-Tokens": tc.wantRemaining,
				"X-Ratelimit-Reset-Tokens": tc.wantRetry, "X-Ratelimit-Limit-Requests": "", "Ratelimit": tc.wantRateLimit,
				"Ratelimit-Policy": `"tokens";q=6000;qu="tokens";w=60`,
			}
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("headers (-want +got):\n%s", d)
			}
			wantBody := errorDetail{Type: "rate_limit_error", Code: "token_rate_limit",
				Message: "Rate limit exceeded: 6000 weighted tokens per minute. " + tc.wantMessageEnd}
			if d := cmp.Diff(wantBody, body.Error); d != "" {
				t.Errorf("body (-want +got):\n%s", d)
			}
			if n := up.calls.Load(); n != 0 {
				t.Errorf("upstream calls = %d, want 0", n)
			}
		})
	}
}

// TestBC10_NeverFitsIs413: bucket capacity 8000; 3000 + 6000 = 9000 can
// never fit: 413 request_too_large without Retry-After, nothing charged.
func TestBC10_NeverFitsIs413(t *testing.T) {
	up := newUpstream(t, okJSON(1, 1))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(48000), WeightedBurst: i64(8000)})})
	resp := e.do("POST", "/v1/completions", "key-a", completionsBody(3000, 6000, ""))
	body := decode[errorBody](t, resp)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || body.Error.Code != "request_too_large" || body.Error.Type != "invalid_request_error" {
		t.Fatalf("got %d %+v, want 413 request_too_large", resp.StatusCode, body.Error)
	}
	if ra := resp.Header.Get("Retry-After"); ra != "" {
		t.Errorf("Retry-After = %q, want none", ra)
	}
	if got := e.tokensLeft("a"); got != 8000 {
		t.Errorf("bucket = %d, want 8000", got)
	}
}

// TestInteractiveNonStreaming: the request is proxied with the provider key
// (the tenant key stripped), usage refunds the unused output, and the
// response carries the tenant's quota headers, not the provider's.
func TestInteractiveNonStreaming(t *testing.T) {
	up := newUpstream(t, okJSON(100, 50))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(60000), WeightedBurst: i64(10000)})})
	resp := e.do("POST", "/v1/completions", "key-a", completionsBody(100, 1000, ""))
	b := readAll(t, resp)
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"completion_tokens":50`) {
		t.Fatalf("got %d %s", resp.StatusCode, b)
	}
	if got, want := e.tokensLeft("a"), int64(10000-150); got != want {
		t.Errorf("bucket = %d, want %d (charge 1100, refund 950)", got, want)
	}
	h := up.headers[0]
	if got := h.Get("Authorization"); got != "Bearer sk-provider-secret" {
		t.Errorf("upstream Authorization = %q", got)
	}
	if got := resp.Header.Get("X-Ratelimit-Remaining-Tokens"); got != "9850" {
		t.Errorf("X-RateLimit-Remaining-Tokens = %q, want 9850 (the tenant's)", got)
	}
	if got := resp.Header.Get("X-Ratelimit-Limit-Tokens"); got != "60000" {
		t.Errorf("X-RateLimit-Limit-Tokens = %q, want 60000 (the tenant's)", got)
	}
	if s := e.reg.Tenant("a").Limiter.Snapshot(t0); s.InFlight != 0 || s.KVBlocks != 0 {
		t.Errorf("after the call: %+v, want nothing in flight", s)
	}
}

// TestBC24_StreamAndNonStreamLeaveSameBucket: prompt 1000, max_tokens 2000,
// output 1500, bucket 10 000: both paths leave 7500 (charge 3000, refund
// 500); five streams exhaust the bucket like five non-streaming calls.
func TestBC24_StreamAndNonStreamLeaveSameBucket(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "non-streaming", true: "streaming"}[stream], func(t *testing.T) {
			h := okJSON(1000, 1500)
			extra := ""
			if stream {
				h, extra = sseStream(1500, 1000), `,"stream":true`
			}
			e := newEnv(t, newUpstream(t, h), []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(60000), WeightedBurst: i64(10000)})})
			var lefts []int64
			var codes []int
			for range 5 {
				resp := e.do("POST", "/v1/completions", "key-a", completionsBody(1000, 2000, extra))
				readAll(t, resp)
				codes = append(codes, resp.StatusCode)
				lefts = append(lefts, e.tokensLeft("a"))
			}
			if d := cmp.Diff([]int{200, 200, 200, 429, 429}, codes); d != "" {
				t.Errorf("statuses (-want +got):\n%s", d)
			}
			if d := cmp.Diff([]int64{7500, 5000, 2500, 2500, 2500}, lefts); d != "" {
				t.Errorf("bucket after each call (-want +got):\n%s", d)
			}
		})
	}
}

// readEvents returns the data payloads of an SSE body.
func readEvents(t *testing.T, resp *http.Response) []string {
	t.Helper()
	defer resp.Body.Close()
	var out []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, d)
		}
	}
	return out
}

// TestStreamUsageChunkHiddenWhenNotAsked: the gateway injects
// stream_options.include_usage upstream and drops the usage-only chunk for a
// client that did not ask; a client that asked gets it.
//
// Member names are exact, as the providers read them: "Include_Usage" does
// not ask (the gateway still asks upstream, so the call is settled from the
// provider's usage); stream_options null is no options (it once made the
// handler panic on a nil map).
func TestStreamUsageChunkHiddenWhenNotAsked(t *testing.T) {
	for _, c := range []struct {
		name    string
		options string // stream_options, "" for none
		asked   bool
	}{
		{"not asked", "", false},
		{"asked", `{"include_usage":true}`, true},
		{"null options", `null`, false},
		{"asked false", `{"include_usage":false,"x":1}`, false},
		{"null include_usage", `{"include_usage":null}`, false},
		{"other case", `{"Include_Usage":true}`, false},
	} {
		asked := c.asked
		t.Run(c.name, func(t *testing.T) {
			up := newUpstream(t, sseStream(3, 10))
			e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(60000), WeightedBurst: i64(10000)})})
			extra := `,"stream":true`
			if c.options != "" {
				extra += `,"stream_options":` + c.options
			}
			resp := e.do("POST", "/v1/completions", "key-a", completionsBody(10, 100, extra))
			if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
				t.Errorf("Content-Type = %q", ct)
			}
			events := readEvents(t, resp)
			wantN := 6 // 3 tokens, finish, usage, [DONE]
			if !asked {
				wantN = 5
			}
			if len(events) != wantN || events[len(events)-1] != "[DONE]" {
				t.Fatalf("events = %q, want %d ending in [DONE]", events, wantN)
			}
			hasUsage := strings.Contains(strings.Join(events, "\n"), `"usage"`)
			if hasUsage != asked {
				t.Errorf("usage chunk forwarded = %v, want %v", hasUsage, asked)
			}
			so, _ := up.lastBody()["stream_options"].(map[string]any)
			if so["include_usage"] != true {
				t.Errorf("upstream stream_options = %v, want include_usage true", so)
			}
			if got, want := e.tokensLeft("a"), int64(10000-13); got != want {
				t.Errorf("bucket = %d, want %d (refunded from the usage chunk)", got, want)
			}
		})
	}
}

// TestBC28_OutputReservation: (a) a stream without usage is charged from its
// counted deltas (200 + 800 generated, never just the prompt); (b) max_completion_tokens 1 and
// max_tokens 4096 charge the larger, 100 + 4096; (c) neither charges the
// pool default 4096.
func TestBC28_OutputReservation(t *testing.T) {
	noUsage := func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		for range 800 {
			w.Write([]byte("data: {\"choices\":[{\"delta\":{\"content\":\" x\"}}]}\n\n"))
		}
		w.Write([]byte("data: [DONE]\n\n"))
	}
	for _, tc := range []struct {
		name       string
		handler    func(w http.ResponseWriter, r *http.Request, body []byte)
		body       string
		wantCharge int64
	}{
		{"a stream without usage", noUsage, completionsBody(200, 1000, `,"stream":true`), 1000},
		{"b both fields: the larger", nil, completionsBody(100, 4096, `,"max_completion_tokens":1`), 4196},
		{"c neither field: pool default", nil, `{"model":"` + testModel + `","prompt":[` + strings.Repeat("1,", 99) + `1]}`, 4196},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var charged int64
			h := tc.handler
			if h == nil {
				// Answer without usage so that the charge stands and is visible.
				h = func(w http.ResponseWriter, r *http.Request, body []byte) {
					w.Header().Set("Content-Type", "application/json")
					w.Write([]byte(`{"choices":[]}`))
				}
			}
			e := newEnv(t, newUpstream(t, h), []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(600000), WeightedBurst: i64(100000)})})
			resp := e.do("POST", "/v1/completions", "key-a", tc.body)
			readAll(t, resp)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			charged = 100000 - e.tokensLeft("a")
			if charged != tc.wantCharge {
				t.Errorf("charged %d, want %d", charged, tc.wantCharge)
			}
		})
	}
}

// TestBC22_RefusalsAndUpstreamErrorsRefund: a throttle refusal (paused
// pool) is 503 upstream_quota_exhausted and the bucket is whole again, the
// second identical request too (not 429); upstream 500 passes through with a
// full refund; upstream 429 refunds, answers 503 with Retry-After and pauses
// the model so the next call is refused without reaching the provider.
func TestBC22_RefusalsAndUpstreamErrorsRefund(t *testing.T) {
	limits := limiter.Limits{WeightedPerMinute: i64(6000), WeightedBurst: i64(1000), RequestsPerMinute: i64(600)}
	t.Run("throttle paused", func(t *testing.T) {
		up := newUpstream(t, okJSON(1, 1))
		e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limits)})
		m := e.reg.Model(testModel)
		p, ok, _ := m.Throttle.TryStart(t0, 1, throttle.Interactive)
		if !ok {
			t.Fatal("probe refused")
		}
		m.Throttle.OnTooManyRequests(t0, p, throttle.Quota{RetryAfter: 30 * time.Second, HasRetryAfter: true})
		for i := range 2 {
			resp := e.do("POST", "/v1/completions", "key-a", completionsBody(100, 500, ""))
			body := decode[errorBody](t, resp)
			if resp.StatusCode != 503 || body.Error.Code != "upstream_quota_exhausted" {
				t.Fatalf("request %d: %d %+v, want 503 upstream_quota_exhausted", i, resp.StatusCode, body.Error)
			}
			if ra := resp.Header.Get("Retry-After"); ra != "30" && ra != "31" {
				t.Errorf("Retry-After = %q, want 30 (+ jitter)", ra)
			}
			if got := e.tokensLeft("a"); got != 1000 {
				t.Errorf("request %d: bucket = %d, want 1000", i, got)
			}
		}
		if snap := e.reg.Tenant("a").Limiter.Snapshot(t0); snap.RequestsRemaining != 100 {
			t.Errorf("request bucket = %d, want 100 (refunded)", snap.RequestsRemaining)
		}
		if n := up.calls.Load(); n != 0 {
			t.Errorf("upstream calls = %d, want 0", n)
		}
	})
	t.Run("upstream 500", func(t *testing.T) {
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(500)
			w.Write([]byte(`{"error":{"message":"boom","type":"server_error"}}`))
		})
		e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limits)})
		resp := e.do("POST", "/v1/completions", "key-a", completionsBody(100, 500, ""))
		b := readAll(t, resp)
		if resp.StatusCode != 500 || !strings.Contains(string(b), "boom") {
			t.Fatalf("got %d %s, want the upstream 500 passed through", resp.StatusCode, b)
		}
		if got := e.tokensLeft("a"); got != 1000 {
			t.Errorf("bucket = %d, want 1000", got)
		}
	})
	t.Run("upstream 429", func(t *testing.T) {
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
			w.Header().Set("Retry-After", "20")
			w.WriteHeader(429)
			w.Write([]byte(`{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}`))
		})
		e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limits)})
		resp := e.do("POST", "/v1/completions", "key-a", completionsBody(100, 500, ""))
		body := decode[errorBody](t, resp)
		if resp.StatusCode != 503 || body.Error.Code != "upstream_quota_exhausted" || resp.Header.Get("Retry-After") != "20" {
			t.Fatalf("got %d %+v Retry-After %q, want 503 upstream_quota_exhausted 20", resp.StatusCode, body.Error, resp.Header.Get("Retry-After"))
		}
		if got := e.tokensLeft("a"); got != 1000 {
			t.Errorf("bucket = %d, want 1000", got)
		}
		resp = e.do("POST", "/v1/completions", "key-a", completionsBody(100, 500, ""))
		readAll(t, resp)
		if resp.StatusCode != 503 || up.calls.Load() != 1 {
			t.Errorf("second call: %d with %d upstream calls, want 503 and 1 (paused)", resp.StatusCode, up.calls.Load())
		}
	})
}

// TestBC29_AdmissionBeforeFirstByte: a bucket of 15 tokens nearly drained;
// a stream with max_tokens 50 gets a clean 429 with Retry-After and no
// upstream call, never a truncated 200 stream; with room it gets a complete
// stream.
func TestBC29_AdmissionBeforeFirstByte(t *testing.T) {
	up := newUpstream(t, sseStream(5, 1))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(30), WeightedBurst: i64(15)})})
	resp := e.do("POST", "/v1/completions", "key-a", completionsBody(1, 50, `,"stream":true`))
	body := decode[errorBody](t, resp)
	if resp.StatusCode != 413 || body.Error.Code != "request_too_large" {
		t.Fatalf("51 tokens against a burst of 15: %d %+v, want 413", resp.StatusCode, body.Error)
	}
	resp = e.do("POST", "/v1/completions", "key-a", completionsBody(1, 10, `,"stream":true`))
	events := readEvents(t, resp)
	if resp.StatusCode != 200 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("got %d %q, want a complete stream", resp.StatusCode, events)
	}
	resp = e.do("POST", "/v1/completions", "key-a", completionsBody(1, 14, `,"stream":true`))
	readAll(t, resp)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("drained: %d Retry-After %q, want a clean 429", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if n := up.calls.Load(); n != 1 {
		t.Errorf("upstream calls = %d, want 1", n)
	}
}

// TestIdentification: API keys (missing and wrong keys 401
// invalid_api_key, never echoed) and the trusted header (unknown 401
// unknown_tenant; the header is stripped upstream).
func TestIdentification(t *testing.T) {
	t.Run("api key", func(t *testing.T) {
		up := newUpstream(t, okJSON(1, 1))
		e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
		for _, key := range []string{"", "key-wrong-SECRET"} {
			resp := e.do("POST", "/v1/completions", key, completionsBody(1, 1, ""))
			b := readAll(t, resp)
			if resp.StatusCode != 401 || !strings.Contains(string(b), `"code":"invalid_api_key"`) {
				t.Errorf("key %q: %d %s, want 401 invalid_api_key", key, resp.StatusCode, b)
			}
			if key != "" && strings.Contains(string(b), key) {
				t.Errorf("the key is echoed: %s", b)
			}
		}
		resp := e.do("POST", "/v1/completions", "key-a", completionsBody(1, 1, ""))
		readAll(t, resp)
		if resp.StatusCode != 200 {
			t.Fatalf("right key: %d", resp.StatusCode)
		}
		if got := up.headers[0].Get("Authorization"); got != "Bearer sk-provider-secret" {
			t.Errorf("upstream Authorization = %q, want the provider key only", got)
		}
	})
	t.Run("trusted header", func(t *testing.T) {
		up := newUpstream(t, okJSON(1, 1))
		e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})}, withPool(func(p *registry.PoolPolicy) {
			p.IdentMode, p.IdentHeader = registry.IdentifyTrustedHeader, "X-Tenant"
		}))
		send := func(id string) *http.Response {
			req, _ := http.NewRequestWithContext(context.Background(), "POST", e.srv.URL+"/v1/completions", strings.NewReader(completionsBody(1, 1, "")))
			if id != "" {
				req.Header.Set("X-Tenant", id)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			return resp
		}
		for _, id := range []string{"", "nobody"} {
			resp := send(id)
			b := readAll(t, resp)
			if resp.StatusCode != 401 || !strings.Contains(string(b), `"code":"unknown_tenant"`) {
				t.Errorf("header %q: %d %s, want 401 unknown_tenant", id, resp.StatusCode, b)
			}
		}
		resp := send("a")
		readAll(t, resp)
		if resp.StatusCode != 200 {
			t.Fatalf("tenant a: %d", resp.StatusCode)
		}
		if got := up.headers[0].Get("X-Tenant"); got != "" {
			t.Errorf("trusted header forwarded upstream: %q", got)
		}
	})
}

// TestRequestValidation: bounded body, malformed JSON and unknown model.
func TestRequestValidation(t *testing.T) {
	up := newUpstream(t, okJSON(1, 1))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
	for _, tc := range []struct {
		name, body string
		wantStatus int
		wantCode   string
	}{
		{"malformed", `{"model":`, 400, "invalid_json"},
		{"unknown model", `{"model":"other","prompt":"hi"}`, 400, "model_not_found"},
		{"too large", `{"model":"` + testModel + `","prompt":"` + strings.Repeat("x", DefaultMaxBodyBytes) + `"}`, 413, "body_too_large"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := e.do("POST", "/v1/completions", "key-a", tc.body)
			body := decode[errorBody](t, resp)
			if resp.StatusCode != tc.wantStatus || body.Error.Code != tc.wantCode {
				t.Errorf("got %d %q, want %d %q", resp.StatusCode, body.Error.Code, tc.wantStatus, tc.wantCode)
			}
		})
	}
	if up.calls.Load() != 0 {
		t.Errorf("upstream called")
	}
}

// TestBC23_ClientDisconnectMidStreamSettles: the client goes away after the
// first frame; the upstream call is cancelled and the reservation is
// settled all the same (slot and KV blocks released; without usage the
// charge stands, BC-28a).
func TestBC23_ClientDisconnectMidStreamSettles(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		for range 400 {
			w.Write([]byte("data: {\"choices\":[{\"delta\":{\"content\":\" x\"}}]}\n\n"))
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(600000), WeightedBurst: i64(10000), MaxConcurrent: i64(1)})})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", e.srv.URL+"/v1/completions", strings.NewReader(completionsBody(200, 1000, `,"stream":true`)))
	req.Header.Set("Authorization", "Bearer key-a")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	for i := range 400 {
		line, err := br.ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "data: ") {
			t.Fatalf("frame %d: %q, %v", i, line, err)
		}
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	resp.Body.Close()
	waitFor(t, "the reservation to be settled", func() bool { return e.reg.Tenant("a").Limiter.Snapshot(t0).InFlight == 0 })
	if s := e.reg.Tenant("a").Limiter.Snapshot(t0); s.KVBlocks != 0 {
		t.Errorf("KV blocks held after the disconnect: %d", s.KVBlocks)
	}
	// Charged prompt 200 + the 400 tokens generated; the other 600 of the
	// output reservation are refunded.
	if got := e.tokensLeft("a"); got != 10000-600 {
		t.Errorf("bucket = %d, want %d (prompt + 400 generated)", got, 10000-600)
	}
}
