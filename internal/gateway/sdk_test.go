package gateway

// The official OpenAI Go SDK (github.com/openai/openai-go/v3) as the client
// of the gateway, unmodified: the issue asks that its built-in retry works
// against our refusals without custom code.
//
// What the SDK does (v3.98.0, internal/requestconfig): it retries 408, 409,
// 429 and every 5xx (or what `x-should-retry: true` names), at most
// MaxRetries = 2 times; the wait is Retry-After-Ms, else Retry-After
// (seconds, or an HTTP date), else exponential backoff from 0.5 s with
// jitter. A server-named wait above MaxRetryDelay (2 minutes by default)
// ends the retries at once and returns the refusal. 400, 401, 403 and 413
// are never retried. The gateway sends Retry-After only (whole seconds,
// rounded up, at least 1), so the SDK waits exactly the advertised time.
//
// These tests run on the real clock because the SDK sleeps in real time;
// each retry case waits one Retry-After of 1 s, and they run in parallel.

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/metrics"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// exchange is one request the gateway answered, as seen on the wire.
type exchange struct {
	path       string
	status     int
	retryCount string // X-Stainless-Retry-Count of the request
	retryAfter string // Retry-After of the response
	received   time.Time
	answered   time.Time
}

// wireLog records every exchange of the gateway's HTTP server.
type wireLog struct {
	mu  sync.Mutex
	all []exchange
}

func (l *wireLog) exchanges() []exchange {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]exchange(nil), l.all...)
}

func (l *wireLog) statuses() []int {
	var s []int
	for _, x := range l.exchanges() {
		s = append(s, x.status)
	}
	return s
}

// statusRecorder captures the status of a response; it unwraps to the real
// writer so that http.ResponseController can flush streams.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// realEnv is a gateway on the real clock behind a recording server.
type realEnv struct {
	reg *registry.Registry
	gw  *Gateway
	srv *httptest.Server
	log *wireLog
}

func newRealEnv(t *testing.T, up *upstream, tenants []registry.TenantPolicy) *realEnv {
	t.Helper()
	clk := clock.RealClock{}
	reg := registry.New(clk)
	if err := reg.SetPool(registry.PoolPolicy{Name: "pool", BaseURL: up.srv.URL,
		Models:    []registry.ModelPolicy{{Name: testModel, TokensPerMinute: 1000000, RequestsPerMinute: 10000}},
		CostModel: limiter.CostModel{InputWeight: 1, OutputWeight: 1}, DefaultMaxOutputTokens: 4096, UpstreamTimeout: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	for _, tp := range tenants {
		if err := reg.UpsertTenant(tp); err != nil {
			t.Fatal(err)
		}
	}
	reg.SetTenantsSynced()
	gw := New(Options{Registry: reg, Clock: clk, ProviderKey: "sk-provider-secret", Store: jobs.NewMemStore(clk, 0, 0),
		Metrics: metrics.New(prometheus.NewRegistry(), nil), Rand: func() float64 { return 0 }})
	log := &wireLog{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		x := exchange{path: r.URL.Path, retryCount: r.Header.Get("X-Stainless-Retry-Count"), received: time.Now()}
		rec := &statusRecorder{ResponseWriter: w}
		gw.ServeHTTP(rec, r)
		x.status, x.retryAfter, x.answered = rec.status, w.Header().Get("Retry-After"), time.Now()
		log.mu.Lock()
		log.all = append(log.all, x)
		log.mu.Unlock()
	}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = gw.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		srv.Close()
	})
	return &realEnv{reg: reg, gw: gw, srv: srv, log: log}
}

// client is an SDK client with its defaults (MaxRetries 2, no custom retry
// code), pointed at the gateway with the tenant key.
func (e *realEnv) client(key string) openai.Client {
	return openai.NewClient(option.WithBaseURL(e.srv.URL+"/v1/"), option.WithAPIKey(key))
}

// chatParams is a small chat request with max_tokens.
func chatParams(model string, maxTokens int64) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:     model,
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hi.")},
		MaxTokens: openai.Int(maxTokens),
	}
}

// TestSDKChatCompletion: a chat completion through the SDK succeeds, returns
// the provider's usage and carries the tenant's quota fields. The tenant
// refills 1 weighted token and 1 request per second, so the figures read
// right after the call are exact (the call takes far less than a second).
func TestSDKChatCompletion(t *testing.T) {
	up := newUpstream(t, okJSON(12, 5))
	e := newRealEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{
		WeightedPerMinute: i64(60), WeightedBurst: i64(10000), RequestsPerMinute: i64(60), RequestBurst: i64(10)})})
	var raw *http.Response
	c := e.client("key-a")
	resp, err := c.Chat.Completions.New(context.Background(), chatParams(testModel, 100), option.WithResponseInto(&raw))
	if err != nil {
		t.Fatal(err)
	}
	if got := []int64{resp.Usage.PromptTokens, resp.Usage.CompletionTokens, resp.Usage.TotalTokens}; got[0] != 12 || got[1] != 5 || got[2] != 17 {
		t.Errorf("usage = %v, want [12 5 17]", got)
	}
	if len(resp.Choices) != 1 || resp.Choices[0].Message.Content != "hi" {
		t.Errorf("choices = %+v, want one with content \"hi\"", resp.Choices)
	}
	// Settled to 17 of 10 000; 1 of 10 requests used. Reset: 17 tokens at
	// 1/s, 1 request at 1/s.
	want := map[string]string{
		"X-Ratelimit-Limit-Tokens": "60", "X-Ratelimit-Remaining-Tokens": "9983", "X-Ratelimit-Reset-Tokens": "17",
		"X-Ratelimit-Limit-Requests": "60", "X-Ratelimit-Remaining-Requests": "9", "X-Ratelimit-Reset-Requests": "1",
		"Ratelimit":        `"tokens";r=9983;t=17, "requests";r=9;t=1`,
		"Ratelimit-Policy": `"tokens";q=60;qu="tokens";w=60, "requests";q=60;w=60`,
	}
	for k, v := range want {
		if got := raw.Header.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if got := e.log.statuses(); len(got) != 1 || got[0] != 200 {
		t.Errorf("gateway answered %v, want [200]", got)
	}
	if n := up.calls.Load(); n != 1 {
		t.Errorf("upstream calls = %d, want 1", n)
	}
}

// TestSDKRetriesAfterRetryAfter: with the tenant's token bucket, its request
// bucket, or the pool's provider quota empty, the gateway refuses with
// Retry-After: 1 (429 for the tenant's limits, 503 for the pool) and the
// SDK's default retry waits that second and succeeds on its second attempt:
// exactly one refusal and one 200 reach the wire, the retry carries
// X-Stainless-Retry-Count 1 and comes at least 1 s after the refusal (the
// SDK's own backoff would have come after 0.375-0.5 s and been refused
// again).
func TestSDKRetriesAfterRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		name          string
		limits        limiter.Limits
		drain         limiter.Cost // charged (and held) before the call
		wantStatuses  []int
		wantUpstream  int64
		wantRetryWait time.Duration
	}{
		{
			// 1000 tokens per second, bucket 1000, drained: the ~110-token
			// request is short by ~0.11 s, Retry-After 1.
			name:         "token bucket empty: 429 token_rate_limit",
			limits:       limiter.Limits{WeightedPerMinute: i64(60000), WeightedBurst: i64(1000)},
			drain:        limiter.CostModel{InputWeight: 1, OutputWeight: 1}.Cost(1000, 0),
			wantStatuses: []int{429, 200}, wantUpstream: 1, wantRetryWait: time.Second,
		},
		{
			// One request per second, bucket 1, drained: Retry-After 1.
			name:         "request bucket empty: 429 request_rate_limit",
			limits:       limiter.Limits{RequestsPerMinute: i64(60), RequestBurst: i64(1)},
			drain:        limiter.CostModel{InputWeight: 1, OutputWeight: 1}.Cost(0, 0),
			wantStatuses: []int{429, 200}, wantUpstream: 1, wantRetryWait: time.Second,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			up := newUpstream(t, okJSON(10, 2))
			e := newRealEnv(t, up, []registry.TenantPolicy{tenant("a", tc.limits)})
			if _, rej := e.reg.Tenant("a").Limiter.Admit(time.Now(), tc.drain); rej != nil {
				t.Fatalf("draining: %+v", rej)
			}
			c := e.client("key-a")
			resp, err := c.Chat.Completions.New(context.Background(), chatParams(testModel, 100))
			if err != nil {
				t.Fatalf("SDK call failed after its retries: %v; wire %+v", err, e.log.exchanges())
			}
			if resp.Usage.TotalTokens != 12 {
				t.Errorf("usage total = %d, want 12", resp.Usage.TotalTokens)
			}
			checkRetryExchanges(t, e.log.exchanges(), tc.wantStatuses, tc.wantRetryWait)
			if n := up.calls.Load(); n != tc.wantUpstream {
				t.Errorf("upstream calls = %d, want %d", n, tc.wantUpstream)
			}
		})
	}
	t.Run("provider quota paused: 503 upstream_quota_exhausted", func(t *testing.T) {
		t.Parallel()
		// The provider answers the first call 429 with Retry-After 1: the
		// gateway pauses the model and answers 503 with Retry-After 1; the
		// SDK retries 5xx, after that second the model is resumed and the
		// provider answers 200.
		var once sync.Once
		ok := okJSON(10, 2)
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
			first := false
			once.Do(func() { first = true })
			if first {
				w.Header().Set("Retry-After", "1")
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusTooManyRequests)
				_, _ = w.Write([]byte(`{"error":{"message":"Rate limit reached for requests","type":"requests","param":null,"code":"rate_limit_exceeded"}}`))
				return
			}
			ok(w, r, body)
		})
		e := newRealEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(60000)})})
		c := e.client("key-a")
		resp, err := c.Chat.Completions.New(context.Background(), chatParams(testModel, 100))
		if err != nil {
			t.Fatalf("SDK call failed after its retries: %v; wire %+v", err, e.log.exchanges())
		}
		if resp.Usage.TotalTokens != 12 {
			t.Errorf("usage total = %d, want 12", resp.Usage.TotalTokens)
		}
		checkRetryExchanges(t, e.log.exchanges(), []int{503, 200}, time.Second)
		if n := up.calls.Load(); n != 2 {
			t.Errorf("upstream calls = %d, want 2 (the throttled one and the retry)", n)
		}
	})
}

// checkRetryExchanges checks a refusal with Retry-After "1" followed by the
// SDK's retry, wait later.
func checkRetryExchanges(t *testing.T, xs []exchange, wantStatuses []int, wait time.Duration) {
	t.Helper()
	var got []int
	for _, x := range xs {
		got = append(got, x.status)
	}
	if len(got) != len(wantStatuses) {
		t.Fatalf("gateway answered %v, want %v", got, wantStatuses)
	}
	for i := range got {
		if got[i] != wantStatuses[i] {
			t.Fatalf("gateway answered %v, want %v", got, wantStatuses)
		}
	}
	if xs[0].retryAfter != "1" || xs[0].retryCount != "0" {
		t.Errorf("refusal: Retry-After %q, X-Stainless-Retry-Count %q; want \"1\", \"0\"", xs[0].retryAfter, xs[0].retryCount)
	}
	if xs[1].retryCount != "1" {
		t.Errorf("retry: X-Stainless-Retry-Count %q, want \"1\"", xs[1].retryCount)
	}
	if gap := xs[1].received.Sub(xs[0].answered); gap < wait {
		t.Errorf("retry came %v after the refusal, want at least the Retry-After of %v", gap, wait)
	}
}

// TestSDKDoesNotRetryFinalRefusals: refusals that cannot succeed unchanged
// reach the gateway exactly once, and the SDK's *openai.Error carries our
// status, code, type and message.
func TestSDKDoesNotRetryFinalRefusals(t *testing.T) {
	for _, tc := range []struct {
		name       string
		limits     limiter.Limits
		budget     *registry.BudgetPolicy
		model      string
		maxTokens  int64
		wantStatus int
		wantType   string
		wantCode   string
		wantMsg    string // prefix
	}{
		{
			name:   "413 request_too_large",
			limits: limiter.Limits{WeightedPerMinute: i64(60000), WeightedBurst: i64(1000)}, model: testModel, maxTokens: 5000,
			wantStatus: 413, wantType: "invalid_request_error", wantCode: "request_too_large",
			wantMsg: "Request too large: it needs 5009 weighted tokens, more than the 1000 the tenant's plan grants at once, so it can never be admitted. Reduce the prompt or max_tokens.",
		},
		{
			name:   "400 model_not_found",
			limits: limiter.Limits{WeightedPerMinute: i64(60000)}, model: "no-such-model", maxTokens: 10,
			wantStatus: 400, wantType: "invalid_request_error", wantCode: "model_not_found",
			wantMsg: `The model "no-such-model" is not served by this pool.`,
		},
		{
			name:   "403 tenant_suspended",
			limits: limiter.Limits{WeightedPerMinute: i64(0)}, model: testModel, maxTokens: 10,
			wantStatus: 403, wantType: "permission_error", wantCode: "tenant_suspended",
			wantMsg: "The tenant is suspended",
		},
		{
			// Retry-After is the time to the end of the month, far above the
			// SDK's 2-minute cap: it returns the 429 without waiting.
			name:   "429 budget_exhausted with a Retry-After beyond the SDK's cap",
			limits: limiter.Limits{WeightedPerMinute: i64(60000)}, budget: &registry.BudgetPolicy{WeightedTokens: 150, Period: registry.BudgetMonth},
			model: testModel, maxTokens: 100,
			wantStatus: 429, wantType: "rate_limit_error", wantCode: "budget_exhausted",
			wantMsg: "Budget exhausted",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.budget != nil {
				now := time.Now().UTC()
				if end := time.Date(now.Year(), now.Month()+1, 1, 0, 0, 0, 0, time.UTC); end.Sub(now) < 5*time.Minute {
					t.Skip("the month ends within 5 minutes: Retry-After would be under the SDK's 2-minute cap")
				}
			}
			up := newUpstream(t, okJSON(1, 1))
			tp := tenant("a", tc.limits)
			tp.Budget = tc.budget
			if tc.budget != nil {
				// 100 of 150 already spent this month: the call (109) does
				// not fit what is left, though it fits the whole budget.
				now := time.Now().UTC()
				tp.BudgetSeed = &registry.BudgetSeed{Used: 100, ResetTime: time.Date(now.Year(), now.Month()+1, 1, 0, 0, 0, 0, time.UTC)}
			}
			e := newRealEnv(t, up, []registry.TenantPolicy{tp})
			c := e.client("key-a")
			_, err := c.Chat.Completions.New(context.Background(), chatParams(tc.model, tc.maxTokens))
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) {
				t.Fatalf("err = %v, want *openai.Error", err)
			}
			if apiErr.StatusCode != tc.wantStatus || apiErr.Type != tc.wantType || apiErr.Code != tc.wantCode ||
				!strings.HasPrefix(apiErr.Message, tc.wantMsg) {
				t.Errorf("error = %d %q %q %q, want %d %q %q %q...", apiErr.StatusCode, apiErr.Type, apiErr.Code, apiErr.Message,
					tc.wantStatus, tc.wantType, tc.wantCode, tc.wantMsg)
			}
			if got := e.log.statuses(); len(got) != 1 || got[0] != tc.wantStatus {
				t.Errorf("gateway answered %v, want exactly one %d", got, tc.wantStatus)
			}
			if n := up.calls.Load(); n != 0 {
				t.Errorf("upstream calls = %d, want 0", n)
			}
		})
	}
}

// TestSDKStreaming: a streamed chat completion through the SDK's ssestream.
// The gateway asks the provider for usage on every stream (to settle the
// charge) but a client that did not ask for it sees no usage chunk; one
// that set stream_options.include_usage gets it as the last chunk.
func TestSDKStreaming(t *testing.T) {
	for _, tc := range []struct {
		name         string
		includeUsage bool
		wantChunks   int // 3 content chunks, the finish chunk, [usage]
	}{
		{"without include_usage", false, 4},
		{"with include_usage", true, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const prompt, n = 7, 3
			up := newUpstream(t, sseStream(n, prompt))
			e := newRealEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(60000)})})
			p := chatParams(testModel, 100)
			if tc.includeUsage {
				p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
			}
			c := e.client("key-a")
			stream := c.Chat.Completions.NewStreaming(context.Background(), p)
			var content strings.Builder
			var chunks int
			var usageChunks []int64
			for stream.Next() {
				ch := stream.Current()
				chunks++
				if ch.JSON.Usage.Valid() {
					usageChunks = append(usageChunks, ch.Usage.TotalTokens)
				}
				for _, choice := range ch.Choices {
					content.WriteString(choice.Delta.Content)
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatal(err)
			}
			_ = stream.Close()
			if got := content.String(); got != " t0 t1 t2" {
				t.Errorf("content = %q, want %q", got, " t0 t1 t2")
			}
			if chunks != tc.wantChunks {
				t.Errorf("chunks = %d, want %d", chunks, tc.wantChunks)
			}
			switch {
			case tc.includeUsage && (len(usageChunks) != 1 || usageChunks[0] != prompt+n):
				t.Errorf("usage chunks = %v, want one with total %d", usageChunks, prompt+n)
			case !tc.includeUsage && len(usageChunks) != 0:
				t.Errorf("usage chunks = %v, want none (the client did not ask for usage)", usageChunks)
			}
			if got := up.lastBody()["stream_options"]; got == nil {
				t.Errorf("upstream stream_options = %v, want include_usage set by the gateway", got)
			}
			// The handler returns after the client has read the stream's end.
			waitFor(t, "the stream's handler to return", func() bool { return len(e.log.exchanges()) > 0 })
			if got := e.log.statuses(); len(got) != 1 || got[0] != 200 {
				t.Errorf("gateway answered %v, want [200]", got)
			}
		})
	}
}
