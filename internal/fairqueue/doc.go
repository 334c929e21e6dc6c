// Package fairqueue is the batch scheduler's fair queue: deficit round robin
// (M. Shreedhar and G. Varghese, "Efficient fair queueing using deficit round
// robin", SIGCOMM 1995) across tenants, by weighted token cost (seed 000, "Fair
// queueing by cost" and "Backpressure and deadlines").
//
// Every tenant with queued work is in the round. A visit to a tenant adds one
// quantum, scaled by the tenant's weight, to its deficit; the tenant then
// dispatches jobs while its deficit covers the cost of its head job, and the
// round moves on when it does not. A tenant with ten thousand queued jobs thus
// gets the same share of weighted tokens per round as a tenant with one, a
// tenant whose jobs are ten times larger gets a tenth of the jobs, and a weight
// of three gets three times the tokens. A tenant whose queue empties leaves the
// round with its deficit reset to 0, so it cannot bank credit while idle
// (BC-34).
//
// Backpressure: a per-tenant bound (by count and optionally by weighted
// tokens) and a pool-wide bound; one tenant's full queue never blocks another's
// enqueue (seed 000). Deadlines: every job may carry a deadline; expired jobs
// are dropped, returned to the caller, and never charged to the deficit
// (BC-35, BC-37). Sweep drops expired jobs everywhere, so they stop counting
// toward the bounds as soon as they expire, not only when the round reaches
// them; a coarse deadline index (one bucket per second of deadline) keeps
// Sweep cheap when nothing has expired.
//
// Eligibility: Dequeue takes a predicate that says whether a tenant may start
// its head job now (its limiter's concurrency, KV blocks and token bucket). An
// ineligible tenant is skipped without losing its place in the round or its
// deficit, and gains no quantum while skipped; if no tenant is eligible after
// one full pass, Dequeue returns nil rather than spinning. With Lookahead set,
// a tenant whose head does not fit may dispatch a later job that does (a large
// KV request must not block small ones, BC-32), at most MaxBypass times per
// head job, so the large job's wait stays bounded; a job the predicate calls
// TenantIneligible (no job of the tenant could start) ends the lookahead. The
// scheduler sets Lookahead under the pool's queueingStrategy BestEffortFIFO
// (the default; registry.LookaheadJobs).
//
// Aging and the wait bound (seed 002 section 6: "add aging so a low-weight
// tenant doesn't starve indefinitely"). DRR alone already bounds the wait: a
// job of cost c at the head of a weight-w tenant's queue is dispatched by the
// tenant's ceil(c/(Quantum*w))-th visit, and between two visits every other
// tenant j dispatches at most Quantum*w_j + C_j - 1 weighted tokens (C_j its
// largest job), so at most ceil(c/(Quantum*w)) * sum_j(Quantum*w_j + C_j - 1)
// tokens go to others first (RoundTokens, WaitBound). With quantum 1000, a
// weight-1 tenant's 8000-token job against a weight-100 tenant of 1000-token
// jobs waits exactly 800,000 tokens (bound 807,992). Config.MaxWaitTokens
// caps that: the queue counts weighted tokens dispatched pool-wide (one
// counter) and notes, per tenant, the count when its head job became head;
// once the difference reaches MaxWaitTokens, the tenant's next eligible visit
// raises its deficit to the job's cost, so the job goes on that visit and the
// wait is at most MaxWaitTokens - 1 + sum_j(Quantum*w_j + C_j - 1). This is
// O(1) (one comparison per visit, 8 bytes per tenant, nothing per job). Set
// above the DRR bound of the tenants' normal jobs, aging never fires and the
// shares are exactly DRR's; set below it, a low-weight tenant's large job is
// served sooner, at the price of a share above its weight for that job. The
// wait in seconds is the bound divided by the pool's rate in weighted tokens
// per second. The bounds assume every tenant eligible and not deprioritised,
// no Lookahead bypass and no Requeue; an ineligible or deprioritised
// competitor only lowers the tokens that pass.
//
// Cost: O(1) amortised per job, no allocation per job beyond the caller's
// Job (amortised slice growth only), and only compact per-tenant data on the
// hot path. Each tenant's FIFO is a ring of job pointers (8 bytes a slot,
// power-of-two length); a job knows its ring position, so Cancel, a
// Lookahead dispatch and Sweep remove it in O(1) by leaving a tombstone,
// which the ring skips at its ends and compacts once tombstones outnumber
// live jobs. Tenants are linked into the round. The deadline index is one
// slice of tickets (job pointers) per second of deadline; a job knows its
// ticket's position, so a removal clears that slot and touches no other job.
// A full slice whose cleared prefix is at least half of it moves its live
// tail down without touching a job (positions are absolute, with a base, as
// in the rings): the common case, as jobs leave roughly in the order they
// came; one at least half cleared elsewhere is compacted. The queue keeps no
// index by job ID: the
// caller keeps the *Job (the gateway does, by ID) and passes it to Cancel.
// Enqueue finds the tenant by name (one map lookup); EnqueueTo with a
// TenantRef skips it. SetCost reprices a queued job in O(1) (the scheduler
// reprices every queued job when the pool's cost model changes). The
// queue's own state is 16 bytes inside Job plus about 40 bytes a job
// outside it (ring slot, ticket, share of the tenant
// state) at ten jobs per tenant; see docs/benchmarks.md, "Fair queue".
//
// A Queue is not safe for concurrent use: the caller serialises every call
// with its own lock (the scheduler holds one mutex around the queue and the
// limiter checks made from the eligibility predicate). Time is a parameter.
package fairqueue
