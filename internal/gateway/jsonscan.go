package gateway

import (
	"bytes"
	"encoding/binary"
	"math/bits"

	"github.com/fairshare-dev/fairshare/internal/limiter"
)

// maxJSONDepth is encoding/json's nesting limit (its scanner refuses a
// value nested deeper than 10000 arrays or objects), kept so that
// scanResponseJSON accepts exactly what json.Valid accepts.
const maxJSONDepth = 10000

// scanResponseJSON validates a non-streaming response body and reads its
// usage in one pass (brief "performance targets": usage extraction on a
// 1 MB response within 1.2x a reverse proxy's CPU). ok reports whether b is
// one JSON value under RFC 8259 with exactly the acceptance of
// encoding/json.Valid (whitespace, numbers, string escapes, control
// characters refused in strings, invalid UTF-8 accepted, nesting at most
// 10000 deep); a body that is not is a 502 upstream_invalid_response with
// the charge kept (BC-28a). u is what parseBodyUsage returns for b: the
// top-level members whose key may name "usage" (encoding/json matches keys
// case-insensitively, and the last of duplicates wins) are decoded with
// encoding/json, so the result is the same for every body; the rest of the
// body is only scanned. Memory: O(depth) besides the members kept.
func scanResponseJSON(b []byte) (u limiter.Usage, ok bool) {
	var cands [][2]int // key start, value end of candidate top-level members
	ok, obj := scanJSON(b, usageKeyCandidate, func(c [2]int) { cands = append(cands, c) })
	if !ok || !obj || len(cands) == 0 {
		// A valid body that is not an object, or an object without a
		// usage member, has no usage (json.Unmarshal into a struct fails or
		// leaves Usage nil).
		return limiter.Usage{}, ok
	}
	if len(cands) == 1 {
		if u, ok := plainUsage(b, cands[0]); ok {
			return u, true
		}
	}
	n := 2
	for _, c := range cands {
		n += c[1] - c[0] + 1
	}
	doc := make([]byte, 0, n)
	doc = append(doc, '{')
	for i, c := range cands {
		if i > 0 {
			doc = append(doc, ',')
		}
		doc = append(doc, b[c[0]:c[1]]...)
	}
	doc = append(doc, '}')
	return parseBodyUsage(doc), true
}

// plainUsage reads the usage of the one candidate member c (its span in
// b, validated by scanJSON) without encoding/json when the member has the
// common shape: the key "usage" as written, and null or an object whose
// keys are plain ASCII and whose prompt_tokens, completion_tokens and
// total_tokens (matched case-insensitively, the last of duplicates winning, null
// clearing) are integers of at most 18 digits. ok is false for any other
// shape, which parseBodyUsage then decodes; the result is the same
// (FuzzScanResponseJSON).
func plainUsage(b []byte, c [2]int) (u limiter.Usage, ok bool) {
	ke := scanJSONString(b, c[0]+1)
	if string(b[c[0]+1:ke-1]) != "usage" {
		return limiter.Usage{}, false
	}
	v := b[skipJSONSpace(b, skipJSONSpace(b, ke)+1):c[1]]
	if string(v) == "null" {
		return limiter.Usage{}, true
	}
	if len(v) == 0 || v[0] != '{' {
		return limiter.Usage{}, false
	}
	// As usageJSON: set (and the value) of each field.
	var hasP, hasC, hasT bool
	var pv, cv, tv int64
	plain := eachMember(v, func(key, val []byte) bool {
		var has *bool
		var dst *int64
		switch {
		case asciiEqualFold(key, "prompt_tokens"):
			has, dst = &hasP, &pv
		case asciiEqualFold(key, "completion_tokens"):
			has, dst = &hasC, &cv
		case asciiEqualFold(key, "total_tokens"):
			has, dst = &hasT, &tv
		default:
			return plainASCIIKey(key)
		}
		if string(val) == "null" {
			*has = false
		} else if n, ok := plainJSONInt(val); ok {
			*has, *dst = true, n
		} else {
			return false
		}
		return true
	})
	if !plain {
		return limiter.Usage{}, false
	}
	opt := func(has bool, v *int64) *int64 {
		if has {
			return v
		}
		return nil
	}
	return usageOf(opt(hasP, &pv), opt(hasC, &cv), opt(hasT, &tv)), true
}

// usageKeyCandidate reports whether the raw (still escaped) JSON object key
// k may match the field "usage" under encoding/json's rules: its ASCII
// case-insensitive spelling, or any key with an escape or a non-ASCII byte
// (which may unescape or case-fold to it, such as U+017F for 's'). A
// superset is harmless: encoding/json decides on the candidates.
func usageKeyCandidate(k []byte) bool {
	if len(k) == 5 && k[0]|0x20 == 'u' && k[1]|0x20 == 's' && k[2]|0x20 == 'a' && k[3]|0x20 == 'g' && k[4]|0x20 == 'e' {
		return true
	}
	if len(k) > 64 {
		return false // "usage" escaped in full is 30 bytes; folded forms are shorter
	}
	for _, c := range k {
		if c == '\\' || c >= 0x80 {
			return true
		}
	}
	return false
}

// scanJSON reports whether b is one valid JSON value (encoding/json.Valid's
// grammar and depth limit) and whether it is an object; for an object it
// calls found, in order, with the span (from the key's opening quote to the
// end of the value) of every top-level member whose raw key (between the
// quotes, still escaped) keep accepts (found may be called before b turns
// out invalid). It is iterative: the container stack is one byte per level.
func scanJSON(b []byte, keep func(key []byte) bool, found func(span [2]int)) (ok, object bool) {
	var stack []byte // '{' or '[' per open container
	var small [64]byte
	stack = small[:0]
	n := len(b)
	i := skipJSONSpace(b, 0)
	if i < n {
		object = b[i] == '{'
	}
	member := -1 // start of the candidate top-level member being scanned
	var top byte // the innermost open container
value:
	if i >= n {
		return false, object
	}
	switch c := b[i]; {
	case c == '{':
		if len(stack) >= maxJSONDepth {
			return false, object
		}
		stack = append(stack, '{')
		i = skipJSONSpace(b, i+1)
		if i < n && b[i] == '}' {
			stack = stack[:len(stack)-1]
			i++
			goto end
		}
		goto key
	case c == '[':
		if len(stack) >= maxJSONDepth {
			return false, object
		}
		stack = append(stack, '[')
		i = skipJSONSpace(b, i+1)
		if i < n && b[i] == ']' {
			stack = stack[:len(stack)-1]
			i++
			goto end
		}
		goto value
	case c == '"':
		if i = scanJSONString(b, i+1); i < 0 {
			return false, object
		}
	case c == 't':
		if !hasLiteral(b, i, "true") {
			return false, object
		}
		i += 4
	case c == 'f':
		if !hasLiteral(b, i, "false") {
			return false, object
		}
		i += 5
	case c == 'n':
		if !hasLiteral(b, i, "null") {
			return false, object
		}
		i += 4
	case c == '-' || (c >= '0' && c <= '9'):
		if i = scanJSONNumber(b, i); i < 0 {
			return false, object
		}
	default:
		return false, object
	}
end:
	// A value ended at i.
	if len(stack) == 1 && member >= 0 {
		found([2]int{member, i})
		member = -1
	}
	i = skipJSONSpace(b, i)
	if len(stack) == 0 {
		return i == n, object
	}
	if i >= n {
		return false, object
	}
	top = stack[len(stack)-1]
	switch {
	case b[i] == ',':
		i = skipJSONSpace(b, i+1)
		if top == '{' {
			goto key
		}
		goto value
	case (top == '{' && b[i] == '}') || (top == '[' && b[i] == ']'):
		stack = stack[:len(stack)-1]
		i++
		goto end
	}
	return false, object
key:
	if i >= n || b[i] != '"' {
		return false, object
	}
	{
		ks := i
		if i = scanJSONString(b, i+1); i < 0 {
			return false, object
		}
		if len(stack) == 1 && keep(b[ks+1:i-1]) {
			member = ks
		}
		i = skipJSONSpace(b, i)
		if i >= n || b[i] != ':' {
			return false, object
		}
		i = skipJSONSpace(b, i+1)
	}
	goto value
}

// skipJSONSpace returns the index of the first byte at or after i that is
// not JSON whitespace (RFC 8259 section 2: space, tab, LF, CR).
func skipJSONSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// hasLiteral reports whether b holds lit at i.
func hasLiteral(b []byte, i int, lit string) bool {
	return len(b)-i >= len(lit) && string(b[i:i+len(lit)]) == lit
}

const (
	swarOnes  = 0x0101010101010101
	swarHighs = 0x8080808080808080
)

// scanJSONString scans a string whose opening quote is at i-1 and returns
// the index after its closing quote, or -1 when it is invalid (RFC 8259
// section 7: a control character below U+0020, a bad escape, or no closing
// quote). The next quote and the next backslash are found with
// bytes.IndexByte (vectorised), each search starting where the last one
// ended, so every byte is searched at most once for each; the plain run
// before them is checked for control characters by hasControl.
func scanJSONString(b []byte, i int) int {
	n := len(b)
	// Most strings (keys, ids, short values) end within 16 bytes: two
	// words checked at once for a quote, a backslash or a control
	// character find their end without the searches' calls.
	for range 2 {
		if i+8 > n {
			break
		}
		x := binary.LittleEndian.Uint64(b[i:])
		qx := x ^ (swarOnes * '"')
		sx := x ^ (swarOnes * '\\')
		m := (((qx - swarOnes) &^ qx) | ((sx - swarOnes) &^ sx) | ((x - swarOnes*0x20) &^ x)) & swarHighs
		if m == 0 {
			i += 8
			continue
		}
		// The lowest flagged byte is the first such byte (borrows only
		// propagate upwards from a flagged byte).
		i += bits.TrailingZeros64(m) / 8
		if b[i] == '"' {
			return i + 1
		}
		break
	}
	q, bs := -1, -1 // the next '"' (n: none) and the next '\\' before q (q: none) at or after i
	for {
		if q < i {
			q = n
			if k := bytes.IndexByte(b[i:], '"'); k >= 0 {
				q = i + k
			}
		}
		if bs < i {
			bs = q
			if k := bytes.IndexByte(b[i:q], '\\'); k >= 0 {
				bs = i + k
			}
		}
		end := min(q, bs)
		if hasControl(b[i:end]) {
			return -1
		}
		i = end
		if i >= n {
			return -1
		}
		if b[i] == '"' {
			return i + 1
		}
		// b[i] is a backslash.
		i++
		if i >= n {
			return -1
		}
		switch b[i] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			i++
		case 'u':
			if n-i < 5 {
				return -1
			}
			for _, h := range b[i+1 : i+5] {
				if !isHexDigit(h) {
					return -1
				}
			}
			i += 5
		default:
			return -1
		}
	}
}

// hasControl reports whether s holds a byte below 0x20, 32 bytes at a
// time: a word x has one exactly when (x - 0x20 in every byte) &^ x has a
// byte's high bit set (the "has less than" word trick, exact for bounds up
// to 0x80).
func hasControl(s []byte) bool {
	i := 0
	for ; i+32 <= len(s); i += 32 {
		x0 := binary.LittleEndian.Uint64(s[i:])
		x1 := binary.LittleEndian.Uint64(s[i+8:])
		x2 := binary.LittleEndian.Uint64(s[i+16:])
		x3 := binary.LittleEndian.Uint64(s[i+24:])
		m := ((x0 - swarOnes*0x20) &^ x0) | ((x1 - swarOnes*0x20) &^ x1) | ((x2 - swarOnes*0x20) &^ x2) | ((x3 - swarOnes*0x20) &^ x3)
		if m&swarHighs != 0 {
			return true
		}
	}
	for ; i+8 <= len(s); i += 8 {
		x := binary.LittleEndian.Uint64(s[i:])
		if ((x-swarOnes*0x20)&^x)&swarHighs != 0 {
			return true
		}
	}
	for ; i < len(s); i++ {
		if s[i] < 0x20 {
			return true
		}
	}
	return false
}

func isHexDigit(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// scanJSONNumber scans a number starting at i and returns the index after
// it, or -1 when it is invalid (RFC 8259 section 6: -?(0|[1-9][0-9]*)
// (.[0-9]+)?([eE][+-]?[0-9]+)?).
func scanJSONNumber(b []byte, i int) int {
	n := len(b)
	if b[i] == '-' {
		i++
	}
	if i >= n {
		return -1
	}
	switch {
	case b[i] == '0':
		i++
	case b[i] >= '1' && b[i] <= '9':
		i = skipDigits(b, i+1)
	default:
		return -1
	}
	if i < n && b[i] == '.' {
		j := skipDigits(b, i+1)
		if j == i+1 {
			return -1
		}
		i = j
	}
	if i < n && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < n && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := skipDigits(b, i)
		if j == i {
			return -1
		}
		i = j
	}
	return i
}

func skipDigits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}
