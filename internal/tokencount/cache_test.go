package tokencount

import (
	"errors"
	"fmt"
	"sync"
	"testing"
)

// countingTokenizer counts texts with Text and records how often each was
// tokenized.
type countingTokenizer struct {
	mu    sync.Mutex
	calls map[string]int
	err   error
}

func (c *countingTokenizer) count(s string) (int64, error) {
	c.mu.Lock()
	c.calls[s]++
	c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	return Text(s)
}

func TestCacheCountsOncePerScope(t *testing.T) {
	ct := &countingTokenizer{calls: map[string]int{}}
	c := newCache(64, ct.count)
	const sys = "You are a helpful assistant. Answer in French."
	want, err := Text(sys)
	if err != nil || want != 10 {
		t.Fatalf("Text = %d, %v; want 10", want, err)
	}
	for i := range 3 {
		if got, err := c.Text("tenant-a", sys); err != nil || got != want {
			t.Fatalf("request %d: %d, %v; want %d", i, got, err, want)
		}
	}
	if ct.calls[sys] != 1 {
		t.Fatalf("tokenized %d times for one scope, want 1", ct.calls[sys])
	}
	// Another scope (tenant) never hits what tenant-a sent.
	if got, err := c.Text("tenant-b", sys); err != nil || got != want {
		t.Fatalf("tenant-b: %d, %v", got, err)
	}
	if ct.calls[sys] != 2 {
		t.Fatalf("tokenized %d times for two scopes, want 2", ct.calls[sys])
	}
	// The scope and the text are not concatenated ambiguously.
	if _, err := c.Text("tenant-", "a"+sys); err != nil || ct.calls["a"+sys] != 1 {
		t.Fatalf("scope \"tenant-\" + \"a...\" hit another entry: calls %d", ct.calls["a"+sys])
	}
	if got, _ := c.Text("tenant-a", ""); got != 0 || ct.calls[""] != 0 {
		t.Fatalf("empty text: %d, tokenized %d times", got, ct.calls[""])
	}
}

// One slot: every new text evicts the last, and every count is still
// exact.
func TestCacheEvictionKeepsCountsExact(t *testing.T) {
	ct := &countingTokenizer{calls: map[string]int{}}
	c := newCache(1, ct.count)
	texts := []string{"one two three", "hello", "a b c d e f g", "hello"}
	for _, s := range texts {
		want, _ := Text(s)
		if got, err := c.Text("t", s); err != nil || got != want {
			t.Fatalf("%q: %d, %v; want %d", s, got, err, want)
		}
	}
	if ct.calls["hello"] != 2 {
		t.Fatalf("\"hello\" tokenized %d times, want 2 (evicted in between)", ct.calls["hello"])
	}
	if len(c.slots) != 1 {
		t.Fatalf("slots %d", len(c.slots))
	}
}

func TestCacheErrorsAreNotKept(t *testing.T) {
	ct := &countingTokenizer{calls: map[string]int{}, err: errors.New("vocabulary unavailable")}
	c := newCache(8, ct.count)
	for range 2 {
		if _, err := c.Text("t", "x"); err == nil {
			t.Fatal("error not returned")
		}
	}
	if ct.calls["x"] != 2 {
		t.Fatalf("a failed count was kept: tokenized %d times", ct.calls["x"])
	}
}

// Concurrent lookups and stores of many texts (go test -race) return exact
// counts.
func TestCacheConcurrent(t *testing.T) {
	c := NewCache(16)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 300 {
				s := fmt.Sprintf("text %d of goroutine", i%40)
				want, _ := Text(s)
				if got, err := c.Text(fmt.Sprint(g%2), s); err != nil || got != want {
					t.Errorf("%q: %d, want %d", s, got, want)
					return
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkCacheText: a chat message counted again (hit) against counting
// it (miss: Text), per call.
func BenchmarkCacheText(b *testing.B) {
	const s = "Summarise the quarterly report in three bullet points."
	b.Run("miss", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Text(s); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("hit", func(b *testing.B) {
		c := NewCache(DefaultCacheSlots)
		_, _ = c.Text("tenant", s)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := c.Text("tenant", s); err != nil {
				b.Fatal(err)
			}
		}
	})
}
