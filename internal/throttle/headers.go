package throttle

import (
	"math"
	"math/bits"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Bounds on parsed values. A value outside them is malformed (ignored and
// counted in Quota.Malformed), except Retry-After, which is clamped (see
// MaxRetryAfter).
const (
	// MaxReset is the longest reset the parser accepts (24 h: the longest
	// window any provider documents is a day, e.g. an IETF policy w=86400).
	// A longer reset is malformed, so it can never mean "wait forever".
	MaxReset = 24 * time.Hour

	// MaxRetryAfter is the longest Retry-After the parser represents
	// (7 days). A provider's explicit Retry-After is the one figure that must
	// never be shortened into an early retry (BC-05d), so larger values are
	// clamped to it rather than ignored; 277403 s (BC-12) is below it and
	// represented exactly. Callers compare waits with their deadline.
	MaxRetryAfter = 7 * 24 * time.Hour

	// MaxQuotaValue is the largest limit or remaining count accepted (1e15);
	// larger values are malformed.
	MaxQuotaValue int64 = 1_000_000_000_000_000

	// EpochSecondsThreshold: a bare numeric reset at or above it (1e9, i.e.
	// 2001-09-09) is an absolute Unix time in seconds; below it, a delay in
	// seconds. Classic X-RateLimit-Reset is sent both ways (Envoy: delta;
	// GitHub: epoch).
	EpochSecondsThreshold = 1e9

	// EpochMillisThreshold: a bare numeric reset at or above it (1e12) is an
	// absolute Unix time in milliseconds. At or above 1e15 it is malformed.
	EpochMillisThreshold = 1e12
)

// Dialect names, as reported in Quota.Dialect and Dimension.Dialect.
const (
	DialectOpenAI    = "openai"    // x-ratelimit-{limit,remaining,reset}-{requests,tokens}, Go-duration resets
	DialectAnthropic = "anthropic" // anthropic-ratelimit-*-{limit,remaining,reset}, RFC 3339 resets
	DialectAzure     = "azure"     // OpenAI names with integer-second resets or retry-after-ms / x-ms-retry-after-ms
	DialectClassic   = "classic"   // X-RateLimit-{Limit,Remaining,Reset}
	DialectIETF      = "ietf"      // RateLimit / RateLimit-Policy (draft-10/11) and RateLimit-{Limit,Remaining,Reset} (draft-03..06)
)

// Dimension is what a response says about one quota dimension.
type Dimension struct {
	// Limit is the quota per window (tokens or requests); -1 unknown. Always
	// > 0 when known (a zero limit, as Azure sometimes sends, is malformed,
	// and so is the remaining of its triplet).
	Limit int64
	// Remaining is what is left now; -1 unknown. Never above Limit when both
	// are known.
	Remaining int64
	// Reset is the time until the quota is fully replenished (OpenAI,
	// Anthropic, Azure) or the window ends (classic, IETF); -1 unknown,
	// otherwise in [0, MaxReset]. A fixed-window figure whose remaining
	// comes without a reset but whose Window is known (an IETF RateLimit
	// item without t, draft-10 section 4.1.2, whose policy has a w) has
	// Reset = Window: the window ends at the latest then.
	Reset time.Duration
	// Window is the length of the quota's window when the provider states
	// it, in (0, MaxReset]: the w parameter of the IETF RateLimit-Policy
	// the figure names (draft-10 section 3.1.3: "an interval in seconds"),
	// of a draft-03 RateLimit-Policy item ("10;w=1"), or of the policy
	// item that an Envoy-style X-RateLimit-Limit or draft-03
	// RateLimit-Limit list gives for its limit ("10, 10;w=1"); a w above
	// MaxReset (a monthly quota) is read as MaxReset. 0 when not stated:
	// the limit is then per Window (60 s), as every per-minute quota is.
	Window time.Duration
	// Dialect is the dialect that supplied this figure, "" if none.
	Dialect string
	// Beyond is, when > 0, the remaining of another figure of the same
	// dimension whose reset comes later than Reset (an IETF policy with a
	// longer window, such as a daily quota beside a per-second one): the
	// most the dimension admits from this figure on, across its reset,
	// until that later reset. 0 when no such figure was sent.
	Beyond int64
}

// Known reports whether the dimension carries a limit or a remaining count.
func (d Dimension) Known() bool { return d.Limit > 0 || d.Remaining >= 0 }

// Quota is everything one response says about the provider's rate limit.
type Quota struct {
	// Tokens is the provider-token dimension (prompt + max output tokens),
	// Requests the request dimension.
	Tokens, Requests Dimension
	// Input and Output are Anthropic's separate input-token (ITPM) and
	// output-token (OTPM) dimensions, from the
	// anthropic-ratelimit-{input,output}-tokens-{limit,remaining,reset}
	// triplets (remaining rounded to the nearest thousand; output charged
	// max_tokens at admission and refunded at the end: provider header
	// reference, Anthropic section). In input tokens (prompt) and output
	// tokens (max output at start); unknown for every other dialect.
	Input, Output Dimension
	// RetryAfter is the provider's explicit wait, valid when HasRetryAfter;
	// in [0, MaxRetryAfter].
	RetryAfter    time.Duration
	HasRetryAfter bool
	// Dialect is the dialect of the winning tokens figure, else of the
	// winning requests figure, else of the input or output figure, else "azure" when only a millisecond
	// Retry-After was seen, else "".
	Dialect string
	// Malformed counts header values (or structured-field members) ignored
	// as malformed, for a metric.
	Malformed int
}

func unknownDimension() Dimension { return Dimension{Limit: -1, Remaining: -1, Reset: -1} }

// Dimension indexes, in Throttle.dims and parser.best.
const (
	dimTokens   = 0
	dimRequests = 1
	dimInput    = 2 // Anthropic input tokens (ITPM)
	dimOutput   = 3 // Anthropic output tokens (OTPM)
	numDims     = 4
)

// Field slots: every header the parser reads has one, in the order of
// slotKeys. Triplets are limit, remaining, reset.
const (
	sRetryAfter    = iota
	sRetryAfterMs  // retry-after-ms
	sXMsRetryAfter // x-ms-retry-after-ms
	sOpenAI        // 6 slots: [dim*3 + limit/remaining/reset], tokens then requests
	_
	_
	_
	_
	_
	sAnthropic // 6 slots as sOpenAI
	_
	_
	_
	_
	_
	sAnthropicInOut // 6 slots: input-tokens triplet, output-tokens triplet
	_
	_
	_
	_
	_
	sClassic // 3 slots
	_
	_
	sIETF // 3 slots: RateLimit-{Limit,Remaining,Reset}
	_
	_
	sIETFRateLimit // every field line kept
	sIETFPolicy    // every field line kept
	nSlots
)

// slotKeys are the canonical header keys (http.CanonicalHeaderKey of the
// lower-case names; TestHeaderKeysCanonical checks them), by slot. Values are
// read from the http.Header map under exactly these keys: the semantics of
// Header.Get, without canonicalising on every call.
var slotKeys = [nSlots]string{
	"Retry-After", "Retry-After-Ms", "X-Ms-Retry-After-Ms",
	"X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens",
	"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests",
	"Anthropic-Ratelimit-Tokens-Limit", "Anthropic-Ratelimit-Tokens-Remaining", "Anthropic-Ratelimit-Tokens-Reset",
	"Anthropic-Ratelimit-Requests-Limit", "Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Requests-Reset",
	"Anthropic-Ratelimit-Input-Tokens-Limit", "Anthropic-Ratelimit-Input-Tokens-Remaining", "Anthropic-Ratelimit-Input-Tokens-Reset",
	"Anthropic-Ratelimit-Output-Tokens-Limit", "Anthropic-Ratelimit-Output-Tokens-Remaining", "Anthropic-Ratelimit-Output-Tokens-Reset",
	"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset",
	"Ratelimit-Limit", "Ratelimit-Remaining", "Ratelimit-Reset",
	"Ratelimit", "Ratelimit-Policy",
}

// slotHash is a perfect hash of the slot keys into 64 buckets (constants
// found by search; init panics on a collision).
func slotHash(k string) uint32 {
	return (uint32(len(k)) + uint32(k[len(k)-2])*5149 + uint32(k[len(k)/2])*40) & 63
}

// slotTable maps slotHash to slot+1 (0: no slot).
var slotTable [64]int8

func init() {
	for s, k := range slotKeys {
		h := slotHash(k)
		if slotTable[h] != 0 {
			panic("throttle: slotHash collision: " + k)
		}
		slotTable[h] = int8(s + 1)
	}
}

// slotOf returns the slot of canonical header key k, or -1: one hash of
// three bytes and one string comparison.
func slotOf(k string) int {
	if len(k) < len("Ratelimit") {
		return -1
	}
	s := int(slotTable[slotHash(k)]) - 1
	if s < 0 || slotKeys[s] != k {
		return -1
	}
	return s
}

// fields are the rate-limit header values of one response, by slot: the
// first field line of each (as Header.Get), every line for the two IETF
// structured fields. A value is kept as a pointer to the first element of
// the map's slice, half the size of a string: the parser zeroes its fields
// on every call.
type fields struct {
	v       [nSlots]*string
	present uint32 // bit per slot: the key is in the map with at least one value
	multi   uint32 // bit per slot: the key has more than one field line
	lines   [2][]string
}

// any reports whether any of the n slots from base is present.
func (f *fields) any(base, n int) bool { return f.present&((1<<n-1)<<base) != 0 }

func (f *fields) has(slot int) bool { return f.present&(1<<slot) != 0 }

// isMulti reports whether slot has more than one field line: a list (RFC
// 9110 section 5.3), read by the list readers.
func (f *fields) isMulti(slot int) bool { return f.multi&(1<<slot) != 0 }

// get returns the value of slot and whether it is present.
func (f *fields) get(slot int) (string, bool) {
	if !f.has(slot) {
		return "", false
	}
	return *f.v[slot], true
}

func (f *fields) set(slot int, vs []string) {
	if len(vs) == 0 {
		return
	}
	f.v[slot] = &vs[0]
	f.present |= 1 << slot
	if len(vs) > 1 {
		f.multi |= 1 << slot
	}
	if slot >= sIETFRateLimit {
		f.lines[slot-sIETFRateLimit] = vs
	}
}

// dialectSlots are the slots read per dialect ("" = every dialect), after
// the three Retry-After slots, which every dialect reads.
func dialectSlots(only string) (lo, hi int) {
	switch only {
	case DialectOpenAI, DialectAzure:
		return sOpenAI, sAnthropic
	case DialectAnthropic:
		return sAnthropic, sClassic
	case DialectClassic:
		return sClassic, sIETF
	case DialectIETF:
		return sIETF, nSlots
	}
	return sOpenAI, nSlots
}

// gather fills f from h for the slots [lo, hi) and the Retry-After slots. A
// map with no more entries than keys to look up is read in one pass,
// dispatching on the key (every dialect read: 29 keys, and a response
// carries 10-20 fields); a larger one by one lookup per key (a dialect set:
// 6 to 15 keys).
func (f *fields) gather(h http.Header, lo, hi int) {
	if len(h) <= hi-lo+sOpenAI {
		for k, vs := range h {
			if s := slotOf(k); s >= 0 && (s < sOpenAI || (s >= lo && s < hi)) {
				f.set(s, vs)
			}
		}
		return
	}
	for s := 0; s < sOpenAI; s++ {
		f.set(s, h[slotKeys[s]])
	}
	for s := lo; s < hi; s++ {
		f.set(s, h[slotKeys[s]])
	}
}

// trimOWS trims HTTP optional whitespace (SP, HTAB) and other ASCII space.
// The common case, a value with no surrounding space, returns at once.
func trimOWS(s string) string {
	if len(s) > 0 && s[0] > ' ' && s[0] < 0x80 && s[len(s)-1] > ' ' && s[len(s)-1] < 0x80 {
		return s
	}
	return strings.TrimSpace(s)
}

// parseDigits parses s, 1 to 15 ASCII digits, exactly as strconv.ParseInt
// (and, converted, as strconv.ParseFloat: below 2^53 the conversion is
// exact); ok=false for anything else, which the callers hand to strconv.
//
// Eight digits or more (epoch times) start with the first eight read as one
// word: a chain of three multiplications instead of eight.
func parseDigits(s string) (int64, bool) {
	if len(s) == 0 || len(s) > 15 {
		return 0, false
	}
	var v int64
	i := 0
	if len(s) >= 8 {
		b := s[:8]
		w := uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
			uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
		// Every byte is '0'-'9': its high nibble is 3, and still 3 once 6
		// is added (no byte carries into the next: each is at most 0x3f).
		if w&0xf0f0f0f0f0f0f0f0 != 0x3030303030303030 || (w+0x0606060606060606)&0xf0f0f0f0f0f0f0f0 != 0x3030303030303030 {
			return 0, false
		}
		d := w - 0x3030303030303030                 // digit values, the first in the low byte
		d = (d*10 + d>>8) & 0x00ff00ff00ff00ff      // pairs
		d = (d*100 + d>>16) & 0x0000ffff0000ffff    // quadruples
		v, i = int64((d*10000+d>>32)&0xffffffff), 8 // the eight
	}
	for ; i < len(s); i++ {
		c := s[i] - '0'
		if c > 9 {
			return 0, false
		}
		v = v*10 + int64(c)
	}
	return v, true
}

// parseDecimal is strconv.ParseFloat(s, 64) for an s that passed
// isDecimalNumber, with a fast path for plain integers.
func parseDecimal(s string) (float64, error) {
	if v, ok := parseDigits(s); ok {
		return float64(v), nil
	}
	return strconv.ParseFloat(s, 64)
}

// isDecimalNumber reports whether s is digits with at most one '.', followed
// by at least one digit: no sign, exponent, NaN or Inf.
func isDecimalNumber(s string) bool {
	if s == "" {
		return false
	}
	dot := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case isDigit(c):
		case c == '.' && !dot && i > 0 && i < len(s)-1:
			dot = true
		default:
			return false
		}
	}
	return true
}

// parseCount parses a non-negative integer count in [0, MaxQuotaValue].
func parseCount(s string) (int64, bool) {
	s = trimOWS(s)
	if s == "" || len(s) > 16 {
		return 0, false
	}
	var v int64
	for i := 0; i < len(s); i++ {
		c := s[i] - '0'
		if c > 9 {
			return 0, false
		}
		v = v*10 + int64(c) // at most 16 digits: no overflow
	}
	if v > MaxQuotaValue {
		return 0, false
	}
	return v, true
}

// parseLimit parses a limit: a positive count, optionally followed by an
// Envoy/draft-03 policy list ("10, 10;w=1;name=\"per-ip\", 1000;w=3600"),
// of which the leading figure is the limit in effect. A value that is
// digits up to its end, a ',' or a ';' (the common "100" and "10, 10;w=1")
// is read in one scan; anything else by parseLimitSlow, with the same result
// (FuzzParseLimit compares them).
func parseLimit(s string) (int64, bool) {
	var v int64
	n := 0
	for ; n < len(s) && n < 16; n++ {
		c := s[n] - '0'
		if c > 9 {
			break
		}
		v = v*10 + int64(c)
	}
	if n > 0 && (n == len(s) || s[n] == ',' || s[n] == ';') {
		if v == 0 || v > MaxQuotaValue {
			return 0, false
		}
		return v, true
	}
	return parseLimitSlow(s)
}

// parseLimitSlow is parseLimit for any value: the leading figure, up to the
// first ',' or ';', trimmed of OWS.
func parseLimitSlow(s string) (int64, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == ',' || s[i] == ';' {
			s = s[:i]
			break
		}
	}
	v, ok := parseCount(s)
	if !ok || v == 0 {
		return 0, false
	}
	return v, true
}

// ParseResetDuration parses an OpenAI/Azure reset value: a Go duration such
// as "6m0s", "1.5s", "250ms", "1m30.5s" or "0s", or a bare number of seconds
// ("0", "60", "8.64": Azure sends integer seconds). Surrounding whitespace is
// trimmed. It returns ok=false for anything else, for negative values and
// for values above MaxReset ("1d", "abc", "-1s", "NaN", "25h"), so the
// caller falls back to its default instead of reading 0 or "forever"
// (BC-02).
func ParseResetDuration(s string) (time.Duration, bool) {
	s = trimOWS(s)
	if s == "" {
		return 0, false
	}
	if isDecimalNumber(s) {
		v, err := parseDecimal(s)
		if err != nil || v > MaxReset.Seconds() {
			return 0, false
		}
		return time.Duration(math.Round(v * 1e9)), true
	}
	if s[0] == '-' || s[0] == '+' {
		return 0, false
	}
	if d, ok := parseSimpleDuration(s); ok {
		if d > MaxReset {
			return 0, false
		}
		return d, true
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 || d > MaxReset {
		return 0, false
	}
	return d, true
}

// parseResetValue parses any reset encoding a provider sends, relative to
// now: an RFC 3339 time (Anthropic; offsets allowed), a bare number (below
// EpochSecondsThreshold delay seconds, below EpochMillisThreshold epoch
// seconds, below 1e15 epoch milliseconds), or a Go duration. An absolute
// time in the past means "replenished now" (0); anything above MaxReset is
// malformed.
//
// The forms providers send most are read in integers, without the floats
// and time.Time of parseResetSlow, which reads everything else with the
// same result (FuzzParseResetValue compares them): 1 to 15 digits, a Go
// duration of integer h/m/s/ms components, and "YYYY-MM-DDTHH:MM:SSZ".
func parseResetValue(s string, now time.Time) (time.Duration, bool) {
	if v, ok := parseDigits(s); ok {
		switch {
		case v < EpochSecondsThreshold:
			if v > int64(MaxReset/time.Second) {
				return 0, false
			}
			return time.Duration(v) * time.Second, true
		case v < EpochMillisThreshold:
			return untilUnix(v, 0, now)
		default: // below 1e15: parseDigits reads at most 15 digits
			return untilUnix(v/1000, v%1000*1e6, now)
		}
	}
	if d, ok := parseSimpleDuration(s); ok {
		if d > MaxReset {
			return 0, false
		}
		return d, true
	}
	if sec, ok := rfc3339UTCUnix(s); ok {
		return untilUnix(sec, 0, now)
	}
	return parseResetSlow(s, now)
}

// parseResetSlow is parseResetValue for any value, through floats and
// time.Time.
func parseResetSlow(s string, now time.Time) (time.Duration, bool) {
	s = trimOWS(s)
	if isDecimalNumber(s) {
		v, err := parseDecimal(s)
		if err != nil {
			return 0, false
		}
		var at time.Time
		switch {
		case v < EpochSecondsThreshold:
			if v > MaxReset.Seconds() {
				return 0, false
			}
			return time.Duration(math.Round(v * 1e9)), true
		case v < EpochMillisThreshold:
			sec := math.Floor(v)
			at = time.Unix(int64(sec), int64(math.Round((v-sec)*1e9)))
		case v < 1e15:
			ms := math.Floor(v)
			at = time.UnixMilli(int64(ms)).Add(time.Duration(math.Round((v - ms) * 1e6)))
		default:
			return 0, false
		}
		return untilTime(at, now)
	}
	if len(s) >= 20 && (strings.IndexByte(s, 'T') > 0 || strings.IndexByte(s, 't') > 0) {
		at, ok := parseRFC3339UTC(s)
		if !ok {
			var err error
			if at, err = time.Parse(time.RFC3339, s); err != nil {
				return 0, false
			}
		}
		return untilTime(at, now)
	}
	return ParseResetDuration(s)
}

// untilUnix is untilTime(time.Unix(sec, nsec), now) for sec within
// +-2^40 and nsec in [0, 1e9), in integers; a now outside +-2^40 s of the
// epoch goes to untilTime.
func untilUnix(sec, nsec int64, now time.Time) (time.Duration, bool) {
	const bound = 1 << 40
	ns := now.Unix()
	if ns < -bound || ns > bound {
		return untilTime(time.Unix(sec, nsec), now)
	}
	ds := sec - ns // |ds| < 2^41
	switch {
	case ds < 0: // at-now <= -1 s + (nsec - now's nanoseconds) < 0
		return 0, true
	case ds > int64(MaxReset/time.Second)+1: // at-now > MaxReset + 1 s - 1 s
		return 0, false
	}
	return untilDuration(time.Duration(ds)*time.Second + time.Duration(nsec-int64(now.Nanosecond())))
}

// untilDuration is untilTime for d = at-now.
func untilDuration(d time.Duration) (time.Duration, bool) {
	if d < 0 {
		return 0, true
	}
	if d > MaxReset {
		return 0, false
	}
	return d, true
}

// untilTime is at-now clamped at 0 (a past reset means "now"), malformed
// above MaxReset.
func untilTime(at, now time.Time) (time.Duration, bool) {
	d := at.Sub(now)
	if d < 0 {
		return 0, true
	}
	if d > MaxReset {
		return 0, false
	}
	return d, true
}

// clampRetry clamps a non-negative wait in seconds to [0, MaxRetryAfter].
func clampRetry(seconds float64) time.Duration {
	if seconds >= MaxRetryAfter.Seconds() {
		return MaxRetryAfter
	}
	return time.Duration(math.Round(seconds * 1e9))
}

// clampRetryUnits is clampRetry(float64(n) * unit / time.Second) for n in
// [0, 1e15) and unit time.Second or time.Millisecond, in integers: below
// MaxRetryAfter the float computation rounds to n*unit exactly (its error
// is under a quarter of a nanosecond), and at or above it both clamp
// (FuzzClampRetryUnits compares them).
func clampRetryUnits(n int64, unit time.Duration) time.Duration {
	if n >= int64(MaxRetryAfter/unit) {
		return MaxRetryAfter
	}
	return time.Duration(n) * unit
}

// ParseRetryAfter reads the provider's explicit wait from h at now. Order:
// retry-after-ms, then x-ms-retry-after-ms (milliseconds; Azure, OpenAI
// SDKs), which win over Retry-After (BC-05a); then Retry-After as
// delay-seconds or any of the three RFC 9110 HTTP-date forms (IMF-fixdate,
// RFC 850, asctime) via http.ParseTime (BC-03). A past date gives 0, ok; "0"
// gives 0, ok (eligible immediately, BC-05b). Values above MaxRetryAfter are
// clamped to it. A malformed or absent value gives ok=false, so the caller
// applies its default backoff (never 0).
//
// Each of the three is a single value (RFC 9110 section 10.2.3), but an
// intermediary that merges duplicate field lines turns two into a list
// ("5, 10"; RFC 9110 section 5.3), and a field may arrive as several lines:
// such a list is read conservatively, as the largest valid member (the
// latest instant), its malformed members ignored (and counted by
// ParseHeaders) and its empty ones skipped (RFC 9110 section 5.6.1).
func ParseRetryAfter(h http.Header, now time.Time) (d time.Duration, ok bool) {
	var f fields
	for s := 0; s < sOpenAI; s++ {
		f.set(s, h[slotKeys[s]])
	}
	d, ok, _ = parseRetryAfter(&f, h, now)
	return d, ok
}

func parseRetryAfter(f *fields, h http.Header, now time.Time) (d time.Duration, ok bool, malformed int) {
	for _, slot := range [2]int{sRetryAfterMs, sXMsRetryAfter} {
		v, present := f.get(slot)
		if !present {
			continue
		}
		if !f.isMulti(slot) {
			if d, ok := retryNumber(v, time.Millisecond); ok {
				return d, true, malformed
			}
		}
		d, ok, bad := retryList(h[slotKeys[slot]], time.Millisecond, h, now)
		malformed += bad
		if ok {
			return d, true, malformed
		}
	}
	v, present := f.get(sRetryAfter)
	if !present {
		return 0, false, malformed
	}
	if !f.isMulti(sRetryAfter) {
		if d, ok := retryNumber(v, time.Second); ok {
			return d, true, malformed
		}
		if at, err := http.ParseTime(trimOWS(v)); err == nil {
			return retryUntil(at, providerNow(h, now)), true, malformed
		}
	}
	d, ok, bad := retryList(h[slotKeys[sRetryAfter]], time.Second, h, now)
	return d, ok, malformed + bad
}

// retryNumber reads a delay in unit (time.Second: Retry-After's
// delay-seconds; time.Millisecond: retry-after-ms): 1 to 15 digits, or
// tolerantly a decimal ("1.5"), clamped to MaxRetryAfter. ok=false for
// anything else (a sign, an exponent, NaN, a date).
func retryNumber(v string, unit time.Duration) (time.Duration, bool) {
	if n, ok := parseDigits(v); ok {
		return clampRetryUnits(n, unit), true
	}
	v = trimOWS(v)
	if isDecimalNumber(v) {
		if x, err := parseDecimal(v); err == nil {
			if unit == time.Millisecond {
				return clampRetry(x / 1000), true
			}
			return clampRetry(x), true
		}
	}
	return 0, false
}

// retryUntil is the wait until at from ref: 0 for a past instant, at most
// MaxRetryAfter.
func retryUntil(at, ref time.Time) time.Duration {
	d := at.Sub(ref)
	if d < 0 {
		return 0
	}
	return min(d, MaxRetryAfter)
}

// retryList reads the field lines of a Retry-After (unit time.Second:
// delay-seconds or HTTP-dates, read against providerNow(h, now)) or of a
// retry-after-ms (unit time.Millisecond) as one comma-separated list (RFC
// 9110 section 5.3) and returns its largest valid member, the number of
// malformed members (at least 1 when no member is valid), and ok=false
// when none is valid. Empty members are skipped (RFC 9110 section 5.6.1).
// The IMF-fixdate and RFC 850 forms carry a comma after the day name: a
// member that is not a number is read together with the next one as a
// date first.
func retryList(lines []string, unit time.Duration, h http.Header, now time.Time) (d time.Duration, ok bool, bad int) {
	var ref time.Time
	refDone := false
	for _, s := range lines {
		for i := 0; i <= len(s); {
			j := commaFrom(s, i)
			m := trimOWS(s[i:j])
			next := j + 1
			if m == "" {
				i = next
				continue
			}
			v, good := retryNumber(m, unit)
			if !good && unit == time.Second {
				var at time.Time
				if j < len(s) {
					k := commaFrom(s, j+1)
					if t, err := http.ParseTime(trimOWS(s[i:k])); err == nil {
						at, good, next = t, true, k+1
					}
				}
				if !good {
					if t, err := http.ParseTime(m); err == nil {
						at, good = t, true
					}
				}
				if good {
					if !refDone {
						ref, refDone = providerNow(h, now), true
					}
					v = retryUntil(at, ref)
				}
			}
			switch {
			case !good:
				bad++
			case !ok || v > d:
				d, ok = v, true
			}
			i = next
		}
	}
	if !ok && bad == 0 {
		bad = 1 // no member at all: the value is malformed
	}
	return d, ok, bad
}

// commaFrom is the index of the first ',' in s at or after i, or len(s).
func commaFrom(s string, i int) int {
	if k := strings.IndexByte(s[i:], ','); k >= 0 {
		return i + k
	}
	return len(s)
}

// parser accumulates candidate figures per dimension while reading the
// dialects, and keeps the most restrictive one in the Quota it fills.
type parser struct {
	f         fields
	now       time.Time
	h         http.Header
	ref       time.Time // providerNow's result, once refDone
	refDone   bool
	q         Quota
	malformed int
}

// providerNow is providerNow(p.h, p.now), computed once per response.
func (p *parser) providerNow() time.Time {
	if !p.refDone {
		p.ref, p.refDone = providerNow(p.h, p.now), true
	}
	return p.ref
}

// SkewTolerance is how far the provider's Date may be from the local clock
// before absolute times in its rate-limit headers are read against that
// Date instead of the local clock. Date has a resolution of one second and
// is taken before the response travels, so a Date up to about a second
// behind is normal.
const SkewTolerance = 2 * time.Second

// providerNow is the instant to read a response's absolute times against
// (an RFC 3339 or epoch reset, a Retry-After HTTP-date), which are instants
// of the provider's clock: the local now, or the response's Date
// (IMF-fixdate, RFC 9110 section 6.6.1) when it is more than SkewTolerance
// away from it. A local clock ahead of the provider's by 30 s would
// otherwise read a reset 5 s away as already past, and one behind by
// minutes pause for minutes more. A missing or malformed Date gives now.
func providerNow(h http.Header, now time.Time) time.Time {
	vs := h["Date"]
	if len(vs) == 0 {
		return now
	}
	sec, ok := imfFixdateUnix(vs[0])
	if !ok {
		return now
	}
	date := time.Unix(sec, 0)
	if skew := date.Sub(now); skew > SkewTolerance || skew < -SkewTolerance {
		return date
	}
	return now
}

// best is the Quota's figure for dimension dim (dimTokens...dimOutput).
func (p *parser) best(dim int) *Dimension {
	switch dim {
	case dimTokens:
		return &p.q.Tokens
	case dimRequests:
		return &p.q.Requests
	case dimInput:
		return &p.q.Input
	}
	return &p.q.Output
}

// offer proposes a figure for dimension dim. The most restrictive wins: the
// smallest remaining, for equal remaining the later reset; a figure with a
// remaining beats one without; among limit-only figures the smallest limit.
// c is read, not changed. Dimensions move field by field: a whole-struct copy
// is made in wide loads that stall on the narrow stores just made.
func (p *parser) offer(dim int, c *Dimension) {
	remaining := c.Remaining
	if remaining < 0 && c.Limit <= 0 {
		return
	}
	if c.Limit > 0 && remaining > c.Limit {
		remaining = c.Limit
	}
	b := p.best(dim)
	better := false
	switch {
	case b.Remaining < 0 && b.Limit <= 0:
		better = true
	case remaining >= 0 && b.Remaining < 0:
		better = true
	case remaining < 0 && b.Remaining >= 0:
		better = false
	case remaining >= 0:
		better = remaining < b.Remaining || (remaining == b.Remaining && c.Reset > b.Reset)
	default:
		better = slowerLimit(c, b)
	}
	if better {
		// The figure replaced still binds past c's reset when its own
		// reset is later (it has more left, or it would have won).
		beyond := int64(0)
		if b.Remaining >= 0 && c.Reset >= 0 && b.Reset > c.Reset {
			beyond = minPositive(b.Remaining, b.Beyond)
		}
		b.Limit, b.Remaining, b.Reset, b.Window, b.Dialect, b.Beyond = c.Limit, remaining, c.Reset, c.Window, c.Dialect, beyond
		return
	}
	if remaining >= 0 && b.Remaining >= 0 && b.Reset >= 0 && c.Reset > b.Reset {
		b.Beyond = minPositive(b.Beyond, remaining)
	}
}

// slowerLimit reports whether limit-only figure c admits less per unit of
// time than b: c.Limit per its window below b.Limit per its window (Window
// when not stated), the quota that binds in the long run; for equal rates,
// the smaller limit. Exact: the products are compared in 128 bits.
func slowerLimit(c, b *Dimension) bool {
	cw, bw := uint64(windowOf(c)/time.Second), uint64(windowOf(b)/time.Second)
	chi, clo := bits.Mul64(uint64(c.Limit), bw)
	bhi, blo := bits.Mul64(uint64(b.Limit), cw)
	if chi != bhi || clo != blo {
		return chi < bhi || (chi == bhi && clo < blo)
	}
	return c.Limit < b.Limit
}

// windowOf is d's window: Window (60 s) when the provider did not state
// one.
func windowOf(d *Dimension) time.Duration {
	if d.Window > 0 {
		return d.Window
	}
	return Window
}

// windowReset gives a fixed-window figure with a remaining but no reset
// the end of its stated window as its reset: the latest the window can end
// (see Dimension.Reset).
func windowReset(d *Dimension) {
	if d.Remaining >= 0 && d.Reset < 0 && d.Window > 0 {
		d.Reset = d.Window
	}
}

// policyWindow reads a w parameter (draft-10 section 3.1.3: a non-zero,
// non-negative Integer of seconds): ok=false for anything else; above
// MaxReset, MaxReset.
func policyWindow(v sfValue) (time.Duration, bool) {
	switch {
	case v.kind != sfInteger || v.i <= 0:
		return 0, false
	case v.i >= int64(MaxReset/time.Second):
		return MaxReset, true
	}
	return time.Duration(v.i) * time.Second, true
}

// limitWindow is the window of the quota policy that a limit list states
// for its limit: the first valid w of a member of s whose Item is the
// Integer limit ("10, 10;w=1" for 10: 1 s; draft-03 section 4, as Envoy
// sends it in X-RateLimit-Limit), 0 if there is none. The list's other
// members are not counted as malformed: only its leading figure is the
// limit (parseLimit).
func limitWindow(s string, limit int64) time.Duration {
	var m sfPick
	it := sfList{s: s}
	for it.nextPick(&m, "w", "", "") {
		if m.item.kind == sfInteger && m.item.i == limit && m.has[0] {
			if w, ok := policyWindow(m.val[0]); ok {
				return w
			}
		}
	}
	return 0
}

// minPositive is the smaller of a and b among those > 0, 0 if neither is.
func minPositive(a, b int64) int64 {
	switch {
	case a <= 0:
		return max(b, 0)
	case b <= 0:
		return a
	}
	return min(a, b)
}

// triplet reads limit, remaining and reset header values into d, of the
// dialect given, and reports whether any of the three headers was there.
// The triplet's slots are base, base+1, base+2.
func (p *parser) triplet(base int, dialect string, d *Dimension) (present bool) {
	d.Limit, d.Remaining, d.Reset, d.Window, d.Dialect = -1, -1, -1, 0, dialect
	zeroLimit := false
	if v, ok := p.f.get(base); ok {
		present = true
		if n, ok := parseLimit(v); ok {
			d.Limit = n
			if (dialect == DialectClassic || dialect == DialectIETF) && strings.IndexByte(v, ';') >= 0 {
				d.Window = limitWindow(v, n)
			}
		} else {
			p.malformed++
			n, ok := parseCount(v)
			zeroLimit = ok && n == 0
		}
	}
	if v, ok := p.f.get(base + 1); ok {
		present = true
		n, ok := parseCount(v)
		if !ok || p.f.isMulti(base+1) {
			var bad int
			n, ok, bad = countList(p.h[slotKeys[base+1]])
			p.malformed += bad
		}
		switch {
		case ok && !zeroLimit:
			d.Remaining = n
		case ok:
			// A limit of 0 is a placeholder (Azure OpenAI sends 0 and
			// -1 figures): the remaining beside it says nothing either,
			// and its 0 must not stop the model.
			p.malformed++
		}
	}
	if v, ok := p.f.get(base + 2); ok {
		present = true
		var r time.Duration
		ok := false
		if !p.f.isMulti(base + 2) {
			now := p.now
			if len(v) >= 10 {
				// Perhaps an absolute time (epoch, RFC 3339): read
				// against the provider's clock. Relative forms do not
				// read now.
				now = p.providerNow()
			}
			r, ok = parseResetValue(v, now)
		}
		if !ok {
			var bad int
			r, ok, bad = resetList(p.h[slotKeys[base+2]], p.providerNow())
			p.malformed += bad
		}
		if ok {
			d.Reset = r
		}
	}
	return present
}

// countList reads the field lines of a remaining count as one
// comma-separated list (an intermediary that merges duplicate field lines
// joins them with commas, RFC 9110 section 5.3) and returns its least valid
// member (parseCount): the conservative reading of two figures of one
// quota. bad counts malformed members, at least 1 when none is valid
// (ok=false); empty members are skipped (RFC 9110 section 5.6.1).
func countList(lines []string) (n int64, ok bool, bad int) {
	for _, s := range lines {
		for i := 0; i <= len(s); {
			j := commaFrom(s, i)
			if m := trimOWS(s[i:j]); m != "" {
				switch v, good := parseCount(m); {
				case !good:
					bad++
				case !ok || v < n:
					n, ok = v, true
				}
			}
			i = j + 1
		}
	}
	if !ok && bad == 0 {
		bad = 1
	}
	return n, ok, bad
}

// resetList is countList for a reset (parseResetValue at now, which is the
// provider's clock for absolute times): its largest valid member, the
// latest reset. A reset has no form with a comma (Go durations, numbers,
// RFC 3339 times).
func resetList(lines []string, now time.Time) (d time.Duration, ok bool, bad int) {
	for _, s := range lines {
		for i := 0; i <= len(s); {
			j := commaFrom(s, i)
			if m := trimOWS(s[i:j]); m != "" {
				switch v, good := parseResetValue(m, now); {
				case !good:
					bad++
				case !ok || v > d:
					d, ok = v, true
				}
			}
			i = j + 1
		}
	}
	if !ok && bad == 0 {
		bad = 1
	}
	return d, ok, bad
}

// ParseHeaders reads every rate-limit dialect in h (a response received at
// now) and returns the most restrictive figure per dimension, the explicit
// Retry-After, and a count of malformed values. It never fails and never
// panics: malformed, negative, NaN or out-of-range values are ignored (and
// counted), so the caller's default applies.
//
// Dialects (see provider-headers reference):
//   - OpenAI / Azure OpenAI: x-ratelimit-{limit,remaining,reset}-{requests,tokens};
//     resets as Go durations (OpenAI) or integer seconds (Azure). Reported as
//     "azure" when retry-after-ms / x-ms-retry-after-ms is present, a reset is a
//     bare number, or a remaining comes without a reset.
//   - Anthropic: anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset},
//     RFC 3339 resets (offsets allowed; a past reset means 0). The tokens
//     triplet (Anthropic's "most restrictive limit in effect") fills Tokens
//     when present; the input-tokens and output-tokens triplets fill Input
//     and Output, never Tokens (ITPM and OTPM are separate buckets; BC-07).
//   - Classic X-RateLimit-{Limit,Remaining,Reset}: the requests dimension;
//     reset as delay seconds, epoch seconds (>= 1e9) or epoch ms (>= 1e12).
//   - IETF draft-10/11 RateLimit and RateLimit-Policy structured Lists (any
//     number of members and field lines); a policy's qu "requests"/"request"
//     (the default) maps to Requests, a unit containing "token" to Tokens,
//     others are ignored. The draft-03..06 RateLimit-{Limit,Remaining,Reset}
//     with RateLimit-Policy "10;w=1" maps to Requests. A policy's window w
//     is the figure's Window, and its reset when t is absent (see
//     parseIETF).
//
// Remaining and reset values are single figures; one that an intermediary
// merged into a comma-separated list, or that came as several field lines
// (RFC 9110 section 5.3), is read as its least remaining and its latest
// reset, malformed members ignored and counted (Retry-After likewise: see
// ParseRetryAfter).
func ParseHeaders(h http.Header, now time.Time) Quota {
	return parseHeaders(h, now, "")
}

// ParseHeadersDialect is ParseHeaders restricted to one dialect, the
// ProviderPool's spec.upstream.dialect hint (api/v1alpha1 Dialect enum:
// "Auto", "OpenAI", "Anthropic", "Azure", "Classic", "IETF"; the lower-case
// Dialect* names of this package are accepted too, case-insensitively).
// With a dialect set, the rate-limit headers of every other dialect are
// ignored — a proxy in front of the provider may add classic
// X-RateLimit-* headers of its own that describe the proxy, not the
// provider's quota — and are not counted as malformed. Retry-After,
// retry-after-ms and x-ms-retry-after-ms are read in every dialect (RFC 9110
// section 10.2.3; provider-headers reference). Per dialect:
//
//   - OpenAI: x-ratelimit-{limit,remaining,reset}-{requests,tokens}, figures
//     reported as "openai" (continuous replenishment);
//   - Azure: the same x-ratelimit-*-{requests,tokens} names, reported as
//     "azure";
//   - Anthropic: anthropic-ratelimit-* only;
//   - Classic: X-RateLimit-{Limit,Remaining,Reset} only;
//   - IETF: RateLimit / RateLimit-Policy (draft-10/11) and
//     RateLimit-{Limit,Remaining,Reset} (draft-03..06) only.
//
// "", "Auto" and any unknown name behave as ParseHeaders (every dialect,
// most restrictive figure wins).
func ParseHeadersDialect(h http.Header, now time.Time, dialect string) Quota {
	return parseHeaders(h, now, dialect)
}

// NormalizeDialect maps a dialect hint to this package's Dialect* name:
// "OpenAI"/"openai" to DialectOpenAI, and so on for Anthropic, Azure, Classic
// and IETF (case-insensitive); "", "Auto" and unknown names to "" (every
// dialect).
func NormalizeDialect(dialect string) string {
	switch dialect { // the spellings of the API enum and of this package
	case "", "Auto":
		return ""
	case "OpenAI", DialectOpenAI:
		return DialectOpenAI
	case "Anthropic", DialectAnthropic:
		return DialectAnthropic
	case "Azure", DialectAzure:
		return DialectAzure
	case "Classic", DialectClassic:
		return DialectClassic
	case "IETF", DialectIETF:
		return DialectIETF
	}
	for _, d := range [...]string{DialectOpenAI, DialectAnthropic, DialectAzure, DialectClassic, DialectIETF} {
		if strings.EqualFold(dialect, d) {
			return d
		}
	}
	return ""
}

// parseHeaders reads the dialect of the hint only (NormalizeDialect; "" =
// every dialect). It takes the hint, not the normalized name, so that
// ParseHeadersDialect is inlined: a Quota returned through one more call is
// copied once more.
//
// gather reads only the slots of the dialect (and Retry-After), so a slot
// present is one the dialect reads: the checks below need not name it.
func parseHeaders(h http.Header, now time.Time, dialect string) Quota {
	only := dialect
	if only != "" {
		only = NormalizeDialect(dialect)
	}
	p := parser{now: now, h: h}
	q := &p.q
	// Field by field: a composite literal would be built on the stack and
	// copied in wide loads that stall on the narrow stores.
	for _, d := range [numDims]*Dimension{&q.Tokens, &q.Requests, &q.Input, &q.Output} {
		d.Limit, d.Remaining, d.Reset = -1, -1, -1
	}
	f := &p.f
	lo, hi := dialectSlots(only)
	f.gather(h, lo, hi)
	var msRetry bool
	if f.any(sRetryAfter, sOpenAI) {
		q.RetryAfter, q.HasRetryAfter, p.malformed = parseRetryAfter(f, h, now)
		msRetry = q.HasRetryAfter && f.any(sRetryAfterMs, 2)
	}

	// OpenAI / Azure.
	for dim := 0; dim < 2 && f.any(sOpenAI, 6); dim++ {
		var d Dimension
		if !p.triplet(sOpenAI+3*dim, DialectOpenAI, &d) {
			continue
		}
		resetRaw, hasReset := f.get(sOpenAI + 3*dim + 2)
		switch {
		case only != "":
			d.Dialect = only
		case msRetry || (d.Remaining >= 0 && !hasReset) || (hasReset && isDecimalNumber(trimOWS(resetRaw))):
			d.Dialect = DialectAzure
		}
		p.offer(dim, &d)
	}

	if f.any(sAnthropic, sClassic-sAnthropic) {
		p.parseAnthropic()
	}

	// Classic.
	if f.any(sClassic, 3) {
		var d Dimension
		if p.triplet(sClassic, DialectClassic, &d) {
			windowReset(&d)
			p.offer(dimRequests, &d)
		}
	}

	// IETF.
	if f.any(sIETF, nSlots-sIETF) {
		p.parseIETF()
	}

	q.Malformed = p.malformed
	switch {
	case q.Tokens.Dialect != "":
		q.Dialect = q.Tokens.Dialect
	case q.Requests.Dialect != "":
		q.Dialect = q.Requests.Dialect
	case q.Input.Dialect != "":
		q.Dialect = q.Input.Dialect
	case q.Output.Dialect != "":
		q.Dialect = q.Output.Dialect
	case msRetry && (only == "" || only == DialectAzure):
		q.Dialect = DialectAzure
	}
	return *q
}

// parseAnthropic reads the anthropic-ratelimit-* triplets: requests to
// Requests, tokens to Tokens, input-tokens to Input and output-tokens to
// Output. Input and output are separate buckets (ITPM, OTPM), each paced on
// its own; they are never summed into Tokens, whose sum would hide the
// bucket that binds (provider header reference, Anthropic; BC-07).
func (p *parser) parseAnthropic() {
	var d Dimension
	if p.triplet(sAnthropic+3*dimRequests, DialectAnthropic, &d) {
		p.offer(dimRequests, &d)
	}
	if p.triplet(sAnthropic+3*dimTokens, DialectAnthropic, &d) {
		p.offer(dimTokens, &d)
	}
	if p.triplet(sAnthropicInOut, DialectAnthropic, &d) {
		p.offer(dimInput, &d)
	}
	if p.triplet(sAnthropicInOut+3, DialectAnthropic, &d) {
		p.offer(dimOutput, &d)
	}
}

// ietfPolicy is one RateLimit-Policy member.
type ietfPolicy struct {
	name string
	q    int64
	win  time.Duration // w, 0 if absent or malformed
	// dim is dimTokens or dimRequests; -1 for units we do not pace and
	// for a malformed policy, whose RateLimit items are then ignored
	// rather than read as requests.
	dim  int
	used bool
}

// ietfUnit maps a quota unit to a dimension: "requests" (the default) or
// "request" (the draft's IANA table) to Requests, any unit naming tokens
// (no tokens unit is registered; vendors use their own) to Tokens, others
// (content-bytes, concurrent-requests) to -1.
func ietfUnit(qu string) int {
	switch qu { // the common spellings, as below
	case "", "requests", "request":
		return dimRequests
	case "tokens", "token":
		return dimTokens
	}
	switch {
	case qu == "" || strings.EqualFold(qu, "requests") || strings.EqualFold(qu, "request"):
		return dimRequests
	case strings.Contains(strings.ToLower(qu), "token"):
		return dimTokens
	}
	return -1
}

// windowParam is the window of a RateLimit-Policy member picked with w as
// its third parameter (policyWindow), 0 if absent; a malformed w is
// counted and ignored (the policy's quota still holds).
func (p *parser) windowParam(m *sfPick) time.Duration {
	if !m.has[2] {
		return 0
	}
	w, ok := policyWindow(m.val[2])
	if !ok {
		p.malformed++
	}
	return w
}

// parseIETF reads the IETF fields: RateLimit-Policy and RateLimit
// (draft-10/11), whose RateLimit items take the quota q and window w of
// the policy they name (sections 3.1 and 4.1); an item without t (or with
// a malformed one) ends at the latest at its policy's w (windowReset). An
// item naming no policy sent is a request quota of unknown limit and
// window; one naming a malformed policy is ignored. Then the draft-03..06
// RateLimit-{Limit,Remaining,Reset}, whose window is the w of the
// RateLimit-Policy item ("10;w=1") or RateLimit-Limit list member that has
// its limit.
func (p *parser) parseIETF() {
	var buf [8]ietfPolicy
	policies := buf[:0]
	oldLimit := int64(-1) // draft-03 "RateLimit-Policy: 10;w=1": the smallest quota
	var oldWindow time.Duration
	var m sfPick
	for _, line := range p.f.lines[sIETFPolicy-sIETFRateLimit] {
		it := sfList{s: line}
		for it.nextPick(&m, "q", "qu", "w") {
			switch m.item.kind {
			case sfString, sfToken:
				dim := -1
				var win time.Duration
				qv, ok := m.val[0], m.has[0]
				u, uok := m.val[1], m.has[1]
				switch {
				case !ok || qv.kind != sfInteger || qv.i <= 0 || qv.i > MaxQuotaValue:
					p.malformed++
				case uok && u.kind != sfString && u.kind != sfToken:
					p.malformed++
				default:
					if !uok {
						u.s = ""
					}
					dim, win = ietfUnit(u.s), p.windowParam(&m)
				}
				if len(policies) == cap(policies) {
					policies = append(policies, ietfPolicy{})
				} else {
					policies = policies[:len(policies)+1]
				}
				// Field by field (see offer).
				pol := &policies[len(policies)-1]
				pol.name, pol.q, pol.win, pol.dim, pol.used = m.item.s, qv.i, win, dim, false
			case sfInteger:
				if m.item.i <= 0 || m.item.i > MaxQuotaValue {
					p.malformed++
					continue
				}
				win := p.windowParam(&m)
				if oldLimit < 0 || m.item.i < oldLimit || (m.item.i == oldLimit && oldWindow == 0) {
					oldLimit, oldWindow = m.item.i, win
				}
			default:
				p.malformed++
			}
		}
		p.malformed += it.malformed
	}
	for _, line := range p.f.lines[0] {
		it := sfList{s: line}
		for it.nextPick(&m, "r", "t", "") {
			if m.item.kind != sfString && m.item.kind != sfToken {
				p.malformed++
				continue
			}
			rv, ok := m.val[0], m.has[0]
			if !ok || rv.kind != sfInteger || rv.i < 0 || rv.i > MaxQuotaValue {
				p.malformed++
				continue
			}
			var d Dimension // field by field (see offer)
			d.Limit, d.Remaining, d.Reset, d.Dialect = -1, rv.i, -1, DialectIETF
			if tv, ok := m.val[1], m.has[1]; ok {
				if tv.kind == sfInteger && tv.i >= 0 && tv.i <= int64(MaxReset/time.Second) {
					d.Reset = time.Duration(tv.i) * time.Second
				} else {
					p.malformed++
				}
			}
			dim := dimRequests
			for i := range policies {
				if policies[i].name == m.item.s {
					policies[i].used = true
					d.Limit, d.Window, dim = policies[i].q, policies[i].win, policies[i].dim
					break
				}
			}
			windowReset(&d)
			if dim >= 0 {
				p.offer(dim, &d)
			}
		}
		p.malformed += it.malformed
	}
	for _, pol := range policies {
		if !pol.used && pol.dim >= 0 {
			d := Dimension{Limit: pol.q, Remaining: -1, Reset: -1, Window: pol.win, Dialect: DialectIETF}
			p.offer(pol.dim, &d)
		}
	}
	// draft-03..06 form.
	var d Dimension
	if present := p.triplet(sIETF, DialectIETF, &d); present || oldLimit > 0 {
		if d.Limit < 0 {
			d.Limit = oldLimit
		}
		if d.Window == 0 && d.Limit > 0 {
			if d.Limit == oldLimit {
				d.Window = oldWindow
			} else {
				for _, line := range p.f.lines[sIETFPolicy-sIETFRateLimit] {
					if d.Window = limitWindow(line, d.Limit); d.Window > 0 {
						break
					}
				}
			}
		}
		windowReset(&d)
		p.offer(dimRequests, &d)
	}
}
