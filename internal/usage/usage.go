// Package usage tracks each tenant's consumption over a sliding window and
// flags the tenants whose usage stands out from their tier: the "cost per
// tenant far exceeding their tier" and "high rate of limit violations
// (probing)" signals of seed 002 section 7 ("Detecting abuse"), whose
// practical approach is to "monitor cost per tenant against tier,
// investigate outliers manually". Exercise E of the same seed asks for the
// threshold; docs/operations.md ("Cost per tenant and usage outliers")
// gives it with the measurement behind it.
//
// The package knows neither HTTP nor Kubernetes and reads no clock: every
// call takes the time. A Ring holds one tenant's counts in 1-minute
// buckets; Evaluate compares the tenants' window totals within each tier.
// A signal only reports: it never refuses or slows a request (seed 002
// section 7, response 1 "log and monitor").
package usage

import (
	"fmt"
	"math"
	"sort"
	"sync"
	"time"
)

// BucketWidth is the width of one bucket of a Ring: a window is a whole
// number of minutes.
const BucketWidth = time.Minute

// Defaults of Config (the ProviderPool's spec.usageMonitoring defaults).
const (
	// DefaultWindow is the evaluation window: one hour.
	DefaultWindow = time.Hour
	// DefaultCostRatio: a tenant is a cost outlier at 10 times its tier's
	// median weighted tokens over the window (docs/operations.md, "Cost per
	// tenant and usage outliers", for the measurement behind 10).
	DefaultCostRatio = 10
	// DefaultMinTierSize: a tier's median means something from 5 active
	// tenants.
	DefaultMinTierSize = 5
	// DefaultMinWeightedTokens: below 100,000 weighted tokens over the
	// window a tenant is never a cost outlier, however small its tier's
	// median.
	DefaultMinWeightedTokens = 100_000
	// DefaultRejectionPercent: a tenant with at least half of its requests
	// refused by its own limits over the window is flagged.
	DefaultRejectionPercent = 50
	// DefaultMinRejections: and at least 100 refusals, so that a few
	// refusals of a quiet tenant flag nothing.
	DefaultMinRejections = 100
	// MaxWindow bounds the window (one day: 1440 buckets per tenant).
	MaxWindow = 24 * time.Hour
)

// Counts are a tenant's consumption over a span of time.
type Counts struct {
	// WeightedTokens used, as settled (input*w_in + output*w_out of the
	// pool's cost model; the figure of used_weighted_tokens_total).
	WeightedTokens int64
	// InputTokens and OutputTokens used, in provider tokens (the
	// provider's usage, or the charge when it is unknown).
	InputTokens, OutputTokens int64
	// Admitted calls (interactive requests and job dispatches) and Refused
	// requests and jobs (refused by the tenant's own limits: rate,
	// concurrency, KV blocks, budget, queue bound, suspension).
	Admitted, Refused int64
}

// Add adds o to c.
func (c *Counts) Add(o Counts) {
	c.WeightedTokens += o.WeightedTokens
	c.InputTokens += o.InputTokens
	c.OutputTokens += o.OutputTokens
	c.Admitted += o.Admitted
	c.Refused += o.Refused
}

// Requests is Admitted + Refused.
func (c Counts) Requests() int64 { return c.Admitted + c.Refused }

// Active reports whether the tenant had any traffic.
func (c Counts) Active() bool { return c.Requests() > 0 || c.WeightedTokens > 0 }

type bucket struct {
	minute int64 // minutes since the Unix epoch of the bucket's start
	Counts
}

// Ring is one tenant's counts in 1-minute buckets over a window. It keeps
// only the minutes that had traffic (48 bytes each), in time order: a
// tenant that never sends a request costs the Ring header alone, one that
// sends a request now and then costs a bucket per minute it did so within
// the window, and a busy one at most the window's buckets (2,880 bytes for
// the default hour). The buckets are released once every one has left the
// window (at the next Record or Window). Record is O(1) and allocates
// nothing in the common case (the current minute's bucket exists, or its
// slice has room). Safe for concurrent use.
type Ring struct {
	mu sync.Mutex
	// n is the window in buckets, fixed at NewRing.
	n int
	// buckets are the minutes with traffic, ascending, each within n
	// minutes of the last; nil when there are none.
	buckets []bucket
}

// NewRing returns an empty ring over window (rounded up to whole minutes,
// at least one, at most MaxWindow). It allocates no bucket yet.
func NewRing(window time.Duration) *Ring {
	return &Ring{n: windowBuckets(window)}
}

func windowBuckets(window time.Duration) int {
	window = min(max(window, BucketWidth), MaxWindow)
	return int((window + BucketWidth - 1) / BucketWidth)
}

// minuteOf returns the minutes since the Unix epoch of the bucket holding
// now (floor, also before 1970).
func minuteOf(now time.Time) int64 {
	s := now.Unix()
	m := s / 60
	if s%60 < 0 {
		m--
	}
	return m
}

// slot returns the bucket of minute, adding it in time order if there is
// none, or nil when minute is at least the window's length before the
// newest bucket (it can no longer be in a window that holds the newest).
// A newer minute drops the buckets that left its window first. Callers hold
// r.mu.
func (r *Ring) slot(minute int64) *bucket {
	n := len(r.buckets)
	if n > 0 {
		last := r.buckets[n-1].minute
		switch {
		case minute == last:
			return &r.buckets[n-1]
		case minute < last:
			return r.insert(minute)
		}
		r.expire(minute)
		n = len(r.buckets)
	}
	r.grow()
	r.buckets = append(r.buckets, bucket{minute: minute})
	return &r.buckets[n]
}

// grow makes room for one more bucket, doubling the slice's capacity up to
// the window's length (the buckets, distinct minutes of one window, never
// exceed it). Callers hold r.mu.
func (r *Ring) grow() {
	n := len(r.buckets)
	if n < cap(r.buckets) {
		return
	}
	grown := make([]bucket, n, max(min(2*n, r.n), n+1))
	copy(grown, r.buckets)
	r.buckets = grown
}

// insert returns the bucket of minute, older than the newest bucket,
// inserting it in time order if there is none (a caller's time read just
// before another's but recorded after it, at a minute's turn), or nil when
// it is out of the newest bucket's window. Callers hold r.mu.
func (r *Ring) insert(minute int64) *bucket {
	n := len(r.buckets)
	if minute <= r.buckets[n-1].minute-int64(r.n) {
		return nil
	}
	i := n - 1 // the first bucket at or after minute
	for i > 0 && r.buckets[i-1].minute >= minute {
		i--
	}
	if r.buckets[i].minute == minute {
		return &r.buckets[i]
	}
	r.grow()
	r.buckets = append(r.buckets, bucket{})
	copy(r.buckets[i+1:], r.buckets[i:n])
	r.buckets[i] = bucket{minute: minute}
	return &r.buckets[i]
}

// expire drops the buckets that are not in the window ending at minute
// (those of minute-n or earlier), releasing the slice when none is left.
// Callers hold r.mu.
func (r *Ring) expire(minute int64) {
	k := 0
	for k < len(r.buckets) && r.buckets[k].minute <= minute-int64(r.n) {
		k++
	}
	switch {
	case k == len(r.buckets):
		r.buckets = nil
	case k > 0:
		r.buckets = r.buckets[:copy(r.buckets, r.buckets[k:])]
	}
}

// Record adds c to the bucket of now. A time older than the window ending
// at the newest bucket is dropped, so callers pass a clock's current time.
func (r *Ring) Record(now time.Time, c Counts) {
	m := minuteOf(now)
	r.mu.Lock()
	if b := r.slot(m); b != nil {
		b.Add(c)
	}
	r.mu.Unlock()
}

// Window returns the sum of the buckets in the window ending at now: the
// current minute and the n-1 minutes before it. Buckets that have left it
// for good (older than the window ending at now, with now not before the
// newest bucket) are released.
func (r *Ring) Window(now time.Time) Counts {
	m := minuteOf(now)
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := len(r.buckets); n > 0 && r.buckets[n-1].minute <= m {
		r.expire(m)
	}
	n := int64(r.n)
	var out Counts
	for i := range r.buckets {
		b := &r.buckets[i]
		if b.minute <= m && b.minute > m-n {
			out.Add(b.Counts)
		}
	}
	return out
}

// Span returns the window of the ring (its buckets times BucketWidth).
func (r *Ring) Span() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return time.Duration(r.n) * BucketWidth
}

// Resized returns a ring over window holding r's buckets that fall in the
// new window ending at now (a pool's window change keeps what it can).
func (r *Ring) Resized(now time.Time, window time.Duration) *Ring {
	out := NewRing(window)
	m := minuteOf(now)
	n := int64(out.n)
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.buckets {
		b := r.buckets[i]
		if b.minute <= m && b.minute > m-n && b.Active() {
			if nb := out.slot(b.minute); nb != nil {
				nb.Add(b.Counts)
			}
		}
	}
	return out
}

// Config is a pool's usage-monitoring settings (ProviderPool
// spec.usageMonitoring). Normalized puts the defaults in zero fields except
// MinWeightedTokens, where 0 means no floor; DefaultConfig is the
// configuration of a pool that sets nothing.
type Config struct {
	// Window is the span the totals cover (whole minutes).
	Window time.Duration
	// CostRatio: a tenant whose weighted tokens over the window are at
	// least CostRatio times its tier's median is a cost outlier.
	CostRatio int64
	// MinTierSize is the number of active tenants a tier needs before its
	// median is used.
	MinTierSize int
	// MinWeightedTokens: a tenant below it over the window is never a cost
	// outlier.
	MinWeightedTokens int64
	// RejectionPercent: a tenant with at least this percentage of its
	// requests refused by its own limits over the window, and at least
	// MinRejections refusals, is flagged for limit violations.
	RejectionPercent int64
	// MinRejections is the fewest refusals that flag limit violations.
	MinRejections int64
}

// Normalized returns c with the defaults in its zero (or negative) fields
// (a negative MinWeightedTokens becomes 0) and the window rounded up to whole minutes within [1m, MaxWindow].
func (c Config) Normalized() Config {
	if c.Window <= 0 {
		c.Window = DefaultWindow
	}
	c.Window = time.Duration(windowBuckets(c.Window)) * BucketWidth
	if c.CostRatio <= 0 {
		c.CostRatio = DefaultCostRatio
	}
	if c.MinTierSize <= 0 {
		c.MinTierSize = DefaultMinTierSize
	}
	if c.MinWeightedTokens < 0 {
		c.MinWeightedTokens = 0
	}
	if c.RejectionPercent <= 0 {
		c.RejectionPercent = DefaultRejectionPercent
	}
	c.RejectionPercent = min(c.RejectionPercent, 100)
	if c.MinRejections <= 0 {
		c.MinRejections = DefaultMinRejections
	}
	return c
}

// DefaultConfig is the configuration of a pool that sets nothing.
func DefaultConfig() Config {
	return Config{MinWeightedTokens: DefaultMinWeightedTokens}.Normalized()
}

// Reasons of a Signal (the reasons of the TenantQuota condition
// UsageOutlier, docs/api.md).
const (
	// ReasonCostAboveTier: weighted tokens over the window at least
	// Config.CostRatio times the tier's median (seed 002 section 7, "cost
	// per tenant far exceeding their tier").
	ReasonCostAboveTier = "CostAboveTier"
	// ReasonLimitViolations: at least Config.RejectionPercent of the
	// tenant's requests refused by its own limits (seed 002 section 7,
	// "high rate of limit violations (probing)").
	ReasonLimitViolations = "LimitViolations"
	// ReasonWithinTier: neither.
	ReasonWithinTier = "WithinTier"
)

// Signal says whether a tenant is flagged, why, and with which figures.
type Signal struct {
	// Outlier is true when the tenant is flagged.
	Outlier bool
	// Reason is ReasonCostAboveTier (checked first), ReasonLimitViolations
	// or ReasonWithinTier.
	Reason string
	// Message states the figures behind the reason.
	Message string
}

// Input is one tenant's totals over the window, for Evaluate.
type Input struct {
	// ID of the tenant and Tier ("" is a tier of its own, like any name).
	ID, Tier string
	// Counts over the window.
	Counts Counts
}

// Evaluation is one tenant's usage over the window compared with its tier.
type Evaluation struct {
	// Window the totals cover.
	Window time.Duration
	// Tier of the tenant.
	Tier string
	// Counts are the tenant's totals over the window.
	Counts Counts
	// TierActive is the number of tenants of the tier with traffic in the
	// window; TierMedian their median weighted tokens (the mean of the two
	// middle values, rounded down, for an even number), 0 when TierActive
	// < Config.MinTierSize.
	TierActive int
	TierMedian int64
	// HasMedian: the tier has at least Config.MinTierSize active tenants,
	// so TierMedian is used.
	HasMedian bool
	// RatioPercent is 100 * WeightedTokens / TierMedian (rounded down; a
	// median of 0 counts as 1), 0 when the tier has no usable median.
	RatioPercent int64
	// RefusedPercent is 100 * Refused / Requests (rounded down), 0 without
	// requests.
	RefusedPercent int64
	// Signal is the verdict.
	Signal Signal
}

// Evaluate compares each tenant's totals over cfg.Window with its tier
// under cfg (zero fields defaulted) and returns one Evaluation per input, in input order.
// Tenants of one tier are compared with each other; the median is taken
// over the tier's active tenants (those with traffic in the window), the
// tenant itself included. Rules (seed 002 section 7):
//
//   - CostAboveTier when the tier has at least MinTierSize active tenants,
//     the tenant used at least MinWeightedTokens and WeightedTokens >=
//     CostRatio * max(median, 1);
//   - else LimitViolations when Refused >= MinRejections and Refused*100 >=
//     RejectionPercent * (Admitted + Refused);
//   - else WithinTier.
func Evaluate(cfg Config, in []Input) []Evaluation {
	cfg = cfg.Normalized()
	window := cfg.Window
	tiers := map[string][]int64{}
	for i := range in {
		if in[i].Counts.Active() {
			tiers[in[i].Tier] = append(tiers[in[i].Tier], in[i].Counts.WeightedTokens)
		}
	}
	type tierStat struct {
		active int
		median int64
	}
	stats := make(map[string]tierStat, len(tiers))
	for tier, v := range tiers {
		st := tierStat{active: len(v)}
		if len(v) >= cfg.MinTierSize {
			st.median = median(v)
		}
		stats[tier] = st
	}
	out := make([]Evaluation, len(in))
	for i := range in {
		c := in[i].Counts
		st := stats[in[i].Tier]
		e := Evaluation{Window: window, Tier: in[i].Tier, Counts: c, TierActive: st.active, TierMedian: st.median}
		usable := st.active >= cfg.MinTierSize
		e.HasMedian = usable
		if usable {
			e.RatioPercent = mulDiv(c.WeightedTokens, 100, max(st.median, 1))
		}
		if n := c.Requests(); n > 0 {
			e.RefusedPercent = c.Refused * 100 / n
		}
		switch {
		case usable && c.WeightedTokens >= cfg.MinWeightedTokens && c.WeightedTokens/cfg.CostRatio >= max(st.median, 1):
			e.Signal = Signal{Outlier: true, Reason: ReasonCostAboveTier, Message: fmt.Sprintf(
				"%d weighted tokens in the last %s: %s the median of tier %q (%d, over %d active tenants); threshold %dx",
				c.WeightedTokens, window, times(e.RatioPercent), in[i].Tier, st.median, st.active, cfg.CostRatio)}
		case c.Refused >= cfg.MinRejections && c.Refused*100 >= cfg.RejectionPercent*c.Requests():
			e.Signal = Signal{Outlier: true, Reason: ReasonLimitViolations, Message: fmt.Sprintf(
				"%d of %d requests (%d%%) refused by the tenant's own limits in the last %s; threshold %d%% and %d refusals",
				c.Refused, c.Requests(), e.RefusedPercent, window, cfg.RejectionPercent, cfg.MinRejections)}
		default:
			e.Signal = Signal{Reason: ReasonWithinTier, Message: withinMessage(e, in[i].Tier, usable, window)}
		}
		out[i] = e
	}
	return out
}

func withinMessage(e Evaluation, tier string, usable bool, window time.Duration) string {
	if !usable {
		return fmt.Sprintf("%d weighted tokens in the last %s; tier %q has %d active tenants, too few for a median",
			e.Counts.WeightedTokens, window, tier, e.TierActive)
	}
	return fmt.Sprintf("%d weighted tokens in the last %s: %s the median of tier %q (%d); %d%% of requests refused",
		e.Counts.WeightedTokens, window, times(e.RatioPercent), tier, e.TierMedian, e.RefusedPercent)
}

// times formats a percentage as a multiple with one decimal ("12.3x").
func times(pct int64) string { return fmt.Sprintf("%d.%dx", pct/100, pct%100/10) }

// median returns the median of v (sorted in place): the middle value, or
// the mean of the two middle values rounded down.
func median(v []int64) int64 {
	sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	a, b := v[n/2-1], v[n/2]
	return a/2 + b/2 + (a%2+b%2)/2
}

// mulDiv returns a*b/c rounded down, saturating at math.MaxInt64 (a, b >= 0,
// c > 0).
func mulDiv(a, b, c int64) int64 {
	if a <= 0 {
		return 0
	}
	if a > math.MaxInt64/b {
		return math.MaxInt64
	}
	return a * b / c
}
