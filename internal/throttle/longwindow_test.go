package throttle

import (
	"testing"
	"time"
)

// TestLongWindowLogIsBounded: a dimension whose limit has a stated window of
// a day keeps, past Window, at most MaxLongWindowStarts starts (the latest),
// instead of every start of the day; with no stated window it keeps only
// Window's.
func TestLongWindowLogIsBounded(t *testing.T) {
	n := MaxLongWindowStarts + 100
	fill := func(window time.Duration) *dimension {
		d := newDimension(0)
		d.hdrLimit, d.hdrWindow = 1<<40, window
		for i := range n {
			d.record(uint64(i+1), NOW.Add(time.Duration(i)*time.Millisecond), 1, uint64(i+1))
		}
		d.prune(NOW.Add(time.Duration(n-1) * time.Millisecond))
		return &d
	}
	d := fill(24 * time.Hour)
	if got := d.log.len(); got != MaxLongWindowStarts {
		t.Fatalf("daily window: %d starts kept, want %d", got, MaxLongWindowStarts)
	}
	if got := d.log.at(0).seq; got != 101 {
		t.Errorf("daily window: oldest start kept is %d, want 101 (the oldest dropped first)", got)
	}
	// Only the starts in (now-Window, now]: 60,000 at 1 ms apart.
	if got := fill(0).log.len(); got != 60000 {
		t.Errorf("no stated window: %d starts kept, want 60000", got)
	}
}
