package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fairshare-dev/fairshare/internal/fairqueue"
	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/providersim"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// continuousUsageStream answers like vLLM with
// stream_options.continuous_usage_stats: a running usage in each of n
// content chunks, then a usage-only chunk when the request asked for
// include_usage, then [DONE].
func continuousUsageStream(n, prompt int64) func(w http.ResponseWriter, r *http.Request, body []byte) {
	return func(w http.ResponseWriter, r *http.Request, body []byte) {
		quotaHeaders(w.Header())
		w.Header().Set("Content-Type", "text/event-stream")
		for i := int64(1); i <= n; i++ {
			fmt.Fprintf(w, "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t\"}}],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", prompt, i, prompt+i)
		}
		if bytes.Contains(body, []byte(`"include_usage":true`)) {
			fmt.Fprintf(w, "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", prompt, n, prompt+n)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}
}

// TestBC24_StreamWithUsageInEveryChunkSettlesFromTheLast: with vLLM's
// continuous_usage_stats every chunk carries a running usage; the stream is
// settled from the last one (100 + 900 = 1000), not the first (100 + 1):
// bucket 10000, charge 100 + 1000, so 9000 afterwards. The usage-only chunk
// is still hidden from a client that did not ask for include_usage.
func TestBC24_StreamWithUsageInEveryChunkSettlesFromTheLast(t *testing.T) {
	for _, tc := range []struct {
		name       string
		options    string
		wantEvents int
	}{
		{"client asked for include_usage", `{"include_usage":true,"continuous_usage_stats":true}`, 902}, // 900 chunks, usage, [DONE]
		{"usage injected by the gateway", `{"continuous_usage_stats":true}`, 901},                       // usage-only chunk hidden
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, continuousUsageStream(900, 100))
			e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(600000), WeightedBurst: i64(10000)})})
			resp := e.do("POST", "/v1/completions", "key-a", completionsBody(100, 1000, `,"stream":true,"stream_options":`+tc.options))
			events := readEvents(t, resp)
			if len(events) != tc.wantEvents || events[len(events)-1] != "[DONE]" {
				t.Fatalf("got %d events ending %q, want %d ending [DONE]", len(events), events[len(events)-1], tc.wantEvents)
			}
			if got := e.tokensLeft("a"); got != 9000 {
				t.Errorf("bucket after the stream = %d, want 9000 (charged 1100, used 100 + 900)", got)
			}
		})
	}
}

// chatBody is a chat request for the test model with the given max_tokens.
func chatBody(maxTokens int64) string {
	return `{"model":"` + testModel + `","messages":[{"role":"user","content":"hi"}],"max_tokens":` + strconv.FormatInt(maxTokens, 10) + `}`
}

// simUpstream is a provider simulator with a quota of tpm tokens per minute
// on the env's clock, behind the recording fake upstream.
func simUpstream(t *testing.T, tpm int64) (*upstream, func(e *env) *providersim.Server) {
	var sim *providersim.Server
	var mu sync.Mutex
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		r2 := r.Clone(r.Context())
		r2.Body = io.NopCloser(bytes.NewReader(body))
		mu.Lock()
		s := sim
		mu.Unlock()
		s.ServeHTTP(w, r2)
	})
	return up, func(e *env) *providersim.Server {
		mu.Lock()
		defer mu.Unlock()
		sim = providersim.New(providersim.Config{TokensPerMinute: tpm, RequestsPerMinute: 600, Clock: e.clock, Models: []string{testModel}})
		return sim
	}
}

// TestBC10_LargerThanProviderLimitRefusedAtAdmission: with the model's
// provider token limit known (the pool's tokensPerMinute hint, or the
// provider's headers), a request of prompt + max output above it is
// refused at once with 413 request_too_large and no Retry-After,
// interactive and at job submission; nothing reaches the provider, and
// another tenant's call right after succeeds.
func TestBC10_LargerThanProviderLimitRefusedAtAdmission(t *testing.T) {
	for _, tc := range []struct {
		name string
		hint int64 // pool tokensPerMinute
		// learn: a first small call whose response carries the provider's limit
		learn bool
	}{
		{"limit from the pool's hint", 12000, false},
		{"limit from the provider's headers", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up, start := simUpstream(t, 12000)
			e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{}), tenant("b", limiter.Limits{})},
				withPool(func(p *registry.PoolPolicy) {
					p.Models[0].TokensPerMinute = tc.hint
					p.Models[0].RequestsPerMinute = 600
				}))
			start(e)
			calls := int64(0)
			if tc.learn {
				if resp := e.do("POST", "/v1/chat/completions", "key-a", chatBody(50)); resp.StatusCode != 200 {
					t.Fatalf("learning call: %d %s", resp.StatusCode, readAll(t, resp))
				}
				calls = 1
			}
			resp := e.do("POST", "/v1/chat/completions", "key-a", chatBody(13000))
			body := decode[errorBody](t, resp)
			if resp.StatusCode != 413 || body.Error.Code != "request_too_large" || resp.Header.Get("Retry-After") != "" {
				t.Fatalf("interactive: %d %+v Retry-After %q, want 413 request_too_large without Retry-After", resp.StatusCode, body.Error, resp.Header.Get("Retry-After"))
			}
			if !strings.Contains(body.Error.Message, "exceeds the provider's limit of 12000 tokens per minute") {
				t.Errorf("message = %q, want it to name the provider's limit", body.Error.Message)
			}
			resp = e.do("POST", "/v1/jobs", "key-a", `{"body":`+chatBody(13000)+`}`)
			body = decode[errorBody](t, resp)
			if resp.StatusCode != 413 || body.Error.Code != "request_too_large" || resp.Header.Get("Retry-After") != "" {
				t.Fatalf("job: %d %+v, want 413 request_too_large without Retry-After", resp.StatusCode, body.Error)
			}
			if got := up.calls.Load(); got != calls {
				t.Errorf("upstream calls = %d, want %d (nothing oversized sent)", got, calls)
			}
			if resp := e.do("POST", "/v1/chat/completions", "key-b", chatBody(50)); resp.StatusCode != 200 {
				t.Errorf("tenant b right after: %d %s, want 200", resp.StatusCode, readAll(t, resp))
			}
		})
	}
}

// TestBC10_QueuedJobTooLargeAfterLimitDropFailsAtDispatch: a job that fit
// at submission but exceeds the model's limit after the pool's
// tokensPerMinute drops fails at dispatch with request_too_large, unsent.
func TestBC10_QueuedJobTooLargeAfterLimitDropFailsAtDispatch(t *testing.T) {
	up := newUpstream(t, okJSON(10, 10))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})},
		withPool(func(p *registry.PoolPolicy) { p.Models[0].TokensPerMinute = 12000 }))
	e.pause(10 * time.Second)
	j := e.submit("key-a", jobBody(10, 5000, ""))
	pool := *e.reg.Pool()
	pool.Models = []registry.ModelPolicy{{Name: testModel, TokensPerMinute: 4000, RequestsPerMinute: 10000}}
	if err := e.reg.SetPool(pool); err != nil {
		t.Fatal(err)
	}
	e.clock.Step(11 * time.Second)
	waitFor(t, "the job to fail", func() bool { return e.storeStatus(j.ID) == jobs.StatusFailed })
	got := e.job("key-a", j.ID)
	if got.Error == nil || got.Error.Code != "request_too_large" || got.Attempts != 0 || up.calls.Load() != 0 {
		t.Errorf("job = status %s attempts %d error %+v, upstream calls %d; want failed request_too_large, 0 attempts, 0 calls",
			got.Status, got.Attempts, got.Error, up.calls.Load())
	}
}

// tooLargeRefusals are provider answers saying the request exceeds the
// provider's limit (BC-10), each with the limit it names (0: none).
var tooLargeRefusals = []struct {
	name   string
	status int
	body   string
}{
	{"429 Request too large (OpenAI)", 429, `{"error":{"message":"Request too large for gpt-test on tokens per min (TPM): Limit 12000, Requested 13010. The input or output tokens must be reduced in order to run successfully.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`},
	{"429 code request_too_large", 429, `{"error":{"message":"too big","type":"invalid_request_error","code":"request_too_large"}}`},
	{"429 type tokens, requested above the limit", 429, `{"error":{"message":"Limit 12000, Requested 13010.","type":"tokens","code":null}}`},
	{"413", 413, `{"error":{"message":"payload too large"}}`},
}

// TestBC10_ProviderRefusalTooLargeDoesNotPause: an upstream 413, or a 429
// saying the request is too large for the provider's limit, answers the
// interactive call with our 413 request_too_large (no Retry-After), does
// not pause the model, and leaves another tenant's next call unaffected;
// a limit named by the refusal refuses the next oversized call at
// admission.
func TestBC10_ProviderRefusalTooLargeDoesNotPause(t *testing.T) {
	for _, tc := range tooLargeRefusals {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				if bytes.Contains(body, []byte(`"max_tokens":13000`)) {
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(tc.status)
					io.WriteString(w, tc.body)
					return
				}
				// No quota headers: the limit a refusal names stands.
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, `{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":10}}`)
			})
			e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(600000), WeightedBurst: i64(100000)}), tenant("b", limiter.Limits{})},
				withPool(func(p *registry.PoolPolicy) { p.Models[0].TokensPerMinute = 0 }))
			resp := e.do("POST", "/v1/chat/completions", "key-a", chatBody(13000))
			body := decode[errorBody](t, resp)
			if resp.StatusCode != 413 || body.Error.Code != "request_too_large" || resp.Header.Get("Retry-After") != "" {
				t.Fatalf("%d %+v Retry-After %q, want 413 request_too_large without Retry-After", resp.StatusCode, body.Error, resp.Header.Get("Retry-After"))
			}
			if p := e.reg.Model(testModel).Throttle.PausedUntil(); !p.IsZero() {
				t.Errorf("model paused until %v, want not paused", p)
			}
			if got := e.tokensLeft("a"); got != 100000 {
				t.Errorf("bucket of a = %d, want 100000 (refunded)", got)
			}
			if resp := e.do("POST", "/v1/chat/completions", "key-b", chatBody(50)); resp.StatusCode != 200 {
				t.Errorf("tenant b right after: %d %s, want 200", resp.StatusCode, readAll(t, resp))
			}
			wantCalls := int64(3) // the refused call, b's call, the same oversized call again
			if strings.Contains(tc.body, "Limit 12000") {
				wantCalls = 2 // the limit was learnt: refused at admission
			}
			if resp := e.do("POST", "/v1/chat/completions", "key-a", chatBody(13000)); resp.StatusCode != 413 {
				t.Errorf("second oversized call: %d, want 413", resp.StatusCode)
			} else {
				readAll(t, resp)
			}
			if got := up.calls.Load(); got != wantCalls {
				t.Errorf("upstream calls = %d, want %d", got, wantCalls)
			}
		})
	}
	t.Run("an ordinary 429 still pauses the model", func(t *testing.T) {
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(429)
			io.WriteString(w, `{"error":{"message":"Rate limit reached for gpt-test on tokens per min (TPM): Limit 12000, Used 11000, Requested 2000.","type":"tokens","code":"rate_limit_exceeded"}}`)
		})
		e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
		resp := e.do("POST", "/v1/chat/completions", "key-a", chatBody(2000))
		body := decode[errorBody](t, resp)
		if resp.StatusCode != 503 || body.Error.Code != "upstream_quota_exhausted" {
			t.Errorf("%d %+v, want 503 upstream_quota_exhausted", resp.StatusCode, body.Error)
		}
		if got := e.reg.Model(testModel).Throttle.PausedUntil(); !got.Equal(t0.Add(7 * time.Second)) {
			t.Errorf("PausedUntil = %v, want t0+7s", got)
		}
	})
}

// TestBC10_JobRefusedAsTooLargeByProviderFailsWithoutRetry: a job the
// provider refuses as too large (the simulator's "Request too large" 429,
// the model's limit not known at submission) fails after one attempt with
// request_too_large, the model is not paused and another tenant's job runs.
func TestBC10_JobRefusedAsTooLargeByProviderFailsWithoutRetry(t *testing.T) {
	up, start := simUpstream(t, 12000)
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{}), tenant("b", limiter.Limits{})},
		withPool(func(p *registry.PoolPolicy) { p.Models[0].TokensPerMinute = 0 }))
	sim := start(e)
	j := e.submit("key-a", `{"body":`+chatBody(13000)+`}`)
	waitFor(t, "the job to fail", func() bool { return e.storeStatus(j.ID) == jobs.StatusFailed })
	got := e.job("key-a", j.ID)
	if got.Error == nil || got.Error.Code != "request_too_large" || got.Attempts != 1 {
		t.Fatalf("job = attempts %d error %+v, want 1 attempt, request_too_large", got.Attempts, got.Error)
	}
	if p := e.reg.Model(testModel).Throttle.PausedUntil(); !p.IsZero() {
		t.Errorf("model paused until %v, want not paused", p)
	}
	jb := e.submit("key-b", `{"body":`+chatBody(50)+`}`)
	waitFor(t, "b's job to succeed", func() bool { return e.storeStatus(jb.ID) == jobs.StatusSucceeded })
	if st := sim.Stats(); st.Requests != 2 || st.Throttled != 1 {
		t.Errorf("simulator saw %d requests, %d throttled; want 2 and 1", st.Requests, st.Throttled)
	}
}

// TestBC20_BudgetReservedAtAdmission: the budget is charged at admission
// like the limiter, so 10 concurrent calls of 500 weighted tokens against a
// budget of 1000 admit exactly 2 (the rest 429 budget_exhausted); each is
// settled to its actual usage (400), so used is 800 afterwards. A call the
// provider fails is refunded in full.
func TestBC20_BudgetReservedAtAdmission(t *testing.T) {
	release := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		<-release
		okJSON(100, 300)(w, r, body)
	})
	a := tenant("a", limiter.Limits{})
	a.Budget = &registry.BudgetPolicy{WeightedTokens: 1000, Period: registry.BudgetDay}
	e := newEnv(t, up, []registry.TenantPolicy{a})
	done := make(chan string, 10)
	for range 10 {
		go func() {
			resp, err := http.DefaultClient.Do(mustRequest(e, completionsBody(100, 400, "")))
			if err != nil {
				done <- err.Error()
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			code := ""
			if resp.StatusCode != 200 {
				code = " " + decodeCode(b)
			}
			done <- strconv.Itoa(resp.StatusCode) + code
		}()
	}
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	defer unblock()
	got := map[string]int{}
	for range 8 {
		select {
		case c := <-done:
			got[c]++
		case <-time.After(10 * time.Second):
			t.Fatalf("after 10 s only %v answered, %d upstream calls in flight; want 8 refusals at once", got, up.calls.Load())
		}
	}
	waitFor(t, "2 upstream calls", func() bool { return up.calls.Load() == 2 })
	if st, _ := e.reg.Tenant("a").Budget(e.clock.Now()); st.Reserved != 1000 || st.Remaining != 0 {
		t.Errorf("budget while 2 calls are in flight = %+v, want reserved 1000, remaining 0", st)
	}
	unblock()
	for range 2 {
		got[<-done]++
	}
	if diff := cmp.Diff(map[string]int{"200": 2, "429 budget_exhausted": 8}, got); diff != "" {
		t.Errorf("outcomes (-want +got):\n%s", diff)
	}
	st, _ := e.reg.Tenant("a").Budget(e.clock.Now())
	if st.Used != 800 || st.Reserved != 0 || st.Remaining != 200 {
		t.Errorf("budget = %+v, want used 800 (2 x 400 actual), reserved 0, remaining 200", st)
	}
	if n := up.calls.Load(); n != 2 {
		t.Errorf("upstream calls = %d, want 2", n)
	}

	t.Run("provider error refunds the reservation", func(t *testing.T) {
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) { w.WriteHeader(500) })
		b := tenant("b", limiter.Limits{})
		b.Budget = &registry.BudgetPolicy{WeightedTokens: 1000, Period: registry.BudgetDay}
		e := newEnv(t, up, []registry.TenantPolicy{b})
		resp := e.do("POST", "/v1/completions", "key-b", completionsBody(100, 400, ""))
		readAll(t, resp)
		st, _ := e.reg.Tenant("b").Budget(e.clock.Now())
		if resp.StatusCode != 500 || st.Used != 0 || st.Reserved != 0 || st.Remaining != 1000 {
			t.Errorf("status %d, budget %+v; want 500 and the budget untouched", resp.StatusCode, st)
		}
	})
}

func mustRequest(e *env, body string) *http.Request {
	req, err := http.NewRequest("POST", e.srv.URL+"/v1/completions", strings.NewReader(body))
	if err != nil {
		panic(err)
	}
	req.Header.Set("Authorization", "Bearer key-a")
	return req
}

func decodeCode(b []byte) string {
	var eb errorBody
	_ = json.Unmarshal(b, &eb)
	return eb.Error.Code
}

// TestBC28_MaxTokensTimesNNeverWraps: max_tokens x n is bounded before it
// is multiplied, so 2^62+1000 x 4 is not charged as 4000 and 2^62 x 2 not as
// a negative (then 0) count: 413 request_too_large, interactive and job,
// nothing charged or sent. A normal n multiplies the reservation.
func TestBC28_MaxTokensTimesNNeverWraps(t *testing.T) {
	up := newUpstream(t, okJSON(10, 5))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(60000), WeightedBurst: i64(10000)})},
		withPool(func(p *registry.PoolPolicy) { p.Models[0].TokensPerMinute = 0 }))
	for _, tc := range []struct {
		name      string
		maxTokens int64
		n         int
	}{
		{"2^62+1000 x 4", 4611686018427388904, 4},
		{"2^62 x 2", 1 << 62, 2},
		{"2^40 x 2", 1 << 40, 2},
	} {
		extra := `,"n":` + strconv.Itoa(tc.n)
		for _, path := range []string{"interactive", "job"} {
			t.Run(tc.name+" "+path, func(t *testing.T) {
				resp := e.do("POST", "/v1/completions", "key-a", completionsBody(10, tc.maxTokens, extra))
				if path == "job" {
					resp = e.do("POST", "/v1/jobs", "key-a", `{"endpoint":"/v1/completions","body":`+completionsBody(10, tc.maxTokens, extra)+`}`)
				}
				body := decode[errorBody](t, resp)
				if resp.StatusCode != 413 || body.Error.Code != "request_too_large" || resp.Header.Get("Retry-After") != "" {
					t.Errorf("%d %+v, want 413 request_too_large", resp.StatusCode, body.Error)
				}
			})
		}
	}
	if up.calls.Load() != 0 || e.tokensLeft("a") != 10000 {
		t.Fatalf("upstream calls %d, bucket %d; want 0 and 10000", up.calls.Load(), e.tokensLeft("a"))
	}
	resp := e.do("POST", "/v1/completions", "key-a", completionsBody(10, 100, `,"n":3`))
	readAll(t, resp)
	if resp.StatusCode != 200 || e.tokensLeft("a") != 10000-15 {
		t.Errorf("n 3: %d, bucket %d; want 200, %d (charged 10 + 300, settled to 15)", resp.StatusCode, e.tokensLeft("a"), 10000-15)
	}
}

// TestUpstreamGetsOnlyAllowListedHeaders: a tenant's credentials or account
// selectors (Authorization, OpenAI-Organization, OpenAI-Project, X-Api-Key,
// Api-Key, Cookie) never reach the provider, which sees the provider key
// only; tracing and feature headers pass.
func TestUpstreamGetsOnlyAllowListedHeaders(t *testing.T) {
	up := newUpstream(t, okJSON(5, 5))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
	req, err := http.NewRequest("POST", e.srv.URL+"/v1/completions", strings.NewReader(completionsBody(5, 5, "")))
	if err != nil {
		t.Fatal(err)
	}
	sent := map[string]string{
		"Authorization":       "Bearer key-a",
		"OpenAI-Organization": "org-someone-else",
		"OpenAI-Project":      "proj-x",
		"X-Api-Key":           "tenant-supplied",
		"Api-Key":             "tenant-supplied",
		"Cookie":              "session=1",
		"X-Fairshare-Tenant":  "b",
		"Accept-Encoding":     "br",
		"OpenAI-Beta":         "assistants=v2",
		"Traceparent":         "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"X-Request-Id":        "req-1",
		"User-Agent":          "client/1.0",
	}
	for k, v := range sent {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	h := up.headers[0]
	got := map[string]string{}
	for _, k := range []string{"Authorization", "OpenAI-Organization", "OpenAI-Project", "X-Api-Key", "Api-Key", "Cookie", "X-Fairshare-Tenant", "OpenAI-Beta", "Traceparent", "X-Request-Id", "User-Agent", "Content-Type"} {
		got[k] = h.Get(k)
	}
	want := map[string]string{
		"Authorization": "Bearer sk-provider-secret", "OpenAI-Organization": "", "OpenAI-Project": "", "X-Api-Key": "", "Api-Key": "",
		"Cookie": "", "X-Fairshare-Tenant": "", "OpenAI-Beta": "assistants=v2", "Traceparent": sent["Traceparent"],
		"X-Request-Id": "req-1", "User-Agent": "client/1.0", "Content-Type": "application/json",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("upstream headers (-want +got):\n%s", diff)
	}
	if ae := h.Get("Accept-Encoding"); ae == "br" {
		t.Errorf("Accept-Encoding %q forwarded; the gateway must be able to read the usage", ae)
	}
}

// TestJobQueueBoundCountsJobsTakenOutByTheDispatcher: a job the dispatcher
// has taken out of the queue (and will put back: the model is paused)
// still counts toward its tenant's bound, so a submission in that window
// cannot push the tenant over it. Deterministic: the submissions run
// exactly between the dispatcher's Dequeue and its Requeue.
func TestJobQueueBoundCountsJobsTakenOutByTheDispatcher(t *testing.T) {
	up := newUpstream(t, okJSON(1, 1))
	a := tenant("a", limiter.Limits{})
	a.MaxQueued = 2
	e := newEnv(t, up, []registry.TenantPolicy{a})
	e.pause(60 * time.Second)
	var once sync.Once
	codes := make(chan []int, 1)
	hook := func(*fairqueue.Job) {
		once.Do(func() {
			var got []int
			for range 2 {
				resp, err := http.DefaultClient.Do(mustJobRequest(e, jobBody(10, 100, "")))
				if err != nil {
					got = append(got, -1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				got = append(got, resp.StatusCode)
			}
			codes <- got
		})
	}
	e.gw.dispatch.dequeuedHook.Store(&hook)
	first := e.submit("key-a", jobBody(10, 100, ""))
	got := <-codes
	if diff := cmp.Diff([]int{202, 429}, got); diff != "" {
		t.Errorf("submissions while the first job is out of the queue (-want +got):\n%s", diff)
	}
	// The model stays paused (fake clock): the first job is put back and
	// the tenant ends at its bound, not one over it.
	waitFor(t, "the first job to be put back", func() bool {
		var held int
		e.reg.WithQueue(func(q *fairqueue.Queue) { held = e.gw.dispatch.held["a"] })
		return held == 0 && e.storeStatus(first.ID) == jobs.StatusQueued
	})
	var n int
	e.reg.WithQueue(func(q *fairqueue.Queue) { n = q.Len("a") })
	if n != 2 {
		t.Errorf("queued = %d, want 2 (the bound)", n)
	}
}

func mustJobRequest(e *env, body string) *http.Request {
	req, err := http.NewRequest("POST", e.srv.URL+"/v1/jobs", strings.NewReader(body))
	if err != nil {
		panic(err)
	}
	req.Header.Set("Authorization", "Bearer key-a")
	return req
}

// TestRequestValidationNamesTheField: messages null or empty, and a
// deadlineSeconds that is not a positive number of seconds, are 400 with a
// message naming the field; a request without max output that the pool's
// default makes too large for the tenant's burst says so.
func TestRequestValidationNamesTheField(t *testing.T) {
	up := newUpstream(t, okJSON(10, 5))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(6000), WeightedBurst: i64(1000)})})
	for _, tc := range []struct {
		name, path, body string
		status           int
		code, contains   string
	}{
		{"messages null", "/v1/chat/completions", `{"model":"gpt-test","messages":null,"max_tokens":5}`, 400, "invalid_request", `"messages"`},
		{"messages empty", "/v1/chat/completions", `{"model":"gpt-test","messages":[],"max_tokens":5}`, 400, "invalid_request", `"messages" must be a non-empty array`},
		{"messages absent", "/v1/chat/completions", `{"model":"gpt-test","max_tokens":5}`, 400, "invalid_request", `"messages"`},
		{"deadline string", "/v1/jobs", `{"body":{"model":"gpt-test","messages":[{"role":"user","content":"hi"}],"max_tokens":5},"deadlineSeconds":"5"}`, 400, "invalid_deadline", `"deadlineSeconds" must be a number`},
		{"deadline object", "/v1/jobs", `{"body":{"model":"gpt-test","messages":[{"role":"user","content":"hi"}],"max_tokens":5},"deadlineSeconds":{}}`, 400, "invalid_deadline", `"deadlineSeconds" must be a number`},
		{"deadline negative", "/v1/jobs", `{"body":{"model":"gpt-test","messages":[{"role":"user","content":"hi"}],"max_tokens":5},"deadlineSeconds":-1}`, 400, "invalid_deadline", `"deadlineSeconds" must be at least 0.001`},
		{"deadline 1e-12", "/v1/jobs", `{"body":{"model":"gpt-test","messages":[{"role":"user","content":"hi"}],"max_tokens":5},"deadlineSeconds":1e-12}`, 400, "invalid_deadline", `"deadlineSeconds" must be at least 0.001`},
		{"job body not an object", "/v1/jobs", `{"body":"x"}`, 400, "invalid_request", `"body" object`},
		{"default max output above the burst", "/v1/chat/completions", `{"model":"gpt-test","messages":[{"role":"user","content":"hi"}]}`, 413, "request_too_large",
			"The pool's default max output of 4096 tokens was charged because the request set no max_tokens; set max_tokens or raise spec.tokens.burst."},
		{"default max output above the burst, job", "/v1/jobs", `{"body":{"model":"gpt-test","messages":[{"role":"user","content":"hi"}]}}`, 413, "request_too_large",
			"The pool's default max output of 4096 tokens was charged because the request set no max_tokens; set max_tokens or raise spec.tokens.burst."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := e.do("POST", tc.path, "key-a", tc.body)
			body := decode[errorBody](t, resp)
			if resp.StatusCode != tc.status || body.Error.Code != tc.code || !strings.Contains(body.Error.Message, tc.contains) ||
				strings.Contains(body.Error.Message, "fairqueue") || strings.Contains(body.Error.Message, "not a valid JSON object") {
				t.Errorf("%d %s %q, want %d %s containing %q", resp.StatusCode, body.Error.Code, body.Error.Message, tc.status, tc.code, tc.contains)
			}
		})
	}
	if n := up.calls.Load(); n != 0 {
		t.Errorf("upstream calls = %d, want 0", n)
	}
}

// TestCancelWhileDispatchedSaysSo: a DELETE that lands between the
// dispatcher taking the job out of the queue and starting it is 409
// job_not_cancellable, and its message says the job has just left the queue
// (the record still says queued; the message once read "The job is queued
// and can no longer be cancelled.").
func TestCancelWhileDispatchedSaysSo(t *testing.T) {
	up := newUpstream(t, okJSON(1, 1))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
	var once sync.Once
	type answer struct {
		status      int
		code, msg   string
		statusAfter jobs.Status
	}
	answers := make(chan answer, 1)
	var id atomic.Value
	hook := func(fj *fairqueue.Job) {
		once.Do(func() {
			for id.Load() == nil { // the submission's answer is not written yet
				time.Sleep(time.Millisecond)
			}
			req, _ := http.NewRequest(http.MethodDelete, e.srv.URL+"/v1/jobs/"+id.Load().(string), nil)
			req.Header.Set("Authorization", "Bearer key-a")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				answers <- answer{status: -1, msg: err.Error()}
				return
			}
			var eb struct {
				Error struct{ Code, Message string } `json:"error"`
			}
			_ = json.NewDecoder(resp.Body).Decode(&eb)
			resp.Body.Close()
			answers <- answer{resp.StatusCode, eb.Error.Code, eb.Error.Message, e.storeStatus(fj.ID)}
		})
	}
	e.gw.dispatch.dequeuedHook.Store(&hook)
	j := e.submit("key-a", jobBody(10, 100, ""))
	id.Store(j.ID)
	got := <-answers
	want := answer{http.StatusConflict, codeJobNotCancellable, "The job has just left the queue (to be sent or finished) and can no longer be cancelled.", jobs.StatusQueued}
	if got != want {
		t.Errorf("DELETE while dispatched: %+v, want %+v", got, want)
	}
}
