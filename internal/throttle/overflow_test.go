package throttle

import (
	"math"
	"testing"
)

func TestFloorCount(t *testing.T) {
	for _, c := range []struct {
		level float64
		want  int64
	}{
		{-1, 0},
		{0, 0},
		{math.NaN(), 0},
		{math.Inf(-1), 0},
		{2.999, 2},
		{1 << 62, 1 << 62},
		// The largest float64 below 2^63 converts exactly.
		{math.Nextafter(1<<63, 0), 9223372036854774784},
		// float64(math.MaxInt64) is 2^63: it must not wrap.
		{float64(math.MaxInt64), math.MaxInt64},
		{1e30, math.MaxInt64},
		{math.Inf(1), math.MaxInt64},
	} {
		if got := floorCount(c.level); got != c.want {
			t.Errorf("floorCount(%v) = %d, want %d", c.level, got, c.want)
		}
	}
}

func TestReserveOfDoesNotOverflow(t *testing.T) {
	for _, c := range []struct{ lim, pct, want int64 }{
		{1000, 20, 200},
		{1, 20, 1},
		{150, 20, 30},
		{0, 99, 0},
		{100, 0, 0},
		// ceil(9223372036854775807 * 20 / 100) = ceil(1844674407370955161.4)
		{math.MaxInt64, 20, 1844674407370955162},
		// ceil(9223372036854775807 * 99 / 100) = ceil(9131138316486228048.93)
		{math.MaxInt64, 99, 9131138316486228049},
	} {
		if got := reserveOf(c.lim, c.pct); got != c.want {
			t.Errorf("reserveOf(%d, %d) = %d, want %d", c.lim, c.pct, got, c.want)
		}
	}
}

// A quota hint of math.MaxInt64 reads as math.MaxInt64 remaining, not 0
// (float64(math.MaxInt64) is 2^63, which int64() wraps to math.MinInt64).
func TestStatusOfAHugeHintDoesNotWrap(t *testing.T) {
	th := New(Config{TokensPerMinuteHint: math.MaxInt64, RequestsPerMinuteHint: math.MaxInt64, ReservePercent: 20}, NOW)
	st := th.Status(NOW)
	if st.TokensLimit != math.MaxInt64 || st.TokensRemaining != 9223372036854775807 ||
		st.RequestsLimit != math.MaxInt64 || st.RequestsRemaining != 9223372036854775807 || st.AtReserve {
		t.Fatalf("Status = %+v, want limits and remaining 9223372036854775807, not at reserve", st)
	}
}
