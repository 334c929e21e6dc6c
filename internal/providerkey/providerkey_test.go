package providerkey

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"
)

func TestKey(t *testing.T) {
	k := New("")
	if k.Present() || k.Authorization() != "" {
		t.Fatalf("empty key: present %v, authorization %q", k.Present(), k.Authorization())
	}
	if !k.Set("sk-a") || k.Set("sk-a") {
		t.Fatal("Set reports a change only when the key differs")
	}
	if got := k.Authorization(); got != "Bearer sk-a" {
		t.Fatalf("Authorization %q", got)
	}
	k.Set("sk-b")
	if got := string(k.Redact([]byte("sk-a sk-b sk-c"))); got != "[REDACTED] [REDACTED] sk-c" {
		t.Errorf("Redact after one rotation: %q, want the current and the previous key redacted", got)
	}
	k.Set("sk-c")
	if got := string(k.Redact([]byte("sk-a sk-b sk-c"))); got != "sk-a [REDACTED] [REDACTED]" {
		t.Errorf("Redact after two rotations: %q", got)
	}
	b := []byte("nothing to hide")
	if got := k.Redact(b); &got[0] != &b[0] {
		t.Error("Redact copied a body without a key")
	}
	if n := testing.AllocsPerRun(100, func() { _ = k.Authorization() }); n != 0 {
		t.Errorf("Authorization allocates %v times", n)
	}
}

// TestFileLoad: whitespace is trimmed; an empty or unreadable file keeps
// the key and is logged once per change of error, not on every read; the
// key never reaches the log.
func TestFileLoad(t *testing.T) {
	var logs []string
	log := funcr.New(func(prefix, args string) { logs = append(logs, prefix+" "+args) }, funcr.Options{})
	path := filepath.Join(t.TempDir(), "api-key")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	f := &File{Path: path, Key: New(""), Log: log}
	if err := f.Load(); err == nil {
		t.Fatal("Load of a missing file: no error")
	}
	write(" sk-first\n")
	if err := f.Load(); err != nil || f.Key.Authorization() != "Bearer sk-first" {
		t.Fatalf("Load: %v, authorization %q", err, f.Key.Authorization())
	}
	write("\n")
	for range 3 {
		if err := f.Load(); err != ErrEmpty {
			t.Fatalf("Load of an empty file: %v", err)
		}
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		_ = f.Load()
	}
	if got := f.Key.Authorization(); got != "Bearer sk-first" {
		t.Fatalf("after bad reads: %q, want the last good key", got)
	}
	write("sk-second")
	if err := f.Load(); err != nil || f.Key.Authorization() != "Bearer sk-second" {
		t.Fatalf("Load: %v, authorization %q", err, f.Key.Authorization())
	}
	all := strings.Join(logs, "\n")
	if strings.Contains(all, "sk-") {
		t.Errorf("the log holds a key:\n%s", all)
	}
	count := func(s string) int { return strings.Count(all, s) }
	if n := count("provider key file is empty"); n != 1 {
		t.Errorf("empty file logged %d times, want once:\n%s", n, all)
	}
	if n := count("no such file"); n != 2 {
		t.Errorf("missing file logged %d times, want twice (at start, then once when removed):\n%s", n, all)
	}
	if n := count("readable again"); n != 2 {
		t.Errorf("recoveries logged %d times, want 2:\n%s", n, all)
	}
	if n := count("provider key changed"); n != 1 {
		t.Errorf("rotations logged %d times, want 1 (the first key is no rotation):\n%s", n, all)
	}
}
