package throttle

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// A Retry-After (or retry-after-ms) that an intermediary merged into a
// list ("5, 10", RFC 9110 section 5.3), or that came as several field
// lines, is read as its largest valid member (RFC 9110 section 10.2.3
// defines one value; the latest instant is the safe reading); malformed
// members are ignored and counted, empty ones skipped. A merged value was
// malformed, and the 429 paused for the 1 s default backoff.
func TestRetryAfterList(t *testing.T) {
	tests := []struct {
		name      string
		lines     []string
		want      time.Duration
		ok        bool
		malformed int
	}{
		{"equal members", []string{"Retry-After: 5, 5"}, 5 * time.Second, true, 0},
		{"the larger member, second", []string{"Retry-After: 5, 10"}, 10 * time.Second, true, 0},
		{"the larger member, first", []string{"Retry-After: 10, 5"}, 10 * time.Second, true, 0},
		{"a malformed member ignored", []string{"Retry-After: 5, soon"}, 5 * time.Second, true, 1},
		{"no valid member", []string{"Retry-After: soon, later"}, 0, false, 2},
		{"empty members skipped", []string{"Retry-After: , 7,"}, 7 * time.Second, true, 0},
		{"only empty members", []string{"Retry-After: ,"}, 0, false, 1},
		{"an IMF-fixdate and seconds", []string{"Retry-After: Thu, 01 Jan 2026 00:02:00 GMT, 30"}, 120 * time.Second, true, 0},
		{"seconds and an IMF-fixdate", []string{"Retry-After: 30, Thu, 01 Jan 2026 00:02:00 GMT"}, 120 * time.Second, true, 0},
		{"two IMF-fixdates", []string{"Retry-After: Thu, 01 Jan 2026 00:03:00 GMT, Thu, 01 Jan 2026 00:02:00 GMT"}, 180 * time.Second, true, 0},
		{"an RFC 850 date", []string{"Retry-After: Thursday, 01-Jan-26 00:02:00 GMT, 5"}, 120 * time.Second, true, 0},
		{"an asctime date", []string{"Retry-After: Thu Jan  1 00:02:00 2026, 5"}, 120 * time.Second, true, 0},
		{"a past date and seconds", []string{"Retry-After: Wed, 31 Dec 2025 23:59:00 GMT, 3"}, 3 * time.Second, true, 0},
		{"a malformed date-like member", []string{"Retry-After: Thu, 99 Jan 2026 00:02:00 GMT, 4"}, 4 * time.Second, true, 2},
		{"two field lines, the larger second", []string{"Retry-After: 5", "Retry-After: 10"}, 10 * time.Second, true, 0},
		{"two field lines, the larger first", []string{"Retry-After: 10", "Retry-After: 5"}, 10 * time.Second, true, 0},
		{"a huge member is clamped", []string{"Retry-After: 5, 999999999999"}, MaxRetryAfter, true, 0},
		{"retry-after-ms merged", []string{"retry-after-ms: 250, 300"}, 300 * time.Millisecond, true, 0},
		{"retry-after-ms lines", []string{"retry-after-ms: 300", "retry-after-ms: 250"}, 300 * time.Millisecond, true, 0},
		{"x-ms-retry-after-ms merged", []string{"x-ms-retry-after-ms: 1500, 1500.5"}, 1500500 * time.Microsecond, true, 0},
		{"a malformed ms list falls back to Retry-After", []string{"retry-after-ms: x, y", "Retry-After: 2, 1"}, 2 * time.Second, true, 2},
		{"a date read against the provider's Date",
			[]string{"Date: Thu, 01 Jan 2026 00:00:30 GMT", "Retry-After: 5, Thu, 01 Jan 2026 00:02:00 GMT"}, 90 * time.Second, true, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := hdr(tc.lines...)
			d, ok := ParseRetryAfter(h, NOW)
			if d != tc.want || ok != tc.ok {
				t.Errorf("ParseRetryAfter = %v, %v; want %v, %v", d, ok, tc.want, tc.ok)
			}
			q := ParseHeaders(h, NOW)
			if q.RetryAfter != tc.want || q.HasRetryAfter != tc.ok || q.Malformed != tc.malformed {
				t.Errorf("ParseHeaders: RetryAfter %v, %v, malformed %d; want %v, %v, %d",
					q.RetryAfter, q.HasRetryAfter, q.Malformed, tc.want, tc.ok, tc.malformed)
			}
		})
	}
}

// A 429 whose Retry-After an intermediary merged pauses for the largest
// member (BC-05d: never sooner than the provider said).
func TestMergedRetryAfterPauses(t *testing.T) {
	th := New(Config{JitterWindow: -1}, NOW)
	p := mustStart(t, th, NOW, 1, Interactive)
	th.OnTooManyRequests(NOW, p, ParseHeaders(hdr("Retry-After: 5, 10"), NOW))
	if got := th.PausedUntil(); !got.Equal(at(10 * time.Second)) {
		t.Fatalf("PausedUntil = %v, want +10s", got.Sub(NOW))
	}
}

// The single-valued figures of every dialect (remaining and reset, read
// by the same code), merged into a list or sent as several field lines,
// are read conservatively: the least remaining and the latest reset. They
// were malformed, or only the first line was read.
func TestMergedFiguresReadConservatively(t *testing.T) {
	tests := []struct {
		name  string
		lines []string
		want  Quota
	}{
		{"OpenAI merged remaining and reset",
			[]string{"x-ratelimit-limit-tokens: 1000", "x-ratelimit-remaining-tokens: 900, 800", "x-ratelimit-reset-tokens: 6s, 8s"},
			Quota{Tokens: dim(1000, 800, 8*time.Second, DialectOpenAI), Dialect: DialectOpenAI}},
		{"classic merged epoch resets",
			[]string{"X-RateLimit-Remaining: 5, 3", "X-RateLimit-Reset: 1767225660, 1767225670"},
			Quota{Requests: dim(-1, 3, 70*time.Second, DialectClassic), Dialect: DialectClassic}},
		{"classic remaining in two lines, the smaller second",
			[]string{"X-RateLimit-Remaining: 5", "X-RateLimit-Remaining: 3", "X-RateLimit-Reset: 9"},
			Quota{Requests: dim(-1, 3, 9*time.Second, DialectClassic), Dialect: DialectClassic}},
		{"Anthropic resets in two lines",
			[]string{"anthropic-ratelimit-requests-remaining: 0", "anthropic-ratelimit-requests-reset: 2026-01-01T00:00:05Z",
				"anthropic-ratelimit-requests-reset: 2026-01-01T00:00:07Z"},
			Quota{Requests: dim(-1, 0, 7*time.Second, DialectAnthropic), Dialect: DialectAnthropic}},
		{"draft-03 merged reset",
			[]string{"RateLimit-Limit: 10", "RateLimit-Remaining: 4", "RateLimit-Reset: 3, 2"},
			Quota{Requests: dim(10, 4, 3*time.Second, DialectIETF), Dialect: DialectIETF}},
		{"malformed members ignored and counted",
			[]string{"X-RateLimit-Remaining: 5, lots", "X-RateLimit-Reset: soon, 9"},
			Quota{Requests: dim(-1, 5, 9*time.Second, DialectClassic), Dialect: DialectClassic, Malformed: 2}},
		{"no valid member: no figure",
			[]string{"X-RateLimit-Remaining: lots, more", "X-RateLimit-Reset: 9"},
			Quota{Malformed: 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.want
			if want.Tokens == (Dimension{}) {
				want.Tokens = none
			}
			if want.Requests == (Dimension{}) {
				want.Requests = none
			}
			if diff := cmp.Diff(inOutUnknown(want), ParseHeaders(hdr(tc.lines...), NOW)); diff != "" {
				t.Errorf("ParseHeaders (-want +got):\n%s", diff)
			}
		})
	}
}
