package throttle

import (
	"net/http"
	"testing"
	"time"
)

// TestReviewDPHostileUsageDoesNotStallTheModel: a provider's usage is
// only a correction of one call's charge. A usage of 2^62 tokens for a
// call that no figure covers (call A, still unanswered when call B
// started; B's response carried the figure) must not stop every start of
// the model: at most, a call uses the whole per-minute limit (a call above
// it is refused by the provider), so the next call fits again within one
// window, not after the 24 h cap of a wait.
func TestReviewDPHostileUsageDoesNotStallTheModel(t *testing.T) {
	th := New(Config{}, NOW)
	h := http.Header{}
	h.Set("x-ratelimit-limit-tokens", "1000000")
	h.Set("x-ratelimit-remaining-tokens", "1000000")
	h.Set("x-ratelimit-reset-tokens", "0s")
	h.Set("x-ratelimit-limit-requests", "10000")
	h.Set("x-ratelimit-remaining-requests", "10000")
	h.Set("x-ratelimit-reset-requests", "0s")
	p0, ok, _ := th.TryStartCost(NOW, Cost{Prompt: 10, MaxOutput: 10}, Interactive)
	if !ok {
		t.Fatal("first call refused")
	}
	th.Observe(NOW, p0, ParseHeaders(h, NOW))
	a, ok, _ := th.TryStartCost(NOW, Cost{Prompt: 100, MaxOutput: 100}, Interactive)
	if !ok {
		t.Fatal("call A refused")
	}
	b, ok, _ := th.TryStartCost(NOW, Cost{Prompt: 100, MaxOutput: 100}, Interactive)
	if !ok {
		t.Fatal("call B refused")
	}
	h.Set("x-ratelimit-remaining-tokens", "999800")
	th.Observe(NOW.Add(time.Millisecond), b, ParseHeaders(h, NOW.Add(time.Millisecond)))
	th.DoneTokens(NOW.Add(2*time.Millisecond), a, 1<<62, 0, true)
	_, ok, wait := th.TryStartCost(NOW.Add(3*time.Millisecond), Cost{Prompt: 100, MaxOutput: 100}, Interactive)
	if !ok && wait > Window+time.Second {
		t.Fatalf("after a usage of 2^62 tokens: refused for %v; want a wait of at most one window (%v)", wait, Window)
	}
}
