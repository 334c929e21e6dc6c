package throttle

import (
	"testing"
	"time"
)

// Anthropic: an OTPM 429 (output remaining 2000, rounded, under the call's
// max_tokens) while input has plenty left. The figures explain the 429 (the
// output dimension cannot cover max_tokens), so sub-window pacing must not
// be latched for the throttle's lifetime: after the pause, bursts resume.
func TestReviewAnthropicOTPM429DoesNotLatchEvenPacing(t *testing.T) {
	th := New(Config{JitterWindow: -1, Rand: fixedRand(0)}, NOW)
	reset := NOW.Add(time.Minute).UTC().Format(time.RFC3339)
	anth := func(in, out int64) Quota {
		return ParseHeadersDialect(hdr(
			"anthropic-ratelimit-requests-limit: 1000", "anthropic-ratelimit-requests-remaining: 990", "anthropic-ratelimit-requests-reset: "+reset,
			"anthropic-ratelimit-input-tokens-limit: 400000", "anthropic-ratelimit-input-tokens-remaining: "+itoa(in), "anthropic-ratelimit-input-tokens-reset: "+reset,
			"anthropic-ratelimit-output-tokens-limit: 80000", "anthropic-ratelimit-output-tokens-remaining: "+itoa(out), "anthropic-ratelimit-output-tokens-reset: "+reset,
			"retry-after: 1"), NOW, "Anthropic")
	}
	th.Observe(NOW, Permit{}, anth(400000, 80000))
	p := mustStart(t, th, NOW, 5096, Batch) // 1000 prompt + 4096 max_tokens
	th.OnTooManyRequests(NOW, p, anth(390000, 2000))
	if th.subWindow {
		t.Errorf("an OTPM 429 (output remaining 2000 < max_tokens 4096) latched sub-window pacing for the throttle's lifetime")
	}
}

// A 429 that carries no figure at all (OpenAI/Azure "server overloaded",
// any 429 without rate-limit headers) cannot prove sub-windows. With the
// previous response's figures it still must not latch pacing.
func TestReviewOverload429WithFiguresLatches(t *testing.T) {
	th := New(Config{TokensPerMinuteHint: 600000, RequestsPerMinuteHint: 600, JitterWindow: -1, Rand: fixedRand(0)}, NOW)
	oa := ParseHeaders(hdr("x-ratelimit-limit-tokens: 600000", "x-ratelimit-remaining-tokens: 590000", "x-ratelimit-reset-tokens: 1s",
		"x-ratelimit-limit-requests: 600", "x-ratelimit-remaining-requests: 590", "x-ratelimit-reset-requests: 1s", "retry-after: 1"), NOW)
	p := mustStart(t, th, NOW, 100, Batch)
	th.OnTooManyRequests(NOW, p, oa) // OpenAI 429 "engine overloaded": figures show room
	for i := range 20 {
		if _, ok, w := th.TryStart(at(2*time.Second), 100, Batch); !ok {
			t.Fatalf("start %d after an OpenAI-dialect 429 refused (wait %v): even pacing latched for the throttle's lifetime by one 429", i+1, w)
		}
	}
}
