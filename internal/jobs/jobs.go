package jobs

import (
	"encoding/json"
	"errors"
	"time"
)

// Status is a job's place in its life cycle (see the package doc).
type Status string

// Job statuses, as returned by the job API.
const (
	// StatusQueued: waiting in the fair queue (or for a retry backoff).
	StatusQueued Status = "queued"
	// StatusRunning: the upstream call is in flight.
	StatusRunning Status = "running"
	// StatusSucceeded: the provider answered 2xx; Response and Usage are set.
	StatusSucceeded Status = "succeeded"
	// StatusFailed: the job will not run (again); Error says why.
	StatusFailed Status = "failed"
	// StatusExpired: the deadline passed before the job was sent; it was
	// never charged (BC-35, BC-37).
	StatusExpired Status = "expired"
	// StatusCancelled: the tenant cancelled the job while it was queued.
	StatusCancelled Status = "cancelled"
)

// Finished reports whether s is a terminal status.
func (s Status) Finished() bool {
	switch s {
	case StatusSucceeded, StatusFailed, StatusExpired, StatusCancelled:
		return true
	}
	return false
}

// Valid reports whether s is one of the six statuses.
func (s Status) Valid() bool {
	return s == StatusQueued || s == StatusRunning || s.Finished()
}

// Usage is the provider's usage of a succeeded job, in provider tokens.
type Usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
}

// Error is why a job failed or expired: a machine-readable Code
// (for example "deadline_exceeded", "upstream_error", "tenant_removed") and
// a human-readable Message.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Job is one batch job. Body, Metadata and Response are treated as
// immutable once stored: the store hands out copies of Job that share them.
type Job struct {
	// ID is assigned by Store.Create: "job_" + 32 hex digits, the store
	// sequence and generation encrypted (MemStore.newID); opaque, it does
	// not sort in submission order. Files written by earlier versions may
	// hold ids of the form "job_" + 16 hex digits of the sequence + 8
	// random hex digits.
	ID string
	// Tenant is the owning tenant id; other tenants never see the job.
	Tenant string
	// Status is the life-cycle status.
	Status Status
	// Endpoint is the OpenAI path the body is sent to, for example
	// "/v1/chat/completions".
	Endpoint string
	// Model is the body's "model".
	Model string
	// Body is the request body sent upstream (never streaming).
	Body json.RawMessage
	// PromptTokens and MaxOutputTokens are the cost estimate at submission,
	// in provider tokens (brief "cost model").
	PromptTokens, MaxOutputTokens int64
	// Metadata is the caller's opaque metadata object, returned as given.
	Metadata json.RawMessage
	// CreatedAt is the submission time; StartedAt the first upstream call
	// (zero until then); FinishedAt the time of the terminal status.
	CreatedAt, StartedAt, FinishedAt time.Time
	// Deadline is the time after which the job is not sent any more.
	Deadline time.Time
	// Attempts is the number of upstream calls made.
	Attempts int
	// DispatchSeq is the job's position (1-based) in the pool's global
	// dispatch order, of its latest upstream call; 0 until dispatched.
	DispatchSeq int64
	// QueueWait is StartedAt - CreatedAt, the time spent queued before the
	// first upstream call (0 when a clock that went back made it negative).
	QueueWait time.Duration
	// Usage is the provider's usage of a succeeded job.
	Usage *Usage
	// Response is the provider's JSON body of a succeeded job, or of the
	// refusal that failed a job (a 4xx, or a 413/429 for a request over the
	// provider's limit), when it was JSON, with the provider key redacted.
	// The bodies of answers that are retried (5xx, 408, 429) are not kept.
	Response json.RawMessage
	// Error says why the job failed, expired or was cancelled.
	Error *Error
	// Recovered is set when the job was running when the scheduler stopped
	// and was queued again: at restart for a scheduler that was killed
	// (issue "Durable job store": jobs that were running are requeued and
	// marked as retried), or at once by a scheduler that stops gracefully
	// with the job's upstream call in flight. Delivery toward the
	// provider is at-least-once: the provider may have received and
	// processed the interrupted call, and the job is sent again.
	Recovered bool
	// WebhookURL, when not empty, is the http or https URL POSTed the job
	// (its API view) once it reaches a terminal status (docs/api.md
	// "Batch jobs", completion webhook).
	WebhookURL string
	// WebhookStatus is the delivery state of the completion webhook: ""
	// (no webhook, or the job is not finished), "pending", "delivered" or
	// "failed" (attempts exhausted, refused, or dropped).
	WebhookStatus string
	// WebhookAttempts is the number of webhook delivery attempts made.
	WebhookAttempts int
	// IdempotencyKey, when not empty, is the key the tenant submitted the
	// job under (the Idempotency-Key request header of POST /v1/jobs, or a
	// bulk line's idempotencyKey; docs/api.md "Idempotent submission"):
	// 1 to 255 printable ASCII characters. A store holds at most one job
	// per (Tenant, IdempotencyKey) (ErrIdempotencyKeyHeld) until that job
	// is deleted or pruned. Set at Create and never changed.
	IdempotencyKey string `json:",omitempty"`
	// IdempotencyFingerprint is the hex SHA-256 (64 characters) of what
	// defined the job at submission, compared with a retry's under the same
	// key; empty without a key. Set at Create and never changed.
	IdempotencyFingerprint string `json:",omitempty"`

	seq uint64
}

// Errors returned by Store implementations.
var (
	// ErrNotFound: no job with that id (or it was pruned after retention).
	ErrNotFound = errors.New("job not found")
	// ErrInvalidCursor: the "after" cursor is not a job id of this store.
	ErrInvalidCursor = errors.New("invalid cursor")
	// ErrIdempotencyKeyHeld: Create was given a job whose (Tenant,
	// IdempotencyKey) another stored job holds; that job is returned with
	// it and nothing is written.
	ErrIdempotencyKeyHeld = errors.New("idempotency key held by a stored job")
)

// Filter selects jobs for Store.List.
type Filter struct {
	// Status, when not empty, keeps only jobs in that status.
	Status Status
	// After, when not empty, is a job id: only jobs submitted after it are
	// listed (keyset paging; the id need not still exist).
	After string
	// Limit is the page size; <= 0 means no limit.
	Limit int
}

// PendingLister is implemented by stores that can list every queued or
// running job of all tenants in submission order (MemStore, BoltStore): the
// jobs a restarted scheduler queues again.
type PendingLister interface {
	Pending() []Job
}

// WebhookPending is the WebhookStatus of a job whose completion webhook is
// being delivered.
const WebhookPending = "pending"

// WebhookLister is implemented by stores that can list the finished jobs
// whose completion webhook was not delivered yet (MemStore, BoltStore): a
// restarted scheduler delivers them again.
type WebhookLister interface {
	UndeliveredWebhooks() []Job
}

// DispatchSeqLister is implemented by stores that can tell the largest
// DispatchSeq of the jobs they hold (MemStore, BoltStore): a restarted
// scheduler numbers its dispatches after it, so that dispatch_seq keeps
// ordering the pool's calls across restarts.
type DispatchSeqLister interface {
	MaxDispatchSeq() int64
}

// Store persists jobs. Implementations are safe for concurrent use and
// return copies of Job.
type Store interface {
	// Create assigns j an ID and stores it; it returns the stored job.
	// When j.IdempotencyKey is set and a stored job of j.Tenant holds the
	// same key, nothing is stored: Create returns that job and
	// ErrIdempotencyKeyHeld (checked and inserted under the store's lock,
	// so concurrent Creates with one key store one job).
	Create(j Job) (Job, error)
	// ByIdempotencyKey returns the stored job of tenant that holds key, and
	// false when none does (none was created with it, or it was deleted or
	// pruned). Another tenant's key never matches.
	ByIdempotencyKey(tenant, key string) (Job, bool)
	// Get returns the job with that id, or ErrNotFound.
	Get(id string) (Job, error)
	// Update applies fn to the stored job under the store's lock and
	// returns the result; an error from fn aborts the update and is
	// returned as is. ErrNotFound when the id is unknown.
	Update(id string, fn func(j *Job) error) (Job, error)
	// Delete removes a job (a submission that could not be queued).
	Delete(id string) error
	// List returns the tenant's jobs in submission order that match f, and
	// whether more matching jobs follow the page. ErrInvalidCursor when
	// f.After is not an id of this store's format.
	List(tenant string, f Filter) ([]Job, bool, error)
	// Counts returns the number of stored jobs per status, for all tenants.
	Counts() map[Status]int
}
