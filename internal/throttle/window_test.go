package throttle

import (
	"strconv"
	"testing"
	"time"
)

// Fixed windows (classic, IETF): concurrent calls reach the provider in any
// order, so the figure of a later-started call may not include an
// earlier-started one. However the figures arrive, no more than the limit
// starts between two resets.
func TestFixedWindowOutOfOrderFiguresNeverExceedLimit(t *testing.T) {
	th := New(Config{JitterWindow: -1, Rand: fixedRand(0)}, NOW)
	classic := func(remaining int64, reset string) Quota {
		return ParseHeaders(hdr("X-RateLimit-Limit: 10", "X-RateLimit-Remaining: "+itoa(remaining), "X-RateLimit-Reset: "+reset), NOW)
	}
	th.Observe(NOW, Permit{}, classic(0, "1")) // the window ends at +1 s
	if w := mustRefuse(t, th, NOW, 1, Batch); w != time.Second {
		t.Fatalf("wait %v, want 1s (the reset)", w)
	}
	var ps []Permit
	for range 10 {
		ps = append(ps, mustStart(t, th, at(time.Second), 1, Batch))
	}
	mustRefuse(t, th, at(time.Second), 1, Batch)
	// The provider admitted the 5th call first: its figure says 9 left, and
	// counts none of the 1st to 4th. Seq-based accounting alone would see
	// 9 - 5 (calls 6..10) = 4 left.
	th.Observe(at(1020*time.Millisecond), ps[4], classic(9, "4"))
	if w := mustRefuse(t, th, at(1020*time.Millisecond), 1, Batch); w != 4*time.Second {
		t.Fatalf("wait %v, want 4s (until the reset, with 10 started in the window)", w)
	}
	// After the next reset the window is full again.
	th.Observe(at(1050*time.Millisecond), ps[9], classic(0, "4"))
	mustRefuse(t, th, at(5*time.Second), 1, Batch)
	for range 10 {
		mustStart(t, th, at(5050*time.Millisecond), 1, Batch)
	}
	mustRefuse(t, th, at(5050*time.Millisecond), 1, Batch)
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

// A 429 while the figures say the call fitted (Azure's sub-windows) turns on
// even pacing at 99% of the limit per minute, per dimension.
func TestSubWindow429PacesEvenly(t *testing.T) {
	th := New(Config{TokensPerMinuteHint: 60000, RequestsPerMinuteHint: 1200, JitterWindow: -1, Rand: fixedRand(0)}, NOW)
	azure := func(tokens, requests int64, extra ...string) Quota {
		return ParseHeaders(hdr(append([]string{"x-ratelimit-remaining-tokens: " + itoa(tokens),
			"x-ratelimit-remaining-requests: " + itoa(requests)}, extra...)...), NOW)
	}
	th.Observe(NOW, Permit{}, azure(60000, 1200))
	// Before any sub-window 429, bursts are allowed.
	var p Permit
	for range 5 {
		p = mustStart(t, th, NOW, 100, Batch)
	}
	th.OnTooManyRequests(NOW, p, azure(59500, 1195, "retry-after-ms: 5000"))
	if w := mustRefuse(t, th, at(time.Second), 100, Batch); w != 4*time.Second {
		t.Fatalf("wait %v, want 4s (retry-after-ms)", w)
	}
	mustStart(t, th, at(5*time.Second), 100, Batch)
	// 100 tokens at 0.99 x 60000 per minute: 101.010101 ms; 1 request at
	// 0.99 x 1200 per minute: 50.505 ms. The longer wins.
	cost, lim := 100.0, 60000.0
	want := time.Duration(int64(cost * float64(time.Minute) / (lim * 0.99))) // 101.010101ms
	if w := mustRefuse(t, th, at(5*time.Second), 100, Batch); w != want {
		t.Fatalf("wait %v, want %v", w, want)
	}
	mustStart(t, th, at(5*time.Second).Add(want), 100, Batch)
	mustRefuse(t, th, at(5*time.Second).Add(want+want/2), 100, Batch)
}

// A 429 that the figures explain (the dimension is exhausted) does not turn
// pacing on: after the pause, bursts are allowed again.
func TestExplained429KeepsBursts(t *testing.T) {
	th := New(Config{TokensPerMinuteHint: 60000, RequestsPerMinuteHint: 1200, JitterWindow: -1, Rand: fixedRand(0)}, NOW)
	p := mustStart(t, th, NOW, 100, Batch)
	th.OnTooManyRequests(NOW, p, ParseHeaders(hdr("x-ratelimit-limit-tokens: 60000", "x-ratelimit-remaining-tokens: 50",
		"x-ratelimit-reset-tokens: 59.95s", "retry-after: 1"), NOW))
	for range 5 {
		mustStart(t, th, at(2*time.Second), 100, Batch)
	}
}

// Even pacing learnt from one dialect's sub-window 429s is dropped when the
// pool's dialect changes (Reconfigure): the new provider starts with bursts;
// a Reconfigure that keeps the dialect keeps the pacing.
func TestSubWindowPacingResetByDialectChange(t *testing.T) {
	cfg := Config{TokensPerMinuteHint: 60000, RequestsPerMinuteHint: 1200, JitterWindow: -1, Rand: fixedRand(0), Dialect: "Azure"}
	th := New(cfg, NOW)
	azure := func(tokens, requests int64, extra ...string) Quota {
		return ParseHeadersDialect(hdr(append([]string{"x-ratelimit-remaining-tokens: " + itoa(tokens),
			"x-ratelimit-remaining-requests: " + itoa(requests)}, extra...)...), NOW, "Azure")
	}
	th.Observe(NOW, Permit{}, azure(60000, 1200))
	p := mustStart(t, th, NOW, 100, Batch)
	th.OnTooManyRequests(NOW, p, azure(59900, 1199, "retry-after-ms: 1000"))
	mustStart(t, th, at(time.Second), 100, Batch)
	mustRefuse(t, th, at(time.Second), 100, Batch) // paced evenly

	cfg.TokensPerMinuteHint = 120000 // same dialect: pacing kept
	th.Reconfigure(at(time.Second), cfg)
	mustRefuse(t, th, at(time.Second), 100, Batch)

	cfg.Dialect = "OpenAI"
	th.Reconfigure(at(time.Second), cfg)
	for range 3 {
		mustStart(t, th, at(time.Second), 100, Batch)
	}
}

// A fixed window that the provider rolls over before the reset it announced
// (an integer-second reset is rounded, an epoch reset truncated): the first
// figure of the new window arrives before the old reset instant. The starts
// of the previous window must not count against the new one: the window
// then admits what its figure says is left, not the previous window's rest.
func TestFixedWindowEarlyRolloverStartsAFreshCount(t *testing.T) {
	th := New(Config{JitterWindow: -1, Rand: fixedRand(0)}, NOW)
	classic := func(remaining int64, reset string) Quota {
		return ParseHeaders(hdr("X-RateLimit-Limit: 10", "X-RateLimit-Remaining: "+itoa(remaining), "X-RateLimit-Reset: "+reset), NOW)
	}
	th.Observe(NOW, Permit{}, classic(10, "10"))                        // the window ends at +10 s
	th.Observe(at(10500*time.Millisecond), Permit{}, classic(10, "10")) // next window: [10.5 s, 20.5 s)
	for i := range 8 {
		p := mustStart(t, th, at(11*time.Second), 1, Batch)
		th.Observe(at(11100*time.Millisecond), p, classic(int64(9-i), "10")) // ends at 21.1 s as announced
	}
	// The provider's window really ends at 20.6 s. Call A, started at
	// 20.6 s, is still in flight; call B, started at 20.65 s, reached the
	// provider first, as the first call of the new window: 9 left, 10 s to
	// go. A will count in the new window too: 8 more may start.
	mustStart(t, th, at(20600*time.Millisecond), 1, Batch)
	p := mustStart(t, th, at(20650*time.Millisecond), 1, Batch)
	th.Observe(at(20700*time.Millisecond), p, classic(9, "10"))
	for i := range 8 {
		if _, ok, wait := th.TryStart(at(20800*time.Millisecond), 1, Batch); !ok {
			t.Fatalf("start %d of the 8 the new window has left refused, wait %v", i+1, wait)
		}
	}
	mustRefuse(t, th, at(20800*time.Millisecond), 1, Batch)
}
