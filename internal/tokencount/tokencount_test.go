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

// TestMemberNamesExact: a message's "content" and "name" and a content
// part's "text" are matched exactly, as the providers read them; other
// spellings are other members. The last of duplicates wins.
func TestMemberNamesExact(t *testing.T) {
	for _, c := range []struct {
		raw, name, content string
		err                bool
	}{
		{raw: `{"content":"long text","Content":"hi","NAME":"x"}`, content: `"long text"`},
		{raw: `{"Content":"hi"}`},
		{raw: `{"name":"a","name":null,"content":null}`, content: `null`},
		{raw: `{"name":"a","Name":"b"}`, name: "a"},
		{raw: `{"\u006eame":"e"}`, name: "e"},
		{raw: `{"name":1}`, err: true},
		{raw: `[1]`, err: true},
		{raw: `null`},
	} {
		var m Message
		err := json.Unmarshal([]byte(c.raw), &m)
		if (err != nil) != c.err || m.Name != c.name || string(m.Content) != c.content {
			t.Errorf("%s: name %q content %q err %v; want %q %q err %v", c.raw, m.Name, m.Content, err, c.name, c.content, c.err)
		}
	}
	for _, c := range []struct {
		raw, want string
		err       bool
	}{
		{raw: `[{"type":"text","text":"abc","TEXT":""}]`, want: "abc"},
		{raw: `[{"type":"text","Text":"abc"},{"text":"d\u00e9"},null,{"text":null}]`, want: "dé"},
		{raw: `[{"text":5}]`, err: true},
		{raw: `["abc"]`, err: true},
	} {
		got, err := ContentText(json.RawMessage(c.raw))
		if (err != nil) != c.err || got != c.want {
			t.Errorf("ContentText(%s) = %q, %v; want %q, error %v", c.raw, got, err, c.want, c.err)
		}
	}
}
