package providersim

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fairshare-dev/fairshare/internal/throttle"
)

// rateHeaders returns every response header except the transport ones, by
// lower-case name, so a test sees exactly what the dialect added.
func rateHeaders(h http.Header) map[string]string {
	m := map[string]string{}
	for k, v := range h {
		switch k {
		case "Content-Type", "Content-Length", "Date":
			continue
		}
		m[strings.ToLower(k)] = strings.Join(v, " | ")
	}
	return m
}

// req108 is a request charged 8 + 100 = 108 tokens and, with OutputTokens
// 100, never refunded.
var req108 = chatBody(`"max_tokens":100`)

func postN(t *testing.T, url string, n int) result {
	t.Helper()
	var r result
	for i := range n {
		if r = post(t, context.Background(), url, req108); r.status != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i+1, r.status, r.body)
		}
	}
	return r
}

func wantHeaders(t *testing.T, what string, r result, want map[string]string) {
	t.Helper()
	if diff := cmp.Diff(want, rateHeaders(r.header)); diff != "" {
		t.Errorf("%s: headers (-want +got):\n%s", what, diff)
	}
}

// TestDialectAnthropic: the AnthropicHeadersTokens mode (tokens triplet
// only, remaining rounded down).
func TestDialectAnthropic(t *testing.T) {
	_, ts, fc := newTestServer(t, Config{Dialect: DialectAnthropic, TokensPerMinute: 60000, RequestsPerMinute: 50, OutputTokens: 100000,
		AnthropicHeaders: AnthropicHeadersTokens})
	fc.Step(500 * time.Millisecond)
	r := postN(t, ts.URL, 1)
	// Tokens 59892 rounded down to 59000; full again after 108/1000 s =
	// 00:00:00.608, rounded up to the second. Requests full after 1.2 s.
	wantHeaders(t, "first", r, map[string]string{
		"anthropic-ratelimit-requests-limit": "50", "anthropic-ratelimit-requests-remaining": "49",
		"anthropic-ratelimit-requests-reset": "2026-01-01T00:00:02Z",
		"anthropic-ratelimit-tokens-limit":   "60000", "anthropic-ratelimit-tokens-remaining": "59000",
		"anthropic-ratelimit-tokens-reset": "2026-01-01T00:00:01Z",
	})
	// Drain the tokens to 59892-59000 = 892 with a big request, then ask 1008.
	if r := post(t, context.Background(), ts.URL, chatBody(`"max_tokens":58992`)); r.status != http.StatusOK {
		t.Fatalf("drain: %d %s", r.status, r.body)
	}
	r = post(t, context.Background(), ts.URL, chatBody(`"max_tokens":1000`))
	if r.status != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429", r.status)
	}
	// 1008-892 = 116 tokens at 1000/s: 0.116 s, retry-after 1. Tokens
	// remaining 892 reads 0; full after 59108/1000 s from 00:00:00.5 =
	// 00:00:59.608 -> 00:01:00.
	wantHeaders(t, "429", r, map[string]string{
		"anthropic-ratelimit-requests-limit": "50", "anthropic-ratelimit-requests-remaining": "48",
		"anthropic-ratelimit-requests-reset": "2026-01-01T00:00:03Z",
		"anthropic-ratelimit-tokens-limit":   "60000", "anthropic-ratelimit-tokens-remaining": "0",
		"anthropic-ratelimit-tokens-reset": "2026-01-01T00:01:00Z",
		"retry-after":                      "1",
	})
	var e anthropicErrorBody
	if err := json.Unmarshal(r.body, &e); err != nil || e.Type != "error" || e.Error.Type != "rate_limit_error" ||
		!strings.Contains(e.Error.Message, "rate limit of 60000 tokens per minute") {
		t.Errorf("429 body %s (%v)", r.body, err)
	}
	r = post(t, context.Background(), ts.URL, "{")
	if err := json.Unmarshal(r.body, &e); r.status != http.StatusBadRequest || err != nil || e.Error.Type != "invalid_request_error" {
		t.Errorf("400 body %d %s", r.status, r.body)
	}
}

func TestDialectAnthropicExactStep(t *testing.T) {
	_, ts, _ := newTestServer(t, Config{Dialect: DialectAnthropic, TokensPerMinute: 60000, AnthropicRemainingStep: 1, OutputTokens: 100})
	if got := postN(t, ts.URL, 1).header.Get("anthropic-ratelimit-tokens-remaining"); got != "59892" {
		t.Errorf("remaining %q, want 59892", got)
	}
}

// TestDialectAzureSubWindow: TPM 6000 over 10 s sub-windows is 1000 tokens
// per sub-window; the tenth 108-token request exceeds it while the minute's
// remaining is 5028.
func TestDialectAzureSubWindow(t *testing.T) {
	s, ts, fc := newTestServer(t, Config{Dialect: DialectAzure, TokensPerMinute: 6000, RequestsPerMinute: 60,
		SubWindow: 10 * time.Second, OutputTokens: 100})
	// Tokens full again after 108 / 100 per s = 1.08 s, rounded up to 2.
	wantHeaders(t, "first", postN(t, ts.URL, 1), map[string]string{
		"x-ratelimit-remaining-requests": "59", "x-ratelimit-remaining-tokens": "5892",
		"x-ratelimit-limit-tokens": "6000", "x-ratelimit-reset-tokens": "2",
	})
	postN(t, ts.URL, 8) // 9 x 108 = 972 in this sub-window
	fc.Step(2500 * time.Millisecond)
	r := post(t, context.Background(), ts.URL, req108)
	if r.status != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429 (sub-window)", r.status)
	}
	// Minute buckets: 6000 - 972 + 2.5 s x 100/s = 5278 tokens, 51 + 2.5 = 53.5 requests.
	wantHeaders(t, "429", r, map[string]string{
		"x-ratelimit-remaining-requests": "53", "x-ratelimit-remaining-tokens": "5278",
		"x-ratelimit-limit-tokens": "6000", "x-ratelimit-reset-tokens": "8", // 722 tokens: 7.22 s
		"retry-after": "8", "retry-after-ms": "7500", "x-ms-retry-after-ms": "7500",
	})
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if err := json.Unmarshal(r.body, &e); err != nil || e.Error.Code != "429" ||
		!strings.Contains(e.Error.Message, "exceeded token rate limit") || !strings.Contains(e.Error.Message, "retry after 8 seconds") {
		t.Errorf("429 body %s (%v)", r.body, err)
	}
	fc.Step(7500 * time.Millisecond) // the next sub-window: 00:00:10
	wantHeaders(t, "next sub-window", postN(t, ts.URL, 1), map[string]string{
		"x-ratelimit-remaining-requests": "59", "x-ratelimit-remaining-tokens": "5892",
		"x-ratelimit-limit-tokens": "6000", "x-ratelimit-reset-tokens": "2",
	})
	if st := s.Stats(); st.Throttled != 1 || st.Succeeded != 10 {
		t.Errorf("stats %+v", st)
	}
}

// TestDialectAzureRequestsSubWindow: RPM 60 over 1 s sub-windows is one
// request per second.
func TestDialectAzureRequestsSubWindow(t *testing.T) {
	_, ts, fc := newTestServer(t, Config{Dialect: DialectAzure, RequestsPerMinute: 60, SubWindow: time.Second})
	fc.Step(250 * time.Millisecond)
	postN(t, ts.URL, 1)
	r := post(t, context.Background(), ts.URL, req108)
	wantHeaders(t, "second in the same second", r, map[string]string{
		"x-ratelimit-remaining-requests": "59", "retry-after": "1", "retry-after-ms": "750", "x-ms-retry-after-ms": "750",
	})
	if r.status != http.StatusTooManyRequests || !strings.Contains(string(r.body), "exceeded request rate limit") {
		t.Errorf("status %d body %s", r.status, r.body)
	}
}

func TestDialectClassic(t *testing.T) {
	for _, tc := range []struct {
		form, reset string
		httpDate    bool
		retryAfter  string
	}{
		{"", "8", false, "8"},
		{ClassicResetDelta, "8", false, "8"},
		{ClassicResetEpoch, "1767225610", false, "8"},
		{ClassicResetEpochMillis, "1767225610000", true, "Thu, 01 Jan 2026 00:00:10 GMT"},
	} {
		t.Run("form="+tc.form, func(t *testing.T) {
			_, ts, fc := newTestServer(t, Config{Dialect: DialectClassic, RequestsPerMinute: 60, TokensPerMinute: 600000,
				Window: 10 * time.Second, ClassicResetForm: tc.form, RetryAfterHTTPDate: tc.httpDate, OutputTokens: 100})
			fc.Step(2500 * time.Millisecond)
			// 10 requests per 10 s window; the reset is the window end, 00:00:10.
			wantHeaders(t, "first", postN(t, ts.URL, 1), map[string]string{
				"x-ratelimit-limit": "10", "x-ratelimit-remaining": "9", "x-ratelimit-reset": tc.reset,
			})
			postN(t, ts.URL, 9)
			r := post(t, context.Background(), ts.URL, req108)
			wantHeaders(t, "429", r, map[string]string{
				"x-ratelimit-limit": "10", "x-ratelimit-remaining": "0", "x-ratelimit-reset": tc.reset, "retry-after": tc.retryAfter,
			})
			var e apiError
			if err := json.Unmarshal(r.body, &e); r.status != http.StatusTooManyRequests || err != nil || e.Error.Code == nil || *e.Error.Code != "rate_limit_exceeded" {
				t.Errorf("429 %d %s", r.status, r.body)
			}
			fc.Step(7500 * time.Millisecond) // 00:00:10: a new window, full
			r = postN(t, ts.URL, 1)
			if got := r.header.Get("X-RateLimit-Remaining"); got != "9" {
				t.Errorf("new window remaining %q", got)
			}
		})
	}
}

func TestDialectIETF(t *testing.T) {
	_, ts, fc := newTestServer(t, Config{Dialect: DialectIETF, RequestsPerMinute: 600, TokensPerMinute: 6000,
		Window: 10 * time.Second, OutputTokens: 100})
	fc.Step(2500 * time.Millisecond)
	policy := `"requests";q=100;w=10, "tokens";q=1000;qu="tokens";w=10`
	wantHeaders(t, "first", postN(t, ts.URL, 1), map[string]string{
		"ratelimit-policy": policy, "ratelimit": `"requests";r=99;t=8, "tokens";r=892;t=8`,
	})
	postN(t, ts.URL, 8) // 972 tokens
	r := post(t, context.Background(), ts.URL, req108)
	wantHeaders(t, "429", r, map[string]string{
		"ratelimit-policy": policy, "ratelimit": `"requests";r=91;t=8, "tokens";r=28;t=8`, "retry-after": "8",
	})
	var p struct {
		Type     string   `json:"type"`
		Status   int      `json:"status"`
		Violated []string `json:"violated-policies"`
	}
	if err := json.Unmarshal(r.body, &p); r.status != http.StatusTooManyRequests || err != nil ||
		r.header.Get("Content-Type") != "application/problem+json" ||
		p.Type != "https://iana.org/assignments/http-problem-types#quota-exceeded" || p.Status != 429 || !cmp.Equal(p.Violated, []string{"tokens"}) {
		t.Errorf("429 %d %q %s", r.status, r.header.Get("Content-Type"), r.body)
	}
}

func TestDialectIETFLegacy(t *testing.T) {
	_, ts, fc := newTestServer(t, Config{Dialect: DialectIETFLegacy, RequestsPerMinute: 60, Window: 10 * time.Second})
	fc.Step(2500 * time.Millisecond)
	wantHeaders(t, "first", postN(t, ts.URL, 1), map[string]string{
		"ratelimit-limit": "10", "ratelimit-remaining": "9", "ratelimit-reset": "8", "ratelimit-policy": "10;w=10",
	})
	postN(t, ts.URL, 9)
	r := post(t, context.Background(), ts.URL, req108)
	wantHeaders(t, "429", r, map[string]string{
		"ratelimit-limit": "10", "ratelimit-remaining": "0", "ratelimit-reset": "8", "ratelimit-policy": "10;w=10", "retry-after": "8",
	})
	if !strings.Contains(string(r.body), `"violated-policies":["default"]`) {
		t.Errorf("body %s", r.body)
	}
}

// truth is the simulator's own view of one dimension after a response.
type truth struct {
	limit, remaining int64
	reset            time.Duration
}

func (s *Server) truths() (req, tok truth) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advance(s.clock.Now())
	return truth{int64(s.requests.limit), s.requests.remaining(), s.requests.resetIn()},
		truth{int64(s.tokens.limit), s.tokens.remaining(), s.tokens.resetIn()}
}

// TestRoundTrip: in every dialect, throttle.ParseHeaders (and
// ParseHeadersDialect with the matching hint) reads from the simulator's
// headers its true limit, remaining and reset, within the dialect's
// documented rounding, over a sequence of requests at various times.
func TestRoundTrip(t *testing.T) {
	type bounds struct {
		limit            bool          // the limit is sent
		remainingStep    int64         // remaining within (truth-step, truth]; 1 = exact
		nearest          bool          // remaining within [truth-step/2, truth+step/2) instead, capped at the limit
		resetLo, resetHi time.Duration // parsed reset - true reset in [lo, hi]; hi < 0: no reset sent
	}
	for _, tc := range []struct {
		cfg      Config
		hint     string
		label    string
		req, tok *bounds // nil: the dimension is not described
	}{
		{Config{Dialect: DialectOpenAI}, "OpenAI", throttle.DialectOpenAI,
			&bounds{true, 1, false, -time.Millisecond / 2, time.Millisecond / 2}, &bounds{true, 1, false, -time.Millisecond / 2, time.Millisecond / 2}},
		{Config{Dialect: DialectAnthropic}, "Anthropic", throttle.DialectAnthropic,
			&bounds{true, 1, false, 0, time.Second}, &bounds{true, DefaultAnthropicRemainingStep, true, 0, time.Second}},
		{Config{Dialect: DialectAnthropic, AnthropicHeaders: AnthropicHeadersTokens}, "Anthropic", throttle.DialectAnthropic,
			&bounds{true, 1, false, 0, time.Second}, &bounds{true, DefaultAnthropicRemainingStep, false, 0, time.Second}},
		{Config{Dialect: DialectAzure, SubWindow: 10 * time.Second}, "Azure", throttle.DialectAzure,
			&bounds{false, 1, false, 0, -1}, &bounds{true, 1, false, 0, time.Second}},
		{Config{Dialect: DialectClassic, Window: 10 * time.Second}, "Classic", throttle.DialectClassic,
			&bounds{true, 1, false, 0, time.Second}, nil},
		{Config{Dialect: DialectClassic, Window: 10 * time.Second, ClassicResetForm: ClassicResetEpoch}, "Classic", throttle.DialectClassic,
			&bounds{true, 1, false, 0, time.Second}, nil},
		{Config{Dialect: DialectClassic, Window: 10 * time.Second, ClassicResetForm: ClassicResetEpochMillis}, "Classic", throttle.DialectClassic,
			&bounds{true, 1, false, 0, time.Millisecond}, nil},
		{Config{Dialect: DialectIETF, Window: 10 * time.Second}, "IETF", throttle.DialectIETF,
			&bounds{true, 1, false, 0, time.Second}, &bounds{true, 1, false, 0, time.Second}},
		{Config{Dialect: DialectIETFLegacy, Window: 10 * time.Second}, "IETF", throttle.DialectIETF,
			&bounds{true, 1, false, 0, time.Second}, nil},
	} {
		name := tc.cfg.Dialect + "/" + tc.cfg.ClassicResetForm + tc.cfg.AnthropicHeaders
		t.Run(name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.TokensPerMinute, cfg.RequestsPerMinute, cfg.OutputTokens = 120000, 1200, 40
			s, ts, fc := newTestServer(t, cfg)
			check := func(what string, b *bounds, d throttle.Dimension, tr truth) {
				t.Helper()
				if b == nil {
					if d.Known() {
						t.Errorf("%s: %+v, want nothing", what, d)
					}
					return
				}
				if d.Dialect != tc.label {
					t.Errorf("%s: dialect %q, want %q", what, d.Dialect, tc.label)
				}
				if wantLimit := map[bool]int64{true: tr.limit, false: -1}[b.limit]; d.Limit != wantLimit {
					t.Errorf("%s: limit %d, want %d", what, d.Limit, wantLimit)
				}
				switch half := b.remainingStep / 2; {
				case b.nearest && (d.Remaining < tr.remaining-half || d.Remaining >= tr.remaining+b.remainingStep-half || d.Remaining > tr.limit):
					t.Errorf("%s: remaining %d, true %d (nearest step %d)", what, d.Remaining, tr.remaining, b.remainingStep)
				case !b.nearest && (d.Remaining > tr.remaining || d.Remaining <= tr.remaining-b.remainingStep):
					t.Errorf("%s: remaining %d, true %d (step %d)", what, d.Remaining, tr.remaining, b.remainingStep)
				}
				switch diff := d.Reset - tr.reset; {
				case b.resetHi < 0 && d.Reset != -1:
					t.Errorf("%s: reset %v, want none", what, d.Reset)
				case b.resetHi >= 0 && (diff < b.resetLo || diff > b.resetHi):
					t.Errorf("%s: reset %v, true %v (allowed %v..%v)", what, d.Reset, tr.reset, b.resetLo, b.resetHi)
				}
			}
			steps := []time.Duration{0, 137 * time.Millisecond, 0, 2 * time.Second, 999 * time.Millisecond, 0, 7300 * time.Millisecond, 41 * time.Millisecond}
			for i := range 40 {
				fc.Step(steps[i%len(steps)])
				prompt := []string{`"max_tokens":100`, `"max_tokens":2500`, `"max_tokens":7`}[i%3]
				r := post(t, context.Background(), ts.URL, chatBody(prompt))
				if r.status != http.StatusOK && r.status != http.StatusTooManyRequests {
					t.Fatalf("status %d: %s", r.status, r.body)
				}
				// The refund happens before the response is written: the
				// headers describe the buckets at admission, so compare with
				// the truth at admission, which is the truth now plus the
				// refund (0 for a 429).
				req, tok := s.truths()
				if r.status == http.StatusOK {
					gen := min(int64(40), map[int]int64{0: 100, 1: 2500, 2: 7}[i%3])
					refund := map[int]int64{0: 100, 1: 2500, 2: 7}[i%3] - gen
					if tok.limit > 0 && refund > 0 {
						tok = truthBefore(tok, refund, s, cfg)
					}
				}
				q := throttle.ParseHeaders(r.header, s.clock.Now())
				what := fmt.Sprintf("#%d (%d)", i, r.status)
				check(what+" requests", tc.req, q.Requests, req)
				check(what+" tokens", tc.tok, q.Tokens, tok)
				if q.Malformed != 0 {
					t.Errorf("%s: %d malformed", what, q.Malformed)
				}
				if qd := throttle.ParseHeadersDialect(r.header, s.clock.Now(), tc.hint); !cmp.Equal(qd, q) {
					t.Errorf("%s: ParseHeadersDialect(%s) differs: %s", what, tc.hint, cmp.Diff(q, qd))
				}
				if r.status == http.StatusTooManyRequests {
					if ra, ok := throttle.ParseRetryAfter(r.header, s.clock.Now()); !ok || ra <= 0 {
						t.Errorf("%s: 429 without a usable Retry-After: %v", what, r.header)
					}
				}
			}
		})
	}
}

// truthBefore undoes a refund of n tokens on a tokens truth (the response's
// headers were written at admission, before the refund).
func truthBefore(tr truth, n int64, s *Server, cfg Config) truth {
	s.mu.Lock()
	level := s.tokens.level - float64(n)
	fixed := s.tokens.window > 0
	s.mu.Unlock()
	tr.remaining = int64(math.Floor(level))
	if !fixed {
		tr.reset = seconds((float64(tr.limit) - level) / (float64(cfg.TokensPerMinute) / 60))
	}
	return tr
}

// TestAnthropicRemaining: nearest rounding (ties up, capped at the limit)
// in the inout mode, down in the tokens mode.
func TestAnthropicRemaining(t *testing.T) {
	for _, tc := range []struct {
		v, limit int64
		mode     string
		step     int64
		want     int64
	}{
		{600, 6000, "", 0, 1000}, // above the truth: the dangerous case
		{499, 6000, "", 0, 0},
		{500, 6000, "", 0, 1000},
		{1499, 6000, AnthropicHeadersInOut, 0, 1000},
		{5992, 6000, "", 0, 6000},
		{5600, 5800, "", 0, 5800}, // 6000 capped at the limit
		{0, 6000, "", 0, 0},
		{149, 6000, "", 100, 100},
		{1999, 6000, AnthropicHeadersTokens, 0, 1000},
		{600, 6000, AnthropicHeadersTokens, 0, 0},
		{1234, 6000, "", 1, 1234},
	} {
		cfg := Config{Dialect: DialectAnthropic, AnthropicHeaders: tc.mode, AnthropicRemainingStep: tc.step}
		if got := anthropicRemaining(tc.v, tc.limit, cfg); got != tc.want {
			t.Errorf("%+v: %d, want %d", tc, got, tc.want)
		}
	}
}

// theBody is a request whose prompt is n+6 tokens (n " the" tokens, the
// message overhead and the reply priming) with the given max_tokens.
func theBody(n, maxTokens int) string {
	return fmt.Sprintf(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":%q}],"max_tokens":%d}`,
		strings.Repeat(" the", n), maxTokens)
}

// TestDialectAnthropicInOut: the default mode sends the input-tokens and
// output-tokens triplets of separate ITPM and OTPM buckets, remaining
// rounded to the nearest thousand — up as well as down, so a header can
// promise more than is left and the next request still be refused.
// OutputTokens is large, so every request generates its max_tokens and
// nothing is refunded.
func TestDialectAnthropicInOut(t *testing.T) {
	s, ts, fc := newTestServer(t, Config{Dialect: DialectAnthropic, InputTokensPerMinute: 6000, OutputTokensPerMinute: 3000,
		RequestsPerMinute: 600, OutputTokens: 100000})
	fc.Step(500 * time.Millisecond)
	// Input 6000-8 = 5992 reads 6000, full after 8/100 s; output 3000-100 =
	// 2900 reads 3000, full after 100/50 = 2 s (00:00:02.5 -> :03);
	// requests 599, full after 0.1 s.
	wantHeaders(t, "first", postN(t, ts.URL, 1), map[string]string{
		"anthropic-ratelimit-requests-limit": "600", "anthropic-ratelimit-requests-remaining": "599",
		"anthropic-ratelimit-requests-reset":     "2026-01-01T00:00:01Z",
		"anthropic-ratelimit-input-tokens-limit": "6000", "anthropic-ratelimit-input-tokens-remaining": "6000",
		"anthropic-ratelimit-input-tokens-reset":  "2026-01-01T00:00:01Z",
		"anthropic-ratelimit-output-tokens-limit": "3000", "anthropic-ratelimit-output-tokens-remaining": "3000",
		"anthropic-ratelimit-output-tokens-reset": "2026-01-01T00:00:03Z",
	})
	// Output 2900-2300 = 600 reads 1000; full after 2400/50 = 48 s.
	r := post(t, context.Background(), ts.URL, chatBody(`"max_tokens":2300`))
	if r.status != http.StatusOK {
		t.Fatalf("second: %d %s", r.status, r.body)
	}
	wantHeaders(t, "second", r, map[string]string{
		"anthropic-ratelimit-requests-limit": "600", "anthropic-ratelimit-requests-remaining": "598",
		"anthropic-ratelimit-requests-reset":     "2026-01-01T00:00:01Z",
		"anthropic-ratelimit-input-tokens-limit": "6000", "anthropic-ratelimit-input-tokens-remaining": "6000",
		"anthropic-ratelimit-input-tokens-reset":  "2026-01-01T00:00:01Z",
		"anthropic-ratelimit-output-tokens-limit": "3000", "anthropic-ratelimit-output-tokens-remaining": "1000",
		"anthropic-ratelimit-output-tokens-reset": "2026-01-01T00:00:49Z",
	})
	// "1000" left, but 700 output tokens do not fit in the 600 really left:
	// 429 on output tokens, (700-600)/50 = 2 s; nothing charged.
	r = post(t, context.Background(), ts.URL, chatBody(`"max_tokens":700`))
	if r.status != http.StatusTooManyRequests {
		t.Fatalf("third: status %d, want 429", r.status)
	}
	wantHeaders(t, "third", r, map[string]string{
		"anthropic-ratelimit-requests-limit": "600", "anthropic-ratelimit-requests-remaining": "598",
		"anthropic-ratelimit-requests-reset":     "2026-01-01T00:00:01Z",
		"anthropic-ratelimit-input-tokens-limit": "6000", "anthropic-ratelimit-input-tokens-remaining": "6000",
		"anthropic-ratelimit-input-tokens-reset":  "2026-01-01T00:00:01Z",
		"anthropic-ratelimit-output-tokens-limit": "3000", "anthropic-ratelimit-output-tokens-remaining": "1000",
		"anthropic-ratelimit-output-tokens-reset": "2026-01-01T00:00:49Z",
		"retry-after": "2",
	})
	var e anthropicErrorBody
	if err := json.Unmarshal(r.body, &e); err != nil || e.Error.Type != "rate_limit_error" ||
		!strings.Contains(e.Error.Message, "rate limit of 3000 output tokens per minute") {
		t.Errorf("429 body %s (%v)", r.body, err)
	}
	// 2 s later (00:00:02.5): input full again, output 700, requests 600.
	// A 5400-token prompt with max_tokens 700: input 600 reads 1000 (full
	// after 54 s: 00:00:56.5 -> :57), output 0 (full after 60 s).
	fc.Step(2 * time.Second)
	r = post(t, context.Background(), ts.URL, theBody(5394, 700))
	if r.status != http.StatusOK {
		t.Fatalf("fourth: %d %s", r.status, r.body)
	}
	wantHeaders(t, "fourth", r, map[string]string{
		"anthropic-ratelimit-requests-limit": "600", "anthropic-ratelimit-requests-remaining": "599",
		"anthropic-ratelimit-requests-reset":     "2026-01-01T00:00:03Z",
		"anthropic-ratelimit-input-tokens-limit": "6000", "anthropic-ratelimit-input-tokens-remaining": "1000",
		"anthropic-ratelimit-input-tokens-reset":  "2026-01-01T00:00:57Z",
		"anthropic-ratelimit-output-tokens-limit": "3000", "anthropic-ratelimit-output-tokens-remaining": "0",
		"anthropic-ratelimit-output-tokens-reset": "2026-01-01T00:01:03Z",
	})
	// A prompt of 606 tokens does not fit the 600 input tokens left (output
	// is short too, but input's wait, 0.06 s, is shorter than output's 2 s):
	// the longer wait names the limit.
	r = post(t, context.Background(), ts.URL, theBody(600, 100))
	if r.status != http.StatusTooManyRequests || r.header.Get("retry-after") != "2" ||
		!strings.Contains(string(r.body), "3000 output tokens per minute") {
		t.Errorf("fifth: %d %v %s", r.status, r.header, r.body)
	}
	fc.Step(time.Second) // output 50, input 700
	r = post(t, context.Background(), ts.URL, theBody(800, 10))
	if r.status != http.StatusTooManyRequests || r.header.Get("retry-after") != "2" ||
		!strings.Contains(string(r.body), "6000 input tokens per minute") {
		t.Errorf("sixth: %d %v %s", r.status, r.header, r.body) // (806-700)/100 = 1.06 s -> 2
	}
	st := s.Stats()
	if want := t0.Add(500 * time.Millisecond); !st.FirstExhausted.Equal(want) || st.Throttled != 3 || st.Succeeded != 3 {
		t.Errorf("stats %+v, want exhausted at %v (output 600 < 2300 after the second), 3 throttled, 3 succeeded", st, want)
	}
	if want := t0.Add(3500 * time.Millisecond); !st.LastExhausted.Equal(want) {
		t.Errorf("last exhausted %v, want %v (the sixth)", st.LastExhausted, want)
	}
}

// TestDialectAnthropicInOutRefund: output is charged max_tokens on receipt
// and the unused part refunded at the end of the response; the tokens
// triplet describes the TokensPerMinute bucket, rounded the same way.
func TestDialectAnthropicInOutRefund(t *testing.T) {
	s, ts, _ := newTestServer(t, Config{Dialect: DialectAnthropic, InputTokensPerMinute: 6000, OutputTokensPerMinute: 3000,
		TokensPerMinute: 60000, OutputTokens: 20})
	// Output 3000-2000 = 1000 at admission (full after 40 s), input 5992,
	// tokens 60000-2008 = 57992 reads 58000 (full after 2.008 s).
	r := post(t, context.Background(), ts.URL, chatBody(`"max_tokens":2000`))
	wantHeaders(t, "first", r, map[string]string{
		"anthropic-ratelimit-input-tokens-limit": "6000", "anthropic-ratelimit-input-tokens-remaining": "6000",
		"anthropic-ratelimit-input-tokens-reset":  "2026-01-01T00:00:01Z",
		"anthropic-ratelimit-output-tokens-limit": "3000", "anthropic-ratelimit-output-tokens-remaining": "1000",
		"anthropic-ratelimit-output-tokens-reset": "2026-01-01T00:00:40Z",
		"anthropic-ratelimit-tokens-limit":        "60000", "anthropic-ratelimit-tokens-remaining": "58000",
		"anthropic-ratelimit-tokens-reset": "2026-01-01T00:00:03Z",
	})
	// 1980 refunded to output (2980) and tokens (59972). Then 108: output
	// 2880 reads 3000 (full after 120/50 = 2.4 s), tokens 59864 reads 60000
	// (full after 0.136 s), input 5984.
	wantHeaders(t, "second", postN(t, ts.URL, 1), map[string]string{
		"anthropic-ratelimit-input-tokens-limit": "6000", "anthropic-ratelimit-input-tokens-remaining": "6000",
		"anthropic-ratelimit-input-tokens-reset":  "2026-01-01T00:00:01Z",
		"anthropic-ratelimit-output-tokens-limit": "3000", "anthropic-ratelimit-output-tokens-remaining": "3000",
		"anthropic-ratelimit-output-tokens-reset": "2026-01-01T00:00:03Z",
		"anthropic-ratelimit-tokens-limit":        "60000", "anthropic-ratelimit-tokens-remaining": "60000",
		"anthropic-ratelimit-tokens-reset": "2026-01-01T00:00:01Z",
	})
	s.mu.Lock()
	in, out, tok := s.input.level, s.output.level, s.tokens.level
	s.mu.Unlock()
	// 80 refunded: output 2880+80, tokens 59864+80.
	if in != 5984 || out != 2960 || tok != 59944 {
		t.Errorf("levels input %v output %v tokens %v, want 5984 2960 59944", in, out, tok)
	}
	if st := s.Stats(); st.CompletionTokens != 40 || !st.FirstExhausted.Equal(t0) {
		t.Errorf("stats %+v, want 40 completion tokens, exhausted at t0 (output 1000 < 2000 after the first)", st)
	}
}
