package providersim

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/fairshare-dev/fairshare/internal/tokencount"
)

func TestResetFormat(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{6 * time.Minute, "6m0s"},
		{1500 * time.Millisecond, "1.5s"},
		{250 * time.Millisecond, "250ms"},
		{0, "0s"},
		{1000400 * time.Microsecond, "1s"},
		{8640600 * time.Microsecond, "8.641s"},
		{72 * time.Second, "1m12s"},
	} {
		h := http.Header{}
		writeQuotaHeaders(h, Config{}, quota{tokLimit: 1, tokReset: tc.d})
		if got := h.Get("x-ratelimit-reset-tokens"); got != tc.want {
			t.Errorf("%v: %q, want %q", tc.d, got, tc.want)
		}
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want int64
	}{
		{13 * time.Second, 13},
		{13*time.Second + 1, 13}, // float noise
		{13*time.Second + 10*time.Millisecond, 14},
		{100 * time.Millisecond, 1},
		{0, 1},
	} {
		if got := retryAfterSeconds(tc.d); got != tc.want {
			t.Errorf("%v: %d, want %d", tc.d, got, tc.want)
		}
	}
}

// TestBucketSlowRefill: fractional refill is kept, so a slow rate (500 per
// minute, advanced in 10 ms steps) gains exactly what elapsed time allows.
func TestBucketSlowRefill(t *testing.T) {
	b := newBucket(500, t0)
	b.take(500)
	now := t0
	for range 6000 {
		now = now.Add(10 * time.Millisecond)
		b.advance(now)
	}
	if got := b.remaining(); got < 499 || got > 500 {
		t.Errorf("after 60 s: %d, want 500 (±1)", got)
	}
	b.give(1000)
	if b.level != 500 {
		t.Errorf("give clamps: %v", b.level)
	}
	b.advance(t0) // clock stepped back: no change
	if b.level != 500 || !b.last.Equal(now) {
		t.Errorf("backwards clock changed the bucket")
	}
}

func TestFillerTokens(t *testing.T) {
	for _, w := range fillerWords {
		if n, err := countText(w); err != nil || n != 1 {
			t.Errorf("%q is %d tokens (%v), want 1", w, n, err)
		}
	}
	for _, n := range []int64{0, 1, 17, 18, 100} {
		if got, _ := countText(fillerText(n)); got != n {
			t.Errorf("fillerText(%d) is %d tokens", n, got)
		}
	}
}

func TestPromptTokens(t *testing.T) {
	msg := func(role, name, content string) chatMessage {
		return chatMessage{Role: role, Name: name, Content: json.RawMessage(content)}
	}
	for _, tc := range []struct {
		name string
		msgs []chatMessage
		want int64
	}{
		{"empty", nil, tokencount.ReplyPrimingTokens},
		{"string", []chatMessage{msg("user", "", `"Hello there"`)}, 2 + 3 + 3},
		{"parts", []chatMessage{msg("user", "", `[{"type":"text","text":"Hello"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":" there"}]`)}, 2 + 3 + 3},
		{"name and null", []chatMessage{msg("system", "", `"Hello there"`), msg("assistant", "bob", `null`)}, 2 + 3 + 0 + 3 + 1 + 3},
	} {
		got, err := promptTokens(tc.msgs)
		if err != nil || got != tc.want {
			t.Errorf("%s: %d, %v; want %d", tc.name, got, err, tc.want)
		}
	}
}

func TestMainServes(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	errc := make(chan error, 1)
	go func() {
		errc <- Main(ctx, []string{"--addr", "127.0.0.1:0", "--tokens-per-minute", "6000", "--requests-per-minute", "60", "--output-tokens", "3"}, pw)
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	url, ok := strings.CutPrefix(strings.TrimSpace(line), "providersim listening on ")
	if !ok {
		t.Fatalf("line %q", line)
	}
	r := post(t, context.Background(), url, chatBody(`"max_tokens":10`))
	want := map[string]string{
		"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "59",
		"x-ratelimit-limit-tokens": "6000", "x-ratelimit-remaining-tokens": "5982",
	}
	got := quotaHeaders(r.header)
	delete(got, "x-ratelimit-reset-requests") // real clock
	delete(got, "x-ratelimit-reset-tokens")
	if r.status != http.StatusOK || !cmp.Equal(want, got) {
		t.Errorf("status %d headers %v", r.status, got)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Errorf("Main: %v", err)
	}
}

func TestMainFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--dialect", "smoke-signals"},
		{"--dialect", "classic", "--classic-reset", "hours"},
		{"--window", "1500ms"},
		{"--sub-window", "2m"},
		{"--latency", "soon"},
		{"extra"},
		{"--tokens-per-minute", "-5"},
	} {
		if err := Main(context.Background(), args, io.Discard); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
	if err := Main(context.Background(), []string{"-h"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}

func TestParseFlags(t *testing.T) {
	cfg, addr, err := parseFlags([]string{"--addr", "127.0.0.1:0", "--dialect", "classic", "--window", "10s",
		"--classic-reset", "epochms", "--requests-per-minute", "600", "--retry-after-http-date"}, io.Discard)
	want := Config{Dialect: DialectClassic, Window: 10 * time.Second, ClassicResetForm: ClassicResetEpochMillis,
		RequestsPerMinute: 600, RetryAfterHTTPDate: true, OutputTokens: DefaultOutputTokens, AnthropicRemainingStep: DefaultAnthropicRemainingStep,
		AnthropicHeaders: AnthropicHeadersInOut}
	if err != nil || addr != "127.0.0.1:0" || !cmp.Equal(cfg, want, cmpopts.IgnoreFields(Config{}, "Clock")) {
		t.Errorf("classic: %v %q %s", err, addr, cmp.Diff(want, cfg, cmpopts.IgnoreFields(Config{}, "Clock")))
	}
	cfg, _, err = parseFlags([]string{"--dialect", "azure", "--sub-window", "1s", "--tokens-per-minute", "6000"}, io.Discard)
	if err != nil || cfg.Dialect != DialectAzure || cfg.SubWindow != time.Second || cfg.TokensPerMinute != 6000 {
		t.Errorf("azure: %v %+v", err, cfg)
	}
	cfg, _, err = parseFlags([]string{"--dialect", "anthropic", "--anthropic-remaining-step", "1"}, io.Discard)
	if err != nil || cfg.Dialect != DialectAnthropic || cfg.AnthropicRemainingStep != 1 {
		t.Errorf("anthropic: %v %+v", err, cfg)
	}
	cfg, _, err = parseFlags([]string{"--dialect", "anthropic", "--input-tokens-per-minute", "24000",
		"--output-tokens-per-minute", "9000", "--anthropic-headers", "tokens"}, io.Discard)
	if err != nil || cfg.InputTokensPerMinute != 24000 || cfg.OutputTokensPerMinute != 9000 || cfg.AnthropicHeaders != AnthropicHeadersTokens {
		t.Errorf("anthropic in/out: %v %+v", err, cfg)
	}
	for _, args := range [][]string{
		{"--dialect", "openai", "--input-tokens-per-minute", "1000"},
		{"--dialect", "anthropic", "--output-tokens-per-minute", "-1"},
		{"--dialect", "anthropic", "--anthropic-headers", "both"},
	} {
		if _, _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}

// TestMessageMemberNamesExact: the simulator reads a message's members by
// their exact names, as the providers and the gateway do, and refuses a
// message that is not an object.
func TestMessageMemberNamesExact(t *testing.T) {
	var req chatRequest
	if err := json.Unmarshal([]byte(`{"messages":[{"role":"user","content":"a long text here","Content":"hi"}]}`), &req); err != nil {
		t.Fatal(err)
	}
	if string(req.Messages[0].Content) != `"a long text here"` || req.Messages[0].Role != "user" {
		t.Errorf("message %+v, want the exact content and role", req.Messages[0])
	}
	if err := json.Unmarshal([]byte(`{"messages":[null]}`), &req); err == nil {
		t.Error("a null message was accepted")
	}
}
