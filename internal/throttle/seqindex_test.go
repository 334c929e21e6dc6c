package throttle

import (
	"math/rand/v2"
	"testing"
)

// TestSeqIndexMatchesSearch: the O(1) guess of entryLog.seqIndex gives the
// binary search's answer (the smallest index whose seq is at least s) on
// logs of consecutive seqs, logs with gaps, and rings whose head has
// wrapped, for every s around and inside the logged seqs.
func TestSeqIndexMatchesSearch(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 300 {
		var l entryLog
		seq := uint64(1 + r.IntN(1000))
		n := r.IntN(200)
		gapEvery := 0 // consecutive
		if round%3 == 1 {
			gapEvery = 1 + r.IntN(20)
		}
		pops := r.IntN(n + 1) // moves the ring's head, so positions wrap
		for i := range n + pops {
			l.push(entry{seq: seq})
			seq++
			if gapEvery > 0 && i%gapEvery == 0 {
				seq += uint64(1 + r.IntN(5))
			}
		}
		for range pops {
			l.popFront()
		}
		lo := uint64(0)
		if l.len() > 0 {
			lo = l.at(0).seq
		}
		for s := lo - min(lo, 3); s <= seq+3; s++ {
			want := l.search(func(e *entry) bool { return e.seq >= s })
			if got := l.seqIndex(s); got != want {
				t.Fatalf("round %d (n %d, gaps every %d): seqIndex(%d) = %d, want %d", round, l.len(), gapEvery, s, got, want)
			}
		}
	}
	var d dimension
	d.log.push(entry{seq: 7})
	if got := d.firstAfterSeq(^uint64(0)); got != 1 {
		t.Errorf("firstAfterSeq(max) = %d, want 1", got)
	}
}
