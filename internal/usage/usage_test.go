package usage

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func TestRingWindow(t *testing.T) {
	r := NewRing(5 * time.Minute)
	if got := r.Span(); got != 5*time.Minute {
		t.Fatalf("Span = %s, want 5m", got)
	}
	r.Record(t0, Counts{WeightedTokens: 100, InputTokens: 10, OutputTokens: 18, Admitted: 1})
	r.Record(t0.Add(59*time.Second), Counts{Refused: 1})
	r.Record(t0.Add(2*time.Minute), Counts{WeightedTokens: 50, Admitted: 1})
	r.Record(t0.Add(4*time.Minute+30*time.Second), Counts{WeightedTokens: 7, Admitted: 1})
	cases := []struct {
		at   time.Duration
		want Counts
	}{
		{0, Counts{WeightedTokens: 100, InputTokens: 10, OutputTokens: 18, Admitted: 1, Refused: 1}},
		{4*time.Minute + 59*time.Second, Counts{WeightedTokens: 157, InputTokens: 10, OutputTokens: 18, Admitted: 3, Refused: 1}},
		{5 * time.Minute, Counts{WeightedTokens: 57, Admitted: 2}}, // minute 0 left the window
		{7 * time.Minute, Counts{WeightedTokens: 7, Admitted: 1}},
		{9 * time.Minute, Counts{}},
		{-time.Minute, Counts{}}, // before every bucket
	}
	for _, c := range cases {
		if got := r.Window(t0.Add(c.at)); got != c.want {
			t.Errorf("Window(t0+%s) = %+v, want %+v", c.at, got, c.want)
		}
	}
	// Minute 4, the newest, left the window at 9 minutes: the buckets are
	// released, and a later Record starts afresh.
	if r.buckets != nil {
		t.Errorf("after the window passed every bucket: %d buckets kept, want none", len(r.buckets))
	}
	r.Record(t0.Add(10*time.Minute), Counts{WeightedTokens: 1, Admitted: 1})
	if got, want := r.Window(t0.Add(10*time.Minute)), (Counts{WeightedTokens: 1, Admitted: 1}); got != want {
		t.Errorf("after the release: %+v, want %+v", got, want)
	}
}

// TestRingOutOfOrder: a Record whose time is older than the newest bucket
// (read before another caller's, recorded after it) lands in its own
// minute, in time order; one a whole window older than the newest is
// dropped; Record of a newer minute drops the buckets that left its window.
func TestRingOutOfOrder(t *testing.T) {
	r := NewRing(5 * time.Minute)
	r.Record(t0.Add(1*time.Minute), Counts{WeightedTokens: 1})
	r.Record(t0.Add(4*time.Minute), Counts{WeightedTokens: 4})
	r.Record(t0.Add(2*time.Minute), Counts{WeightedTokens: 2})     // inserted between
	r.Record(t0.Add(0*time.Minute), Counts{WeightedTokens: 10})    // inserted first
	r.Record(t0.Add(4*time.Minute), Counts{WeightedTokens: 40})    // the newest, again
	r.Record(t0.Add(-1*time.Minute), Counts{WeightedTokens: 1000}) // 5 minutes before the newest: dropped
	var minutes []int64
	for _, b := range r.buckets {
		minutes = append(minutes, b.minute-minuteOf(t0))
	}
	if got, want := fmt.Sprint(minutes), "[0 1 2 4]"; got != want {
		t.Errorf("bucket minutes %s, want %s", got, want)
	}
	if got := r.Window(t0.Add(4 * time.Minute)).WeightedTokens; got != 10+1+2+4+40 {
		t.Errorf("Window(4m) = %d, want 57", got)
	}
	r.Record(t0.Add(6*time.Minute), Counts{WeightedTokens: 6}) // minutes 0 and 1 leave
	minutes = minutes[:0]
	for _, b := range r.buckets {
		minutes = append(minutes, b.minute-minuteOf(t0))
	}
	if got, want := fmt.Sprint(minutes), "[2 4 6]"; got != want {
		t.Errorf("after minute 6: bucket minutes %s, want %s", got, want)
	}
}

// TestRingMatchesReference: over 3 hours of records one to ninety seconds
// apart, some read up to a minute before the previous one, and queries at
// non-decreasing times, Window equals the sum of every record of its window
// (a list of all records), and the ring never holds more buckets than the
// window's minutes nor a capacity above it.
func TestRingMatchesReference(t *testing.T) {
	type rec struct {
		minute int64
		c      Counts
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, window := range []time.Duration{time.Minute, 2 * time.Minute, 7 * time.Minute, time.Hour} {
		r := NewRing(window)
		n := int64(windowBuckets(window))
		var all []rec
		now := t0
		for i := range 4000 {
			now = now.Add(time.Duration(1+rng.IntN(90)) * time.Second)
			at := now
			if rng.IntN(4) == 0 {
				at = now.Add(-time.Duration(rng.IntN(60)) * time.Second)
			}
			c := Counts{WeightedTokens: int64(1 + rng.IntN(1000)), Admitted: 1}
			r.Record(at, c)
			all = append(all, rec{minuteOf(at), c})
			if i%7 == 0 {
				m := minuteOf(now)
				var want Counts
				for _, x := range all {
					if x.minute <= m && x.minute > m-n {
						want.Add(x.c)
					}
				}
				if got := r.Window(now); got != want {
					t.Fatalf("window %v, record %d: Window = %+v, want %+v", window, i, got, want)
				}
			}
			if int64(len(r.buckets)) > n || int64(cap(r.buckets)) > n {
				t.Fatalf("window %v: %d buckets, capacity %d; want at most %d", window, len(r.buckets), cap(r.buckets), n)
			}
		}
	}
}

func TestRingBeforeEpoch(t *testing.T) {
	r := NewRing(2 * time.Minute)
	at := time.Unix(-30, 0) // minute -1
	r.Record(at, Counts{Admitted: 1})
	if got := r.Window(time.Unix(-1, 0)); got.Admitted != 1 {
		t.Errorf("Window(-1s).Admitted = %d, want 1", got.Admitted)
	}
	if got := r.Window(time.Unix(60, 0)); got.Admitted != 0 { // minutes 0 and 1
		t.Errorf("Window(60s).Admitted = %d, want 0", got.Admitted)
	}
}

func TestRingResized(t *testing.T) {
	r := NewRing(10 * time.Minute)
	for i := range 10 {
		r.Record(t0.Add(time.Duration(i)*time.Minute), Counts{WeightedTokens: int64(i + 1)})
	}
	now := t0.Add(9 * time.Minute)
	small := r.Resized(now, 3*time.Minute)
	if got := small.Window(now).WeightedTokens; got != 8+9+10 {
		t.Errorf("resized to 3m: %d, want 27", got)
	}
	big := r.Resized(now, 20*time.Minute)
	if got := big.Window(now).WeightedTokens; got != 55 {
		t.Errorf("resized to 20m: %d, want 55", got)
	}
	if got := big.Span(); got != 20*time.Minute {
		t.Errorf("Span = %s", got)
	}
}

func TestConfigNormalized(t *testing.T) {
	got := Config{Window: 90 * time.Second, MinWeightedTokens: -5, RejectionPercent: 250}.Normalized()
	want := Config{Window: 2 * time.Minute, CostRatio: 10, MinTierSize: 5, MinWeightedTokens: 0, RejectionPercent: 100, MinRejections: 100}
	if got != want {
		t.Errorf("Normalized = %+v, want %+v", got, want)
	}
	if got, want := DefaultConfig(), (Config{Window: time.Hour, CostRatio: 10, MinTierSize: 5, MinWeightedTokens: 100_000, RejectionPercent: 50, MinRejections: 100}); got != want {
		t.Errorf("DefaultConfig = %+v, want %+v", got, want)
	}
	if got := (Config{Window: 48 * time.Hour}).Normalized().Window; got != MaxWindow {
		t.Errorf("window capped at %s, want %s", got, MaxWindow)
	}
}

func TestMedian(t *testing.T) {
	cases := []struct {
		in   []int64
		want int64
	}{
		{[]int64{5}, 5},
		{[]int64{9, 1, 5}, 5},
		{[]int64{1, 2, 3, 4}, 2}, // (2+3)/2 rounded down
		{[]int64{3, 5, 1, 7}, 4}, // (3+5)/2
		{[]int64{0, 0, 10, 10}, 5},
		{[]int64{1<<62 + 1, 1<<62 + 1}, 1<<62 + 1}, // no overflow
	}
	for _, c := range cases {
		if got := median(append([]int64(nil), c.in...)); got != c.want {
			t.Errorf("median(%v) = %d, want %d", c.in, got, c.want)
		}
	}
}

func w(id, tier string, weighted, admitted, refused int64) Input {
	return Input{ID: id, Tier: tier, Counts: Counts{WeightedTokens: weighted, Admitted: admitted, Refused: refused}}
}

func TestEvaluate(t *testing.T) {
	cfg := Config{Window: time.Hour, CostRatio: 10, MinTierSize: 5, MinWeightedTokens: 1000, RejectionPercent: 50, MinRejections: 100}
	in := []Input{
		w("a", "free", 100, 10, 0),
		w("b", "free", 200, 10, 0),
		w("c", "free", 300, 10, 0),
		w("d", "free", 400, 10, 0),
		w("e", "free", 3000, 10, 0), // 8.57x the median 350
		w("f", "free", 2999, 10, 0),
		w("g", "free", 0, 0, 0),      // idle: not in the median
		w("p", "pro", 900000, 10, 0), // tier of 4 active tenants: no median
		w("q", "pro", 1, 10, 0),
		w("r", "pro", 1, 100, 100), // 50% refused and 100 refusals: flagged
		w("s", "pro", 1, 101, 99),  // 99 refusals: not
		w("", "", 10, 1, 0),
	}
	got := Evaluate(cfg, in)
	type row struct {
		reason              string
		outlier             bool
		active              int
		median, ratio, refd int64
	}
	want := map[string]row{
		"a": {ReasonWithinTier, false, 6, 350, 28, 0},
		"b": {ReasonWithinTier, false, 6, 350, 57, 0},
		"c": {ReasonWithinTier, false, 6, 350, 85, 0},
		"d": {ReasonWithinTier, false, 6, 350, 114, 0},
		"e": {ReasonWithinTier, false, 6, 350, 857, 0},
		"f": {ReasonWithinTier, false, 6, 350, 856, 0},
		"g": {ReasonWithinTier, false, 6, 350, 0, 0},
		"p": {ReasonWithinTier, false, 4, 0, 0, 0},
		"q": {ReasonWithinTier, false, 4, 0, 0, 0},
		"r": {ReasonLimitViolations, true, 4, 0, 0, 50},
		"s": {ReasonWithinTier, false, 4, 0, 0, 49},
		"":  {ReasonWithinTier, false, 1, 0, 0, 0},
	}
	for i, e := range got {
		id := in[i].ID
		r := row{e.Signal.Reason, e.Signal.Outlier, e.TierActive, e.TierMedian, e.RatioPercent, e.RefusedPercent}
		if r != want[id] {
			t.Errorf("%q: %+v, want %+v", id, r, want[id])
		}
		if e.HasMedian != (e.TierActive >= 5) {
			t.Errorf("%q: HasMedian %v with %d active", id, e.HasMedian, e.TierActive)
		}
		if e.Window != time.Hour || e.Counts != in[i].Counts || e.Tier != in[i].Tier {
			t.Errorf("%q: window/counts/tier not carried: %+v", id, e)
		}
	}
	// With six active free tenants the median is (300+400)/2 = 350, so e at
	// 3000 is 8.57x. Make e a clear outlier and check the exact message.
	in[4].Counts.WeightedTokens = 3500
	got = Evaluate(cfg, in)
	if e := got[4]; !e.Signal.Outlier || e.Signal.Reason != ReasonCostAboveTier || e.RatioPercent != 1000 || e.TierMedian != 350 {
		t.Fatalf("e: %+v", e)
	} else if want := `3500 weighted tokens in the last 1h0m0s: 10.0x the median of tier "free" (350, over 6 active tenants); threshold 10x`; e.Signal.Message != want {
		t.Errorf("message\n got %s\nwant %s", e.Signal.Message, want)
	}
	if want := `100 of 200 requests (50%) refused by the tenant's own limits in the last 1h0m0s; threshold 50% and 100 refusals`; got[9].Signal.Message != want {
		t.Errorf("message\n got %s\nwant %s", got[9].Signal.Message, want)
	}
	if want := `1 weighted tokens in the last 1h0m0s; tier "pro" has 4 active tenants, too few for a median`; got[8].Signal.Message != want {
		t.Errorf("message\n got %s\nwant %s", got[8].Signal.Message, want)
	}
	if want := `100 weighted tokens in the last 1h0m0s: 0.2x the median of tier "free" (350); 0% of requests refused`; got[0].Signal.Message != want {
		t.Errorf("message\n got %s\nwant %s", got[0].Signal.Message, want)
	}
}

func TestEvaluateFloorAndZeroMedian(t *testing.T) {
	cfg := Config{MinTierSize: 3, MinWeightedTokens: 500, CostRatio: 10}
	in := []Input{
		w("a", "t", 0, 0, 5), // active (refused), 0 tokens
		w("b", "t", 0, 0, 5),
		w("e", "t", 0, 0, 5),
		w("c", "t", 499, 1, 0), // median 0 counts as 1, but under the floor
		w("d", "t", 500, 1, 0), // at the floor: flagged
	}
	got := Evaluate(cfg, in)
	if got[3].Signal.Outlier || got[3].RatioPercent != 49900 {
		t.Errorf("c: %+v", got[3])
	}
	if !got[4].Signal.Outlier || got[4].Signal.Reason != ReasonCostAboveTier || got[4].TierMedian != 0 || got[4].RatioPercent != 50000 {
		t.Errorf("d: %+v", got[4])
	}
	// Cost is checked before violations.
	in[4].Counts.Refused = 1000
	if got := Evaluate(cfg, in)[4]; got.Signal.Reason != ReasonCostAboveTier || !strings.Contains(got.Signal.Message, "500.0x") {
		t.Errorf("d with refusals: %+v", got.Signal)
	}
}

func BenchmarkRingRecord(b *testing.B) {
	r := NewRing(time.Hour)
	c := Counts{WeightedTokens: 1200, InputTokens: 200, OutputTokens: 200, Admitted: 1}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		r.Record(t0.Add(time.Duration(i)*time.Second), c)
	}
}

// TestRingAllocatesBucketsOnFirstRecord: a ring that never recorded holds
// no buckets (a registry of idle tenants costs only the Ring headers), reads
// as empty, keeps its span, and resizes without allocating; the first
// Record allocates one bucket, a tenant busy every minute ends with the
// window's 60 and no more capacity, after which Record allocates nothing.
func TestRingAllocatesBucketsOnFirstRecord(t *testing.T) {
	r := NewRing(time.Hour)
	if r.buckets != nil {
		t.Fatalf("new ring has %d buckets, want none", len(r.buckets))
	}
	if got := r.Window(t0); got != (Counts{}) {
		t.Errorf("Window of an empty ring = %+v, want zero", got)
	}
	if got := r.Span(); got != time.Hour {
		t.Errorf("Span = %v, want 1h", got)
	}
	if rs := r.Resized(t0, 2*time.Hour); rs.buckets != nil || rs.Span() != 2*time.Hour {
		t.Errorf("Resized empty ring: %d buckets, span %v; want none, 2h", len(rs.buckets), rs.Span())
	}
	if r.buckets != nil {
		t.Fatal("reads allocated buckets")
	}
	c := Counts{WeightedTokens: 7, Admitted: 1}
	r.Record(t0, c)
	if len(r.buckets) != 1 || cap(r.buckets) != 1 {
		t.Fatalf("after Record: %d buckets, capacity %d; want 1, 1", len(r.buckets), cap(r.buckets))
	}
	if got := r.Window(t0); got != c {
		t.Errorf("Window = %+v, want %+v", got, c)
	}
	for i := range 120 {
		r.Record(t0.Add(time.Duration(i)*time.Minute), c)
	}
	if len(r.buckets) != 60 || cap(r.buckets) != 60 {
		t.Fatalf("busy every minute for 2 h: %d buckets, capacity %d; want 60, 60", len(r.buckets), cap(r.buckets))
	}
	next := t0.Add(120 * time.Minute)
	if n := testing.AllocsPerRun(100, func() { r.Record(next, c); next = next.Add(time.Minute) }); n != 0 {
		t.Errorf("Record allocates %v times once the buckets exist", n)
	}
}
