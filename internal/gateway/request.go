package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"unicode/utf8"

	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/tokencount"
)

// OpenAI endpoints the gateway serves and proxies.
const (
	endpointChat        = "/v1/chat/completions"
	endpointCompletions = "/v1/completions"
	endpointEmbeddings  = "/v1/embeddings"
)

// request is a parsed OpenAI request: the fields the gateway reads, their
// raw JSON values, and the body, sent upstream unchanged unless a field
// must be added (upstreamBody).
type request struct {
	endpoint string
	model    string
	stream   bool
	// clientUsage: the client asked for the streaming usage chunk
	// (stream_options.include_usage).
	clientUsage bool
	// askUsage: the gateway adds stream_options.include_usage upstream (a
	// stream whose client did not ask, on a pool whose streamUsage is
	// IncludeUsage).
	askUsage bool
	// promptTokens estimated with cl100k_base; maxOutput is the output
	// reservation (BC-28b/c), times n choices.
	promptTokens, maxOutput int64
	// defaultMaxOutput: the request set no max output, so the pool's
	// defaultMaxOutputTokens was charged (BC-28c).
	defaultMaxOutput bool
	// perChoice is the output reservation of one choice and choices the n
	// of the request (maxOutput = perChoice * choices).
	perChoice, choices int64
	// injectMax: the request set no max output and the tenant's plan caps
	// it, so perChoice is sent upstream as the request's output limit.
	injectMax bool
	// wouldRefuse: the code Enforce would have refused the request with
	// before admission (a DryRun tenant's request over its output cap).
	wouldRefuse string
	fields      requestFields
	body        []byte
}

// requestFields holds the raw JSON values of the top-level members of a
// request body that parseRequest reads; nil when the member is absent. As
// when a body is decoded into a map, keys match exactly once unescaped
// (case-sensitive) and the last of duplicate members wins.
type requestFields struct {
	model, stream, streamOptions, messages, prompt, input json.RawMessage
	maxTokens, maxCompletionTokens, n, bestOf             json.RawMessage
	tools, functions                                      json.RawMessage
}

// set records value as the member named key (unescaped); other names are
// ignored.
func (f *requestFields) set(key string, value json.RawMessage) {
	switch key {
	case "model":
		f.model = value
	case "stream":
		f.stream = value
	case "stream_options":
		f.streamOptions = value
	case "messages":
		f.messages = value
	case "prompt":
		f.prompt = value
	case "input":
		f.input = value
	case "max_tokens":
		f.maxTokens = value
	case "max_completion_tokens":
		f.maxCompletionTokens = value
	case "n":
		f.n = value
	case "best_of":
		f.bestOf = value
	case "tools":
		f.tools = value
	case "functions":
		f.functions = value
	}
}

// requestKeyCandidate reports whether the raw (still escaped) top-level key
// k may name a member requestFields keeps: one of its names as written, or
// any key with an escape (which may unescape to one). It is a cheap filter
// before requestKeyName.
func requestKeyCandidate(k []byte) bool {
	switch string(k) {
	case "model", "stream", "stream_options", "messages", "prompt", "input", "max_tokens", "max_completion_tokens", "n",
		"best_of", "tools", "functions":
		return true
	}
	return bytes.IndexByte(k, '\\') >= 0
}

// requestKeyName returns the raw key k unescaped into buf when it may name a
// requestFields member: every character in [a-z_], written as is or as the
// escape \u00XX (the only JSON escape that yields them: RFC 8259 section
// 7), at most len(buf) of them; ok is false for any other key, which names
// no member. It allocates nothing, whatever the number of members (a body
// of 8 MiB of escaped keys once cost hundreds of MB through json.Unmarshal
// of each key).
func requestKeyName(k []byte, buf *[24]byte) (name []byte, ok bool) {
	n := 0
	for i := 0; i < len(k); {
		c := k[i]
		if c == '\\' {
			if len(k)-i < 6 || k[i+1] != 'u' || k[i+2] != '0' || k[i+3] != '0' {
				return nil, false
			}
			hi, lo := hexValue(k[i+4]), hexValue(k[i+5])
			if hi < 0 || lo < 0 {
				return nil, false
			}
			c, i = byte(hi<<4|lo), i+6
		} else {
			i++
		}
		if n == len(buf) || !(c == '_' || 'a' <= c && c <= 'z') {
			return nil, false
		}
		buf[n] = c
		n++
	}
	return buf[:n], true
}

// isJSONNull reports whether raw, a JSON value, is the literal null.
func isJSONNull(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

// hexValue is the value of the hexadecimal digit c, or -1.
func hexValue(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// decodeRequestFields validates body as one JSON object (encoding/json's
// grammar, scanJSON) and reads the members requestFields keeps, in one
// pass, without building a map of every member and without allocating per
// member (a body of many duplicate or escaped keys costs no more than any
// other of its size); ok is false when body is not valid JSON or not an
// object (f may then be partly set).
func decodeRequestFields(body []byte, f *requestFields) (ok bool) {
	var buf [24]byte
	valid, obj := scanJSON(body, requestKeyCandidate, func(c [2]int) {
		ke := scanJSONString(body, c[0]+1)                   // just past the key's closing quote
		vs := skipJSONSpace(body, skipJSONSpace(body, ke)+1) // past the colon
		if name, ok := requestKeyName(body[c[0]+1:ke-1], &buf); ok {
			f.set(string(name), json.RawMessage(body[vs:c[1]]))
		}
	})
	return valid && obj
}

// codeBodyTimeout refuses a request whose body was not received within the
// gateway's body read timeout (408).
const codeBodyTimeout = "body_timeout"

// readBody reads at most limit bytes of the request body: 413
// body_too_large beyond it. A body whose Content-Length already exceeds
// limit is refused before any of it is read; a chunked or unannounced body
// is read up to limit+1 bytes and no further (net/http then closes the
// connection instead of draining the rest). A body that breaks off is 400
// invalid_request; one not received before the read deadline is 408
// body_timeout.
func readBody(r *http.Request, limit int64) ([]byte, *apiError) {
	tooLarge := &apiError{status: http.StatusRequestEntityTooLarge, typ: typeInvalidRequest, code: codeBodyTooLarge,
		message: fmt.Sprintf("The request body exceeds %d bytes.", limit)}
	if r.ContentLength > limit {
		return nil, tooLarge
	}
	b, err := readAllLimit(r.Body, r.ContentLength, limit)
	if err != nil {
		if isTimeout(err) {
			return nil, &apiError{status: http.StatusRequestTimeout, typ: typeInvalidRequest, code: codeBodyTimeout,
				message: "The request body was not received in time."}
		}
		return nil, badRequest(codeInvalidRequest, "Reading the request body failed.")
	}
	if int64(len(b)) > limit {
		return nil, tooLarge
	}
	return b, nil
}

// readAllLimit reads body as io.ReadAll(io.LimitReader(body, limit+1))
// does (at most limit+1 bytes, until EOF or the first error, returned with
// the bytes read). The buffer follows the bytes that arrive, not the
// announced contentLength (bytes; -1 when unknown): it starts at
// min(contentLength+1, initialBodyBuffer) and doubles, but a doubling never
// passes contentLength+1 when that is within limit, so a body that arrives
// as announced ends with one exact allocation instead of append's slack. A
// client that announces 8 MiB and sends a few bytes holds at most
// initialBodyBuffer (before, io.ReadAll held only what arrived; sizing the
// buffer from Content-Length alone let such a client pin 8 MiB per
// connection until the body read timeout).
func readAllLimit(body io.Reader, contentLength, limit int64) ([]byte, error) {
	want := -1 // contentLength+1 when known and within limit
	if contentLength >= 0 && contentLength <= limit {
		want = int(contentLength) + 1 // and the final EOF read
	}
	size := 512
	if want > 0 {
		size = min(want, initialBodyBuffer)
	}
	b := make([]byte, 0, size)
	lr := io.LimitedReader{R: body, N: limit + 1}
	for {
		if len(b) == cap(b) {
			next := 2 * cap(b)
			if want > cap(b) && want < next {
				next = want
			}
			nb := make([]byte, len(b), next)
			copy(nb, b)
			b = nb
		}
		n, err := lr.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err != nil {
			if err == io.EOF {
				err = nil
			}
			return b, err
		}
	}
}

// initialBodyBuffer is the most readAllLimit allocates before the bytes
// arrive: 64 KiB, larger than most chat requests, so they are read with one
// allocation.
const initialBodyBuffer = 64 << 10

// parseRequest parses an OpenAI request body for endpoint and estimates its
// cost inputs. Errors: 400 invalid_json for malformed JSON or a non-object,
// 400 invalid_request for missing or ill-typed fields, 400 model_not_found
// for a model the pool does not serve.
//
// The output reservation is the LARGER of max_completion_tokens and
// max_tokens when both are set (BC-28b: a client cannot get 4096 tokens
// charged as 1), else the one set, else the pool's defaultMaxOutputTokens
// (BC-28c); embeddings reserve no output. It is multiplied by n (choices),
// or by best_of on completions when that is larger (the provider generates
// and bills best_of completions).
func parseRequest(endpoint string, body []byte, pool *registry.PoolPolicy, pc promptCounter) (*request, *apiError) {
	req := &request{endpoint: endpoint, body: body}
	if !decodeRequestFields(body, &req.fields) {
		return nil, badRequest(codeInvalidJSON, "The request body is not a valid JSON object.")
	}
	f := &req.fields
	if err := decodeField(f.model, &req.model); err != nil || req.model == "" {
		return nil, badParam(codeInvalidRequest, "model", "The request needs a string \"model\".")
	}
	if !pool.HasModel(req.model) {
		return nil, badParam(codeModelNotFound, "model", fmt.Sprintf("The model %q is not served by this pool.", req.model))
	}
	if err := decodeField(f.stream, &req.stream); err != nil {
		return nil, badParam(codeInvalidRequest, "stream", "\"stream\" must be a boolean.")
	}
	if raw := f.streamOptions; raw != nil && req.stream && !isJSONNull(raw) {
		// Member names are exact, as the providers read them: a client's
		// "Include_Usage" does not ask for the usage chunk, so the gateway
		// still asks for it upstream (upstreamBody). null is no options.
		var so map[string]json.RawMessage
		if err := json.Unmarshal(raw, &so); err != nil {
			return nil, badParam(codeInvalidRequest, "stream_options", "\"stream_options\" must be an object.")
		}
		if v, ok := so["include_usage"]; ok && !isJSONNull(v) {
			if err := json.Unmarshal(v, &req.clientUsage); err != nil {
				return nil, badParam(codeInvalidRequest, "stream_options.include_usage", "\"stream_options.include_usage\" must be a boolean.")
			}
		}
	}
	req.askUsage = req.stream && !req.clientUsage && endpoint != endpointEmbeddings &&
		pool.StreamUsage != registry.StreamUsageCountDeltas
	var err error
	switch endpoint {
	case endpointChat:
		req.promptTokens, err = chatPromptTokens(f.messages, pc)
		if err == nil {
			// Tool definitions are prompt tokens too (tokencount.Tools).
			for _, defs := range [...]json.RawMessage{f.tools, f.functions} {
				if defs == nil {
					continue
				}
				var n int64
				if n, err = pc.text(tokencount.JSONText(defs)); err != nil {
					break
				}
				req.promptTokens += n
			}
		}
	case endpointCompletions:
		req.promptTokens, err = inputTokens(f.prompt, pc)
	case endpointEmbeddings:
		if f.input == nil || isJSONNull(f.input) {
			// Required by the embeddings API: without it the provider
			// refuses the call, so it is refused here, before admission.
			err = errors.New("the request needs \"input\"")
		} else {
			req.promptTokens, err = inputTokens(f.input, pc)
		}
	}
	if err != nil {
		return nil, badParam(codeInvalidRequest, promptParam(endpoint), err.Error())
	}
	if endpoint != endpointEmbeddings {
		var maxTokens, maxCompletion *int64
		const msg = "\"max_tokens\" and \"max_completion_tokens\" must be non-negative integers."
		if decodeField(f.maxTokens, &maxTokens) != nil || (maxTokens != nil && *maxTokens < 0) {
			return nil, badParam(codeInvalidRequest, "max_tokens", msg)
		}
		if decodeField(f.maxCompletionTokens, &maxCompletion) != nil || (maxCompletion != nil && *maxCompletion < 0) {
			return nil, badParam(codeInvalidRequest, "max_completion_tokens", msg)
		}
		switch {
		case maxTokens != nil && maxCompletion != nil:
			req.maxOutput = max(*maxTokens, *maxCompletion)
		case maxTokens != nil:
			req.maxOutput = *maxTokens
		case maxCompletion != nil:
			req.maxOutput = *maxCompletion
		default:
			req.maxOutput = pool.DefaultMaxOutputTokens
			req.defaultMaxOutput = true
		}
		var n *int64
		if decodeField(f.n, &n) != nil || (n != nil && *n < 1) {
			return nil, badParam(codeInvalidRequest, "n", "\"n\" must be a positive integer.")
		}
		// Charged for every choice asked for: the provider is sent n as
		// given (it refuses n above its own bound, which refunds in full).
		choices := int64(1)
		if n != nil {
			choices = *n
		}
		if endpoint == endpointCompletions {
			// best_of: the provider generates best_of completions server
			// side, returns n of them and bills them all (its own
			// admission estimate counts best_of too).
			var bestOf *int64
			if decodeField(f.bestOf, &bestOf) != nil || (bestOf != nil && *bestOf < 1) {
				return nil, badParam(codeInvalidRequest, "best_of", "\"best_of\" must be a positive integer.")
			}
			if bestOf != nil {
				choices = max(choices, *bestOf)
			}
		}
		// Bound before multiplying: max output x n must never wrap around
		// (2^62 x 4 would otherwise be charged as 0 or a few tokens).
		if req.maxOutput > maxRequestTokens/choices {
			return nil, &apiError{status: http.StatusRequestEntityTooLarge, typ: typeInvalidRequest, code: codeRequestTooLarge,
				message: fmt.Sprintf("Request too large: max output tokens x n exceeds %d tokens and can never be admitted. Reduce max_tokens or n.", maxRequestTokens)}
		}
		req.perChoice, req.choices = req.maxOutput, choices
		req.maxOutput *= choices
	}
	return req, nil
}

// applyPlanCap applies the tenant's spec.maxOutputTokensPerRequest (capTokens,
// provider tokens; 0 is no cap). A request that asks for more output per
// choice is refused with 400 max_tokens_too_large (issue: "a request whose
// own value exceeds the plan's cap is refused with a clear 400"). A request
// that set no output limit is charged min(pool default, cap) per choice and
// that limit is sent upstream, so the provider cannot generate more than
// was charged. For a DryRun tenant (dryRun) the refusal is not returned but
// recorded in req.wouldRefuse, and the request passes unchanged.
func (req *request) applyPlanCap(capTokens int64, dryRun bool) *apiError {
	if capTokens <= 0 || req.endpoint == endpointEmbeddings || req.perChoice <= capTokens {
		return nil
	}
	if !req.defaultMaxOutput && dryRun {
		req.wouldRefuse = codeMaxTokensTooLarge
		return nil
	}
	if !req.defaultMaxOutput {
		return &apiError{status: http.StatusBadRequest, typ: typeInvalidRequest, code: codeMaxTokensTooLarge,
			message: fmt.Sprintf("The request asks for %d output tokens per choice; the tenant's plan allows at most %d "+
				"(spec.maxOutputTokensPerRequest). Set max_completion_tokens or max_tokens to %d or less.",
				req.perChoice, capTokens, capTokens)}
	}
	req.perChoice, req.injectMax = capTokens, true
	req.maxOutput = capTokens * req.choices
	return nil
}

// explainDefault adds to a 413 request_too_large refusal of a request that
// set no max output that the pool's default was charged (BC-28c), and how
// to get under the limit: set max_tokens, or (when a limit of the tenant
// tripped, not the provider's) raise the tenant's burst. Other errors are
// returned as is.
func (req *request) explainDefault(e *apiError, pool *registry.PoolPolicy) *apiError {
	if e == nil || e.code != codeRequestTooLarge || !req.defaultMaxOutput {
		return e
	}
	out := *e
	out.message += fmt.Sprintf(" The pool's default max output of %d tokens was charged because the request set no max_tokens; set max_tokens", pool.DefaultMaxOutputTokens)
	if !e.providerLimit {
		out.message += " or raise spec.tokens.burst"
	}
	out.message += "."
	return &out
}

// promptCounter counts the prompt texts of one tenant's request: through
// the gateway's count cache, scoped by the tenant's id (tokencount.Cache:
// a conversation's earlier turns and a system prompt are tokenized once),
// or with tokencount.Text when cache is nil.
type promptCounter struct {
	cache *tokencount.Cache
	scope string
}

// promptCounter returns the counter of tenant t's prompts.
func (g *Gateway) promptCounter(t *registry.Tenant) promptCounter {
	return promptCounter{cache: g.counts, scope: t.ID}
}

// text returns the cl100k_base tokens of s (tokencount.Text's errors).
func (pc promptCounter) text(s string) (int64, error) {
	if pc.cache == nil {
		return tokencount.Text(s)
	}
	return pc.cache.Text(pc.scope, s)
}

// decodeField decodes the raw value of a member into v when present (raw
// not nil) and not null. The common shapes of the fields parseRequest reads
// (a plain string into *string, true or false into *bool, a plain integer
// into **int64) are decoded without encoding/json; the result is the same
// (raw is a value of a body scanJSON has validated), anything else is left
// to json.Unmarshal.
func decodeField(raw json.RawMessage, v any) error {
	if raw == nil || isJSONNull(raw) {
		return nil
	}
	switch p := v.(type) {
	case *string:
		if s, ok := tokencount.PlainJSONString(raw); ok {
			*p = s
			return nil
		}
	case *bool:
		switch string(raw) {
		case "true":
			*p = true
			return nil
		case "false":
			*p = false
			return nil
		}
	case **int64:
		if n, ok := plainJSONInt(raw); ok {
			*p = &n
			return nil
		}
	}
	return json.Unmarshal(raw, v)
}

// plainJSONInt returns the value of raw when it is a JSON integer of at
// most 18 digits (an optional minus sign, digits only), which cannot
// overflow an int64.
func plainJSONInt(raw []byte) (int64, bool) {
	digits := raw
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || len(digits) > 18 {
		return 0, false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	return n, err == nil
}

// chatPromptTokens estimates the prompt tokens of a chat request's messages
// with tokencount's recipe (tokencount.Chat). raw is a value of a body
// encoding/json has validated (parseRequest); its array is walked one
// element at a time (nextJSONValue) and each message decoded on its own, so
// that memory stays bounded by the largest message rather than growing
// with the number of messages (an 8 MiB body of empty messages is 2.7
// million of them), without a json.Decoder's copy of the array.
func chatPromptTokens(raw json.RawMessage, pc promptCounter) (int64, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return 0, errors.New("the request needs \"messages\"")
	}
	errShape := errors.New("\"messages\" must be an array of message objects")
	if raw[0] != '[' {
		return 0, errShape
	}
	total, count := int64(tokencount.ReplyPrimingTokens), 0
	i := skipJSONSpace(raw, 1)
	for i < len(raw) && raw[i] != ']' {
		end := nextJSONValue(raw, i)
		var m tokencount.Message
		if raw[i] != '{' || decodeMessage(raw[i:end], &m) != nil {
			return 0, errShape // null and other non-objects included: the provider refuses them
		}
		text, err := tokencount.ContentText(m.Content)
		if err == nil {
			var n int64
			if n, err = pc.text(text); err == nil {
				total += n + tokencount.MessageOverheadTokens
				if m.Name != "" {
					total += tokencount.NameOverheadTokens
				}
			}
		}
		for _, calls := range [...]json.RawMessage{m.ToolCalls, m.FunctionCall} {
			if err == nil && calls != nil {
				var n int64
				if n, err = pc.text(tokencount.JSONText(calls)); err == nil {
					total += n
				}
			}
		}
		if err != nil {
			return 0, fmt.Errorf("messages[%d].content: %w", count, err)
		}
		count++
		i = skipJSONSpace(raw, end)
		if i < len(raw) && raw[i] == ',' {
			i = skipJSONSpace(raw, i+1)
		}
	}
	if count == 0 {
		return 0, errors.New("\"messages\" must be a non-empty array of message objects")
	}
	return total, nil
}

// decodeMessage decodes one chat message (a value of a body scanJSON has
// validated) into m exactly as json.Unmarshal(raw, m) does
// (tokencount.Message.UnmarshalJSON: exact member names, as the providers
// read them). An object whose keys are plain ASCII and whose "name", if any,
// is a plain string or null is read member by member: a key equal to
// "content", "tool_calls", "function_call" or "name" sets that field (the last of duplicates wins; a null
// name is no name); the other members are skipped. Anything else (a
// key with an escape, which may unescape to a field name, or a non-ASCII
// byte; a name of another type; a value that is not an object) is left to
// json.Unmarshal.
func decodeMessage(raw []byte, m *tokencount.Message) error {
	if !decodeMessagePlain(raw, m) {
		*m = tokencount.Message{}
		return json.Unmarshal(raw, m)
	}
	return nil
}

// decodeMessagePlain is decodeMessage's member-by-member path; false when
// it does not apply (m is then partly set).
func decodeMessagePlain(raw []byte, m *tokencount.Message) bool {
	if len(raw) == 0 || raw[0] != '{' {
		return false
	}
	return eachMember(raw, func(key, value []byte) bool {
		switch {
		case string(key) == "content":
			m.Content = json.RawMessage(value)
		case string(key) == "tool_calls":
			m.ToolCalls = json.RawMessage(value)
		case string(key) == "function_call":
			m.FunctionCall = json.RawMessage(value)
		case string(key) == "name":
			m.Name = ""
			if !bytes.Equal(value, []byte("null")) {
				s, ok := tokencount.PlainJSONString(value)
				if !ok {
					return false
				}
				m.Name = s
			}
		default:
			return plainASCIIKey(key)
		}
		return true
	})
}

// eachMember calls f with the raw key (between the quotes, still escaped)
// and the value of every member of obj, an object of a body scanJSON has
// validated, in order, and stops when f returns false; it reports whether
// every call returned true.
func eachMember(obj []byte, f func(key, value []byte) bool) bool {
	i := skipJSONSpace(obj, 1)
	for i < len(obj) && obj[i] == '"' {
		ke := scanJSONString(obj, i+1)
		if ke < 0 {
			return false
		}
		vs := skipJSONSpace(obj, skipJSONSpace(obj, ke)+1) // past the colon
		ve := nextJSONValue(obj, vs)
		if !f(obj[i+1:ke-1], obj[vs:ve]) {
			return false
		}
		i = skipJSONSpace(obj, ve)
		if i < len(obj) && obj[i] == ',' {
			i = skipJSONSpace(obj, i+1)
		}
	}
	return true
}

// plainASCIIKey reports whether the raw key k has neither an escape nor a
// non-ASCII byte, so that it can match a struct field only by ASCII case
// folding (encoding/json also folds some non-ASCII letters, such as the
// Kelvin sign to k).
func plainASCIIKey(k []byte) bool {
	for _, c := range k {
		if c == '\\' || c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// asciiEqualFold reports whether the bytes k equal the lower-case ASCII
// name under ASCII case folding.
func asciiEqualFold(k []byte, name string) bool {
	if len(k) != len(name) {
		return false
	}
	for i := range len(k) {
		c := k[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != name[i] {
			return false
		}
	}
	return true
}

// nextJSONValue returns the index just past the JSON value that starts at
// b[i], for b already validated as JSON (it checks nothing): a string to
// its closing quote, an object or array to its closing bracket (strings
// inside skipped), a literal or number to the next delimiter.
func nextJSONValue(b []byte, i int) int {
	depth := 0
	for ; i < len(b); i++ {
		switch c := b[i]; c {
		case '"':
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
			if depth == 0 {
				return i + 1
			}
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i
			}
			depth--
			if depth == 0 {
				return i + 1
			}
		case ',', ' ', '\t', '\r', '\n':
			if depth == 0 {
				return i
			}
		}
	}
	return i
}

// inputTokens estimates the tokens of a completions "prompt" or embeddings
// "input": a string, an array of strings, an array of token ids, or an array
// of arrays of token ids. The shape is read from the first bytes and the
// value decoded once in that shape (decoding it in every shape in turn
// allocated several times the body for long arrays).
func inputTokens(raw json.RawMessage, pc promptCounter) (int64, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return 0, nil
	}
	errShape := errors.New("the prompt or input must be a string, an array of strings or an array of token ids")
	switch raw[0] {
	case '"':
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return 0, errShape
		}
		return pc.text(s)
	case '[':
	default:
		return 0, errShape
	}
	first := bytes.TrimLeft(raw[1:], " \t\r\n")
	if len(first) == 0 {
		return 0, errShape
	}
	switch first[0] {
	case ']':
		return 0, nil
	case '"':
		var ss []string
		if json.Unmarshal(raw, &ss) != nil {
			return 0, errShape
		}
		var total int64
		for _, s := range ss {
			n, err := pc.text(s)
			if err != nil {
				return 0, err
			}
			total += n
		}
		return total, nil
	case '[':
		var idss [][]int64
		if json.Unmarshal(raw, &idss) != nil {
			return 0, errShape
		}
		var total int64
		for _, ids := range idss {
			total += int64(len(ids))
		}
		return total, nil
	default:
		var ids []int64
		if json.Unmarshal(raw, &ids) != nil {
			return 0, errShape
		}
		return int64(len(ids)), nil
	}
}

// upstreamBody returns the body to send upstream. For a stream whose client
// did not ask for usage it sets stream_options.include_usage=true so that
// the usage chunk can refund the reservation (BC-24, BC-28a), unless the
// pool's streamUsage is CountDeltas (askUsage); injected reports whether it
// did (the usage-only chunk is then not forwarded).
//
// When the plan capped a request that set no output limit (injectMax), the
// limit is sent as max_completion_tokens on chat completions and max_tokens
// on completions.
func (req *request) upstreamBody() (body []byte, injected bool, err error) {
	injectUsage := req.askUsage
	if !injectUsage && !req.injectMax {
		return req.body, false, nil
	}
	// The rare path: every member, decoded into a map, re-encoded with the
	// added ones.
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(req.body, &fields); err != nil {
		return nil, false, err
	}
	if injectUsage {
		var so map[string]json.RawMessage
		if raw := req.fields.streamOptions; raw != nil {
			_ = json.Unmarshal(raw, &so)
		}
		if so == nil { // absent or null
			so = map[string]json.RawMessage{}
		}
		so["include_usage"] = json.RawMessage("true")
		b, err := json.Marshal(so)
		if err != nil {
			return nil, false, err
		}
		fields["stream_options"] = b
	}
	if req.injectMax {
		name := "max_tokens"
		if req.endpoint == endpointChat {
			name = "max_completion_tokens"
		}
		fields[name] = json.RawMessage(strconv.FormatInt(req.perChoice, 10))
	}
	body, err = json.Marshal(fields)
	return body, injectUsage, err
}

// promptParam is the request parameter that holds an endpoint's input:
// "messages" for chat completions, "prompt" for completions, "input" for
// embeddings.
func promptParam(endpoint string) string {
	switch endpoint {
	case endpointCompletions:
		return "prompt"
	case endpointEmbeddings:
		return "input"
	}
	return "messages"
}
