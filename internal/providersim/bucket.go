package providersim

import (
	"math"
	"time"
)

// bucket is a continuously replenished token bucket in the style of the
// provider's own quota: capacity = the per-minute limit, refill rate =
// limit/60 units per second, starting full. A limit <= 0 means unlimited: every
// operation is a no-op and the bucket never runs short.
//
// Levels are float64 and refill is derived from the elapsed time since the
// last update, so slow rates never lose fractional refill to truncation.
// bucket is not safe for concurrent use; Server guards it with its mutex.
//
// With window > 0 it is a fixed window instead (classic X-RateLimit-* and
// IETF dialects, Azure sub-windows): limit units per window, the windows
// aligned on multiples of window since the zero time (so, for a window that
// divides a day, on the wall clock: :00, :10, :20 ... for 10 s), the level
// back to limit at each window start, no refill in between.
type bucket struct {
	limit  float64 // units per minute (per window when window > 0), also the capacity
	level  float64 // units available now, in [0, limit]
	last   time.Time
	window time.Duration // 0: continuous; > 0: fixed windows of this length
	start  time.Time     // the current fixed window's start
}

func newBucket(limit int64, now time.Time) bucket {
	return bucket{limit: float64(limit), level: float64(limit), last: now}
}

// newWindow returns a fixed-window bucket of limit units per window, full.
func newWindow(limit int64, window time.Duration, now time.Time) bucket {
	return bucket{limit: float64(limit), level: float64(limit), last: now, window: window, start: now.Truncate(window)}
}

func (b *bucket) unlimited() bool { return b.limit <= 0 }

// perSecond returns the refill rate in units per second.
func (b *bucket) perSecond() float64 { return b.limit / 60 }

// advance refills the bucket for the time elapsed since the last update.
// A clock that steps backwards refills nothing.
func (b *bucket) advance(now time.Time) {
	if b.unlimited() {
		return
	}
	if b.window > 0 {
		if now.After(b.last) {
			b.last = now
		}
		if ws := b.last.Truncate(b.window); ws.After(b.start) {
			b.start, b.level = ws, b.limit
		}
		return
	}
	if el := now.Sub(b.last); el > 0 {
		b.level = math.Min(b.limit, b.level+el.Seconds()*b.perSecond())
		b.last = now
	}
}

// wait returns how long until the bucket holds n units (0 if it already
// does). ok is false when n exceeds the capacity, so no wait will do.
func (b *bucket) wait(n float64) (d time.Duration, ok bool) {
	if b.unlimited() || n <= b.level {
		return 0, true
	}
	if n > b.limit {
		return 0, false
	}
	if b.window > 0 {
		return b.windowEnd().Sub(b.last), true
	}
	return seconds((n - b.level) / b.perSecond()), true
}

// take removes n units; callers check wait first.
func (b *bucket) take(n float64) {
	if !b.unlimited() {
		b.level -= n
	}
}

// give returns n units, clamped at the capacity.
func (b *bucket) give(n float64) {
	if !b.unlimited() && n > 0 {
		b.level = math.Min(b.limit, b.level+n)
	}
}

// windowEnd is the end of the current fixed window.
func (b *bucket) windowEnd() time.Time { return b.start.Add(b.window) }

// resetIn returns the time until the bucket is full again; for a fixed
// window, the time until the window ends (whatever the level, as classic
// and IETF servers report it).
func (b *bucket) resetIn() time.Duration {
	if b.unlimited() {
		return 0
	}
	if b.window > 0 {
		return b.windowEnd().Sub(b.last)
	}
	return seconds((b.limit - b.level) / b.perSecond())
}

// remaining returns the whole units available now (floor).
func (b *bucket) remaining() int64 {
	return int64(math.Floor(b.level))
}

// seconds converts a float number of seconds to a Duration, rounding to the
// nearest nanosecond.
func seconds(s float64) time.Duration {
	return time.Duration(math.Round(s * float64(time.Second)))
}

// retryAfterSeconds renders a wait as whole delay-seconds for Retry-After
// (RFC 9110 section 10.2.3): rounded up, at least 1. A tolerance of 1 µs
// absorbs float noise so that an exact 13 s never becomes 14.
func retryAfterSeconds(d time.Duration) int64 {
	s := int64(math.Ceil((d - time.Microsecond).Seconds()))
	return max(s, 1)
}
