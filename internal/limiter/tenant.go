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
type Rejection struct {
	Reason     Reason
	Retryable  bool
	RetryAfter time.Duration
	Limit      int64
	Remaining  int64
	Reset      time.Duration
}

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
type Limits struct {
	WeightedPerMinute, WeightedBurst *int64
	InputPerMinute, OutputPerMinute  *int64
	RequestsPerMinute, RequestBurst  *int64
	MaxConcurrent, MaxKVBlocks       *int64
	Soft                             bool
}

// Dimension indexes of Tenant.dims.
const (
	dimWeighted = iota
	dimInput
	dimOutput
	dimRequests
	numDims
)

var rateReasons = [numDims]Reason{ReasonTokenRate, ReasonInputTokenRate, ReasonOutputTokenRate, ReasonRequestRate}

// dim is one rate dimension of a tenant.
type dim struct {
	on        bool
	gen       uint32 // bumped whenever the bucket is replaced, so old reservations do not refund into it
	perMinute int64
	b         Bucket
}

func (d *dim) rejection(reason Reason, retryable bool, retryAfter time.Duration) Rejection {
	return Rejection{
		Reason:     reason,
		Retryable:  retryable,
		RetryAfter: retryAfter,
		Limit:      d.perMinute,
		Remaining:  int64(max(0, math.Floor(d.b.tokens+tolerance))),
		Reset:      d.b.untilFull(),
	}
}

// Tenant is one tenant's limiter: weighted, input and output token buckets, a
// request bucket, a concurrency counter and a KV block counter (seed 002
// section 3). It is safe for concurrent use: one mutex guards all of it, so a
// check and its charge are atomic (BC-20).
type Tenant struct {
	mu        sync.Mutex
	dims      [numDims]dim
	soft      bool
	suspended bool
	maxConc   int64 // -1 unlimited
	maxKV     int64 // -1 unlimited
	inFlight  int64
	kv        int64
}

// NewTenant returns a tenant limiter with limits l at now; every bucket starts
// full.
func NewTenant(l Limits, now time.Time) *Tenant {
	t := &Tenant{}
	t.apply(now, l)
	return t
}

// Update applies new limits at now, live (BC-41): a removed limit stops
// applying at once, a lowered one applies at once (bucket tokens clamped to
// the new capacity), an added one starts with a full bucket. Requests in
// flight and the KV blocks they hold are kept, and they settle into the
// buckets they were charged to as long as those still exist.
func (t *Tenant) Update(now time.Time, l Limits) {
	t.mu.Lock()
	t.apply(now, l)
	t.mu.Unlock()
}

func (t *Tenant) apply(now time.Time, l Limits) {
	t.suspended = false
	t.soft = l.Soft
	t.setDim(now, dimWeighted, l.WeightedPerMinute, l.WeightedBurst)
	t.setDim(now, dimInput, l.InputPerMinute, nil)
	t.setDim(now, dimOutput, l.OutputPerMinute, nil)
	t.setDim(now, dimRequests, l.RequestsPerMinute, l.RequestBurst)
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

func (t *Tenant) setDim(now time.Time, i int, rate, burst *int64) {
	d := &t.dims[i]
	if rate == nil || *rate <= 0 {
		if d.on {
			d.on = false
			d.gen++
		}
		d.perMinute = -1
		if rate != nil {
			d.perMinute = 0
			t.suspended = true
		}
		return
	}
	r := *rate
	capacity := max(1, r/6)
	if burst != nil && *burst >= 1 {
		capacity = *burst
	}
	refill := float64(r) / 60
	if d.on {
		d.b.SetLimits(now, float64(capacity), refill)
	} else {
		d.b.init(float64(capacity), refill, now)
		d.on = true
		d.gen++
	}
	d.perMinute = r
}

// check decides admission of c at now without charging. The order is
// suspension, size, concurrency, KV blocks, token buckets, request bucket.
func (t *Tenant) check(now time.Time, c *Cost) (rej Rejection, ok, over bool) {
	if t.suspended {
		return Rejection{Reason: ReasonSuspended}, false, false
	}
	need := [numDims]float64{float64(c.Weighted), float64(c.PromptTokens), float64(c.MaxOutputTokens), 1}
	for i := range dimRequests {
		if d := &t.dims[i]; d.on && need[i] > d.b.capacity {
			d.b.advance(now)
			return d.rejection(ReasonTooLarge, false, 0), false, false
		}
	}
	if t.maxKV >= 0 && c.KVBlocks > t.maxKV {
		return Rejection{Reason: ReasonTooLarge, Limit: t.maxKV, Remaining: max(0, t.maxKV-t.kv)}, false, false
	}
	if t.maxConc >= 0 && t.inFlight >= t.maxConc {
		return Rejection{Reason: ReasonConcurrency, Retryable: true, Limit: t.maxConc, Remaining: 0}, false, false
	}
	if t.maxKV >= 0 && t.kv+c.KVBlocks > t.maxKV {
		return Rejection{Reason: ReasonMemory, Retryable: true, Limit: t.maxKV, Remaining: max(0, t.maxKV-t.kv)}, false, false
	}
	first := -1
	var wait time.Duration
	ns := now.UnixNano()
	for i := range numDims {
		d := &t.dims[i]
		if !d.on {
			continue
		}
		d.b.advanceNs(ns)
		if d.b.has(need[i]) {
			continue
		}
		if t.soft && i != dimRequests {
			over = true
			continue
		}
		if first < 0 {
			first = i
		}
		wait = max(wait, d.b.wait(need[i]))
	}
	if first >= 0 {
		return t.dims[first].rejection(rateReasons[first], true, wait), false, over
	}
	return Rejection{}, true, over
}

// Check returns what Admit would answer for c at now, without charging
// anything: nil when c would be admitted. The fair queue uses it as its
// eligibility test. It allocates only when it rejects; see Allowed.
func (t *Tenant) Check(now time.Time, c Cost) *Rejection {
	t.mu.Lock()
	rej, ok, _ := t.check(now, &c)
	t.mu.Unlock()
	if ok {
		return nil
	}
	return newRejection(rej)
}

// Allowed reports whether Admit would admit c at now, without charging and
// without allocating.
func (t *Tenant) Allowed(now time.Time, c Cost) bool {
	t.mu.Lock()
	_, ok, _ := t.check(now, &c)
	t.mu.Unlock()
	return ok
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
// The returned Reservation must be settled with Complete or Cancel on every
// exit path. Admit does not allocate per call (reservations are carved from
// shared slabs); a rejection allocates the Rejection.
func (t *Tenant) Admit(now time.Time, c Cost) (*Reservation, *Rejection) {
	t.mu.Lock()
	rej, ok, over := t.check(now, &c)
	if !ok {
		t.mu.Unlock()
		return nil, newRejection(rej)
	}
	need := [numDims]float64{float64(c.Weighted), float64(c.PromptTokens), float64(c.MaxOutputTokens), 1}
	var charged [numDims]bool
	var gens [numDims]uint32
	for i := range numDims {
		if d := &t.dims[i]; d.on {
			d.b.debit(need[i])
			charged[i], gens[i] = true, d.gen
		}
	}
	t.inFlight++
	t.kv += c.KVBlocks
	t.mu.Unlock()
	r := newReservation()
	*r = Reservation{t: t, cost: c, over: over, charged: charged, gens: gens}
	return r, nil
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
//     or KV limit, or a bucket holds less than one token.
type Snapshot struct {
	InFlight, KVBlocks   int64
	TokensRemaining      int64
	TokensLimitPerMinute int64
	RequestsRemaining    int64
	Limited              bool
}

// Snapshot returns the tenant's figures at now.
func (t *Tenant) Snapshot(now time.Time) Snapshot {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := Snapshot{InFlight: t.inFlight, KVBlocks: t.kv, TokensRemaining: -1, TokensLimitPerMinute: -1, RequestsRemaining: -1}
	s.Limited = t.suspended || (t.maxConc >= 0 && t.inFlight >= t.maxConc) || (t.maxKV >= 0 && t.kv >= t.maxKV)
	for i := range numDims {
		d := &t.dims[i]
		if !d.on {
			continue
		}
		d.b.advance(now)
		if !d.b.has(1) {
			s.Limited = true
		}
	}
	if d := &t.dims[dimWeighted]; d.on {
		s.TokensRemaining = int64(max(0, math.Floor(d.b.tokens+tolerance)))
		s.TokensLimitPerMinute = d.perMinute
	} else if d.perMinute == 0 {
		s.TokensRemaining, s.TokensLimitPerMinute = 0, 0
	}
	if d := &t.dims[dimRequests]; d.on {
		s.RequestsRemaining = int64(max(0, math.Floor(d.b.tokens+tolerance)))
	} else if d.perMinute == 0 {
		s.RequestsRemaining = 0
	}
	return s
}

// Reservation is the record of one admitted request: what was charged to
// which bucket. Settle it exactly once with Complete or Cancel; later calls
// are no-ops (BC-15). It is safe for concurrent use (the "stream done" and
// "client disconnected" paths may race).
type Reservation struct {
	t       *Tenant
	cost    Cost
	over    bool
	done    bool // guarded by t.mu
	charged [numDims]bool
	gens    [numDims]uint32
}

// Cost returns the charge recorded at admission.
func (r *Reservation) Cost() Cost { return r.cost }

// OverLimit reports whether the request was admitted over a token rate under
// a soft limit (Limits.Soft).
func (r *Reservation) OverLimit() bool { return r.over }

// Settlement is the outcome of settling a reservation, in weighted tokens.
// Applied is false when the reservation had already been settled (the zero
// Settlement). RefundedWeighted = ChargedWeighted - UsedWeighted; a negative
// value is an extra debit (usage above the charge).
type Settlement struct {
	Applied                                         bool
	ChargedWeighted, UsedWeighted, RefundedWeighted int64
}

// Complete settles the reservation at now from the provider's usage u
// (charge-then-refund, seed 002 section 3). For each token bucket it was
// charged to, it credits charge - actual (clamped to the capacity), or debits
// actual - charge when usage exceeded the charge (debt down to -capacity,
// BC-15, BC-29); the refund is computed from this record, not from the
// bucket's current window (BC-23). With u.Known false the charge stands
// (BC-28(a)). The request bucket is not refunded. It releases the concurrency
// slot and the KV blocks. It is applied exactly once: later Complete or Cancel
// calls return the zero Settlement (BC-15, BC-23).
func (r *Reservation) Complete(now time.Time, u Usage) Settlement {
	c := &r.cost
	usedP, usedO, usedW := c.PromptTokens, c.MaxOutputTokens, c.Weighted
	if u.Known {
		usedP, usedO = clampTokens(u.PromptTokens), clampTokens(u.OutputTokens)
		usedW = c.model().Weighted(usedP, usedO)
	}
	if !r.settle(now, [numDims]int64{c.Weighted - usedW, c.PromptTokens - usedP, c.MaxOutputTokens - usedO, 0}) {
		return Settlement{}
	}
	return Settlement{Applied: true, ChargedWeighted: c.Weighted, UsedWeighted: usedW, RefundedWeighted: c.Weighted - usedW}
}

// Cancel settles a request that failed before the provider processed it (no
// ready endpoint, connection refused, a timeout before the upstream call): a
// full refund of every bucket including the request bucket, and release of
// the concurrency slot and KV blocks (BC-22). Whether an upstream 429 or 5xx
// is cancelled or completed is the caller's documented policy. Idempotent with
// Complete: only the first settlement applies.
func (r *Reservation) Cancel(now time.Time) Settlement {
	c := &r.cost
	if !r.settle(now, [numDims]int64{c.Weighted, c.PromptTokens, c.MaxOutputTokens, 1}) {
		return Settlement{}
	}
	return Settlement{Applied: true, ChargedWeighted: c.Weighted, UsedWeighted: 0, RefundedWeighted: c.Weighted}
}

// settle credits delta[i] (debits when negative) to every bucket the
// reservation was charged to and that still exists, releases concurrency and
// KV blocks, and reports false when the reservation was already settled.
func (r *Reservation) settle(now time.Time, delta [numDims]int64) bool {
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
	for i := range numDims {
		d := &t.dims[i]
		if !r.charged[i] || !d.on || d.gen != r.gens[i] || delta[i] == 0 {
			continue
		}
		d.b.advance(now)
		if delta[i] > 0 {
			d.b.credit(float64(delta[i]))
		} else {
			d.b.debit(float64(-delta[i]))
		}
	}
	t.inFlight = max(0, t.inFlight-1)
	t.kv = max(0, t.kv-r.cost.KVBlocks)
	return true
}

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
