package throttle

import (
	"math/rand/v2"
	"net/http"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func at(d time.Duration) time.Time { return NOW.Add(d) }

func fixedRand(v float64) func() float64 { return func() float64 { return v } }

func seededRand(seed uint64) func() float64 { return rand.New(rand.NewPCG(seed, 7)).Float64 }

// mustStart starts a call or fails the test.
func mustStart(t *testing.T, th *Throttle, now time.Time, tokens int64, p Priority) Permit {
	t.Helper()
	pm, ok, wait := th.TryStart(now, tokens, p)
	if !ok {
		t.Fatalf("TryStart(%v, %d, %v) refused, wait %v", now.Sub(NOW), tokens, p, wait)
	}
	return pm
}

// mustRefuse asserts a refusal and returns the wait.
func mustRefuse(t *testing.T, th *Throttle, now time.Time, tokens int64, p Priority) time.Duration {
	t.Helper()
	_, ok, wait := th.TryStart(now, tokens, p)
	if ok {
		t.Fatalf("TryStart(%v, %d, %v) started, want refused", now.Sub(NOW), tokens, p)
	}
	if wait <= 0 {
		t.Fatalf("refused with wait %v, want > 0", wait)
	}
	return wait
}

func near(got, want time.Duration) bool {
	d := got - want
	return d >= -time.Microsecond && d <= time.Microsecond
}

// plentyOfTokens keeps the tokens dimension out of the way in tests about requests.
const plentyOfTokens = 1_000_000_000

func TestBC05_PauseHonoursRetryAfter(t *testing.T) {
	newTh := func() (*Throttle, Permit) {
		th := New(Config{TokensPerMinuteHint: plentyOfTokens, RequestsPerMinuteHint: 1000, JitterWindow: time.Second, Rand: fixedRand(0.5)}, NOW)
		return th, mustStart(t, th, NOW, 100, Batch)
	}
	t.Run("b: retry-after 0 is eligible immediately", func(t *testing.T) {
		th, p := newTh()
		th.OnTooManyRequests(NOW, p, ParseHeaders(hdr("retry-after: 0"), NOW))
		if got := th.PausedUntil(); !got.Equal(NOW) {
			t.Fatalf("PausedUntil = %v, want NOW", got)
		}
		mustStart(t, th, NOW, 100, Interactive)
		mustStart(t, th, NOW, 100, Batch)
	})
	t.Run("c: 60 s boundary honoured", func(t *testing.T) {
		th, p := newTh()
		th.OnTooManyRequests(NOW, p, ParseHeaders(hdr("retry-after: 60"), NOW))
		if got := th.PausedUntil(); !got.Equal(at(60 * time.Second)) {
			t.Fatalf("PausedUntil = %v, want NOW+60s", got.Sub(NOW))
		}
		mustRefuse(t, th, at(60*time.Second-time.Nanosecond), 1, Interactive)
		mustStart(t, th, at(60*time.Second), 1, Interactive)
	})
	t.Run("d: 600 s honoured, no start before NOW+600s", func(t *testing.T) {
		th, p := newTh()
		th.OnTooManyRequests(NOW, p, ParseHeaders(hdr("retry-after: 600"), NOW))
		for _, off := range []time.Duration{0, time.Second, 120 * time.Second, 300 * time.Second, 599*time.Second + 999*time.Millisecond} {
			for _, pr := range []Priority{Interactive, Batch} {
				wait := mustRefuse(t, th, at(off), 1, pr)
				// Until the end of the pause plus this caller's jitter (0.5 of 1 s).
				if want := 600*time.Second - off + 500*time.Millisecond; wait != want {
					t.Errorf("at +%v %v wait = %v, want %v", off, pr, wait, want)
				}
			}
		}
		// A later, shorter 429 does not shorten the pause; a longer one extends it.
		last := at(599*time.Second + 999*time.Millisecond) // the throttle's clock does not go back (tick)
		th.OnTooManyRequests(last, Permit{}, ParseHeaders(hdr("retry-after-ms: 0"), last))
		if got := th.PausedUntil(); !got.Equal(at(600 * time.Second)) {
			t.Fatalf("PausedUntil after a shorter 429 = %v, want NOW+600s", got.Sub(NOW))
		}
		mustStart(t, th, at(600*time.Second), 1, Interactive)
		th.OnTooManyRequests(at(601*time.Second), Permit{}, ParseHeaders(hdr("retry-after: 700"), at(601*time.Second)))
		if got := th.PausedUntil(); !got.Equal(at(1301 * time.Second)) {
			t.Fatalf("PausedUntil after a longer 429 = %v, want NOW+1301s", got.Sub(NOW))
		}
	})
	t.Run("no retry-after and no exhausted reset: default backoff", func(t *testing.T) {
		th := New(Config{TokensPerMinuteHint: plentyOfTokens, RequestsPerMinuteHint: 1000, DefaultBackoff: 3 * time.Second}, NOW)
		p := mustStart(t, th, NOW, 1, Batch)
		th.OnTooManyRequests(NOW, p, ParseHeaders(hdr("retry-after: soon"), NOW))
		if got := th.PausedUntil(); !got.Equal(at(3 * time.Second)) {
			t.Fatalf("PausedUntil = %v, want NOW+3s", got.Sub(NOW))
		}
	})
}

func TestBC07_AnthropicExhaustedDimension(t *testing.T) {
	base := []string{
		"anthropic-ratelimit-requests-limit: 50",
		"anthropic-ratelimit-requests-remaining: 0",
		"anthropic-ratelimit-tokens-limit: 100000",
		"anthropic-ratelimit-tokens-reset: 2026-01-01T00:01:00Z",
	}
	tests := []struct {
		name  string
		extra []string
		want  time.Duration
	}{
		{"A: requests exhausted, wait for its reset (not the tokens reset)",
			[]string{"anthropic-ratelimit-requests-reset: 2026-01-01T00:00:05Z", "anthropic-ratelimit-tokens-remaining: 16000"}, 5 * time.Second},
		{"B: both exhausted, the later reset",
			[]string{"anthropic-ratelimit-requests-reset: 2026-01-01T00:00:05Z", "anthropic-ratelimit-tokens-remaining: 0"}, 60 * time.Second},
		{"C: offset reset is the same instant",
			[]string{"anthropic-ratelimit-requests-reset: 2026-01-01T02:00:05+02:00", "anthropic-ratelimit-tokens-remaining: 16000"}, 5 * time.Second},
		{"D: retry-after wins",
			[]string{"anthropic-ratelimit-requests-reset: 2026-01-01T00:00:05Z", "anthropic-ratelimit-tokens-remaining: 16000", "retry-after: 3"}, 3 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			th := New(Config{TokensPerMinuteHint: 100000, RequestsPerMinuteHint: 50, Rand: fixedRand(0)}, NOW)
			p := mustStart(t, th, NOW, 1000, Interactive)
			q := ParseHeaders(hdr(append(append([]string{}, base...), tc.extra...)...), NOW)
			th.OnTooManyRequests(NOW, p, q)
			if got := th.PausedUntil(); !got.Equal(at(tc.want)) {
				t.Fatalf("PausedUntil = NOW+%v, want NOW+%v", got.Sub(NOW), tc.want)
			}
			if wait := mustRefuse(t, th, NOW, 1000, Interactive); wait != tc.want {
				t.Errorf("wait at NOW = %v, want %v", wait, tc.want)
			}
			mustRefuse(t, th, at(tc.want-time.Millisecond), 1000, Interactive)
			mustStart(t, th, at(tc.want), 1000, Interactive)
		})
	}
}

// TestBC11_ThunderingHerd: paused until NOW+10s with 200 batch and 50
// interactive waiters, the provider allowing 100 requests per window after
// the reset.
func TestBC11_ThunderingHerd(t *testing.T) {
	const jitter = time.Second
	th := New(Config{TokensPerMinuteHint: plentyOfTokens, ReservePercent: 20, JitterWindow: jitter, Rand: seededRand(11)}, NOW)
	first := mustStart(t, th, NOW, 10, Interactive)
	th.OnTooManyRequests(NOW, first, ParseHeaders(hdr(
		`RateLimit-Policy: "default";q=100;w=60`,
		`RateLimit: "default";r=0;t=10`,
		"retry-after: 10",
	), NOW))

	type waiter struct {
		id   int
		p    Priority
		next time.Time
	}
	var ws []*waiter
	for i := 0; i < 250; i++ {
		p := Batch
		if i%5 == 0 { // 50 interactive
			p = Interactive
		}
		w := &waiter{id: i, p: p}
		wait := mustRefuse(t, th, NOW, 10, p)
		if wait < 10*time.Second || wait > 10*time.Second+jitter {
			t.Fatalf("waiter %d wait %v, want in [10s, 10s+%v]", i, wait, jitter)
		}
		w.next = NOW.Add(wait)
		ws = append(ws, w)
	}
	var starts []time.Time
	var batch, interactive int
	horizon := at(12 * time.Second)
	for {
		sort.Slice(ws, func(i, j int) bool { return ws[i].next.Before(ws[j].next) })
		if len(ws) == 0 || ws[0].next.After(horizon) {
			break
		}
		w := ws[0]
		if w.next.Before(at(10 * time.Second)) {
			t.Fatalf("waiter %d came back at +%v, before the reset", w.id, w.next.Sub(NOW))
		}
		_, ok, wait := th.TryStart(w.next, 10, w.p)
		if ok {
			starts = append(starts, w.next)
			if w.p == Batch {
				batch++
			} else {
				interactive++
			}
			ws = ws[1:]
			continue
		}
		w.next = w.next.Add(wait)
	}
	if len(starts) != 100 {
		t.Errorf("starts after the reset = %d, want exactly the window's allowance 100", len(starts))
	}
	if batch > 80 {
		t.Errorf("batch starts = %d, want <= 80 (20%% reserve)", batch)
	}
	if interactive < 20 {
		t.Errorf("interactive starts = %d, want >= 20 (the reserve)", interactive)
	}
	distinct := map[time.Time]bool{}
	lo, hi := starts[0], starts[0]
	for _, s := range starts {
		distinct[s] = true
		if s.Before(lo) {
			lo = s
		}
		if s.After(hi) {
			hi = s
		}
	}
	if lo.Before(at(10*time.Second)) || hi.After(at(10*time.Second+jitter)) {
		t.Errorf("starts span [+%v, +%v], want within [10s, 10s+%v]", lo.Sub(NOW), hi.Sub(NOW), jitter)
	}
	if len(distinct) < 90 || hi.Sub(lo) < jitter/2 {
		t.Errorf("starts not spread: %d distinct instants over %v", len(distinct), hi.Sub(lo))
	}
}

// TestBC12_LongRetryAfterBoundedWaits: a 277403 s Retry-After is represented
// exactly and every wait TryStart returns lies within [pause end, pause end +
// jitter]: the caller compares it with its deadline (NOW+1h here) and gives up.
func TestBC12_LongRetryAfterBoundedWaits(t *testing.T) {
	const jitter = 2 * time.Second
	th := New(Config{TokensPerMinuteHint: 1000, RequestsPerMinuteHint: 10, JitterWindow: jitter, Rand: seededRand(12)}, NOW)
	p := mustStart(t, th, NOW, 10, Batch)
	th.OnTooManyRequests(NOW, p, ParseHeaders(hdr("retry-after: 277403"), NOW))
	end := at(277403 * time.Second)
	if got := th.PausedUntil(); !got.Equal(end) {
		t.Fatalf("PausedUntil = NOW+%v, want NOW+277403s", got.Sub(NOW))
	}
	deadline := at(time.Hour)
	r := rand.New(rand.NewPCG(1, 2))
	// Random instants in increasing order: the throttle's clock does not go
	// back (Throttle.tick).
	offs := make([]int64, 1000)
	for i := range offs {
		offs[i] = r.Int64N(int64(277403 * time.Second))
	}
	slices.Sort(offs)
	for i := 0; i < 1000; i++ {
		now := NOW.Add(time.Duration(offs[i]))
		pr := Priority(r.IntN(2))
		wait := mustRefuse(t, th, now, 10, pr)
		if lo, hi := end.Sub(now), end.Sub(now)+jitter; wait < lo || wait > hi {
			t.Fatalf("at +%v wait %v outside [%v, %v]", now.Sub(NOW), wait, lo, hi)
		}
		if now.Before(deadline) && !now.Add(wait).After(deadline) {
			t.Fatalf("a wait that ends before the deadline while paused for days")
		}
	}
}

func TestBC13_SlidingWindowNeverOverruns(t *testing.T) {
	t.Run("t=30s send refused while the window holds 1.8M", func(t *testing.T) {
		th := New(Config{TokensPerMinuteHint: 2_000_000, RequestsPerMinuteHint: 1000}, NOW)
		mustStart(t, th, NOW, 1_800_000, Batch)
		if wait := mustRefuse(t, th, at(30*time.Second), 900_000, Batch); wait != 30*time.Second {
			t.Errorf("wait = %v, want 30s (until the t=0 send leaves the window)", wait)
		}
		mustStart(t, th, at(30*time.Second), 200_000, Batch)
		mustRefuse(t, th, at(60*time.Second-time.Nanosecond), 900_000, Batch)
		mustStart(t, th, at(60*time.Second), 900_000, Batch)
	})
	t.Run("property: every 60 s window holds at most the limit", func(t *testing.T) {
		for seed := uint64(1); seed <= 20; seed++ {
			const limit, rpm = 2_000_000, 300
			th := New(Config{TokensPerMinuteHint: limit, RequestsPerMinuteHint: rpm, ReservePercent: int64(seed % 40), Rand: seededRand(seed)}, NOW)
			r := rand.New(rand.NewPCG(seed, 13))
			type start struct {
				at   time.Time
				cost int64
			}
			var starts []start
			type caller struct {
				next time.Time
				cost int64
				p    Priority
			}
			callers := make([]*caller, 8)
			for i := range callers {
				callers[i] = &caller{next: NOW.Add(time.Duration(r.Int64N(int64(time.Second)))), cost: 1 + r.Int64N(400_000), p: Priority(r.IntN(2))}
			}
			end := at(30 * time.Minute)
			for {
				sort.Slice(callers, func(i, j int) bool { return callers[i].next.Before(callers[j].next) })
				c := callers[0]
				if c.next.After(end) {
					break
				}
				pm, ok, wait := th.TryStart(c.next, c.cost, c.p)
				if !ok {
					if wait <= 0 {
						t.Fatalf("seed %d: refused with wait %v", seed, wait)
					}
					c.next = c.next.Add(wait)
					continue
				}
				starts = append(starts, start{c.next, c.cost})
				if r.IntN(2) == 0 { // usage below the charge: the window log keeps the charge
					th.Done(c.next, pm, c.cost/3, true)
				}
				c.next = c.next.Add(time.Duration(r.Int64N(int64(5 * time.Second))))
				c.cost, c.p = 1+r.Int64N(400_000), Priority(r.IntN(2))
			}
			if len(starts) < 100 {
				t.Fatalf("seed %d: only %d starts", seed, len(starts))
			}
			lo := 0
			var sum int64
			for hi, s := range starts {
				sum += s.cost
				for !starts[lo].at.After(s.at.Add(-Window)) {
					sum -= starts[lo].cost
					lo++
				}
				if sum > limit {
					t.Fatalf("seed %d: window ending +%v holds %d tokens > %d", seed, s.at.Sub(NOW), sum, limit)
				}
				if n := hi - lo + 1; n > rpm {
					t.Fatalf("seed %d: window ending +%v holds %d requests > %d", seed, s.at.Sub(NOW), n, rpm)
				}
			}
		}
	})
}

// TestBC39_ReserveVsBatch states the policy: batch never takes the reserve
// (30% of 1000 RPM) while interactive calls arrive; with BorrowAfter set and
// no interactive call for that long batch may use it, and the reserve returns
// at the next interactive call.
func TestBC39_ReserveVsBatch(t *testing.T) {
	const rpm, reserve = 1000, 300
	th := New(Config{TokensPerMinuteHint: plentyOfTokens, RequestsPerMinuteHint: rpm, ReservePercent: 30, BorrowAfter: 30 * time.Second}, NOW)
	type start struct {
		at time.Time
		p  Priority
	}
	var starts []start
	var batchBefore []int // batchBefore[i]: batch starts among starts[:i]
	record := func(now time.Time, p Priority) {
		b := 0
		if n := len(starts); n > 0 {
			b = batchBefore[n-1]
			if starts[n-1].p == Batch {
				b++
			}
		}
		starts, batchBefore = append(starts, start{now, p}), append(batchBefore, b)
	}
	const tick = 100 * time.Millisecond
	interactiveOn := func(now time.Time) bool {
		return now.Before(at(5*time.Minute)) || !now.Before(at(7*time.Minute))
	}
	// windowCount counts the starts in (now-Window, now]; starts are in time order.
	windowCount := func(now time.Time) (total, batch int) {
		lo := sort.Search(len(starts), func(i int) bool { return starts[i].at.After(now.Add(-Window)) })
		hi := sort.Search(len(starts), func(i int) bool { return starts[i].at.After(now) })
		if lo >= hi {
			return 0, 0
		}
		batch = batchBefore[hi-1] - batchBefore[lo]
		if starts[hi-1].p == Batch {
			batch++
		}
		return hi - lo, batch
	}
	var demand float64
	firstReturn := time.Time{}
	for now := NOW; now.Before(at(10 * time.Minute)); now = now.Add(tick) {
		// Batch backlog first (worst case for interactive), then interactive demand of 2000 RPM.
		for {
			total, _ := windowCount(now)
			if _, ok, _ := th.TryStart(now, 1, Batch); !ok {
				break
			}
			if interactiveOn(now) && total+1 > rpm-reserve {
				t.Fatalf("+%v: batch started with %d in the window while interactive is active", now.Sub(NOW), total)
			}
			record(now, Batch)
		}
		if interactiveOn(now) {
			demand += 2000.0 / 60 * tick.Seconds()
			for ; demand >= 1; demand-- {
				if _, ok, _ := th.TryStart(now, 1, Interactive); ok {
					record(now, Interactive)
					if firstReturn.IsZero() && !now.Before(at(7*time.Minute)) {
						firstReturn = now
					}
				}
			}
		}
		total, batch := windowCount(now)
		if total > rpm {
			t.Fatalf("+%v: %d starts in the window > %d", now.Sub(NOW), total, rpm)
		}
		steady := (now.After(at(time.Minute)) && now.Before(at(5*time.Minute))) || now.After(at(8*time.Minute))
		if steady && (batch > rpm-reserve || total-batch < reserve) {
			t.Fatalf("+%v: window holds %d batch and %d interactive; want batch <= %d and interactive >= %d", now.Sub(NOW), batch, total-batch, rpm-reserve, reserve)
		}
	}
	// Interactive idle from 5 min: after BorrowAfter batch uses the reserve.
	if _, batch := windowCount(at(7*time.Minute - tick)); batch != rpm {
		t.Errorf("batch in the window before 7 min = %d, want %d (borrowing the idle reserve)", batch, rpm)
	}
	if firstReturn.IsZero() || firstReturn.Sub(at(7*time.Minute)) > Window {
		t.Errorf("interactive regained capacity at +%v, want within one window of 7 min", firstReturn.Sub(NOW))
	}
}

func TestSeed_BatchStopsAtReserveInteractiveDoesNot(t *testing.T) {
	th := New(Config{ReservePercent: 20, Rand: fixedRand(0)}, NOW)
	// Figures from a call not started here: tokens 2500 left of 10000,
	// replenishing 1000 tokens/s (7500 missing, full in 7.5 s).
	th.Observe(NOW, Permit{}, ParseHeaders(hdr(
		"x-ratelimit-limit-tokens: 10000",
		"x-ratelimit-remaining-tokens: 2500",
		"x-ratelimit-reset-tokens: 7.5s",
		"x-ratelimit-limit-requests: 100",
		"x-ratelimit-remaining-requests: 50",
		"x-ratelimit-reset-requests: 30s",
	), NOW))
	// Reserve = 2000: batch may leave no less than that.
	if wait := mustRefuse(t, th, NOW, 600, Batch); !near(wait, 100*time.Millisecond) {
		t.Errorf("batch wait = %v, want 100ms (100 tokens at 1000/s)", wait)
	}
	mustStart(t, th, NOW, 500, Batch) // leaves exactly the reserve
	if st := th.Status(NOW); !st.AtReserve || st.TokensRemaining != 2000 {
		t.Errorf("Status = %+v, want AtReserve with 2000 tokens left", st)
	}
	mustRefuse(t, th, NOW, 1, Batch)
	mustStart(t, th, NOW, 2000, Interactive) // interactive uses the reserve
	if wait := mustRefuse(t, th, NOW, 1, Interactive); !near(wait, time.Millisecond) {
		t.Errorf("interactive wait = %v, want 1ms", wait)
	}
	mustStart(t, th, at(time.Second), 1000, Interactive)
}

func TestSeed_429StopsBothUntilReset(t *testing.T) {
	th := New(Config{TokensPerMinuteHint: 60000, RequestsPerMinuteHint: 600, Rand: fixedRand(0)}, NOW)
	p := mustStart(t, th, NOW, 500, Batch)
	th.OnTooManyRequests(NOW, p, ParseHeaders(hdr(
		"x-ratelimit-limit-tokens: 60000",
		"x-ratelimit-remaining-tokens: 0",
		"x-ratelimit-reset-tokens: 4s",
	), NOW))
	for _, pr := range []Priority{Interactive, Batch} {
		if wait := mustRefuse(t, th, at(2*time.Second), 1, pr); wait != 2*time.Second {
			t.Errorf("%v wait = %v, want 2s", pr, wait)
		}
	}
	mustStart(t, th, at(4*time.Second), 500, Interactive)
	mustStart(t, th, at(4*time.Second), 500, Batch)
}

func TestThrottle_NeverUnboundedAfterReset(t *testing.T) {
	t.Run("known limit: the limit, not infinity", func(t *testing.T) {
		th := New(Config{TokensPerMinuteHint: plentyOfTokens, Rand: fixedRand(0.25)}, NOW)
		th.Observe(NOW, Permit{}, ParseHeaders(hdr("X-RateLimit-Limit: 100", "X-RateLimit-Remaining: 0", "X-RateLimit-Reset: 10"), NOW))
		if wait := mustRefuse(t, th, at(9*time.Second), 1, Interactive); wait != 1250*time.Millisecond {
			t.Errorf("wait before the reset = %v, want 1s + 0.25 jitter", wait)
		}
		for i := 0; i < 100; i++ {
			mustStart(t, th, at(10*time.Second), 1, Interactive)
		}
		if wait := mustRefuse(t, th, at(10*time.Second), 1, Interactive); wait != Window {
			t.Errorf("wait after 100 starts = %v, want 60s", wait)
		}
	})
	t.Run("unknown limit: one probe at a time after the reset", func(t *testing.T) {
		th := New(Config{TokensPerMinuteHint: plentyOfTokens, Rand: fixedRand(0)}, NOW)
		th.Observe(NOW, Permit{}, ParseHeaders(hdr("x-ratelimit-remaining-requests: 0", "x-ratelimit-reset-requests: 10"), NOW))
		if wait := mustRefuse(t, th, at(5*time.Second), 1, Interactive); wait != 5*time.Second {
			t.Errorf("wait = %v, want 5s", wait)
		}
		p := mustStart(t, th, at(10*time.Second), 1, Interactive)
		if wait := mustRefuse(t, th, at(10*time.Second), 1, Interactive); wait != probeRecheck {
			t.Errorf("wait while probing = %v, want %v", wait, probeRecheck)
		}
		th.Observe(at(11*time.Second), p, ParseHeaders(hdr("x-ratelimit-remaining-requests: 50", "x-ratelimit-reset-requests: 30"), at(11*time.Second)))
		for i := 0; i < 50; i++ {
			mustStart(t, th, at(11*time.Second), 1, Interactive)
		}
		mustRefuse(t, th, at(11*time.Second), 1, Interactive)
	})
}

func TestThrottle_ProbeSilentAnd429Only(t *testing.T) {
	th := New(Config{DefaultBackoff: 2 * time.Second, Rand: fixedRand(0)}, NOW)
	p := mustStart(t, th, NOW, 100, Batch)
	if wait := mustRefuse(t, th, NOW, 100, Interactive); wait != probeRecheck {
		t.Errorf("wait while the probe is in flight = %v, want %v", wait, probeRecheck)
	}
	if st := th.Status(NOW); st.TokensLimit != -1 || st.TokensRemaining != -1 || st.RequestsLimit != -1 || st.RequestsRemaining != -1 {
		t.Errorf("Status = %+v, want all unknown", st)
	}
	th.Done(at(time.Second), p, 80, true) // no headers: 429-only from now on
	for i := 0; i < 1000; i++ {
		mustStart(t, th, at(time.Second), 100, Batch)
	}
	th.OnTooManyRequests(at(2*time.Second), Permit{}, Quota{Tokens: none, Requests: none})
	if got := th.PausedUntil(); !got.Equal(at(4 * time.Second)) {
		t.Fatalf("PausedUntil = +%v, want +4s (default backoff)", got.Sub(NOW))
	}
	// After the pause the unknown limit is probed again, one call at a time.
	p = mustStart(t, th, at(4*time.Second), 100, Batch)
	mustRefuse(t, th, at(4*time.Second), 100, Batch)
	th.Observe(at(5*time.Second), p, ParseHeaders(http.Header{}, at(5*time.Second)))
	mustStart(t, th, at(5*time.Second), 100, Batch)
	mustStart(t, th, at(5*time.Second), 100, Batch)

	t.Run("a lost probe stops blocking after the probe timeout", func(t *testing.T) {
		th := New(Config{}, NOW)
		mustStart(t, th, NOW, 1, Batch)
		mustRefuse(t, th, at(probeTimeout-time.Nanosecond), 1, Batch)
		mustStart(t, th, at(probeTimeout), 1, Batch)
	})
}

// TestThrottle_ProbeEndsOnlyWithItsOwnPermit: the outcome of a call other
// than the probe in flight (a call started while the dimension was silent,
// or a probe that timed out and was replaced) must not end the probe, or a
// second probe would start beside it.
func TestThrottle_ProbeEndsOnlyWithItsOwnPermit(t *testing.T) {
	for _, tc := range []struct {
		name   string
		report func(th *Throttle, now time.Time, p Permit)
	}{
		{"Done without usage", func(th *Throttle, now time.Time, p Permit) { th.Done(now, p, 0, false) }},
		{"OnTooManyRequests with Retry-After 0", func(th *Throttle, now time.Time, p Permit) {
			th.OnTooManyRequests(now, p, Quota{Tokens: none, Requests: none, HasRetryAfter: true})
		}},
	} {
		t.Run(tc.name+": a replaced probe", func(t *testing.T) {
			th := New(Config{Rand: fixedRand(0)}, NOW)
			lost := mustStart(t, th, NOW, 1, Batch) // probe, never reported in time
			probe := mustStart(t, th, at(probeTimeout), 1, Batch)
			tc.report(th, at(probeTimeout+time.Second), lost)
			if wait := mustRefuse(t, th, at(probeTimeout+time.Second), 1, Batch); wait != probeRecheck {
				t.Fatalf("wait = %v, want %v (the second probe is still in flight)", wait, probeRecheck)
			}
			tc.report(th, at(probeTimeout+2*time.Second), probe)
			mustStart(t, th, at(probeTimeout+2*time.Second), 1, Batch)
		})
	}
}

func TestThrottle_InFlightCallsStaySubtracted(t *testing.T) {
	th := New(Config{}, NOW)
	reqs := "x-ratelimit-limit-requests: 1000\nx-ratelimit-remaining-requests: 900\nx-ratelimit-reset-requests: 6s"
	// Provider figures replenish 1000 tokens/s: the reset is the time until full.
	openai := func(rem, reset string) Quota {
		return ParseHeaders(hdr(append(splitLines(reqs),
			"x-ratelimit-limit-tokens: 60000",
			"x-ratelimit-remaining-tokens: "+rem,
			"x-ratelimit-reset-tokens: "+reset)...), NOW)
	}
	th.Observe(NOW, Permit{}, openai("10000", "50s"))
	var ps []Permit
	for i := 0; i < 4; i++ {
		ps = append(ps, mustStart(t, th, NOW, 1000, Batch))
	}
	if st := th.Status(NOW); st.TokensRemaining != 6000 {
		t.Fatalf("remaining after 4 starts = %d, want 6000", st.TokensRemaining)
	}
	// The provider's figure at p1's response includes p1 only: p2..p4 stay subtracted.
	th.Observe(NOW, ps[0], openai("9000", "51s"))
	if st := th.Status(NOW); st.TokensRemaining != 6000 {
		t.Fatalf("remaining after observing p1 = %d, want 9000-3000 = 6000", st.TokensRemaining)
	}
	// p4's figure: p1..p3 were all unanswered when p4 started, so the
	// provider may have admitted them after p4: they stay subtracted.
	th.Observe(NOW, ps[3], openai("5500", "54.5s"))
	if st := th.Status(NOW); st.TokensRemaining != 2500 {
		t.Fatalf("remaining after observing p4 = %d, want 5500-3000 = 2500", st.TokensRemaining)
	}
	// An older call's response arriving late does not overwrite the newer figure.
	th.Observe(NOW, ps[1], openai("8000", "52s"))
	th.Observe(NOW, ps[2], openai("7000", "53s"))
	if st := th.Status(NOW); st.TokensRemaining != 2500 {
		t.Fatalf("remaining after a late p2 = %d, want 2500", st.TokensRemaining)
	}
	// Continuous replenishment: 54500 missing over 54.5 s is 1000 tokens/s.
	if st := th.Status(at(2 * time.Second)); st.TokensRemaining != 4500 {
		t.Fatalf("remaining 2 s later = %d, want 4500", st.TokensRemaining)
	}
	// p5 starts once all four have answered: its figure includes them all.
	p5 := mustStart(t, th, at(2*time.Second), 1000, Batch)
	th.Observe(at(2*time.Second), p5, openai("6500", "53.5s"))
	if st := th.Status(at(2 * time.Second)); st.TokensRemaining != 6500 {
		t.Fatalf("remaining after observing p5 = %d, want 6500", st.TokensRemaining)
	}
}

func splitLines(s string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == '\n' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return out
}

func TestThrottle_DoneRefundsUnobservedCharge(t *testing.T) {
	th := New(Config{}, NOW)
	th.Observe(NOW, Permit{}, ParseHeaders(hdr(
		"x-ratelimit-limit-tokens: 60000", "x-ratelimit-remaining-tokens: 10000", "x-ratelimit-reset-tokens: 50s",
		"x-ratelimit-limit-requests: 100", "x-ratelimit-remaining-requests: 100", "x-ratelimit-reset-requests: 0s",
	), NOW))
	p1 := mustStart(t, th, NOW, 5000, Batch)
	p2 := mustStart(t, th, NOW, 3000, Batch)
	th.Done(NOW, p1, 1000, true) // refund 4000
	if st := th.Status(NOW); st.TokensRemaining != 6000 || st.RequestsRemaining != 98 {
		t.Fatalf("after refund: %+v, want tokens 6000, requests 98", st)
	}
	th.Done(NOW, p1, 1000, true) // applied once: same value again
	th.Done(NOW, p2, 0, false)   // usage unknown: the charge stands
	if st := th.Status(NOW); st.TokensRemaining != 6000 {
		t.Fatalf("after repeated Done: tokens %d, want 6000", st.TokensRemaining)
	}
	p3 := mustStart(t, th, NOW, 1000, Batch)
	th.Done(NOW, p3, 2500, true) // more than charged: extra debit of 1500
	if st := th.Status(NOW); st.TokensRemaining != 3500 {
		t.Fatalf("after extra debit: tokens %d, want 3500", st.TokensRemaining)
	}
	// Once a figure covers p3, Done changes nothing.
	th.Observe(NOW, p3, ParseHeaders(hdr("x-ratelimit-limit-tokens: 60000", "x-ratelimit-remaining-tokens: 4000", "x-ratelimit-reset-tokens: 56s"), NOW))
	th.Done(NOW, p3, 0, true)
	if st := th.Status(NOW); st.TokensRemaining != 4000 {
		t.Fatalf("after Done of an observed call: tokens %d, want 4000", st.TokensRemaining)
	}
}

func TestThrottle_Status(t *testing.T) {
	th := New(Config{ReservePercent: 10, Rand: fixedRand(0)}, NOW)
	p := mustStart(t, th, NOW, 10, Interactive)
	th.OnTooManyRequests(NOW, p, ParseHeaders(hdr(
		"anthropic-ratelimit-requests-limit: 50",
		"anthropic-ratelimit-requests-remaining: 0",
		"anthropic-ratelimit-requests-reset: 2026-01-01T00:00:05Z",
		"anthropic-ratelimit-tokens-limit: 100000",
		"anthropic-ratelimit-tokens-remaining: 16000",
		"anthropic-ratelimit-tokens-reset: 2026-01-01T00:01:00Z",
	), NOW))
	want := Status{
		TokensLimit: 100000, TokensRemaining: 16000, RequestsLimit: 50, RequestsRemaining: 0,
		TokensReset: at(time.Minute), RequestsReset: at(5 * time.Second), PausedUntil: at(5 * time.Second),
		Dialect: DialectAnthropic, Paused: true,
	}
	if diff := cmp.Diff(want, th.Status(NOW)); diff != "" {
		t.Errorf("Status mismatch (-want +got):\n%s", diff)
	}
	want.TokensRemaining, want.RequestsRemaining, want.Paused = 16000+7000, 50, false
	if diff := cmp.Diff(want, th.Status(at(5*time.Second))); diff != "" {
		t.Errorf("Status at +5s mismatch (-want +got):\n%s", diff)
	}
}

func TestThrottle_ReconfigureKeepsState(t *testing.T) {
	th := New(Config{TokensPerMinuteHint: plentyOfTokens, RequestsPerMinuteHint: 10}, NOW)
	for i := 0; i < 10; i++ {
		mustStart(t, th, NOW, 1, Batch)
	}
	mustRefuse(t, th, NOW, 1, Batch)
	th.Reconfigure(NOW, Config{TokensPerMinuteHint: plentyOfTokens, RequestsPerMinuteHint: 20, ReservePercent: 50})
	mustRefuse(t, th, NOW, 1, Batch) // 10 of 20 used, reserve 10
	for i := 0; i < 10; i++ {
		mustStart(t, th, NOW, 1, Interactive)
	}
	mustRefuse(t, th, NOW, 1, Interactive)
}

func TestThrottle_OversizedCallStartsWhenFull(t *testing.T) {
	th := New(Config{TokensPerMinuteHint: 1000, RequestsPerMinuteHint: 100, ReservePercent: 50}, NOW)
	mustStart(t, th, NOW, 100, Interactive)
	if wait := mustRefuse(t, th, at(time.Second), 5000, Batch); wait != 59*time.Second {
		t.Errorf("wait = %v, want 59s (until the window is empty)", wait)
	}
	mustStart(t, th, at(time.Minute), 5000, Batch)
}

func TestThrottle_RefusalsAlwaysWaitPositive(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	dialects := []http.Header{
		hdr("x-ratelimit-limit-tokens: 5000", "x-ratelimit-remaining-tokens: 100", "x-ratelimit-reset-tokens: 3s", "x-ratelimit-limit-requests: 20", "x-ratelimit-remaining-requests: 1", "x-ratelimit-reset-requests: 1s"),
		hdr("X-RateLimit-Limit: 30", "X-RateLimit-Remaining: 0", "X-RateLimit-Reset: 7"),
		hdr(`RateLimit-Policy: "t";q=4000;qu="tokens";w=60`, `RateLimit: "t";r=0`),
		hdr("x-ratelimit-remaining-tokens: 0"),
		http.Header{},
		hdr("retry-after: 2"),
	}
	for seed := 0; seed < 5; seed++ {
		th := New(Config{ReservePercent: int64(seed * 10), TokensPerMinuteHint: int64(seed * 1000), BorrowAfter: time.Duration(seed) * time.Second}, NOW)
		now := NOW
		var live []Permit
		for i := 0; i < 5000; i++ {
			now = now.Add(time.Duration(r.Int64N(int64(300 * time.Millisecond))))
			switch r.IntN(5) {
			case 0, 1:
				p, ok, wait := th.TryStart(now, r.Int64N(3000), Priority(r.IntN(2)))
				if ok {
					live = append(live, p)
				} else if wait <= 0 || wait > MaxRetryAfter+time.Second {
					t.Fatalf("refused with wait %v", wait)
				}
			case 2:
				if len(live) > 0 {
					i := r.IntN(len(live))
					th.Observe(now, live[i], ParseHeaders(dialects[r.IntN(len(dialects))], now))
				}
			case 3:
				if len(live) > 0 {
					i := r.IntN(len(live))
					th.Done(now, live[i], r.Int64N(3000), r.IntN(2) == 0)
					live = append(live[:i], live[i+1:]...)
				}
			case 4:
				if r.IntN(20) == 0 && len(live) > 0 {
					th.OnTooManyRequests(now, live[r.IntN(len(live))], ParseHeaders(dialects[r.IntN(len(dialects))], now))
				}
			}
		}
	}
}

func TestThrottle_ConcurrentUse(t *testing.T) {
	th := New(Config{TokensPerMinuteHint: 600_000, RequestsPerMinuteHint: 6000, ReservePercent: 20}, NOW)
	var wg sync.WaitGroup
	var mu sync.Mutex
	started := 0
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				now := at(time.Duration(i) * time.Millisecond)
				p, ok, _ := th.TryStart(now, 100, Priority(g%2))
				if !ok {
					continue
				}
				mu.Lock()
				started++
				mu.Unlock()
				if i%3 == 0 {
					th.Observe(now, p, Quota{Tokens: none, Requests: none})
				} else {
					th.Done(now, p, 50, true)
				}
				_ = th.Status(now)
			}
		}(g)
	}
	wg.Wait()
	// 2 s of simulated time: at most the per-minute hints, 6000 requests.
	if started == 0 || started > 6000 {
		t.Fatalf("started %d, want in (0, 6000]", started)
	}
}

// TestBatchWaitEndsWhenBorrowingBegins (BC-39, BC-37): 2 requests a minute,
// half kept for interactive calls, batch borrows after 5 s without one. An
// interactive call at NOW takes batch's share; a batch call refused at
// NOW+1s is told to ask again at NOW+5s, when borrowing begins (not when the
// window refills, 60 s later, past a batch job's deadline), and starts
// then. Without BorrowAfter the wait is the window's refill.
func TestBatchWaitEndsWhenBorrowingBegins(t *testing.T) {
	th := New(Config{TokensPerMinuteHint: plentyOfTokens, RequestsPerMinuteHint: 2, ReservePercent: 50, BorrowAfter: 5 * time.Second, Rand: fixedRand(0)}, NOW)
	mustStart(t, th, NOW, 1, Interactive)
	if wait := mustRefuse(t, th, at(time.Second), 1, Batch); wait != 4*time.Second {
		t.Errorf("batch wait at +1s = %v, want 4s (borrowing begins at +5s)", wait)
	}
	mustStart(t, th, at(5*time.Second), 1, Batch)

	strict := New(Config{TokensPerMinuteHint: plentyOfTokens, RequestsPerMinuteHint: 2, ReservePercent: 50, Rand: fixedRand(0)}, NOW)
	mustStart(t, strict, NOW, 1, Interactive)
	if wait := mustRefuse(t, strict, at(time.Second), 1, Batch); wait <= 4*time.Second {
		t.Errorf("batch wait without BorrowAfter = %v, want the window's refill (> 4s)", wait)
	}
}
