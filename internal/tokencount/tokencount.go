// Package tokencount counts prompt tokens offline with a real tokenizer:
// cl100k_base from github.com/tiktoken-go/tokenizer, following OpenAI's
// published recipe for chat models (openai-cookbook, "How to count tokens with
// tiktoken"): every message costs its content tokens plus
// MessageOverheadTokens, a message with a "name" costs NameOverheadTokens more,
// and every reply is primed with ReplyPrimingTokens.
//
// The gateway uses it to estimate a request's prompt before admission (the
// estimate is corrected by the provider's usage afterwards: brief "cost
// model"); the provider simulator uses the same count, so the two agree.
package tokencount

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/tiktoken-go/tokenizer"
	"github.com/tiktoken-go/tokenizer/codec"
)

const (
	// MessageOverheadTokens is added per chat message (role and delimiters), in tokens.
	MessageOverheadTokens = 3
	// NameOverheadTokens is added per chat message that carries a "name", in tokens.
	NameOverheadTokens = 1
	// ReplyPrimingTokens is added once per chat request for the assistant reply header, in tokens.
	ReplyPrimingTokens = 3
)

var cl100k = sync.OnceValues(func() (tokenizer.Codec, error) {
	return codec.NewCl100kBase(), nil
})

// Load loads the cl100k_base vocabulary now if it is not loaded yet: about
// 8 MB of memory and tens of milliseconds of CPU that the first Text would
// otherwise pay, on a user's request. It fails only if the embedded
// vocabulary cannot be loaded.
func Load() error {
	_, err := cl100k()
	return err
}

// Text returns the number of cl100k_base tokens in s. It fails only if the
// embedded vocabulary cannot be loaded. s is Unicode text in UTF-8, as
// tiktoken takes (the gateway's texts are decoded from JSON); for bytes
// that are not UTF-8 the count is whatever the pattern engine makes of
// them, and has changed between its versions (TestTextMatchesGolden).
func Text(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	enc, err := cl100k()
	if err != nil {
		return 0, err
	}
	n, err := enc.Count(s)
	return int64(n), err
}

// Message is the part of an OpenAI chat message that costs prompt tokens.
// It is decoded by its UnmarshalJSON, with exact member names.
type Message struct {
	Name    string          `json:"name,omitempty"`
	Content json.RawMessage `json:"content"`
	// ToolCalls and FunctionCall are an assistant message's "tool_calls" and
	// legacy "function_call", as raw JSON (nil when absent): calls the
	// model made, sent back in the conversation, which the provider bills as
	// prompt tokens (counted by their JSON text, see JSONText).
	ToolCalls    json.RawMessage `json:"tool_calls,omitempty"`
	FunctionCall json.RawMessage `json:"function_call,omitempty"`
}

// UnmarshalJSON decodes a chat message as the providers' APIs read it, with
// exact, case-sensitive member names: "content", "tool_calls" and
// "function_call" are kept as their raw JSON values, "name" must be a
// string or null (no name), the last of duplicate
// members wins (as in the providers' JSON decoders) and every other member
// is ignored. JSON null leaves m as it is; any other value that is not an
// object is an error. encoding/json's own struct decoding would also take "Content" or
// "NAME", so that a message carrying a long "content" and a short
// "Content" would be counted by the short one while the provider reads the
// long one.
func (m *Message) UnmarshalJSON(data []byte) error {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(data, &members); err != nil {
		return err
	}
	if c, ok := members["content"]; ok {
		m.Content = c
	}
	if c, ok := members["tool_calls"]; ok {
		m.ToolCalls = c
	}
	if c, ok := members["function_call"]; ok {
		m.FunctionCall = c
	}
	if n, ok := members["name"]; ok {
		m.Name = ""
		if !isNull(n) {
			if err := json.Unmarshal(n, &m.Name); err != nil {
				return fmt.Errorf("name: %w", err)
			}
		}
	}
	return nil
}

// JSONText is the text that stands for a JSON value in a prompt estimate:
// the value in compact form (insignificant whitespace removed, RFC 8259
// section 2), or "" for an absent or null value. Tool definitions and tool
// calls reach the model in a rendering of their own, which providers do not
// publish; the tokens of their JSON text are an estimate of the same order,
// corrected by the provider's usage when the call ends (brief "cost
// model"). An invalid value is returned as it is.
func JSONText(raw json.RawMessage) string {
	if len(raw) == 0 || isNull(raw) {
		return ""
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return string(raw)
	}
	return b.String()
}

// Tools returns the prompt tokens of a chat request's tool definitions
// ("tools", or the legacy "functions"), each raw JSON or nil: the
// cl100k_base tokens of their JSON text (JSONText). It fails only if the
// embedded vocabulary cannot be loaded.
func Tools(defs ...json.RawMessage) (int64, error) {
	var total int64
	for _, d := range defs {
		n, err := Text(JSONText(d))
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// isNull reports whether raw is the JSON literal null.
func isNull(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

// Chat returns the prompt tokens of chat messages: content tokens, the
// tokens of each message's tool_calls and function_call JSON text (Tools),
// plus the fixed overheads above. It returns an error naming the message whose content
// is neither a string, an array of content parts, nor null.
func Chat(msgs []Message) (int64, error) {
	total := int64(ReplyPrimingTokens)
	for i, m := range msgs {
		text, err := ContentText(m.Content)
		if err != nil {
			return 0, fmt.Errorf("messages[%d].content: %w", i, err)
		}
		n, err := Text(text)
		if err != nil {
			return 0, fmt.Errorf("messages[%d].content: %w", i, err)
		}
		total += n + MessageOverheadTokens
		if m.Name != "" {
			total += NameOverheadTokens
		}
		calls, err := Tools(m.ToolCalls, m.FunctionCall)
		if err != nil {
			return 0, fmt.Errorf("messages[%d].tool_calls: %w", i, err)
		}
		total += calls
	}
	return total, nil
}

// ErrContent is returned for message content of another JSON type.
var ErrContent = errors.New("content must be a string or an array of content parts")

// ContentText extracts the text of a message's content: a JSON string, or the
// "text" of every part of an array of content parts (other parts, such as
// images, count nothing). Null or absent content (an assistant message with
// tool calls) is empty. A part's "text" is matched exactly, as the
// providers match it ("TEXT" is not its text); it must be a string or null.
// A part that is neither an object nor null is an error.
func ContentText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	switch raw[0] {
	case '"':
		if s, ok := PlainJSONString(raw); ok {
			return s, nil
		}
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	case '[':
		var parts []map[string]json.RawMessage
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", err
		}
		var sb strings.Builder
		for i, p := range parts {
			t, ok := p["text"]
			if !ok || isNull(t) {
				continue
			}
			s, ok := PlainJSONString(t)
			if !ok {
				if err := json.Unmarshal(t, &s); err != nil {
					return "", fmt.Errorf("part %d: text: %w", i, err)
				}
			}
			sb.WriteString(s)
		}
		return sb.String(), nil
	}
	return "", ErrContent
}

// PlainJSONString returns the value of the JSON string raw when it has no
// escapes, no control characters and valid UTF-8, so that its value is its
// bytes (what json.Unmarshal would return, without its decoder); otherwise
// ok is false and the caller decodes it with encoding/json (RFC 8259
// section 7).
func PlainJSONString(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", false
	}
	in := raw[1 : len(raw)-1]
	ascii := true
	for _, c := range in {
		if c < 0x20 || c == '\\' || c == '"' {
			return "", false
		}
		if c >= utf8.RuneSelf {
			ascii = false
		}
	}
	if !ascii && !utf8.Valid(in) {
		return "", false
	}
	return string(in), true
}
