// Package faults tests the gateway against upstream faults: the real
// gateway (internal/gateway) in front of the real provider simulator
// (internal/providersim), both on 127.0.0.1, with the simulator's fault
// injection (providersim.Fault). One row per fault and path (interactive,
// interactive streaming, batch job) asserts the client's status, error
// type and code, Retry-After, the exact refund (the tenant's token bucket
// and its usage counters), the release of concurrency slots and KV blocks,
// the number of upstream attempts (the simulator's counters) and the
// model's pause. The outcome table is in docs/reliability.md.
//
// The gateway runs on a fake clock, so the buckets do not refill, retry
// backoffs and pauses are exact, and the test advances the clock only
// while a job waits for its retry or the end of a pause. Upstream
// timeouts are real time (the pool's timeout is 1 s).
package faults
