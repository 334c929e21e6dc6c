package throttle

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// dimW is dim with Window set.
func dimW(limit, remaining int64, reset, window time.Duration, dialect string) Dimension {
	return withWindow(dim(limit, remaining, reset, dialect), window)
}

// A stated window is read with the figure, and a remaining without a reset
// ends at the latest with its window (draft-10 sections 3.1.3 and 4.1.2):
// a daily policy with 0 left and no t was read as a 60 s window, and the
// throttle sent into the exhausted day once a minute.
func TestIETFWindowStatedByThePolicy(t *testing.T) {
	day := 24 * time.Hour
	tests := []struct {
		name  string
		lines []string
		want  Quota
	}{
		{"no t: the reset is the policy's w",
			[]string{`RateLimit-Policy: "burst";q=100;w=60,"daily";q=1000;w=86400`, `RateLimit: "daily";r=0`},
			Quota{Requests: dimW(1000, 0, day, day, DialectIETF), Dialect: DialectIETF}},
		{"a malformed t is ignored, the reset is the policy's w",
			[]string{`RateLimit-Policy: "daily";q=1000;w=86400`, `RateLimit: "daily";r=0;t=-5`},
			Quota{Requests: dimW(1000, 0, day, day, DialectIETF), Dialect: DialectIETF, Malformed: 1}},
		{"t wins over w",
			[]string{`RateLimit-Policy: "p";q=100;w=60`, `RateLimit: "p";r=0;t=5`},
			Quota{Requests: dimW(100, 0, 5*time.Second, time.Minute, DialectIETF), Dialect: DialectIETF}},
		{"a token policy's window",
			[]string{`RateLimit-Policy: "tpd";q=5000000;qu="tokens";w=86400`, `RateLimit: "tpd";r=42`},
			Quota{Tokens: dimW(5000000, 42, day, day, DialectIETF), Dialect: DialectIETF}},
		{"a window above MaxReset is read as MaxReset",
			[]string{`RateLimit-Policy: "monthly";q=100000;w=2592000`, `RateLimit: "monthly";r=0`},
			Quota{Requests: dimW(100000, 0, MaxReset, MaxReset, DialectIETF), Dialect: DialectIETF}},
		{"a malformed w is ignored and counted, the quota holds",
			[]string{`RateLimit-Policy: "p";q=100;w=0, "d";q=50;w=1.5`, `RateLimit: "p";r=3`},
			Quota{Requests: dim(100, 3, -1, DialectIETF), Dialect: DialectIETF, Malformed: 2}},
		{"draft-03: the RateLimit-Policy item of the limit",
			[]string{"RateLimit-Remaining: 0", "RateLimit-Policy: 10;w=1, 100;w=60"},
			Quota{Requests: dimW(10, 0, time.Second, time.Second, DialectIETF), Dialect: DialectIETF}},
		{"draft-03: the policy item whose quota is RateLimit-Limit's",
			[]string{"RateLimit-Limit: 100", "RateLimit-Remaining: 0", "RateLimit-Policy: 10;w=1, 100;w=3600"},
			Quota{Requests: dimW(100, 0, time.Hour, time.Hour, DialectIETF), Dialect: DialectIETF}},
		{"draft-03: a policy list in RateLimit-Limit",
			[]string{"RateLimit-Limit: 100, 100;w=3600", "RateLimit-Remaining: 0"},
			Quota{Requests: dimW(100, 0, time.Hour, time.Hour, DialectIETF), Dialect: DialectIETF}},
		{"classic: Envoy's policy list in X-RateLimit-Limit",
			[]string{`X-RateLimit-Limit: 10, 10;w=1;name="per-ip", 1000;w=3600`, "X-RateLimit-Remaining: 0"},
			Quota{Requests: dimW(10, 0, time.Second, time.Second, DialectClassic), Dialect: DialectClassic}},
		{"classic: the list member of the leading figure, not the first",
			[]string{"X-RateLimit-Limit: 1000, 10;w=1, 1000;w=3600", "X-RateLimit-Remaining: 7", "X-RateLimit-Reset: 30"},
			Quota{Requests: dimW(1000, 7, 30*time.Second, time.Hour, DialectClassic), Dialect: DialectClassic}},
		{"classic without a stated window keeps an unknown reset",
			[]string{"X-RateLimit-Limit: 10", "X-RateLimit-Remaining: 0"},
			Quota{Requests: dim(10, 0, -1, DialectClassic), Dialect: DialectClassic}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.want
			if want.Tokens == (Dimension{}) {
				want.Tokens = none
			}
			if want.Requests == (Dimension{}) {
				want.Requests = none
			}
			if diff := cmp.Diff(inOutUnknown(want), ParseHeaders(hdr(tc.lines...), NOW)); diff != "" {
				t.Errorf("ParseHeaders (-want +got):\n%s", diff)
			}
		})
	}
}

// A RateLimit item naming a policy that is malformed (here without its
// required q) is ignored: it was read as a request figure, and this token
// policy's r=0 stopped every call for its t.
func TestIETFItemOfMalformedPolicyIgnored(t *testing.T) {
	q := ParseHeaders(hdr(`RateLimit-Policy: "t";qu="tokens";w=60`, `RateLimit: "t";r=0;t=30`), NOW)
	want := Quota{Tokens: none, Requests: none, Input: none, Output: none, Malformed: 1}
	if diff := cmp.Diff(want, q); diff != "" {
		t.Fatalf("ParseHeaders (-want +got):\n%s", diff)
	}
}

// Limit-only policies of one dimension: the one with the lower rate binds
// in the long run (a daily quota of 1000, not a per-second one of 100);
// for equal rates the smaller limit.
func TestIETFLimitOnlyPoliciesCompareByRate(t *testing.T) {
	q := ParseHeaders(hdr(`RateLimit-Policy: "burst";q=100;w=1, "daily";q=1000;w=86400`), NOW)
	if want := dimW(1000, -1, -1, 24*time.Hour, DialectIETF); q.Requests != want {
		t.Errorf("Requests = %+v, want %+v", q.Requests, want)
	}
	q = ParseHeaders(hdr(`RateLimit-Policy: "a";q=60;w=60, "b";q=1;w=1`), NOW)
	if want := dimW(1, -1, -1, time.Second, DialectIETF); q.Requests != want {
		t.Errorf("equal rates: Requests = %+v, want %+v", q.Requests, want)
	}
	// A limit without a stated window is per minute: 100/min is slower
	// than 10/s.
	q = ParseHeaders(hdr("X-RateLimit-Limit: 100", `RateLimit-Policy: "s";q=10;w=1`), NOW)
	if want := dim(100, -1, -1, DialectClassic); q.Requests != want {
		t.Errorf("unstated window: Requests = %+v, want %+v", q.Requests, want)
	}
}

// The throttle waits for a daily policy's window when its remaining is 0
// without a reset, after a 2xx as after a 429; it paused for 60 s (or the
// 1 s default backoff after a 429) and sent into the exhausted day.
func TestThrottleExhaustedDailyPolicyWaitsForItsWindow(t *testing.T) {
	q := ParseHeaders(hdr(`RateLimit-Policy: "daily";q=1000;w=86400`, `RateLimit: "daily";r=0`), NOW)
	th := New(Config{JitterWindow: -1}, NOW)
	th.Observe(NOW, Permit{}, q)
	if wait := mustRefuse(t, th, at(61*time.Second), 1, Interactive); wait != 24*time.Hour-61*time.Second {
		t.Errorf("wait at 61 s = %v, want %v", wait, 24*time.Hour-61*time.Second)
	}
	mustStart(t, th, at(24*time.Hour), 1, Interactive)

	th = New(Config{JitterWindow: -1}, NOW)
	th.OnTooManyRequests(NOW, Permit{}, q)
	if got, want := th.PausedUntil(), at(24*time.Hour); !got.Equal(want) {
		t.Errorf("PausedUntil after a 429 = %v, want %v", got.Sub(NOW), want.Sub(NOW))
	}
}

// A policy's quota with no remaining figure is counted over the policy's
// window, not per minute: 3 a day stay 3 a day, and 2 a second are 2 a
// second (they were 3 a minute and 2 a minute).
func TestThrottlePolicyLimitCountedOverItsWindow(t *testing.T) {
	th := New(Config{JitterWindow: -1}, NOW)
	th.Observe(NOW, Permit{}, ParseHeaders(hdr(`RateLimit-Policy: "daily";q=3;w=86400`), NOW))
	for range 3 {
		mustStart(t, th, NOW, 1, Interactive)
	}
	if wait := mustRefuse(t, th, NOW, 1, Interactive); wait != 24*time.Hour {
		t.Errorf("wait = %v, want 24h", wait)
	}
	if wait := mustRefuse(t, th, at(61*time.Second), 1, Interactive); wait != 24*time.Hour-61*time.Second {
		t.Errorf("wait at 61 s = %v, want %v", wait, 24*time.Hour-61*time.Second)
	}
	mustStart(t, th, at(24*time.Hour), 1, Interactive)

	th = New(Config{JitterWindow: -1}, NOW)
	th.Observe(NOW, Permit{}, ParseHeaders(hdr(`RateLimit-Policy: "burst";q=2;w=1`), NOW))
	mustStart(t, th, NOW, 1, Interactive)
	mustStart(t, th, NOW, 1, Interactive)
	if wait := mustRefuse(t, th, NOW, 1, Interactive); wait != time.Second {
		t.Errorf("wait = %v, want 1s", wait)
	}
	mustStart(t, th, at(time.Second), 1, Interactive)
	mustStart(t, th, at(time.Second), 1, Interactive)
	mustRefuse(t, th, at(time.Second), 1, Interactive)
}

// A daily policy without t outlasts a per-second one that binds now: its
// remaining caps the dimension past the per-second reset (Beyond). Its
// reset was unknown, so it never counted as the later one, and the
// per-second window's whole limit started into a day with 5 left.
func TestIETFPolicyWithoutResetStillOutlasts(t *testing.T) {
	q := ParseHeaders(hdr(`RateLimit-Policy: "burst";q=100;w=1, "daily";q=1000;w=86400`,
		`RateLimit: "burst";r=0;t=1, "daily";r=5`), NOW)
	want := withBeyond(dimW(100, 0, time.Second, time.Second, DialectIETF), 5)
	if q.Requests != want {
		t.Fatalf("Requests = %+v, want %+v", q.Requests, want)
	}
	th := New(Config{JitterWindow: -1}, NOW)
	th.Observe(NOW, Permit{}, q)
	for range 5 {
		mustStart(t, th, at(time.Second), 1, Interactive)
	}
	mustRefuse(t, th, at(time.Second), 1, Interactive)
}
