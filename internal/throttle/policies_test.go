package throttle

import (
	"testing"
	"time"
)

// Several IETF quota policies for one dimension: a short window that binds
// now and a long one that outlasts it. The short one governs until its
// reset; after it, the long one's remaining still does: the throttle must
// not let the short window's whole limit start into a long window that has
// 5 left (95 calls refused by the provider).
func TestIETFPolicyOutlastingTheGoverningOneStillBinds(t *testing.T) {
	h := hdr(`RateLimit-Policy: "burst";q=100;w=1, "daily";q=1000;w=86400`,
		`RateLimit: "burst";r=0;t=1, "daily";r=5;t=80000`)
	q := ParseHeaders(h, NOW)
	if q.Requests.Remaining != 0 || q.Requests.Reset != time.Second || q.Requests.Limit != 100 {
		t.Fatalf("Requests = %+v, want the burst policy (remaining 0, reset 1s, limit 100)", q.Requests)
	}
	if q.Requests.Beyond != 5 {
		t.Errorf("Requests.Beyond = %d, want 5 (the daily remaining, past the burst reset)", q.Requests.Beyond)
	}
	th := New(Config{JitterWindow: -1, Rand: fixedRand(0)}, NOW)
	th.Observe(NOW, Permit{}, q)
	mustRefuse(t, th, at(500*time.Millisecond), 1, Interactive)
	for i := range 5 {
		if _, ok, wait := th.TryStart(at(time.Second), 1, Interactive); !ok {
			t.Fatalf("start %d of the 5 the daily policy has left refused, wait %v", i+1, wait)
		}
	}
	mustRefuse(t, th, at(time.Second), 1, Interactive)

	// The order of the members does not matter; a policy whose window ends
	// first says nothing past its reset.
	q = ParseHeaders(hdr(`RateLimit-Policy: "burst";q=100;w=1, "daily";q=1000;w=86400`,
		`RateLimit: "daily";r=5;t=80000, "burst";r=0;t=1`), NOW)
	if q.Requests.Beyond != 5 || q.Requests.Remaining != 0 {
		t.Errorf("reversed members: Requests = %+v, want remaining 0, Beyond 5", q.Requests)
	}
	q = ParseHeaders(hdr(`RateLimit-Policy: "burst";q=100;w=1, "daily";q=1000;w=86400`,
		`RateLimit: "burst";r=50;t=1, "daily";r=5;t=80000`), NOW)
	if q.Requests.Remaining != 5 || q.Requests.Beyond != 0 {
		t.Errorf("daily governs: Requests = %+v, want remaining 5, Beyond 0", q.Requests)
	}
}
