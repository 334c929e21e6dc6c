package gateway

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// TestJobHeldByTheReserveIsNotExpiredBeforeBorrowing (BC-37, BC-39): the
// model's hint allows 2 requests per minute, the pool keeps 50% for
// interactive calls and lets batch borrow the reserve after 5 s without
// one. An interactive call at NOW uses batch's share; a job with a 20 s
// deadline is refused by the reserve, not by a provider pause. It must
// stay queued and be sent once borrowing begins (NOW+5s), not be expired at
// NOW as "paused past the job's deadline" (the throttle's wait, about the
// window's 60 s, ignores the borrowing that starts sooner).
func TestJobHeldByTheReserveIsNotExpiredBeforeBorrowing(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json") // no quota headers: the hints pace
		fmt.Fprint(w, `{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":10,"total_tokens":20}}`)
	})
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})}, withPool(func(p *registry.PoolPolicy) {
		p.ReservePercent = 50
		p.BorrowAfter = 5 * time.Second
		p.Models = []registry.ModelPolicy{{Name: testModel, TokensPerMinute: 1000000, RequestsPerMinute: 2}}
	}))
	if resp := e.do("POST", "/v1/completions", "key-a", completionsBody(10, 10, "")); resp.StatusCode != http.StatusOK {
		t.Fatalf("interactive call: %d", resp.StatusCode)
	} else {
		readAll(t, resp)
	}
	j := e.submit("key-a", jobBody(10, 10, `,"deadlineSeconds":20`))
	waitFor(t, "the dispatcher to wait or the job to finish", func() bool {
		return e.clock.HasWaiters() || e.storeStatus(j.ID).Finished()
	})
	if st := e.storeStatus(j.ID); st != jobs.StatusQueued {
		t.Fatalf("job at NOW: %s %+v, want queued (the provider is not paused; borrowing begins at NOW+5s)", st, e.job("key-a", j.ID).Error)
	}
	e.clock.Step(6 * time.Second)
	waitFor(t, "the job to succeed", func() bool { return e.storeStatus(j.ID) == jobs.StatusSucceeded })
	if n := up.calls.Load(); n != 2 {
		t.Errorf("upstream calls = %d, want 2", n)
	}
}
