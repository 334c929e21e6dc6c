// Package httpbench benchmarks the Fairshare gateway over HTTP next to the
// peers a user would otherwise run, in one run on one machine, and reports
// ratios (brief "Performance targets"; the rules of the benchmark method,
// open loop, interleaved peers, CPU per request, are summarised here).
//
// # Processes
//
// Every program is its own process, built with `go build` into a temporary
// directory (Build), so that the RSS and the CPU of each peer are its own:
//
//   - cmd/upstream, the loopback mock provider (instant, or 20 ms before its
//     headers; SSE: 64 frames 20 ms apart);
//   - cmd/proxy, the peer: a plain httputil.ReverseProxy;
//   - cmd/gateway, the Fairshare gateway as the scheduler builds it, with 1
//     or 10,000 tenants identified by API key.
//
// The load generator is this process (the vegeta library for fixed-rate
// loads, a plain net/http client for SSE). Every peer of an experiment talks
// to the same upstream process; "direct" is the client talking to the
// upstream itself. Only 127.0.0.1 is ever addressed.
//
// # Method
//
//   - Open loop: requests are sent at a fixed arrival rate whatever the
//     answers (vegeta's constant pacer), so a slow peer queues requests and
//     its tail shows it (no coordinated omission). Keep-alive connections; a
//     request that takes more than 1 s, or any status but 200, is an error.
//   - Interleaving: each experiment runs several rounds, and in each round
//     every peer in turn (direct, proxy, gateway ...) gets the same load, so
//     drifts of the shared machine hit every peer alike. Raw latencies of all
//     rounds are kept per peer and exact (nearest-rank) percentiles computed.
//   - Added latency: a percentile of a peer minus the same percentile of
//     direct over the same rounds (µs); the cost of the extra hop. Requests
//     do not overlap in that experiment (concurrency 1 by a low rate).
//   - CPU per request: utime+stime of the peer process from /proc/PID/stat
//     (clock ticks of 1/100 s, so 10,000 µs each) read before and after each
//     of its load phases, summed over rounds, divided by its requests. The
//     load generator's own CPU is not counted.
//   - RSS: VmRSS of /proc/PID/status, in MB of 2^20 bytes; at idle also
//     RssAnon (heap, stacks: what grows with tenants and load), the rest
//     being pages of the binary (code, read-only data) the process touched.
//   - Frontier: a ladder of rates, every peer at each rate in turn; a peer's
//     figure for a bound is the highest rate whose p99 stayed under the bound
//     with no error (0 if none); a peer leaves the ladder once it errs or its
//     p99 passes the largest bound. The bounds are the upstream's latency
//     plus 5, 10 and 50 ms: 5, 10, 50 ms (units rps-p99-5ms, -10ms, -50ms)
//     against the instant upstream, 25, 30, 70 ms against the 20 ms one.
//
// All processes share the machine's cores (the load generator included), so
// absolute figures are of this machine only; compare peers of one run.
//
// Results are written in the Go benchmark format (golang.org/x/perf/benchfmt)
// with one line per (experiment, peer), named BenchmarkHTTP<Exp>/<key=value>...;
// the iteration count is the number of measured requests (or streams).
package httpbench
