package throttle

import (
	"testing"
	"time"
)

// anthropicQuota is an Anthropic response's tokens triplet at now: limit
// 60000, the given remaining (the provider rounds it down to a thousand) and
// the reset time.
func anthropicQuota(now time.Time, remaining int64, reset time.Time) Quota {
	return ParseHeaders(hdr("anthropic-ratelimit-tokens-limit: 60000",
		"anthropic-ratelimit-tokens-remaining: "+itoa(remaining),
		"anthropic-ratelimit-tokens-reset: "+reset.UTC().Format(time.RFC3339)), now)
}

// Continuous buckets: concurrent calls reach the provider in any order, so
// the figure of a later-started call does not include an earlier-started
// call that was still unanswered when it started. A burst of 10 calls on a
// 1000-token figure, whose 9th call's response arrives first with the
// bucket's level before the other 9 were admitted, must not let a second
// burst start (the provider's bucket holds about 100 tokens then).
func TestContinuousOutOfOrderFigureKeepsEarlierCallsInFlight(t *testing.T) {
	th := New(Config{TokensPerMinuteHint: 60000, JitterWindow: -1, Rand: fixedRand(0)}, NOW)
	// The provider's bucket holds 1000 to 1099 tokens after the last call.
	th.Observe(NOW, Permit{}, anthropicQuota(NOW, 1000, at(60*time.Second)))
	var ps []Permit
	for range 10 {
		ps = append(ps, mustStart(t, th, NOW, 100, Batch))
	}
	mustRefuse(t, th, NOW, 100, Batch)
	// The provider admitted the 9th call first: 1000 left after it. Its
	// figure counts none of the calls 1 to 8, all unanswered when the 9th
	// started, nor the 10th: 1000 - 9*100 = 100 left, room for one call,
	// not nine.
	now := at(20 * time.Millisecond)
	th.Observe(now, ps[8], anthropicQuota(now, 1000, at(60*time.Second)))
	if s := th.Status(now); s.TokensRemaining != 100 {
		t.Fatalf("tokens remaining %d, want 100 (1000 - 9 calls in flight)", s.TokensRemaining)
	}
	p11 := mustStart(t, th, now, 100, Batch)
	mustRefuse(t, th, now, 100, Batch)
	// The other calls answer, the 10th with a figure of 0 (it was admitted
	// last). The calls 1 to 8 and 11 were unanswered when the 10th started:
	// they stay subtracted from its figure, at 1000 tokens/s.
	for i, p := range ps {
		if i != 8 {
			th.Observe(now, p, anthropicQuota(now, 0, at(60*time.Second)))
		}
	}
	later := at(1200 * time.Millisecond)
	if s := th.Status(later); s.TokensRemaining != 180 {
		t.Fatalf("tokens remaining %d, want 180 (0 - 9 calls + 1180 ms at 1000/s)", s.TokensRemaining)
	}
	// A call started after all of them have answered is covered by its own
	// figure, less the 11th, still unanswered.
	p := mustStart(t, th, later, 100, Batch)
	th.Observe(later, p, anthropicQuota(later, 1000, at(60*time.Second)))
	if s := th.Status(later); s.TokensRemaining != 1000-100 {
		t.Fatalf("tokens remaining %d, want 900 (the figure less the 11th call)", s.TokensRemaining)
	}
	// Once the 11th answers, the figure of the next call includes it too.
	th.Observe(later, p11, anthropicQuota(later, 0, at(60*time.Second)))
	last := mustStart(t, th, later, 100, Batch)
	th.Observe(later, last, anthropicQuota(later, 1000, at(60*time.Second)))
	if s := th.Status(later); s.TokensRemaining != 1000 {
		t.Fatalf("tokens remaining %d, want 1000 (every earlier call answered)", s.TokensRemaining)
	}
}
