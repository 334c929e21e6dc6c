package throttle

import (
	"math"
	"math/rand/v2"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

// Priority is the class of a call: interactive calls (a user is waiting) may
// use the reserve; batch calls may not (seed: "Two paths, one quota").
type Priority int

const (
	// Interactive calls may use the whole remaining quota, reserve included.
	Interactive Priority = iota
	// Batch calls start only while the reserve stays untouched.
	Batch
)

// String returns "interactive" or "batch".
func (p Priority) String() string {
	if p == Interactive {
		return "interactive"
	}
	return "batch"
}

// Window is the window of per-minute quotas: the span of the sliding window
// log used with hints (BC-13) and with a provider limit whose window is not
// stated, and the age after which a provider figure without a longer reset
// is stale. A limit whose window the provider states (Dimension.Window: an
// IETF policy's w) is counted over that window instead.
const Window = 60 * time.Second

const (
	// probeTimeout: a probe call whose outcome is never reported (no
	// Observe, OnTooManyRequests or Done) stops blocking other probes after
	// this long (the longest upstream timeout a ProviderPool allows is 3600 s,
	// the default 120 s).
	probeTimeout = 2 * time.Minute
	// probeRecheck is the base wait returned while a probe is in flight.
	probeRecheck = 100 * time.Millisecond
	// refundRecheck is the longest wait an input or output dimension
	// returns while calls it charged are in flight: their responses
	// report refunds (Throttle.DoneTokens) and new figures.
	refundRecheck = 100 * time.Millisecond
	// anthropicStep is the rounding of Anthropic's input-tokens and
	// output-tokens remaining: "rounded to the nearest thousand" (provider
	// header reference, Anthropic section).
	anthropicStep = 1000
	// minWait is the smallest wait TryStart returns when it refuses.
	minWait = time.Millisecond
	// levelEpsilon absorbs float rounding in the replenishment estimate, in
	// tokens or requests.
	levelEpsilon = 1e-6
	// subWindowPace is the share of the per-minute limit paced evenly after
	// a sub-window 429 (see Throttle.subWindow): 1% below the limit, so the
	// jitter between a start here and its arrival at the provider cannot
	// put one call too many into a sub-window.
	subWindowPace = 0.99
)

// Config configures a Throttle. The zero value is usable: no reserve, no
// hints, 1 s default backoff, 1 s jitter window, no borrowing.
type Config struct {
	// ReservePercent is the share of each dimension's limit, in percent in
	// [0, 100), kept for interactive calls: a batch call starts only while
	// remaining-after-start stays >= ceil(limit*ReservePercent/100), per
	// dimension (seed "The adaptive throttle"; BC-39). Values outside are
	// clamped to [0, 99].
	ReservePercent int64
	// TokensPerMinuteHint and RequestsPerMinuteHint are the ProviderPool's
	// quota hints (provider tokens per minute, requests per minute); 0 means
	// unknown. A hint is the limit until headers give one, and paces calls
	// with a sliding 60 s window log while the provider sends no figures.
	TokensPerMinuteHint, RequestsPerMinuteHint int64
	// DefaultBackoff is the pause after a 429 that carries no usable
	// Retry-After and no usable reset of an exhausted dimension. <= 0 means
	// 1 s.
	DefaultBackoff time.Duration
	// JitterWindow spreads callers released after a pause or a fixed-window
	// reset over [release, release+JitterWindow] (BC-11). 0 means 1 s; < 0
	// disables jitter.
	JitterWindow time.Duration
	// BorrowAfter lets batch calls use the reserve once no interactive call
	// has arrived for this long; the reserve returns at the next interactive
	// call. 0 (or negative): batch never borrows (BC-39).
	BorrowAfter time.Duration
	// Rand returns a number in [0, 1) for jitter; nil uses math/rand/v2.
	// Called with the throttle's lock held.
	Rand func() float64
	// Dialect is the ProviderPool's spec.upstream.dialect hint ("Auto",
	// "OpenAI", "Anthropic", "Azure", "Classic", "IETF", case-insensitive):
	// Throttle.ParseHeaders reads only that dialect's rate-limit headers
	// (see ParseHeadersDialect). "" or "Auto" reads every dialect.
	Dialect string
}

func (c Config) normalized() Config {
	c.ReservePercent = min(max(c.ReservePercent, 0), 99)
	c.TokensPerMinuteHint = max(c.TokensPerMinuteHint, 0)
	c.RequestsPerMinuteHint = max(c.RequestsPerMinuteHint, 0)
	if c.DefaultBackoff <= 0 {
		c.DefaultBackoff = time.Second
	}
	switch {
	case c.JitterWindow == 0:
		c.JitterWindow = time.Second
	case c.JitterWindow < 0:
		c.JitterWindow = 0
	}
	c.BorrowAfter = max(c.BorrowAfter, 0)
	if c.Rand == nil {
		c.Rand = rand.Float64
	}
	return c
}

// Cost is what one call is charged at start, in tokens: Prompt to the input
// dimension, MaxOutput (max_tokens x n) to the output dimension, their sum
// to the provider-token dimension, and 1 to requests. Anthropic charges
// max_tokens against OTPM at admission and refunds the unused part at the
// end (provider header reference, Anthropic section; seed "Reading the
// quota instead of guessing it").
type Cost struct {
	// Prompt is the prompt (input) tokens, MaxOutput the max output tokens.
	// Negative values count as 0.
	Prompt, MaxOutput int64
}

// Permit identifies one call started by TryStart: its sequence number (1, 2,
// ... in start order) and the provider tokens charged for it. Pass it back to
// Observe, OnTooManyRequests or Done. The zero Permit stands for a call not
// started through the throttle.
type Permit struct {
	seq    uint64
	tokens int64
	at     time.Time
}

// Seq is the permit's start sequence number (0 for the zero Permit).
func (p Permit) Seq() uint64 { return p.seq }

// Tokens is the number of provider tokens charged at start.
func (p Permit) Tokens() int64 { return p.tokens }

// StartedAt is the time the call was started.
func (p Permit) StartedAt() time.Time { return p.at }

// Status is a snapshot of a throttle, for the ProviderPool status and metrics.
type Status struct {
	// Limits and estimated remaining quota now, in provider tokens and
	// requests; -1 unknown.
	TokensLimit, TokensRemaining, RequestsLimit, RequestsRemaining int64
	// TokensReset and RequestsReset are when the provider's last figure said
	// the dimension is fully replenished (zero if unknown).
	TokensReset, RequestsReset time.Time
	// PausedUntil is the end of the pause after the last 429 (may be past).
	PausedUntil time.Time
	// Dialect is the dialect of the last response that carried figures.
	Dialect string
	// Paused: now is before PausedUntil. AtReserve: a batch call of one
	// token would be refused by the reserve in some dimension now.
	Paused, AtReserve bool
}

// entry is one started call in a dimension's log. It holds no pointers, so
// a long log costs the garbage collector nothing to scan.
type entry struct {
	seq     uint64
	at      int64 // start time, Unix nanoseconds
	charged int64 // cost at start, never changed (window log sums)
	pending int64 // cost still unaccounted by a provider figure (refundable by Done)
	cum     int64 // cumulative charged up to and including this entry
	// floor is the smallest seq of a call still unanswered when this call
	// started (this call's own seq when every earlier call had answered):
	// the provider's figure for this call may lack the calls from floor on.
	floor uint64
	// ans is the largest seq started when this call's outcome was reported
	// (Observe, OnTooManyRequests or Done); 0 while unanswered. A call with
	// ans < s answered before the call s started, so the provider had
	// processed it before it admitted s.
	ans uint64
}

// entryLog is a growable ring buffer of entries in start order (seq and at
// non-decreasing).
type entryLog struct {
	buf  []entry // len is zero or a power of two
	head int
	n    int
}

func (l *entryLog) len() int { return l.n }

func (l *entryLog) at(i int) *entry { return &l.buf[(l.head+i)&(len(l.buf)-1)] }

func (l *entryLog) push(e entry) {
	if l.n == len(l.buf) {
		nb := make([]entry, max(16, 2*len(l.buf)))
		for i := 0; i < l.n; i++ {
			nb[i] = *l.at(i)
		}
		l.buf, l.head = nb, 0
	}
	l.buf[(l.head+l.n)&(len(l.buf)-1)] = e
	l.n++
}

func (l *entryLog) popFront() {
	l.head = (l.head + 1) & (len(l.buf) - 1)
	l.n--
}

// search is the smallest index i in [0, len) with f(entry i), or len.
func (l *entryLog) search(f func(e *entry) bool) int {
	return sort.Search(l.n, func(i int) bool { return f(l.at(i)) })
}

// seqIndex is the smallest index i in [0, len) with entry i's seq >= s, or
// len. Every call started records one entry in each dimension, so the seqs
// of a log are usually consecutive and entry i has seq first+i: that index
// is tried first and checked against its neighbour (two reads, O(1)); a log
// with gaps falls back to the binary search. The log holds a Window of
// starts (300,000 at 5,000 calls a second), where the binary search cost
// about twenty cache misses a call.
func (l *entryLog) seqIndex(s uint64) int {
	if l.n == 0 {
		return 0
	}
	first := l.at(0).seq
	if s <= first {
		return 0
	}
	if d := s - first; d <= uint64(l.n) {
		i := int(d)
		if (i == l.n || l.at(i).seq >= s) && l.at(i-1).seq < s {
			return i
		}
	}
	return l.search(func(e *entry) bool { return e.seq >= s })
}

type mode int

const (
	modeProbe      mode = iota // nothing known: one probe call at a time
	modeSilent                 // responses carry no figure and there is no hint: 429-only
	modeBlocked                // a fresh figure says 0 left and the limit is unknown
	modeContinuous             // fresh figure, token bucket replenished continuously
	modeStep                   // fresh figure, fixed window (classic, IETF), before its reset
	modeWindow                 // sliding window log (60 s, or the limit's stated window) against the limit
)

// dimension is the throttle's state for one quota dimension.
type dimension struct {
	hint int64 // configured per-minute hint, 0 unknown
	// optional: the dimension exists only for some dialects (Anthropic
	// input and output tokens): while nothing is known of it, it never
	// blocks (no probe, no pacing); only figures make it count.
	optional bool
	hdrLimit int64 // limit from headers, -1 unknown
	// hdrWindow is the window of hdrLimit when the provider stated it
	// (Dimension.Window), 0 unknown: see window.
	hdrWindow time.Duration
	maxSeen   int64 // largest remaining ever observed: a lower bound of the limit

	hasFig   bool
	figRem   int64
	figAt    time.Time
	figReset time.Duration // -1 unknown
	figSeq   uint64        // the call whose response gave the figure (0: not started here)
	// figFloor is the floor of the figure's call: the starts before it are
	// included in the figure; those from figFloor to figSeq only when they
	// answered before figSeq started (see covered). Concurrent calls reach
	// the provider in any order, so a call still unanswered when figSeq
	// started may have been admitted after it.
	figFloor uint64
	figStep  bool // fixed window (classic, IETF) rather than continuous
	// figBeyond, when > 0, is the figure's Beyond: what another quota of
	// the dimension that outlasts the figure's reset had left, which caps
	// the estimate (less the starts the figure does not cover) while the
	// figure is fresh, across its reset.
	figBeyond int64
	// winFrom is the start of the current fixed window as seen here: the
	// reset instant of the previous window's figure, once passed, or the
	// start of the call whose figure shows that the provider rolled the
	// window over before that instant (zero before the first reset). A fixed window never admits more than the
	// limit, so the estimate is also capped at limit minus the starts since
	// winFrom: figures of calls admitted out of start order (concurrent
	// calls reach the provider in any order) cannot then let more than the
	// limit start in one window.
	winFrom time.Time
	// tat is the earliest start allowed by the even pacing engaged after a
	// sub-window 429 (Throttle.subWindow), in Unix ns: GCRA's theoretical
	// arrival time.
	tat int64

	silent bool

	log entryLog
}

func newDimension(hint int64) dimension {
	return dimension{hint: hint, hdrLimit: -1, figReset: -1}
}

// limit is the limit in effect: from headers, else the hint, else the
// largest remaining seen; -1 when none is known.
func (d *dimension) limit() int64 {
	switch {
	case d.hdrLimit > 0:
		return d.hdrLimit
	case d.hint > 0:
		return d.hint
	case d.maxSeen > 0:
		return d.maxSeen
	}
	return -1
}

// window is the span the limit in effect is counted over: the provider's
// stated window of a header limit (an IETF policy's w: a daily quota is
// counted over a day, a per-second one over a second), else Window (the
// hints and every other limit are per minute).
func (d *dimension) window() time.Duration {
	if d.hdrLimit > 0 && d.hdrWindow > 0 {
		return d.hdrWindow
	}
	return Window
}

// fresh reports whether the last figure still describes the provider: for
// Window, or for its reset if longer.
func (d *dimension) fresh(now time.Time) bool {
	return d.hasFig && now.Sub(d.figAt) < max(Window, d.figReset)
}

// firstAfterSeq is the index in the log of the first entry with seq > s.
func (d *dimension) firstAfterSeq(s uint64) int {
	if s == math.MaxUint64 {
		return d.log.len()
	}
	return d.log.seqIndex(s + 1)
}

// uncoveredFrom is the index in the log of the first entry the figure may
// not include; entries before it are all covered.
func (d *dimension) uncoveredFrom() int {
	if d.figStep {
		return d.firstAfterSeq(d.figSeq)
	}
	return d.log.seqIndex(d.figFloor)
}

// covered reports whether the provider's figure includes the call e.
//
// For a continuous bucket: the figure's own call, the calls started before
// figFloor, and those started before figSeq that answered before figSeq
// started (the provider had processed them before it admitted figSeq). Any
// other call, even one started earlier, may reach the provider after
// figSeq and stays charged: with Anthropic's remaining rounded down to a
// thousand, a figure that steps up by a thousand releases a burst of
// concurrent calls, and the first of their figures to arrive may be that
// of a call the provider admitted before the others.
//
// For a fixed window (figStep): every call started up to figSeq. A refusal
// there waits for the window's end, so keeping the burst that opens a
// window charged twice would cost the window; the cap at the limit minus
// the starts since winFrom bounds the error of out-of-order figures instead.
func (d *dimension) covered(e *entry) bool {
	if d.figStep {
		return e.seq <= d.figSeq
	}
	return e.seq < d.figFloor || e.seq == d.figSeq || (e.seq < d.figSeq && e.ans != 0 && e.ans < d.figSeq)
}

// ownRefund is what the provider gave back, after the figure, of the charge
// of the figure's own call: Anthropic charges max_tokens against OTPM at
// admission, when the figure is taken, and refunds the unused part at the
// end of the call (provider header reference, Anthropic section), which
// Throttle.DoneTokens reports. Every other call the figure covers answered
// before the figure's call started, so the figure already holds its refund.
// Only the input and output dimensions (optional) are refunded this way.
func (d *dimension) ownRefund() float64 {
	if !d.optional {
		return 0
	}
	if e := d.entry(d.figSeq); e != nil {
		return float64(e.charged - e.pending)
	}
	return 0
}

// inFlight reports whether a call the figure does not cover is still
// unanswered (its charge may yet be refunded).
func (d *dimension) inFlight() bool {
	for i := d.uncoveredFrom(); i < d.log.len(); i++ {
		if e := d.log.at(i); e.ans == 0 && !d.covered(e) {
			return true
		}
	}
	return false
}

func (d *dimension) pendingSum() int64 {
	var sum int64
	for i := d.uncoveredFrom(); i < d.log.len(); i++ {
		if e := d.log.at(i); !d.covered(e) {
			sum += e.pending
		}
	}
	return sum
}

// span is how far back the log counts starts not before since: the
// limit's window for a sliding count (since zero: no figure, or a limit
// without one); from a fixed window's start (since set), every start since
// it, up to max(Window, window) back. A fixed window's figures arrive late
// and its integer-second resets are rounded up, so the throttle's view of
// the window may last longer than the window: a count that slid over the
// window alone dropped the window's first starts and let the provider
// refuse calls.
func (d *dimension) span(since time.Time) time.Duration {
	if since.IsZero() {
		return d.window()
	}
	return max(Window, d.window())
}

// windowStart is the index in the log of the first entry inside the sliding
// window (now-span, now] and not before since.
func (d *dimension) windowStart(now, since time.Time) int {
	from := now.Add(-d.span(since)).UnixNano()
	lo := from + 1
	if !since.IsZero() {
		lo = max(lo, since.UnixNano())
	}
	return d.log.search(func(e *entry) bool { return e.at >= lo })
}

func (d *dimension) windowSum(now, since time.Time) int64 {
	i := d.windowStart(now, since)
	if i >= d.log.len() {
		return 0
	}
	first := d.log.at(i)
	return d.log.at(d.log.len()-1).cum - first.cum + first.charged
}

// rate is the continuous replenishment rate in units per nanosecond: derived
// from the figure (the reset is the time until full), else limit per window.
func (d *dimension) rate(lim int64) float64 {
	rem := min(d.figRem, lim)
	if d.figReset > 0 && lim > rem {
		return float64(lim-rem) / float64(d.figReset)
	}
	return float64(lim) / float64(d.window())
}

// state evaluates the dimension at now: its mode, limit, estimated level and,
// for modeStep and modeBlocked, the reset instant; for modeWindow the lower
// bound of the counted starts.
func (d *dimension) state(now time.Time) (m mode, lim int64, level float64, at time.Time) {
	lim = d.limit()
	if lim <= 0 {
		if d.fresh(now) {
			resetAt := d.figAt.Add(d.window())
			if d.figReset >= 0 {
				resetAt = d.figAt.Add(d.figReset)
			}
			if now.Before(resetAt) {
				return modeBlocked, -1, float64(d.figRem - d.pendingSum()), resetAt
			}
		}
		if d.silent {
			return modeSilent, -1, 0, time.Time{}
		}
		return modeProbe, -1, 0, time.Time{}
	}
	if d.fresh(now) {
		if !d.figStep {
			r := d.rate(lim)
			level = float64(min(d.figRem, lim)) + d.ownRefund()
			prev := d.figAt.UnixNano()
			for i := d.uncoveredFrom(); i < d.log.len(); i++ {
				e := d.log.at(i)
				if d.covered(e) {
					continue
				}
				if e.at > prev {
					level = math.Min(float64(lim), level+r*float64(e.at-prev))
					prev = e.at
				}
				level -= float64(e.pending)
			}
			if n := now.UnixNano(); n > prev {
				level = math.Min(float64(lim), level+r*float64(n-prev))
			}
			return modeContinuous, lim, d.capBeyond(level), time.Time{}
		}
		resetAt := d.figAt.Add(d.window())
		if d.figReset >= 0 {
			resetAt = d.figAt.Add(d.figReset)
		}
		if now.Before(resetAt) {
			level := float64(min(d.figRem, lim) - d.pendingSum())
			if !d.winFrom.IsZero() && !now.Before(d.winFrom) {
				level = math.Min(level, float64(lim-d.windowSum(now, d.winFrom)))
			}
			return modeStep, lim, d.capBeyond(level), resetAt
		}
		return modeWindow, lim, d.capBeyond(float64(lim - d.windowSum(now, resetAt))), resetAt
	}
	return modeWindow, lim, float64(lim - d.windowSum(now, time.Time{})), time.Time{}
}

// capBeyond caps a fresh figure's level at its figBeyond less the starts
// the figure does not cover.
func (d *dimension) capBeyond(level float64) float64 {
	if d.figBeyond <= 0 {
		return level
	}
	return math.Min(level, float64(d.figBeyond-d.pendingSum()))
}

// verdict is one dimension's answer to "may a call of this cost start?".
type verdict struct {
	ok     bool
	probe  bool          // allowed only as the single probe call
	wait   time.Duration // when !ok
	jitter bool          // wait ends at a herd instant (reset): spread it
}

// reserveOf is the reserve of a limit, ceil(lim*pct/100) for lim >= 0 and
// pct in [0, 99], computed without overflow for every lim up to
// math.MaxInt64.
func reserveOf(lim, pct int64) int64 { return lim/100*pct + (lim%100*pct+99)/100 }

// check answers for a call of cost units with reservePct percent of the
// limit kept back.
func (d *dimension) check(now time.Time, cost, reservePct int64) verdict {
	m, lim, level, at := d.state(now)
	switch m {
	case modeProbe:
		if d.optional {
			return verdict{ok: true}
		}
		return verdict{ok: true, probe: true}
	case modeSilent:
		return verdict{ok: true}
	case modeBlocked:
		if level+levelEpsilon >= float64(cost) {
			return verdict{ok: true}
		}
		return verdict{wait: at.Sub(now), jitter: true}
	}
	need := cost + reserveOf(lim, reservePct)
	if need > lim {
		// A call that cannot fit beside the reserve (or at all) starts only
		// when the dimension is full, so it is never refused forever.
		need = lim
	}
	if level+levelEpsilon >= float64(need) {
		return verdict{ok: true}
	}
	switch m {
	case modeContinuous:
		r := d.rate(lim)
		ns := math.Ceil((float64(need) - level) / r)
		if ns > float64(MaxReset) {
			ns = float64(MaxReset)
		}
		if d.optional && ns > float64(refundRecheck) && d.inFlight() {
			// Calls in flight hold their max_tokens, of which the provider
			// refunds the unused part at their end: ask again then rather
			// than wait for the refill of charges that are given back.
			ns = float64(refundRecheck)
		}
		return verdict{wait: time.Duration(ns)}
	case modeStep:
		return verdict{wait: at.Sub(now), jitter: true}
	}
	// modeWindow: the earliest instant when enough of the window expires.
	freed := level
	for i := d.windowStart(now, at); i < d.log.len(); i++ {
		e := d.log.at(i)
		freed += float64(e.charged)
		if freed+levelEpsilon >= float64(need) {
			return verdict{wait: time.Duration(e.at + int64(d.span(at)) - now.UnixNano())}
		}
	}
	return verdict{wait: d.span(at)} // unreachable: an empty window holds the full limit
}

// record appends a started call (at is non-decreasing: see Throttle.tick)
// with the floor of the calls unanswered at its start.
func (d *dimension) record(seq uint64, at time.Time, cost int64, floor uint64) {
	cum := cost
	if n := d.log.len(); n > 0 {
		cum += d.log.at(n - 1).cum
	}
	d.log.push(entry{seq: seq, at: at.UnixNano(), charged: cost, pending: cost, cum: cum, floor: floor})
}

// entry returns the log entry of the call seq, nil if not (or no longer)
// logged.
func (d *dimension) entry(seq uint64) *entry {
	if seq == 0 {
		return nil
	}
	if i := d.firstAfterSeq(seq - 1); i < d.log.len() && d.log.at(i).seq == seq {
		return d.log.at(i)
	}
	return nil
}

// prune drops entries outside the window that no figure still needs. The
// log keeps at least Window of starts (Throttle.advanceFloor reads the
// tokens log over Window), and a stated window's when longer (a daily
// quota keeps up to a day of starts, 56 bytes each).
//
// Past Window the log keeps at most MaxLongWindowStarts starts, so that a
// stated window of a day at a high call rate cannot grow the log without
// bound (8.6 million starts, 480 MB, at 100 calls a second): the oldest
// starts beyond Window are dropped first, and a count over the longer
// window then covers only the latest MaxLongWindowStarts starts and
// Window's. The provider's remaining figures, which govern whenever they
// are fresh, are unaffected.
func (d *dimension) prune(now time.Time) {
	from := now.Add(-max(Window, d.window())).UnixNano()
	fresh := d.fresh(now)
	for d.log.len() > 0 {
		e := d.log.at(0)
		if e.at > from || (fresh && e.seq >= d.figFloor) {
			break
		}
		d.log.popFront()
	}
	minute := now.Add(-Window).UnixNano()
	for d.log.len() > MaxLongWindowStarts {
		e := d.log.at(0)
		if e.at > minute || (fresh && e.seq >= d.figFloor) {
			break
		}
		d.log.popFront()
	}
}

// MaxLongWindowStarts bounds the starts a dimension's log keeps beyond
// Window for a stated window longer than Window (dimension.prune): 2^18
// starts, 14 MiB at most per dimension.
const MaxLongWindowStarts = 1 << 18

// apply takes a response's figure for this dimension. seq is the permit of
// the response (0: a call not started here, which covers no local start).
func (d *dimension) apply(now time.Time, seq uint64, q Dimension) {
	if q.Limit > 0 {
		d.hdrLimit, d.hdrWindow = q.Limit, q.Window
	}
	if q.Remaining < 0 {
		return
	}
	d.maxSeen = max(d.maxSeen, q.Remaining)
	d.silent = false
	if seq != 0 && d.hasFig && seq < d.figSeq {
		return // an older call's response arriving late: the newer figure stands
	}
	if d.hasFig && d.figStep && d.figReset >= 0 {
		oldReset := d.figAt.Add(d.figReset)
		switch {
		case !now.Before(oldReset):
			d.winFrom = oldReset
		case q.Reset >= 0 && q.Remaining > d.figRem && !d.winFrom.IsZero() &&
			now.Add(q.Reset).Sub(oldReset) > max(time.Second, oldReset.Sub(d.winFrom)/2):
			// The provider rolled its window over before the reset it
			// announced (an integer-second reset is rounded up, an epoch
			// one truncated, and the response's latency moves a delay
			// later): more left than the last figure said, and an end
			// more than half a window (and a second) past the announced
			// one. The new window began before the provider admitted
			// this call; the calls that had answered before it started
			// belong to the old window and must not count in the new
			// one's cap, the calls still unanswered then (from its
			// floor on) may reach the provider after it and do.
			from := now
			if e := d.entry(seq); e != nil {
				from = time.Unix(0, e.at)
				if f := d.entry(e.floor); f != nil {
					from = time.Unix(0, f.at)
				}
			}
			if from.After(d.winFrom) {
				d.winFrom = from
			}
		}
	}
	rounded := d.optional && q.Dialect == DialectAnthropic && q.Remaining%anthropicStep == 0
	predicted, havePred := 0.0, false
	if rounded && d.fresh(now) && !d.figStep {
		if m, _, level, _ := d.state(now); m == modeContinuous {
			predicted, havePred = level, true
		}
	}
	d.hasFig = true
	d.figRem, d.figAt, d.figReset, d.figBeyond = q.Remaining, now, q.Reset, q.Beyond
	d.figStep = q.Dialect == DialectClassic || q.Dialect == DialectIETF
	if seq != 0 {
		d.figSeq, d.figFloor = seq, seq
		if e := d.entry(seq); e != nil {
			d.figFloor = e.floor
		}
	}
	if rounded {
		d.figRem = d.roundedFigure(q.Remaining, predicted, havePred)
	}
}

// roundedFigure is the remaining to use for an Anthropic input or output
// figure f, which the provider rounds to the nearest anthropicStep: the
// true remaining is in [f-step/2, f+step/2). With the estimate the previous
// figure gave for now (predicted, when havePred), it keeps that estimate
// clamped into the band, so that the rounding neither stalls nor bursts
// starts; without one, the limit for a figure at the limit (a full bucket),
// else the band's lower end. Called once the new figure is
// set: the returned remaining gives a level of predicted.
func (d *dimension) roundedFigure(f int64, predicted float64, havePred bool) int64 {
	lo, hi := max(f-anthropicStep/2, 0), f+anthropicStep/2-1
	if lim := d.limit(); lim > 0 {
		hi = min(hi, lim)
		lo = min(lo, hi)
	}
	if !havePred {
		if lim := d.limit(); lim > 0 && f >= lim {
			// A figure at the limit: the bucket is full (the provider caps
			// the rounded remaining at the limit), as it is at the start.
			return lim
		}
		return lo
	}
	// The new level is figRem + ownRefund - pendingSum (every uncovered
	// call started before now, so no refill is added in between).
	rem := math.Round(predicted + float64(d.pendingSum()) - d.ownRefund())
	return int64(math.Min(math.Max(rem, float64(lo)), float64(hi)))
}

// Throttle is the adaptive throttle of one (ProviderPool, model). It is safe
// for concurrent use. See the package documentation for the model.
type Throttle struct {
	mu              sync.Mutex
	cfg             Config
	seq             uint64
	latest          time.Time // latest time any caller has passed in (tick); keeps the logs ordered
	dims            [numDims]dimension
	pausedUntil     time.Time
	lastInteractive time.Time
	probing         bool
	probeAt         time.Time
	probeSeq        uint64 // the permit of the probe in flight
	// subWindow is set by a 429 that the figures do not explain (every
	// known remaining covered the call): the provider enforces its
	// per-minute quota over shorter sub-windows (Azure OpenAI: "1 s or 10 s
	// sub-windows, so a 429 can come while the remaining count is still
	// positive", provider header reference). From then on starts are also
	// paced evenly, per dimension, at subWindowPace of limit per Window,
	// without burst (GCRA with zero tolerance): a sub-window of length w
	// then receives at most about subWindowPace x limit x w / 60 s, within
	// the limit x w / 60 s it admits. The pacing stays on for the throttle's
	// lifetime (Reconfigure keeps it).
	subWindow bool
	dialect   string
	// floorSeq is the smallest seq that may still be unanswered: every
	// call before it has answered or started more than Window ago (a call
	// whose outcome is never reported stops holding figures back then).
	floorSeq uint64
}

// New returns a throttle configured by cfg, created at now (the reference for
// BorrowAfter until the first interactive call).
func New(cfg Config, now time.Time) *Throttle {
	cfg = cfg.normalized()
	return &Throttle{
		cfg: cfg,
		dims: [numDims]dimension{newDimension(cfg.TokensPerMinuteHint), newDimension(cfg.RequestsPerMinuteHint),
			{optional: true, hdrLimit: -1, figReset: -1}, {optional: true, hdrLimit: -1, figReset: -1}},
		lastInteractive: now,
	}
}

// tokensSplit reports whether the provider describes its token quota only by
// separate input and output figures (Anthropic ITPM and OTPM, no tokens
// triplet): the tokens dimension then has no figure of its own and its
// per-minute hint, a sum that cannot see the provider's output refunds, does
// not pace; the input and output dimensions do.
func (t *Throttle) tokensSplit(now time.Time) bool {
	d := &t.dims[dimTokens]
	if d.hdrLimit > 0 || d.fresh(now) {
		return false
	}
	return t.dims[dimInput].fresh(now) || t.dims[dimOutput].fresh(now)
}

// quotaKnown reports whether q carries a figure in any dimension.
func quotaKnown(q Quota) bool { return q.Known() }

// Known reports whether q carries a figure in any dimension (tokens,
// requests, or Anthropic's input and output tokens): a response whose
// Quota is Known is one to pass to Throttle.Observe.
func (q Quota) Known() bool {
	return q.Tokens.Known() || q.Requests.Known() || q.Input.Known() || q.Output.Known()
}

// dimsOf returns q's figures by dimension index.
func dimsOf(q Quota) [numDims]Dimension {
	return [numDims]Dimension{q.Tokens, q.Requests, q.Input, q.Output}
}

// Reconfigure applies a new configuration (live policy from the ProviderPool)
// without losing the observed quota, the log of started calls or a pause.
func (t *Throttle) Reconfigure(now time.Time, cfg Config) {
	cfg = cfg.normalized()
	t.mu.Lock()
	defer t.mu.Unlock()
	now = t.tick(now)
	if !strings.EqualFold(cfg.Dialect, t.cfg.Dialect) {
		// Even pacing was learnt from the old dialect's 429s (Azure
		// sub-windows): a new dialect starts without it.
		t.subWindow = false
		for i := range t.dims {
			t.dims[i].tat = 0
		}
	}
	t.cfg = cfg
	t.dims[dimTokens].hint = cfg.TokensPerMinuteHint
	t.dims[dimRequests].hint = cfg.RequestsPerMinuteHint
	for i := range t.dims {
		t.dims[i].prune(now)
	}
}

// ParseHeaders parses a response's headers received at now in the
// configured Config.Dialect: ParseHeadersDialect(h, now, cfg.Dialect). It is
// the parser to use for this throttle's responses, so that the ProviderPool's
// dialect hint applies.
func (t *Throttle) ParseHeaders(h http.Header, now time.Time) Quota {
	t.mu.Lock()
	dialect := t.cfg.Dialect
	t.mu.Unlock()
	return ParseHeadersDialect(h, now, dialect)
}

func (t *Throttle) jitter() time.Duration {
	if t.cfg.JitterWindow <= 0 {
		return 0
	}
	f := t.cfg.Rand()
	if !(f >= 0) { // NaN or negative
		f = 0
	}
	f = min(f, 1)
	return time.Duration(f * float64(t.cfg.JitterWindow))
}

// TryStart is TryStartCost for a call whose split between prompt and output
// is unknown: providerTokens (prompt + max output) is charged to the tokens
// dimension and, since either part may be all of it, to the input and the
// output dimensions too (they count only where the provider sends input and
// output figures: Anthropic).
func (t *Throttle) TryStart(now time.Time, providerTokens int64, p Priority) (Permit, bool, time.Duration) {
	providerTokens = max(providerTokens, 0)
	return t.start(now, [numDims]int64{providerTokens, 1, providerTokens, providerTokens}, p)
}

// TryStartCost asks whether a call of cost c and one request may start now
// with priority p. On success it charges every dimension — c.Prompt to
// input tokens, c.MaxOutput to output tokens, their sum to provider tokens,
// 1 to requests — and returns a Permit. Every dimension must admit the call
// (the most restrictive wins); a dimension nothing is known of never blocks
// beyond the single probe call of the tokens and requests dimensions. Otherwise it returns how long to wait
// before asking again, always > 0: while paused after a 429, until
// PausedUntil plus this caller's jitter in [0, JitterWindow] (BC-05d, BC-11);
// before a fixed-window reset, until the reset plus jitter; else until the
// estimate covers the cost (and, for batch, the reserve). A batch call
// refused while the reserve holds is told to ask again when borrowing the
// reserve begins (Config.BorrowAfter after the latest interactive call),
// if that is sooner.
//
// The wait may be long (a provider Retry-After of days is honoured exactly,
// BC-12): callers must compare it with their deadline and context and give
// up rather than sleep past them; the throttle never shortens a pause.
func (t *Throttle) TryStartCost(now time.Time, c Cost, p Priority) (Permit, bool, time.Duration) {
	in, out := max(c.Prompt, 0), max(c.MaxOutput, 0)
	return t.start(now, [numDims]int64{in + out, 1, in, out}, p)
}

// start is TryStart with the cost per dimension (tokens, requests, input,
// output).
func (t *Throttle) start(now time.Time, costs [numDims]int64, p Priority) (Permit, bool, time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now = t.tick(now)
	providerTokens := costs[dimTokens]
	if p == Interactive && now.After(t.lastInteractive) {
		t.lastInteractive = now
	}
	if now.Before(t.pausedUntil) {
		return Permit{}, false, t.pausedUntil.Sub(now) + t.jitter()
	}
	pct := t.cfg.ReservePercent
	var borrowIn time.Duration // > 0: batch may borrow the reserve after this long
	if p != Batch {
		pct = 0
	} else if t.cfg.BorrowAfter > 0 {
		if borrowIn = t.lastInteractive.Add(t.cfg.BorrowAfter).Sub(now); borrowIn <= 0 {
			pct = 0
		}
	}
	ok, probe := true, false
	var wait time.Duration
	herd := false
	split := t.tokensSplit(now)
	for i := range t.dims {
		t.dims[i].prune(now)
		if i == dimTokens && split {
			continue
		}
		v := t.dims[i].check(now, costs[i], pct)
		probe = probe || v.probe
		if !v.ok {
			ok = false
			if v.wait > wait {
				wait, herd = v.wait, v.jitter
			}
		}
	}
	if !ok {
		if herd {
			wait += t.jitter()
		}
		if pct > 0 && borrowIn > 0 {
			// Held back by the reserve, perhaps: ask again when borrowing
			// begins, if that is sooner (BC-39), rather than after the
			// window's refill, past a batch job's deadline.
			wait = min(wait, borrowIn)
		}
		return Permit{}, false, max(wait, minWait)
	}
	var intervals [numDims]int64
	if t.subWindow {
		n := now.UnixNano()
		for i := range t.dims {
			if lim := t.dims[i].limit(); lim > 0 {
				iv := float64(costs[i]) * float64(t.dims[i].window()) / (float64(lim) * subWindowPace)
				intervals[i] = int64(math.Min(iv, float64(MaxReset)))
				if tat := t.dims[i].tat; tat > n {
					wait = max(wait, time.Duration(tat-n))
				}
			}
		}
		if wait > 0 {
			return Permit{}, false, max(wait, minWait)
		}
	}
	if probe {
		if t.probing && now.Sub(t.probeAt) < probeTimeout {
			w := probeRecheck
			if t.cfg.JitterWindow > 0 {
				w += time.Duration(min(max(t.cfg.Rand(), 0), 1) * float64(probeRecheck))
			}
			return Permit{}, false, w
		}
	}
	at := now // not before any start recorded (tick)
	floor := t.advanceFloor(now)
	t.seq++
	if probe {
		t.probing, t.probeAt, t.probeSeq = true, now, t.seq
	}
	for i := range t.dims {
		t.dims[i].record(t.seq, at, costs[i], min(floor, t.seq))
		if intervals[i] > 0 {
			t.dims[i].tat = max(t.dims[i].tat, now.UnixNano()) + intervals[i]
		}
	}
	return Permit{seq: t.seq, tokens: providerTokens, at: at}, true, 0
}

// tick returns the time to evaluate the throttle at: now, or the latest
// time a caller has passed in when that is later, which it then records.
// Callers read their clock before they take t.mu: one that waited for the
// lock (or was descheduled on a busy machine) while others recorded
// figures and starts at later instants would otherwise evaluate the quota
// in the past, where a fixed window's previous figure still holds. Such a
// start was recorded before the window boundary it actually crossed and
// escaped the new window's count (limit minus the starts since the
// window's start): the provider then refused the calls above its limit.
// Every instant a caller passed in has already happened, so the latest of
// them is never after the present. Callers' clocks must not go backwards
// by more than they tolerate being ignored: k8s.io/utils/clock's real and
// fake clocks do not.
func (t *Throttle) tick(now time.Time) time.Time {
	if now.Before(t.latest) {
		return t.latest
	}
	t.latest = now
	return now
}

// advanceFloor moves floorSeq past the calls that have answered or started
// more than Window before now, and returns it: the floor of a call starting
// now (see entry.floor). Amortised O(1): each entry is passed once.
func (t *Throttle) advanceFloor(now time.Time) uint64 {
	d := &t.dims[dimTokens]
	old := now.Add(-Window).UnixNano()
	i := d.log.seqIndex(t.floorSeq)
	for ; i < d.log.len(); i++ {
		e := d.log.at(i)
		if e.ans == 0 && e.at > old {
			t.floorSeq = e.seq
			return e.seq
		}
	}
	t.floorSeq = t.seq + 1
	return t.floorSeq
}

// answered marks the call of p as answered: from the next start on, the
// provider's figures include it.
func (t *Throttle) answered(p Permit) {
	for i := range t.dims {
		if e := t.dims[i].entry(p.seq); e != nil && e.ans == 0 {
			e.ans = t.seq
		}
	}
}

// Observe records the quota figures of a response to the call of p, received
// at now (q from ParseHeaders). Per dimension (provider tokens, requests,
// and Anthropic's input and output tokens) it sets limit, remaining and
// reset; calls started after p, which the provider's figure cannot include
// yet, stay subtracted, and so (continuous buckets) do calls started before p
// that were still unanswered when p started (see dimension.covered). A
// dimension the response says nothing about keeps its state; with no limit
// known it becomes 429-only (no probe needed).
func (t *Throttle) Observe(now time.Time, p Permit, q Quota) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now = t.tick(now)
	t.endProbe(p)
	if q.Dialect != "" && quotaKnown(q) {
		t.dialect = q.Dialect
	}
	for i, qd := range dimsOf(q) {
		d := &t.dims[i]
		d.apply(now, p.seq, qd)
		if !qd.Known() && d.limit() <= 0 {
			d.silent = true
		}
		d.prune(now)
	}
	t.answered(p)
}

// OnTooManyRequests records a 429 response to the call of p at now. It pauses
// every start, interactive included, until now + q.RetryAfter when present
// (0 included: eligible at once, BC-05b); else until the reset of the
// exhausted dimension (remaining 0; tokens, requests, input or output), the
// latest one when several are (BC-07);
// else for DefaultBackoff. A pause is never shortened: a later 429 only
// extends it (BC-05d). A 429 although every known remaining covered the
// call means the provider enforces sub-windows (Azure): from then on starts
// are also paced evenly (see Throttle.subWindow). Figures in q are recorded as by Observe; a dimension
// whose limit is unknown goes back to one probe call at a time after the
// pause.
func (t *Throttle) OnTooManyRequests(now time.Time, p Permit, q Quota) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now = t.tick(now)
	t.endProbe(p)
	if q.Dialect != "" && quotaKnown(q) {
		t.dialect = q.Dialect
	}
	// A 429 while every known remaining covered the call: sub-windows.
	if p.seq != 0 && (q.Dialect == DialectAzure || (q.Dialect == "" && t.dialect == DialectAzure)) &&
		(q.Tokens.Remaining >= 0 || q.Requests.Remaining >= 0) &&
		(q.Tokens.Remaining < 0 || q.Tokens.Remaining >= max(p.tokens, 1)) &&
		(q.Requests.Remaining < 0 || q.Requests.Remaining >= 1) {
		t.subWindow = true
	}
	for i, qd := range dimsOf(q) {
		d := &t.dims[i]
		d.apply(now, p.seq, qd)
		if d.limit() <= 0 {
			d.silent = false
		}
	}
	t.answered(p)
	var pause time.Duration
	switch {
	case q.HasRetryAfter:
		pause = q.RetryAfter
	default:
		pause = -1
		for _, qd := range dimsOf(q) {
			// An elapsed (0) reset is not hard data: it cannot explain a 429.
			if qd.Remaining == 0 && qd.Reset > 0 {
				pause = max(pause, qd.Reset)
			}
		}
		if pause < 0 {
			pause = t.cfg.DefaultBackoff
		}
	}
	if until := now.Add(pause); until.After(t.pausedUntil) {
		t.pausedUntil = until
	}
}

// Done records the end of the call of p at now when its response gave no
// usable figures. With ok, actualProviderTokens is what the provider counted
// (from usage) and replaces the tokens charge wherever no provider figure
// includes the call (a refund, or an extra debit; a figure that may have
// been taken before the call reached the provider does not, see
// dimension.covered); the input and output charges, whose split is unknown
// here, are only lowered to it (each part is at most the whole). The sliding window log keeps the charge, since
// providers such as OpenAI count max_tokens at arrival. Without ok the
// charge stands. Either way the request stays counted and a probe in flight
// ends; with ok, a dimension with no limit known becomes 429-only.
func (t *Throttle) Done(now time.Time, p Permit, actualProviderTokens int64, ok bool) {
	a := max(actualProviderTokens, 0)
	t.done(now, p, [numDims]int64{a, -1, a, a}, true, ok)
}

// DoneTokens is Done with the usage split: with ok, promptTokens replaces
// the input charge, outputTokens (generated) the output charge — the refund
// of the unused max_tokens that Anthropic makes at the end of the call
// (provider header reference, Anthropic section) — and their sum the tokens
// charge, each wherever no provider figure of that dimension includes the
// call; in the input and output dimensions the refund also counts after the
// figure of the call's own response, which the provider took before it
// (dimension.ownRefund).
func (t *Throttle) DoneTokens(now time.Time, p Permit, promptTokens, outputTokens int64, ok bool) {
	in, out := max(promptTokens, 0), max(outputTokens, 0)
	sum := in + out
	if sum < 0 { // overflow: a usage no call can have (done clamps it)
		sum = math.MaxInt64
	}
	t.done(now, p, [numDims]int64{sum, -1, in, out}, false, ok)
}

// done corrects the pending charge of each dimension of actual >= 0 to it
// (capOnly: only downwards) while no figure of the dimension covers the call.
// An actual above the dimension's limit is read as the limit: no call uses
// more than a whole window's quota (the provider refuses a larger one), so
// a hostile or garbled usage (2^62 tokens) costs at most one window instead
// of stopping every start of the model for the longest wait.
func (t *Throttle) done(now time.Time, p Permit, actual [numDims]int64, capOnly, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now = t.tick(now)
	t.endProbe(p)
	if p.seq == 0 {
		return
	}
	for i := range t.dims {
		d := &t.dims[i]
		if ok && d.limit() <= 0 && !d.fresh(now) {
			d.silent = true
		}
	}
	defer t.answered(p)
	if !ok {
		return
	}
	for i := range t.dims {
		if actual[i] < 0 {
			continue
		}
		// Set even while a figure covers the call: a newer figure whose
		// call may have reached the provider first uncovers it again
		// (dimension.covered), and the provider then counts the actual use
		// (Anthropic refunds the unused max_tokens at the end of the call).
		d := &t.dims[i]
		a := actual[i]
		if lim := d.limit(); lim > 0 {
			a = min(a, lim)
		}
		if e := d.entry(p.seq); e != nil {
			if capOnly && i != dimTokens {
				e.pending = min(e.pending, a)
			} else {
				e.pending = a
			}
		}
	}
}

// endProbe ends the probe in flight when p is its permit. The outcome of
// another call (one started before the probe, or before a probe that timed
// out and was replaced) says nothing about the probe and must not let a
// second probe start beside it.
func (t *Throttle) endProbe(p Permit) {
	if t.probing && p.seq != 0 && p.seq == t.probeSeq {
		t.probing = false
	}
}

// PausedUntil is the end of the current (or last) pause after a 429.
func (t *Throttle) PausedUntil() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pausedUntil
}

// floorCount is the count a level reads as in Status: floor(level) clamped
// to [0, math.MaxInt64]. A limit near math.MaxInt64 gives a level of 2^63
// once converted to float64, which int64() would wrap to a negative count
// (read as 0); it reads math.MaxInt64 instead. NaN reads 0.
func floorCount(level float64) int64 {
	f := math.Floor(level)
	switch {
	case !(f > 0): // also NaN
		return 0
	case f >= 1<<63: // float64(math.MaxInt64) rounds up to 2^63
		return math.MaxInt64
	}
	return int64(f)
}

// Status returns a snapshot at now.
func (t *Throttle) Status(now time.Time) Status {
	t.mu.Lock()
	defer t.mu.Unlock()
	now = t.tick(now)
	s := Status{PausedUntil: t.pausedUntil, Paused: now.Before(t.pausedUntil), Dialect: t.dialect}
	pct := t.cfg.ReservePercent
	if t.cfg.BorrowAfter > 0 && now.Sub(t.lastInteractive) >= t.cfg.BorrowAfter {
		pct = 0
	}
	var lims, rems [numDims]int64
	var resets [numDims]time.Time
	for i := range t.dims {
		d := &t.dims[i]
		m, lim, level, _ := d.state(now)
		lims[i], rems[i] = lim, -1
		switch m {
		case modeContinuous, modeStep, modeWindow, modeBlocked:
			rems[i] = floorCount(level + levelEpsilon)
		}
		if d.hasFig && d.figReset >= 0 {
			resets[i] = d.figAt.Add(d.figReset)
		}
		if lim > 0 && pct > 0 && level+levelEpsilon < float64(1+reserveOf(lim, pct)) && level+levelEpsilon >= 1 {
			s.AtReserve = true
		}
	}
	s.TokensLimit, s.RequestsLimit = lims[dimTokens], lims[dimRequests]
	s.TokensRemaining, s.RequestsRemaining = rems[dimTokens], rems[dimRequests]
	s.TokensReset, s.RequestsReset = resets[dimTokens], resets[dimRequests]
	return s
}
