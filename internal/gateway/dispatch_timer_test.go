package gateway

import (
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// lateTimerClock moves the fake clock on by step while the first timer of
// length d is being made, before it starts: the clock read that gave d and
// the timer's own start are two steps, and time can pass between them.
type lateTimerClock struct {
	*clocktesting.FakeClock
	d, step time.Duration
	done    atomic.Bool
}

func (c *lateTimerClock) NewTimer(d time.Duration) clock.Timer {
	if d == c.d && c.done.CompareAndSwap(false, true) {
		c.FakeClock.Step(c.step)
	}
	return c.FakeClock.NewTimer(d)
}

// TestDispatcherTimerMadeLate: a batch job waiting for a model's 30 s pause
// to end is sent once the clock has passed the end, also when the clock
// passed it while the dispatcher was making the timer of its wait (its next
// sweep, 1 s). Before, that timer started at the new time, 1 s later than
// the time it was for, so on a clock that moves by steps the job was never
// sent (a test's Step of 31 s right after a submission hung its job, about
// 1 run in 300).
func TestDispatcherTimerMadeLate(t *testing.T) {
	var lc *lateTimerClock
	up := newUpstream(t, okJSON(10, 20))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})}, withClock(func(fc *clocktesting.FakeClock) clock.WithTicker {
		lc = &lateTimerClock{FakeClock: fc, d: sweepInterval, step: 31 * time.Second}
		return lc
	}))
	e.pause(30 * time.Second)
	j := e.submit("key-a", jobBody(10, 100, ""))
	waitFor(t, "the job to succeed", func() bool { return e.storeStatus(j.ID) == jobs.StatusSucceeded })
	if !lc.done.Load() {
		t.Fatal("the dispatcher made no timer for its next sweep")
	}
	if got := e.clock.Now().Sub(t0); got != 31*time.Second {
		t.Errorf("clock moved %v, want 31s (one step, while the timer was made)", got)
	}
}
