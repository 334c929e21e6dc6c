package gateway

import (
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
	ok, obj := scanJSON(b, usageKeyCandidate, &cands)
	if !ok || !obj || len(cands) == 0 {
		// A valid body that is not an object, or an object without a
		// usage member, has no usage (json.Unmarshal into a struct fails or
		// leaves Usage nil).
		return limiter.Usage{}, ok
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
// appends to cands the span (from the key's opening quote to the end of the
// value) of every top-level member whose raw key (between the quotes, still
// escaped) keep accepts. It is iterative: the container stack is one byte
// per level.
func scanJSON(b []byte, keep func(key []byte) bool, cands *[][2]int) (ok, object bool) {
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
		*cands = append(*cands, [2]int{member, i})
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
// quote). Runs of plain bytes are skipped 8 at a time.
func scanJSONString(b []byte, i int) int {
	n := len(b)
	for {
		for i+8 <= n {
			x := binary.LittleEndian.Uint64(b[i:])
			// High bit set in a byte that is '"', '\\' or below 0x20 (the
			// "has zero byte" and "has less than" word tricks; exact as to
			// whether any such byte is present, the lowest flagged byte is
			// the first such byte).
			q := x ^ (swarOnes * '"')
			s := x ^ (swarOnes * '\\')
			m := ((q - swarOnes) &^ q) | ((s - swarOnes) &^ s) | ((x - swarOnes*0x20) &^ x)
			m &= swarHighs
			if m == 0 {
				i += 8
				continue
			}
			i += bits.TrailingZeros64(m) / 8
			break
		}
		if i >= n {
			return -1
		}
		switch c := b[i]; {
		case c == '"':
			return i + 1
		case c < 0x20:
			return -1
		case c == '\\':
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
		default:
			i++
		}
	}
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
