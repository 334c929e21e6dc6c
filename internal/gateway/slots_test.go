package gateway

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// A batch backlog fills at most the upstream slots outside the pool's
// reserve (4 slots, reserve 25%: 3), so an interactive call still finds a
// slot instead of a 503 pool_concurrency_limit; once no interactive call has
// arrived for BorrowAfter, batch fills the reserved slot too.
func TestBatchLeavesReservedSlotsToInteractive(t *testing.T) {
	release := make(chan struct{})
	var inUpstream atomic.Int64
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		inUpstream.Add(1)
		<-release
		okJSON(10, 5)(w, r, body)
	})
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{}), tenant("b", limiter.Limits{})},
		withConcurrency(4), withPool(func(p *registry.PoolPolicy) {
			p.ReservePercent = 25
			p.BorrowAfter = time.Minute
		}))
	for range 6 {
		e.submit("key-a", jobBody(10, 5, ""))
	}
	waitFor(t, "3 jobs upstream", func() bool { return inUpstream.Load() == 3 })
	time.Sleep(50 * time.Millisecond) // a fourth start would be upstream by now (evidence only; asserted below)
	if got := inUpstream.Load(); got != 3 {
		t.Fatalf("%d batch calls upstream, want 3 (one of 4 slots reserved)", got)
	}

	done := make(chan *http.Response)
	go func() { done <- e.do("POST", "/v1/completions", "key-b", completionsBody(10, 5, "")) }()
	waitFor(t, "the interactive call upstream", func() bool { return inUpstream.Load() == 4 })
	release <- struct{}{} // one call answers: either may be first
	close(release)
	resp := <-done
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("interactive call: %d %s, want 200", resp.StatusCode, readAll(t, resp))
	}
	readAll(t, resp)
	waitFor(t, "the backlog drained", func() bool { return inUpstream.Load() == 7 })
}

// After BorrowAfter without an interactive call, batch fills every slot.
func TestBatchBorrowsReservedSlots(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	var inUpstream atomic.Int64
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		inUpstream.Add(1)
		<-release
		okJSON(10, 5)(w, r, body)
	})
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})},
		withConcurrency(4), withPool(func(p *registry.PoolPolicy) {
			p.ReservePercent = 25
			p.BorrowAfter = time.Minute
		}))
	for range 6 {
		e.submit("key-a", jobBody(10, 5, ""))
	}
	waitFor(t, "3 jobs upstream", func() bool { return inUpstream.Load() == 3 })
	e.clock.Step(time.Minute)
	waitFor(t, "the reserved slot borrowed", func() bool { return inUpstream.Load() == 4 })
}
