// Package limiter is the per-tenant admission limiter of the data plane: a
// token bucket and a tenant limiter that enforces three dimensions at once
// (seed 002 sections 2, 3 and 5).
//
//   - Token rate, in weighted tokens (input*w_in + output*w_out, see
//     CostModel) and optionally in provider input and output tokens. Rates are
//     published per minute and enforced smoothly by token buckets refilled
//     continuously from the elapsed time (rate/60 tokens per second), so a
//     60,000/min plan cannot spend 60,000 in its first second unless its burst
//     allows it (seed 002 section 5, BC-16). Refills are summed with Kahan
//     compensation, so no rounding accumulates over millions of operations.
//   - Concurrency and memory: requests in flight and KV-cache blocks held.
//   - Request rate, a secondary limit.
//
// Admission charges the estimate up front, prompt + max output tokens, because
// the output length is unknown until the response ends; completion refunds the
// difference from the provider's usage figures (charge-then-refund, seed 002
// section 3). Unlike the seed's sketch, every check happens before any charge,
// so a refusal charges nothing (BC-20); refunds are computed from the
// reservation record, clamped to the bucket capacity and applied exactly once
// (BC-15, BC-23); usage above the charge becomes debt rather than being
// forgiven (BC-29); and concurrency and KV blocks are released on every exit
// path (Complete, Cancel, or Abandon for a call its client left after it was
// sent: tokens refunded, the request kept charged).
//
// Under Limits.DryRun (the TenantQuota's DryRun enforcement mode) every
// decision is computed and nothing is refused: a request Enforce would refuse
// is admitted with a shadow Reservation that charges nothing and reports the
// refusal (Reservation.DryRunRejection), so the limiter state, and with it
// every later decision, is exactly that of the same tenant under Enforce.
//
// Admission allocates nothing with Tenant.AdmitInto (the reservation lives in
// the caller's per-request struct); Tenant.Admit carves reservations from
// shared slabs. docs/benchmarks.md compares both with golang.org/x/time/rate.
//
// Time is always a parameter (now time.Time), in the style of
// golang.org/x/time/rate, so tests drive a fake clock.
package limiter
