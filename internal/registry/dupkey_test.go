package registry

import (
	"errors"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// TestDuplicateKeyOwnerDoesNotDependOnLoadOrder: two TenantQuotas of the
// pool hold the same API key. Whichever order they are loaded in (a
// TenantQuota created after the other, a scheduler restart or a standby
// taking over, which load them in the cache's order), the key must
// authenticate as the TenantQuota created first, and the other must report
// ErrDuplicateKey; otherwise a restart can move the key's callers (their
// limits, budget and job listing) to the other tenant.
func TestDuplicateKeyOwnerDoesNotDependOnLoadOrder(t *testing.T) {
	older := TenantPolicy{ID: "a", Name: "tq-a", MaxQueued: 5, Created: t0, KeyHashes: []KeyHash{HashKey("shared")}}
	newer := TenantPolicy{ID: "b", Name: "tq-b", MaxQueued: 5, Created: t0.Add(time.Hour), KeyHashes: []KeyHash{HashKey("shared")}}
	for _, order := range [][]TenantPolicy{{older, newer}, {newer, older}} {
		r := New(clocktesting.NewFakeClock(t0))
		_ = r.SetPool(testPool())
		for _, p := range order {
			_ = r.UpsertTenant(p)
		}
		first := order[0].Name
		if got := r.TenantByKey("shared"); got == nil || got.ID != "a" {
			t.Errorf("loaded %s first: the key authenticates as %v; want tenant a (tq-a, created first)", first, got)
		}
		for _, o := range r.Snapshot(t0).Objects {
			switch o.Name {
			case "tq-a":
				if o.Err != nil {
					t.Errorf("loaded %s first: tq-a error %v; want none", first, o.Err)
				}
			case "tq-b":
				if !errors.Is(o.Err, ErrDuplicateKey) {
					t.Errorf("loaded %s first: tq-b error %v; want ErrDuplicateKey", first, o.Err)
				}
			}
		}
		// tq-b applied again (its Secret is read every minute) still
		// cannot take the key; once tq-a is gone it gets it.
		if err := r.UpsertTenant(newer); !errors.Is(err, ErrDuplicateKey) {
			t.Errorf("loaded %s first: tq-b applied again: %v; want ErrDuplicateKey", first, err)
		}
		r.RemoveTenant("tq-a")
		if err := r.UpsertTenant(newer); err != nil {
			t.Errorf("loaded %s first: tq-b after tq-a is removed: %v", first, err)
		}
		if got := r.TenantByKey("shared"); got == nil || got.ID != "b" {
			t.Errorf("loaded %s first: after tq-a is removed the key authenticates as %v; want b", first, got)
		}
	}
}

// TestDuplicateTenantIDHolderDoesNotDependOnLoadOrder: two TenantQuotas
// with the same tenant id. The operator accepts the one created first
// (then by name) and refuses the other with DuplicateTenantID; the
// scheduler must serve that same one whatever order it loads them in, or
// after a restart it serves the refused plan and the accepted tenant's
// key gets 401.
func TestDuplicateTenantIDHolderDoesNotDependOnLoadOrder(t *testing.T) {
	older := TenantPolicy{ID: "x", Name: "tq-a", MaxQueued: 5, Created: t0, KeyHashes: []KeyHash{HashKey("key-a")}}
	newer := TenantPolicy{ID: "x", Name: "tq-b", MaxQueued: 5, Created: t0.Add(time.Hour), KeyHashes: []KeyHash{HashKey("key-b")}}
	for _, order := range [][]TenantPolicy{{older, newer}, {newer, older}} {
		r := New(clocktesting.NewFakeClock(t0))
		_ = r.SetPool(testPool())
		for _, p := range order {
			_ = r.UpsertTenant(p)
		}
		first := order[0].Name
		if got := r.Tenant("x"); got == nil || got.Policy().Name != "tq-a" {
			t.Errorf("loaded %s first: tenant x served for %v; want tq-a (created first)", first, got)
		}
		if r.TenantByKey("key-a") == nil || r.TenantByKey("key-b") != nil {
			t.Errorf("loaded %s first: key-a %v, key-b %v; want tq-a's key only", first, r.TenantByKey("key-a"), r.TenantByKey("key-b"))
		}
		for _, o := range r.Snapshot(t0).Objects {
			if o.Name == "tq-b" && !errors.Is(o.Err, ErrDuplicateTenantID) {
				t.Errorf("loaded %s first: tq-b error %v; want ErrDuplicateTenantID", first, o.Err)
			}
			if o.Name == "tq-a" && o.Err != nil {
				t.Errorf("loaded %s first: tq-a error %v; want none", first, o.Err)
			}
		}
		// Removing the refused one leaves the served one alone.
		if r.RemoveTenant("tq-b") != nil || r.Tenant("x") == nil {
			t.Errorf("loaded %s first: removing tq-b removed tenant x", first)
		}
	}
}
