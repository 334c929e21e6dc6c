package throttle

import (
	"net/http"
	"reflect"
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

// fuzzDialects are the dialect hints the fuzz targets pick from by index.
var fuzzDialects = [...]string{"Auto", "OpenAI", "Anthropic", "Azure", "Classic", "IETF"}

// checkQuota asserts the documented bounds of a parsed Quota.
func checkQuota(t *testing.T, q Quota) {
	t.Helper()
	checkDimension(t, "Tokens", q.Tokens)
	checkDimension(t, "Requests", q.Requests)
	if q.RetryAfter < 0 || q.RetryAfter > MaxRetryAfter || (!q.HasRetryAfter && q.RetryAfter != 0) {
		t.Fatalf("RetryAfter = %v (has %v)", q.RetryAfter, q.HasRetryAfter)
	}
	if q.Malformed < 0 {
		t.Fatalf("Malformed = %d", q.Malformed)
	}
}

// FuzzParseHeadersDialect: any header block parsed under any dialect hint
// stays within bounds, carries only that dialect's figures, and never more
// malformed counts than the unrestricted parse.
func FuzzParseHeadersDialect(f *testing.F) {
	for i, s := range []string{
		"x-ratelimit-limit-tokens: 150000\nx-ratelimit-remaining-tokens: 149984\nx-ratelimit-reset-tokens: 6m0s\nX-RateLimit-Remaining: 0",
		"anthropic-ratelimit-tokens-remaining: 1000\nanthropic-ratelimit-tokens-reset: 2026-01-01T00:00:05Z\nretry-after: 3",
		"x-ratelimit-remaining-tokens: 10\nretry-after-ms: 250\nx-ms-retry-after-ms: 300",
		"X-RateLimit-Limit: 10\nX-RateLimit-Remaining: 3\nX-RateLimit-Reset: 1767225660000",
		"RateLimit-Policy: \"t\";q=100;qu=\"tokens\";w=10\nRateLimit: \"t\";r=50;t=3\nRateLimit-Limit: 5",
	} {
		f.Add(uint8(i), s)
		f.Add(uint8(i+1), s)
	}
	f.Fuzz(func(t *testing.T, which uint8, s string) {
		h := http.Header{}
		for _, line := range strings.Split(s, "\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			h.Add(strings.TrimSpace(k), v)
		}
		dialect := fuzzDialects[int(which)%len(fuzzDialects)]
		q := ParseHeadersDialect(h, NOW, dialect)
		checkQuota(t, q)
		all := ParseHeaders(h, NOW)
		if q.Malformed > all.Malformed {
			t.Fatalf("%s: malformed %d > auto's %d", dialect, q.Malformed, all.Malformed)
		}
		if only := NormalizeDialect(dialect); only != "" {
			for _, d := range []Dimension{q.Tokens, q.Requests} {
				if d.Dialect != "" && d.Dialect != only {
					t.Fatalf("%s: figure of dialect %q", dialect, d.Dialect)
				}
			}
		} else if !reflect.DeepEqual(q, all) {
			t.Fatalf("Auto differs from ParseHeaders: %+v vs %+v", q, all)
		}
	})
}

// dialectTriplets are, per dialect, the headers FuzzDialectValues fills with
// the fuzzed limit, remaining and reset values, so every dialect's value
// parsers are reached without the fuzzer having to guess header names.
var dialectTriplets = [...][3]string{
	{"x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"},
	{"x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "retry-after-ms"},
	{"anthropic-ratelimit-tokens-limit", "anthropic-ratelimit-tokens-remaining", "anthropic-ratelimit-tokens-reset"},
	{"anthropic-ratelimit-input-tokens-limit", "anthropic-ratelimit-output-tokens-remaining", "anthropic-ratelimit-input-tokens-reset"},
	{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"},
	{"RateLimit-Policy", "RateLimit", "Retry-After"},
	{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"},
	{"x-ms-retry-after-ms", "x-ratelimit-remaining-tokens", "Retry-After"},
}

// FuzzDialectValues: each dialect's header names with arbitrary values, under
// every dialect hint: no panic, values within bounds.
func FuzzDialectValues(f *testing.F) {
	seeds := [][3]string{
		{"150000", "149000", "6m0s"}, {"500", "499", "250"}, {"80000", "20000", "2026-01-01T00:00:45Z"},
		{"80000", "0", "2026-01-01T00:00:45+02:00"}, {"100, 100;w=60", "7", "1767225660"},
		{`"burst";q=100;w=60, "t";q=9;qu="tokens"`, `"burst";r=5;t=20, "t";r=1`, "Thu, 01 Jan 2026 00:02:00 GMT"},
		{"60", "9", "4"}, {"1.5", "-1", "NaN"},
	}
	for i, s := range seeds {
		f.Add(uint8(i), uint8(i), s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, which, hint uint8, limit, remaining, reset string) {
		names := dialectTriplets[int(which)%len(dialectTriplets)]
		h := http.Header{}
		for i, v := range [3]string{limit, remaining, reset} {
			h.Set(names[i], v)
		}
		checkQuota(t, ParseHeadersDialect(h, NOW, fuzzDialects[int(hint)%len(fuzzDialects)]))
	})
}

// FuzzStructuredFieldList: the RFC 9651 List reader behind the IETF fields
// never panics, visits members with string, token, integer or other bare
// items, and counts malformed members >= 0.
func FuzzStructuredFieldList(f *testing.F) {
	for _, s := range []string{`"burst";q=100;w=60,"daily";q=1000;w=86400`, `"peruser";q=65535;qu="content-bytes";w=10;pk=:sdfjLJUOUH==:`,
		`"default";r=50;t=30`, `10;w=1`, `a;b, c;d=?1, (1 2);x=3`, `"a\"b";r=-1`, `,,`, `1e3;r=9999999999999999`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n := 0
		malformed := forEachSFMember(s, func(m *sfMember) { n++ })
		if malformed < 0 || n < 0 {
			t.Fatalf("malformed %d", malformed)
		}
		if n+malformed > len(s)+1 {
			t.Fatalf("%d members + %d malformed from %d bytes", n, malformed, len(s))
		}
	})
}
