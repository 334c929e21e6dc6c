package registry

import (
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fairshare-dev/fairshare/internal/throttle"
)

// groupPool is a pool whose models a and b share the rate-limit group g and
// whose model c has a limit of its own.
func groupPool() PoolPolicy {
	return PoolPolicy{Name: "pool", BaseURL: "http://127.0.0.1:1", Models: []ModelPolicy{
		{Name: "a", TokensPerMinute: 1000, RequestsPerMinute: 50, RateLimitGroup: "g"},
		{Name: "b", TokensPerMinute: 600, RateLimitGroup: "g"},
		{Name: "c", TokensPerMinute: 900},
	}}
}

// pause429 reports a 429 with Retry-After d on one call of th at now.
func pause429(t *testing.T, th *throttle.Throttle, now time.Time, d time.Duration) {
	t.Helper()
	p, ok, _ := th.TryStart(now, 1, throttle.Interactive)
	if !ok {
		t.Fatal("TryStart refused before the 429")
	}
	th.OnTooManyRequests(now, p, throttle.Quota{RetryAfter: d, HasRetryAfter: true})
}

func TestRateLimitGroupSharesOneThrottle(t *testing.T) {
	r := New(clocktesting.NewFakeClock(t0))
	if err := r.SetPool(groupPool()); err != nil {
		t.Fatal(err)
	}
	a, b, c := r.Model("a"), r.Model("b"), r.Model("c")
	if a.Throttle != b.Throttle {
		t.Fatal("models a and b of group g have separate throttles")
	}
	if c.Throttle == a.Throttle {
		t.Fatal("model c, without a group, shares group g's throttle")
	}
	// The group's hints are the smallest its members state: tokens 600
	// (b), requests 50 (a, the only one stating it).
	st := a.Throttle.Status(t0)
	if st.TokensLimit != 600 || st.RequestsLimit != 50 {
		t.Errorf("group g hints: tokens %d, requests %d; want 600, 50", st.TokensLimit, st.RequestsLimit)
	}
	if st := c.Throttle.Status(t0); st.TokensLimit != 900 || st.RequestsLimit != -1 {
		t.Errorf("model c hints: tokens %d, requests %d; want 900, -1", st.TokensLimit, st.RequestsLimit)
	}
	// A 429 for a pauses b, not c.
	pause429(t, a.Throttle, t0, 7*time.Second)
	if got := b.Throttle.PausedUntil(); !got.Equal(t0.Add(7 * time.Second)) {
		t.Errorf("b paused until %v after a's 429; want %v", got, t0.Add(7*time.Second))
	}
	if _, ok, _ := c.Throttle.TryStart(t0, 1, throttle.Interactive); !ok {
		t.Error("a 429 of group g paused model c")
	}
}

func TestRateLimitGroupChangesKeepFigures(t *testing.T) {
	r := New(clocktesting.NewFakeClock(t0))
	p := PoolPolicy{Name: "pool", BaseURL: "http://127.0.0.1:1", Models: []ModelPolicy{
		{Name: "a", TokensPerMinute: 1000}, {Name: "b", TokensPerMinute: 1000},
	}}
	if err := r.SetPool(p); err != nil {
		t.Fatal(err)
	}
	a0, b0 := r.Model("a"), r.Model("b")
	pause429(t, a0.Throttle, t0, 30*time.Second)
	b0.AddThrottled()
	b0.AddThrottled()
	b0.ObserveTokenLimit(2000)

	// a and b form group g: the group takes a's throttle (the first
	// member's), with its pause; b is replaced by a Model on it, keeping
	// its 429 count and provider token limit.
	p.Models[0].RateLimitGroup, p.Models[1].RateLimitGroup = "g", "g"
	if err := r.SetPool(p); err != nil {
		t.Fatal(err)
	}
	a1, b1 := r.Model("a"), r.Model("b")
	if a1 != a0 {
		t.Error("model a, whose throttle the group took, was replaced")
	}
	if b1 == b0 || b1.Throttle != a0.Throttle {
		t.Fatal("model b did not move onto the group's throttle")
	}
	if got := b1.Throttle.PausedUntil(); !got.Equal(t0.Add(30 * time.Second)) {
		t.Errorf("group paused until %v; want a's pause %v", got, t0.Add(30*time.Second))
	}
	if got := r.Snapshot(t0).Models; len(got) != 2 || got[1].Name != "b" || got[1].Throttled != 2 {
		t.Errorf("snapshot models %+v; want b with its 2 throttled calls", got)
	}
	if got := b1.TokenLimit(); got != 2000 {
		t.Errorf("b's token limit %d after the move; want the provider's 2000", got)
	}
	// b0, held by a call in flight, still settles on its old throttle.
	if b0.Throttle == b1.Throttle {
		t.Error("the replaced Model's throttle changed under a call in flight")
	}

	// a leaves the group: b keeps the group's throttle, a gets a new one.
	p.Models[0].RateLimitGroup = ""
	if err := r.SetPool(p); err != nil {
		t.Fatal(err)
	}
	a2, b2 := r.Model("a"), r.Model("b")
	if b2 != b1 {
		t.Error("model b, still in group g, was replaced")
	}
	if a2 == a1 || a2.Throttle == b2.Throttle {
		t.Fatal("model a, out of the group, still shares its throttle")
	}
	if _, ok, _ := a2.Throttle.TryStart(t0, 1, throttle.Interactive); !ok {
		t.Error("model a's own new throttle is paused")
	}
	if _, ok, _ := b2.Throttle.TryStart(t0, 1, throttle.Interactive); ok {
		t.Error("group g lost its pause when a left it")
	}
}

func TestRateLimitGroupSwapKeepsEachGroupsThrottle(t *testing.T) {
	r := New(clocktesting.NewFakeClock(t0))
	p := PoolPolicy{Name: "pool", BaseURL: "http://127.0.0.1:1", Models: []ModelPolicy{
		{Name: "a", RateLimitGroup: "g1"}, {Name: "b", RateLimitGroup: "g2"},
	}}
	if err := r.SetPool(p); err != nil {
		t.Fatal(err)
	}
	g1, g2 := r.Model("a").Throttle, r.Model("b").Throttle
	p.Models[0].RateLimitGroup, p.Models[1].RateLimitGroup = "g2", "g1"
	if err := r.SetPool(p); err != nil {
		t.Fatal(err)
	}
	if r.Model("a").Throttle != g2 || r.Model("b").Throttle != g1 {
		t.Error("swapping two models' groups did not swap their throttles: a group's throttle follows the group")
	}
	// A group named like a model is another key.
	p.Models = []ModelPolicy{{Name: "a"}, {Name: "b", RateLimitGroup: "a"}}
	if err := r.SetPool(p); err != nil {
		t.Fatal(err)
	}
	if r.Model("a").Throttle == r.Model("b").Throttle {
		t.Error("group \"a\" shares model a's own throttle")
	}
}
