package main

// Comparison says how a target's figure is judged.
type Comparison int

const (
	// RatioMax passes when figure / peer <= Threshold (the figure is at most Threshold times the peer's).
	RatioMax Comparison = iota
	// RatioMin passes when figure / peer >= Threshold (throughput at least Threshold times the peer's).
	RatioMin
	// SpeedupMin passes when peer / figure >= Threshold (the figure, a time per operation, is at least
	// Threshold times faster than the peer's).
	SpeedupMin
	// DiffMax passes when figure - peer <= Threshold, in the figure's unit.
	DiffMax
	// Max passes when figure <= Threshold; there is no peer.
	Max
	// Min passes when figure >= Threshold; there is no peer.
	Min
	// Report has no target: the figure is shown for reference.
	Report
)

// Bound is an extra upper bound on another unit of the figure's benchmark (for example "0 allocs"
// next to a ratio of ns/op); the row passes only when every bound holds.
type Bound struct {
	Unit string
	Max  float64
}

// Target is one row of the summary: a figure (a benchmark name without its -GOMAXPROCS suffix and
// a unit), optionally a peer figure from the same raw file, the comparison and its threshold, and
// where the target comes from.
type Target struct {
	Area      string
	What      string
	Bench     string // benchmark name, "Benchmark..." without the -GOMAXPROCS suffix
	Unit      string // unit as the benchmark prints it ("ns/op", "p99-added-us", ...)
	PeerBench string // empty when the comparison has no peer
	PeerUnit  string
	Cmp       Comparison
	Threshold float64
	Also      []Bound
	Source    string // the section of the product brief the target comes from
}

// briefPerf is the section of the product brief every target below comes from.
const briefPerf = "brief: Performance targets"

// targets is the table of every target the summary reports, in display order.
var targets = buildTargets()

func buildTargets() []Target {
	var t []Target
	add := func(x Target) {
		if x.Source == "" {
			x.Source = briefPerf
		}
		t = append(t, x)
	}
	zeroBytes := []Bound{{Unit: "B/op", Max: 0}}

	// Admission (internal/limiter, BenchmarkAdmission): AdmitInto, what the gateway calls, against
	// two x/time/rate AllowN calls per request, one goroutine. B/op rather than allocs/op: allocs/op
	// rounds a slab allocation every 64 admissions down to 0.
	// Admit returns a new *Reservation (96 B) by design; the allocation-free path the gateway
	// takes is AdmitInto, whose rows below carry the 0 B/op target.
	add(Target{Area: "admission", What: "Admit (1 tenant, no lookup, returns a new *Reservation) vs 2 AllowN",
		Bench: "BenchmarkAdmit", Unit: "ns/op", PeerBench: "BenchmarkXRate2AllowN", PeerUnit: "ns/op",
		Cmp: RatioMax, Threshold: 2})
	for _, op := range []string{"admit", "refund"} {
		for _, pat := range []string{"zipf", "stride"} {
			for _, n := range []string{"1k", "100k"} {
				base := "BenchmarkAdmission/" + op + "/" + pat + "/" + n + "/serial/"
				add(Target{Area: "admission", What: op + "/" + pat + "/" + n + "/serial AdmitInto vs 2 AllowN; 0 B/op",
					Bench: base + "fairshare-into", Unit: "ns/op", PeerBench: base + "xrate", PeerUnit: "ns/op",
					Cmp: RatioMax, Threshold: 2, Also: zeroBytes})
			}
		}
	}
	for _, op := range []string{"admit", "refund"} {
		for _, pat := range []string{"zipf", "stride"} {
			pre := "BenchmarkAdmission/" + op + "/" + pat + "/"
			add(Target{Area: "admission", What: op + "/" + pat + "/serial AdmitInto, 100k tenants vs 1k",
				Bench: pre + "100k/serial/fairshare-into", Unit: "ns/op", PeerBench: pre + "1k/serial/fairshare-into", PeerUnit: "ns/op",
				Cmp: RatioMax, Threshold: 2})
		}
	}

	// Fair queue (internal/fairqueue, BenchmarkEnqueueDequeue and BenchmarkMemoryPerJob).
	// Two workloads: the benchmark method's (each dequeued job queued again by its own tenant) and a
	// harder one (queued by a tenant picked by a stride through all of them, so every enqueue finds
	// a cold tenant). By TenantRef is how the gateway queues a job; by name is Enqueue's lookup.
	const heap = "BenchmarkEnqueueDequeue/tenants=100k/jobs=1M/impl=container-heap"
	for _, wl := range []struct{ elem, what string }{{"workload=same-job/", "method's workload"}, {"", "scattered tenants"}} {
		for _, impl := range []struct{ name, what string }{{"drr-ref", "by TenantRef"}, {"drr", "by name"}} {
			big := "BenchmarkEnqueueDequeue/tenants=100k/jobs=1M/" + wl.elem + "impl=" + impl.name
			add(Target{Area: "fair queue", What: wl.what + ": enqueue+dequeue 100k tenants/1M jobs " + impl.what + ", speed-up over container/heap; 0 B/op",
				Bench: big, Unit: "ns/op", PeerBench: heap, PeerUnit: "ns/op",
				Cmp: SpeedupMin, Threshold: 3, Also: zeroBytes})
			add(Target{Area: "fair queue", What: wl.what + ": enqueue+dequeue " + impl.what + ", 1M jobs (100k tenants) vs 10k jobs (1k tenants)",
				Bench: big, Unit: "ns/op", PeerBench: "BenchmarkEnqueueDequeue/tenants=1k/jobs=10k/" + wl.elem + "impl=" + impl.name, PeerUnit: "ns/op",
				Cmp: RatioMax, Threshold: 1.5})
		}
	}
	add(Target{Area: "fair queue", What: "memory per queued job (1M jobs, 100k tenants), the queue's fields in Job included",
		Bench: "BenchmarkMemoryPerJob", Unit: "B/job-incl-links", Cmp: Max, Threshold: 64})

	// Header parsing (internal/throttle, BenchmarkHeaderParse): each parse against strconv.ParseInt
	// over every number the same response carries (docs/benchmarks.md, Header parsing).
	for _, d := range []string{"openai", "anthropic", "azure", "classic", "ietf", "ietf-legacy"} {
		for _, mode := range []struct{ name, what string }{{"ParseHeaders", "Auto"}, {"ParseHeadersDialect", "dialect set"}} {
			add(Target{Area: "header parsing", What: d + " " + mode.what + " vs strconv.ParseInt; ≤ 1 alloc",
				Bench: "BenchmarkHeaderParse/dialect=" + d + "/" + mode.name, Unit: "ns/op",
				PeerBench: "BenchmarkHeaderParse/dialect=" + d + "/strconv.ParseInt", PeerUnit: "ns/op",
				Cmp: RatioMax, Threshold: 3, Also: []Bound{{Unit: "allocs/op", Max: 1}}})
		}
	}

	// Status writer (internal/kube, BenchmarkStatusWriter10k, 10k TenantQuotas on a real API server).
	const sw = "BenchmarkStatusWriter10k"
	add(Target{Area: "status writer", What: "writes/s with nothing changing (10k tenants)", Bench: sw, Unit: "idle-writes/s", Cmp: Max, Threshold: 0.2})
	add(Target{Area: "status writer", What: "writes/s under churn (1,000 tenants changing every pass)", Bench: sw, Unit: "churn-writes/s", Cmp: Max, Threshold: 5})
	add(Target{Area: "status writer", What: "most writes in any simulated second", Bench: sw, Unit: "max-writes/s", Cmp: Max, Threshold: 5})
	add(Target{Area: "status writer", What: "largest status on the API server, bytes", Bench: sw, Unit: "status-B", Cmp: Max, Threshold: 4096})

	// Throttle goodput (test/goodput, BenchmarkGoodput): the gateway against the simulator's quota.
	for _, d := range []string{"openai", "azure", "classic", "ietf", "ietf-legacy", "anthropic", "anthropic-refund", "anthropic-tokens"} {
		b := "BenchmarkGoodput/dialect=" + d + "/client=gateway"
		add(Target{Area: "goodput", What: d + ": quota used in steady state, %", Bench: b, Unit: "util%", Cmp: Min, Threshold: 95})
		add(Target{Area: "goodput", What: d + ": upstream 429s in steady state", Bench: b, Unit: "429s", Cmp: Max, Threshold: 0})
	}

	// HTTP data plane (test/httpbench): the gateway against httputil.ReverseProxy ("proxy") to the
	// same loopback upstream. Only the gateway's rows name a tenant count.
	for _, up := range []string{"instant", "20ms"} {
		proxy := "BenchmarkHTTPAddedLatency/upstream=" + up + "/peer=proxy"
		for _, ten := range []string{"1", "10000"} {
			gw := "BenchmarkHTTPAddedLatency/upstream=" + up + "/peer=gateway/tenants=" + ten
			add(Target{Area: "HTTP latency", What: "added p50 µs, upstream " + up + ", " + ten + " tenants, vs reverse proxy",
				Bench: gw, Unit: "p50-added-us", PeerBench: proxy, PeerUnit: "p50-added-us", Cmp: RatioMax, Threshold: 1.25})
			add(Target{Area: "HTTP latency", What: "added p99 µs, upstream " + up + ", " + ten + " tenants, vs reverse proxy",
				Bench: gw, Unit: "p99-added-us", PeerBench: proxy, PeerUnit: "p99-added-us", Cmp: RatioMax, Threshold: 1.5})
		}
	}
	// The frontier's p99 bounds are the upstream's latency plus 5, 10 and
	// 50 ms (test/httpbench frontierBounds).
	for _, up := range []string{"instant", "20ms"} {
		pre := "BenchmarkHTTPFrontier/upstream=" + up + "/peer="
		units := []string{"rps-p99-5ms", "rps-p99-10ms", "rps-p99-50ms"}
		if up == "20ms" {
			units = []string{"rps-p99-25ms", "rps-p99-30ms", "rps-p99-70ms"}
		}
		for i, u := range units {
			bound := u[len("rps-"):]
			if up == "20ms" {
				bound += " (20 ms + " + []string{"5", "10", "50"}[i] + " ms)"
			}
			add(Target{Area: "HTTP throughput", What: "req/s at " + bound + ", upstream " + up + ", 10000 tenants, vs reverse proxy",
				Bench: pre + "gateway/tenants=10000", Unit: u, PeerBench: pre + "proxy", PeerUnit: u, Cmp: RatioMin, Threshold: 0.85})
		}
	}
	add(Target{Area: "HTTP streaming", What: "SSE frame gap p99 µs, 512 streams, minus reverse proxy's",
		Bench: "BenchmarkHTTPSSE/streams=512/peer=gateway", Unit: "gap-p99-us",
		PeerBench: "BenchmarkHTTPSSE/streams=512/peer=proxy", PeerUnit: "gap-p99-us", Cmp: DiffMax, Threshold: 50})
	for _, s := range []string{"1", "512"} {
		add(Target{Area: "HTTP streaming", What: "SSE stalls, " + s + " stream(s)",
			Bench: "BenchmarkHTTPSSE/streams=" + s + "/peer=gateway", Unit: "stalls", Cmp: Max, Threshold: 0})
	}
	add(Target{Area: "HTTP usage", What: "CPU µs per 1 MB request with usage accounting, vs reverse proxy",
		Bench: "BenchmarkHTTPUsage1MB/peer=gateway/tenants=1", Unit: "cpu-us/req",
		PeerBench: "BenchmarkHTTPUsage1MB/peer=proxy", PeerUnit: "cpu-us/req", Cmp: RatioMax, Threshold: 1.2})
	add(Target{Area: "HTTP memory", What: "idle RSS MB, 1 tenant, vs reverse proxy",
		Bench: "BenchmarkHTTPMemory/peer=gateway/tenants=1", Unit: "rss-idle-MB",
		PeerBench: "BenchmarkHTTPMemory/peer=proxy", PeerUnit: "rss-idle-MB", Cmp: RatioMax, Threshold: 2})
	mem := "BenchmarkHTTPMemory/peer="
	add(Target{Area: "HTTP memory", What: "idle anonymous RSS MB (heap, stacks), 1 tenant, vs reverse proxy",
		Bench: mem + "gateway/tenants=1", Unit: "rss-anon-idle-MB", PeerBench: mem + "proxy", PeerUnit: "rss-anon-idle-MB",
		Cmp: Report, Source: "reported, no target"})
	add(Target{Area: "HTTP memory", What: "idle RSS MB, 10000 tenants, vs reverse proxy",
		Bench: mem + "gateway/tenants=10000", Unit: "rss-idle-MB", PeerBench: mem + "proxy", PeerUnit: "rss-idle-MB",
		Cmp: Report, Source: "reported, no target"})
	add(Target{Area: "HTTP memory", What: "RSS MB at steady load, 10000 tenants, vs reverse proxy",
		Bench: mem + "gateway/tenants=10000", Unit: "rss-steady-MB", PeerBench: mem + "proxy", PeerUnit: "rss-steady-MB",
		Cmp: Report, Source: "reported, no target"})
	for _, ten := range []string{"1", "10000"} {
		add(Target{Area: "HTTP CPU", What: "CPU µs per small request at concurrency 1, " + ten + " tenants, vs reverse proxy",
			Bench: "BenchmarkHTTPAddedLatency/upstream=instant/peer=gateway/tenants=" + ten, Unit: "cpu-us/req",
			PeerBench: "BenchmarkHTTPAddedLatency/upstream=instant/peer=proxy", PeerUnit: "cpu-us/req",
			Cmp: Report, Source: "reported, no target"})
	}
	add(Target{Area: "HTTP upstream", What: "loopback upstream alone, req/s at p99 5 ms (the ceiling of the rows above)",
		Bench: "BenchmarkHTTPUpstreamCeiling/upstream=instant", Unit: "rps-p99-5ms", Cmp: Report, Source: "reported, no target"})
	return t
}
