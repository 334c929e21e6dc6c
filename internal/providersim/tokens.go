package providersim

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"

	"github.com/fairshare-dev/fairshare/internal/tokencount"
)

// chatMessage is the part of an OpenAI chat message the simulator reads.
// Content is either a string or an array of content parts.
type chatMessage struct {
	Role         string          `json:"role"`
	Name         string          `json:"name,omitempty"`
	Content      json.RawMessage `json:"content"`
	ToolCalls    json.RawMessage `json:"tool_calls,omitempty"`
	FunctionCall json.RawMessage `json:"function_call,omitempty"`
}

// UnmarshalJSON reads a message as the providers and the gateway read it
// (tokencount.Message.UnmarshalJSON: exact member names, so "Content" is
// not "content"); a message that is not an object, null included, is an
// error, as the providers refuse it.
func (m *chatMessage) UnmarshalJSON(data []byte) error {
	if b := bytes.TrimSpace(data); len(b) == 0 || b[0] != '{' {
		return errors.New("each message must be an object")
	}
	var tm tokencount.Message
	if err := json.Unmarshal(data, &tm); err != nil {
		return err
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(data, &members); err != nil {
		return err
	}
	if r, ok := members["role"]; ok {
		_ = json.Unmarshal(r, &m.Role) // a role of another type is left empty
	}
	m.Name, m.Content, m.ToolCalls, m.FunctionCall = tm.Name, tm.Content, tm.ToolCalls, tm.FunctionCall
	return nil
}

// promptTokens returns the prompt tokens of a chat request's messages and
// tool definitions (tools, functions: raw JSON or nil), counted as the
// gateway counts them (package tokencount: cl100k_base, OpenAI's
// per-message overheads, tool calls and definitions by their JSON text).
// It returns an error for content that is neither a string, an array of
// parts nor null.
func promptTokens(msgs []chatMessage, tools ...json.RawMessage) (int64, error) {
	tm := make([]tokencount.Message, len(msgs))
	for i, m := range msgs {
		tm[i] = tokencount.Message{Name: m.Name, Content: m.Content, ToolCalls: m.ToolCalls, FunctionCall: m.FunctionCall}
	}
	n, err := tokencount.Chat(tm)
	if err != nil {
		return 0, err
	}
	defs, err := tokencount.Tools(tools...)
	return n + defs, err
}

// countText returns the number of cl100k_base tokens in s.
func countText(s string) (int64, error) { return tokencount.Text(s) }

// fillerWords are the deterministic generated tokens: each, with its leading
// space, is exactly one cl100k_base token, so n words are n completion tokens.
var fillerWords = []string{
	" the", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog",
	" and", " then", " runs", " far", " away", " into", " a", " green", " field",
}

// fillerToken returns the i-th generated token (0-based).
func fillerToken(i int64) string { return fillerWords[i%int64(len(fillerWords))] }

// fillerText returns the first n generated tokens concatenated.
func fillerText(n int64) string {
	var sb strings.Builder
	for i := range n {
		sb.WriteString(fillerToken(i))
	}
	return sb.String()
}
