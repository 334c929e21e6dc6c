package tokencount

import (
	"encoding/json"
	"errors"
	"testing"
)

func TestText(t *testing.T) {
	// U+FFFD is what JSON decoding makes of bytes that are not UTF-8 in a
	// client's text (the same counts under regexp2 v2.5.1 and v2.13.0).
	for s, want := range map[string]int64{"": 0, "hello": 1, "hello world": 2, " the quick brown fox": 4,
		"\uFFFD": 1, "\uFFFD\uFFFD": 1, "a\uFFFDb": 3, " \uFFFD": 1, "caf\uFFFD au lait": 5} {
		if got, err := Text(s); err != nil || got != want {
			t.Errorf("Text(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
}

func TestChat(t *testing.T) {
	msgs := []Message{
		{Content: json.RawMessage(`"hello world"`)},                                 // 2 + 3
		{Name: "bob", Content: json.RawMessage(`[{"type":"text","text":"hello"}]`)}, // 1 + 3 + 1
		{Content: json.RawMessage(`null`)},                                          // 0 + 3
	}
	got, err := Chat(msgs)
	if want := int64(2 + 3 + 1 + 3 + 1 + 0 + 3 + ReplyPrimingTokens); err != nil || got != want {
		t.Fatalf("Chat = %d, %v; want %d", got, err, want)
	}
	if _, err := Chat([]Message{{Content: json.RawMessage(`42`)}}); !errors.Is(err, ErrContent) {
		t.Fatalf("numeric content: got %v, want ErrContent", err)
	}
}
