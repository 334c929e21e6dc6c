package providersim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	"github.com/tiktoken-go/tokenizer"
)

// Prompt token accounting follows OpenAI's published recipe for chat models
// (openai-cookbook, "How to count tokens with tiktoken"): every message costs
// its content tokens plus MessageOverheadTokens, a message with a "name" costs
// NameOverheadTokens more, and every reply is primed with ReplyPrimingTokens.
const (
	// MessageOverheadTokens is added per message (role and delimiters), in tokens.
	MessageOverheadTokens = 3
	// NameOverheadTokens is added per message that carries a "name", in tokens.
	NameOverheadTokens = 1
	// ReplyPrimingTokens is added once per request for the assistant reply header, in tokens.
	ReplyPrimingTokens = 3
)

var cl100k = sync.OnceValues(func() (tokenizer.Codec, error) {
	return tokenizer.Get(tokenizer.Cl100kBase)
})

// countText returns the number of cl100k_base tokens in s.
func countText(s string) (int64, error) {
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

// chatMessage is the part of an OpenAI chat message the simulator reads.
// Content is either a string or an array of content parts.
type chatMessage struct {
	Role    string          `json:"role"`
	Name    string          `json:"name,omitempty"`
	Content json.RawMessage `json:"content"`
}

// contentText extracts the text of a message's content: a JSON string, or
// the "text" of every part of an array of content parts. Null or absent
// content is empty.
func contentText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	switch raw[0] {
	case '"':
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	case '[':
		var parts []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", err
		}
		var sb strings.Builder
		for _, p := range parts {
			sb.WriteString(p.Text)
		}
		return sb.String(), nil
	default:
		return "", fmt.Errorf("content must be a string or an array of content parts")
	}
}

// promptTokens returns the prompt tokens of a chat request's messages with
// cl100k_base: the content tokens of every message plus the fixed overheads
// MessageOverheadTokens, NameOverheadTokens and ReplyPrimingTokens. It
// returns an error for content that is neither a string nor an array of parts.
func promptTokens(msgs []chatMessage) (int64, error) {
	total := int64(ReplyPrimingTokens)
	for i, m := range msgs {
		text, err := contentText(m.Content)
		if err != nil {
			return 0, fmt.Errorf("messages[%d].content: %w", i, err)
		}
		n, err := countText(text)
		if err != nil {
			return 0, fmt.Errorf("messages[%d].content: %w", i, err)
		}
		total += n + MessageOverheadTokens
		if m.Name != "" {
			total += NameOverheadTokens
		}
	}
	return total, nil
}

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
