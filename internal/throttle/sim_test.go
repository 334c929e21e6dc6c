package throttle

import (
	"container/heap"
	"math"
	"net/http"
	"strconv"
	"testing"
	"time"
)

// fakeProvider enforces a quota like OpenAI: continuous token buckets for
// tokens and requests, checked at arrival, with OpenAI rate-limit headers on
// every response (reset = time until full).
type fakeProvider struct {
	tokCap, reqCap   float64 // per minute; also the bucket capacity
	tokLevel, reqLvl float64
	last             time.Time
	consumed         int64
	ok, tooMany      int
}

func newFakeProvider(tpm, rpm float64, now time.Time) *fakeProvider {
	return &fakeProvider{tokCap: tpm, reqCap: rpm, tokLevel: tpm, reqLvl: rpm, last: now}
}

func (f *fakeProvider) refill(now time.Time) {
	dt := now.Sub(f.last).Minutes()
	if dt > 0 {
		f.tokLevel = math.Min(f.tokCap, f.tokLevel+dt*f.tokCap)
		f.reqLvl = math.Min(f.reqCap, f.reqLvl+dt*f.reqCap)
		f.last = now
	}
}

func untilFull(level, capacity float64) string {
	d := time.Duration((capacity - level) / capacity * float64(time.Minute)).Round(time.Millisecond)
	return d.String()
}

// call handles one request of cost tokens arriving at now.
func (f *fakeProvider) call(now time.Time, cost int64) (status int, h http.Header) {
	f.refill(now)
	status = http.StatusOK
	if f.tokLevel >= float64(cost) && f.reqLvl >= 1 {
		f.tokLevel -= float64(cost)
		f.reqLvl--
		f.consumed += cost
		f.ok++
	} else {
		status = http.StatusTooManyRequests
		f.tooMany++
	}
	h = http.Header{}
	h.Set("x-ratelimit-limit-tokens", strconv.FormatInt(int64(f.tokCap), 10))
	h.Set("x-ratelimit-remaining-tokens", strconv.FormatInt(int64(f.tokLevel), 10))
	h.Set("x-ratelimit-reset-tokens", untilFull(f.tokLevel, f.tokCap))
	h.Set("x-ratelimit-limit-requests", strconv.FormatInt(int64(f.reqCap), 10))
	h.Set("x-ratelimit-remaining-requests", strconv.FormatInt(int64(f.reqLvl), 10))
	h.Set("x-ratelimit-reset-requests", untilFull(f.reqLvl, f.reqCap))
	if status == http.StatusTooManyRequests {
		need := math.Max(float64(cost)-f.tokLevel, 0) / f.tokCap * 60
		h.Set("retry-after", strconv.Itoa(int(math.Ceil(need))))
	}
	return status, h
}

// event is a worker's next action on the simulated clock.
type event struct {
	at     time.Time
	worker int
	// a response to deliver (inFlight) or a start attempt
	inFlight bool
	permit   Permit
	status   int
	h        http.Header
}

type eventQueue []*event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at.Equal(q[j].at) {
		return q[i].worker < q[j].worker
	}
	return q[i].at.Before(q[j].at)
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

const (
	simTPM      = 60000
	simRPM      = 600
	simCost     = 500
	simLatency  = 200 * time.Millisecond
	simWorkers  = 10
	simDuration = 10 * time.Minute
)

type simResult struct {
	consumed            int64
	tooMany             int
	tooManyAfterFirstOK int
}

// runSim drives simWorkers workers against the fake provider for
// simDuration; with th nil the workers are a naive client that retries on
// 429 after the provider's Retry-After.
func runSim(th *Throttle) simResult {
	prov := newFakeProvider(simTPM, simRPM, NOW)
	q := &eventQueue{}
	for w := 0; w < simWorkers; w++ {
		heap.Push(q, &event{at: NOW, worker: w})
	}
	end := NOW.Add(simDuration)
	var res simResult
	observed := false
	for q.Len() > 0 {
		e := heap.Pop(q).(*event)
		if e.at.After(end) {
			continue
		}
		if e.inFlight {
			next := &event{at: e.at, worker: e.worker}
			quota := ParseHeaders(e.h, e.at)
			if e.status == http.StatusTooManyRequests {
				res.tooMany++
				if observed {
					res.tooManyAfterFirstOK++
				}
				if th != nil {
					th.OnTooManyRequests(e.at, e.permit, quota)
				} else {
					next.at = e.at.Add(quota.RetryAfter)
				}
			} else if th != nil {
				th.Observe(e.at, e.permit, quota)
			}
			observed = true
			heap.Push(q, next)
			continue
		}
		var p Permit
		if th != nil {
			var ok bool
			var wait time.Duration
			p, ok, wait = th.TryStart(e.at, simCost, Batch)
			if !ok {
				e.at = e.at.Add(wait)
				heap.Push(q, e)
				continue
			}
		}
		status, h := prov.call(e.at, simCost)
		heap.Push(q, &event{at: e.at.Add(simLatency), worker: e.worker, inFlight: true, permit: p, status: status, h: h})
	}
	res.consumed = prov.consumed
	return res
}

// TestGoodput: against a provider that enforces 60,000 tokens/min and 600
// requests/min, the throttle uses at least 95% of the quota over 10 minutes
// with zero 429s once the first response has been observed, where a naive
// retry-on-429 client gets many.
func TestGoodput(t *testing.T) {
	th := New(Config{Rand: seededRand(42)}, NOW)
	got := runSim(th)
	// The most the provider can grant: a full bucket at the start plus the
	// refill over the run.
	quota := int64(simTPM + simTPM*simDuration.Minutes())
	if got.tooManyAfterFirstOK != 0 {
		t.Errorf("throttle: %d upstream 429s after the first observation, want 0", got.tooManyAfterFirstOK)
	}
	if got.consumed < quota*95/100 {
		t.Errorf("throttle: consumed %d tokens, want >= 95%% of %d", got.consumed, quota)
	}
	naive := runSim(nil)
	if naive.tooMany < 1000 {
		t.Errorf("naive client: %d 429s, expected many (the comparison is meaningless otherwise)", naive.tooMany)
	}
	t.Logf("throttle: consumed %d of %d (%.1f%%), 429s %d; naive: consumed %d, 429s %d",
		got.consumed, quota, 100*float64(got.consumed)/float64(quota), got.tooMany, naive.consumed, naive.tooMany)
}
