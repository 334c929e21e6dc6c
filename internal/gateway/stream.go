package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/tokencount"
)

// streamTextBatch bounds the generated text (bytes) a stream keeps for its
// deferred token count (streamText): beyond it the text kept so far is
// counted and dropped, so a stream holds at most this much text whatever
// its length (brief "performance targets": no whole-body buffering).
const streamTextBatch = 64 << 10

// streamText is the generated text of a stream whose tokens have not been
// counted yet, and the tokens counted so far. A stream that ends without a
// usage chunk is settled from the prompt plus these output tokens (BC-23,
// BC-28a); most streams end with a usage chunk, so the text is only
// tokenized when it is needed (count) or when it reaches streamTextBatch,
// instead of once per delta (brief "performance targets": SSE frame gap).
//
// The text of the deltas is counted joined, as the provider tokenizes (and
// bills) the output it generated as one text: a word split over two deltas
// is one token, not two. Each batch boundary may split a token, counting at
// most one more than the joined text has per streamTextBatch bytes.
type streamText struct {
	buf     []byte // text not yet counted
	counted int64  // tokens of the text already counted
}

// add counts and drops the kept text once it reaches streamTextBatch.
func (s *streamText) add() {
	if len(s.buf) >= streamTextBatch {
		s.flush()
	}
}

// flush counts the kept text and drops it.
func (s *streamText) flush() {
	if len(s.buf) == 0 {
		return
	}
	if k, err := tokencount.Text(string(s.buf)); err == nil {
		s.counted += k
	} else {
		s.counted += int64(len(s.buf)) // unreachable with a loaded encoding; a byte per token bounds it
	}
	s.buf = s.buf[:0]
}

// count returns the output tokens of all the text added so far (cl100k_base,
// joined as above).
func (s *streamText) count() int64 {
	s.flush()
	return s.counted
}

// streamReadBuffer is the size (bytes) of the buffer a stream is read
// through; a longer line is read in pieces (proxyStream).
const streamReadBuffer = 32 << 10

// maxPooledStreamBuf bounds the capacity (bytes) of an event or text buffer
// kept for the next stream: a larger one (a huge event) is left to the
// garbage collector.
const maxPooledStreamBuf = 128 << 10

// streamState is the memory one proxied stream works in: its read buffer,
// the event being assembled and the text kept for its count. They are
// reused by the next stream (streamStatePool), so a stream allocates none
// of them (brief "performance targets": 512 concurrent streams).
type streamState struct {
	br    *bufio.Reader
	cr    crReader
	event []byte
	text  streamText
}

var streamStatePool = sync.Pool{New: func() any {
	return &streamState{br: bufio.NewReaderSize(nil, streamReadBuffer)}
}}

// getStreamState returns a streamState reading body, its buffers empty.
func getStreamState(body io.Reader) *streamState {
	st := streamStatePool.Get().(*streamState)
	st.cr = crReader{r: body}
	st.br.Reset(&st.cr)
	return st
}

// crReader reads an event stream so that every line ends in LF: a CR
// alone, which ends a line too (WHATWG HTML, server-sent events: lines end
// in "CRLF, LF or CR"), becomes CRLF, so that proxyStream, which splits
// lines at LF, sees each line (the client gets the same events, with CRLF
// for CR). A CR is completed at once (an LF right after it is then
// dropped), so no event is held back waiting for the next byte. A read
// without a lone CR (LF or CRLF line ends: every provider seen) is passed
// through as is, without a copy.
type crReader struct {
	r       io.Reader
	skipLF  bool   // the last byte read was a CR, completed with an LF
	pending []byte // rewritten bytes that did not fit the last read
	err     error  // the error to return once pending is drained
}

// Read implements io.Reader.
func (c *crReader) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		if len(c.pending) == 0 {
			return n, c.err
		}
		return n, nil
	}
	if c.err != nil {
		return 0, c.err
	}
	for {
		n, err := c.r.Read(p)
		if n > 0 && c.skipLF {
			c.skipLF = false
			if p[0] == '\n' {
				n = copy(p, p[1:n])
			}
		}
		if n == 0 && err == nil {
			continue
		}
		b := p[:n]
		lone := 0
		for i := bytes.IndexByte(b, '\r'); i >= 0; {
			if i+1 == len(b) || b[i+1] != '\n' {
				lone++
			}
			k := bytes.IndexByte(b[i+1:], '\r')
			if k < 0 {
				break
			}
			i += 1 + k
		}
		if lone == 0 {
			return n, err
		}
		out := make([]byte, 0, n+lone)
		for i, ch := range b {
			out = append(out, ch)
			if ch == '\r' && (i+1 == len(b) || b[i+1] != '\n') {
				out = append(out, '\n')
			}
		}
		c.skipLF = b[len(b)-1] == '\r'
		k := copy(p, out)
		if k < len(out) {
			c.pending, c.err = out[k:], err
			return k, nil
		}
		return k, err
	}
}

// putStreamState gives st back for reuse; st must not be used afterwards.
func putStreamState(st *streamState) {
	st.cr = crReader{}
	st.br.Reset(nil)
	if cap(st.event) > maxPooledStreamBuf {
		st.event = nil
	}
	st.event = st.event[:0]
	if cap(st.text.buf) > maxPooledStreamBuf {
		st.text.buf = nil
	}
	st.text = streamText{buf: st.text.buf[:0]}
	streamStatePool.Put(st)
}

// eventInfo is what proxyStream needs from one SSE event.
type eventInfo struct {
	usage     limiter.Usage // the event's usage; Known when it carried one
	usageOnly bool          // the data line with the usage had no choices (OpenAI's final usage chunk)
}

// scanEvent reads one SSE event's usage and generated text as decoding each
// of its data lines with encoding/json does (decodeChunkJSON), in one pass
// per line and without allocating for the chunks providers send (brief
// "performance targets": SSE frame gap). usage is that of the first data
// line holding a JSON object with a non-null usage whose prompt_tokens is
// not null (only when the event contains `"usage"`; BC-24); when text is
// not nil, the generated text of every data line that decodes as a
// streaming chunk (per choice: text, delta content, refusal, reasoning
// content, then tool-call arguments) is appended to *text (only when the
// event contains `"choices"`; BC-23, BC-28a). A data line is read by
// scanChunk, which gives up on any shape it does not take on itself, and is
// then decoded with encoding/json, so the result is always encoding/json's
// (FuzzScanEvent).
func scanEvent(event []byte, text *[]byte) (info eventInfo) {
	// The two gates are only looked up for a line left to encoding/json:
	// a line scanChunk reads itself has a usage or text only under the
	// keys "usage" and "choices" spelt exactly, so the event holds them.
	gates := false
	var wantUsage, wantText bool
	for line := range bytes.Lines(event) {
		data, found := bytes.CutPrefix(trimEOL(line), []byte("data:"))
		if !found {
			continue
		}
		data = bytes.TrimSpace(data)
		if len(data) == 0 || data[0] != '{' {
			continue
		}
		mark := 0
		if text != nil {
			mark = len(*text)
		}
		var r chunkResult
		if !scanChunk(data, text, &r) {
			if !gates {
				gates = true
				wantUsage = bytes.Contains(event, []byte(`"usage"`))
				wantText = text != nil && bytes.Contains(event, []byte(`"choices"`))
			}
			var tp *[]byte
			if wantText {
				tp = text
				*tp = (*tp)[:mark]
			} else if text != nil {
				*text = (*text)[:mark]
			}
			r = decodeChunkJSON(data, tp)
			if !wantUsage {
				r.usageOK = false
			}
		}
		if text != nil && !r.deltaOK {
			*text = (*text)[:mark]
		}
		if !info.usage.Known && r.usageOK && r.usage.Known {
			info.usage, info.usageOnly = r.usage, r.choices == 0
		}
	}
	return info
}

// chunkResult is one data line decoded as eventUsage and deltaTokens
// decoded it.
type chunkResult struct {
	usageOK bool          // json.Unmarshal into {choices []RawMessage; usage *usageJSON} succeeded
	usage   limiter.Usage // that usage (Known when usage and its prompt_tokens were not null)
	choices int           // the length of its choices
	deltaOK bool          // json.Unmarshal into streamChunk succeeded (the text appended counts)
}

// decodeChunkJSON decodes one data line with encoding/json, appending its
// generated text to *text when text is not nil.
func decodeChunkJSON(data []byte, text *[]byte) (r chunkResult) {
	var uc struct {
		Choices []json.RawMessage `json:"choices"`
		Usage   *usageJSON        `json:"usage"`
	}
	if json.Unmarshal(data, &uc) == nil {
		r.usageOK, r.usage, r.choices = true, uc.Usage.usage(), len(uc.Choices)
	}
	if text == nil {
		return r
	}
	var ch streamChunk
	if json.Unmarshal(data, &ch) != nil {
		return r
	}
	r.deltaOK = true
	for _, c := range ch.Choices {
		*text = append(*text, c.Text...)
		*text = append(*text, c.Delta.Content...)
		*text = append(*text, c.Delta.Refusal...)
		*text = append(*text, c.Delta.ReasoningContent...)
		for _, tc := range c.Delta.ToolCalls {
			*text = append(*text, tc.Function.Arguments...)
		}
		*text = append(*text, c.Delta.FunctionCall.Arguments...)
	}
	return r
}

// maxScanDepth bounds the nesting scanChunk skips on its own; deeper values
// are left to encoding/json.
const maxScanDepth = 64

// chunkScanner reads one streaming chunk strictly: any key with an escape
// or a non-ASCII byte, a key that matches a field only case-insensitively,
// a repeated field, a value of another type than the field's, a usage
// number that is not a plain int64, or nesting deeper than maxScanDepth
// makes it give up (ok false) so that encoding/json decides.
type chunkScanner struct {
	b    []byte
	i    int
	text *[]byte // nil: the text is not collected
	fail bool
}

// scanChunk reads the data line b (a JSON object, leading and trailing
// space trimmed) into r and appends its text to *text (text may be nil); ok
// false means it gave up and r and *text must not be used.
func scanChunk(b []byte, text *[]byte, r *chunkResult) (ok bool) {
	s := chunkScanner{b: b, text: text}
	seen := 0
	s.object(func(key []byte) {
		switch s.field(key, "usage", "choices") {
		case 0:
			if seen&1 != 0 {
				s.fail = true
				return
			}
			seen |= 1
			r.usage = s.usage()
		case 1:
			if seen&2 != 0 {
				s.fail = true
				return
			}
			seen |= 2
			r.choices = s.choicesArray()
		default:
			s.skip()
		}
	})
	if s.fail || skipJSONSpace(b, s.i) != len(b) {
		return false
	}
	r.usageOK, r.deltaOK = true, true
	return true
}

// field returns the index of the name among names that key spells exactly,
// -1 when it is none of them; a key that matches one only under
// encoding/json's case-insensitive rule, or that has an escape or a
// non-ASCII byte, fails the scan.
func (s *chunkScanner) field(key []byte, names ...string) int {
	for _, c := range key {
		if c == '\\' || c >= 0x80 {
			s.fail = true
			return -1
		}
	}
	for j, n := range names {
		if string(key) == n {
			return j
		}
		if len(key) == len(n) && asciiFoldEqual(key, n) {
			s.fail = true
			return -1
		}
	}
	return -1
}

func asciiFoldEqual(k []byte, n string) bool {
	for i := range k {
		a, b := k[i], n[i]
		if 'A' <= a && a <= 'Z' {
			a += 'a' - 'A'
		}
		if 'A' <= b && b <= 'Z' {
			b += 'a' - 'A'
		}
		if a != b {
			return false
		}
	}
	return true
}

// object reads an object at s.i (after space), calling member with each
// raw key with s.i at its value; member must read the value.
func (s *chunkScanner) object(member func(key []byte)) {
	b := s.b
	s.i = skipJSONSpace(b, s.i)
	if s.i >= len(b) || b[s.i] != '{' {
		s.fail = true
		return
	}
	s.i = skipJSONSpace(b, s.i+1)
	if s.i < len(b) && b[s.i] == '}' {
		s.i++
		return
	}
	for !s.fail {
		if s.i >= len(b) || b[s.i] != '"' {
			s.fail = true
			return
		}
		ks := s.i + 1
		e := scanJSONString(b, ks)
		if e < 0 {
			s.fail = true
			return
		}
		key := b[ks : e-1]
		s.i = skipJSONSpace(b, e)
		if s.i >= len(b) || b[s.i] != ':' {
			s.fail = true
			return
		}
		s.i = skipJSONSpace(b, s.i+1)
		member(key)
		if s.fail {
			return
		}
		s.i = skipJSONSpace(b, s.i)
		if s.i >= len(b) {
			s.fail = true
			return
		}
		switch b[s.i] {
		case ',':
			s.i = skipJSONSpace(b, s.i+1)
		case '}':
			s.i++
			return
		default:
			s.fail = true
			return
		}
	}
}

// array reads an array at s.i, calling elem with s.i at each element; elem
// must read it.
func (s *chunkScanner) array(elem func()) {
	b := s.b
	if s.i >= len(b) || b[s.i] != '[' {
		s.fail = true
		return
	}
	s.i = skipJSONSpace(b, s.i+1)
	if s.i < len(b) && b[s.i] == ']' {
		s.i++
		return
	}
	for !s.fail {
		elem()
		if s.fail {
			return
		}
		s.i = skipJSONSpace(b, s.i)
		if s.i >= len(b) {
			s.fail = true
			return
		}
		switch b[s.i] {
		case ',':
			s.i = skipJSONSpace(b, s.i+1)
		case ']':
			s.i++
			return
		default:
			s.fail = true
			return
		}
	}
}

// null reads a null at s.i when there is one.
func (s *chunkScanner) null() bool {
	if hasLiteral(s.b, s.i, "null") {
		s.i += 4
		return true
	}
	return false
}

// usage reads a usage value: null or an object whose prompt_tokens,
// completion_tokens and total_tokens are null or int64 numbers.
func (s *chunkScanner) usage() (u limiter.Usage) {
	if s.null() {
		return u
	}
	var prompt, completion, total *int64
	var pv, cv, tv int64
	seen := 0
	s.object(func(key []byte) {
		j := s.field(key, "prompt_tokens", "completion_tokens", "total_tokens")
		if j < 0 {
			s.skip()
			return
		}
		if seen&(1<<j) != 0 {
			s.fail = true
			return
		}
		seen |= 1 << j
		if s.null() {
			return
		}
		v, ok := s.int64()
		if !ok {
			s.fail = true
			return
		}
		switch j {
		case 0:
			pv, prompt = v, &pv
		case 1:
			cv, completion = v, &cv
		default:
			tv, total = v, &tv
		}
	})
	return usageOf(prompt, completion, total)
}

// int64 reads a number at s.i that is an integer within int64 (what
// encoding/json stores in an int64 without error).
func (s *chunkScanner) int64() (int64, bool) {
	b := s.b
	start := s.i
	if s.i >= len(b) {
		return 0, false
	}
	e := scanJSONNumber(b, s.i)
	if e < 0 {
		return 0, false
	}
	v, err := strconv.ParseInt(string(b[start:e]), 10, 64)
	if err != nil {
		return 0, false
	}
	s.i = e
	return v, true
}

// span is the [start, end) of a value in the scanned line; end 0: none.
type span struct{ start, end int }

// choice pieces, in the order decodeChunkJSON appends them.
const (
	pieceText = iota
	pieceContent
	pieceRefusal
	pieceReasoning
	pieceToolCalls    // the tool_calls array
	pieceFunctionCall // the arguments of the legacy function_call
	nPieces
)

// choicesArray reads choices (null or an array of null or choice objects)
// and returns its length; each choice's text is appended in
// decodeChunkJSON's order (text, content, refusal, reasoning content, the
// tool-call arguments, then the legacy function_call's arguments).
func (s *chunkScanner) choicesArray() (n int) {
	if s.null() {
		return 0
	}
	s.array(func() {
		n++
		if s.null() {
			return
		}
		var pieces [nPieces]span
		seen := 0
		s.object(func(key []byte) {
			j := s.field(key, "text", "delta")
			if j < 0 {
				s.skip()
				return
			}
			if seen&(1<<j) != 0 {
				s.fail = true
				return
			}
			seen |= 1 << j
			if j == 0 {
				pieces[pieceText] = s.str()
			} else {
				s.delta(&pieces)
			}
		})
		if s.fail || s.text == nil {
			return
		}
		for _, p := range pieces[:pieceToolCalls] {
			if p.end > 0 {
				s.appendStr(s.b[p.start:p.end])
			}
		}
		if p := pieces[pieceToolCalls]; p.end > 0 {
			end := s.i
			s.i = p.start
			s.toolCalls(true)
			s.i = end
		}
		if p := pieces[pieceFunctionCall]; p.end > 0 {
			s.appendStr(s.b[p.start:p.end])
		}
	})
	return n
}

// delta reads a delta: null or an object of content, refusal and
// reasoning_content (null or strings), tool_calls (null or an array of
// null or objects whose function is null or an object whose arguments is
// null or a string) and function_call (null or an object whose arguments
// is null or a string), noting their spans in pieces.
func (s *chunkScanner) delta(pieces *[nPieces]span) {
	if s.null() {
		return
	}
	seen := 0
	s.object(func(key []byte) {
		j := s.field(key, "content", "refusal", "reasoning_content", "tool_calls", "function_call")
		if j < 0 {
			s.skip()
			return
		}
		if seen&(1<<j) != 0 {
			s.fail = true
			return
		}
		seen |= 1 << j
		if j < 3 {
			pieces[pieceContent+j] = s.str()
			return
		}
		if s.null() {
			return
		}
		if j == 4 {
			s.oneField("arguments", func() { pieces[pieceFunctionCall] = s.str() })
			return
		}
		start := s.i
		s.toolCalls(false)
		pieces[pieceToolCalls] = span{start, s.i}
	})
}

// toolCalls reads a tool_calls array, appending its arguments to the text
// when collect is set (and the text is collected).
func (s *chunkScanner) toolCalls(collect bool) {
	s.array(func() {
		if s.null() {
			return
		}
		s.oneField("function", func() {
			if s.null() {
				return
			}
			s.oneField("arguments", func() {
				if p := s.str(); collect && p.end > 0 && s.text != nil {
					s.appendStr(s.b[p.start:p.end])
				}
			})
		})
	})
}

// oneField reads an object in which the field name is read by read, other
// members skipped.
func (s *chunkScanner) oneField(name string, read func()) {
	seen := false
	s.object(func(key []byte) {
		if s.field(key, name) < 0 {
			s.skip()
			return
		}
		if seen {
			s.fail = true
			return
		}
		seen = true
		read()
	})
}

// str reads a string or null at s.i and returns the string token's span
// (end 0 for null).
func (s *chunkScanner) str() span {
	if s.null() {
		return span{}
	}
	b := s.b
	if s.i >= len(b) || b[s.i] != '"' {
		s.fail = true
		return span{}
	}
	e := scanJSONString(b, s.i+1)
	if e < 0 {
		s.fail = true
		return span{}
	}
	p := span{s.i, e}
	s.i = e
	return p
}

// appendStr appends the value of the string token tok (quotes included),
// as encoding/json decodes it, to the text.
func (s *chunkScanner) appendStr(tok []byte) {
	raw := tok[1 : len(tok)-1]
	plain, ascii := true, true
	for _, c := range raw {
		if c == '\\' {
			plain = false
			break
		}
		if c >= 0x80 {
			ascii = false
		}
	}
	if plain && (ascii || utf8.Valid(raw)) {
		*s.text = append(*s.text, raw...)
		return
	}
	// Escapes or invalid UTF-8: encoding/json's unquoting (which replaces
	// invalid UTF-8 and lone surrogates with U+FFFD).
	var v string
	if json.Unmarshal(tok, &v) != nil {
		s.fail = true
		return
	}
	*s.text = append(*s.text, v...)
}

// skip reads and validates any JSON value at s.i.
func (s *chunkScanner) skip() {
	b := s.b
	var stack [maxScanDepth]byte
	depth := 0
	for {
		if s.i >= len(b) {
			s.fail = true
			return
		}
		switch c := b[s.i]; {
		case c == '{' || c == '[':
			if depth == maxScanDepth {
				s.fail = true
				return
			}
			stack[depth] = c
			depth++
			s.i = skipJSONSpace(b, s.i+1)
			if s.i < len(b) && (c == '{' && b[s.i] == '}' || c == '[' && b[s.i] == ']') {
				depth--
				s.i++
				break
			}
			if c == '{' {
				if !s.key() {
					return
				}
			}
			continue
		case c == '"':
			if s.i = scanJSONString(b, s.i+1); s.i < 0 {
				s.i = len(b)
				s.fail = true
				return
			}
		case c == 't' && hasLiteral(b, s.i, "true"):
			s.i += 4
		case c == 'f' && hasLiteral(b, s.i, "false"):
			s.i += 5
		case c == 'n' && hasLiteral(b, s.i, "null"):
			s.i += 4
		case c == '-' || (c >= '0' && c <= '9'):
			if s.i = scanJSONNumber(b, s.i); s.i < 0 {
				s.i = len(b)
				s.fail = true
				return
			}
		default:
			s.fail = true
			return
		}
		// A value ended at s.i: close containers, or go to the next value.
		for {
			if depth == 0 {
				return
			}
			s.i = skipJSONSpace(b, s.i)
			if s.i >= len(b) {
				s.fail = true
				return
			}
			top := stack[depth-1]
			c := b[s.i]
			if c == ',' {
				s.i = skipJSONSpace(b, s.i+1)
				if top == '{' && !s.key() {
					return
				}
				break
			}
			if top == '{' && c == '}' || top == '[' && c == ']' {
				depth--
				s.i++
				continue
			}
			s.fail = true
			return
		}
	}
}

// key reads an object key and its colon at s.i, leaving s.i at the value.
func (s *chunkScanner) key() bool {
	b := s.b
	if s.i >= len(b) || b[s.i] != '"' {
		s.fail = true
		return false
	}
	e := scanJSONString(b, s.i+1)
	if e < 0 {
		s.fail = true
		return false
	}
	s.i = skipJSONSpace(b, e)
	if s.i >= len(b) || b[s.i] != ':' {
		s.fail = true
		return false
	}
	s.i = skipJSONSpace(b, s.i+1)
	return true
}
