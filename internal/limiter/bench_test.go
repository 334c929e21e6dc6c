package limiter

import (
	"strconv"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// benchLimits has every dimension enabled and large enough never to refuse.
var benchLimits = Limits{
	WeightedPerMinute: i64(1 << 40), InputPerMinute: i64(1 << 40), OutputPerMinute: i64(1 << 40),
	RequestsPerMinute: i64(1 << 40), MaxConcurrent: i64(1 << 40), MaxKVBlocks: i64(1 << 50),
}

// BenchmarkAdmitComplete: one tenant, admission (all four buckets, concurrency,
// KV blocks, charge) plus settlement with usage. Target 0 allocs/op.
func BenchmarkAdmitComplete(b *testing.B) {
	tn := NewTenant(benchLimits, now0)
	c := DefaultCostModel.Cost(1000, 500)
	u := Usage{PromptTokens: 1000, OutputTokens: 200, Known: true}
	b.ReportAllocs()
	now := now0
	for i := 0; b.Loop(); i++ {
		now = now.Add(time.Microsecond)
		r, rej := tn.Admit(now, c)
		if rej != nil {
			b.Fatal(rej)
		}
		r.Complete(now, u)
	}
}

// BenchmarkAdmit: admission alone on one tenant, the figure compared with
// BenchmarkXRate2AllowN (brief: at most 2x).
func BenchmarkAdmit(b *testing.B) {
	tn := NewTenant(benchLimits, now0)
	c := DefaultCostModel.Cost(1000, 500)
	b.ReportAllocs()
	now := now0
	for b.Loop() {
		now = now.Add(time.Microsecond)
		if _, rej := tn.Admit(now, c); rej != nil {
			b.Fatal(rej)
		}
	}
}

func benchTenants(b *testing.B, n int) {
	tenants := make(map[string]*Tenant, n)
	for i := range n {
		tenants["tenant-"+strconv.Itoa(i)] = NewTenant(benchLimits, now0)
	}
	// The key is formatted per request, as the gateway has it fresh from the
	// request headers (hot in cache), rather than read from a cold table.
	key := make([]byte, 0, 32)
	c := DefaultCostModel.Cost(1000, 500)
	b.ReportAllocs()
	now := now0
	i := 0
	for b.Loop() {
		now = now.Add(time.Microsecond)
		// A stride through the keys defeats the cache the way random traffic does.
		i += 7919
		if i >= n {
			i %= n
		}
		key = strconv.AppendInt(append(key[:0], "tenant-"...), int64(i), 10)
		if _, rej := tenants[string(key)].Admit(now, c); rej != nil {
			b.Fatal(rej)
		}
	}
}

// BenchmarkAdmit1kTenants and BenchmarkAdmit100kTenants: tenant lookup in a
// map plus Admit (brief: 100k at most 2x the 1k cost).
func BenchmarkAdmit1kTenants(b *testing.B)   { benchTenants(b, 1_000) }
func BenchmarkAdmit100kTenants(b *testing.B) { benchTenants(b, 100_000) }

// BenchmarkXRate2AllowN is the baseline of the brief's admission target: two
// golang.org/x/time/rate AllowN calls (a token limiter and a request limiter).
func BenchmarkXRate2AllowN(b *testing.B) {
	tokens := rate.NewLimiter(rate.Limit(1<<40), 1<<40)
	reqs := rate.NewLimiter(rate.Limit(1<<40), 1<<40)
	b.ReportAllocs()
	now := now0
	for b.Loop() {
		now = now.Add(time.Microsecond)
		if !tokens.AllowN(now, 1500) || !reqs.AllowN(now, 1) {
			b.Fatal("refused")
		}
	}
}
