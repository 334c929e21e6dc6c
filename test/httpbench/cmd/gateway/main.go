// Command gateway serves the Fairshare gateway for the HTTP benchmarks
// (package httpbench), built as the scheduler builds it
// (internal/scheduler run.go): the Go memory limit from the cgroup
// (runtimeconfig.ApplyMemoryLimit; none on a machine without one), a registry on the real clock, a Prometheus
// registry with the Go and process collectors and metrics.New on it, an
// in-memory job store (the scheduler's default without a job store path),
// gateway.New served by gateway.NewServer with its dispatcher (Gateway.Run),
// the tokenizer's vocabulary loaded before it listens.
//
// The pool takes the API defaults of a ProviderPool (internal/kube
// PoolPolicy: reserve 20%, cost model input 1 / output 4 / KV block 16
// tokens, default max output 4096 tokens, quantum 4096, 100,000 queued jobs,
// upstream timeout 120 s, usage monitoring defaults), with tenants
// identified by API key (registry.IdentifyAPIKey, `Authorization: Bearer
// <key>`, the production default) and two models, "sim" and "sim-1mb". Each
// of the --tenants tenants (ids t0..t{N-1}, key TenantKey(i)) has every limit
// set (weighted token bucket, request bucket, concurrency, KV blocks) so that
// admission runs in full, but far above any benchmark load, which therefore
// never gets a 429.
//
// --upstream-concurrency is the pool's upstreamConcurrency (API default 64);
// the benchmarks raise it to 1024, the proxy peer's connection pool, so that
// 512 concurrent streams measure the cost of the gateway, not its queue.
//
// It listens on 127.0.0.1, prints "listening 127.0.0.1:PORT" as its first
// line of standard output and exits cleanly on SIGTERM or SIGINT, writing
// the profiles asked for by --cpuprofile (CPU from start to exit) and
// --memprofile (the allocs profile at exit).
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/fairshare-dev/fairshare/internal/gateway"
	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/metrics"
	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/runtimeconfig"
	"github.com/fairshare-dev/fairshare/internal/tokencount"
)

// TenantKey is the API key of tenant i; the harness (httpbench.TenantKey)
// uses the same format.
func TenantKey(i int) string { return fmt.Sprintf("sk-bench-tenant-%d", i) }

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address (loopback only)")
	upstream := flag.String("upstream", "", "upstream base URL, e.g. http://127.0.0.1:41234")
	tenants := flag.Int("tenants", 1, "number of tenants (API keys TenantKey(0..N-1))")
	conc := flag.Int("upstream-concurrency", gateway.DefaultUpstreamConcurrency, "pool upstreamConcurrency (calls in flight to the provider)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile (start to exit) to this file")
	memprofile := flag.String("memprofile", "", "write the allocs profile at exit to this file")
	flag.Parse()
	if err := run(*addr, *upstream, *tenants, *conc, *cpuprofile, *memprofile); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func ptr(v int64) *int64 { return &v }

func run(addr, upstream string, tenants, conc int, cpuprofile, memprofile string) error {
	if upstream == "" || tenants < 1 {
		return fmt.Errorf("--upstream is required and --tenants must be >= 1")
	}
	if cpuprofile != "" {
		f, err := os.Create(cpuprofile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer func() { pprof.StopCPUProfile(); _ = f.Close() }()
	}
	log := zap.New()
	runtimeconfig.ApplyMemoryLimit(log) // as the scheduler does: no limit outside a container
	clk := clock.RealClock{}
	reg := registry.New(clk)
	if err := reg.SetPool(registry.PoolPolicy{
		Name: "bench", Generation: 1, BaseURL: upstream, Dialect: "Auto",
		Models: []registry.ModelPolicy{
			{Name: "sim", TokensPerMinute: 100_000_000_000, RequestsPerMinute: 100_000_000},
			{Name: "sim-1mb", TokensPerMinute: 100_000_000_000, RequestsPerMinute: 100_000_000},
		},
		ReservePercent:         20,
		CostModel:              limiter.CostModel{InputWeight: 1, OutputWeight: 4, KVBlockTokens: 16},
		DefaultMaxOutputTokens: 4096,
		IdentMode:              registry.IdentifyAPIKey,
		Quantum:                4096,
		MaxQueuedJobs:          100000,
		UpstreamTimeout:        120 * time.Second,
	}); err != nil {
		return err
	}
	lim := limiter.Limits{
		WeightedPerMinute: ptr(1_000_000_000_000), WeightedBurst: ptr(10_000_000_000),
		RequestsPerMinute: ptr(1_000_000_000), RequestBurst: ptr(10_000_000),
		MaxConcurrent: ptr(100_000), MaxKVBlocks: ptr(1_000_000_000),
	}
	for i := range tenants {
		if err := reg.UpsertTenant(registry.TenantPolicy{
			ID: fmt.Sprintf("t%d", i), Name: fmt.Sprintf("t%d", i), Generation: 1, Limits: lim, Weight: 1,
			MaxQueued: registry.DefaultMaxQueuedPerTenant, DefaultDeadline: time.Hour,
			KeyHashes: []registry.KeyHash{registry.HashKey(TenantKey(i))},
		}); err != nil {
			return err
		}
	}
	reg.SetTenantsSynced()
	prom := prometheus.NewRegistry()
	prom.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.New(prom, func() registry.Snapshot { return reg.Snapshot(clk.Now()) })
	gw := gateway.New(gateway.Options{Registry: reg, Clock: clk, Metrics: m, Store: jobs.NewMemStore(clk, 0, 0),
		UpstreamConcurrency: conc, Log: log.WithName("gateway")})
	// As the scheduler does before it can be ready.
	if err := tokencount.Load(); err != nil {
		return err
	}

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := gateway.NewServer(gw, gateway.ServerOptions{})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	runCtx, cancelRun := context.WithCancel(context.Background())
	runDone := make(chan struct{})
	go func() { defer close(runDone); _ = gw.Run(runCtx) }()
	go func() { _ = srv.Serve(ln) }()
	fmt.Printf("listening %s\n", ln.Addr())
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	cancelRun()
	select {
	case <-runDone:
	case <-time.After(2 * time.Second):
	}
	if memprofile != "" {
		if f, err := os.Create(memprofile); err == nil {
			_ = pprof.Lookup("allocs").WriteTo(f, 0)
			_ = f.Close()
		}
	}
	return nil
}
