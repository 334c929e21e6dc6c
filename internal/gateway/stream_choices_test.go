package gateway

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/fairshare-dev/fairshare/internal/tokencount"
)

// TestReviewStreamChoicesCountedPerChoice: a stream of n=2 choices without
// usage whose deltas interleave is charged the prompt plus the tokens of
// each choice's text (the provider tokenizes and bills every choice on its
// own), not the tokens of the interleaved deltas joined into one text,
// which merges a piece of one choice with the next piece of the other
// (" the" + "ory" is one token, " theory").
// TestStreamChoicesCountedPerChoice: a stream with n = 2 and no usage,
// whose choices' deltas interleave (" the", "ory", " cat", " dog"), is
// charged the prompt plus each choice's tokens counted on its own, not the
// joined text " theory cat dog" (which merges two choices' pieces into one
// token): the provider bills each choice separately (BC-23, BC-28a).
func TestStreamChoicesCountedPerChoice(t *testing.T) {
	type piece struct {
		index int
		text  string
	}
	pieces := []piece{{0, " the"}, {1, "ory"}, {0, " cat"}, {1, " dog"}}
	var events []string
	perChoice := map[int]string{}
	var joined string
	for _, p := range pieces {
		b, _ := json.Marshal(map[string]any{"choices": []any{map[string]any{"index": p.index, "delta": map[string]any{"content": p.text}}}})
		events = append(events, string(b))
		perChoice[p.index] += p.text
		joined += p.text
	}
	var want int64
	for _, s := range perChoice {
		k, _ := tokencount.Text(s)
		want += k
	}
	if kj, _ := tokencount.Text(joined); kj == want {
		t.Fatalf("precondition: joined %q counts %d, as the choices do", joined, kj)
	}
	body := strings.Replace(hiStreamBody, `"stream":true`, `"stream":true,"n":2`, 1)
	_, charged := streamEvents(t, events, body)
	if w := hiPromptTokens(t) + want; charged != w {
		t.Errorf("charged %d, want prompt + per-choice output tokens = %d", charged, w)
	}
}
