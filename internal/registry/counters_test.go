package registry

import (
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// countTenant counts on tn: completed jobs, expired jobs, rejections,
// weighted tokens used and DryRun rejections, each n times (tokens: 100
// weighted tokens each time).
func countTenant(tn *Tenant, n int) {
	for range n {
		tn.AddCompleted()
		tn.AddExpired()
		tn.AddRejection()
		tn.AddUsed(t0, 100)
		tn.AddDryRunRejection()
	}
}

func counterRegistry(t *testing.T, pols ...TenantPolicy) *Registry {
	t.Helper()
	r := New(clocktesting.NewFakeClock(t0))
	if err := r.SetPool(testPool()); err != nil {
		t.Fatal(err)
	}
	for _, p := range pols {
		if err := r.UpsertTenant(p); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// TestSeedCountersCarriesOnFromStatus: a tenant that counted 2 of each
// before the status writer first read its TenantQuota's status gets the
// status's figures added once, keeping its own counts (never reported
// before); a second seed (the status read again) adds nothing, and later
// counts go on from the sum.
func TestSeedCountersCarriesOnFromStatus(t *testing.T) {
	r := counterRegistry(t, TenantPolicy{ID: "a", Name: "tq-a", UID: "u1", MaxQueued: 5})
	tn := r.Tenant("a")
	countTenant(tn, 2)
	if tn.CountersSeeded() {
		t.Fatal("seeded before SeedCounters")
	}
	base := Counters{Completed: 10, Expired: 20, Rejections: 30, TokensUsed: 4000, DryRunRejections: 50}
	added, ok := tn.SeedCounters("u1", base)
	if !ok || added != base {
		t.Fatalf("SeedCounters = %+v, %v; want %+v, true", added, ok, base)
	}
	want := Counters{Completed: 12, Expired: 22, Rejections: 32, TokensUsed: 4200, DryRunRejections: 52}
	if got := tn.Counters(); got != want || !tn.CountersSeeded() {
		t.Fatalf("after the seed: %+v (seeded %v), want %+v", got, tn.CountersSeeded(), want)
	}
	// The status read again (a check, or after the pool came back) holds
	// what this scheduler wrote: adding it again would count it twice.
	if added, ok := tn.SeedCounters("u1", want); !ok || added != (Counters{}) {
		t.Fatalf("second SeedCounters = %+v, %v; want nothing added, true", added, ok)
	}
	countTenant(tn, 1)
	want = Counters{Completed: 13, Expired: 23, Rejections: 33, TokensUsed: 4300, DryRunRejections: 53}
	if got := tn.Counters(); got != want {
		t.Fatalf("after one more of each: %+v, want %+v", got, want)
	}
	s := r.Snapshot(t0).Tenants[0]
	if !s.CountersSeeded || s.Completed != 13 || s.Expired != 23 || s.Rejections != 33 || s.TokensUsed != 4300 || s.DryRunRejections != 53 {
		t.Errorf("snapshot = %+v; want seeded with 13, 23, 33, 4300, 53", s)
	}
}

// TestSeedCountersNegativeBase: negative figures (a hand edit of the
// status) are read as 0.
func TestSeedCountersNegativeBase(t *testing.T) {
	r := counterRegistry(t, TenantPolicy{ID: "a", Name: "tq-a", UID: "u1", MaxQueued: 5})
	tn := r.Tenant("a")
	countTenant(tn, 1)
	added, ok := tn.SeedCounters("u1", Counters{Completed: -5, Expired: 7, Rejections: -1, TokensUsed: -100, DryRunRejections: 3})
	if want := (Counters{Expired: 7, DryRunRejections: 3}); !ok || added != want {
		t.Fatalf("SeedCounters = %+v, %v; want %+v, true", added, ok, want)
	}
	if got, want := tn.Counters(), (Counters{Completed: 1, Expired: 8, Rejections: 1, TokensUsed: 100, DryRunRejections: 4}); got != want {
		t.Errorf("counters %+v, want %+v", got, want)
	}
}

// TestRecreatedTenantQuotaCountsFromZero: a TenantQuota deleted and created
// again under its name, applied as one update (the informer coalesced the
// delete and the create), is another object: the tenant's counters start
// from 0 and unseeded; the old object's status cannot seed them, the new
// one's can. An update of the same object keeps them.
func TestRecreatedTenantQuotaCountsFromZero(t *testing.T) {
	r := counterRegistry(t, TenantPolicy{ID: "a", Name: "tq-a", UID: "u1", Generation: 1, MaxQueued: 5})
	tn := r.Tenant("a")
	countTenant(tn, 3)
	if _, ok := tn.SeedCounters("u1", Counters{Completed: 100}); !ok {
		t.Fatal("seed refused")
	}
	// A spec change of the same object: nothing changes.
	if err := r.UpsertTenant(TenantPolicy{ID: "a", Name: "tq-a", UID: "u1", Generation: 2, MaxQueued: 9}); err != nil {
		t.Fatal(err)
	}
	if got, want := tn.Counters(), (Counters{Completed: 103, Expired: 3, Rejections: 3, TokensUsed: 300, DryRunRejections: 3}); got != want || !tn.CountersSeeded() {
		t.Fatalf("after an update: %+v (seeded %v), want %+v seeded", got, tn.CountersSeeded(), want)
	}

	if err := r.UpsertTenant(TenantPolicy{ID: "a", Name: "tq-a", UID: "u2", Generation: 1, MaxQueued: 5}); err != nil {
		t.Fatal(err)
	}
	if r.Tenant("a") != tn {
		t.Fatal("the tenant was replaced; want the same one, its counters reset")
	}
	if got := tn.Counters(); got != (Counters{}) || tn.CountersSeeded() {
		t.Fatalf("re-created: %+v (seeded %v), want zero and unseeded", got, tn.CountersSeeded())
	}
	tn.AddCompleted()
	if added, ok := tn.SeedCounters("u1", Counters{Completed: 103}); ok || added != (Counters{}) {
		t.Fatalf("seed from the old object's status = %+v, %v; want refused", added, ok)
	}
	if added, ok := tn.SeedCounters("u2", Counters{}); !ok || added != (Counters{}) {
		t.Fatalf("seed from the new object's (empty) status = %+v, %v; want nothing added, true", added, ok)
	}
	if got, want := tn.Counters(), (Counters{Completed: 1}); got != want {
		t.Errorf("re-created after one job: %+v, want %+v", got, want)
	}
}

// TestTenantTakenOverCountsFromZero: a TenantQuota created before another
// one with the same tenant id takes the tenant over (see
// TestDuplicateTenantIDHolderDoesNotDependOnLoadOrder): the counts made for the
// other object are not its own.
func TestTenantTakenOverCountsFromZero(t *testing.T) {
	newer := TenantPolicy{ID: "x", Name: "tq-b", UID: "ub", MaxQueued: 5, Created: t0.Add(time.Hour)}
	older := TenantPolicy{ID: "x", Name: "tq-a", UID: "ua", MaxQueued: 5, Created: t0}
	r := counterRegistry(t, newer)
	tn := r.Tenant("x")
	countTenant(tn, 2)
	if _, ok := tn.SeedCounters("ub", Counters{Rejections: 40}); !ok {
		t.Fatal("seed refused")
	}
	if err := r.UpsertTenant(older); err != nil {
		t.Fatal(err)
	}
	if got := r.Tenant("x").Counters(); got != (Counters{}) || r.Tenant("x").CountersSeeded() {
		t.Fatalf("taken over: %+v (seeded %v), want zero and unseeded", got, r.Tenant("x").CountersSeeded())
	}
	if added, ok := r.Tenant("x").SeedCounters("ua", Counters{Rejections: 7}); !ok || added.Rejections != 7 {
		t.Fatalf("seed from tq-a's status = %+v, %v; want 7 rejections added", added, ok)
	}
}

// TestSeedUpstreamThrottled: the pool's 429 count adds the status's figure
// once per ProviderPool UID, keeping the 429s counted before; a pool
// created again under its name (another UID) restarts from its own
// status's figure.
func TestSeedUpstreamThrottled(t *testing.T) {
	r := counterRegistry(t)
	for range 3 {
		r.AddUpstreamThrottled()
	}
	if got := r.SeedUpstreamThrottled("p1", 100); got != 100 {
		t.Fatalf("first seed added %d, want 100", got)
	}
	if got := r.Snapshot(t0).UpstreamThrottled; got != 103 {
		t.Fatalf("after the seed: %d, want 103", got)
	}
	if got := r.SeedUpstreamThrottled("p1", 103); got != 0 {
		t.Fatalf("seed of the same pool again added %d, want 0", got)
	}
	r.AddUpstreamThrottled()
	if got := r.Snapshot(t0).UpstreamThrottled; got != 104 {
		t.Fatalf("after one more 429: %d, want 104", got)
	}
	if got := r.SeedUpstreamThrottled("p2", 5); got != -99 {
		t.Fatalf("seed of a re-created pool added %d, want -99 (from 104 to 5)", got)
	}
	if got := r.Snapshot(t0).UpstreamThrottled; got != 5 {
		t.Fatalf("re-created pool: %d, want 5", got)
	}
	if got := New(clocktesting.NewFakeClock(t0)).SeedUpstreamThrottled("p1", -4); got != 0 {
		t.Errorf("a negative figure added %d, want 0", got)
	}
}
