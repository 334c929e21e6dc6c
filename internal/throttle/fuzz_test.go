package throttle

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

func checkDimension(t *testing.T, name string, d Dimension) {
	t.Helper()
	if d.Remaining < -1 || d.Remaining > MaxQuotaValue {
		t.Fatalf("%s.Remaining = %d out of [-1, %d]", name, d.Remaining, MaxQuotaValue)
	}
	if d.Limit < -1 || d.Limit == 0 || d.Limit > MaxQuotaValue {
		t.Fatalf("%s.Limit = %d, want -1 or in [1, %d]", name, d.Limit, MaxQuotaValue)
	}
	if d.Limit > 0 && d.Remaining > d.Limit {
		t.Fatalf("%s.Remaining %d > Limit %d", name, d.Remaining, d.Limit)
	}
	if d.Reset != -1 && (d.Reset < 0 || d.Reset > MaxReset) {
		t.Fatalf("%s.Reset = %v, want -1 or in [0, %v]", name, d.Reset, MaxReset)
	}
	if d.Known() != (d.Dialect != "") {
		t.Fatalf("%s: known %v but dialect %q", name, d.Known(), d.Dialect)
	}
}

// FuzzParseHeaders: any header block parses without panic into values within
// their documented bounds. The input is "Name: value" lines.
func FuzzParseHeaders(f *testing.F) {
	for _, s := range []string{
		"x-ratelimit-limit-tokens: 150000\nx-ratelimit-remaining-tokens: 149984\nx-ratelimit-reset-tokens: 6m0s",
		"anthropic-ratelimit-requests-remaining: 0\nanthropic-ratelimit-requests-reset: 2026-01-01T00:00:05Z",
		"anthropic-ratelimit-input-tokens-remaining: 10\nanthropic-ratelimit-output-tokens-remaining: 0",
		"X-RateLimit-Limit: 10, 10;w=1\nX-RateLimit-Remaining: 3\nX-RateLimit-Reset: 1767225660",
		"RateLimit-Policy: \"burst\";q=100;w=60,\"daily\";q=1000;w=86400\nRateLimit: \"burst\";r=50;t=30",
		"RateLimit: \"a\\\"b\";r=1;t=99999999999999\nRateLimit-Policy: 10;w=1",
		"RateLimit-Remaining: 1\nRateLimit-Reset: 1e309",
		"retry-after-ms: 250\nretry-after: Thu, 01 Jan 2026 00:02:00 GMT",
		"x-ratelimit-reset-requests: NaN\nx-ratelimit-remaining-requests: -1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		h := http.Header{}
		for _, line := range strings.Split(s, "\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			h.Add(strings.TrimSpace(k), v)
		}
		q := ParseHeaders(h, NOW)
		checkDimension(t, "Tokens", q.Tokens)
		checkDimension(t, "Requests", q.Requests)
		if q.RetryAfter < 0 || q.RetryAfter > MaxRetryAfter || (!q.HasRetryAfter && q.RetryAfter != 0) {
			t.Fatalf("RetryAfter = %v (has %v)", q.RetryAfter, q.HasRetryAfter)
		}
		if q.Malformed < 0 {
			t.Fatalf("Malformed = %d", q.Malformed)
		}
		// The throttle accepts anything the parser produces.
		th := New(Config{Rand: fixedRand(0.5)}, NOW)
		p, _, _ := th.TryStart(NOW, 100, Batch)
		th.Observe(NOW, p, q)
		th.OnTooManyRequests(NOW, p, q)
		if _, ok, wait := th.TryStart(NOW.Add(time.Second), 100, Interactive); !ok && (wait <= 0 || wait > MaxRetryAfter+2*time.Second) {
			t.Fatalf("wait %v", wait)
		}
	})
}

// FuzzParseRetryAfter: no panic; ok results lie in [0, MaxRetryAfter].
func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{"0", "120", "1.5", "Thu, 01 Jan 2026 00:02:00 GMT", "Thursday, 01-Jan-26 00:02:00 GMT",
		"Thu Jan  1 00:02:00 2026", "soon", "-1", "NaN", "99999999999999999999999999"} {
		f.Add(s, "")
		f.Add("", s)
	}
	f.Fuzz(func(t *testing.T, retryAfter, ms string) {
		h := http.Header{}
		if retryAfter != "" {
			h.Set("Retry-After", retryAfter)
		}
		if ms != "" {
			h.Set("Retry-After-Ms", ms)
		}
		d, ok := ParseRetryAfter(h, NOW)
		if ok && (d < 0 || d > MaxRetryAfter) {
			t.Fatalf("ParseRetryAfter(%q, %q) = %v", retryAfter, ms, d)
		}
		if !ok && d != 0 {
			t.Fatalf("not ok but d = %v", d)
		}
	})
}

// FuzzParseResetDuration: no panic; ok results lie in [0, MaxReset].
func FuzzParseResetDuration(f *testing.F) {
	for _, s := range []string{"6m0s", "1.5s", "250ms", "1m30.5s", "0s", "0", "60", " 1s ", "1d", "abc", "-1s", "NaN", "99999999h", "1.5e3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, ok := ParseResetDuration(s)
		if ok && (d < 0 || d > MaxReset) {
			t.Fatalf("ParseResetDuration(%q) = %v", s, d)
		}
		if !ok && d != 0 {
			t.Fatalf("not ok but d = %v", d)
		}
		if r, ok := parseResetValue(s, NOW); ok && (r < 0 || r > MaxReset) {
			t.Fatalf("parseResetValue(%q) = %v", s, r)
		}
	})
}
