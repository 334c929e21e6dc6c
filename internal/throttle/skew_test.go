package throttle

import (
	"net/http"
	"testing"
	"time"
)

// Absolute reset times (Anthropic's RFC 3339 resets, classic epoch resets,
// a Retry-After HTTP-date) are instants of the provider's clock. When the
// response's Date shows that the local clock is off by more than a couple of
// seconds, they are read against the provider's Date, not the local clock:
// a local clock 30 s ahead read a reset 5 s away as already past (quota
// "replenished now" while it is exhausted), one 2 min behind as 2 min 5 s
// away (a pause of minutes for a 5 s reset).
func TestAbsoluteResetsReadAgainstProviderDate(t *testing.T) {
	date := "Date: Thu, 01 Jan 2026 00:00:00 GMT" // the provider's clock: NOW
	tests := []struct {
		name  string
		local time.Time // the local clock when the response arrives
		lines []string
		want  Quota
	}{
		{"anthropic, local clock 30 s ahead", NOW.Add(30 * time.Second),
			[]string{date, "anthropic-ratelimit-requests-limit: 50", "anthropic-ratelimit-requests-remaining: 0",
				"anthropic-ratelimit-requests-reset: 2026-01-01T00:00:05Z"},
			Quota{Requests: dim(50, 0, 5*time.Second, DialectAnthropic), Tokens: none, Dialect: DialectAnthropic}},
		{"anthropic, local clock 2 min behind", NOW.Add(-2 * time.Minute),
			[]string{date, "anthropic-ratelimit-requests-limit: 50", "anthropic-ratelimit-requests-remaining: 0",
				"anthropic-ratelimit-requests-reset: 2026-01-01T00:00:05.5Z"},
			Quota{Requests: dim(50, 0, 5500*time.Millisecond, DialectAnthropic), Tokens: none, Dialect: DialectAnthropic}},
		{"classic epoch seconds, local clock 30 s ahead", NOW.Add(30 * time.Second),
			[]string{date, "X-RateLimit-Limit: 100", "X-RateLimit-Remaining: 0", "X-RateLimit-Reset: 1767225620"},
			Quota{Requests: dim(100, 0, 20*time.Second, DialectClassic), Tokens: none, Dialect: DialectClassic}},
		{"classic epoch milliseconds, local clock 1 h behind", NOW.Add(-time.Hour),
			[]string{date, "X-RateLimit-Limit: 100", "X-RateLimit-Remaining: 0", "X-RateLimit-Reset: 1767225620000"},
			Quota{Requests: dim(100, 0, 20*time.Second, DialectClassic), Tokens: none, Dialect: DialectClassic}},
		{"retry-after HTTP-date, local clock 60 s ahead", NOW.Add(time.Minute),
			[]string{date, "Retry-After: Thu, 01 Jan 2026 00:02:00 GMT"},
			Quota{Tokens: none, Requests: none, RetryAfter: 2 * time.Minute, HasRetryAfter: true}},
		{"delta seconds do not depend on the clocks", NOW.Add(time.Minute),
			[]string{date, "X-RateLimit-Limit: 100", "X-RateLimit-Remaining: 0", "X-RateLimit-Reset: 20"},
			Quota{Requests: dim(100, 0, 20*time.Second, DialectClassic), Tokens: none, Dialect: DialectClassic}},
		{"clocks within the tolerance: the local clock", NOW.Add(1500 * time.Millisecond),
			[]string{date, "anthropic-ratelimit-requests-limit: 50", "anthropic-ratelimit-requests-remaining: 0",
				"anthropic-ratelimit-requests-reset: 2026-01-01T00:00:05Z"},
			Quota{Requests: dim(50, 0, 3500*time.Millisecond, DialectAnthropic), Tokens: none, Dialect: DialectAnthropic}},
		{"a malformed Date is ignored", NOW.Add(30 * time.Second),
			[]string{"Date: yesterday", "anthropic-ratelimit-requests-limit: 50", "anthropic-ratelimit-requests-remaining: 0",
				"anthropic-ratelimit-requests-reset: 2026-01-01T00:00:45Z"},
			Quota{Requests: dim(50, 0, 15*time.Second, DialectAnthropic), Tokens: none, Dialect: DialectAnthropic}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := ParseHeaders(hdr(tc.lines...), tc.local)
			got.Malformed = 0
			if want := inOutUnknown(tc.want); got != want {
				t.Errorf("ParseHeaders =\n%+v\nwant\n%+v", got, want)
			}
		})
	}
	// ParseRetryAfter reads the Date too.
	h := hdr(date, "Retry-After: Thu, 01 Jan 2026 00:02:00 GMT")
	if d, ok := ParseRetryAfter(h, NOW.Add(time.Minute)); !ok || d != 2*time.Minute {
		t.Errorf("ParseRetryAfter = %v, %v; want 2m0s, true", d, ok)
	}
}

// The throttle, with a local clock 30 s ahead of the provider's: a classic
// window exhausted until the provider's epoch reset 20 s away stays closed
// until then, instead of being read as already replenished.
func TestSkewedClockKeepsExhaustedWindowClosed(t *testing.T) {
	local := NOW.Add(30 * time.Second)
	th := New(Config{JitterWindow: -1, Rand: fixedRand(0)}, local)
	q := ParseHeaders(hdr("Date: Thu, 01 Jan 2026 00:00:00 GMT", "X-RateLimit-Limit: 100",
		"X-RateLimit-Remaining: 0", "X-RateLimit-Reset: 1767225620"), local)
	th.Observe(local, Permit{}, q)
	if w := mustRefuse(t, th, local, 1, Interactive); w != 20*time.Second {
		t.Fatalf("wait %v, want 20s (the provider's reset)", w)
	}
	mustStart(t, th, local.Add(20*time.Second), 1, Interactive)
}

// imfFixdateUnix agrees with time.Parse(http.TimeFormat) on every input it
// accepts (the day name, which neither checks against the date, aside),
// and accepts every well-formed IMF-fixdate.
func FuzzIMFFixdate(f *testing.F) {
	for _, s := range []string{"Thu, 01 Jan 2026 00:00:00 GMT", "Sun, 06 Nov 1994 08:49:37 GMT", "Sun, 29 Feb 2028 23:59:59 GMT",
		"Sun, 29 Feb 2027 23:59:59 GMT", "Sun, 06 Nov 1994 24:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun, 06 Foo 1994 08:49:37 GMT"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sec, ok := imfFixdateUnix(s)
		if len(s) < 3 {
			return
		}
		at, err := time.Parse(http.TimeFormat, "Mon"+s[3:])
		wellFormed := err == nil && at.Format(http.TimeFormat)[3:] == s[3:]
		switch {
		case ok && (err != nil || at.Unix() != sec):
			t.Fatalf("imfFixdateUnix(%q) = %d, time.Parse = %v, %v", s, sec, at, err)
		case !ok && wellFormed:
			t.Fatalf("imfFixdateUnix(%q) refused, time.Parse = %v", s, at)
		}
	})
}
