// Package goodput measures how much of a provider's quota a client gets
// through without being refused, against the provider simulator
// (internal/providersim) enforcing a real quota in each rate-limit dialect,
// all in one process on 127.0.0.1 and the real clock.
//
// Three clients drain the same backlog of identical batch requests, each
// against a fresh simulator with the same quota:
//
//   - gateway: the Fairshare gateway (internal/gateway, configured without
//     Kubernetes: registry.New, SetPool, UpsertTenant, gateway.New), the
//     backlog submitted as one POST /v1/jobs/bulk upload; the adaptive
//     throttle (internal/throttle) paces the upstream calls from the
//     provider's headers.
//   - naive: the openai-go SDK (github.com/openai/openai-go/v3) with its
//     default retry policy (2 retries; Retry-After / retry-after-ms honoured
//     up to 60 s, else 0.5 s x 2^n backoff capped at 8 s with up to 25%
//     jitter), the same number of workers as the gateway's upstream
//     concurrency, each resending a request that failed after its retries.
//   - pacer: fixed-rate pacing at the nominal limit: one request every
//     quota-unit interval (the request's charge divided by the per-second
//     quota), whatever the responses say; a refused request is simply
//     sent again at a later tick.
//
// Measured in steady state, after a warm-up (Warmup, 5 s, then up to the
// next window or sub-window boundary for the fixed-window dialects and
// Azure, so the measurement covers whole windows) over Measure (20 s):
//
//   - utilisation: the quota units (tokens, or requests in the classic and
//     ietf-legacy dialects, whose headers count requests) the simulator
//     accepted from requests that arrived in the measurement window, over the
//     quota of that window (per-minute quota / 60 x 20 s);
//   - 429s: the 429 responses the simulator sent for requests that arrived in
//     the measurement window (the warm-up's are reported apart).
//
// Every request costs exactly 100 tokens (40 prompt + 60 max_tokens, all
// generated, so nothing is refunded), and the simulator answers after 20 ms.
// The quotas: 60,000 TPM (1,000 tokens/s, 10 requests/s) and 1,200 RPM for
// the token-counting dialects; 600 RPM for classic and ietf-legacy; 5 s fixed
// windows for classic, ietf and ietf-legacy; 10 s sub-windows for Azure.
//
// Run: go test -run '^$' -bench Goodput -benchtime 1x ./test/goodput/
// (about 9 minutes: 18 runs of 25-35 s). TestGoodputGateway is the short
// assertion that `make test` runs (about 20 s).
package goodput
