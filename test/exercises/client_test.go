package exercises

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Quota dimensions of the gateway's headers: X-RateLimit-*-Tokens (weighted
// tokens) and X-RateLimit-*-Requests (docs/api.md "Rejections").
const (
	dimTokens   = "Tokens"
	dimRequests = "Requests"
)

// mirror is a client's copy of one of its token buckets at the gateway,
// rebuilt from the quota headers: level units at time at, refilled at perSec
// (the published per-minute limit / 60), never above capacity (a lower bound
// of the bucket's capacity: the largest remaining seen or cost admitted, so
// that the copy errs on the side of waiting).
type mirror struct {
	level, perSec, capacity float64
	at                      time.Time
}

// levelAt is the predicted level at now.
func (m *mirror) levelAt(now time.Time) float64 {
	return math.Min(m.capacity, m.level+m.perSec*now.Sub(m.at).Seconds())
}

// pacer makes a client self-throttle from the gateway's headers (seed 002
// section 8: "the headers let clients self-throttle proactively"). Before a
// request it waits until every bucket it mirrors holds the request's cost
// and debits it; every response's X-RateLimit-Remaining-* and
// X-RateLimit-Limit-* correct the mirrors. Until the first response nothing
// is known, so one request is sent alone as a probe. It is shared by the
// workers of one client.
type pacer struct {
	mu      sync.Mutex
	dims    map[string]*mirror
	probe   bool // the probe is in flight
	nextID  int64
	pending map[int64]map[string]float64 // requests sent and not answered: their cost
}

// newPacer returns a pacer that knows nothing yet.
func newPacer() *pacer {
	return &pacer{dims: map[string]*mirror{}, pending: map[int64]map[string]float64{}}
}

// acquire waits until a request costing cost (units per dimension) fits the
// mirrored buckets, debits them and returns the request's ticket; false when
// deadline passes first.
func (p *pacer) acquire(cost map[string]float64, deadline time.Time) (int64, bool) {
	for {
		if !time.Now().Before(deadline) {
			return 0, false
		}
		p.mu.Lock()
		now := time.Now()
		var wait time.Duration
		switch {
		case len(p.dims) == 0 && p.probe:
			wait = 2 * time.Millisecond // the probe's answer will tell
		case len(p.dims) == 0:
			p.probe = true
		default:
			for d, m := range p.dims {
				if short := cost[d] - m.levelAt(now); short > 0 {
					wait = max(wait, time.Duration(short/m.perSec*float64(time.Second))+time.Millisecond)
				}
			}
		}
		if wait == 0 {
			for d, m := range p.dims {
				m.level, m.at = m.levelAt(now)-cost[d], now
			}
			p.nextID++
			id := p.nextID
			p.pending[id] = cost
			p.mu.Unlock()
			return id, true
		}
		p.mu.Unlock()
		if !sleepUntil(wait, deadline) {
			return 0, false
		}
	}
}

// observe corrects the mirrors from the answer to request ticket (admitted:
// it succeeded). The gateway's Remaining is the bucket floored to an
// integer, taken after the refund of this request and after the charge of
// every request it admitted before answering, which may or may not include
// this client's other requests still in flight. So the true level lies in
// [Remaining - in flight, Remaining + 1): a prediction inside keeps its
// precision; one outside (a refund the client could not predict, or a charge
// it did not know of) is replaced by the pessimistic end.
func (p *pacer) observe(ticket int64, h http.Header, admitted bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cost := p.pending[ticket]
	delete(p.pending, ticket)
	p.probe = false
	now := time.Now()
	for _, d := range []string{dimTokens, dimRequests} {
		rem, err1 := strconv.ParseInt(h.Get("X-RateLimit-Remaining-"+d), 10, 64)
		lim, err2 := strconv.ParseInt(h.Get("X-RateLimit-Limit-"+d), 10, 64)
		if err1 != nil || err2 != nil || lim <= 0 {
			continue
		}
		var inFlight float64
		for _, c := range p.pending {
			inFlight += c[d]
		}
		r := float64(rem)
		m := p.dims[d]
		if m == nil {
			m = &mirror{level: r - inFlight, at: now}
			p.dims[d] = m
		}
		m.perSec = float64(lim) / 60
		m.capacity = math.Max(m.capacity, r)
		if admitted {
			m.capacity = math.Max(m.capacity, cost[d])
		}
		if pred := m.levelAt(now); pred < r-inFlight || pred >= r+1 {
			m.level, m.at = r-inFlight, now
		}
	}
}

// politeWorkers runs workers goroutines that send body for tenant id until
// deadline, honouring Retry-After on a refusal (seed 002 section 8), and,
// when p is not nil, pacing every request through p first. jobs, when not
// nil, bounds the work: each worker claims one job at a time and retries it
// until it succeeds. It returns when every worker has stopped (after its
// last reply).
func politeWorkers(h *harness, id string, body []byte, cost map[string]float64, workers int, deadline time.Time,
	jobs *atomic.Int64, p *pacer, tl *tally, check func(reply)) {
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for jobs == nil || jobs.Add(-1) >= 0 {
				for {
					var ticket int64
					if p != nil {
						var ok bool
						if ticket, ok = p.acquire(cost, deadline); !ok {
							return
						}
					} else if !time.Now().Before(deadline) {
						return
					}
					sent := time.Now()
					r := h.post(id, body)
					tl.add(r, sent)
					if check != nil {
						check(r)
					}
					ok := r.err == nil && r.status == http.StatusOK
					if p != nil {
						p.observe(ticket, r.header, ok)
					}
					if ok {
						break
					}
					wait := 100 * time.Millisecond // a transport error
					if ra, ok := r.retryAfter(); ok {
						wait = ra
					}
					if !sleepUntil(wait, deadline) {
						return
					}
				}
			}
		})
	}
	wg.Wait()
}

// naiveWorkers runs workers goroutines that each claim jobs and send them as
// fast as they can, retrying a refused one after a fixed pause and ignoring
// every header, until the jobs are done or deadline passes.
func naiveWorkers(h *harness, id string, body []byte, workers int, pause time.Duration, deadline time.Time,
	jobs *atomic.Int64, tl *tally, check func(reply)) {
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for jobs.Add(-1) >= 0 {
				for time.Now().Before(deadline) {
					sent := time.Now()
					r := h.post(id, body)
					tl.add(r, sent)
					if check != nil {
						check(r)
					}
					if r.err == nil && r.status == http.StatusOK {
						break
					}
					time.Sleep(pause)
				}
			}
		})
	}
	wg.Wait()
}

// ietfParams returns the parameters of the member named name of an IETF
// quota field (draft-ietf-httpapi-ratelimit-headers: RateLimit and
// RateLimit-Policy are Structured Field Lists whose members are a policy
// name with parameters, e.g. `"tokens";r=9850;t=1`), and whether it was
// there. Parameter values are returned as written (strings keep quotes).
// Only the simple form the gateway writes is understood (no commas or
// semicolons inside strings).
func ietfParams(h http.Header, field, name string) (map[string]string, bool) {
	for item := range strings.SplitSeq(h.Get(field), ",") {
		params := strings.Split(strings.TrimSpace(item), ";")
		if strings.Trim(params[0], `"`) != name {
			continue
		}
		m := map[string]string{}
		for _, kv := range params[1:] {
			k, v, _ := strings.Cut(strings.TrimSpace(kv), "=")
			m[k] = v
		}
		return m, true
	}
	return nil, false
}

// ietfRemaining reads the remaining units (r) of policy name from the IETF
// `RateLimit` field.
func ietfRemaining(h http.Header, name string) (int64, bool) {
	m, ok := ietfParams(h, "RateLimit", name)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(m["r"], 10, 64)
	return n, err == nil
}
