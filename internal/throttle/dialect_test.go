package throttle

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// mixedHeaders is a response carrying every dialect at once, as a provider
// behind a proxy that adds its own classic and IETF fields would send.
func mixedHeaders() []string {
	return []string{
		"x-ratelimit-limit-tokens: 150000",
		"x-ratelimit-remaining-tokens: 149000",
		"x-ratelimit-reset-tokens: 400ms",
		"x-ratelimit-limit-requests: 500",
		"x-ratelimit-remaining-requests: 499",
		"x-ratelimit-reset-requests: 120ms",
		"anthropic-ratelimit-requests-limit: 50",
		"anthropic-ratelimit-requests-remaining: 40",
		"anthropic-ratelimit-requests-reset: 2026-01-01T00:00:12Z",
		"anthropic-ratelimit-tokens-limit: 80000",
		"anthropic-ratelimit-tokens-remaining: 20000",
		"anthropic-ratelimit-tokens-reset: 2026-01-01T00:00:45Z",
		"X-RateLimit-Limit: 100",
		"X-RateLimit-Remaining: 7",
		"X-RateLimit-Reset: 30",
		`RateLimit-Policy: "burst";q=100;w=60`,
		`RateLimit: "burst";r=5;t=20`,
		"Retry-After: 3",
	}
}

func TestParseHeadersDialect(t *testing.T) {
	ra := func(q Quota) Quota { q.RetryAfter, q.HasRetryAfter = 3*time.Second, true; return q }
	tests := []struct {
		name, dialect string
		lines         []string
		want          Quota
	}{
		{"auto keeps the most restrictive figure", "Auto", mixedHeaders(), ra(Quota{
			Tokens: dim(80000, 20000, 45*time.Second, DialectAnthropic), Requests: withBeyond(withWindow(dim(100, 5, 20*time.Second, DialectIETF), time.Minute), 7), Dialect: DialectAnthropic})},
		{"empty is auto", "", mixedHeaders(), ra(Quota{
			Tokens: dim(80000, 20000, 45*time.Second, DialectAnthropic), Requests: withBeyond(withWindow(dim(100, 5, 20*time.Second, DialectIETF), time.Minute), 7), Dialect: DialectAnthropic})},
		{"unknown name is auto", "Gopher", mixedHeaders(), ra(Quota{
			Tokens: dim(80000, 20000, 45*time.Second, DialectAnthropic), Requests: withBeyond(withWindow(dim(100, 5, 20*time.Second, DialectIETF), time.Minute), 7), Dialect: DialectAnthropic})},
		{"OpenAI", "OpenAI", mixedHeaders(), ra(Quota{
			Tokens: dim(150000, 149000, 400*time.Millisecond, DialectOpenAI), Requests: dim(500, 499, 120*time.Millisecond, DialectOpenAI), Dialect: DialectOpenAI})},
		{"openai lower case", "openai", mixedHeaders(), ra(Quota{
			Tokens: dim(150000, 149000, 400*time.Millisecond, DialectOpenAI), Requests: dim(500, 499, 120*time.Millisecond, DialectOpenAI), Dialect: DialectOpenAI})},
		{"Azure reads the OpenAI names as azure", "Azure", mixedHeaders(), ra(Quota{
			Tokens: dim(150000, 149000, 400*time.Millisecond, DialectAzure), Requests: dim(500, 499, 120*time.Millisecond, DialectAzure), Dialect: DialectAzure})},
		{"Anthropic", "Anthropic", mixedHeaders(), ra(Quota{
			Tokens: dim(80000, 20000, 45*time.Second, DialectAnthropic), Requests: dim(50, 40, 12*time.Second, DialectAnthropic), Dialect: DialectAnthropic})},
		{"Classic", "CLASSIC", mixedHeaders(), ra(Quota{
			Tokens: none, Requests: dim(100, 7, 30*time.Second, DialectClassic), Dialect: DialectClassic})},
		{"IETF", "IETF", mixedHeaders(), ra(Quota{
			Tokens: none, Requests: withWindow(dim(100, 5, 20*time.Second, DialectIETF), time.Minute), Dialect: DialectIETF})},
		{"IETF draft-03 form", "IETF", []string{"RateLimit-Limit: 60", "RateLimit-Remaining: 9", "RateLimit-Reset: 4", "X-RateLimit-Remaining: 0"}, Quota{
			Tokens: none, Requests: dim(60, 9, 4*time.Second, DialectIETF), Dialect: DialectIETF}},
		{"a proxy's exhausted classic figure is ignored for OpenAI", "OpenAI",
			[]string{"x-ratelimit-limit-requests: 500", "x-ratelimit-remaining-requests: 499", "x-ratelimit-reset-requests: 120ms", "X-RateLimit-Limit: 10", "X-RateLimit-Remaining: 0", "X-RateLimit-Reset: 60"},
			Quota{Tokens: none, Requests: dim(500, 499, 120*time.Millisecond, DialectOpenAI), Dialect: DialectOpenAI}},
		{"the same under Auto: the proxy's figure wins", "Auto",
			[]string{"x-ratelimit-limit-requests: 500", "x-ratelimit-remaining-requests: 499", "x-ratelimit-reset-requests: 120ms", "X-RateLimit-Limit: 10", "X-RateLimit-Remaining: 0", "X-RateLimit-Reset: 60"},
			Quota{Tokens: none, Requests: dim(10, 0, time.Minute, DialectClassic), Dialect: DialectClassic}},
		{"malformed headers of other dialects are not counted", "OpenAI",
			[]string{"x-ratelimit-remaining-tokens: 12", "x-ratelimit-reset-tokens: 1s", "X-RateLimit-Remaining: lots", "anthropic-ratelimit-tokens-reset: soon", `RateLimit: ;;`},
			Quota{Tokens: dim(-1, 12, time.Second, DialectOpenAI), Requests: none, Dialect: DialectOpenAI}},
		{"malformed headers of the dialect are counted", "Classic",
			[]string{"X-RateLimit-Remaining: lots", "X-RateLimit-Reset: 5"},
			Quota{Tokens: none, Requests: none, Malformed: 1}},
		{"Azure: retry-after-ms read, no figures", "Azure", []string{"retry-after-ms: 250", "Retry-After: 1"},
			Quota{Tokens: none, Requests: none, RetryAfter: 250 * time.Millisecond, HasRetryAfter: true, Dialect: DialectAzure}},
		{"Anthropic: Retry-After HTTP-date still read", "Anthropic", []string{"Retry-After: Thu, 01 Jan 2026 00:00:42 GMT", "x-ratelimit-remaining-tokens: 0"},
			Quota{Tokens: none, Requests: none, RetryAfter: 42 * time.Second, HasRetryAfter: true}},
		{"Anthropic: retry-after-ms read but not labelled azure", "Anthropic", []string{"x-ms-retry-after-ms: 1500"},
			Quota{Tokens: none, Requests: none, RetryAfter: 1500 * time.Millisecond, HasRetryAfter: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := ParseHeadersDialect(hdr(tc.lines...), NOW, tc.dialect)
			if diff := cmp.Diff(inOutUnknown(tc.want), got); diff != "" {
				t.Fatalf("ParseHeadersDialect(%q) (-want +got):\n%s", tc.dialect, diff)
			}
			if NormalizeDialect(tc.dialect) == "" {
				if auto := ParseHeaders(hdr(tc.lines...), NOW); !cmp.Equal(auto, got) {
					t.Fatalf("Auto differs from ParseHeaders:\n%s", cmp.Diff(auto, got))
				}
			}
		})
	}
}

func TestNormalizeDialect(t *testing.T) {
	for in, want := range map[string]string{
		"": "", "Auto": "", "auto": "", "OpenAI": DialectOpenAI, "openai": DialectOpenAI, "Anthropic": DialectAnthropic,
		"Azure": DialectAzure, "Classic": DialectClassic, "IETF": DialectIETF, "ietf": DialectIETF, "ietf-legacy": "", "x": "",
	} {
		if got := NormalizeDialect(in); got != want {
			t.Errorf("NormalizeDialect(%q) = %q, want %q", in, got, want)
		}
	}
}

// The throttle's own parser applies Config.Dialect, and Reconfigure changes it.
func TestThrottleParseHeadersDialect(t *testing.T) {
	th := New(Config{Dialect: "Classic"}, NOW)
	h := hdr(mixedHeaders()...)
	if got, want := th.ParseHeaders(h, NOW), ParseHeadersDialect(h, NOW, "Classic"); !cmp.Equal(got, want) {
		t.Fatalf("Classic: %s", cmp.Diff(want, got))
	}
	th.Reconfigure(NOW, Config{})
	if got, want := th.ParseHeaders(h, NOW), ParseHeaders(h, NOW); !cmp.Equal(got, want) {
		t.Fatalf("Auto: %s", cmp.Diff(want, got))
	}
}
