package throttle

import (
	"testing"
	"time"
)

// Azure OpenAI sometimes sends placeholder figures (a limit of 0, a
// remaining of 0 or -1; provider header reference, Azure section). A
// triplet whose limit is 0 describes no quota: its remaining 0 is not an
// exhaustion, and must not stop the model for a minute after every such
// response (one call a minute without hints).
func TestZeroLimitPlaceholderDoesNotBlock(t *testing.T) {
	placeholder := hdr("x-ratelimit-limit-requests: 0", "x-ratelimit-remaining-requests: 0",
		"x-ratelimit-limit-tokens: 0", "x-ratelimit-remaining-tokens: 0")
	q := ParseHeaders(placeholder, NOW)
	if q.Tokens.Known() || q.Requests.Known() {
		t.Fatalf("ParseHeaders = tokens %+v, requests %+v; want both unknown", q.Tokens, q.Requests)
	}
	if q.Malformed != 4 {
		t.Errorf("Malformed = %d, want 4 (two zero limits, two remaining of them)", q.Malformed)
	}
	th := New(Config{JitterWindow: -1, Rand: fixedRand(0)}, NOW)
	for i := range 5 {
		now := at(time.Duration(i) * time.Second)
		p := mustStart(t, th, now, 100, Interactive)
		th.Observe(now.Add(100*time.Millisecond), p, ParseHeaders(placeholder, now.Add(100*time.Millisecond)))
	}
	// A remaining of 0 beside a real limit is an exhaustion.
	q = ParseHeaders(hdr("x-ratelimit-limit-requests: 60", "x-ratelimit-remaining-requests: 0", "x-ratelimit-reset-requests: 1s"), NOW)
	if q.Requests != dim(60, 0, time.Second, DialectOpenAI) {
		t.Errorf("Requests = %+v, want limit 60, remaining 0, reset 1s", q.Requests)
	}
}
