package limiter

import (
	"math"
	"sync"
	"time"
)

// Reason is the machine-readable code of a rejection; the gateway returns it
// as the OpenAI-style error `code` (brief "data plane contract", seed 002
// section 8).
type Reason string

// Rejection reasons.
const (
	// ReasonTokenRate: the weighted token bucket is short. Retryable.
	ReasonTokenRate Reason = "token_rate_limit"
	// ReasonInputTokenRate: the input (prompt) token bucket is short. Retryable.
	ReasonInputTokenRate Reason = "input_token_rate_limit"
	// ReasonOutputTokenRate: the output token bucket is short. Retryable.
	ReasonOutputTokenRate Reason = "output_token_rate_limit"
	// ReasonRequestRate: the request bucket is empty. Retryable.
	ReasonRequestRate Reason = "request_rate_limit"
	// ReasonConcurrency: MaxConcurrent requests are in flight. Retryable.
	ReasonConcurrency Reason = "concurrency_limit"
	// ReasonMemory: the request's KV blocks do not fit next to those held.
	// Retryable.
	ReasonMemory Reason = "memory_limit"
	// ReasonTooLarge: the request exceeds the capacity of a bucket or the KV
	// block limit and can never be admitted unchanged (BC-10, BC-32). Not
	// retryable; the gateway answers 413.
	ReasonTooLarge Reason = "request_too_large"
	// ReasonSuspended: a limit of the tenant is 0 (BC-19, BC-32). Not
	// retryable.
	ReasonSuspended Reason = "tenant_suspended"
)

// Rejection says why a request was refused and when to retry.
//
//   - RetryAfter is the exact time until every short bucket holds the request's
//     cost (deficit / refill rate, BC-09); the gateway rounds it up to whole
//     seconds, at least 1, for the Retry-After header. It is 0 when there is
//     no estimate (concurrency and memory wait for a completion) and when the
//     rejection is not retryable.
//   - Limit, Remaining and Reset describe the dimension that tripped, for the
//     X-RateLimit-* headers: the published per-minute limit (tokens or
//     requests per minute; the maximum for concurrency and KV blocks; 0 when
//     suspended), what is left now (floored, never negative), and the time
//     until that bucket is full again.
//   - For ReasonTooLarge: Unit names what did not fit ("weighted tokens",
//     "input tokens", "output tokens" or "KV blocks"), Need is what the
//     request needs of it and Capacity the most the tenant can ever grant at
//     once (the bucket's capacity, or MaxKVBlocks), so that the refusal can
//     say by how much to shrink the request.
type Rejection struct {
	Reason     Reason
	Retryable  bool
	RetryAfter time.Duration
	Limit      int64
	Remaining  int64
	Reset      time.Duration
	Unit       string
	Need       int64
	Capacity   int64
}

// dimUnits names the unit of each rate dimension, for Rejection.Unit.
var dimUnits = [numDims]string{"weighted tokens", "input tokens", "output tokens", "requests"}

// Limits are one tenant's limits, from its TenantQuota (seed 002 sections 2
// and 5). A nil pointer is unlimited; a value of 0 (or below) suspends the
// tenant: every request is refused with ReasonSuspended (BC-19, BC-32).
//
//   - WeightedPerMinute: weighted tokens per minute; the bucket refills at
//     WeightedPerMinute/60 per second. WeightedBurst is its capacity, in
//     weighted tokens; nil or < 1 means WeightedPerMinute/6 (ten seconds of
//     refill), at least 1.
//   - InputPerMinute, OutputPerMinute: provider tokens per minute for prompts
//     and for output (charged at max output, refunded from usage); each bucket
//     holds rate/6 tokens, at least 1.
//   - RequestsPerMinute: requests per minute; RequestBurst is the capacity of
//     the request bucket, nil or < 1 meaning max(1, RequestsPerMinute/6).
//   - MaxConcurrent: requests in flight. MaxKVBlocks: KV-cache blocks held by
//     requests in flight. The "admit when idle" escape never applies to a
//     limit of 0 (BC-32).
//   - Soft: a soft limit (seed 002 section 5): a request over a token rate is
//     admitted, charged (the bucket goes into debt) and marked
//     Reservation.OverLimit so the caller can deprioritise it. Request rate,
//     concurrency, memory, size and suspension stay hard.
//   - DryRun: the TenantQuota's DryRun enforcement mode, a shadow mode in the
//     manner of Envoy ratelimit's shadow_mode: every decision is computed but
//     nothing is refused. A request that passes is admitted and charged
//     exactly as without DryRun; a request that would be refused (for any
//     reason, including ReasonTooLarge and ReasonSuspended) is admitted with a
//     shadow Reservation that charges nothing, holds no concurrency slot and
//     no KV blocks, and reports the refusal (Reservation.DryRunRejection). The
//     limiter state is therefore exactly that of the same tenant without
//     DryRun, so later decisions, Snapshot and the would-be refusals stay
//     meaningful. Check and Allowed answer "admitted" (nothing is held back).
//     With Soft too, Soft decides first: a request over a token rate is
//     admitted over the limit as usual, and only a hard refusal becomes a
//     shadow reservation.
type Limits struct {
	WeightedPerMinute, WeightedBurst *int64
	InputPerMinute, OutputPerMinute  *int64
	RequestsPerMinute, RequestBurst  *int64
	MaxConcurrent, MaxKVBlocks       *int64
	Soft                             bool
	DryRun                           bool
}

// Dimension indexes of a tenant's rate buckets.
const (
	dimWeighted = iota
	dimInput
	dimOutput
	dimRequests
	numDims
)

var rateReasons = [numDims]Reason{ReasonTokenRate, ReasonInputTokenRate, ReasonOutputTokenRate, ReasonRequestRate}

// nsPerMinute converts a per-minute rate into a refill per nanosecond:
// refill = elapsed ns * perMinute / nsPerMinute, one rounding in float64.
const nsPerMinute = float64(time.Minute)

// Tenant is one tenant's limiter: weighted, input and output token buckets, a
// request bucket, a concurrency counter and a KV block counter (seed 002
// section 3). It is safe for concurrent use: one mutex guards all of it, so a
// check and its charge are atomic (BC-20).
//
// Its buckets follow the rules of Bucket (refill from the elapsed time,
// tolerance, debt down to -capacity), laid out for the admission path in
// three 64-byte cache lines (the struct is 192 bytes, a Go size class whose
// objects are 64-byte aligned): line 0 holds everything an admission or a
// settlement writes (the lock, the clock, the counters, the bucket
// contents), line 1 what only Update writes, line 2 the published rates
// (Update) and the refill compensation, written by a refill while a bucket
// is below its capacity (the bucket's padding held no data before). An
// admission on a full bucket therefore moves one cache line between cores,
// and one below its capacity two. The four buckets share one clock, and the refill of bucket i
// over d nanoseconds is d*perMinute[i]/6e10 tokens, one float64 rounding
// (exact when the product is below 2^53 and the refill a whole number).
type Tenant struct {
	// Cache line 0: written by every admission and settlement.
	mu       sync.Mutex
	last     int64            // Unix nanoseconds of the last refill of every bucket
	inFlight int64            // requests admitted and not settled
	kv       int64            // KV blocks they hold
	tokens   [numDims]float64 // negative while in debt, down to -capacity
	// Cache line 1: the limits, written by Update only.
	on        uint8 // bit i: rate dimension i is limited
	soft      bool
	suspended bool
	dryRun    bool
	// gens are bumped when a bucket is created or removed, so that a
	// reservation does not settle into a bucket created after its admission.
	// They wrap after 65536 changes of one limit, far more than a request in
	// flight can see.
	gens     [numDims]uint16
	_        [4]byte
	maxConc  int64 // -1 unlimited
	maxKV    int64 // -1 unlimited
	capacity [numDims]float64
	// Cache line 2: the published rates, written by Update only, and the
	// refill compensation.
	perMinute [numDims]int64 // -1 unlimited, 0 suspended
	// comp is the rounding error of each bucket's refills so far (Kahan
	// summation): each refill is a fraction of a token added to a level up
	// to the capacity, and adding them one by one lost up to half a unit in
	// the last place of the level each time, which accumulated while the
	// bucket stayed below its capacity (-2.2e-6 token after a million
	// refills at a level of 666,666: the exact boundary was refused). With
	// the compensation the level is exact to its last place whatever the
	// number of refills. Reset whenever the level is set rather than added
	// to (full, clamped, a new limit).
	comp [numDims]float64
}

// NewTenant returns a tenant limiter with limits l at now; every bucket starts
// full.
func NewTenant(l Limits, now time.Time) *Tenant {
	t := &Tenant{last: now.UnixNano()}
	t.apply(t.last, l)
	return t
}

// Update applies new limits at now, live (BC-41): a removed limit stops
// applying at once, a lowered one applies at once (bucket tokens clamped to
// the new capacity), an added one starts with a full bucket. Requests in
// flight and the KV blocks they hold are kept, and they settle into the
// buckets they were charged to as long as those still exist. Switching
// DryRun on or off changes only later admissions: every reservation settles
// by the mode it was admitted under.
func (t *Tenant) Update(now time.Time, l Limits) {
	t.mu.Lock()
	t.apply(now.UnixNano(), l)
	t.mu.Unlock()
}

func (t *Tenant) apply(ns int64, l Limits) {
	t.advance(ns) // refill at the old rates up to now
	t.suspended = false
	t.soft = l.Soft
	t.dryRun = l.DryRun
	t.setDim(dimWeighted, l.WeightedPerMinute, l.WeightedBurst)
	t.setDim(dimInput, l.InputPerMinute, nil)
	t.setDim(dimOutput, l.OutputPerMinute, nil)
	t.setDim(dimRequests, l.RequestsPerMinute, l.RequestBurst)
	t.maxConc = t.maxOf(l.MaxConcurrent)
	t.maxKV = t.maxOf(l.MaxKVBlocks)
}

func (t *Tenant) maxOf(p *int64) int64 {
	if p == nil {
		return -1
	}
	if *p <= 0 {
		t.suspended = true
		return 0
	}
	return *p
}

func (t *Tenant) setDim(i int, rate, burst *int64) {
	bit := uint8(1) << i
	if rate == nil || *rate <= 0 {
		if t.on&bit != 0 {
			t.on &^= bit
			t.gens[i]++
		}
		t.tokens[i], t.capacity[i], t.comp[i] = 0, 0, 0
		t.perMinute[i] = -1
		if rate != nil {
			t.perMinute[i] = 0
			t.suspended = true
		}
		return
	}
	r := *rate
	capacity := max(1, r/6)
	if burst != nil && *burst >= 1 {
		capacity = *burst
	}
	c := float64(capacity)
	t.comp[i] = 0
	if t.on&bit != 0 {
		t.tokens[i] = max(-c, min(c, t.tokens[i]))
	} else {
		t.tokens[i] = c
		t.on |= bit
		t.gens[i]++
	}
	t.capacity[i], t.perMinute[i] = c, r
}

// advance refills every bucket for the time elapsed since the last update,
// with compensated (Kahan) summation of the refills (see comp). A clock that
// goes backwards adds nothing and keeps the later timestamp.
func (t *Tenant) advance(ns int64) {
	d := ns - t.last
	if d <= 0 {
		return
	}
	t.last = ns
	for i := range numDims {
		if t.on&(1<<i) != 0 && t.tokens[i] < t.capacity[i] {
			// The explicit conversions round each step, so that no fused
			// multiply-add undoes the compensation.
			y := float64(float64(d)*float64(t.perMinute[i])/nsPerMinute) - t.comp[i]
			sum := float64(t.tokens[i] + y)
			if sum >= t.capacity[i] {
				t.tokens[i], t.comp[i] = t.capacity[i], 0
				continue
			}
			t.comp[i] = float64(sum-t.tokens[i]) - y
			t.tokens[i] = sum
		}
	}
}

// has reports whether bucket i holds n tokens (within the rounding tolerance).
func (t *Tenant) has(i int, n float64) bool { return t.tokens[i]+tolerance >= n }

// wait returns how long until bucket i holds n tokens: the exact deficit /
// refill time, rounded to the nanosecond (BC-09); 0 when it holds them,
// math.MaxInt64 when it never will.
func (t *Tenant) wait(i int, n float64) time.Duration {
	if t.has(i, n) {
		return 0
	}
	if n > t.capacity[i] {
		return math.MaxInt64
	}
	return nsOf((n - t.tokens[i]) * nsPerMinute / float64(t.perMinute[i]))
}

// untilFull returns how long until bucket i is full.
func (t *Tenant) untilFull(i int) time.Duration {
	if t.tokens[i] >= t.capacity[i] {
		return 0
	}
	return nsOf((t.capacity[i] - t.tokens[i]) * nsPerMinute / float64(t.perMinute[i]))
}

func nsOf(ns float64) time.Duration {
	ns = math.Round(ns)
	if ns >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(ns)
}

// remaining is the floor of bucket i, never negative.
func (t *Tenant) remaining(i int) int64 { return int64(max(0, math.Floor(t.tokens[i]+tolerance))) }

func (t *Tenant) rejection(i int, reason Reason, retryable bool, retryAfter time.Duration) Rejection {
	return Rejection{
		Reason:     reason,
		Retryable:  retryable,
		RetryAfter: retryAfter,
		Limit:      t.perMinute[i],
		Remaining:  t.remaining(i),
		Reset:      t.untilFull(i),
	}
}

// need is what c takes from each rate bucket: weighted tokens, prompt tokens,
// max output tokens, one request.
func need(c *Cost) [numDims]float64 {
	return [numDims]float64{float64(c.Weighted), float64(c.PromptTokens), float64(c.MaxOutputTokens), 1}
}

// verdict is the outcome of check; the Rejection of a refusal is built only
// when one is needed (rejectionOf), so the admitting path copies none.
type verdict uint8

const (
	admitted verdict = iota
	refusedSuspended
	refusedTooLarge   // a rate bucket's capacity; dim says which
	refusedTooLargeKV // MaxKVBlocks
	refusedConcurrency
	refusedMemory
	refusedRate // dim is the first short bucket
)

// check decides admission of c at ns without charging; need is need(c). The
// order is suspension, size, concurrency, KV blocks, token buckets, request
// bucket. It refills the buckets up to ns. over reports a token rate passed
// over under a soft limit.
func (t *Tenant) check(ns int64, c *Cost, need *[numDims]float64) (v verdict, dim int, over bool) {
	if t.suspended {
		return refusedSuspended, 0, false
	}
	t.advance(ns)
	for i := range dimRequests {
		if t.on&(1<<i) != 0 && need[i] > t.capacity[i] {
			return refusedTooLarge, i, false
		}
	}
	if t.maxKV >= 0 && c.KVBlocks > t.maxKV {
		return refusedTooLargeKV, 0, false
	}
	if t.maxConc >= 0 && t.inFlight >= t.maxConc {
		return refusedConcurrency, 0, false
	}
	if t.maxKV >= 0 && t.kv+c.KVBlocks > t.maxKV {
		return refusedMemory, 0, false
	}
	for i := range numDims {
		if t.on&(1<<i) == 0 || t.has(i, need[i]) {
			continue
		}
		if t.soft && i != dimRequests {
			over = true
			continue
		}
		return refusedRate, i, over
	}
	return admitted, 0, over
}

// rejectionOf builds the Rejection of a refusal (v, dim) of c by check, under
// the same lock hold. A rate refusal's RetryAfter covers every short bucket
// that a soft limit does not let pass.
func (t *Tenant) rejectionOf(v verdict, dim int, c *Cost, need *[numDims]float64) Rejection {
	switch v {
	case refusedSuspended:
		return Rejection{Reason: ReasonSuspended}
	case refusedTooLarge:
		r := t.rejection(dim, ReasonTooLarge, false, 0)
		r.Unit, r.Need, r.Capacity = dimUnits[dim], int64(need[dim]), int64(t.capacity[dim])
		return r
	case refusedTooLargeKV:
		return Rejection{Reason: ReasonTooLarge, Limit: t.maxKV, Remaining: max(0, t.maxKV-t.kv),
			Unit: "KV blocks", Need: c.KVBlocks, Capacity: t.maxKV}
	case refusedConcurrency:
		return Rejection{Reason: ReasonConcurrency, Retryable: true, Limit: t.maxConc, Remaining: 0}
	case refusedMemory:
		return Rejection{Reason: ReasonMemory, Retryable: true, Limit: t.maxKV, Remaining: max(0, t.maxKV-t.kv)}
	}
	var wait time.Duration
	for i := dim; i < numDims; i++ {
		if t.on&(1<<i) != 0 && !(t.soft && i != dimRequests) {
			wait = max(wait, t.wait(i, need[i]))
		}
	}
	return t.rejection(dim, rateReasons[dim], true, wait)
}

// Check returns what Admit would answer for c at now, without charging
// anything: nil when c would be admitted. The fair queue uses it as its
// eligibility test. It allocates only when it rejects; see Allowed. Under
// Limits.DryRun it returns nil: nothing is held back.
func (t *Tenant) Check(now time.Time, c Cost) *Rejection {
	ns, n := now.UnixNano(), need(&c)
	t.mu.Lock()
	if t.dryRun {
		t.mu.Unlock()
		return nil
	}
	v, dim, _ := t.check(ns, &c, &n)
	if v == admitted {
		t.mu.Unlock()
		return nil
	}
	rej := t.rejectionOf(v, dim, &c, &n)
	t.mu.Unlock()
	return newRejection(rej)
}

// Allowed reports whether Admit would admit c at now, without charging and
// without allocating; under Limits.DryRun it is always true.
func (t *Tenant) Allowed(now time.Time, c Cost) bool {
	ns, n := now.UnixNano(), need(&c)
	t.mu.Lock()
	v := admitted
	if !t.dryRun {
		v, _, _ = t.check(ns, &c, &n)
	}
	t.mu.Unlock()
	return v == admitted
}

// Eligible reports whether Admit would admit c at now (ok), and whether it
// would admit it over a token rate under a soft limit (over; Limits.Soft,
// seed 002 section 5), without charging and without allocating. The
// dispatcher uses over to deprioritise the tenant in the fair queue. Under
// Limits.DryRun it is always ok and never over.
func (t *Tenant) Eligible(now time.Time, c Cost) (ok, over bool) {
	ns, n := now.UnixNano(), need(&c)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.dryRun {
		return true, false
	}
	v, _, over := t.check(ns, &c, &n)
	return v == admitted, over && v == admitted
}

// Admit atomically checks every dimension for c at now and, only if all pass,
// charges all of them: c.Weighted from the weighted bucket, c.PromptTokens and
// c.MaxOutputTokens from the input and output buckets, one request, one
// concurrency slot and c.KVBlocks KV blocks. A refusal charges nothing (BC-20;
// unlike seed 002, where a request refused by the request bucket kept the
// tokens already taken). Exactly one of the results is non-nil.
//
// Checks run in this order: suspended (ReasonSuspended, BC-19); too large
// for a bucket's capacity or for MaxKVBlocks (ReasonTooLarge, BC-10, BC-32);
// concurrency (in flight >= MaxConcurrent, BC-31); KV blocks (held + need >
// MaxKVBlocks, BC-31); token buckets (weighted, input, output); request
// bucket. The first failing dimension names the Rejection; its RetryAfter
// covers every short bucket.
//
// Under Limits.DryRun Admit never returns a Rejection: a request that would
// be refused gets a shadow Reservation that charged nothing and holds
// nothing, whose DryRunRejection is the Rejection Admit would have returned.
//
// The returned Reservation must be settled with Complete or Cancel on every
// exit path. Admit does not allocate per call: reservations are carved from
// shared slabs of 64 (88 bytes each, so about 96 bytes of heap per
// admission, one slab allocation per 64); AdmitInto allocates nothing. A
// rejection, or a shadow reservation's Rejection, allocates the Rejection.
func (t *Tenant) Admit(now time.Time, c Cost) (*Reservation, *Rejection) {
	ns, n := now.UnixNano(), need(&c)
	t.mu.Lock()
	v, dim, over := t.check(ns, &c, &n)
	if v != admitted {
		rej, dry := t.refuse(v, dim, &c, &n)
		if !dry {
			return nil, newRejection(rej)
		}
		r := newReservation()
		*r = Reservation{t: t, x: &resExtra{shadow: true, rej: rej}, cost: c}
		return r, nil
	}
	on, gens, x := t.charge(&c, &n)
	t.mu.Unlock()
	r := newReservation()
	*r = Reservation{t: t, x: x, cost: c, gens: gens, charged: on, over: over}
	return r, nil
}

// AdmitInto is Admit recording the reservation in *r, storage the caller
// owns (for instance a field of its per-request struct), so that admission
// allocates nothing: on admission (or a shadow admission under
// Limits.DryRun) it fills *r and returns nil; on a refusal it sets *r to the
// zero Reservation, whose settlement is a no-op, and returns the Rejection.
//
// *r must not hold an unsettled reservation, which would be lost, and must
// not be copied once filled (each copy would settle on its own; go vet's
// copylocks check reports copies). Reusing a settled Reservation is the
// caller's choice: any pointer to it then refers to the new reservation,
// which Admit's never-reused slots rule out.
func (t *Tenant) AdmitInto(now time.Time, c Cost, r *Reservation) *Rejection {
	ns, n := now.UnixNano(), need(&c)
	t.mu.Lock()
	v, dim, over := t.check(ns, &c, &n)
	if v != admitted {
		rej, dry := t.refuse(v, dim, &c, &n)
		if !dry {
			*r = Reservation{}
			return newRejection(rej)
		}
		*r = Reservation{t: t, x: &resExtra{shadow: true, rej: rej}, cost: c}
		return nil
	}
	on, gens, x := t.charge(&c, &n)
	t.mu.Unlock()
	*r = Reservation{t: t, x: x, cost: c, gens: gens, charged: on, over: over}
	return nil
}

// ShadowInto records in *r a shadow reservation (Limits.DryRun) for a
// request of cost c that a check outside the limiter would have refused
// with reason (the tenant's budget, or a per-request cap): it charges
// nothing and holds nothing, and its DryRunRejection reports reason. It
// settles like any shadow reservation. It does not allocate beyond the
// record of the refusal.
func (t *Tenant) ShadowInto(c Cost, reason Reason, r *Reservation) {
	*r = Reservation{t: t, x: &resExtra{shadow: true, rej: Rejection{Reason: reason}}, cost: c}
}

// refuse builds the Rejection of a refusal under the lock, releases the
// lock, and reports whether the tenant is in DryRun (the refusal becomes a
// shadow reservation). It is the cold path of Admit and AdmitInto.
//
//go:noinline
func (t *Tenant) refuse(v verdict, dim int, c *Cost, need *[numDims]float64) (Rejection, bool) {
	rej := t.rejectionOf(v, dim, c, need)
	dry := t.dryRun
	t.mu.Unlock()
	return rej, dry
}

// charge takes need from every limited bucket, a concurrency slot and the KV
// blocks of c, under the lock, and returns what it charged. A bucket's debt
// stops at -capacity (BC-29), so a soft-limited tenant deep in debt may be
// charged less than need: x then records what was not taken, so that
// settlement never refunds tokens that were never paid (BC-15); it is nil
// (no allocation) in the usual case.
func (t *Tenant) charge(c *Cost, need *[numDims]float64) (on uint8, gens [numDims]uint16, x *resExtra) {
	on = t.on
	for i := range numDims {
		if on&(1<<i) != 0 {
			after := t.tokens[i] - need[i]
			if after < -t.capacity[i] {
				if x == nil {
					x = &resExtra{}
				}
				x.untaken[i] = -t.capacity[i] - after
				after = -t.capacity[i]
				t.comp[i] = 0
			}
			t.tokens[i] = after
		}
	}
	t.inFlight++
	t.kv += c.KVBlocks
	return on, t.gens, x
}

// Snapshot is a tenant's live figures for status and response headers.
//
//   - InFlight: requests admitted and not yet settled. KVBlocks: the KV blocks
//     they hold.
//   - TokensRemaining: floor of the weighted bucket, in weighted tokens (0
//     while in debt), -1 when the weighted rate is unlimited.
//   - TokensLimitPerMinute: the published weighted rate, -1 when unlimited.
//   - RequestsRemaining: floor of the request bucket, -1 when unlimited.
//   - Limited: a limit binds now: the tenant is suspended, at its concurrency
//     or KV limit, or a bucket holds less than one token. Under Limits.DryRun
//     it is computed the same way (the limits bind in the shadow decisions;
//     shadow reservations are not counted in InFlight or KVBlocks).
//   - TokensReset, RequestsReset: the time until the weighted and the
//     request bucket are full again, debt included (0 when full or
//     unlimited).
type Snapshot struct {
	InFlight, KVBlocks         int64
	TokensRemaining            int64
	TokensLimitPerMinute       int64
	RequestsRemaining          int64
	Limited                    bool
	TokensReset, RequestsReset time.Duration
}

// Snapshot returns the tenant's figures at now.
func (t *Tenant) Snapshot(now time.Time) Snapshot {
	ns := now.UnixNano()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.advance(ns)
	s := Snapshot{InFlight: t.inFlight, KVBlocks: t.kv, TokensRemaining: -1, TokensLimitPerMinute: -1, RequestsRemaining: -1}
	s.Limited = t.suspended || (t.maxConc >= 0 && t.inFlight >= t.maxConc) || (t.maxKV >= 0 && t.kv >= t.maxKV)
	for i := range numDims {
		if t.on&(1<<i) != 0 && !t.has(i, 1) {
			s.Limited = true
		}
	}
	if t.on&(1<<dimWeighted) != 0 {
		s.TokensRemaining = t.remaining(dimWeighted)
		s.TokensLimitPerMinute = t.perMinute[dimWeighted]
		s.TokensReset = t.untilFull(dimWeighted)
	} else if t.perMinute[dimWeighted] == 0 {
		s.TokensRemaining, s.TokensLimitPerMinute = 0, 0
	}
	if t.on&(1<<dimRequests) != 0 {
		s.RequestsRemaining = t.remaining(dimRequests)
		s.RequestsReset = t.untilFull(dimRequests)
	} else if t.perMinute[dimRequests] == 0 {
		s.RequestsRemaining = 0
	}
	return s
}

// Reservation is the record of one admitted request: what was charged to
// which bucket. Settle it exactly once with Complete or Cancel; later calls
// are no-ops (BC-15). It is safe for concurrent use (the "stream done" and
// "client disconnected" paths may race).
//
// Under Limits.DryRun a request that would have been refused gets a shadow
// reservation: it charged nothing, holds no concurrency slot and no KV
// blocks, and DryRunRejection reports the refusal.
type Reservation struct {
	_       noCopy
	t       *Tenant
	x       *resExtra // nil in the usual case: see resExtra
	cost    Cost
	gens    [numDims]uint16
	charged uint8 // bit i: rate bucket i was charged
	over    bool
	done    bool // guarded by t.mu
}

// resExtra is the rare part of a Reservation, allocated only when needed so
// that the common Reservation stays small: a shadow reservation's would-be
// Rejection (Limits.DryRun), or the tokens a charge could not take because
// the bucket's debt stopped at -capacity (soft limit).
type resExtra struct {
	shadow  bool
	rej     Rejection
	untaken [numDims]float64
}

// isShadow reports whether r is a shadow reservation (DryRun).
func (r *Reservation) isShadow() bool { return r.x != nil && r.x.shadow }

// untakenWeighted is the weighted tokens the charge could not take (whole
// tokens, rounded).
func (r *Reservation) untakenWeighted() int64 {
	if r.x == nil {
		return 0
	}
	return int64(math.Round(r.x.untaken[dimWeighted]))
}

// Cost returns the charge recorded at admission (for a shadow reservation,
// the cost that was checked; nothing was charged).
func (r *Reservation) Cost() Cost { return r.cost }

// OverLimit reports whether the request was admitted over a token rate under
// a soft limit (Limits.Soft). It is false for a shadow reservation: dry run
// changes no treatment.
func (r *Reservation) OverLimit() bool { return r.over }

// DryRunRejection returns, for a shadow reservation (Limits.DryRun), the
// Rejection Admit would have returned without DryRun, and nil for a
// reservation that was admitted and charged. The caller counts it as a
// would-be refusal (metrics, status) and serves the request anyway. The
// pointer is the reservation's own record: it stays valid and does not change.
func (r *Reservation) DryRunRejection() *Rejection {
	if !r.isShadow() {
		return nil
	}
	return &r.x.rej
}

// Settlement is the outcome of settling a reservation, in weighted tokens.
// Applied is false when the reservation had already been settled (the zero
// Settlement).
//
//   - ChargedWeighted: what admission took from the weighted bucket: the
//     cost's Weighted, less what a soft-limited tenant's debt floor
//     (-capacity) kept it from taking; 0 for a shadow reservation.
//   - UsedWeighted: the request's actual spend, which the caller settles the
//     tenant's period budget with: the weighted usage from Usage, the charge
//     when usage is unknown (Complete), 0 (Cancel). A shadow reservation
//     reports it by the same rule, from its Cost, so budgets count real spend
//     in dry run too.
//   - RefundedWeighted: ChargedWeighted - UsedWeighted, what settlement gave
//     back to the limiter; a negative value is an extra debit (usage above
//     the charge). It is 0 for a shadow reservation, which charged nothing
//     and settles nothing into the buckets.
type Settlement struct {
	Applied                                         bool
	ChargedWeighted, UsedWeighted, RefundedWeighted int64
}

// used returns the actual prompt, output and weighted tokens of the request
// from u, or the charge when u is unknown (BC-28(a)).
func (c *Cost) used(u Usage) (p, o, w int64) {
	if !u.Valid() {
		return c.PromptTokens, c.MaxOutputTokens, c.Weighted
	}
	p, o = clampTokens(u.PromptTokens), clampTokens(u.OutputTokens)
	return p, o, c.model().Weighted(p, o)
}

// Complete settles the reservation at now from the provider's usage u
// (charge-then-refund, seed 002 section 3). For each token bucket it was
// charged to, it credits charge - actual (clamped to the capacity), or debits
// actual - charge when usage exceeded the charge (debt down to -capacity,
// BC-15, BC-29); the refund is computed from this record, not from the
// bucket's current window (BC-23). With u.Known false, or a negative count
// (Usage.Valid), the charge stands (BC-28(a)). The request bucket is not refunded. It releases the concurrency
// slot and the KV blocks. It is applied exactly once: later Complete or Cancel
// calls return the zero Settlement (BC-15, BC-23).
//
// A shadow reservation (Limits.DryRun) changes no bucket and releases
// nothing; it returns Applied, ChargedWeighted 0, RefundedWeighted 0 and
// UsedWeighted computed as above, once.
func (r *Reservation) Complete(now time.Time, u Usage) Settlement {
	c := &r.cost
	usedP, usedO, usedW := c.used(u)
	if r.isShadow() {
		if !r.settle(0, nil) {
			return Settlement{}
		}
		return Settlement{Applied: true, UsedWeighted: usedW}
	}
	delta := [numDims]int64{c.Weighted - usedW, c.PromptTokens - usedP, c.MaxOutputTokens - usedO, 0}
	if !r.settle(now.UnixNano(), &delta) {
		return Settlement{}
	}
	charged := c.Weighted - r.untakenWeighted()
	return Settlement{Applied: true, ChargedWeighted: charged, UsedWeighted: usedW, RefundedWeighted: charged - usedW}
}

// Cancel settles a request that failed before the provider processed it (no
// ready endpoint, connection refused, a timeout before the upstream call): a
// full refund of every bucket including the request bucket, and release of
// the concurrency slot and KV blocks (BC-22). Whether an upstream 429 or 5xx
// is cancelled or completed is the caller's documented policy. Idempotent with
// Complete: only the first settlement applies. A shadow reservation changes
// nothing and returns Settlement{Applied: true}, once.
func (r *Reservation) Cancel(now time.Time) Settlement {
	return r.refundTokens(now, 1)
}

// Abandon settles a call whose client went away after it was sent to the
// provider and before the provider's first byte: the token buckets are
// refunded in full, as by Cancel (no output reached anyone), but the request
// bucket keeps its charge, as after Complete: the provider received and
// counted the request, and a refund would let a client that disconnects at
// once send requests to the provider at any rate. It releases the
// concurrency slot and the KV blocks. Idempotent with Complete and Cancel:
// only the first settlement applies. A shadow reservation changes nothing
// and returns Settlement{Applied: true}, once.
func (r *Reservation) Abandon(now time.Time) Settlement {
	return r.refundTokens(now, 0)
}

// refundTokens is Cancel (requests 1: the request bucket's charge is given
// back too) and Abandon (requests 0): a full refund of the token buckets,
// the release of the concurrency slot and KV blocks, applied once.
func (r *Reservation) refundTokens(now time.Time, requests int64) Settlement {
	c := &r.cost
	if r.isShadow() {
		if !r.settle(0, nil) {
			return Settlement{}
		}
		return Settlement{Applied: true}
	}
	delta := [numDims]int64{c.Weighted, c.PromptTokens, c.MaxOutputTokens, requests}
	if !r.settle(now.UnixNano(), &delta) {
		return Settlement{}
	}
	charged := c.Weighted - r.untakenWeighted()
	return Settlement{Applied: true, ChargedWeighted: charged, UsedWeighted: 0, RefundedWeighted: charged}
}

// settle credits delta[i] (debits when negative) to every bucket the
// reservation was charged to and that still exists, releases concurrency and
// KV blocks, and reports false when the reservation was already settled. A
// shadow reservation (delta nil) is only marked settled.
func (r *Reservation) settle(ns int64, delta *[numDims]int64) bool {
	t := r.t
	if t == nil {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if r.done {
		return false
	}
	r.done = true
	if delta == nil {
		return true
	}
	t.advance(ns)
	for i := range numDims {
		if r.charged&t.on&(1<<i) == 0 || t.gens[i] != r.gens[i] {
			continue
		}
		// The refund is what was taken minus what was used: never more
		// than was paid (BC-15), also when the charge stopped at the debt
		// floor.
		d := float64(delta[i])
		if r.x != nil {
			d -= r.x.untaken[i]
		}
		if d == 0 {
			continue
		}
		v := t.tokens[i] + d
		if v >= t.capacity[i] || v <= -t.capacity[i] {
			v, t.comp[i] = max(-t.capacity[i], min(t.capacity[i], v)), 0
		}
		t.tokens[i] = v
	}
	t.inFlight = max(0, t.inFlight-1)
	t.kv = max(0, t.kv-r.cost.KVBlocks)
	return true
}

// noCopy makes go vet's copylocks check report copies of a Reservation; it
// takes no space.
type noCopy struct{}

func (*noCopy) Lock()   {}
func (*noCopy) Unlock() {}

// reservationSlab hands out reservations carved from 64-element arrays so that
// Admit does not allocate per call. A slot is never reused: a slab is freed by
// the garbage collector once none of its reservations is referenced, so a
// stale *Reservation can never settle somebody else's request.
type reservationSlab struct{ free []Reservation }

const slabSize = 64

var slabs = sync.Pool{New: func() any { return new(reservationSlab) }}

func newReservation() *Reservation {
	s := slabs.Get().(*reservationSlab)
	if len(s.free) == 0 {
		s.free = make([]Reservation, slabSize)
	}
	r := &s.free[0]
	s.free = s.free[1:]
	slabs.Put(s)
	return r
}

// newRejection copies rej to the heap; returning &rej directly would move rej
// to the heap on the admitting path too.
func newRejection(rej Rejection) *Rejection {
	p := new(Rejection)
	*p = rej
	return p
}

// RetryAfterSeconds converts a Rejection's RetryAfter into the value of the
// Retry-After header: whole seconds, rounded up, at least 1, so a deficit of
// 0.1 s is never advertised as 0 (BC-09, RFC 9110 section 10.2.3).
func RetryAfterSeconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second > 0 {
		s++
	}
	return max(1, s)
}
