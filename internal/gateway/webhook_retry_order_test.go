package gateway

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// hookedStore fails every Update while failing is set, and runs
// beforeUpdate (once) before the next Update.
type hookedStore struct {
	*jobs.MemStore
	failing      *atomic.Bool
	beforeUpdate *atomic.Pointer[func()]
}

func (s hookedStore) Update(id string, fn func(*jobs.Job) error) (jobs.Job, error) {
	if f := s.beforeUpdate.Swap(nil); f != nil {
		(*f)()
	}
	if s.failing.Load() {
		j, _ := s.MemStore.Get(id)
		return j, errVolumeFull
	}
	return s.MemStore.Update(id, fn)
}

// TestWebhookStateKeptIsNotUndoneByAnEarlierOne: a delivery's state the
// store fails to write while an earlier state kept for a retry is being
// written again (the delivery's next attempt ends meanwhile) is kept, and
// written: the earlier write, whether it succeeds or fails again, neither
// drops it nor replaces it. The job used to end with webhook_status
// "pending" after its delivery (delivered again by the next scheduler).
func TestWebhookStateKeptIsNotUndoneByAnEarlierOne(t *testing.T) {
	for _, tc := range []struct {
		name         string
		earlierFails bool
	}{{"earlier written", false}, {"earlier fails again", true}} {
		t.Run(tc.name, func(t *testing.T) {
			hs := hookedStore{failing: new(atomic.Bool), beforeUpdate: new(atomic.Pointer[func()])}
			up := newUpstream(t, okJSON(10, 20))
			e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})},
				withStore(func(m *jobs.MemStore, _ *clocktesting.FakeClock) jobs.Store {
					hs.MemStore = m
					return hs
				}))
			t.Cleanup(func() { stopWebhooks(e.gw) })
			now := e.clock.Now()
			j, err := hs.MemStore.Create(jobs.Job{Tenant: "a", Status: jobs.StatusSucceeded, Model: "m",
				CreatedAt: now, FinishedAt: now, Deadline: now.Add(time.Hour), WebhookURL: "https://hooks.example/x",
				WebhookStatus: webhookPending})
			if err != nil {
				t.Fatal(err)
			}
			n, d := e.gw.hooks, e.gw.dispatch
			// Attempt 1 failed; its state is not recorded.
			hs.failing.Store(true)
			n.writeState(j.ID, webhookPending, 1)
			// While it is written again, attempt 2 delivers, and that
			// state is not recorded either.
			during := func() {
				n.writeState(j.ID, webhookDelivered, 2)
				hs.failing.Store(tc.earlierFails)
			}
			hs.beforeUpdate.Store(&during)
			d.writeUnrecorded(time.Time{})
			hs.failing.Store(false)
			d.writeUnrecorded(time.Time{})
			d.writeUnrecorded(time.Time{})
			if st, a := e.webhookState(j.ID); st != webhookDelivered || a != 2 {
				t.Errorf("webhook state %s %d, want delivered 2", st, a)
			}
		})
	}
}

// TestWebhookAttemptsCountedWhenAStateIsNotRecorded: a delivery's attempts
// are counted from the attempts it made, not from the stored count, which
// lags while a state the store failed to write waits for its retry: 500
// (its pending state not recorded), then 204 half a second later, before
// the retry, is delivered after 2 attempts. It was recorded delivered
// after 1.
func TestWebhookAttemptsCountedWhenAStateIsNotRecorded(t *testing.T) {
	hs := hookedStore{failing: new(atomic.Bool), beforeUpdate: new(atomic.Pointer[func()])}
	up := newUpstream(t, okJSON(10, 20))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})},
		withStore(func(m *jobs.MemStore, _ *clocktesting.FakeClock) jobs.Store {
			hs.MemStore = m
			return hs
		}))
	t.Cleanup(func() { stopWebhooks(e.gw) })
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if calls.Add(1) == 1 {
			hs.failing.Store(true) // the pending state after this attempt
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		hs.failing.Store(false)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	id := e.submit("key-a", jobBody(10, 100, `,"webhookURL":"`+srv.URL+`"`)).ID
	stepBackoff(t, e, 1, 500*time.Millisecond)
	if n := waitWebhook(t, e, id, webhookDelivered); n != 2 {
		t.Errorf("webhook attempts %d, want 2", n)
	}
}

// TestWebhookPanicCountsItsAttempts: a delivery that panics at its second
// attempt, while the pending state of its first is not recorded yet (the
// store failed it), is recorded failed after 2 attempts, the count the
// delivery had reached; it was recorded with the stored count plus one (1).
func TestWebhookPanicCountsItsAttempts(t *testing.T) {
	hs := hookedStore{failing: new(atomic.Bool), beforeUpdate: new(atomic.Pointer[func()])}
	up := newUpstream(t, okJSON(10, 20))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})},
		withStore(func(m *jobs.MemStore, _ *clocktesting.FakeClock) jobs.Store {
			hs.MemStore = m
			return hs
		}))
	t.Cleanup(func() { stopWebhooks(e.gw) })
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hs.failing.Store(true) // the pending state after this attempt
		w.WriteHeader(http.StatusInternalServerError)
	}))
	t.Cleanup(srv.Close)
	n := e.gw.webhooks()
	healthy := n.client.Transport
	var calls atomic.Int64
	n.client.Transport = roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if calls.Add(1) == 2 {
			hs.failing.Store(false)
			panic("transport fault")
		}
		return healthy.RoundTrip(r)
	})
	id := e.submit("key-a", jobBody(10, 100, `,"webhookURL":"`+srv.URL+`"`)).ID
	stepBackoff(t, e, 1, 500*time.Millisecond)
	if got := waitWebhook(t, e, id, webhookFailed); got != 2 {
		t.Errorf("webhook attempts %d, want 2", got)
	}
}
