package throttle

// Reference copy of the header parser as it was before the single-pass
// rewrite, kept for differential tests only (identifiers prefixed with ref).

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Bounds on parsed values. A value outside them is malformed (ignored and
// counted in Quota.Malformed), except Retry-After, which is clamped (see
// MaxRetryAfter).

func refunknownDimension() Dimension { return Dimension{Limit: -1, Remaining: -1, Reset: -1} }

// Canonical refheader keys, looked up directly in the http.Header map (the same
// semantics as Header.Get, without canonicalising on every call).
var (
	refhRetryAfter     = http.CanonicalHeaderKey("retry-after")
	refhRetryAfterMs   = http.CanonicalHeaderKey("retry-after-ms")
	refhXMsRetryAfter  = http.CanonicalHeaderKey("x-ms-retry-after-ms")
	refhClassicLimit   = http.CanonicalHeaderKey("x-ratelimit-limit")
	refhClassicRemain  = http.CanonicalHeaderKey("x-ratelimit-remaining")
	refhClassicReset   = http.CanonicalHeaderKey("x-ratelimit-reset")
	refhIETFLimit      = http.CanonicalHeaderKey("ratelimit-limit")
	refhIETFRemaining  = http.CanonicalHeaderKey("ratelimit-remaining")
	refhIETFReset      = http.CanonicalHeaderKey("ratelimit-reset")
	refhIETFRateLimit  = http.CanonicalHeaderKey("ratelimit")
	refhIETFPolicy     = http.CanonicalHeaderKey("ratelimit-policy")
	refhOpenAI         = [2][3]string{} // [dim][limit, remaining, reset]
	refhAnthropic      = [2][3]string{} // requests, tokens
	refhAnthropicInOut = [2][3]string{} // input-tokens, output-tokens
)

const (
	refdimTokens   = 0
	refdimRequests = 1
	refdimInput    = 2
	refdimOutput   = 3
)

func init() {
	for d, unit := range [2]string{"tokens", "requests"} {
		for k, f := range [3]string{"limit", "remaining", "reset"} {
			refhOpenAI[d][k] = http.CanonicalHeaderKey("x-ratelimit-" + f + "-" + unit)
			refhAnthropic[d][k] = http.CanonicalHeaderKey("anthropic-ratelimit-" + unit + "-" + f)
		}
	}
	for d, unit := range [2]string{"input-tokens", "output-tokens"} {
		for k, f := range [3]string{"limit", "remaining", "reset"} {
			refhAnthropicInOut[d][k] = http.CanonicalHeaderKey("anthropic-ratelimit-" + unit + "-" + f)
		}
	}
}

func refheader(h http.Header, key string) (string, bool) {
	vs := h[key]
	if len(vs) == 0 {
		return "", false
	}
	return vs[0], true
}

// reftrimOWS trims HTTP optional whitespace (SP, HTAB) and other ASCII space.
func reftrimOWS(s string) string { return strings.TrimSpace(s) }

// refisDecimalNumber reports whether s is digits with at most one '.', followed
// by at least one digit: no sign, exponent, NaN or Inf.
func refisDecimalNumber(s string) bool {
	if s == "" {
		return false
	}
	dot := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case refisDigit(c):
		case c == '.' && !dot && i > 0 && i < len(s)-1:
			dot = true
		default:
			return false
		}
	}
	return true
}

// refparseCount parses a non-negative integer count in [0, MaxQuotaValue].
func refparseCount(s string) (int64, bool) {
	s = reftrimOWS(s)
	if s == "" || len(s) > 16 {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if !refisDigit(s[i]) {
			return 0, false
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v > MaxQuotaValue {
		return 0, false
	}
	return v, true
}

// refparseLimit parses a limit: a positive count, optionally followed by an
// Envoy/draft-03 policy list ("10, 10;w=1;name=\"per-ip\", 1000;w=3600"),
// of which the leading figure is the limit in effect.
func refparseLimit(s string) (int64, bool) {
	if i := strings.IndexAny(s, ",;"); i >= 0 {
		s = s[:i]
	}
	v, ok := refparseCount(s)
	if !ok || v == 0 {
		return 0, false
	}
	return v, true
}

// refParseResetDuration parses an OpenAI/Azure reset value: a Go duration such
// as "6m0s", "1.5s", "250ms", "1m30.5s" or "0s", or a bare number of seconds
// ("0", "60", "8.64": Azure sends integer seconds). Surrounding whitespace is
// trimmed. It returns ok=false for anything else, for negative values and
// for values above MaxReset ("1d", "abc", "-1s", "NaN", "25h"), so the
// caller falls back to its default instead of reading 0 or "forever"
// (BC-02).
func refParseResetDuration(s string) (time.Duration, bool) {
	s = reftrimOWS(s)
	if s == "" {
		return 0, false
	}
	if refisDecimalNumber(s) {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v > MaxReset.Seconds() {
			return 0, false
		}
		return time.Duration(math.Round(v * 1e9)), true
	}
	if s[0] == '-' || s[0] == '+' {
		return 0, false
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 || d > MaxReset {
		return 0, false
	}
	return d, true
}

// refparseResetValue parses any reset encoding a provider sends, relative to
// now: an RFC 3339 time (Anthropic; offsets allowed), a bare number (below
// EpochSecondsThreshold delay seconds, below EpochMillisThreshold epoch
// seconds, below 1e15 epoch milliseconds), or a Go duration. An absolute
// time in the past means "replenished now" (0); anything above MaxReset is
// malformed.
func refparseResetValue(s string, now time.Time) (time.Duration, bool) {
	s = reftrimOWS(s)
	if refisDecimalNumber(s) {
		v, err := strconv.ParseFloat(s, 64)
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
		return refuntilTime(at, now)
	}
	if len(s) >= 20 && (strings.IndexByte(s, 'T') > 0 || strings.IndexByte(s, 't') > 0) {
		at, err := time.Parse(time.RFC3339, s)
		if err != nil {
			return 0, false
		}
		return refuntilTime(at, now)
	}
	return refParseResetDuration(s)
}

// refuntilTime is at-now clamped at 0 (a past reset means "now"), malformed
// above MaxReset.
func refuntilTime(at, now time.Time) (time.Duration, bool) {
	d := at.Sub(now)
	if d < 0 {
		return 0, true
	}
	if d > MaxReset {
		return 0, false
	}
	return d, true
}

// refclampRetry clamps a non-negative wait in seconds to [0, MaxRetryAfter].
func refclampRetry(seconds float64) time.Duration {
	if seconds >= MaxRetryAfter.Seconds() {
		return MaxRetryAfter
	}
	return time.Duration(math.Round(seconds * 1e9))
}

// refParseRetryAfter reads the provider's explicit wait from h at now. Order:
// retry-after-ms, then x-ms-retry-after-ms (milliseconds; Azure, OpenAI
// SDKs), which win over Retry-After (BC-05a); then Retry-After as
// delay-seconds or any of the three RFC 9110 HTTP-date forms (IMF-fixdate,
// RFC 850, asctime) via http.ParseTime (BC-03). A past date gives 0, ok; "0"
// gives 0, ok (eligible immediately, BC-05b). Values above MaxRetryAfter are
// clamped to it. A malformed or absent value gives ok=false, so the caller
// applies its default backoff (never 0).
func refParseRetryAfter(h http.Header, now time.Time) (d time.Duration, ok bool) {
	d, ok, _ = refparseRetryAfter(h, now)
	return d, ok
}

func refparseRetryAfter(h http.Header, now time.Time) (d time.Duration, ok bool, malformed int) {
	for _, key := range [2]string{refhRetryAfterMs, refhXMsRetryAfter} {
		v, present := refheader(h, key)
		if !present {
			continue
		}
		v = reftrimOWS(v)
		if refisDecimalNumber(v) {
			if ms, err := strconv.ParseFloat(v, 64); err == nil {
				return refclampRetry(ms / 1000), true, malformed
			}
		}
		malformed++
	}
	v, present := refheader(h, refhRetryAfter)
	if !present {
		return 0, false, malformed
	}
	v = reftrimOWS(v)
	if refisDecimalNumber(v) {
		if sec, err := strconv.ParseFloat(v, 64); err == nil {
			return refclampRetry(sec), true, malformed
		}
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0, false, malformed + 1
	}
	d = at.Sub(now)
	if d < 0 {
		return 0, true, malformed
	}
	if d > MaxRetryAfter {
		d = MaxRetryAfter
	}
	return d, true, malformed
}

// refparser accumulates candidate figures per dimension while reading the
// dialects, and keeps the most restrictive one.
type refparser struct {
	h         http.Header
	now       time.Time
	best      [4]Dimension
	malformed int
}

// offer proposes a figure for dimension dim. The most restrictive wins: the
// smallest remaining, for equal remaining the later reset; a figure with a
// remaining beats one without; among limit-only figures the smallest limit.
func (p *refparser) offer(dim int, c Dimension) {
	if c.Remaining < 0 && c.Limit <= 0 {
		return
	}
	if c.Limit > 0 && c.Remaining > c.Limit {
		c.Remaining = c.Limit
	}
	b := &p.best[dim]
	better := false
	switch {
	case b.Remaining < 0 && b.Limit <= 0:
		better = true
	case c.Remaining >= 0 && b.Remaining < 0:
		better = true
	case c.Remaining < 0 && b.Remaining >= 0:
		better = false
	case c.Remaining >= 0:
		better = c.Remaining < b.Remaining || (c.Remaining == b.Remaining && c.Reset > b.Reset)
	default:
		better = c.Limit < b.Limit
	}
	if better {
		*b = c
	}
}

// triplet reads limit, remaining and reset refheader values into a Dimension.
// present reports whether any of the three headers was there.
func (p *refparser) triplet(keys [3]string, dialect string) (d Dimension, present bool) {
	d = refunknownDimension()
	d.Dialect = dialect
	if v, ok := refheader(p.h, keys[0]); ok {
		present = true
		if n, ok := refparseLimit(v); ok {
			d.Limit = n
		} else {
			p.malformed++
		}
	}
	if v, ok := refheader(p.h, keys[1]); ok {
		present = true
		if n, ok := refparseCount(v); ok {
			d.Remaining = n
		} else {
			p.malformed++
		}
	}
	if v, ok := refheader(p.h, keys[2]); ok {
		present = true
		if r, ok := refparseResetValue(v, p.now); ok {
			d.Reset = r
		} else {
			p.malformed++
		}
	}
	return d, present
}

// refParseHeaders reads every rate-limit dialect in h (a response received at
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
//     triplet is Anthropic's "most restrictive limit in effect" and fills
//     Tokens; the input-tokens and output-tokens triplets fill Input and
//     Output, never Tokens.
//   - Classic X-RateLimit-{Limit,Remaining,Reset}: the requests dimension;
//     reset as delay seconds, epoch seconds (>= 1e9) or epoch ms (>= 1e12).
//   - IETF draft-10/11 RateLimit and RateLimit-Policy structured Lists (any
//     number of members and field lines); a policy's qu "requests"/"request"
//     (the default) maps to Requests, a unit containing "token" to Tokens,
//     others are ignored. The draft-03..06 RateLimit-{Limit,Remaining,Reset}
//     with RateLimit-Policy "10;w=1" maps to Requests.
func refParseHeaders(h http.Header, now time.Time) Quota {
	return refparseHeaders(h, now, "")
}

// refParseHeadersDialect is refParseHeaders restricted to one dialect, the
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
// "", "Auto" and any unknown name behave as refParseHeaders (every dialect,
// most restrictive figure wins).
func refParseHeadersDialect(h http.Header, now time.Time, dialect string) Quota {
	return refparseHeaders(h, now, refNormalizeDialect(dialect))
}

// refNormalizeDialect maps a dialect hint to this package's Dialect* name:
// "OpenAI"/"openai" to DialectOpenAI, and so on for Anthropic, Azure, Classic
// and IETF (case-insensitive); "", "Auto" and unknown names to "" (every
// dialect).
func refNormalizeDialect(dialect string) string {
	for _, d := range [...]string{DialectOpenAI, DialectAnthropic, DialectAzure, DialectClassic, DialectIETF} {
		if strings.EqualFold(dialect, d) {
			return d
		}
	}
	return ""
}

// refparseHeaders reads the dialect only ("" = every dialect).
func refparseHeaders(h http.Header, now time.Time, only string) Quota {
	p := refparser{h: h, now: now, best: [4]Dimension{refunknownDimension(), refunknownDimension(), refunknownDimension(), refunknownDimension()}}
	q := Quota{}
	var msRetry bool
	q.RetryAfter, q.HasRetryAfter, p.malformed = refparseRetryAfter(h, now)
	if q.HasRetryAfter {
		_, a := refheader(h, refhRetryAfterMs)
		_, b := refheader(h, refhXMsRetryAfter)
		msRetry = a || b
	}

	// OpenAI / Azure.
	for dim := 0; dim < 2 && (only == "" || only == DialectOpenAI || only == DialectAzure); dim++ {
		d, present := p.triplet(refhOpenAI[dim], DialectOpenAI)
		if !present {
			continue
		}
		resetRaw, hasReset := refheader(h, refhOpenAI[dim][2])
		switch {
		case only != "":
			d.Dialect = only
		case msRetry || (d.Remaining >= 0 && !hasReset) || (hasReset && refisDecimalNumber(reftrimOWS(resetRaw))):
			d.Dialect = DialectAzure
		}
		p.offer(dim, d)
	}

	if only == "" || only == DialectAnthropic {
		p.parseAnthropic()
	}

	// Classic.
	if only == "" || only == DialectClassic {
		if d, present := p.triplet([3]string{refhClassicLimit, refhClassicRemain, refhClassicReset}, DialectClassic); present {
			p.offer(refdimRequests, d)
		}
	}

	// IETF.
	if only == "" || only == DialectIETF {
		p.parseIETF()
	}

	q.Tokens, q.Requests, q.Malformed = p.best[refdimTokens], p.best[refdimRequests], p.malformed
	q.Input, q.Output = p.best[refdimInput], p.best[refdimOutput]
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
	return q
}

// parseAnthropic reads the anthropic-ratelimit-* triplets.
func (p *refparser) parseAnthropic() {
	if d, present := p.triplet(refhAnthropic[refdimRequests], DialectAnthropic); present {
		p.offer(refdimRequests, d)
	}
	if d, present := p.triplet(refhAnthropic[refdimTokens], DialectAnthropic); present {
		p.offer(refdimTokens, d)
	}
	if d, present := p.triplet(refhAnthropicInOut[0], DialectAnthropic); present {
		p.offer(refdimInput, d)
	}
	if d, present := p.triplet(refhAnthropicInOut[1], DialectAnthropic); present {
		p.offer(refdimOutput, d)
	}
}

// refietfPolicy is one RateLimit-Policy member.
type refietfPolicy struct {
	name string
	q    int64
	dim  int // refdimTokens, refdimRequests, or -1 for units we do not pace
	used bool
}

// refietfUnit maps a quota unit to a dimension: "requests" (the default) or
// "request" (the draft's IANA table) to Requests, any unit naming tokens
// (no tokens unit is registered; vendors use their own) to Tokens, others
// (content-bytes, concurrent-requests) to -1.
func refietfUnit(qu string) int {
	switch {
	case qu == "" || strings.EqualFold(qu, "requests") || strings.EqualFold(qu, "request"):
		return refdimRequests
	case strings.Contains(strings.ToLower(qu), "token"):
		return refdimTokens
	}
	return -1
}

func (p *refparser) parseIETF() {
	var buf [8]refietfPolicy
	policies := buf[:0]
	oldLimit := int64(-1) // draft-03 "RateLimit-Policy: 10;w=1"
	var sm refsfMember
	m := &sm
	for _, line := range p.h[refhIETFPolicy] {
		it := refsfList{s: line}
		for it.next(m) {
			switch m.item.kind {
			case refsfString, refsfToken:
				qv, ok := m.param("q")
				if !ok || qv.kind != refsfInteger || qv.i <= 0 || qv.i > MaxQuotaValue {
					p.malformed++
					continue
				}
				unit := ""
				if u, ok := m.param("qu"); ok {
					if u.kind != refsfString && u.kind != refsfToken {
						p.malformed++
						continue
					}
					unit = u.s
				}
				policies = append(policies, refietfPolicy{name: m.item.s, q: qv.i, dim: refietfUnit(unit)})
			case refsfInteger:
				if m.item.i <= 0 || m.item.i > MaxQuotaValue {
					p.malformed++
					continue
				}
				if oldLimit < 0 || m.item.i < oldLimit {
					oldLimit = m.item.i
				}
			default:
				p.malformed++
			}
		}
		p.malformed += it.malformed
	}
	for _, line := range p.h[refhIETFRateLimit] {
		it := refsfList{s: line}
		for it.next(m) {
			if m.item.kind != refsfString && m.item.kind != refsfToken {
				p.malformed++
				continue
			}
			rv, ok := m.param("r")
			if !ok || rv.kind != refsfInteger || rv.i < 0 || rv.i > MaxQuotaValue {
				p.malformed++
				continue
			}
			d := Dimension{Limit: -1, Remaining: rv.i, Reset: -1, Dialect: DialectIETF}
			if tv, ok := m.param("t"); ok {
				if tv.kind == refsfInteger && tv.i >= 0 && tv.i <= int64(MaxReset/time.Second) {
					d.Reset = time.Duration(tv.i) * time.Second
				} else {
					p.malformed++
				}
			}
			dim := refdimRequests
			for i := range policies {
				if policies[i].name == m.item.s {
					policies[i].used = true
					d.Limit, dim = policies[i].q, policies[i].dim
					break
				}
			}
			if dim >= 0 {
				p.offer(dim, d)
			}
		}
		p.malformed += it.malformed
	}
	for _, pol := range policies {
		if !pol.used && pol.dim >= 0 {
			p.offer(pol.dim, Dimension{Limit: pol.q, Remaining: -1, Reset: -1, Dialect: DialectIETF})
		}
	}
	// draft-03..06 form.
	if d, present := p.triplet([3]string{refhIETFLimit, refhIETFRemaining, refhIETFReset}, DialectIETF); present || oldLimit > 0 {
		if d.Limit < 0 {
			d.Limit = oldLimit
		}
		p.offer(refdimRequests, d)
	}
}

// This file is a small, tolerant reader for RFC 9651 Structured Field Lists,
// enough for the IETF RateLimit and RateLimit-Policy fields
// (draft-ietf-httpapi-ratelimit-headers-10/11). Unlike a strict RFC 9651
// refparser, which discards a whole field when any member is malformed, it skips
// the malformed member only, as the brief for this package asks ("malformed
// items ignored"), and counts it.

type refsfKind uint8

const (
	refsfNone refsfKind = iota
	refsfString
	refsfToken
	refsfInteger
	refsfDecimal
	refsfBytes
	refsfBool
)

// refsfValue is one bare item: a String or Token in s, an Integer in i.
type refsfValue struct {
	kind refsfKind
	s    string
	i    int64
}

// refsfMaxParams bounds the parameters kept per member; further parameters are
// parsed (so the member is validated) but not kept.
const refsfMaxParams = 8

type refsfParam struct {
	key string
	val refsfValue
}

// refsfMember is one List member: an Item and its parameters.
type refsfMember struct {
	item    refsfValue
	params  [refsfMaxParams]refsfParam
	nParams int
}

// param returns the value of parameter key, if present.
func (m *refsfMember) param(key string) (refsfValue, bool) {
	for i := 0; i < m.nParams; i++ {
		if m.params[i].key == key {
			return m.params[i].val, true
		}
	}
	return refsfValue{}, false
}

// refforEachSFMember parses s as an RFC 9651 List and calls fn for every
// well-formed Item member. It returns the number of members skipped as
// malformed (Inner Lists count as malformed: no RateLimit field uses them).
func refforEachSFMember(s string, fn func(m *refsfMember)) (malformed int) {
	var m refsfMember
	it := refsfList{s: s}
	for it.next(&m) {
		fn(&m)
	}
	return it.malformed
}

// refsfList iterates over the well-formed Item members of an RFC 9651 List
// without a callback, so that the member, owned by the caller, can stay on
// the caller's stack (no allocation per field line).
type refsfList struct {
	s         string
	i         int
	malformed int // members skipped as malformed so far
}

// next parses the next well-formed member into m; false at the end.
func (it *refsfList) next(m *refsfMember) bool {
	s := it.s
	for {
		i := refskipOWS(s, it.i)
		if i >= len(s) {
			it.i = len(s)
			return false
		}
		j, ok := refparseSFMember(s, i, m)
		if ok {
			j = refskipOWS(s, j)
			if j < len(s) && s[j] != ',' {
				ok = false
			}
		}
		if !ok {
			it.malformed++
			it.i = refskipToNextMember(s, i)
			continue
		}
		if j >= len(s) {
			it.i = len(s)
		} else {
			it.i = j + 1 // past the comma
		}
		return true
	}
}

func refskipOWS(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
		i++
	}
	return i
}

// refskipToNextMember returns the index just past the next comma outside a
// quoted string, or len(s).
func refskipToNextMember(s string, i int) int {
	inQuote := false
	for ; i < len(s); i++ {
		c := s[i]
		switch {
		case inQuote && c == '\\':
			i++
		case c == '"':
			inQuote = !inQuote
		case !inQuote && c == ',':
			return i + 1
		}
	}
	return len(s)
}

func refparseSFMember(s string, i int, m *refsfMember) (int, bool) {
	m.nParams = 0
	v, j, ok := refparseBareItem(s, i)
	if !ok {
		return j, false
	}
	m.item = v
	for j < len(s) && s[j] == ';' {
		j++
		for j < len(s) && s[j] == ' ' {
			j++
		}
		k := j
		if j >= len(s) || !(refisLCAlpha(s[j]) || s[j] == '*') {
			return j, false
		}
		for j < len(s) && (refisLCAlpha(s[j]) || refisDigit(s[j]) || s[j] == '_' || s[j] == '-' || s[j] == '.' || s[j] == '*') {
			j++
		}
		key := s[k:j]
		pv := refsfValue{kind: refsfBool, i: 1}
		if j < len(s) && s[j] == '=' {
			pv, j, ok = refparseBareItem(s, j+1)
			if !ok {
				return j, false
			}
		}
		if m.nParams < refsfMaxParams {
			m.params[m.nParams] = refsfParam{key: key, val: pv}
			m.nParams++
		}
	}
	return j, true
}

func refparseBareItem(s string, i int) (refsfValue, int, bool) {
	if i >= len(s) {
		return refsfValue{}, i, false
	}
	c := s[i]
	switch {
	case c == '"':
		return refparseSFString(s, i)
	case c == '-' || refisDigit(c):
		return refparseSFNumber(s, i)
	case c == ':':
		j := i + 1
		for j < len(s) && s[j] != ':' {
			b := s[j]
			if !(refisAlpha(b) || refisDigit(b) || b == '+' || b == '/' || b == '=') {
				return refsfValue{}, j, false
			}
			j++
		}
		if j >= len(s) {
			return refsfValue{}, j, false
		}
		return refsfValue{kind: refsfBytes, s: s[i+1 : j]}, j + 1, true
	case c == '?':
		if i+1 < len(s) && (s[i+1] == '0' || s[i+1] == '1') {
			return refsfValue{kind: refsfBool, i: int64(s[i+1] - '0')}, i + 2, true
		}
		return refsfValue{}, i + 1, false
	case refisAlpha(c) || c == '*':
		j := i + 1
		for j < len(s) && (refisTChar(s[j]) || s[j] == ':' || s[j] == '/') {
			j++
		}
		return refsfValue{kind: refsfToken, s: s[i:j]}, j, true
	}
	return refsfValue{}, i, false
}

func refparseSFString(s string, i int) (refsfValue, int, bool) {
	j := i + 1
	escaped := false
	for j < len(s) {
		c := s[j]
		switch {
		case c == '\\':
			if j+1 >= len(s) || (s[j+1] != '"' && s[j+1] != '\\') {
				return refsfValue{}, j, false
			}
			escaped = true
			j += 2
			continue
		case c == '"':
			raw := s[i+1 : j]
			if escaped {
				var b strings.Builder
				for k := 0; k < len(raw); k++ {
					if raw[k] == '\\' {
						k++
					}
					b.WriteByte(raw[k])
				}
				raw = b.String()
			}
			return refsfValue{kind: refsfString, s: raw}, j + 1, true
		case c < 0x20 || c > 0x7e:
			return refsfValue{}, j, false
		}
		j++
	}
	return refsfValue{}, j, false
}

func refparseSFNumber(s string, i int) (refsfValue, int, bool) {
	j := i
	if s[j] == '-' {
		j++
	}
	start := j
	for j < len(s) && refisDigit(s[j]) {
		j++
	}
	intDigits := j - start
	if intDigits == 0 {
		return refsfValue{}, j, false
	}
	if j < len(s) && s[j] == '.' {
		if intDigits > 12 {
			return refsfValue{}, j, false
		}
		j++
		fs := j
		for j < len(s) && refisDigit(s[j]) {
			j++
		}
		if n := j - fs; n < 1 || n > 3 {
			return refsfValue{}, j, false
		}
		return refsfValue{kind: refsfDecimal}, j, true
	}
	if intDigits > 15 {
		return refsfValue{}, j, false
	}
	v, err := strconv.ParseInt(s[i:j], 10, 64)
	if err != nil {
		return refsfValue{}, j, false
	}
	return refsfValue{kind: refsfInteger, i: v}, j, true
}

func refisDigit(c byte) bool   { return c >= '0' && c <= '9' }
func refisLCAlpha(c byte) bool { return c >= 'a' && c <= 'z' }
func refisAlpha(c byte) bool   { return refisLCAlpha(c) || (c >= 'A' && c <= 'Z') }

// refisTChar reports an RFC 9110 tchar.
func refisTChar(c byte) bool {
	if refisAlpha(c) || refisDigit(c) {
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}
