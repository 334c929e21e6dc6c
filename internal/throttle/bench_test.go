package throttle

import (
	"net/http"
	"testing"
	"time"
)

func BenchmarkParseHeadersOpenAI(b *testing.B) {
	h := hdr(
		"x-ratelimit-limit-requests: 10000",
		"x-ratelimit-limit-tokens: 2000000",
		"x-ratelimit-remaining-requests: 9999",
		"x-ratelimit-remaining-tokens: 1999500",
		"x-ratelimit-reset-requests: 6ms",
		"x-ratelimit-reset-tokens: 15ms",
	)
	b.ReportAllocs()
	for b.Loop() {
		_ = ParseHeaders(h, NOW)
	}
}

func BenchmarkParseHeadersAll(b *testing.B) {
	h := hdr(
		"x-ratelimit-limit-requests: 10000",
		"x-ratelimit-limit-tokens: 2000000",
		"x-ratelimit-remaining-requests: 9999",
		"x-ratelimit-remaining-tokens: 1999500",
		"x-ratelimit-reset-requests: 6ms",
		"x-ratelimit-reset-tokens: 15ms",
		"anthropic-ratelimit-requests-limit: 50",
		"anthropic-ratelimit-requests-remaining: 49",
		"anthropic-ratelimit-requests-reset: 2026-01-01T00:00:05Z",
		"anthropic-ratelimit-tokens-limit: 100000",
		"anthropic-ratelimit-tokens-remaining: 16000",
		"anthropic-ratelimit-tokens-reset: 2026-01-01T00:01:00Z",
		"X-RateLimit-Limit: 100",
		"X-RateLimit-Remaining: 42",
		"X-RateLimit-Reset: 1767225660",
		`RateLimit-Policy: "burst";q=100;w=60,"daily";q=1000;w=86400`,
		`RateLimit: "burst";r=50;t=30`,
		"retry-after-ms: 250",
		"retry-after: Thu, 01 Jan 2026 00:02:00 GMT",
	)
	b.ReportAllocs()
	for b.Loop() {
		_ = ParseHeaders(h, NOW)
	}
}

// BenchmarkTryStartObserve: one start and the observation of its response,
// with a few calls in flight, in steady state.
func BenchmarkTryStartObserve(b *testing.B) {
	th := New(Config{ReservePercent: 20}, NOW)
	q := ParseHeaders(hdr(
		"x-ratelimit-limit-requests: 1000000",
		"x-ratelimit-limit-tokens: 1000000000",
		"x-ratelimit-remaining-requests: 999000",
		"x-ratelimit-remaining-tokens: 999000000",
		"x-ratelimit-reset-requests: 60ms",
		"x-ratelimit-reset-tokens: 60ms",
	), NOW)
	th.Observe(NOW, Permit{}, q)
	var inflight [8]Permit
	now := NOW
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Millisecond)
		p, ok, _ := th.TryStart(now, 500, Batch)
		if !ok {
			b.Fatal("refused")
		}
		slot := i % len(inflight)
		if inflight[slot].Seq() != 0 {
			th.Observe(now, inflight[slot], q)
		}
		inflight[slot] = p
		i++
	}
}

var _ = http.Header{}
