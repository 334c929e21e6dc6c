package providersim

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	testingclock "k8s.io/utils/clock/testing"
)

// t0 is the fake clock's start: 2026-01-01T00:00:00Z.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// helloPrompt is the prompt tokens of a request with the single message
// "Hello there": 2 content tokens ("Hello", " there") + 3 message overhead +
// 3 reply priming.
const helloPrompt = 8

func newTestServer(t *testing.T, cfg Config) (*Server, *httptest.Server, *testingclock.FakeClock) {
	t.Helper()
	fc := testingclock.NewFakeClock(t0)
	cfg.Clock = fc
	s := New(cfg)
	ts := httptest.NewServer(s) // listens on 127.0.0.1
	t.Cleanup(ts.Close)
	return s, ts, fc
}

// chatBody returns a request body with the message "Hello there" and extra
// top-level JSON fields (without braces), e.g. `"max_tokens":100`.
func chatBody(extra string) string {
	b := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hello there"}]`
	if extra != "" {
		b += "," + extra
	}
	return b + "}"
}

type result struct {
	status int
	header http.Header
	body   []byte
}

// post sends a chat completion request; it reports failures with t.Error
// (not Fatal) so it can run on other goroutines, returning status -1.
func post(t *testing.T, ctx context.Context, url, body string) result {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return result{status: -1, header: http.Header{}}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return result{status: -1, header: http.Header{}}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Error(err)
	}
	return result{resp.StatusCode, resp.Header, b}
}

var quotaHeaderNames = []string{
	"x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests",
	"x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens",
	"retry-after",
}

// quotaHeaders returns the rate-limit headers present in h.
func quotaHeaders(h http.Header) map[string]string {
	m := map[string]string{}
	for _, k := range quotaHeaderNames {
		if v := h.Get(k); v != "" {
			m[k] = v
		}
	}
	return m
}

func hdr(limReq, remReq int64, resetReq string, limTok, remTok int64, resetTok string) map[string]string {
	return map[string]string{
		"x-ratelimit-limit-requests": fmt.Sprint(limReq), "x-ratelimit-remaining-requests": fmt.Sprint(remReq),
		"x-ratelimit-reset-requests": resetReq,
		"x-ratelimit-limit-tokens":   fmt.Sprint(limTok), "x-ratelimit-remaining-tokens": fmt.Sprint(remTok),
		"x-ratelimit-reset-tokens": resetTok,
	}
}

func TestPromptTokensHello(t *testing.T) {
	n, err := promptTokens([]chatMessage{{Role: "user", Content: json.RawMessage(`"Hello there"`)}})
	if err != nil || n != helloPrompt {
		t.Fatalf("promptTokens = %d, %v; want %d", n, err, helloPrompt)
	}
}

// TestQuotaSequence checks exact header values after a known sequence: TPM
// 6000 (100 tokens/s), RPM 60 (1 request/s); each request costs 8 prompt +
// 100 reserved = 108 tokens at receipt, generates 40 and is refunded 60.
func TestQuotaSequence(t *testing.T) {
	s, ts, fc := newTestServer(t, Config{TokensPerMinute: 6000, RequestsPerMinute: 60, OutputTokens: 40})
	steps := []struct {
		name    string
		advance time.Duration
		want    map[string]string
	}{
		// 6000-108 = 5892; reset 108/100 s. Then refund 60 -> 5952.
		{"first", 0, hdr(60, 59, "1s", 6000, 5892, "1.08s")},
		// 5952-108 = 5844; reset 156/100 s. Requests 58, reset 2 s. Refund -> 5904.
		{"second", 0, hdr(60, 58, "2s", 6000, 5844, "1.56s")},
		// +0.5 s: tokens 5904+50 = 5954 -> 5846 (reset 1.54s); requests 58.5 -> 57.5 (floor 57, reset 2.5s).
		{"after 500ms", 500 * time.Millisecond, hdr(60, 57, "2.5s", 6000, 5846, "1.54s")},
		// +1 h: both full before the charge.
		{"after 1h", time.Hour, hdr(60, 59, "1s", 6000, 5892, "1.08s")},
	}
	for _, st := range steps {
		fc.Step(st.advance)
		r := post(t, context.Background(), ts.URL, chatBody(`"max_tokens":100`))
		if r.status != http.StatusOK {
			t.Fatalf("%s: status %d: %s", st.name, r.status, r.body)
		}
		if diff := cmp.Diff(st.want, quotaHeaders(r.header)); diff != "" {
			t.Errorf("%s: headers (-want +got):\n%s", st.name, diff)
		}
		var c chatCompletion
		if err := json.Unmarshal(r.body, &c); err != nil {
			t.Fatal(err)
		}
		wantUsage := usageBody{PromptTokens: helloPrompt, CompletionTokens: 40, TotalTokens: 48}
		if diff := cmp.Diff(wantUsage, c.Usage); diff != "" {
			t.Errorf("%s: usage (-want +got):\n%s", st.name, diff)
		}
		if got := c.Choices[0].Message.Content; got != fillerText(40) || c.Choices[0].FinishReason != "stop" {
			t.Errorf("%s: content %q finish %q", st.name, got, c.Choices[0].FinishReason)
		}
	}
	// After the last refund: 5892 + 60 = 5952 tokens.
	s.mu.Lock()
	level := s.tokens.level
	s.mu.Unlock()
	if level != 5952 {
		t.Errorf("tokens after refund = %v, want 5952", level)
	}
	want := Stats{Requests: 4, Succeeded: 4, PromptTokens: 4 * helloPrompt, CompletionTokens: 160, MaxConcurrent: 1}
	if diff := cmp.Diff(want, s.Stats()); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
}

// TestThrottleTokens: 200 tokens left at 100 tokens/s, request 8+1492 = 1500
// -> deficit 1300 -> retry-after 13; with 1490 left the deficit is 0.1 s ->
// retry-after 1 (never 0); 100 ms later the request is admitted.
func TestThrottleTokens(t *testing.T) {
	s, ts, fc := newTestServer(t, Config{TokensPerMinute: 6000, OutputTokens: 100000})
	// Drain to 200: 8 + 5792 = 5800, fully generated so nothing is refunded.
	if r := post(t, context.Background(), ts.URL, chatBody(`"max_tokens":5792`)); r.status != http.StatusOK {
		t.Fatalf("drain: status %d: %s", r.status, r.body)
	}
	req := chatBody(`"max_completion_tokens":1492,"max_tokens":1`) // max_completion_tokens wins
	r := post(t, context.Background(), ts.URL, req)
	if r.status != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429: %s", r.status, r.body)
	}
	want := map[string]string{
		"x-ratelimit-limit-tokens": "6000", "x-ratelimit-remaining-tokens": "200",
		"x-ratelimit-reset-tokens": "58s", "retry-after": "13",
	}
	if diff := cmp.Diff(want, quotaHeaders(r.header)); diff != "" {
		t.Errorf("headers (-want +got):\n%s", diff)
	}
	var e apiError
	if err := json.Unmarshal(r.body, &e); err != nil {
		t.Fatal(err)
	}
	if e.Error.Type != "tokens" || e.Error.Code == nil || *e.Error.Code != "rate_limit_exceeded" ||
		!strings.Contains(e.Error.Message, "Limit 6000, Used 5800, Requested 1500") {
		t.Errorf("error body %s", r.body)
	}

	fc.Step(12900 * time.Millisecond) // 200 + 1290 = 1490
	r = post(t, context.Background(), ts.URL, req)
	if r.status != http.StatusTooManyRequests || r.header.Get("retry-after") != "1" ||
		r.header.Get("x-ratelimit-remaining-tokens") != "1490" || r.header.Get("x-ratelimit-reset-tokens") != "45.1s" {
		t.Errorf("at 1490: status %d headers %v", r.status, quotaHeaders(r.header))
	}

	fc.Step(100 * time.Millisecond) // 1500: exactly enough (off-by-one at the limit)
	r = post(t, context.Background(), ts.URL, req)
	if r.status != http.StatusOK || r.header.Get("x-ratelimit-remaining-tokens") != "0" {
		t.Errorf("at 1500: status %d headers %v", r.status, quotaHeaders(r.header))
	}
	if st := s.Stats(); st.Throttled != 2 || st.Succeeded != 2 || st.Requests != 4 {
		t.Errorf("stats %+v", st)
	}
}

// TestThrottleRequests: RPM 2 (one request per 30 s), tokens unlimited (no
// token headers). The third request waits 30 s; the requests dimension trips.
func TestThrottleRequests(t *testing.T) {
	_, ts, fc := newTestServer(t, Config{RequestsPerMinute: 2})
	wants := []map[string]string{
		{"x-ratelimit-limit-requests": "2", "x-ratelimit-remaining-requests": "1", "x-ratelimit-reset-requests": "30s"},
		{"x-ratelimit-limit-requests": "2", "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1m0s"},
	}
	for i, want := range wants {
		r := post(t, context.Background(), ts.URL, chatBody(""))
		if r.status != http.StatusOK {
			t.Fatalf("request %d: status %d", i, r.status)
		}
		if diff := cmp.Diff(want, quotaHeaders(r.header)); diff != "" {
			t.Errorf("request %d headers (-want +got):\n%s", i, diff)
		}
	}
	fc.Step(10 * time.Second)
	r := post(t, context.Background(), ts.URL, chatBody(""))
	want := map[string]string{
		"x-ratelimit-limit-requests": "2", "x-ratelimit-remaining-requests": "0",
		"x-ratelimit-reset-requests": "50s", "retry-after": "20",
	}
	if r.status != http.StatusTooManyRequests {
		t.Fatalf("status %d", r.status)
	}
	if diff := cmp.Diff(want, quotaHeaders(r.header)); diff != "" {
		t.Errorf("429 headers (-want +got):\n%s", diff)
	}
	if !strings.Contains(string(r.body), `"type":"requests"`) {
		t.Errorf("body %s", r.body)
	}
	fc.Step(20 * time.Second)
	if r := post(t, context.Background(), ts.URL, chatBody("")); r.status != http.StatusOK {
		t.Errorf("after refill: status %d", r.status)
	}
}

// TestThrottleLongerWaitWins: both buckets short; the 429 names the
// dimension with the longer wait and retry-after covers both.
func TestThrottleLongerWaitWins(t *testing.T) {
	_, ts, _ := newTestServer(t, Config{RequestsPerMinute: 1, TokensPerMinute: 600, OutputTokens: 100})
	// Uses the only request and 8+292 = 300 tokens; 100 are generated, so 192 are refunded.
	if r := post(t, context.Background(), ts.URL, chatBody(`"max_tokens":292`)); r.status != http.StatusOK {
		t.Fatalf("status %d", r.status)
	}
	// Tokens: 600-300+192 = 492; need 8+592 = 600 -> 108 short at 10/s = 10.8 s. Requests: 60 s.
	r := post(t, context.Background(), ts.URL, chatBody(`"max_tokens":592`))
	if r.status != http.StatusTooManyRequests || r.header.Get("retry-after") != "60" ||
		!strings.Contains(string(r.body), `"type":"requests"`) {
		t.Errorf("status %d retry-after %q body %s", r.status, r.header.Get("retry-after"), r.body)
	}
}

// TestRequestTooLarge: a charge above the tokens capacity can never fit: 429
// "Request too large" without retry-after, charged nothing.
func TestRequestTooLarge(t *testing.T) {
	s, ts, _ := newTestServer(t, Config{TokensPerMinute: 1000})
	r := post(t, context.Background(), ts.URL, chatBody(`"max_tokens":993`)) // 8+993 = 1001
	if r.status != http.StatusTooManyRequests || r.header.Get("retry-after") != "" ||
		r.header.Get("x-ratelimit-remaining-tokens") != "1000" ||
		!strings.Contains(string(r.body), "Request too large") || !strings.Contains(string(r.body), "Limit 1000, Requested 1001") {
		t.Errorf("status %d headers %v body %s", r.status, quotaHeaders(r.header), r.body)
	}
	if st := s.Stats(); st.Throttled != 1 || st.PromptTokens != 0 {
		t.Errorf("stats %+v", st)
	}
	if r := post(t, context.Background(), ts.URL, chatBody(`"max_tokens":992`)); r.status != http.StatusOK {
		t.Errorf("exactly capacity: status %d", r.status)
	}
}

// TestDefaultReservation: without max_completion_tokens or max_tokens the
// reservation is DefaultMaxOutputTokens.
func TestDefaultReservation(t *testing.T) {
	_, ts, _ := newTestServer(t, Config{TokensPerMinute: 6000})
	r := post(t, context.Background(), ts.URL, chatBody(""))
	if got, want := r.header.Get("x-ratelimit-remaining-tokens"), fmt.Sprint(6000-helloPrompt-DefaultMaxOutputTokens); got != want {
		t.Errorf("remaining %s, want %s", got, want)
	}
	var c chatCompletion
	if err := json.Unmarshal(r.body, &c); err != nil || c.Usage.CompletionTokens != DefaultOutputTokens {
		t.Errorf("usage %+v err %v", c.Usage, err)
	}
}

// TestConcurrentNeverOversubscribes: 40 concurrent requests of 100 tokens
// against a 1000-token bucket with a frozen clock: exactly 10 are admitted.
func TestConcurrentNeverOversubscribes(t *testing.T) {
	s, ts, _ := newTestServer(t, Config{TokensPerMinute: 1000, OutputTokens: 1000})
	const n = 40
	codes := make(chan int, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes <- post(t, context.Background(), ts.URL, chatBody(`"max_tokens":92`)).status
		}()
	}
	wg.Wait()
	close(codes)
	count := map[int]int{}
	for c := range codes {
		count[c]++
	}
	if diff := cmp.Diff(map[int]int{200: 10, 429: 30}, count); diff != "" {
		t.Errorf("status counts (-want +got):\n%s", diff)
	}
	st := s.Stats()
	st.MaxConcurrent = 0 // scheduling-dependent
	// The tenth admission leaves 0 tokens: the quota ran short at t0.
	want := Stats{Requests: 40, Succeeded: 10, Throttled: 30, PromptTokens: 10 * helloPrompt, CompletionTokens: 920,
		FirstExhausted: t0, LastExhausted: t0}
	if diff := cmp.Diff(want, st); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]Level{"tokens": {Level: 0, Limit: 1000}}, s.Levels()); diff != "" {
		t.Errorf("levels (-want +got):\n%s", diff)
	}
}

// sseData returns the payloads of the "data: " lines of an event stream.
func sseData(t *testing.T, body []byte) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	for sc.Scan() {
		if p, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, p)
		} else if sc.Text() != "" {
			t.Fatalf("unexpected line %q", sc.Text())
		}
	}
	return out
}

func TestStreaming(t *testing.T) {
	for _, tc := range []struct {
		name         string
		extra        string
		includeUsage bool
	}{
		{"no stream_options", `"stream":true,"max_tokens":5`, false},
		{"include_usage false", `"stream":true,"max_tokens":5,"stream_options":{"include_usage":false}`, false},
		{"include_usage true", `"stream":true,"max_tokens":5,"stream_options":{"include_usage":true}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, ts, _ := newTestServer(t, Config{TokensPerMinute: 6000, RequestsPerMinute: 60, OutputTokens: 20})
			r := post(t, context.Background(), ts.URL, chatBody(tc.extra))
			if r.status != http.StatusOK || r.header.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("status %d content-type %q", r.status, r.header.Get("Content-Type"))
			}
			if diff := cmp.Diff(hdr(60, 59, "1s", 6000, 6000-13, "130ms"), quotaHeaders(r.header)); diff != "" {
				t.Errorf("headers (-want +got):\n%s", diff)
			}
			data := sseData(t, r.body)
			if data[len(data)-1] != "[DONE]" {
				t.Fatalf("last event %q, want [DONE]", data[len(data)-1])
			}
			var content strings.Builder
			var finishes []string
			var usages []string
			for i, d := range data[:len(data)-1] {
				var raw map[string]json.RawMessage
				if err := json.Unmarshal([]byte(d), &raw); err != nil {
					t.Fatalf("event %d: %v", i, err)
				}
				u, hasUsage := raw["usage"]
				if hasUsage != tc.includeUsage {
					t.Errorf("event %d: usage present %v, want %v", i, hasUsage, tc.includeUsage)
				}
				var ch chunk
				if err := json.Unmarshal([]byte(d), &ch); err != nil {
					t.Fatal(err)
				}
				if ch.Object != "chat.completion.chunk" {
					t.Errorf("event %d: object %q", i, ch.Object)
				}
				if len(ch.Choices) == 0 {
					usages = append(usages, string(u))
					if i != len(data)-2 {
						t.Errorf("usage chunk at %d, want last before [DONE]", i)
					}
					continue
				}
				if hasUsage && string(u) != "null" {
					t.Errorf("event %d: usage %s, want null", i, u)
				}
				c := ch.Choices[0]
				if (c.Delta.Role == "assistant") != (i == 0) {
					t.Errorf("event %d: role %q", i, c.Delta.Role)
				}
				if c.Delta.Content != nil {
					if n, _ := countText(*c.Delta.Content); n != 1 {
						t.Errorf("event %d: content %q is %d tokens, want 1", i, *c.Delta.Content, n)
					}
					content.WriteString(*c.Delta.Content)
				}
				if c.FinishReason != nil {
					finishes = append(finishes, *c.FinishReason)
				}
			}
			if content.String() != fillerText(5) {
				t.Errorf("content %q", content.String())
			}
			if diff := cmp.Diff([]string{"length"}, finishes); diff != "" {
				t.Errorf("finish reasons (-want +got):\n%s", diff)
			}
			var wantUsages []string
			if tc.includeUsage {
				wantUsages = []string{`{"prompt_tokens":8,"completion_tokens":5,"total_tokens":13}`}
			}
			if diff := cmp.Diff(wantUsages, usages); diff != "" {
				t.Errorf("usage chunks (-want +got):\n%s", diff)
			}
			if st := s.Stats(); st.Succeeded != 1 || st.CompletionTokens != 5 {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

// waitFor polls cond (server goroutines reaching a fake-clock wait) for up
// to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestLatencyAndFrames: with Latency 2 s and FrameInterval 100 ms a
// non-streaming reply of 3 tokens waits 2.2 s on the server clock.
func TestLatencyAndFrames(t *testing.T) {
	s, ts, fc := newTestServer(t, Config{Latency: 2 * time.Second, FrameInterval: 100 * time.Millisecond, OutputTokens: 3})
	done := make(chan result, 1)
	go func() { done <- post(t, context.Background(), ts.URL, chatBody("")) }()
	waitFor(t, "the server to wait", fc.HasWaiters)
	fc.Step(2199 * time.Millisecond)
	select {
	case r := <-done:
		t.Fatalf("response before 2.2 s: %d", r.status)
	default:
	}
	if !fc.HasWaiters() || s.Stats().Succeeded != 0 {
		t.Fatal("server stopped waiting before 2.2 s")
	}
	fc.Step(time.Millisecond)
	if r := <-done; r.status != http.StatusOK {
		t.Errorf("status %d", r.status)
	}
}

// TestStreamDisconnectRefunds: a client that leaves after the first frame
// is billed for 1 generated token; the rest of the reservation is refunded.
func TestStreamDisconnectRefunds(t *testing.T) {
	s, ts, fc := newTestServer(t, Config{TokensPerMinute: 6000, FrameInterval: time.Second, OutputTokens: 50})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/chat/completions",
		strings.NewReader(chatBody(`"stream":true,"max_tokens":100`)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q, %v", line, err)
	}
	waitFor(t, "the server to wait for the next frame", fc.HasWaiters)
	cancel()
	resp.Body.Close()
	ts.Close() // blocks until the handler has returned
	want := Stats{Requests: 1, PromptTokens: helloPrompt, CompletionTokens: 1, MaxConcurrent: 1}
	if diff := cmp.Diff(want, s.Stats()); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if got := s.tokens.level; got != 6000-helloPrompt-1 {
		t.Errorf("tokens %v, want %d", got, 6000-helloPrompt-1)
	}
}

func TestBadRequests(t *testing.T) {
	for _, tc := range []struct {
		name, body, wantMsg string
	}{
		{"malformed JSON", `{"messages": [`, "could not parse the JSON body"},
		{"not JSON", `hello`, "could not parse the JSON body"},
		{"wrong type", `{"messages":"hi"}`, "invalid request body"},
		{"no messages", `{"model":"m"}`, "'messages' is a required property"},
		{"max_tokens 0", chatBody(`"max_tokens":0`), "Invalid 'max_tokens'"},
		{"bad content", `{"messages":[{"role":"user","content":42}]}`, "messages[0].content"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, ts, _ := newTestServer(t, Config{TokensPerMinute: 6000})
			r := post(t, context.Background(), ts.URL, tc.body)
			if r.status != http.StatusBadRequest {
				t.Fatalf("status %d", r.status)
			}
			var e apiError
			if err := json.Unmarshal(r.body, &e); err != nil {
				t.Fatal(err)
			}
			if e.Error.Type != "invalid_request_error" || e.Error.Code != nil || !strings.Contains(e.Error.Message, tc.wantMsg) {
				t.Errorf("error body %s", r.body)
			}
			if r.header.Get("x-ratelimit-remaining-tokens") != "6000" {
				t.Errorf("charged: %v", quotaHeaders(r.header))
			}
			if st := s.Stats(); st != (Stats{Requests: 1, MaxConcurrent: 1}) {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

func TestOtherRoutes(t *testing.T) {
	s, ts, _ := newTestServer(t, Config{Models: []string{"a", "b"}})
	post(t, context.Background(), ts.URL, chatBody(""))
	for _, tc := range []struct {
		method, path string
		status       int
		body         string
	}{
		{"GET", "/healthz", 200, "ok\n"},
		{"GET", "/stats", 200, `{"requests":1,"succeeded":1,"throttled":0,"prompt_tokens":8,"completion_tokens":32,"max_concurrent":1}` + "\n"},
		{"GET", "/v1/models", 200, `{"object":"list","data":[{"id":"a","object":"model","created":0,"owned_by":"providersim"},{"id":"b","object":"model","created":0,"owned_by":"providersim"}]}` + "\n"},
		{"GET", "/v1/nope", 404, `{"error":{"message":"Unknown request URL: GET /v1/nope.","type":"invalid_request_error","param":null,"code":"unknown_url"}}` + "\n"},
	} {
		req, _ := http.NewRequest(tc.method, ts.URL+tc.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || string(b) != tc.body {
			t.Errorf("%s %s: %d %s", tc.method, tc.path, resp.StatusCode, b)
		}
	}
	if s.Stats().Requests != 1 {
		t.Errorf("stats %+v", s.Stats())
	}
}

func TestSetConfig(t *testing.T) {
	s, ts, _ := newTestServer(t, Config{TokensPerMinute: 6000, OutputTokens: 100})
	post(t, context.Background(), ts.URL, chatBody(`"max_tokens":100`)) // 5892 -> 5892 after refund 0
	if err := s.SetConfig(Config{TokensPerMinute: 6000, RequestsPerMinute: 10, Dialect: "ietf-draft-99"}); err == nil {
		t.Error("unknown dialect accepted")
	}
	if err := s.SetConfig(Config{TokensPerMinute: 1000, RequestsPerMinute: 10, OutputTokens: 100}); err != nil {
		t.Fatal(err)
	}
	r := post(t, context.Background(), ts.URL, chatBody(`"max_tokens":100`))
	// Tokens clamped to 1000 then charged 108; requests start full at 10.
	if diff := cmp.Diff(hdr(10, 9, "6s", 1000, 892, "6.48s"), quotaHeaders(r.header)); diff != "" {
		t.Errorf("headers (-want +got):\n%s", diff)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg Config
		ok  bool
	}{
		{Config{}, true},
		{Config{Dialect: "openai", TokensPerMinute: 1}, true},
		{Config{Dialect: "anthropic"}, true},
		{Config{Dialect: "ietf-legacy", Window: 10 * time.Second}, true},
		{Config{Dialect: "azure", SubWindow: time.Second}, true},
		{Config{Dialect: "classic", ClassicResetForm: "epochms"}, true},
		{Config{Dialect: "klingon"}, false},
		{Config{Dialect: "classic", ClassicResetForm: "minutes"}, false},
		{Config{Window: 1500 * time.Millisecond}, false},
		{Config{Window: 2 * time.Minute}, false},
		{Config{SubWindow: -time.Second}, false},
		{Config{AnthropicRemainingStep: -1}, false},
		{Config{Dialect: "anthropic", InputTokensPerMinute: 1000, OutputTokensPerMinute: 1000, AnthropicHeaders: "tokens"}, true},
		{Config{Dialect: "anthropic", AnthropicHeaders: "inout"}, true},
		{Config{Dialect: "anthropic", AnthropicHeaders: "both"}, false},
		{Config{Dialect: "anthropic", InputTokensPerMinute: -1}, false},
		{Config{Dialect: "anthropic", OutputTokensPerMinute: -1}, false},
		{Config{InputTokensPerMinute: 1000}, false},
		{Config{Dialect: "azure", OutputTokensPerMinute: 1000}, false},
		{Config{TokensPerMinute: -1}, false},
		{Config{Latency: -time.Second}, false},
		{Config{OutputTokens: -1}, false},
	} {
		if err := tc.cfg.Validate(); (err == nil) != tc.ok {
			t.Errorf("%+v: err %v", tc.cfg, err)
		}
	}
}
