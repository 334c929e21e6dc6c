package limiter

import (
	"math"
	"time"
)

// tolerance absorbs float64 rounding in refill arithmetic: a bucket holding
// cost - 1e-6 tokens admits cost. Without it a rate of 10/13 tokens per second
// would not hold 1 token after 1.3 s (golang/go#34861, BC-16).
const tolerance = 1e-6

// Bucket is a token bucket: it holds up to capacity tokens and refills at
// refillPerSecond tokens per second, computed from the elapsed time since the
// last update (never per tick, so no refill is lost to integer truncation,
// BC-16). Tokens are float64. A bucket may hold debt down to -capacity when
// actual usage exceeds what was charged (BC-15, BC-29).
//
// Bucket is not safe for concurrent use. Tenant applies the same rules to its
// four buckets in a layout of its own (see Tenant). The zero Bucket has
// capacity 0 and never refills.
type Bucket struct {
	capacity float64
	rate     float64 // tokens per second
	tokens   float64
	comp     float64 // rounding error of the refills so far (Kahan; see Tenant.comp)
	last     int64   // Unix nanoseconds of the last update
}

// NewBucket returns a full bucket of capacity tokens refilled at
// refillPerSecond tokens per second, with its clock at now. Negative
// arguments are treated as 0.
func NewBucket(capacity, refillPerSecond float64, now time.Time) *Bucket {
	b := &Bucket{}
	b.init(capacity, refillPerSecond, now)
	return b
}

func (b *Bucket) init(capacity, refillPerSecond float64, now time.Time) {
	capacity, refillPerSecond = max(0, capacity), max(0, refillPerSecond)
	*b = Bucket{capacity: capacity, rate: refillPerSecond, tokens: capacity, last: now.UnixNano()}
}

// advance refills the bucket for the time elapsed since the last update. A
// clock that goes backwards adds nothing and keeps the later timestamp.
func (b *Bucket) advance(now time.Time) { b.advanceNs(now.UnixNano()) }

func (b *Bucket) advanceNs(now int64) {
	d := now - b.last
	if d <= 0 {
		return
	}
	b.last = now
	if b.tokens >= b.capacity {
		return
	}
	y := float64(float64(d)*b.rate/float64(time.Second)) - b.comp
	sum := float64(b.tokens + y)
	if sum >= b.capacity {
		b.tokens, b.comp = b.capacity, 0
		return
	}
	b.comp = float64(sum-b.tokens) - y
	b.tokens = sum
}

// Tokens returns the tokens in the bucket at now (negative while in debt).
func (b *Bucket) Tokens(now time.Time) float64 {
	b.advance(now)
	return b.tokens
}

// Capacity returns the capacity (burst), in tokens.
func (b *Bucket) Capacity() float64 { return b.capacity }

// RefillPerSecond returns the refill rate, in tokens per second.
func (b *Bucket) RefillPerSecond() float64 { return b.rate }

// SetLimits retunes the bucket at now: it is refilled at the old rate up to
// now, then takes the new capacity and rate; the tokens are preserved and
// clamped to [-capacity, capacity] (BC-41: a lowered limit applies at once).
func (b *Bucket) SetLimits(now time.Time, capacity, refillPerSecond float64) {
	b.advance(now)
	b.capacity, b.rate = max(0, capacity), max(0, refillPerSecond)
	b.tokens, b.comp = max(-b.capacity, min(b.capacity, b.tokens)), 0
}

// has reports whether the bucket holds n tokens (within the rounding tolerance).
func (b *Bucket) has(n float64) bool { return b.tokens+tolerance >= n }

// wait returns how long until the bucket holds n tokens at its refill rate:
// the exact deficit / refill time, rounded to the nanosecond (BC-09). It is 0
// when the bucket already holds n, and math.MaxInt64 when it never will.
func (b *Bucket) wait(n float64) time.Duration {
	if b.has(n) {
		return 0
	}
	if n > b.capacity || b.rate <= 0 {
		return math.MaxInt64
	}
	return durationOf((n - b.tokens) / b.rate)
}

// untilFull returns how long until the bucket is full.
func (b *Bucket) untilFull() time.Duration {
	if b.tokens >= b.capacity {
		return 0
	}
	if b.rate <= 0 {
		return math.MaxInt64
	}
	return durationOf((b.capacity - b.tokens) / b.rate)
}

func durationOf(seconds float64) time.Duration {
	ns := math.Round(seconds * float64(time.Second))
	if ns >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(ns)
}

// TakeN removes n tokens at now if the bucket holds them and reports true;
// otherwise it removes nothing and returns false and the time until it will
// hold them (math.MaxInt64 when n exceeds the capacity or the rate is 0).
func (b *Bucket) TakeN(now time.Time, n float64) (ok bool, retryAfter time.Duration) {
	b.advance(now)
	if !b.has(n) {
		return false, b.wait(n)
	}
	b.debit(n)
	return true, 0
}

// Credit returns n tokens to the bucket at now, clamped to the capacity.
func (b *Bucket) Credit(now time.Time, n float64) {
	b.advance(now)
	b.credit(n)
}

// Debit removes n tokens at now even if that puts the bucket in debt; the
// debt is bounded at -capacity.
func (b *Bucket) Debit(now time.Time, n float64) {
	b.advance(now)
	b.debit(n)
}

func (b *Bucket) credit(n float64) {
	if v := b.tokens + n; v < b.capacity {
		b.tokens = v
	} else {
		b.tokens, b.comp = b.capacity, 0
	}
}

func (b *Bucket) debit(n float64) {
	if v := b.tokens - n; v > -b.capacity {
		b.tokens = v
	} else {
		b.tokens, b.comp = -b.capacity, 0
	}
}
