package throttle

import (
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestHeaderKeysCanonical: every slot key is the canonical form of its
// lower-case header name and maps back to its slot.
func TestHeaderKeysCanonical(t *testing.T) {
	for s, k := range slotKeys {
		if c := http.CanonicalHeaderKey(strings.ToLower(k)); c != k {
			t.Errorf("slot %d: key %q, canonical %q", s, k, c)
		}
		if got := slotOf(k); got != s {
			t.Errorf("slotOf(%q) = %d, want %d", k, got, s)
		}
	}
	for _, k := range []string{"", "Retry-After-S", "x-ratelimit-limit", "X-Ratelimit", "Content-Type", "Ratelimit-Policy-X"} {
		if got := slotOf(k); got != -1 {
			t.Errorf("slotOf(%q) = %d, want -1", k, got)
		}
	}
}

// headerBlock builds a header map from "Name: value" lines. flags bit 0:
// keys as written (not canonicalised), so non-canonical keys reach the
// parser as a caller's own map may hold them; bit 1: 40 unrelated fields
// added, so the parser reads by lookups instead of one pass over the map.
func headerBlock(s string, flags uint8) http.Header {
	h := http.Header{}
	for _, line := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		k = strings.TrimSpace(k)
		if flags&1 != 0 {
			h[k] = append(h[k], v)
		} else {
			h.Add(k, v)
		}
	}
	if flags&2 != 0 {
		for i := range 40 {
			h.Set("X-Filler-"+strconv.Itoa(i), "1")
		}
	}
	return h
}

// FuzzHeadersOnePassMatchesLookups: the parser reads a small header map in
// one pass over its fields and a large one by a lookup per known key; both
// give exactly the same Quota and Retry-After, for every dialect hint, with
// keys canonical or not, and Auto is ParseHeaders.
func FuzzHeadersOnePassMatchesLookups(f *testing.F) {
	for _, d := range benchDialects {
		f.Add(uint8(0), uint8(0), strings.Join(d.lines, "\n"))
		f.Add(uint8(3), uint8(2), strings.Join(d.lines, "\n"))
	}
	for i, s := range []string{
		"x-ratelimit-limit-tokens: 150000\nx-ratelimit-remaining-tokens: 149984\nx-ratelimit-reset-tokens: 6m0s\nX-RateLimit-Remaining: 0",
		"anthropic-ratelimit-tokens-remaining: 1000\nanthropic-ratelimit-tokens-reset: 2026-01-01T00:00:05Z\nretry-after: 3",
		"anthropic-ratelimit-input-tokens-remaining: 10\nanthropic-ratelimit-output-tokens-remaining: 0\nanthropic-ratelimit-input-tokens-reset: 2026-01-01T00:00:45+02:00",
		"x-ratelimit-remaining-tokens: 10\nretry-after-ms: 250\nx-ms-retry-after-ms: 300\nx-ratelimit-reset-requests: 1.5s",
		"X-RateLimit-Limit: 10, 10;w=1\nX-RateLimit-Remaining: 3\nX-RateLimit-Reset: 1767225660000\nX-RateLimit-Reset: 1",
		"RateLimit-Policy: \"t\";q=100;qu=\"tokens\";w=10\nRateLimit: \"t\";r=50;t=3\nRateLimit-Limit: 5\nRateLimit: \"u\";r=-1",
		"retry-after: Thu, 01 Jan 2026 00:02:00 GMT\nx-ratelimit-reset-tokens:  25h \nx-ratelimit-limit-tokens: 0",
		"x-ratelimit-reset-tokens: 999999h999999h999999h\nx-ratelimit-remaining-tokens: 00001",
	} {
		f.Add(uint8(i), uint8(i%4), s)
	}
	f.Fuzz(func(t *testing.T, which, flags uint8, s string) {
		small, large := headerBlock(s, flags&^2), headerBlock(s, flags|2)
		dialect := fuzzDialects[int(which)%len(fuzzDialects)]
		if got, want := ParseHeadersDialect(small, NOW, dialect), ParseHeadersDialect(large, NOW, dialect); !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: one pass %+v, lookups %+v", dialect, got, want)
		}
		if got, want := ParseHeaders(small, NOW), ParseHeaders(large, NOW); !reflect.DeepEqual(got, want) {
			t.Fatalf("Auto: one pass %+v, lookups %+v", got, want)
		}
		if got, want := ParseHeaders(small, NOW), ParseHeadersDialect(small, NOW, "Auto"); !reflect.DeepEqual(got, want) {
			t.Fatalf("ParseHeaders %+v, ParseHeadersDialect Auto %+v", got, want)
		}
		d, ok := ParseRetryAfter(small, NOW)
		if rd, rok := ParseRetryAfter(large, NOW); d != rd || ok != rok {
			t.Fatalf("ParseRetryAfter: one pass %v, %v; lookups %v, %v", d, ok, rd, rok)
		}
	})
}

// FuzzSimpleDuration: the Go-duration fast path agrees with
// time.ParseDuration, and ParseResetDuration stays within [0, MaxReset].
func FuzzSimpleDuration(f *testing.F) {
	for _, s := range []string{"6ms", "15ms", "6m0s", "1h30m", "0s", "1.5s", "250us", "1m30.5s", "24h", "24h0m1s", "86400s",
		"999999h", "999999h999999h999999h", "1000000s", "06ms", "1mss", "1m.5s", "1h1h", "5", "", " 6ms ", "1e3s", "1µs", "1msm"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if d, ok := parseSimpleDuration(s); ok {
			want, err := time.ParseDuration(s)
			switch {
			case d <= MaxReset && (err != nil || want != d):
				t.Fatalf("parseSimpleDuration(%q) = %v; time.ParseDuration = %v, %v", s, d, want, err)
			case d > MaxReset && err == nil && want <= MaxReset:
				t.Fatalf("parseSimpleDuration(%q) = %v above MaxReset; time.ParseDuration = %v", s, d, want)
			}
		}
		if d, ok := ParseResetDuration(s); ok && (d < 0 || d > MaxReset) {
			t.Fatalf("ParseResetDuration(%q) = %v, outside [0, MaxReset]", s, d)
		}
	})
}

// FuzzRFC3339UTC: whatever the fast path accepts, time.Parse(time.RFC3339)
// accepts as the same instant, and rfc3339UTCUnix reads as the same Unix
// time; resets read through it stay within [0, MaxReset].
func FuzzRFC3339UTC(f *testing.F) {
	for _, s := range []string{"2026-01-01T00:00:05Z", "2026-01-01T00:00:05z", "2026-01-01t00:00:05Z", "2024-02-29T23:59:59Z",
		"2023-02-29T00:00:00Z", "2000-02-29T00:00:00Z", "1900-02-29T00:00:00Z", "0000-01-01T00:00:00Z", "9999-12-31T23:59:59Z",
		"2026-04-31T00:00:00Z", "2026-13-01T00:00:00Z", "2026-00-01T00:00:00Z", "2026-01-00T00:00:00Z", "2026-01-01T24:00:00Z",
		"2026-01-01T00:60:00Z", "2026-01-01T00:00:60Z", "2026-01-01T00:00:05.5Z", "2026-01-01T00:00:05+02:00",
		"2026-01-01T00:00:05-00:00", "+026-01-01T00:00:05Z", "2026-1-01T00:00:05ZZ", "2026-01-01 00:00:05Z", "２026-01-01T00:00:05Z"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if at, ok := parseRFC3339UTC(s); ok {
			want, err := time.Parse(time.RFC3339, s)
			if err != nil || !want.Equal(at) || want.Location() != at.Location() {
				t.Fatalf("parseRFC3339UTC(%q) = %v; time.Parse = %v, %v", s, at, want, err)
			}
		}
		at, ok := parseRFC3339UTC(s)
		if sec, uok := rfc3339UTCUnix(s); uok != ok || (ok && sec != at.Unix()) {
			t.Fatalf("rfc3339UTCUnix(%q) = %d, %v; parseRFC3339UTC = %v (%d), %v", s, sec, uok, at, at.Unix(), ok)
		}
		if d, ok := parseResetValue(s, NOW); ok && (d < 0 || d > MaxReset) {
			t.Fatalf("parseResetValue(%q) = %v, outside [0, MaxReset]", s, d)
		}
	})
}

// TestFastPathsTaken: the common reset forms are read by the fast paths.
func TestFastPathsTaken(t *testing.T) {
	for s, want := range map[string]time.Duration{"6ms": 6 * time.Millisecond, "6m0s": 6 * time.Minute, "1h30m": 90 * time.Minute, "0s": 0} {
		if d, ok := parseSimpleDuration(s); !ok || d != want {
			t.Errorf("parseSimpleDuration(%q) = %v, %v; want %v, true", s, d, ok, want)
		}
	}
	for _, s := range []string{"1.5s", "250us", "6mx", "1234567s"} {
		if d, ok := parseSimpleDuration(s); ok {
			t.Errorf("parseSimpleDuration(%q) = %v, true; want fallback", s, d)
		}
	}
	if at, ok := parseRFC3339UTC("2024-02-29T23:59:59Z"); !ok || !at.Equal(time.Date(2024, 2, 29, 23, 59, 59, 0, time.UTC)) {
		t.Errorf("parseRFC3339UTC = %v, %v", at, ok)
	}
	if _, ok := parseRFC3339UTC("2023-02-29T00:00:00Z"); ok {
		t.Error("parseRFC3339UTC accepted 2023-02-29")
	}
}

// FuzzParseLimit: the one-scan limit parser agrees with parseLimitSlow on
// any value.
func FuzzParseLimit(f *testing.F) {
	for _, s := range []string{"100", "10, 10;w=1", "10;w=1", "0", "0000000000000001", "1000000000000000", "1000000000000001",
		"9999999999999999", "10000000000000000", " 100", "100 ", "100 ,1", "1e3", "-1", "", ",", "1,", "12345678901234567,1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, ok := parseLimit(s)
		if wv, wok := parseLimitSlow(s); v != wv || ok != wok {
			t.Fatalf("parseLimit(%q) = %d, %v; parseLimitSlow = %d, %v", s, v, ok, wv, wok)
		}
	})
}

// FuzzParseResetValue: the integer fast paths of parseResetValue agree with
// parseResetSlow (floats and time.Time) on any value, at instants with and
// without a fraction of a second or a monotonic reading and far from the
// epoch.
func FuzzParseResetValue(f *testing.F) {
	for _, s := range []string{"0", "60", "86400", "86401", "999999999", "1000000000", "1767225600", "1767225660", "1767312001",
		"999999999999", "1000000000000", "1767225660500", "999999999999999", "1000000000000000", "0060", " 60", "60.5",
		"6ms", "15ms", "6m0s", "1h30m", "24h", "24h0m1s", "999999h", "1.5s", "2026-01-01T00:00:05Z", "2026-01-02T00:00:00Z",
		"2026-01-02T00:00:01Z", "1999-12-31T23:59:59Z", "0000-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "2024-02-29T12:00:00Z",
		"2026-01-01T00:00:05+02:00", "2026-01-01t00:00:05z", "Thu, 01 Jan 2026 00:02:00 GMT", "NaN", "-1", ""} {
		f.Add(s, uint8(0))
		f.Add(s, uint8(1))
	}
	f.Fuzz(func(t *testing.T, s string, which uint8) {
		now := refNows[int(which)%len(refNows)]
		d, ok := parseResetValue(s, now)
		if wd, wok := parseResetSlow(s, now); d != wd || ok != wok {
			t.Fatalf("parseResetValue(%q) at %v = %v, %v; parseResetSlow = %v, %v", s, now, d, ok, wd, wok)
		}
	})
}

// FuzzUntilUnix: untilUnix is untilTime(time.Unix(sec, nsec), now) for
// every sec within +-2^40, nsec in [0, 1e9) and any instant.
func FuzzUntilUnix(f *testing.F) {
	f.Add(int64(1767225660), int64(0), int64(1767225600), int64(0))
	f.Add(int64(1767312000), int64(0), int64(1767225600), int64(0))
	f.Add(int64(1767312001), int64(0), int64(1767225600), int64(999999999))
	f.Add(int64(1767225599), int64(999999999), int64(1767225600), int64(0))
	f.Add(int64(0), int64(0), int64(1<<40+1), int64(0))
	f.Add(int64(-62135596800), int64(0), int64(-62135596800), int64(1))
	f.Fuzz(func(t *testing.T, sec, nsec, nowSec, nowNsec int64) {
		sec %= 1 << 40
		nsec %= 1e9
		if nsec < 0 {
			nsec = -nsec
		}
		for _, now := range [...]time.Time{time.Unix(nowSec, nowNsec), time.Unix(nowSec%(1<<42), nowNsec)} {
			d, ok := untilUnix(sec, nsec, now)
			if wd, wok := untilTime(time.Unix(sec, nsec), now); d != wd || ok != wok {
				t.Fatalf("untilUnix(%d, %d, %v) = %v, %v; untilTime = %v, %v", sec, nsec, now, d, ok, wd, wok)
			}
		}
	})
}

// FuzzSFPickMatchesMember: nextPick visits the same members as next, with
// the same Item and the same values of the three parameters as
// sfMember.param, and counts the same malformed members, whichever path
// (pickSFMemberFast or parseSFMember) reads each member.
func FuzzSFPickMatchesMember(f *testing.F) {
	for _, s := range []string{`"burst";q=100;w=60,"daily";q=1000;w=86400`, `"requests";q=100;w=10, "tokens";q=10000;qu="tokens";w=10`,
		`"requests";r=50;t=3, "tokens";r=5000;t=3`, `100;w=10`, `a;q=1;q=2, b;qu=x;q=3, 7, 4;w=1`, `"a\"b";q=1`, `x;q=1.5, y;q=-1, z;q`,
		`t;a=1;b=2;c=3;d=4;e=5;f=6;g=7;h=8;q=9`, `t; q=1`, `t;q=?1, u;q=:AQ==:, v;Q=1`, `*a/b:c;q=1234567890123456`, `"\u0080";q=1`,
		`tok;q=1 , tok2;q=2 x`, `,,"a";q=1`, `"unterminated;q=1`, `1.25;q=1`} {
		f.Add(s, uint8(0))
		f.Add(s, uint8(1))
	}
	keys := [...][3]string{{"q", "qu", "w"}, {"r", "t", ""}, {"a", "a", "a"}, {"h", "w", "q"}}
	f.Fuzz(func(t *testing.T, s string, which uint8) {
		k := keys[int(which)%len(keys)]
		var m sfMember
		var pk sfPick
		want, got := sfList{s: s}, sfList{s: s}
		for {
			wok, gok := want.next(&m), got.nextPick(&pk, k[0], k[1], k[2])
			if wok != gok || want.i != got.i || want.malformed != got.malformed {
				t.Fatalf("%q: next %v at %d (%d malformed), nextPick %v at %d (%d malformed)", s, wok, want.i, want.malformed, gok, got.i, got.malformed)
			}
			if !wok {
				break
			}
			v0, h0 := m.param(k[0])
			v1, h1 := m.param(k[1])
			v2, h2 := m.param(k[2])
			if m.item != pk.item || h0 != pk.has[0] || (h0 && v0 != pk.val[0]) || h1 != pk.has[1] || (h1 && v1 != pk.val[1]) ||
				h2 != pk.has[2] || (h2 && v2 != pk.val[2]) {
				t.Fatalf("%q: member %+v %q=%+v,%v %q=%+v,%v %q=%+v,%v; picked %+v", s, m.item, k[0], v0, h0, k[1], v1, h1, k[2], v2, h2, pk)
			}
		}
	})
}

// FuzzClampRetryUnits: the integer Retry-After of a 1-15 digit value is the
// float one, in seconds and in milliseconds.
func FuzzClampRetryUnits(f *testing.F) {
	for _, n := range []int64{0, 1, 999, 1500, 604799, 604800, 604801, 604799999, 604800000, 604800001, 999999999999999} {
		f.Add(n)
	}
	f.Fuzz(func(t *testing.T, n int64) {
		if n < 0 {
			n = -n
		}
		n %= 1e15
		if got, want := clampRetryUnits(n, time.Second), clampRetry(float64(n)); got != want {
			t.Fatalf("%d s: %v, float %v", n, got, want)
		}
		if got, want := clampRetryUnits(n, time.Millisecond), clampRetry(float64(n)/1000); got != want {
			t.Fatalf("%d ms: %v, float %v", n, got, want)
		}
	})
}

// TestClampRetryUnitsNearMax: every millisecond count within a million of
// MaxRetryAfter, and every count below a million, agrees with the float
// computation.
func TestClampRetryUnitsNearMax(t *testing.T) {
	limit := int64(MaxRetryAfter / time.Millisecond)
	for _, base := range []int64{0, limit - 1e6} {
		for n := base; n < base+2e6; n++ {
			if got, want := clampRetryUnits(n, time.Millisecond), clampRetry(float64(n)/1000); got != want {
				t.Fatalf("%d ms: %v, float %v", n, got, want)
			}
		}
	}
}

// FuzzParseDigits: parseDigits is strconv.ParseInt on 1 to 15 ASCII digits
// and refuses anything else.
func FuzzParseDigits(f *testing.F) {
	for _, s := range []string{"0", "9", "12345678", "1767225660", "99999999", "00000000", "123456789012345", "1234567890123456",
		"1234567/", "1234567:", "12345678a", "/2345678", "1234 678", "\xb0\x30\x30\x30\x30\x30\x30\x30", "", "-1234567", "+1234567"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, ok := parseDigits(s)
		digits := len(s) >= 1 && len(s) <= 15 && strings.Trim(s, "0123456789") == ""
		want, err := strconv.ParseInt(s, 10, 64)
		if ok != digits || (ok && (err != nil || v != want)) {
			t.Fatalf("parseDigits(%q) = %d, %v; digits %v, ParseInt %d, %v", s, v, ok, digits, want, err)
		}
	})
}
