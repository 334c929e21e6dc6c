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
// Measured in steady state over Measure (20 s), after a warm-up that ends
// on an event rather than after a fixed time (a loaded machine drains the
// initially full buckets slowly, and a burst inside the measurement would
// read as over 100%): the simulator's quota first runs short
// (providersim.Stats.FirstExhausted); where fixed windows or sub-windows
// bind, that is enough; for continuous buckets, Settle (1 s) later, the
// quota runs short again (Stats.LastExhausted) or some bucket holds at most
// 5% of what it refills over the measurement (Server.Levels), so the
// measurement starts with no surplus in the buckets;
// at the latest SettleMax (5 s) after Settle; the pacer, which never
// bursts, after Warmup (5 s). The run
// fails if the warm-up has not ended after MaxWarmup (45 s; the gateway
// took 5-28 s to drain anthropic-tokens' bucket in our runs). The
// measurement then starts at the next window or sub-window boundary for the
// fixed-window dialects and Azure, so it covers whole windows:
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
// openai, azure, ietf and anthropic-tokens; for anthropic, separate input
// and output buckets of 24,000 ITPM and 36,000 OTPM (both binding at 10
// requests/s; the simulator's default Anthropic headers: input-tokens and
// output-tokens triplets, remaining rounded to the nearest thousand);
// anthropic-tokens has one bucket described by the tokens triplet only,
// rounded down. anthropic-refund sends max_tokens 200 for 20 generated
// tokens (180 refunded per request) against 24,000 ITPM and 12,000 OTPM
// (10 requests/s: 400 input and 200 net output tokens per second); its
// utilisation counts the tokens finally billed (60 per request). 600 RPM for
// classic and ietf-legacy; 5 s fixed windows for classic, ietf and
// ietf-legacy; 10 s sub-windows for Azure.
//
// TestGoodputGateway asserts, per scenario, no 429 in the measurement and
// a utilisation within [90%, 105%]; where the dialect rounds remaining
// (Anthropic: a 1,000-token step that can hide that much in each bucket),
// no 429 and at least 80%.
//
// Run: go test -run '^$' -bench Goodput -benchtime 1x -timeout 30m ./test/goodput/
// (about 12 minutes: 24 runs of 25-40 s). TestGoodputGateway is the short
// assertion that `make test-goodput` runs (all scenarios at once, about
// 15-45 s).
package goodput
