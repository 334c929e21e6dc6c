// Package throttle paces calls to an LLM provider from what the provider says
// is left of its quota, one Throttle per (ProviderPool, model).
//
// Two parts:
//
//   - Header parsing (headers.go, sf.go): ParseHeaders reads every rate-limit
//     dialect a provider may speak — OpenAI and Azure OpenAI
//     x-ratelimit-{limit,remaining,reset}-{requests,tokens}, Anthropic
//     anthropic-ratelimit-*, the classic X-RateLimit-{Limit,Remaining,Reset},
//     the IETF draft-ietf-httpapi-ratelimit-headers structured fields
//     (RateLimit / RateLimit-Policy, draft-10/11) and the older
//     RateLimit-{Limit,Remaining,Reset} form (draft-03..06) — and keeps the
//     most restrictive figure per dimension (provider tokens, requests, and
//     Anthropic's separate input tokens and output tokens: ITPM and OTPM,
//     from the anthropic-ratelimit-{input,output}-tokens-* triplets, never
//     summed into provider tokens): the least remaining, which a figure
//     with more left but a later reset caps past its reset
//     (Dimension.Beyond).
//     ParseHeadersDialect (and Throttle.ParseHeaders with Config.Dialect)
//     restricts parsing to the ProviderPool's dialect hint, so that headers a
//     proxy adds in another dialect are ignored; "Auto" is ParseHeaders.
//     A quota's window, when the provider states it (Dimension.Window: an
//     IETF policy's w, draft-10 section 3.1.3, or the w of a draft-03 or
//     Envoy policy list), is kept with the figure, and a remaining without
//     a reset ends at the latest with that window.
//     ParseRetryAfter reads retry-after-ms, x-ms-retry-after-ms and
//     Retry-After (delay-seconds or any RFC 9110 HTTP-date form); a value
//     merged into a list or sent as several field lines (RFC 9110 section
//     5.3) is read as its largest valid member, and remaining and reset
//     values as their least and latest. Absolute times (RFC 3339 and
//     epoch resets, a Retry-After HTTP-date) are read against the
//     response's Date when it is more than SkewTolerance from the local
//     clock: they are instants of the provider's clock. Malformed,
//     negative, NaN or out-of-range values are ignored and counted, never
//     turned into "no wait" or "wait forever".
//
//   - The adaptive throttle (throttle.go): per dimension it keeps the
//     provider's last figure (limit, remaining, reset) and the calls started
//     since, estimates the remaining quota in between (continuous token-bucket
//     replenishment for OpenAI, Azure and Anthropic; a fixed window for the
//     classic and IETF fields), keeps a reserve of the limit for interactive
//     traffic that batch work may not use, caps the starts of a fixed
//     window at its limit whatever order the figures arrive in, paces
//     starts evenly once a 429 comes while the figures said the call fitted
//     (Azure's sub-windows), pauses every start after a 429
//     until the provider's Retry-After or reset, and spreads the callers
//     released after a pause over a jitter window so they do not return as
//     a herd. A limit whose figure is stale (or that came without a
//     remaining) is counted with a sliding window log over its stated
//     window, 60 s when none is stated. Without provider figures it paces
//     from the configured per-minute hints with a sliding 60 s window log,
//     and without hints it
//     lets one probe call through at a time until a response says something.
//     The input and output dimensions count only once Anthropic figures
//     describe them (unknown, they never block); their remaining, rounded
//     to the nearest thousand, is read as a band in which the throttle keeps
//     its own estimate; the unused max_tokens of a call, refunded by the
//     provider at its end (DoneTokens), returns to output; and while the
//     input and output figures describe the provider's token quota alone,
//     the summed tokens hint does not pace.
//
// Time is always a parameter (now time.Time), x/time/rate style: the package
// has no clock, no goroutines and no I/O. A wait returned by TryStart may be
// long (a provider's Retry-After of days is represented exactly); callers
// must compare it with their own deadline and context and give up instead of
// sleeping past it (BC-12).
//
// Units: provider tokens are what the provider counts against the account
// (prompt + max output tokens); input tokens are the prompt, output tokens
// the max output (Cost, TryStartCost); requests count 1 per call. Durations are
// time.Duration; per-minute hints are per 60 s.
//
// Sources: the rules follow the seed article "One rate limit, many tenants"
// (sections "Reading the quota instead of guessing it", "The adaptive
// throttle", "Two paths, one quota"), the provider header reference, RFC 9110
// sections 10.2.3 (Retry-After) and 5.3 (field lines combined into a list),
// RFC 9651 (Structured Fields), draft-ietf-httpapi-ratelimit-headers-10
// sections 3.1.3 (w) and 4.1.2 (t), and the
// regression cases BC-02, BC-03, BC-05, BC-07, BC-11, BC-12, BC-13 and BC-39;
// for Anthropic's input and output buckets the provider header reference,
// Anthropic section ("OTPM rate limits are estimated based on max_tokens at
// the beginning of each request, and the estimate is adjusted at the end").
package throttle
