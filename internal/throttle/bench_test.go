package throttle

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

func BenchmarkParseHeadersOpenAI(b *testing.B) {
	h := hdr(
		"x-ratelimit-limit-requests: 10000",
		"x-ratelimit-limit-tokens: 2000000",
		"x-ratelimit-remaining-requests: 9999",
		"x-ratelimit-remaining-tokens: 1999500",
		"x-ratelimit-reset-requests: 6ms",
		"x-ratelimit-reset-tokens: 15ms",
	)
	b.ReportAllocs()
	for b.Loop() {
		_ = ParseHeaders(h, NOW)
	}
}

func BenchmarkParseHeadersAll(b *testing.B) {
	h := hdr(
		"x-ratelimit-limit-requests: 10000",
		"x-ratelimit-limit-tokens: 2000000",
		"x-ratelimit-remaining-requests: 9999",
		"x-ratelimit-remaining-tokens: 1999500",
		"x-ratelimit-reset-requests: 6ms",
		"x-ratelimit-reset-tokens: 15ms",
		"anthropic-ratelimit-requests-limit: 50",
		"anthropic-ratelimit-requests-remaining: 49",
		"anthropic-ratelimit-requests-reset: 2026-01-01T00:00:05Z",
		"anthropic-ratelimit-tokens-limit: 100000",
		"anthropic-ratelimit-tokens-remaining: 16000",
		"anthropic-ratelimit-tokens-reset: 2026-01-01T00:01:00Z",
		"X-RateLimit-Limit: 100",
		"X-RateLimit-Remaining: 42",
		"X-RateLimit-Reset: 1767225660",
		`RateLimit-Policy: "burst";q=100;w=60,"daily";q=1000;w=86400`,
		`RateLimit: "burst";r=50;t=30`,
		"retry-after-ms: 250",
		"retry-after: Thu, 01 Jan 2026 00:02:00 GMT",
	)
	b.ReportAllocs()
	for b.Loop() {
		_ = ParseHeaders(h, NOW)
	}
}

// BenchmarkTryStartObserve: one start and the observation of its response,
// with a few calls in flight, in steady state.
func BenchmarkTryStartObserve(b *testing.B) {
	th := New(Config{ReservePercent: 20}, NOW)
	q := ParseHeaders(hdr(
		"x-ratelimit-limit-requests: 1000000",
		"x-ratelimit-limit-tokens: 1000000000",
		"x-ratelimit-remaining-requests: 999000",
		"x-ratelimit-remaining-tokens: 999000000",
		"x-ratelimit-reset-requests: 60ms",
		"x-ratelimit-reset-tokens: 60ms",
	), NOW)
	th.Observe(NOW, Permit{}, q)
	var inflight [8]Permit
	now := NOW
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Millisecond)
		p, ok, _ := th.TryStart(now, 500, Batch)
		if !ok {
			b.Fatal("refused")
		}
		slot := i % len(inflight)
		if inflight[slot].Seq() != 0 {
			th.Observe(now, inflight[slot], q)
		}
		inflight[slot] = p
		i++
	}
}

// benchDialects are one realistic response per dialect, as the provider
// simulator (internal/providersim) sends them.
var benchDialects = []struct {
	name, hint string
	lines      []string
}{
	{"openai", "OpenAI", []string{
		"x-ratelimit-limit-requests: 10000", "x-ratelimit-limit-tokens: 2000000",
		"x-ratelimit-remaining-requests: 9999", "x-ratelimit-remaining-tokens: 1999500",
		"x-ratelimit-reset-requests: 6ms", "x-ratelimit-reset-tokens: 15ms"}},
	{"anthropic", "Anthropic", []string{
		"anthropic-ratelimit-requests-limit: 4000", "anthropic-ratelimit-requests-remaining: 3999",
		"anthropic-ratelimit-requests-reset: 2026-01-01T00:00:01Z", "anthropic-ratelimit-tokens-limit: 400000",
		"anthropic-ratelimit-tokens-remaining: 399000", "anthropic-ratelimit-tokens-reset: 2026-01-01T00:00:01Z"}},
	{"azure", "Azure", []string{
		"x-ratelimit-remaining-requests: 599", "x-ratelimit-remaining-tokens: 59000",
		"retry-after: 2", "retry-after-ms: 1500", "x-ms-retry-after-ms: 1500"}},
	{"classic", "Classic", []string{"X-RateLimit-Limit: 100", "X-RateLimit-Remaining: 42", "X-RateLimit-Reset: 1767225660"}},
	{"ietf", "IETF", []string{
		`RateLimit-Policy: "requests";q=100;w=10, "tokens";q=10000;qu="tokens";w=10`,
		`RateLimit: "requests";r=50;t=3, "tokens";r=5000;t=3`}},
	{"ietf-legacy", "IETF", []string{"RateLimit-Limit: 100", "RateLimit-Remaining: 50", "RateLimit-Reset: 3", "RateLimit-Policy: 100;w=10"}},
}

// numericStrings are the header values of lines that are plain decimal
// integers: the integer-values peer's input.
func numericStrings(lines []string) []string {
	var out []string
	for _, l := range lines {
		_, v, _ := strings.Cut(l, ":")
		v = strings.TrimSpace(v)
		if _, err := strconv.ParseInt(v, 10, 64); err == nil {
			out = append(out, v)
		}
	}
	return out
}

// digitRuns are the maximal runs of ASCII digits in the header values of
// lines: every number the response carries, whether a plain integer
// ("9999"), in a duration ("6ms": "6"), an RFC 3339 time (six fields), a
// structured field ("q=100;w=10": "100", "10") or a policy list. This is
// the strconv.ParseInt peer's input.
func digitRuns(lines []string) []string {
	var out []string
	for _, l := range lines {
		_, v, _ := strings.Cut(l, ":")
		for i := 0; i < len(v); {
			if v[i] < '0' || v[i] > '9' {
				i++
				continue
			}
			j := i
			for j < len(v) && v[j] >= '0' && v[j] <= '9' {
				j++
			}
			out = append(out, v[i:j])
			i = j
		}
	}
	return out
}

func benchParseInt(b *testing.B, nums []string) {
	b.ReportAllocs()
	var sink int64
	for b.Loop() {
		for _, s := range nums {
			v, _ := strconv.ParseInt(s, 10, 64)
			sink += v
		}
	}
	_ = sink
}

// BenchmarkHeaderParse: per dialect, ParseHeaders (every dialect read),
// ParseHeadersDialect (the dialect hint set) and the peer,
// strconv.ParseInt over every number the same response carries (digitRuns),
// in the same run, so the ratio (target <= 3x, <= 1 alloc) can be read per
// dialect. strconv.ParseInt-integers is the lighter peer this benchmark
// used before: only the values that are plain integers (numericStrings; for
// ietf the structured fields' integers), without the numbers of durations,
// RFC 3339 times and draft-03 policies; kept for reference.
func BenchmarkHeaderParse(b *testing.B) {
	for _, d := range benchDialects {
		h := hdr(d.lines...)
		b.Run("dialect="+d.name+"/ParseHeaders", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = ParseHeaders(h, NOW)
			}
		})
		b.Run("dialect="+d.name+"/ParseHeadersDialect", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = ParseHeadersDialect(h, NOW, d.hint)
			}
		})
		b.Run("dialect="+d.name+"/strconv.ParseInt", func(b *testing.B) { benchParseInt(b, digitRuns(d.lines)) })
		ints := numericStrings(d.lines)
		if d.name == "ietf" { // the r, t, q and w integers of the structured fields
			ints = []string{"100", "10", "10000", "10", "50", "3", "5000", "3"}
		}
		b.Run("dialect="+d.name+"/strconv.ParseInt-integers", func(b *testing.B) { benchParseInt(b, ints) })
	}
}

// TestBenchPeerInputs pins the peer's inputs, so a change of the benchmark
// responses shows in review.
func TestBenchPeerInputs(t *testing.T) {
	want := map[string]string{
		"openai":      "10000 2000000 9999 1999500 6 15",
		"anthropic":   "4000 3999 2026 01 01 00 00 01 400000 399000 2026 01 01 00 00 01",
		"azure":       "599 59000 2 1500 1500",
		"classic":     "100 42 1767225660",
		"ietf":        "100 10 10000 10 50 3 5000 3",
		"ietf-legacy": "100 50 3 100 10",
	}
	for _, d := range benchDialects {
		if got := strings.Join(digitRuns(d.lines), " "); got != want[d.name] {
			t.Errorf("%s: digit runs %q, want %q", d.name, got, want[d.name])
		}
	}
}

var _ = http.Header{}
