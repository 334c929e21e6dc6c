package throttle

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// NOW is the reference instant of the regression cases: 2026-01-01T00:00:00Z
// (epoch 1767225600).
var NOW = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// hdr builds an http.Header from "Name: value" lines; a name may repeat.
func hdr(lines ...string) http.Header {
	h := http.Header{}
	for _, l := range lines {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			panic("bad header line " + l)
		}
		h.Add(k, strings.TrimPrefix(v, " "))
	}
	return h
}

func dim(limit, remaining int64, reset time.Duration, dialect string) Dimension {
	return Dimension{Limit: limit, Remaining: remaining, Reset: reset, Dialect: dialect}
}

// withWindow returns d with Window set.
func withWindow(d Dimension, w time.Duration) Dimension {
	d.Window = w
	return d
}

// withBeyond returns d with Beyond set.
func withBeyond(d Dimension, beyond int64) Dimension {
	d.Beyond = beyond
	return d
}

var none = Dimension{Limit: -1, Remaining: -1, Reset: -1}

// inOutUnknown returns q with a zero Input or Output replaced by none: the
// tables spell out Input and Output only where a response carries them.
func inOutUnknown(q Quota) Quota {
	if q.Input == (Dimension{}) {
		q.Input = none
	}
	if q.Output == (Dimension{}) {
		q.Output = none
	}
	return q
}

func TestBC02_ParseResetDuration(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"6m0s", 360 * time.Second, true},
		{"1.5s", 1500 * time.Millisecond, true},
		{"250ms", 250 * time.Millisecond, true}, // not 250 s
		{"1m30.5s", 90500 * time.Millisecond, true},
		{"0s", 0, true}, // reset is now: still a valid value
		{"0", 0, true},
		{"60", 60 * time.Second, true}, // integer seconds fallback (Azure)
		{" 1s ", time.Second, true},    // trimmed
		{"\t8.64s", 8640 * time.Millisecond, true},
		{"8.64", 8640 * time.Millisecond, true},
		{"825ms", 825 * time.Millisecond, true},
		{"1m12s", 72 * time.Second, true},
		{"24h", 24 * time.Hour, true},
		{"86400", 24 * time.Hour, true},
		// Unparseable or out of range: the caller's default applies, never 0 s, never forever.
		{"1d", 0, false},
		{"abc", 0, false},
		{"-1s", 0, false},
		{"-0s", 0, false},
		{"+1s", 0, false},
		{"NaN", 0, false},
		{"Inf", 0, false},
		{"1e3", 0, false},
		{"24h0m1s", 0, false},
		{"86401", 0, false},
		{"99999999999999999999h", 0, false},
		{"99999999999999999999", 0, false},
		{"", 0, false},
		{"   ", 0, false},
		{"1.", 0, false},
		{".5", 0, false},
		{"1s garbage", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, ok := ParseResetDuration(tc.in)
			if got != tc.want || ok != tc.ok {
				t.Errorf("ParseResetDuration(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestBC03_RetryAfterHTTPDate(t *testing.T) {
	tests := []struct {
		name, value string
		want        time.Duration
		ok          bool
	}{
		{"IMF-fixdate", "Thu, 01 Jan 2026 00:02:00 GMT", 120 * time.Second, true},
		{"RFC 850", "Thursday, 01-Jan-26 00:02:00 GMT", 120 * time.Second, true},
		{"asctime", "Thu Jan  1 00:02:00 2026", 120 * time.Second, true},
		{"past date clamps to 0", "Wed, 31 Dec 2025 23:59:00 GMT", 0, true},
		{"garbage", "soon", 0, false},
		{"RFC 3339 is not an HTTP-date", "2026-01-01T00:02:00Z", 0, false},
		{"far future clamps", "Fri, 01 Jan 2100 00:00:00 GMT", MaxRetryAfter, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ParseRetryAfter(hdr("Retry-After: "+tc.value), NOW)
			if got != tc.want || ok != tc.ok {
				t.Errorf("ParseRetryAfter(%q) = %v, %v; want %v, %v", tc.value, got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestBC05_RetryAfterPrecedenceZeroAndBounds(t *testing.T) {
	tests := []struct {
		name string
		h    http.Header
		want time.Duration
		ok   bool
	}{
		{"a: retry-after-ms wins over retry-after", hdr("retry-after-ms: 250", "retry-after: 1"), 250 * time.Millisecond, true},
		{"a: x-ms-retry-after-ms wins over retry-after", hdr("x-ms-retry-after-ms: 1500", "retry-after: 1"), 1500 * time.Millisecond, true},
		{"a: retry-after-ms before x-ms-retry-after-ms", hdr("x-ms-retry-after-ms: 900", "retry-after-ms: 250"), 250 * time.Millisecond, true},
		{"a: malformed ms header falls through", hdr("retry-after-ms: soon", "retry-after: 2"), 2 * time.Second, true},
		{"a: fractional ms", hdr("retry-after-ms: 12.5"), 12500 * time.Microsecond, true},
		{"b: zero is eligible immediately", hdr("retry-after: 0"), 0, true},
		{"b: zero ms", hdr("retry-after-ms: 0", "retry-after: 5"), 0, true},
		{"c: 60 s boundary honoured", hdr("retry-after: 60"), 60 * time.Second, true},
		{"d: 600 s honoured", hdr("retry-after: 600"), 600 * time.Second, true},
		{"BC-12: 277403 s represented exactly", hdr("retry-after: 277403"), 277403 * time.Second, true},
		{"huge clamps to the maximum", hdr("retry-after: 99999999999999999999999"), MaxRetryAfter, true},
		{"whitespace", hdr("retry-after:  3 "), 3 * time.Second, true},
		{"negative", hdr("retry-after: -5"), 0, false},
		{"NaN", hdr("retry-after: NaN"), 0, false},
		{"exponent", hdr("retry-after: 1e3"), 0, false},
		{"empty", hdr("retry-after: "), 0, false},
		{"absent", http.Header{}, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ParseRetryAfter(tc.h, NOW)
			if got != tc.want || ok != tc.ok {
				t.Errorf("got %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestParseHeaders(t *testing.T) {
	tests := []struct {
		name string
		h    http.Header
		want Quota
	}{
		{
			name: "empty: nothing known",
			h:    http.Header{},
			want: Quota{Tokens: none, Requests: none},
		},
		{
			name: "OpenAI, 6m0s converts",
			h: hdr(
				"x-ratelimit-limit-requests: 60",
				"x-ratelimit-limit-tokens: 150000",
				"x-ratelimit-remaining-requests: 59",
				"x-ratelimit-remaining-tokens: 149984",
				"x-ratelimit-reset-requests: 1s",
				"x-ratelimit-reset-tokens: 6m0s",
			),
			want: Quota{
				Tokens:   dim(150000, 149984, 6*time.Minute, DialectOpenAI),
				Requests: dim(60, 59, time.Second, DialectOpenAI),
				Dialect:  DialectOpenAI,
			},
		},
		{
			name: "OpenAI on a 429 with retry-after",
			h: hdr(
				"x-ratelimit-limit-tokens: 30000",
				"x-ratelimit-remaining-tokens: 0",
				"x-ratelimit-reset-tokens: 825ms",
				"retry-after: 1",
			),
			want: Quota{
				Tokens: dim(30000, 0, 825*time.Millisecond, DialectOpenAI), Requests: none,
				RetryAfter: time.Second, HasRetryAfter: true, Dialect: DialectOpenAI,
			},
		},
		{
			name: "Azure: integer-second reset, remaining without reset, retry-after-ms",
			h: hdr(
				"x-ratelimit-remaining-requests: 99",
				"x-ratelimit-limit-tokens: 240000",
				"x-ratelimit-remaining-tokens: 1000",
				"x-ratelimit-reset-tokens: 12",
				"retry-after-ms: 1200",
				"retry-after: 2",
			),
			want: Quota{
				Tokens:     dim(240000, 1000, 12*time.Second, DialectAzure),
				Requests:   dim(-1, 99, -1, DialectAzure),
				RetryAfter: 1200 * time.Millisecond, HasRetryAfter: true, Dialect: DialectAzure,
			},
		},
		{
			name: "Azure: only a millisecond retry-after",
			h:    hdr("x-ms-retry-after-ms: 500"),
			want: Quota{Tokens: none, Requests: none, RetryAfter: 500 * time.Millisecond, HasRetryAfter: true, Dialect: DialectAzure},
		},
		{
			name: "Azure: -1 and 0 bogus values are malformed",
			h: hdr(
				"x-ratelimit-limit-tokens: 0",
				"x-ratelimit-remaining-tokens: -1",
			),
			want: Quota{Tokens: none, Requests: none, Malformed: 2},
		},
		{
			name: "Anthropic with RFC 3339 resets (BC-07)",
			h: hdr(
				"anthropic-ratelimit-requests-limit: 50",
				"anthropic-ratelimit-requests-remaining: 0",
				"anthropic-ratelimit-requests-reset: 2026-01-01T00:00:05Z",
				"anthropic-ratelimit-tokens-limit: 100000",
				"anthropic-ratelimit-tokens-remaining: 16000",
				"anthropic-ratelimit-tokens-reset: 2026-01-01T00:01:00Z",
			),
			want: Quota{
				Tokens:   dim(100000, 16000, time.Minute, DialectAnthropic),
				Requests: dim(50, 0, 5*time.Second, DialectAnthropic),
				Dialect:  DialectAnthropic,
			},
		},
		{
			name: "Anthropic: offset reset is the same instant (BC-07 C), fractional seconds, past reset is 0",
			h: hdr(
				"anthropic-ratelimit-requests-remaining: 3",
				"anthropic-ratelimit-requests-reset: 2026-01-01T02:00:05+02:00",
				"anthropic-ratelimit-tokens-remaining: 7000",
				"anthropic-ratelimit-tokens-reset: 2025-12-31T23:59:59.5Z",
			),
			want: Quota{
				Tokens:   dim(-1, 7000, 0, DialectAnthropic),
				Requests: dim(-1, 3, 5*time.Second, DialectAnthropic),
				Dialect:  DialectAnthropic,
			},
		},
		{
			name: "Anthropic: without the tokens triplet, input and output are separate dimensions, never summed",
			h: hdr(
				"anthropic-ratelimit-input-tokens-limit: 400000",
				"anthropic-ratelimit-input-tokens-remaining: 399000",
				"anthropic-ratelimit-input-tokens-reset: 2026-01-01T00:00:01Z",
				"anthropic-ratelimit-output-tokens-limit: 80000",
				"anthropic-ratelimit-output-tokens-remaining: 79000",
				"anthropic-ratelimit-output-tokens-reset: 2026-01-01T00:00:02Z",
			),
			want: Quota{Tokens: none, Requests: none,
				Input:  dim(400000, 399000, time.Second, DialectAnthropic),
				Output: dim(80000, 79000, 2*time.Second, DialectAnthropic), Dialect: DialectAnthropic},
		},
		{
			name: "Anthropic: the tokens triplet fills Tokens, an exhausted output-tokens triplet Output only",
			h: hdr(
				"anthropic-ratelimit-tokens-limit: 480000",
				"anthropic-ratelimit-tokens-remaining: 399000",
				"anthropic-ratelimit-tokens-reset: 2026-01-01T00:00:01Z",
				"anthropic-ratelimit-output-tokens-limit: 80000",
				"anthropic-ratelimit-output-tokens-remaining: 0",
				"anthropic-ratelimit-output-tokens-reset: 2026-01-01T00:00:30Z",
			),
			want: Quota{Tokens: dim(480000, 399000, time.Second, DialectAnthropic), Requests: none,
				Output: dim(80000, 0, 30*time.Second, DialectAnthropic), Dialect: DialectAnthropic},
		},
		{
			name: "classic with delta seconds",
			h:    hdr("X-RateLimit-Limit: 100", "X-RateLimit-Remaining: 42", "X-RateLimit-Reset: 30"),
			want: Quota{Tokens: none, Requests: dim(100, 42, 30*time.Second, DialectClassic), Dialect: DialectClassic},
		},
		{
			name: "classic with epoch seconds",
			h:    hdr("X-RateLimit-Limit: 5000", "X-RateLimit-Remaining: 4999", "X-RateLimit-Reset: 1767225660"),
			want: Quota{Tokens: none, Requests: dim(5000, 4999, time.Minute, DialectClassic), Dialect: DialectClassic},
		},
		{
			name: "classic with epoch milliseconds",
			h:    hdr("X-RateLimit-Remaining: 10", "X-RateLimit-Reset: 1767225601500"),
			want: Quota{Tokens: none, Requests: dim(-1, 10, 1500*time.Millisecond, DialectClassic), Dialect: DialectClassic},
		},
		{
			name: "classic with a past epoch clamps to 0",
			h:    hdr("X-RateLimit-Remaining: 10", "X-RateLimit-Reset: 1767225000"),
			want: Quota{Tokens: none, Requests: dim(-1, 10, 0, DialectClassic), Dialect: DialectClassic},
		},
		{
			name: "classic with an epoch beyond MaxReset is malformed",
			h:    hdr("X-RateLimit-Remaining: 10", "X-RateLimit-Reset: 1867225600"),
			want: Quota{Tokens: none, Requests: dim(-1, 10, -1, DialectClassic), Dialect: DialectClassic, Malformed: 1},
		},
		{
			name: "classic Envoy list-form limit",
			h:    hdr(`X-RateLimit-Limit: 10, 10;w=1;name="per-ip", 1000;w=3600`, "X-RateLimit-Remaining: 9", "X-RateLimit-Reset: 1"),
			want: Quota{Tokens: none, Requests: withWindow(dim(10, 9, time.Second, DialectClassic), time.Second), Dialect: DialectClassic},
		},
		{
			name: "IETF draft-10: RateLimit names a RateLimit-Policy",
			h: hdr(
				`RateLimit-Policy: "burst";q=100;w=60,"daily";q=1000;w=86400`,
				`RateLimit: "default";r=50;t=30, "burst";r=40;t=20`,
			),
			// "default" (no policy: requests) outlasts "burst": its 50 cap
			// the dimension past burst's reset.
			want: Quota{Tokens: none, Requests: withBeyond(withWindow(dim(100, 40, 20*time.Second, DialectIETF), time.Minute), 50), Dialect: DialectIETF},
		},
		{
			name: "IETF: several field lines, token unit, request unit, foreign units ignored, malformed members skipped",
			h: hdr(
				`RateLimit-Policy: "tpm";q=60000;qu="tokens";w=60`,
				`RateLimit-Policy: "rpm";q=600;qu="request";w=60, "bytes";q=65535;qu="content-bytes";w=10;pk=:sdfjLJUOUH==:, garbage;;`,
				`RateLimit: "tpm";r=1500;t=2`,
				`RateLimit: "rpm";r=590;t=1, "bytes";r=10;t=1, "x";t=5, ("inner" "list");r=1`,
			),
			want: Quota{
				Tokens:    withWindow(dim(60000, 1500, 2*time.Second, DialectIETF), time.Minute),
				Requests:  withWindow(dim(600, 590, time.Second, DialectIETF), time.Minute),
				Dialect:   DialectIETF,
				Malformed: 3, // "garbage;;", "x" without r, the inner list
			},
		},
		{
			name: "IETF: vendor token unit and an unused policy gives the limit only",
			h:    hdr(`RateLimit-Policy: "acme";q=5000;qu="acme-tokens";w=60`),
			want: Quota{Tokens: withWindow(dim(5000, -1, -1, DialectIETF), time.Minute), Requests: none, Dialect: DialectIETF},
		},
		{
			name: "IETF draft-03 form with integer RateLimit-Policy",
			h:    hdr("RateLimit-Remaining: 7", "RateLimit-Reset: 3", "RateLimit-Policy: 10;w=1, 100;w=60"),
			want: Quota{Tokens: none, Requests: withWindow(dim(10, 7, 3*time.Second, DialectIETF), time.Second), Dialect: DialectIETF},
		},
		{
			name: "most restrictive wins across dialects: smallest remaining",
			h: hdr(
				"x-ratelimit-limit-requests: 1000",
				"x-ratelimit-remaining-requests: 900",
				"x-ratelimit-reset-requests: 6s",
				"X-RateLimit-Limit: 100",
				"X-RateLimit-Remaining: 12",
				"X-RateLimit-Reset: 40",
				`RateLimit: "default";r=50;t=30`,
			),
			want: Quota{Tokens: none, Requests: dim(100, 12, 40*time.Second, DialectClassic), Dialect: DialectClassic},
		},
		{
			name: "most restrictive: equal remaining, the later reset wins",
			h: hdr(
				"x-ratelimit-remaining-requests: 5",
				"x-ratelimit-reset-requests: 2s",
				"X-RateLimit-Remaining: 5",
				"X-RateLimit-Reset: 9",
			),
			want: Quota{Tokens: none, Requests: dim(-1, 5, 9*time.Second, DialectClassic), Dialect: DialectClassic},
		},
		{
			name: "tokens winner names the dialect",
			h: hdr(
				"x-ratelimit-limit-tokens: 1000",
				"x-ratelimit-remaining-tokens: 900",
				"x-ratelimit-reset-tokens: 6s",
				"X-RateLimit-Remaining: 5",
				"X-RateLimit-Reset: 9",
			),
			want: Quota{Tokens: dim(1000, 900, 6*time.Second, DialectOpenAI), Requests: dim(-1, 5, 9*time.Second, DialectClassic), Dialect: DialectOpenAI},
		},
		{
			name: "malformed values ignored and counted",
			h: hdr(
				"x-ratelimit-limit-tokens: NaN",
				"x-ratelimit-remaining-tokens: 1e3",
				"x-ratelimit-reset-tokens: 1d",
				"x-ratelimit-remaining-requests: 9999999999999999",
				"x-ratelimit-reset-requests: -1s",
				"retry-after: soon",
				"X-RateLimit-Remaining: ", // empty is not 0
			),
			want: Quota{Tokens: none, Requests: none, Malformed: 7},
		},
		{
			name: "remaining above limit is clamped to the limit",
			h:    hdr("x-ratelimit-limit-requests: 10", "x-ratelimit-remaining-requests: 12", "x-ratelimit-reset-requests: 1s"),
			want: Quota{Tokens: none, Requests: dim(10, 10, time.Second, DialectOpenAI), Dialect: DialectOpenAI},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := ParseHeaders(tc.h, NOW)
			if diff := cmp.Diff(inOutUnknown(tc.want), got); diff != "" {
				t.Errorf("ParseHeaders mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestForEachSFMember(t *testing.T) {
	type item struct {
		Kind   sfKind
		S      string
		I      int64
		Params map[string]sfValue
	}
	collect := func(s string) ([]item, int) {
		var out []item
		bad := forEachSFMember(s, func(m *sfMember) {
			it := item{Kind: m.item.kind, S: m.item.s, I: m.item.i, Params: map[string]sfValue{}}
			for i := 0; i < m.nParams; i++ {
				it.Params[m.params[i].key] = m.params[i].val
			}
			out = append(out, it)
		})
		return out, bad
	}
	tests := []struct {
		in   string
		want []item
		bad  int
	}{
		{`"a";q=1`, []item{{Kind: sfString, S: "a", Params: map[string]sfValue{"q": {kind: sfInteger, i: 1}}}}, 0},
		{`"a\"b,c";x=?1;y;z=tok/en, 12;w=-3`, []item{
			{Kind: sfString, S: `a"b,c`, Params: map[string]sfValue{"x": {kind: sfBool, i: 1}, "y": {kind: sfBool, i: 1}, "z": {kind: sfToken, s: "tok/en"}}},
			{Kind: sfInteger, I: 12, Params: map[string]sfValue{"w": {kind: sfInteger, i: -3}}},
		}, 0},
		{`,,"a"`, []item{{Kind: sfString, S: "a", Params: map[string]sfValue{}}}, 2}, // empty members are invalid
		{`"unterminated`, nil, 1},
		{`"a" "b", "c";Q=1, "d";q=1.25, "e";q=1234567890123456`, []item{
			{Kind: sfString, S: "d", Params: map[string]sfValue{"q": {kind: sfDecimal}}},
		}, 3},
		{"", nil, 0},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, bad := collect(tc.in)
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(sfValue{})); diff != "" || bad != tc.bad {
				t.Errorf("members (-want +got):\n%s\nmalformed %d, want %d", diff, bad, tc.bad)
			}
		})
	}
}
