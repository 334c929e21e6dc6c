package limiter

import (
	"math/rand"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// Admission micro-benchmarks (brief "Performance targets": admission at most
// 2x two golang.org/x/time/rate AllowN calls, 0 allocs; 100k tenants at most
// 2x the 1k-tenant cost; parallel at least 1.6x serial). docs/benchmarks.md
// records the figures and how to reproduce them.
//
// Every benchmark runs the same shape on both sides, in the same run:
//
//   - a map[string] of tenants under a sync.RWMutex read lock, as the
//     gateway's registry holds them; the key "tenant-<id>" is formatted per
//     request into a reused buffer (the gateway has it fresh from the
//     request headers);
//   - fairshare, fairshare-into: *Tenant with every dimension on (weighted, input, output and
//     request buckets, concurrency and KV blocks), limits large enough never
//     to refuse;
//   - xrate (the peer): a pair of *rate.Limiter per tenant (tokens and
//     requests) with the same rates and bursts, two AllowN calls per request;
//     for admit+refund, ReserveN on the token limiter, AllowN on the request
//     limiter and CancelAt, the charge-then-refund shape x/time/rate offers;
//   - the tenant of each request comes from a key sequence precomputed
//     outside the timed loop: zipf (skewed, the primary figure: rand.Zipf
//     with s = 1.1, v = 1, ranks mapped to tenants through a fixed random
//     permutation so hot tenants are not neighbours in memory) or stride
//     (uniform: every tenant in turn with a stride of 7919, which defeats the
//     cache the way uniformly scattered traffic does);
//   - serial runs one goroutine; parallel runs b.RunParallel (GOMAXPROCS
//     goroutines), each walking the sequence from its own offset with its own
//     clock; parallel-atomic is parallel with the maps read through atomic
//     pointers instead of the RWMutex, whose reader count is one cache line
//     every lookup writes, on both sides alike.

// benchLimits has every dimension enabled and large enough never to refuse.
var benchLimits = Limits{
	WeightedPerMinute: i64(1 << 40), InputPerMinute: i64(1 << 40), OutputPerMinute: i64(1 << 40),
	RequestsPerMinute: i64(1 << 40), MaxConcurrent: i64(1 << 40), MaxKVBlocks: i64(1 << 50),
}

// benchCost is the request of every benchmark: 1000 prompt tokens and 500 max
// output tokens (3000 weighted, 94 KV blocks); benchUsage its usage.
var (
	benchCost  = DefaultCostModel.Cost(1000, 500)
	benchUsage = Usage{PromptTokens: 1000, OutputTokens: 200, Known: true}
)

// peerTenant is the peer's per-tenant state: the two x/time/rate limiters of
// the brief's baseline.
type peerTenant struct{ tok, reqs *rate.Limiter }

// benchWorld holds n tenants on both sides, in maps under an RWMutex (the
// gateway's registry today) and, for the parallel-atomic mode, the same maps
// published through atomic pointers (a copy-on-write registry, whose lookup
// writes no shared memory).
type benchWorld struct {
	mu         sync.RWMutex
	ours       map[string]*Tenant
	peer       map[string]*peerTenant
	oursAtomic atomic.Pointer[map[string]*Tenant]
	peerAtomic atomic.Pointer[map[string]*peerTenant]
}

// benchLookup is a benchWorld seen through one lookup: the RWMutex-guarded
// maps, or the atomic pointers.
type benchLookup struct {
	w      *benchWorld
	atomic bool
}

func (l benchLookup) tenant(key []byte) *Tenant {
	if l.atomic {
		return (*l.w.oursAtomic.Load())[string(key)]
	}
	l.w.mu.RLock()
	t := l.w.ours[string(key)]
	l.w.mu.RUnlock()
	return t
}

func (l benchLookup) peerTenant(key []byte) *peerTenant {
	if l.atomic {
		return (*l.w.peerAtomic.Load())[string(key)]
	}
	l.w.mu.RLock()
	p := l.w.peer[string(key)]
	l.w.mu.RUnlock()
	return p
}

// seqLen is the length of a key sequence, a power of two above 100k so that
// the stride pattern visits every tenant.
const seqLen = 1 << 20

var (
	worldsMu sync.Mutex
	worlds   = map[int]*benchWorld{}
	seqs     = map[string][]int32{}
)

func world(n int) *benchWorld {
	worldsMu.Lock()
	defer worldsMu.Unlock()
	if w := worlds[n]; w != nil {
		return w
	}
	w := &benchWorld{ours: make(map[string]*Tenant, n), peer: make(map[string]*peerTenant, n)}
	perMinute := *benchLimits.WeightedPerMinute
	lim, burst := rate.Limit(float64(perMinute)/60), int(perMinute/6)
	for i := range n {
		key := "tenant-" + strconv.Itoa(i)
		w.ours[key] = NewTenant(benchLimits, now0)
		w.peer[key] = &peerTenant{tok: rate.NewLimiter(lim, burst), reqs: rate.NewLimiter(lim, burst)}
	}
	w.oursAtomic.Store(&w.ours)
	w.peerAtomic.Store(&w.peer)
	worlds[n] = w
	return w
}

// keySeq returns the tenant indexes of seqLen requests over n tenants.
func keySeq(n int, pattern string) []int32 {
	worldsMu.Lock()
	defer worldsMu.Unlock()
	id := pattern + "/" + strconv.Itoa(n)
	if s := seqs[id]; s != nil {
		return s
	}
	s := make([]int32, seqLen)
	switch pattern {
	case "zipf":
		r := rand.New(rand.NewSource(1))
		perm := r.Perm(n)
		z := rand.NewZipf(r, 1.1, 1, uint64(n-1))
		for i := range s {
			s[i] = int32(perm[z.Uint64()])
		}
	case "stride":
		j := 0
		for i := range s {
			s[i] = int32(j)
			j = (j + 7919) % n
		}
	default:
		panic(pattern)
	}
	seqs[id] = s
	return s
}

// benchOp is one request of a benchmark: the tenant index and the clock.
type benchOp func(w benchLookup, key []byte, now time.Time)

func admitOurs(w benchLookup, key []byte, now time.Time) {
	if _, rej := w.tenant(key).Admit(now, benchCost); rej != nil {
		panic(rej.Reason)
	}
}

func admitOursInto(w benchLookup, key []byte, now time.Time) {
	var r Reservation
	if rej := w.tenant(key).AdmitInto(now, benchCost, &r); rej != nil {
		panic(rej.Reason)
	}
}

// lookupOnly is the tenant lookup alone, the share of the map in every
// figure.
func lookupOnly(w benchLookup, key []byte, now time.Time) {
	if w.tenant(key) == nil {
		panic("no tenant")
	}
}

func admitPeer(w benchLookup, key []byte, now time.Time) {
	p := w.peerTenant(key)
	if !p.tok.AllowN(now, int(benchCost.Weighted)) || !p.reqs.AllowN(now, 1) {
		panic("refused")
	}
}

func refundOurs(w benchLookup, key []byte, now time.Time) {
	r, rej := w.tenant(key).Admit(now, benchCost)
	if rej != nil {
		panic(rej.Reason)
	}
	r.Complete(now, benchUsage)
}

func refundOursInto(w benchLookup, key []byte, now time.Time) {
	var r Reservation
	if rej := w.tenant(key).AdmitInto(now, benchCost, &r); rej != nil {
		panic(rej.Reason)
	}
	r.Complete(now, benchUsage)
}

func refundPeer(w benchLookup, key []byte, now time.Time) {
	p := w.peerTenant(key)
	r := p.tok.ReserveN(now, int(benchCost.Weighted))
	if !r.OK() || r.DelayFrom(now) > 0 || !p.reqs.AllowN(now, 1) {
		panic("refused")
	}
	r.CancelAt(now)
}

// benchEpochs counts the clocks handed out by benchEpoch.
var benchEpochs atomic.Int64

// benchEpoch returns the start of a fresh benchmark clock, an hour after the
// previous one. The worlds are shared by every benchmark, so a clock that
// restarted at now0 would run behind the tenants' last refill and skip the
// refill arithmetic (a clock going backwards refills nothing).
func benchEpoch() time.Time {
	return now0.Add(time.Duration(benchEpochs.Add(1)) * time.Hour)
}

// runSerial and runParallel walk the key sequence, formatting each key into a
// reused buffer, and advance the clock by 1 us per request from a fresh
// epoch (each parallel goroutine has its own clock).
func runSerial(b *testing.B, w benchLookup, seq []int32, op benchOp) {
	key := make([]byte, 0, 32)
	now := benchEpoch()
	j := 0
	b.ReportAllocs()
	cpu := cpuNanos()
	for b.Loop() {
		now = now.Add(time.Microsecond)
		key = strconv.AppendInt(append(key[:0], "tenant-"...), int64(seq[j]), 10)
		j = (j + 1) & (seqLen - 1)
		op(w, key, now)
	}
	reportCPU(b, cpu)
}

// reportCPU reports the process CPU time per operation since cpu (user +
// system, every thread, so the garbage collector's work is included), the
// figure that the other load on a shared machine disturbs least.
func reportCPU(b *testing.B, cpu int64) {
	if end := cpuNanos(); cpu >= 0 && end >= 0 && b.N > 0 {
		b.ReportMetric(float64(end-cpu)/float64(b.N), "cpu-ns/op")
	}
}

func runParallel(b *testing.B, w benchLookup, seq []int32, op benchOp) {
	var goroutine atomic.Int64
	epoch := benchEpoch()
	b.ReportAllocs()
	cpu := cpuNanos()
	defer reportCPU(b, cpu)
	b.RunParallel(func(pb *testing.PB) {
		key := make([]byte, 0, 32)
		now := epoch
		j := int(goroutine.Add(1)*104729) & (seqLen - 1)
		for pb.Next() {
			now = now.Add(time.Microsecond)
			key = strconv.AppendInt(append(key[:0], "tenant-"...), int64(seq[j]), 10)
			j = (j + 1) & (seqLen - 1)
			op(w, key, now)
		}
	})
}

// BenchmarkAdmission is the side-by-side: op (admit, admit+refund), access
// pattern, tenants, mode (serial, parallel, parallel-atomic), then the
// implementation: fairshare
// (Tenant.Admit, reservations from shared slabs), fairshare-into
// (Tenant.AdmitInto, the reservation in the caller's storage), the peer
// xrate and, for admit, lookup-only (the tenant lookup alone).
func BenchmarkAdmission(b *testing.B) {
	type impl struct {
		name string
		op   benchOp
	}
	ops := []struct {
		name  string
		impls []impl
	}{
		{"admit", []impl{{"fairshare", admitOurs}, {"fairshare-into", admitOursInto}, {"xrate", admitPeer}, {"lookup-only", lookupOnly}}},
		{"refund", []impl{{"fairshare", refundOurs}, {"fairshare-into", refundOursInto}, {"xrate", refundPeer}}},
	}
	for _, op := range ops {
		for _, pattern := range []string{"zipf", "stride"} {
			for _, n := range []int{1_000, 100_000} {
				name := op.name + "/" + pattern + "/" + strconv.Itoa(n/1000) + "k"
				for _, mode := range []string{"serial", "parallel", "parallel-atomic"} {
					run := runSerial
					if mode != "serial" {
						run = runParallel
					}
					for _, im := range op.impls {
						b.Run(name+"/"+mode+"/"+im.name, func(b *testing.B) {
							run(b, benchLookup{world(n), mode == "parallel-atomic"}, keySeq(n, pattern), im.op)
						})
					}
				}
			}
		}
	}
}

// BenchmarkAdmitComplete: one tenant, admission (all four buckets, concurrency,
// KV blocks, charge) plus settlement with usage, without a tenant lookup.
func BenchmarkAdmitComplete(b *testing.B) {
	tn := NewTenant(benchLimits, now0)
	b.ReportAllocs()
	now := now0
	for b.Loop() {
		now = now.Add(time.Microsecond)
		r, rej := tn.Admit(now, benchCost)
		if rej != nil {
			b.Fatal(rej)
		}
		r.Complete(now, benchUsage)
	}
}

// BenchmarkAdmit: admission alone on one tenant, without a tenant lookup;
// compare with BenchmarkXRate2AllowN.
func BenchmarkAdmit(b *testing.B) {
	tn := NewTenant(benchLimits, now0)
	b.ReportAllocs()
	now := now0
	for b.Loop() {
		now = now.Add(time.Microsecond)
		if _, rej := tn.Admit(now, benchCost); rej != nil {
			b.Fatal(rej)
		}
	}
}

// BenchmarkXRate2AllowN: the peer of BenchmarkAdmit, two AllowN calls on one
// pair of limiters.
func BenchmarkXRate2AllowN(b *testing.B) {
	tokens := rate.NewLimiter(rate.Limit(1<<40), 1<<40)
	reqs := rate.NewLimiter(rate.Limit(1<<40), 1<<40)
	b.ReportAllocs()
	now := now0
	for b.Loop() {
		now = now.Add(time.Microsecond)
		if !tokens.AllowN(now, int(benchCost.Weighted)) || !reqs.AllowN(now, 1) {
			b.Fatal("refused")
		}
	}
}
