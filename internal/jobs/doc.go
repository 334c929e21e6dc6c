// Package jobs stores batch jobs: one OpenAI-style request submitted to
// POST /v1/jobs, its place in the job life cycle and its result.
//
// Life cycle (brief "data plane contract", seed 000 "Backpressure and
// deadlines"):
//
//	queued ──► running ──► succeeded
//	  │  ▲        │
//	  │  └────────┤ (upstream 429 or 5xx: back to queued, attempts+1)
//	  │           └──► failed    (non-retryable upstream answer, deadline
//	  │                           reached while retrying, tenant removed)
//	  ├──► expired    (deadline reached before it was sent; never charged)
//	  └──► cancelled  (DELETE /v1/jobs/{id} while queued)
//
// Store is the persistence contract; MemStore keeps jobs in memory, retains
// finished jobs for a retention period and up to a bounded count shared
// fairly between tenants (the tenant holding the most loses its oldest
// first), and can be replaced by a durable store (for example bbolt)
// without touching callers.
// The store never decides scheduling: the fair queue and the dispatcher do.
package jobs
