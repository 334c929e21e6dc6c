package throttle

import "strings"

// This file is a small, tolerant reader for RFC 9651 Structured Field Lists,
// enough for the IETF RateLimit and RateLimit-Policy fields
// (draft-ietf-httpapi-ratelimit-headers-10/11). Unlike a strict RFC 9651
// parser, which discards a whole field when any member is malformed, it skips
// the malformed member only, as the brief for this package asks ("malformed
// items ignored"), and counts it.

type sfKind uint8

const (
	sfNone sfKind = iota
	sfString
	sfToken
	sfInteger
	sfDecimal
	sfBytes
	sfBool
)

// sfValue is one bare item: a String or Token in s, an Integer in i.
type sfValue struct {
	kind sfKind
	s    string
	i    int64
}

// sfMaxParams bounds the parameters kept per member; further parameters are
// parsed (so the member is validated) but not kept.
const sfMaxParams = 8

type sfParam struct {
	key string
	val sfValue
}

// sfMember is one List member: an Item and its parameters.
type sfMember struct {
	item    sfValue
	params  [sfMaxParams]sfParam
	nParams int
}

// param returns the value of parameter key, if present.
func (m *sfMember) param(key string) (sfValue, bool) {
	for i := 0; i < m.nParams; i++ {
		if m.params[i].key == key {
			return m.params[i].val, true
		}
	}
	return sfValue{}, false
}

// forEachSFMember parses s as an RFC 9651 List and calls fn for every
// well-formed Item member. It returns the number of members skipped as
// malformed (Inner Lists count as malformed: no RateLimit field uses them).
func forEachSFMember(s string, fn func(m *sfMember)) (malformed int) {
	var m sfMember
	it := sfList{s: s}
	for it.next(&m) {
		fn(&m)
	}
	return it.malformed
}

// sfList iterates over the well-formed Item members of an RFC 9651 List
// without a callback, so that the member, owned by the caller, can stay on
// the caller's stack (no allocation per field line).
type sfList struct {
	s         string
	i         int
	malformed int // members skipped as malformed so far
}

// next parses the next well-formed member into m; false at the end.
func (it *sfList) next(m *sfMember) bool {
	s := it.s
	for {
		i := skipOWS(s, it.i)
		if i >= len(s) {
			it.i = len(s)
			return false
		}
		j, ok := parseSFMember(s, i, m)
		if ok {
			j = skipOWS(s, j)
			if j < len(s) && s[j] != ',' {
				ok = false
			}
		}
		if !ok {
			it.malformed++
			it.i = skipToNextMember(s, i)
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

// Character classes of the fast path (pickSFMemberFast), built from the
// predicates of the general parser.
const (
	sfKeyChar   = 1 << iota // a parameter key's byte after the first
	sfTokenChar             // a Token's byte after the first
	sfPlainChar             // a String's byte other than '"' and '\\'
)

var sfClass [256]uint8

func init() {
	for i := range sfClass {
		c := byte(i)
		if isLCAlpha(c) || isDigit(c) || c == '_' || c == '-' || c == '.' || c == '*' {
			sfClass[c] |= sfKeyChar
		}
		if isTChar(c) || c == ':' || c == '/' {
			sfClass[c] |= sfTokenChar
		}
		if c >= 0x20 && c <= 0x7e && c != '"' && c != '\\' {
			sfClass[c] |= sfPlainChar
		}
	}
}

// sfPick is what a reader takes from one List member: its Item and the
// values of up to three parameters, each the first occurrence among the
// first sfMaxParams parameters (what sfMember.param finds); val[i] is valid
// when has[i].
type sfPick struct {
	item sfValue
	val  [3]sfValue
	has  [3]bool
}

// nextPick is next for a reader of the Item and the parameters k0, k1 and
// k2 of each member ("" for none): it parses the next well-formed member into pk; false at the
// end. Members, malformed ones and it.malformed are exactly those of next
// (FuzzSFPickMatchesMember compares them). A member of the common form
// (strings without escapes, tokens, integers, key=value parameters) is
// read by pickSFMemberFast without storing its parameters; any other by
// parseSFMember.
func (it *sfList) nextPick(pk *sfPick, k0, k1, k2 string) bool {
	s := it.s
	for {
		i := skipOWS(s, it.i)
		if i >= len(s) {
			it.i = len(s)
			return false
		}
		j, ok, handled := pickSFMemberFast(s, i, pk, k0, k1, k2)
		if !handled {
			j, ok = pickSFMember(s, i, pk, k0, k1, k2)
		}
		if ok {
			j = skipOWS(s, j)
			if j < len(s) && s[j] != ',' {
				ok = false
			}
		}
		if !ok {
			it.malformed++
			it.i = skipToNextMember(s, i)
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

// pickSFMember is the general path of nextPick: parseSFMember, then the
// three parameters by sfMember.param.
func pickSFMember(s string, i int, pk *sfPick, k0, k1, k2 string) (int, bool) {
	var m sfMember
	j, ok := parseSFMember(s, i, &m)
	if ok {
		pk.item = m.item
		pk.val[0], pk.has[0] = m.param(k0)
		pk.val[1], pk.has[1] = m.param(k1)
		pk.val[2], pk.has[2] = m.param(k2)
	}
	return j, ok
}

// pickSFMemberFast reads the member at s[i] if it is of the common form:
// an Item and parameters that are each a String without escapes, a Token
// or an Integer of up to 15 digits without a sign, and parameters written
// key=value with no space after the ';'. It then returns what parseSFMember
// would (the end, ok=true), with pk filled as pickSFMember would fill it,
// and handled=true; for any other member handled=false, and the caller
// uses the general path.
func pickSFMemberFast(s string, i int, pk *sfPick, k0, k1, k2 string) (j int, ok, handled bool) {
	j, handled = pickSFItem(s, i, &pk.item)
	if !handled {
		return j, false, false
	}
	pk.has[0], pk.has[1], pk.has[2] = false, false, false
	var v sfValue
	for n := 0; j < len(s) && s[j] == ';'; n++ {
		j++
		k := j
		if j >= len(s) || !(isLCAlpha(s[j]) || s[j] == '*') {
			return j, false, false
		}
		for j < len(s) && sfClass[s[j]]&sfKeyChar != 0 {
			j++
		}
		key := s[k:j]
		if j >= len(s) || s[j] != '=' {
			return j, false, false
		}
		if j, handled = pickSFItem(s, j+1, &v); !handled {
			return j, false, false
		}
		if n < sfMaxParams {
			if !pk.has[0] && eqShort(key, k0) {
				pk.val[0], pk.has[0] = v, true
			}
			if !pk.has[1] && eqShort(key, k1) {
				pk.val[1], pk.has[1] = v, true
			}
			if !pk.has[2] && eqShort(key, k2) {
				pk.val[2], pk.has[2] = v, true
			}
		}
	}
	return j, true, true
}

// eqShort is a == b, by a byte loop: the parameter keys compared are a
// byte or two, shorter than a call to the runtime's comparison.
func eqShort(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// pickSFItem reads the bare item at s[i] into v if it is a String without
// escapes, a Token, or an Integer of 1 to 15 digits not followed by '.',
// as parseBareItem would, and returns its end and true; false for any
// other item (or none), for parseBareItem to read.
func pickSFItem(s string, i int, v *sfValue) (int, bool) {
	if i >= len(s) {
		return i, false
	}
	c := s[i]
	switch {
	case c == '"':
		j := i + 1
		for j < len(s) && sfClass[s[j]]&sfPlainChar != 0 {
			j++
		}
		if j >= len(s) || s[j] != '"' {
			return j, false // an escape, a byte outside a String, or no end
		}
		v.kind, v.s, v.i = sfString, s[i+1:j], 0
		return j + 1, true
	case isDigit(c):
		var n int64
		j := i
		for ; j < len(s) && isDigit(s[j]); j++ {
			n = n*10 + int64(s[j]-'0')
		}
		if j-i > 15 || (j < len(s) && s[j] == '.') {
			return j, false // more than 15 digits, or a Decimal
		}
		v.kind, v.s, v.i = sfInteger, "", n
		return j, true
	case isAlpha(c) || c == '*':
		j := i + 1
		for j < len(s) && sfClass[s[j]]&sfTokenChar != 0 {
			j++
		}
		v.kind, v.s, v.i = sfToken, s[i:j], 0
		return j, true
	}
	return i, false
}

func skipOWS(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
		i++
	}
	return i
}

// skipToNextMember returns the index just past the next comma outside a
// quoted string, or len(s).
func skipToNextMember(s string, i int) int {
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

func parseSFMember(s string, i int, m *sfMember) (int, bool) {
	m.nParams = 0
	v, j, ok := parseBareItem(s, i)
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
		if j >= len(s) || !(isLCAlpha(s[j]) || s[j] == '*') {
			return j, false
		}
		for j < len(s) && (isLCAlpha(s[j]) || isDigit(s[j]) || s[j] == '_' || s[j] == '-' || s[j] == '.' || s[j] == '*') {
			j++
		}
		key := s[k:j]
		pv := sfValue{kind: sfBool, i: 1}
		if j < len(s) && s[j] == '=' {
			pv, j, ok = parseBareItem(s, j+1)
			if !ok {
				return j, false
			}
		}
		if m.nParams < sfMaxParams {
			// Field by field: a composite literal is built on the stack and
			// copied in wide loads that stall on the narrow stores.
			kp := &m.params[m.nParams]
			kp.key, kp.val = key, pv
			m.nParams++
		}
	}
	return j, true
}

func parseBareItem(s string, i int) (sfValue, int, bool) {
	if i >= len(s) {
		return sfValue{}, i, false
	}
	c := s[i]
	switch {
	case c == '"':
		return parseSFString(s, i)
	case c == '-' || isDigit(c):
		return parseSFNumber(s, i)
	case c == ':':
		j := i + 1
		for j < len(s) && s[j] != ':' {
			b := s[j]
			if !(isAlpha(b) || isDigit(b) || b == '+' || b == '/' || b == '=') {
				return sfValue{}, j, false
			}
			j++
		}
		if j >= len(s) {
			return sfValue{}, j, false
		}
		return sfValue{kind: sfBytes, s: s[i+1 : j]}, j + 1, true
	case c == '?':
		if i+1 < len(s) && (s[i+1] == '0' || s[i+1] == '1') {
			return sfValue{kind: sfBool, i: int64(s[i+1] - '0')}, i + 2, true
		}
		return sfValue{}, i + 1, false
	case isAlpha(c) || c == '*':
		j := i + 1
		for j < len(s) && (isTChar(s[j]) || s[j] == ':' || s[j] == '/') {
			j++
		}
		return sfValue{kind: sfToken, s: s[i:j]}, j, true
	}
	return sfValue{}, i, false
}

func parseSFString(s string, i int) (sfValue, int, bool) {
	j := i + 1
	escaped := false
	for j < len(s) {
		c := s[j]
		switch {
		case c == '\\':
			if j+1 >= len(s) || (s[j+1] != '"' && s[j+1] != '\\') {
				return sfValue{}, j, false
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
			return sfValue{kind: sfString, s: raw}, j + 1, true
		case c < 0x20 || c > 0x7e:
			return sfValue{}, j, false
		}
		j++
	}
	return sfValue{}, j, false
}

func parseSFNumber(s string, i int) (sfValue, int, bool) {
	j := i
	if s[j] == '-' {
		j++
	}
	start := j
	for j < len(s) && isDigit(s[j]) {
		j++
	}
	intDigits := j - start
	if intDigits == 0 {
		return sfValue{}, j, false
	}
	if j < len(s) && s[j] == '.' {
		if intDigits > 12 {
			return sfValue{}, j, false
		}
		j++
		fs := j
		for j < len(s) && isDigit(s[j]) {
			j++
		}
		if n := j - fs; n < 1 || n > 3 {
			return sfValue{}, j, false
		}
		return sfValue{kind: sfDecimal}, j, true
	}
	if intDigits > 15 {
		return sfValue{}, j, false
	}
	v, _ := parseDigits(s[start:j]) // 1 to 15 digits: cannot fail or overflow
	if start > i {
		v = -v
	}
	return sfValue{kind: sfInteger, i: v}, j, true
}

func isDigit(c byte) bool   { return c >= '0' && c <= '9' }
func isLCAlpha(c byte) bool { return c >= 'a' && c <= 'z' }
func isAlpha(c byte) bool   { return isLCAlpha(c) || (c >= 'A' && c <= 'Z') }

// isTChar reports an RFC 9110 tchar.
func isTChar(c byte) bool {
	if isAlpha(c) || isDigit(c) {
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}
