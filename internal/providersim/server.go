// Package providersim is an OpenAI-compatible LLM provider simulator for the
// demo, end-to-end tests and load tests.
//
// It serves chat completions (plain JSON and server-sent-event streams) and
// enforces a provider quota for real, the way OpenAI documents it: two
// continuously replenished token buckets, one for requests per minute and one
// for tokens per minute, each with capacity = the per-minute limit and a refill
// rate of limit/60 per second. On receipt a request is charged 1 request and
// prompt + max output tokens (OpenAI reserves max_tokens up front); if either
// bucket is short the request is answered 429 and charged nothing. After the
// response is generated the unused part of the output reservation is refunded.
// In the Anthropic dialect, separate input and output buckets (ITPM, OTPM)
// can be enforced too, charged the prompt and the max output tokens.
// Every chat completion response carries the rate-limit headers of the
// configured dialect (Config.Dialect; the provider header reference,
// provider-headers.md, describes each): OpenAI, Anthropic, Azure OpenAI,
// classic X-RateLimit-* or the IETF draft-ietf-httpapi-ratelimit-headers
// fields (structured draft-10/11 or the older draft-03..06 form). The
// classic and IETF dialects enforce fixed windows (Config.Window) instead of
// buckets, as the servers that speak them do; Azure additionally enforces
// the per-minute quota over short sub-windows (Config.SubWindow). See
// dialects.go for the exact header and 429 forms.
//
// # Fault injection
//
// For reliability tests the simulator injects upstream failures into chat
// completions (faults.go): a 5xx with or without Retry-After and
// retry-after-ms ("status=503,retry-after=7"), a connection reset before
// the response ("reset"), a hang past the client's timeout ("hang=30s"), a
// 200 whose JSON body is malformed ("malformed"), a response cut after k
// stream frames or half its JSON body, by a reset ("cut=3"), a 200 without
// usage, JSON or stream ("no-usage"), and a 429 without Retry-After or any
// rate-limit header ("throttle"). A fault applies to every request, to the
// next count=N, or to one request in every=K (the 1st, K+1-th, ...:
// deterministic). Set it in Go with Server.SetFault, over HTTP with
// POST /faults?fault=<spec> (or a JSON Fault body; GET shows it, DELETE
// clears it), or at start with --fault <spec>. Stats.Faults counts the
// faulted requests; Stats.Requests counts every attempt.
package providersim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
)

// Dialects of rate-limit headers and error bodies (Config.Dialect). The exact
// forms are documented on writeQuotaHeaders and writeThrottled.
const (
	// DialectOpenAI emits x-ratelimit-{limit,remaining,reset}-{requests,tokens}
	// with Go-style durations and OpenAI error bodies.
	DialectOpenAI = "openai"
	// DialectAnthropic emits anthropic-ratelimit-*-{limit,remaining,reset}
	// triplets with RFC 3339 resets (which triplets, and the rounding of
	// tokens remaining, per Config.AnthropicHeaders), enforces
	// Config.InputTokensPerMinute and Config.OutputTokensPerMinute, and
	// sends Anthropic error bodies.
	DialectAnthropic = "anthropic"
	// DialectAzure emits x-ratelimit-remaining-{requests,tokens},
	// x-ratelimit-limit-tokens and x-ratelimit-reset-tokens (integer
	// seconds), 429s with retry-after, retry-after-ms and
	// x-ms-retry-after-ms, and enforces Config.SubWindow.
	DialectAzure = "azure"
	// DialectClassic emits X-RateLimit-{Limit,Remaining,Reset} for the
	// requests quota over fixed windows, the reset in Config.ClassicResetForm.
	DialectClassic = "classic"
	// DialectIETF emits the structured RateLimit-Policy and RateLimit fields
	// of draft-ietf-httpapi-ratelimit-headers-10/11 over fixed windows, and
	// application/problem+json quota-exceeded 429 bodies.
	DialectIETF = "ietf"
	// DialectIETFLegacy emits the draft-03..06 RateLimit-{Limit,Remaining,
	// Reset} and RateLimit-Policy "N;w=S" for the requests quota over fixed
	// windows.
	DialectIETFLegacy = "ietf-legacy"
)

// Dialects lists every Config.Dialect value ("" means DialectOpenAI).
var Dialects = []string{DialectOpenAI, DialectAnthropic, DialectAzure, DialectClassic, DialectIETF, DialectIETFLegacy}

// Forms of the classic X-RateLimit-Reset value (Config.ClassicResetForm);
// the provider header reference: "either delta seconds (Envoy, APISIX) or an
// epoch timestamp (GitHub-style)".
const (
	// ClassicResetDelta: whole seconds until the window ends, rounded up.
	ClassicResetDelta = "delta"
	// ClassicResetEpoch: the window end as Unix seconds, rounded up.
	ClassicResetEpoch = "epoch"
	// ClassicResetEpochMillis: the window end as Unix milliseconds, rounded up.
	ClassicResetEpochMillis = "epochms"
)

// DefaultAnthropicRemainingStep is the rounding step, in tokens, of
// Anthropic's tokens remaining (provider-headers.md, Anthropic: "remaining is
// rounded to the nearest thousand").
const DefaultAnthropicRemainingStep = 1000

// Modes of the Anthropic dialect's token headers (Config.AnthropicHeaders).
const (
	// AnthropicHeadersInOut (the default) is Anthropic's documented form
	// (provider-headers.md, Anthropic): the anthropic-ratelimit-input-tokens-*
	// triplet for the InputTokensPerMinute bucket and the
	// anthropic-ratelimit-output-tokens-* triplet for the
	// OutputTokensPerMinute bucket, each sent when that limit is set, with
	// remaining rounded to the NEAREST multiple of AnthropicRemainingStep
	// (ties up) and capped at the limit, so it can exceed what is really left
	// (600 reads 1000); plus the anthropic-ratelimit-tokens-* triplet, the
	// "most restrictive limit in effect", for the TokensPerMinute bucket
	// when that limit is set, rounded the same way.
	AnthropicHeadersInOut = "inout"
	// AnthropicHeadersTokens is the simplified form: the
	// anthropic-ratelimit-tokens-* triplet only (for the TokensPerMinute
	// bucket), remaining rounded DOWN to a multiple of
	// AnthropicRemainingStep, so it never exceeds the truth. Input and
	// output limits, if set, are enforced but not described.
	AnthropicHeadersTokens = "tokens"
)

const (
	// DefaultMaxOutputTokens is the output reservation, in tokens, for a request
	// that sets neither max_completion_tokens nor max_tokens.
	DefaultMaxOutputTokens = 1024
	// DefaultOutputTokens is the number of tokens generated per response when
	// Config.OutputTokens is 0.
	DefaultOutputTokens = 32
	// DefaultModel is the model listed by GET /v1/models when Config.Models is empty.
	DefaultModel = "gpt-4o-mini"
	// maxBodyBytes bounds a request body, in bytes.
	maxBodyBytes = 32 << 20
)

// Config configures a Server. The zero value is an unlimited, instant
// provider in the OpenAI dialect on the real clock.
type Config struct {
	// TokensPerMinute is the tokens quota (TPM): bucket capacity in tokens,
	// refilled at TokensPerMinute/60 tokens per second. 0 = unlimited, and the
	// token headers are omitted.
	TokensPerMinute int64
	// RequestsPerMinute is the requests quota (RPM): bucket capacity in
	// requests, refilled at RequestsPerMinute/60 per second. 0 = unlimited, and
	// the request headers are omitted.
	RequestsPerMinute int64
	// InputTokensPerMinute is Anthropic's input tokens quota (ITPM, dialect
	// anthropic only): a bucket of this capacity in tokens, refilled at
	// InputTokensPerMinute/60 tokens per second, charged the prompt tokens on
	// receipt. 0 = unlimited. It is enforced beside TokensPerMinute (if
	// set), which then acts as a further combined limit.
	InputTokensPerMinute int64
	// OutputTokensPerMinute is Anthropic's output tokens quota (OTPM,
	// dialect anthropic only): a bucket of this capacity in tokens, refilled
	// at OutputTokensPerMinute/60 tokens per second, charged the max output
	// tokens on receipt, the unused part refunded at the end of the response
	// (provider-headers.md, Anthropic: "OTPM rate limits are estimated based
	// on max_tokens at the beginning of each request, and the estimate is
	// adjusted at the end of the request"). 0 = unlimited.
	OutputTokensPerMinute int64
	// Latency is the delay between admission and the first byte of the response.
	Latency time.Duration
	// OutputTokens is the number of tokens generated per response, capped by
	// the request's max_completion_tokens (else max_tokens, else
	// DefaultMaxOutputTokens). 0 means DefaultOutputTokens.
	OutputTokens int64
	// FrameInterval is the delay between two streamed frames (tokens). A
	// non-streaming response is sent when its last frame would have been:
	// Latency + (generated-1)*FrameInterval after admission.
	FrameInterval time.Duration
	// Dialect selects the header and error format and the enforcement: one
	// of Dialects; "" means DialectOpenAI.
	Dialect string
	// Window is the fixed window of the classic, ietf and ietf-legacy
	// dialects: the per-minute limits are enforced as
	// floor(limit*Window/60s) units per window (at least 1), windows aligned
	// on multiples of Window. 0 means 60 s. It must be whole seconds (the
	// IETF w parameter has no sub-second precision) and at most 60 s.
	// Ignored by the other dialects.
	Window time.Duration
	// SubWindow turns on Azure's sub-window enforcement (dialect azure only;
	// provider-headers.md, Azure: "RPM is enforced over 1 s or 10 s
	// sub-windows, so a 429 can come while the remaining count is still
	// positive"): besides the per-minute buckets, each limit is also enforced
	// as floor(limit*SubWindow/60s) units (at least 1) per fixed sub-window,
	// charged on arrival with the same estimate and never refunded (Azure
	// checks an estimate made on arrival). The remaining headers still
	// report the per-minute buckets. 0 = off; otherwise in [1 ms, 60 s].
	SubWindow time.Duration
	// ClassicResetForm is the form of X-RateLimit-Reset in the classic
	// dialect: ClassicResetDelta (""), ClassicResetEpoch or
	// ClassicResetEpochMillis.
	ClassicResetForm string
	// AnthropicRemainingStep is the step, in tokens, that the Anthropic
	// dialect rounds the tokens remaining to: to the nearest multiple in
	// the AnthropicHeadersInOut mode, down in the AnthropicHeadersTokens
	// mode. 0 means DefaultAnthropicRemainingStep; 1 reports exact values.
	AnthropicRemainingStep int64
	// AnthropicHeaders selects the Anthropic dialect's token headers:
	// AnthropicHeadersInOut ("" is the same) or AnthropicHeadersTokens.
	AnthropicHeaders string
	// RetryAfterHTTPDate sends Retry-After on 429s as an RFC 9110
	// IMF-fixdate (the wait rounded up to whole seconds after now) instead of
	// delay-seconds, in every dialect but azure (whose retry-after is seconds
	// beside retry-after-ms).
	RetryAfterHTTPDate bool
	// Models lists the model ids served by GET /v1/models; chat completions
	// accept any model. Empty means [DefaultModel].
	Models []string
	// Clock is the time source for the buckets and delays. nil = the real clock.
	Clock clock.Clock
	// Fault is injected from New on (Server.SetFault; zero Kind: none).
	// SetConfig does not change the injected fault.
	Fault Fault
}

// Validate reports a configuration error: negative limits, durations or
// output tokens, or an unimplemented Dialect.
func (c Config) Validate() error {
	switch {
	case c.TokensPerMinute < 0, c.RequestsPerMinute < 0:
		return errors.New("providersim: limits must be >= 0 (0 = unlimited)")
	case c.Latency < 0, c.FrameInterval < 0:
		return errors.New("providersim: latency and frame interval must be >= 0")
	case c.OutputTokens < 0:
		return errors.New("providersim: output tokens must be >= 0")
	case c.Window < 0 || c.Window > time.Minute || c.Window%time.Second != 0:
		return errors.New("providersim: window must be whole seconds in [1s, 60s] (0 = 60s)")
	case c.SubWindow != 0 && (c.SubWindow < time.Millisecond || c.SubWindow > time.Minute):
		return errors.New("providersim: sub-window must be in [1ms, 60s] (0 = off)")
	case c.AnthropicRemainingStep < 0:
		return errors.New("providersim: anthropic remaining step must be >= 0")
	case c.InputTokensPerMinute < 0, c.OutputTokensPerMinute < 0:
		return errors.New("providersim: input and output tokens limits must be >= 0 (0 = unlimited)")
	case (c.InputTokensPerMinute > 0 || c.OutputTokensPerMinute > 0) && c.dialect() != DialectAnthropic:
		return errors.New("providersim: input and output tokens limits are for the anthropic dialect only")
	}
	if err := c.Fault.Validate(); err != nil {
		return err
	}
	switch c.AnthropicHeaders {
	case "", AnthropicHeadersInOut, AnthropicHeadersTokens:
	default:
		return fmt.Errorf("providersim: anthropic headers %q (want %q or %q)", c.AnthropicHeaders,
			AnthropicHeadersInOut, AnthropicHeadersTokens)
	}
	switch c.ClassicResetForm {
	case "", ClassicResetDelta, ClassicResetEpoch, ClassicResetEpochMillis:
	default:
		return fmt.Errorf("providersim: classic reset form %q (want %q, %q or %q)", c.ClassicResetForm,
			ClassicResetDelta, ClassicResetEpoch, ClassicResetEpochMillis)
	}
	if c.Dialect == "" {
		return nil
	}
	for _, d := range Dialects {
		if c.Dialect == d {
			return nil
		}
	}
	return fmt.Errorf("providersim: unknown dialect %q (want one of %q)", c.Dialect, Dialects)
}

// dialect is the effective dialect ("" is DialectOpenAI).
func (c Config) dialect() string {
	if c.Dialect == "" {
		return DialectOpenAI
	}
	return c.Dialect
}

// fixedWindow is the fixed window of the dialect, 0 for the bucket dialects.
func (c Config) fixedWindow() time.Duration {
	switch c.dialect() {
	case DialectClassic, DialectIETF, DialectIETFLegacy:
		if c.Window == 0 {
			return time.Minute
		}
		return c.Window
	}
	return 0
}

// perWindow scales a per-minute limit to a window: floor(limit*w/60s), at
// least 1; 0 (unlimited) stays 0.
func perWindow(limit int64, w time.Duration) int64 {
	if limit <= 0 {
		return 0
	}
	return max(1, int64(float64(limit)*w.Seconds()/60))
}

// meterSet is every quota meter of a Server; an unused one is unlimited.
type meterSet struct {
	requests bucket // requests per minute (per window in fixed-window dialects)
	tokens   bucket // tokens per minute (per window in fixed-window dialects)
	// subRequests and subTokens are Azure's sub-window counters (unlimited
	// unless Config.SubWindow is set in the azure dialect).
	subRequests, subTokens bucket
	// input and output are Anthropic's ITPM and OTPM buckets.
	input, output bucket
}

// all lists the meters, for operations on every one.
func (m *meterSet) all() []*bucket {
	return []*bucket{&m.requests, &m.tokens, &m.subRequests, &m.subTokens, &m.input, &m.output}
}

// meters builds the quota meters of cfg at now, full: the requests and
// tokens buckets (fixed windows in the classic and IETF dialects), for
// Azure with a SubWindow the sub-window counters, and Anthropic's input and
// output buckets (unlimited otherwise).
func meters(cfg Config, now time.Time) (m meterSet) {
	if w := cfg.fixedWindow(); w > 0 {
		m.requests = newWindow(perWindow(cfg.RequestsPerMinute, w), w, now)
		m.tokens = newWindow(perWindow(cfg.TokensPerMinute, w), w, now)
	} else {
		m.requests = newBucket(cfg.RequestsPerMinute, now)
		m.tokens = newBucket(cfg.TokensPerMinute, now)
	}
	if cfg.dialect() == DialectAzure && cfg.SubWindow > 0 {
		m.subRequests = newWindow(perWindow(cfg.RequestsPerMinute, cfg.SubWindow), cfg.SubWindow, now)
		m.subTokens = newWindow(perWindow(cfg.TokensPerMinute, cfg.SubWindow), cfg.SubWindow, now)
	}
	m.input = newBucket(cfg.InputTokensPerMinute, now)
	m.output = newBucket(cfg.OutputTokensPerMinute, now)
	return m
}

// Stats are the simulator's counters since New. Counts are requests; token
// counts are tokens as the provider bills them.
type Stats struct {
	// Requests is every POST /v1/chat/completions received (any outcome).
	Requests int64 `json:"requests"`
	// Succeeded is the admitted requests whose whole response was generated.
	Succeeded int64 `json:"succeeded"`
	// Throttled is the 429 responses sent.
	Throttled int64 `json:"throttled"`
	// PromptTokens is the prompt tokens of admitted requests.
	PromptTokens int64 `json:"prompt_tokens"`
	// CompletionTokens is the tokens actually generated (partial streams included).
	CompletionTokens int64 `json:"completion_tokens"`
	// MaxConcurrent is the largest number of chat completion requests in
	// flight at once (from receipt to the end of the response).
	MaxConcurrent int64 `json:"max_concurrent"`
	// FirstExhausted is when the quota first ran short (server clock): the
	// first 429, or the first admission after which some limited meter held
	// less than that request's charge in it (an identical request would have
	// been refused right then), whichever came first; zero until then. A
	// client that bursts from the initially full buckets has used up the
	// burst by this time, so steady-state measurements start after it.
	FirstExhausted time.Time `json:"first_exhausted,omitzero"`
	// LastExhausted is the latest such time; zero until the first.
	LastExhausted time.Time `json:"last_exhausted,omitzero"`
	// Faults is the requests answered with an injected fault (SetFault);
	// they are counted in Requests too.
	Faults int64 `json:"faults,omitempty"`
}

// Server is the simulated provider, an http.Handler. Safe for concurrent use.
type Server struct {
	mux   *http.ServeMux
	clock clock.Clock
	seq   atomic.Int64

	mu sync.Mutex
	meterSet
	cfg      Config
	stats    Stats
	inflight int64
	fault    faultState
}

// New returns a Server with full buckets. It panics if cfg.Validate fails
// (a programming error; Main validates flags first).
func New(cfg Config) *Server {
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	s := &Server{clock: cfg.Clock, cfg: cfg, fault: faultState{f: cfg.Fault}}
	now := s.clock.Now()
	s.meterSet = meters(cfg, now)
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("POST /v1/chat/completions", s.handleChat)
	s.mux.HandleFunc("GET /v1/models", s.handleModels)
	s.mux.HandleFunc("/faults", s.handleFaults)
	s.mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, s.Stats()) })
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		dialect := s.cfg.dialect()
		s.mu.Unlock()
		writeError(w, dialect, http.StatusNotFound, "invalid_request_error", "unknown_url",
			fmt.Sprintf("Unknown request URL: %s %s.", r.Method, r.URL.Path))
	})
	return s
}

// SetConfig replaces the configuration at run time, keeping the clock when
// cfg.Clock is nil. Bucket levels carry over, clamped to the new capacity; a
// dimension that was unlimited starts full. A change between bucket and
// fixed-window enforcement (or of the window) starts the new meters at the
// old level, clamped. It returns cfg.Validate's error
// and changes nothing in that case.
func (s *Server) SetConfig(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if cfg.Clock == nil {
		cfg.Clock = s.clock
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	rebuild := func(b *bucket, nb bucket) {
		b.advance(now)
		if !b.unlimited() {
			nb.level = math.Min(nb.level, b.level)
		}
		*b = nb
	}
	nm := meters(cfg, now)
	for i, b := range s.meterSet.all() {
		rebuild(b, *nm.all()[i])
	}
	s.cfg = cfg
	return nil
}

// Level is one limited quota meter's state (Server.Levels).
type Level struct {
	// Level is the units available now (requests or tokens, fractional).
	Level float64
	// Limit is the capacity: the per-minute limit, or the per-window limit
	// of a fixed window or Azure sub-window.
	Limit float64
	// Window is the fixed window or sub-window length; 0 for a continuously
	// replenished bucket.
	Window time.Duration
}

// Levels returns every limited meter at the server clock's now, by name:
// "requests", "tokens", "input_tokens", "output_tokens", "sub_requests",
// "sub_tokens". For load tests that must know when the initial burst has
// been spent.
func (s *Server) Levels() map[string]Level {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advance(s.clock.Now())
	m := map[string]Level{}
	for name, b := range map[string]*bucket{"requests": &s.requests, "tokens": &s.tokens, "input_tokens": &s.input,
		"output_tokens": &s.output, "sub_requests": &s.subRequests, "sub_tokens": &s.subTokens} {
		if !b.unlimited() {
			m[name] = Level{Level: b.level, Limit: b.limit, Window: b.window}
		}
	}
	return m
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// ServeHTTP serves POST /v1/chat/completions, GET /v1/models, GET /stats,
// GET /healthz and the fault control API /faults (Server.handleFaults).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// chatRequest is the part of an OpenAI chat completion request the simulator reads.
type chatRequest struct {
	Model         string        `json:"model"`
	Messages      []chatMessage `json:"messages"`
	Stream        bool          `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	MaxTokens           *int64          `json:"max_tokens"`
	MaxCompletionTokens *int64          `json:"max_completion_tokens"`
	Tools               json.RawMessage `json:"tools,omitempty"`
	Functions           json.RawMessage `json:"functions,omitempty"`
}

// quota is a snapshot of the described meters for the rate-limit headers.
type quota struct {
	now                    time.Time // when the snapshot was taken
	reqLimit, reqRemaining int64
	reqReset               time.Duration
	tokLimit, tokRemaining int64
	tokReset               time.Duration
	inLimit, inRemaining   int64 // Anthropic ITPM
	inReset                time.Duration
	outLimit, outRemaining int64 // Anthropic OTPM
	outReset               time.Duration
}

// snapshot reads the meters; callers hold s.mu and have advanced them.
func (s *Server) snapshot() quota {
	return quota{
		now:      s.clock.Now(),
		reqLimit: int64(s.requests.limit), reqRemaining: s.requests.remaining(), reqReset: s.requests.resetIn(),
		tokLimit: int64(s.tokens.limit), tokRemaining: s.tokens.remaining(), tokReset: s.tokens.resetIn(),
		inLimit: int64(s.input.limit), inRemaining: s.input.remaining(), inReset: s.input.resetIn(),
		outLimit: int64(s.output.limit), outRemaining: s.output.remaining(), outReset: s.output.resetIn(),
	}
}

// admission is the outcome of charging a request on receipt.
type admission struct {
	q   quota
	cfg Config
	// Set when throttled:
	throttled   bool
	dimension   string        // "requests", "tokens", "input tokens" or "output tokens"
	wait        time.Duration // until enough refills
	neverFits   bool          // the charge exceeds the bucket capacity
	limit, used int64         // of the tripped dimension
	requested   int64         // the charge in the tripped dimension
}

// admit charges 1 request and prompt+maxOut tokens (prompt input tokens
// and maxOut output tokens in Anthropic's ITPM and OTPM buckets), or
// charges nothing and reports the dimension that is short (the one with the
// longest wait; one whose charge exceeds its capacity first).
func (s *Server) admit(prompt, maxOut int64) admission {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	s.advance(now)
	a := admission{cfg: s.cfg}
	charge := float64(prompt + maxOut)
	type need struct {
		b         []*bucket // the meters of the dimension
		n         float64   // the charge in each
		dimension string
	}
	needs := []need{ // a tie of waits goes to the first
		{[]*bucket{&s.requests, &s.subRequests}, 1, "requests"},
		{[]*bucket{&s.tokens, &s.subTokens}, charge, "tokens"},
		{[]*bucket{&s.input}, float64(prompt), "input tokens"},
		{[]*bucket{&s.output}, float64(maxOut), "output tokens"},
	}
	var report *bucket // the per-minute meter of the tripped dimension
	for _, nd := range needs {
		for _, b := range nd.b {
			w, ok := b.wait(nd.n)
			switch {
			case !ok && !a.neverFits:
				a.throttled, a.neverFits, a.dimension, a.wait, report = true, true, nd.dimension, 0, nd.b[0]
				a.requested = int64(nd.n)
			case ok && w > a.wait && !a.neverFits:
				a.throttled, a.dimension, a.wait, report = true, nd.dimension, w, nd.b[0]
				a.requested = int64(nd.n)
			}
		}
	}
	if a.throttled {
		a.limit, a.used = int64(report.limit), int64(report.limit)-report.remaining()
		s.stats.Throttled++
		s.exhausted(now)
	} else {
		short := false
		for _, nd := range needs {
			for _, b := range nd.b {
				b.take(nd.n)
				if w, _ := b.wait(nd.n); w > 0 {
					short = true
				}
			}
		}
		if short {
			s.exhausted(now)
		}
		s.stats.PromptTokens += prompt
	}
	a.q = s.snapshot()
	return a
}

// exhausted records Stats.FirstExhausted and LastExhausted; callers hold
// s.mu.
func (s *Server) exhausted(now time.Time) {
	if s.stats.FirstExhausted.IsZero() {
		s.stats.FirstExhausted = now
	}
	s.stats.LastExhausted = now
}

// advance brings every meter to now; callers hold s.mu.
func (s *Server) advance(now time.Time) {
	for _, b := range s.meterSet.all() {
		b.advance(now)
	}
}

// finish refunds the unused output reservation (maxOut - generated tokens,
// clamped at capacity) to the tokens and output buckets and records the
// outcome.
func (s *Server) finish(maxOut, generated int64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	for _, b := range []*bucket{&s.tokens, &s.output} {
		b.advance(now)
		b.give(float64(maxOut - generated))
	}
	s.stats.CompletionTokens += generated
	if ok {
		s.stats.Succeeded++
	}
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.stats.Requests++
	s.inflight++
	s.stats.MaxConcurrent = max(s.stats.MaxConcurrent, s.inflight)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inflight--
		s.mu.Unlock()
	}()

	req, prompt, err := parseChat(r)
	if err != nil {
		s.mu.Lock()
		s.advance(s.clock.Now())
		q := s.snapshot()
		cfg := s.cfg
		s.mu.Unlock()
		writeQuotaHeaders(w.Header(), cfg, q)
		writeError(w, cfg.dialect(), http.StatusBadRequest, "invalid_request_error", "", err.Error())
		return
	}
	fault := s.nextFault()
	if s.injectEarly(r.Context(), w, fault) {
		return
	}
	maxOut := int64(DefaultMaxOutputTokens)
	switch {
	case req.MaxCompletionTokens != nil:
		maxOut = *req.MaxCompletionTokens
	case req.MaxTokens != nil:
		maxOut = *req.MaxTokens
	}

	a := s.admit(prompt, maxOut)
	writeQuotaHeaders(w.Header(), a.cfg, a.q)
	if a.throttled {
		writeThrottled(w, req.Model, a)
		return
	}

	out := a.cfg.OutputTokens
	if out == 0 {
		out = DefaultOutputTokens
	}
	n, finishReason := out, "stop"
	if out > maxOut {
		n, finishReason = maxOut, "length"
	}
	c := completion{
		id:      "chatcmpl-sim-" + strconv.FormatInt(s.seq.Add(1), 10),
		created: s.clock.Now().Unix(),
		model:   req.Model,
		prompt:  prompt,
		n:       n,
		finish:  finishReason,
	}
	if req.Stream && fault.Kind != FaultMalformed {
		includeUsage := req.StreamOptions != nil && req.StreamOptions.IncludeUsage && fault.Kind != FaultNoUsage
		s.stream(r.Context(), w, a.cfg, c, maxOut, includeUsage, fault)
		return
	}
	if !s.sleep(r.Context(), a.cfg.Latency+time.Duration(max(n-1, 0))*a.cfg.FrameInterval) {
		s.finish(maxOut, 0, false)
		return
	}
	switch fault.Kind {
	case FaultMalformed:
		s.finish(maxOut, n, true)
		writeMalformed(w, c.body())
	case FaultCut:
		s.finish(maxOut, n, false)
		writeCutBody(w, c.body())
	case FaultNoUsage:
		s.finish(maxOut, n, true)
		writeJSON(w, http.StatusOK, c.bodyWithoutUsage())
	default:
		s.finish(maxOut, n, true)
		writeJSON(w, http.StatusOK, c.body())
	}
}

// parseChat decodes a chat completion request and counts its prompt tokens.
// Errors are client errors (400) with an OpenAI-style message.
func parseChat(r *http.Request) (chatRequest, int64, error) {
	var req chatRequest
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBodyBytes))
	if err != nil {
		return req, 0, fmt.Errorf("could not read the request body: %w", err)
	}
	if err := json.Unmarshal(body, &req); err != nil {
		var syn *json.SyntaxError
		if errors.As(err, &syn) || !json.Valid(body) {
			return req, 0, errors.New("We could not parse the JSON body of your request. " +
				"The API expects a JSON payload, but what was sent was not valid JSON.")
		}
		return req, 0, fmt.Errorf("invalid request body: %v", err)
	}
	if len(req.Messages) == 0 {
		return req, 0, errors.New("'messages' is a required property and must be a non-empty array")
	}
	for _, f := range []struct {
		name string
		v    *int64
	}{{"max_tokens", req.MaxTokens}, {"max_completion_tokens", req.MaxCompletionTokens}} {
		if f.v != nil && *f.v < 1 {
			return req, 0, fmt.Errorf("Invalid '%s': integer below minimum value. Expected a value >= 1, but got %d instead.", f.name, *f.v)
		}
	}
	prompt, err := promptTokens(req.Messages, req.Tools, req.Functions)
	if err != nil {
		return req, 0, fmt.Errorf("Invalid %v", err)
	}
	return req, prompt, nil
}

// sleep waits d on the server clock; false if ctx ended first.
func (s *Server) sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := s.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return true
	case <-ctx.Done():
		return false
	}
}

// stream writes the completion as server-sent events: one chunk per token
// (the first also carries the role), a chunk with the finish_reason, then a
// usage chunk with empty choices only when includeUsage, then "data: [DONE]".
// With includeUsage every earlier chunk carries "usage": null, as OpenAI's do.
// A FaultCut fault resets the connection after its Frames content frames.
func (s *Server) stream(ctx context.Context, w http.ResponseWriter, cfg Config, c completion, maxOut int64, includeUsage bool, fault Fault) {
	if !s.sleep(ctx, cfg.Latency) {
		s.finish(maxOut, 0, false)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	send := func(ch chunk) bool {
		if includeUsage && ch.Usage == nil {
			ch.Usage = json.RawMessage("null")
		}
		b, _ := json.Marshal(ch)
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	frames := max(c.n, 1) // a zero-token reply still sends the role chunk
	for i := range frames {
		if fault.Kind == FaultCut && i >= fault.Frames {
			s.finish(maxOut, i, false)
			resetConn(w)
			return
		}
		if i > 0 && !s.sleep(ctx, cfg.FrameInterval) {
			s.finish(maxOut, i, false)
			return
		}
		d := delta{}
		if i == 0 {
			d.Role = "assistant"
		}
		text := ""
		if i < c.n {
			text = fillerToken(i)
		}
		d.Content = &text
		if !send(c.chunk([]chunkChoice{{Delta: d}})) {
			s.finish(maxOut, i, false)
			return
		}
	}
	if fault.Kind == FaultCut { // Frames >= the frames generated: cut before the finish chunk
		s.finish(maxOut, c.n, false)
		resetConn(w)
		return
	}
	s.finish(maxOut, c.n, true)
	reason := c.finish
	if !send(c.chunk([]chunkChoice{{Delta: delta{}, FinishReason: &reason}})) {
		return
	}
	if includeUsage {
		u, _ := json.Marshal(c.usage())
		ch := c.chunk([]chunkChoice{})
		ch.Usage = u
		if !send(ch) {
			return
		}
	}
	if _, err := io.WriteString(w, "data: [DONE]\n\n"); err == nil {
		_ = rc.Flush()
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	models := s.cfg.Models
	s.mu.Unlock()
	if len(models) == 0 {
		models = []string{DefaultModel}
	}
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	list := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list"}
	for _, m := range models {
		list.Data = append(list.Data, model{ID: m, Object: "model", OwnedBy: "providersim"})
	}
	writeJSON(w, http.StatusOK, list)
}

// completion describes one generated response.
type completion struct {
	id      string
	created int64
	model   string
	prompt  int64 // prompt tokens
	n       int64 // completion tokens generated
	finish  string
}

// usageBody is OpenAI's token usage object, in tokens.
type usageBody struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

func (c completion) usage() usageBody {
	return usageBody{PromptTokens: c.prompt, CompletionTokens: c.n, TotalTokens: c.prompt + c.n}
}

type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type choice struct {
	Index        int     `json:"index"`
	Message      message `json:"message"`
	FinishReason string  `json:"finish_reason"`
}

// chatCompletion is the non-streaming response body ("chat.completion").
type chatCompletion struct {
	ID      string    `json:"id"`
	Object  string    `json:"object"`
	Created int64     `json:"created"`
	Model   string    `json:"model"`
	Choices []choice  `json:"choices"`
	Usage   usageBody `json:"usage"`
}

func (c completion) body() chatCompletion {
	return chatCompletion{
		ID: c.id, Object: "chat.completion", Created: c.created, Model: c.model,
		Choices: []choice{{Message: message{Role: "assistant", Content: fillerText(c.n)}, FinishReason: c.finish}},
		Usage:   c.usage(),
	}
}

type delta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type chunkChoice struct {
	Index        int     `json:"index"`
	Delta        delta   `json:"delta"`
	FinishReason *string `json:"finish_reason"`
}

// chunk is one streamed event ("chat.completion.chunk").
type chunk struct {
	ID      string          `json:"id"`
	Object  string          `json:"object"`
	Created int64           `json:"created"`
	Model   string          `json:"model"`
	Choices []chunkChoice   `json:"choices"`
	Usage   json.RawMessage `json:"usage,omitempty"`
}

func (c completion) chunk(choices []chunkChoice) chunk {
	return chunk{ID: c.id, Object: "chat.completion.chunk", Created: c.created, Model: c.model, Choices: choices}
}
