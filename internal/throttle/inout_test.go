package throttle

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// Anthropic's input-tokens and output-tokens triplets fill Quota.Input and
// Quota.Output, never Tokens (provider header reference, Anthropic section;
// BC-07).
func TestParseHeadersAnthropicInputOutput(t *testing.T) {
	inOut := []string{
		"anthropic-ratelimit-input-tokens-limit: 24000",
		"anthropic-ratelimit-input-tokens-remaining: 3000",
		"anthropic-ratelimit-input-tokens-reset: 2026-01-01T00:00:09Z",
		"anthropic-ratelimit-output-tokens-limit: 36000",
		"anthropic-ratelimit-output-tokens-remaining: 0",
		"anthropic-ratelimit-output-tokens-reset: 2026-01-01T00:01:00Z",
	}
	in := dim(24000, 3000, 9*time.Second, DialectAnthropic)
	out := dim(36000, 0, time.Minute, DialectAnthropic)
	with := func(lines ...string) []string { return append(append([]string{}, inOut...), lines...) }
	cases := []struct {
		name    string
		dialect string
		lines   []string
		want    Quota
	}{
		{"input and output only: Tokens stays unknown", "Auto", inOut,
			Quota{Tokens: none, Requests: none, Input: in, Output: out, Dialect: DialectAnthropic}},
		{"the Anthropic hint reads the same", "Anthropic", inOut,
			Quota{Tokens: none, Requests: none, Input: in, Output: out, Dialect: DialectAnthropic}},
		{"a tokens triplet fills Tokens, input and output stay separate", "Anthropic",
			with("anthropic-ratelimit-tokens-limit: 60000", "anthropic-ratelimit-tokens-remaining: 41000",
				"anthropic-ratelimit-tokens-reset: 2026-01-01T00:00:20Z",
				"anthropic-ratelimit-requests-limit: 1200", "anthropic-ratelimit-requests-remaining: 1100",
				"anthropic-ratelimit-requests-reset: 2026-01-01T00:00:05Z"),
			Quota{Tokens: dim(60000, 41000, 20*time.Second, DialectAnthropic), Requests: dim(1200, 1100, 5*time.Second, DialectAnthropic),
				Input: in, Output: out, Dialect: DialectAnthropic}},
		{"Auto: an OpenAI tokens figure fills Tokens beside them", "Auto",
			with("x-ratelimit-limit-tokens: 60000", "x-ratelimit-remaining-tokens: 50000", "x-ratelimit-reset-tokens: 10s"),
			Quota{Tokens: dim(60000, 50000, 10*time.Second, DialectOpenAI), Requests: none, Input: in, Output: out, Dialect: DialectOpenAI}},
		{"a limit-only output triplet", "Anthropic", []string{"anthropic-ratelimit-output-tokens-limit: 8000"},
			Quota{Tokens: none, Requests: none, Input: none, Output: dim(8000, -1, -1, DialectAnthropic), Dialect: DialectAnthropic}},
		{"a malformed input remaining is ignored and counted", "Anthropic",
			[]string{"anthropic-ratelimit-input-tokens-limit: 24000", "anthropic-ratelimit-input-tokens-remaining: -5"},
			Quota{Tokens: none, Requests: none, Input: dim(24000, -1, -1, DialectAnthropic), Output: none, Dialect: DialectAnthropic, Malformed: 1}},
		{"the OpenAI hint ignores them", "OpenAI", inOut,
			Quota{Tokens: none, Requests: none, Input: none, Output: none}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := ParseHeadersDialect(hdr(tc.lines...), NOW, tc.dialect)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ParseHeadersDialect(%q) (-want +got):\n%s", tc.dialect, diff)
			}
			if tc.dialect == "Auto" {
				if diff := cmp.Diff(tc.want, ParseHeaders(hdr(tc.lines...), NOW)); diff != "" {
					t.Errorf("ParseHeaders (-want +got):\n%s", diff)
				}
			}
		})
	}
}

// level is the estimated level of dimension i at now.
func level(th *Throttle, i int, now time.Time) float64 {
	th.mu.Lock()
	defer th.mu.Unlock()
	_, _, l, _ := th.dims[i].state(now)
	return l
}

// Output binds while input has plenty: the start is refused for output,
// with the wait of output's refill; it is allowed once output has refilled;
// input is charged only the prompt of the started call and nothing for the
// refused one. The unused max_tokens refunded at the end (DoneTokens) comes
// back to output (Anthropic OTPM: charged max_tokens at admission, refunded
// at the end; provider header reference).
func TestThrottleOutputBindsInputHasRoom(t *testing.T) {
	th := New(Config{JitterWindow: -1}, NOW)
	reset := func(d time.Duration) string { return NOW.Add(d).UTC().Format(time.RFC3339) }
	// Input full (24000 of 24000), output empty (0 of 12000, full in 60 s:
	// 200 tokens/s).
	q := ParseHeadersDialect(hdr(
		"anthropic-ratelimit-input-tokens-limit: 24000", "anthropic-ratelimit-input-tokens-remaining: 24000",
		"anthropic-ratelimit-input-tokens-reset: "+reset(0),
		"anthropic-ratelimit-output-tokens-limit: 12000", "anthropic-ratelimit-output-tokens-remaining: 0",
		"anthropic-ratelimit-output-tokens-reset: "+reset(time.Minute)), NOW, "Anthropic")
	th.Observe(NOW, Permit{}, q)
	cost := Cost{Prompt: 1000, MaxOutput: 200}
	if _, ok, wait := th.TryStartCost(NOW, cost, Interactive); ok || wait != time.Second {
		t.Fatalf("TryStartCost at NOW = ok %v, wait %v; want refused for output, wait 1s (200 tokens at 200/s)", ok, wait)
	}
	if got := level(th, dimInput, NOW); got != 24000 {
		t.Errorf("input level after the refusal = %v, want 24000 (a refused start charges nothing)", got)
	}
	if _, ok, _ := th.TryStartCost(at(999*time.Millisecond), cost, Interactive); ok {
		t.Fatalf("started at +999ms with 199.8 output tokens for max output 200")
	}
	p, ok, wait := th.TryStartCost(at(time.Second), cost, Interactive)
	if !ok {
		t.Fatalf("refused at +1s (output refilled to 200), wait %v", wait)
	}
	if p.Tokens() != 1200 {
		t.Errorf("permit tokens = %d, want 1200 (prompt + max output)", p.Tokens())
	}
	if got := level(th, dimInput, at(time.Second)); got != 23000 {
		t.Errorf("input level = %v, want 23000 (24000 - the prompt)", got)
	}
	if got := level(th, dimOutput, at(time.Second)); got != 0 {
		t.Errorf("output level = %v, want 0 (200 refilled - 200 max output)", got)
	}
	// The response's figure includes the call at its full max_tokens; the
	// provider refunds 180 at the end.
	th.Observe(at(time.Second), p, ParseHeadersDialect(hdr(
		"anthropic-ratelimit-output-tokens-limit: 12000", "anthropic-ratelimit-output-tokens-remaining: 0",
		"anthropic-ratelimit-output-tokens-reset: "+reset(61*time.Second)), at(time.Second), "Anthropic"))
	th.DoneTokens(at(time.Second), p, 1000, 20, true)
	if got := level(th, dimOutput, at(time.Second)); got != 180 {
		t.Errorf("output level after the refund = %v, want 180 (max output 200 - 20 generated)", got)
	}
	if got := level(th, dimInput, at(time.Second)); got != 23000 {
		t.Errorf("input level after Done = %v, want 23000", got)
	}
}

// The input and output dimensions never block while unknown: an OpenAI
// throttle (no Anthropic figures) with a full tokens bucket starts a call
// whatever its split, without a probe.
func TestThrottleUnknownInputOutputNeverBlock(t *testing.T) {
	th := New(Config{JitterWindow: -1}, NOW)
	th.Observe(NOW, Permit{}, ParseHeaders(hdr("x-ratelimit-limit-tokens: 60000", "x-ratelimit-remaining-tokens: 60000",
		"x-ratelimit-reset-tokens: 0s", "x-ratelimit-limit-requests: 100", "x-ratelimit-remaining-requests: 100",
		"x-ratelimit-reset-requests: 0s"), NOW))
	for i := range 3 {
		if _, ok, wait := th.TryStartCost(NOW, Cost{Prompt: 100, MaxOutput: 19900}, Batch); !ok {
			t.Fatalf("start %d refused, wait %v", i, wait)
		}
	}
	if _, ok, _ := th.TryStartCost(NOW, Cost{Prompt: 100, MaxOutput: 19900}, Batch); ok {
		t.Fatalf("a fourth start of 20000 tokens fitted in 60000 - 3 x 20000")
	}
}
