package registry

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fairshare-dev/fairshare/internal/fairqueue"
	"github.com/fairshare-dev/fairshare/internal/limiter"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func i64(v int64) *int64 { return &v }

func testPool() PoolPolicy {
	return PoolPolicy{Name: "pool", BaseURL: "http://127.0.0.1:1", Models: []ModelPolicy{{Name: "m", TokensPerMinute: 1000}}}
}

func TestSetPoolValidatesThenCommits(t *testing.T) {
	r := New(clocktesting.NewFakeClock(t0))
	if err := r.SetPool(testPool()); err != nil {
		t.Fatal(err)
	}
	p := r.Pool()
	if p.Quantum != DefaultQuantum || p.IdentMode != IdentifyAPIKey || p.IdentHeader != DefaultIdentHeader ||
		p.CostModel != limiter.DefaultCostModel || p.UpstreamTimeout != DefaultUpstreamTimeout {
		t.Errorf("defaults not applied: %+v", p)
	}
	m := r.Model("m")
	for _, bad := range []PoolPolicy{
		{BaseURL: "http://x"},
		{BaseURL: "ftp://x", Models: []ModelPolicy{{Name: "m"}}},
		{BaseURL: "http://x", Models: []ModelPolicy{{Name: "m"}, {Name: "m"}}},
		{BaseURL: "http://x", Models: []ModelPolicy{{Name: "m"}}, ReservePercent: 100},
		{BaseURL: "http://x", Models: []ModelPolicy{{Name: "m"}}, IdentMode: "Cookie"},
	} {
		if err := r.SetPool(bad); err == nil {
			t.Errorf("SetPool(%+v) accepted", bad)
		}
	}
	if r.Pool() != p || r.Model("m") != m {
		t.Error("an invalid policy changed the committed one")
	}
	next := testPool()
	next.Models = append(next.Models, ModelPolicy{Name: "n"})
	if err := r.SetPool(next); err != nil {
		t.Fatal(err)
	}
	if r.Model("m") != m || r.Model("n") == nil {
		t.Error("a reconfigured model must keep its throttle; a new model must get one")
	}
	next.Models = next.Models[1:]
	_ = r.SetPool(next)
	if r.Model("m") != nil {
		t.Error("a removed model is still served")
	}
}

// TestBC41_LiveLimitUpdates: removing the token limit admits a 5000-token
// request at once; a lowered request rate applies to the live limiter (the
// same object, its state kept); deleting the TenantQuota stops admission
// (the scheduler's policy: a deleted tenant is not served).
func TestBC41_LiveLimitUpdates(t *testing.T) {
	fc := clocktesting.NewFakeClock(t0)
	r := New(fc)
	_ = r.SetPool(testPool())
	pol := TenantPolicy{ID: "a", Limits: limiter.Limits{RequestsPerMinute: i64(60), WeightedPerMinute: i64(1000)}, MaxQueued: 10}
	if err := r.UpsertTenant(pol); err != nil {
		t.Fatal(err)
	}
	tn := r.Tenant("a")
	big := limiter.DefaultCostModel.Cost(5000, 0)
	if _, rej := tn.Limiter.Admit(t0, big); rej == nil {
		t.Fatal("5000 tokens admitted under 1000/min")
	}
	pol.Limits.WeightedPerMinute = nil
	if err := r.UpsertTenant(pol); err != nil {
		t.Fatal(err)
	}
	if r.Tenant("a") != tn {
		t.Fatal("an update replaced the tenant's limiter")
	}
	res, rej := tn.Limiter.Admit(t0, big)
	if rej != nil {
		t.Fatalf("after removing the token limit: %+v", rej)
	}
	res.Complete(t0, limiter.Usage{})
	pol.Limits.RequestsPerMinute = i64(10)
	_ = r.UpsertTenant(pol)
	if got := tn.Limiter.Snapshot(t0).RequestsRemaining; got > 1 {
		t.Errorf("requests remaining after lowering to 10/min = %d, want <= 1 (burst 10/6)", got)
	}
	if got := r.RemoveTenant("a"); got != tn || !tn.Removed() || r.Tenant("a") != nil {
		t.Errorf("RemoveTenant: %v, removed %v", got, tn.Removed())
	}
}

func TestUpsertKeepsQueueAndRefusesDuplicates(t *testing.T) {
	r := New(clocktesting.NewFakeClock(t0))
	_ = r.SetPool(testPool())
	a := TenantPolicy{ID: "a", Name: "tq-a", MaxQueued: 5, KeyHashes: []KeyHash{HashKey("ka")}}
	if err := r.UpsertTenant(a); err != nil {
		t.Fatal(err)
	}
	var err error
	r.WithQueue(func(q *fairqueue.Queue) { err = q.Enqueue(t0, &fairqueue.Job{ID: "j1", Tenant: "a", Cost: 10}) })
	if err != nil {
		t.Fatal(err)
	}
	a.Weight = 3
	a.KeyHashes = []KeyHash{HashKey("ka2")}
	if err := r.UpsertTenant(a); err != nil {
		t.Fatal(err)
	}
	if got := r.Snapshot(t0).Backlog; got != 1 {
		t.Errorf("backlog after an update = %d, want 1 (queued jobs are kept)", got)
	}
	if r.TenantByKey("ka") != nil || r.TenantByKey("ka2") == nil {
		t.Error("key rotation not applied")
	}
	dupID := TenantPolicy{ID: "a", Name: "tq-other", MaxQueued: 1}
	if err := r.UpsertTenant(dupID); !errors.Is(err, ErrDuplicateTenantID) {
		t.Errorf("duplicate id: %v", err)
	}
	dupKey := TenantPolicy{ID: "b", Name: "tq-b", KeyHashes: []KeyHash{HashKey("ka2")}}
	if err := r.UpsertTenant(dupKey); !errors.Is(err, ErrDuplicateKey) {
		t.Errorf("duplicate key: %v", err)
	}
	snap := r.Snapshot(t0)
	if len(snap.Tenants) != 1 || len(snap.Objects) != 3 {
		t.Errorf("snapshot: %d tenants, %d objects; want 1 and 3", len(snap.Tenants), len(snap.Objects))
	}
	var removed []string
	r.OnTenantRemoved(func(t *Tenant) { removed = append(removed, t.ID) })
	if r.RemoveTenant("tq-other") != nil {
		t.Error("removing the refused duplicate removed the served tenant")
	}
	r.RemoveTenant("tq-a")
	if len(removed) != 1 || removed[0] != "a" {
		t.Errorf("removal hooks: %v", removed)
	}
}

func TestBudget(t *testing.T) {
	r := New(clocktesting.NewFakeClock(t0))
	_ = r.UpsertTenant(TenantPolicy{ID: "a", Budget: &BudgetPolicy{WeightedTokens: 1000, Period: BudgetDay}})
	tn := r.Tenant("a")
	now := t0.Add(6 * time.Hour)
	tn.AddUsed(now, 900)
	if ok, _, _ := tn.CheckBudget(now, 100); !ok {
		t.Error("100 of the remaining 100 refused")
	}
	ok, resetIn, st := tn.CheckBudget(now, 101)
	if ok || resetIn != 18*time.Hour || st.Remaining != 100 || !st.ResetTime.Equal(t0.AddDate(0, 0, 1)) {
		t.Errorf("over budget: ok %v, reset in %v, %+v", ok, resetIn, st)
	}
	if ok, _, st := tn.CheckBudget(t0.AddDate(0, 0, 1), 1000); !ok || st.Used != 0 {
		t.Errorf("next day: ok %v %+v, want a fresh budget", ok, st)
	}
}

// TestBudgetReservation (BC-20, BC-23): ReserveBudget charges at once, so a
// second reservation sees the first; Settle replaces the charge by the
// actual use exactly once; a reservation settled after its period ended
// does not touch the new period.
func TestBudgetReservation(t *testing.T) {
	r := New(clocktesting.NewFakeClock(t0))
	_ = r.UpsertTenant(TenantPolicy{ID: "a", Budget: &BudgetPolicy{WeightedTokens: 1000, Period: BudgetDay}})
	tn := r.Tenant("a")
	now := t0.Add(time.Hour)
	r1, ok, _, st := tn.ReserveBudget(now, 600)
	if !ok || st != (BudgetStatus{Used: 0, Reserved: 600, Remaining: 400, ResetTime: t0.AddDate(0, 0, 1)}) {
		t.Fatalf("first reservation: ok %v %+v", ok, st)
	}
	if _, ok, resetIn, _ := tn.ReserveBudget(now, 401); ok || resetIn != 23*time.Hour {
		t.Fatalf("401 beside 600 held: ok %v, reset in %v; want refused, 23h", ok, resetIn)
	}
	r2, ok, _, _ := tn.ReserveBudget(now, 400)
	if !ok {
		t.Fatal("400 beside 600 held refused")
	}
	r1.Settle(now, 250)
	r1.Settle(now, 0) // no-op
	if st, _ := tn.Budget(now); st.Used != 250 || st.Reserved != 400 || st.Remaining != 350 {
		t.Errorf("after settling 250 of 600: %+v, want used 250, reserved 400, remaining 350", st)
	}
	next := t0.AddDate(0, 0, 1).Add(time.Minute)
	r2.Settle(next, 400)
	if st, _ := tn.Budget(next); st.Used != 0 || st.Reserved != 0 || st.Remaining != 1000 {
		t.Errorf("next day after a late settlement: %+v, want a fresh budget", st)
	}
	if got := r.Snapshot(next).Tenants[0].TokensUsed; got != 650 {
		t.Errorf("tokensUsed = %d, want 650", got)
	}
}

// TestBudgetSeedSurvivesRestart: a fresh registry (a restarted scheduler, or
// a standby taking over) starts the period from the spend reported in
// status; a seed of an earlier period is ignored; a replica's own larger
// spend is never lowered by an older report; a later, larger report raises
// a replica that has not served the tenant.
func TestBudgetSeedSurvivesRestart(t *testing.T) {
	now := t0.Add(10 * 24 * time.Hour) // 2026-01-11
	monthEnd := time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)
	pol := func(seed *BudgetSeed) TenantPolicy {
		return TenantPolicy{ID: "a", Budget: &BudgetPolicy{WeightedTokens: 10000, Period: BudgetMonth}, BudgetSeed: seed}
	}
	r := New(clocktesting.NewFakeClock(now))
	if err := r.UpsertTenant(pol(&BudgetSeed{Used: 7000, ResetTime: monthEnd})); err != nil {
		t.Fatal(err)
	}
	tn := r.Tenant("a")
	if st, _ := tn.Budget(now); st.Used != 7000 || st.Remaining != 3000 || !st.ResetTime.Equal(monthEnd) {
		t.Errorf("seeded: %+v, want used 7000, remaining 3000", st)
	}
	if _, ok, _, _ := tn.ReserveBudget(now, 3001); ok {
		t.Error("3001 admitted with 3000 left after the restart")
	}
	tn.AddUsed(now, 500)
	_ = r.UpsertTenant(pol(&BudgetSeed{Used: 7200, ResetTime: monthEnd})) // an older report of our own spend
	if st, _ := tn.Budget(now); st.Used != 7500 {
		t.Errorf("own spend 7500 lowered by an older report of 7200: used %d", st.Used)
	}
	_ = r.UpsertTenant(pol(&BudgetSeed{Used: 9000, ResetTime: monthEnd}))
	if st, _ := tn.Budget(now); st.Used != 9000 {
		t.Errorf("a later report of 9000 not taken: used %d", st.Used)
	}

	stale := New(clocktesting.NewFakeClock(now))
	_ = stale.UpsertTenant(pol(&BudgetSeed{Used: 7000, ResetTime: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}))
	if st, _ := stale.Tenant("a").Budget(now); st.Used != 0 || st.Remaining != 10000 {
		t.Errorf("a seed of December applied to January: %+v", st)
	}
}

// TestForceReserveBudget: DryRun's reservation holds the charge even over
// the budget and says whether Enforce would have refused it.
func TestForceReserveBudget(t *testing.T) {
	r := New(clocktesting.NewFakeClock(t0))
	_ = r.UpsertTenant(TenantPolicy{ID: "a", Budget: &BudgetPolicy{WeightedTokens: 1000, Period: BudgetDay}})
	tn := r.Tenant("a")
	r1, ok := tn.ForceReserveBudget(t0, 800)
	if !ok {
		t.Error("800 of 1000 reported over budget")
	}
	r2, ok := tn.ForceReserveBudget(t0, 800)
	if ok {
		t.Error("800 beside 800 held reported within budget")
	}
	r1.Settle(t0, 700)
	r2.Settle(t0, 600)
	if st, _ := tn.Budget(t0); st.Used != 1300 || st.Reserved != 0 || st.Remaining != 0 {
		t.Errorf("after DryRun spend of 1300: %+v, want used 1300, remaining 0", st)
	}
}

// TestPoolAgingReachesTheQueue: the pool's maxWaitTokens configures the
// fair queue's aging; unset, aging is off.
func TestPoolAgingReachesTheQueue(t *testing.T) {
	r := New(clocktesting.NewFakeClock(t0))
	p := testPool()
	p.MaxWaitTokens = 500000
	if err := r.SetPool(p); err != nil {
		t.Fatal(err)
	}
	r.qmu.Lock()
	got := r.qcfg.MaxWaitTokens
	r.qmu.Unlock()
	if got != 500000 {
		t.Errorf("queue MaxWaitTokens = %d, want 500000", got)
	}
	p.MaxWaitTokens = 0
	_ = r.SetPool(p)
	r.qmu.Lock()
	got = r.qcfg.MaxWaitTokens
	r.qmu.Unlock()
	if got != 0 {
		t.Errorf("queue MaxWaitTokens = %d after unsetting, want 0", got)
	}
}

// TestPoolQueueingStrategyReachesTheQueue: BestEffortFIFO (the default, also
// before any pool is set) gives the fair queue a lookahead of LookaheadJobs
// with MaxBypass; StrictFIFO none; an unknown strategy is refused naming the
// field, and the committed policy stays.
func TestPoolQueueingStrategyReachesTheQueue(t *testing.T) {
	r := New(clocktesting.NewFakeClock(t0))
	cfg := func() (int, int) {
		r.qmu.Lock()
		defer r.qmu.Unlock()
		return r.qcfg.Lookahead, r.qcfg.MaxBypass
	}
	if la, mb := cfg(); la != LookaheadJobs || mb != MaxBypass {
		t.Errorf("before a pool: lookahead %d, max bypass %d; want %d, %d", la, mb, LookaheadJobs, MaxBypass)
	}
	p := testPool()
	if err := r.SetPool(p); err != nil {
		t.Fatal(err)
	}
	if got := r.Pool().QueueingStrategy; got != QueueingBestEffortFIFO {
		t.Errorf("default strategy %q, want %q", got, QueueingBestEffortFIFO)
	}
	if la, mb := cfg(); la != LookaheadJobs || mb != MaxBypass {
		t.Errorf("BestEffortFIFO: lookahead %d, max bypass %d; want %d, %d", la, mb, LookaheadJobs, MaxBypass)
	}
	p.QueueingStrategy = QueueingStrictFIFO
	if err := r.SetPool(p); err != nil {
		t.Fatal(err)
	}
	if la, _ := cfg(); la != 0 {
		t.Errorf("StrictFIFO: lookahead %d, want 0", la)
	}
	p.QueueingStrategy = "LIFO"
	err := r.SetPool(p)
	if err == nil || !strings.Contains(err.Error(), "scheduler.queueingStrategy") {
		t.Fatalf("unknown strategy: %v, want an error naming scheduler.queueingStrategy", err)
	}
	if got := r.Pool().QueueingStrategy; got != QueueingStrictFIFO {
		t.Errorf("after a refused policy the strategy is %q, want %q", got, QueueingStrictFIFO)
	}
}

// TestPoolQueueSettingsApplyToANonEmptyQueue: a new quantum and bound reach
// a queue that holds jobs, and the jobs stay.
func TestPoolQueueSettingsApplyToANonEmptyQueue(t *testing.T) {
	r := New(clocktesting.NewFakeClock(t0))
	p := testPool()
	if err := r.SetPool(p); err != nil {
		t.Fatal(err)
	}
	_ = r.UpsertTenant(TenantPolicy{ID: "a", MaxQueued: 10})
	r.WithQueue(func(q *fairqueue.Queue) {
		if err := q.Enqueue(t0, &fairqueue.Job{ID: "j1", Tenant: "a", Cost: 10}); err != nil {
			t.Fatal(err)
		}
	})
	p.Quantum, p.MaxQueuedJobs = 777, 5
	if err := r.SetPool(p); err != nil {
		t.Fatal(err)
	}
	r.qmu.Lock()
	cfg, n := r.qcfg, r.queue.Total()
	r.qmu.Unlock()
	if cfg.Quantum != 777 || cfg.MaxTotal != 5 || n != 1 {
		t.Errorf("quantum %d, bound %d, queued %d; want 777, 5, 1", cfg.Quantum, cfg.MaxTotal, n)
	}
}

// TestDrainInterval: the interval between a tenant's dispatches is a moving
// average (newest weighing 0.25), stretched by a stall since the last one;
// unknown before two dispatches.
func TestDrainInterval(t *testing.T) {
	r := New(clocktesting.NewFakeClock(t0))
	_ = r.UpsertTenant(TenantPolicy{ID: "a"})
	tn := r.Tenant("a")
	if _, ok := tn.DrainInterval(t0); ok {
		t.Error("an interval before any dispatch")
	}
	tn.ObserveDispatch(t0)
	if _, ok := tn.DrainInterval(t0); ok {
		t.Error("an interval after one dispatch")
	}
	tn.ObserveDispatch(t0.Add(4 * time.Second))  // 4 s
	tn.ObserveDispatch(t0.Add(12 * time.Second)) // 0.75*4 + 0.25*8 = 5 s
	if d, ok := tn.DrainInterval(t0.Add(12 * time.Second)); !ok || d != 5*time.Second {
		t.Errorf("DrainInterval = %v, %v; want 5s", d, ok)
	}
	if d, _ := tn.DrainInterval(t0.Add(20 * time.Second)); d != 8*time.Second {
		t.Errorf("after an 8 s stall DrainInterval = %v, want 8s", d)
	}
}

// TestPoolBaseURL checks the base URL rules the API's CEL rules also apply
// (api/v1alpha1 UpstreamSpec.BaseURL): the gateway appends /v1/... to it,
// so a query, a fragment, credentials or a /v1 path are refused with a
// message naming baseURL, and a password never appears in it.
func TestPoolBaseURL(t *testing.T) {
	for url, want := range map[string]string{
		"https://gw.example.com/openai?api-version=1": `baseURL: "https://gw.example.com/openai?api-version=1" has a query or fragment, which would end up before the /v1/... path appended to it`,
		"https://api.example.com?":                    `baseURL: "https://api.example.com?" has a query or fragment, which would end up before the /v1/... path appended to it`,
		"https://api.example.com#x":                   `baseURL: "https://api.example.com#x" has a query or fragment, which would end up before the /v1/... path appended to it`,
		"https://user:sk-secret@api.example.com":      `baseURL: "https://user:xxxxx@api.example.com" carries credentials (user:password@); the provider's key belongs in the credentials Secret`,
		"https://user:sk-secret@api.example.com/v1?x": `baseURL: "https://user:xxxxx@api.example.com/v1?x" carries credentials (user:password@); the provider's key belongs in the credentials Secret`,
		"https://api.openai.com/v1":                   `baseURL: "https://api.openai.com/v1" ends in /v1, which the gateway appends itself`,
		"https://gw.example.com/openai/v1/":           `baseURL: "https://gw.example.com/openai/v1/" ends in /v1, which the gateway appends itself`,
		"https://api.openai.com/v1//":                 `baseURL: "https://api.openai.com/v1//" ends in /v1, which the gateway appends itself`,
		"https://gw.example.com/v1///":                `baseURL: "https://gw.example.com/v1///" ends in /v1, which the gateway appends itself`,
		"https://gw.example.com/xv1//":                "",
		"ftp://api.example.com":                       `baseURL: "ftp://api.example.com" is not an http(s) URL`,
		"https://api.example.com":                     "",
		"HTTPS://gw.example.com/openai/v1beta":        "",
		"http://[::1]:8443/":                          "",
	} {
		p := testPool()
		p.BaseURL = url
		err := p.Validate()
		if got := fmt.Sprint(err); (want == "" && err != nil) || (want != "" && got != want) {
			t.Errorf("Validate(%q) = %v, want %q", url, err, want)
		}
	}
}

// TestTenantEnqueueUsesItsQueueHandle: a tenant's jobs go into the fair
// queue through the handle UpsertTenant took (under the tenant's bound and
// weight, with j.Tenant set), an update keeps that queue state, a tenant not
// yet configured in the queue falls back to its name, and a handle kept
// across the tenant's removal and return queues into the returned tenant's
// state.
func TestTenantEnqueueUsesItsQueueHandle(t *testing.T) {
	r := New(clocktesting.NewFakeClock(t0))
	_ = r.SetPool(testPool())
	a := TenantPolicy{ID: "a", Name: "tq-a", Weight: 2, MaxQueued: 2}
	if err := r.UpsertTenant(a); err != nil {
		t.Fatal(err)
	}
	tn := r.Tenant("a")
	if !tn.qref.Valid() || tn.qref.Name() != "a" {
		t.Fatalf("UpsertTenant took no queue handle: %+v", tn.qref)
	}
	enqueue := func(tn *Tenant, id string) error {
		var err error
		r.WithQueue(func(q *fairqueue.Queue) { err = tn.Enqueue(q, t0, &fairqueue.Job{ID: id, Cost: 10}) })
		return err
	}
	stats := func() []fairqueue.TenantStats {
		var out []fairqueue.TenantStats
		r.WithQueue(func(q *fairqueue.Queue) { out = q.Tenants() })
		return out
	}
	if err := enqueue(tn, "j1"); err != nil {
		t.Fatal(err)
	}
	a.MaxQueued = 3
	if err := r.UpsertTenant(a); err != nil {
		t.Fatal(err)
	}
	if err := enqueue(tn, "j2"); err != nil {
		t.Fatal(err)
	}
	if err := enqueue(tn, "j3"); err != nil {
		t.Fatal(err)
	}
	if err := enqueue(tn, "j4"); !errors.Is(err, fairqueue.ErrTenantFull) {
		t.Errorf("fourth job under maxQueued 3: %v, want ErrTenantFull", err)
	}
	if got := stats(); len(got) != 1 || got[0].Tenant != "a" || got[0].Queued != 3 || got[0].Weight != 2 {
		t.Fatalf("queue after three jobs: %+v", got)
	}
	// Between a tenant's admission and its queue's configuration: by name.
	early := &Tenant{ID: "b"}
	if err := enqueue(early, "k1"); err != nil {
		t.Fatal(err)
	}
	if got := stats(); len(got) != 2 || got[1].Tenant != "b" || got[1].Queued != 1 {
		t.Fatalf("queue after the fallback by name: %+v", got)
	}
	// Removed (its jobs drained: the queue forgets it), then back.
	r.RemoveTenant("tq-a")
	r.WithQueue(func(q *fairqueue.Queue) {
		for range 3 {
			q.DequeueWith(t0, func(tenant string, _ *fairqueue.Job) fairqueue.Eligibility {
				if tenant == "a" {
					return fairqueue.Eligible
				}
				return fairqueue.Ineligible
			})
		}
	})
	if got := stats(); len(got) != 1 || got[0].Tenant != "b" {
		t.Fatalf("queue after a's removal and drain: %+v", got)
	}
	a.Weight = 5
	if err := r.UpsertTenant(a); err != nil {
		t.Fatal(err)
	}
	if err := enqueue(tn, "j5"); err != nil { // the handle from before the removal
		t.Fatal(err)
	}
	if got := stats(); len(got) != 2 || got[0].Tenant != "a" || got[0].Queued != 1 || got[0].Weight != 5 {
		t.Fatalf("queue after a's return: %+v", got)
	}
}

// TestPoolStreamUsage: upstream.streamUsage defaults to IncludeUsage,
// CountDeltas is kept, and an unknown mode is refused naming the field
// while the committed policy stays.
func TestPoolStreamUsage(t *testing.T) {
	r := New(clocktesting.NewFakeClock(t0))
	p := testPool()
	if err := r.SetPool(p); err != nil {
		t.Fatal(err)
	}
	if got := r.Pool().StreamUsage; got != StreamUsageIncludeUsage {
		t.Errorf("default streamUsage %q, want %q", got, StreamUsageIncludeUsage)
	}
	p.StreamUsage = StreamUsageCountDeltas
	if err := r.SetPool(p); err != nil {
		t.Fatal(err)
	}
	p.StreamUsage = "Guess"
	err := r.SetPool(p)
	if err == nil || !strings.Contains(err.Error(), "upstream.streamUsage") {
		t.Fatalf("unknown mode: %v, want an error naming upstream.streamUsage", err)
	}
	if got := r.Pool().StreamUsage; got != StreamUsageCountDeltas {
		t.Errorf("after a refused policy streamUsage is %q, want %q", got, StreamUsageCountDeltas)
	}
}
