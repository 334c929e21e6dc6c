package fairqueue

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"sort"
	"time"
)

// Sentinel errors of Enqueue; test with errors.Is.
var (
	// ErrTenantFull: the tenant's queue is at its bound (count or tokens); the
	// gateway answers 429 `queue_full` (seed 000 "Backpressure", BC-38).
	ErrTenantFull = errors.New("fairqueue: tenant queue full")
	// ErrPoolFull: the pool-wide bound Config.MaxTotal is reached.
	ErrPoolFull = errors.New("fairqueue: pool queue full")
	// ErrDuplicateID: this *Job is already queued. The queue does not
	// compare IDs: keeping them unique is the caller's job.
	ErrDuplicateID = errors.New("fairqueue: job already queued")
	// ErrExpired: the job's deadline is not after now (BC-37).
	ErrExpired = errors.New("fairqueue: job deadline already passed")
	// ErrInvalidJob: the job is nil, has an empty ID, or a cost below 1.
	ErrInvalidJob = errors.New("fairqueue: invalid job")
)

// DefaultQuantum is the quantum used when Config.Quantum is below 1, in
// weighted tokens (the ProviderPool's quantumTokens default).
const DefaultQuantum int64 = 4096

// Granularity is the width of one bucket of the deadline index: Sweep drops a
// whole bucket without looking at its jobs once its end has passed, and
// examines the jobs of the bucket that contains now one by one.
const Granularity = time.Second

// Job is one queued unit of batch work.
//
//   - ID identifies the job for the caller (the queue does not index it; the
//     caller keeps its own records by ID and passes the *Job to Cancel).
//     Tenant names its queue.
//   - Cost is its estimated cost in weighted tokens (CostModel.Cost's Weighted:
//     prompt*w_in + max_output*w_out), at least 1; the deficit is charged this.
//   - Deadline: the job expires at this instant (zero: never). Expired jobs
//     are never dispatched (BC-37).
//   - Value is the caller's payload (the request body, a job record).
//
// A Job belongs to the queue from Enqueue (or Requeue) until Dequeue, Cancel
// or Sweep returns it; the caller must not change it meanwhile. The queue
// keeps 16 bytes of its own inside Job (ring position, deadline slot,
// arrival number, bypass count, flags).
type Job struct {
	ID, Tenant string
	Cost       int64
	Deadline   time.Time
	Value      any

	pos      uint32 // absolute position in the tenant's ring; its slot is pos & mask
	dpos     uint32 // absolute position of its ticket in its deadline bucket (when ticketed)
	seq      uint32 // order of arrival (Enqueue; kept by Requeue), wrapping: see before
	bypassed uint8  // times overtaken through Lookahead while head (at most MaxBypass)
	queued   bool
	ticketed bool // in the deadline index
	overtook bool // dispatched through Lookahead, past its tenant's head
}

// before reports whether j was enqueued before k (their arrival numbers
// within 2^31 of each other, as two jobs of one tenant's queue are).
func (j *Job) before(k *Job) bool { return int32(j.seq-k.seq) < 0 }

// expiredAt reports whether the job's deadline is at or before now.
func (j *Job) expiredAt(now time.Time) bool {
	return !j.Deadline.IsZero() && !now.Before(j.Deadline)
}

// Config configures a Queue.
//
//   - Quantum: weighted tokens added to a weight-1 tenant's deficit per round
//     (ProviderPool spec quantumTokens); below 1 means DefaultQuantum.
//   - MaxTotal: the pool-wide bound on queued jobs; 0 means none.
//   - DefaultWeight: the weight of tenants without SetTenant; below 1 means 1.
//   - DefaultMaxQueued: the per-tenant bound for tenants without SetTenant; 0
//     means none.
//   - DefaultMaxQueuedTokens: the per-tenant bound on queued weighted tokens
//     for tenants without SetTenantMaxTokens; 0 means none.
//   - Lookahead: when a tenant's head job is ineligible, how many further jobs
//     of that tenant Dequeue may consider (0: strictly FIFO per tenant).
//   - MaxBypass: how many times a head job may be overtaken through Lookahead
//     before it blocks its tenant until it is dispatched (below 1 means 4,
//     above 255 means 255), which bounds the wait of a large job (BC-32).
//   - DeprioritisedDivisor: a tenant whose job the eligibility test calls
//     Deprioritised (over a soft limit) receives its quantum divided by this
//     on that visit (below 1 means DefaultDeprioritisedDivisor), so while it
//     stays over its limit it gets 1/divisor of its weighted share of a
//     contended queue (seed 002 section 5, soft limit: "admit but
//     deprioritise"); alone it still gets everything (work-conserving).
//   - MaxWaitTokens: aging (seed 002 section 6, "add aging so a low-weight
//     tenant doesn't starve indefinitely"), in weighted tokens dispatched
//     pool-wide; 0 turns aging off. When a tenant's head job has been its
//     head while at least MaxWaitTokens tokens were dispatched, the tenant's
//     next eligible visit raises its deficit to the job's Cost, so the job is
//     dispatched on that visit: within one more round. See AgingBound for the
//     resulting bound and RoundBound for the bound DRR gives without aging.
type Config struct {
	Quantum                int64
	MaxTotal               int
	DefaultWeight          int64
	DefaultMaxQueued       int
	DefaultMaxQueuedTokens int64
	Lookahead              int
	MaxBypass              int
	DeprioritisedDivisor   int64
	MaxWaitTokens          int64
}

// DefaultDeprioritisedDivisor is Config.DeprioritisedDivisor's default: a
// tenant over its soft limit competes with a quarter of its weight.
const DefaultDeprioritisedDivisor int64 = 4

// Eligibility is an eligibility test's answer for a tenant's job in
// DequeueWith.
type Eligibility uint8

const (
	// Ineligible: the tenant cannot start the job now (a limit binds); it is
	// passed over without losing its place or deficit.
	Ineligible Eligibility = iota
	// Eligible: the tenant may start the job now.
	Eligible
	// Deprioritised: the tenant may start the job but is over a soft limit;
	// its quantum on this visit is divided by Config.DeprioritisedDivisor.
	Deprioritised
	// TenantIneligible: the tenant can start none of its jobs now, whatever
	// their size or model (the scheduler: its concurrency or request rate
	// binds): as Ineligible, and Lookahead does not look past this job.
	TenantIneligible
)

// tenantQ is one tenant's FIFO queue and round-robin state. The FIFO is a
// ring of job pointers: ring[s & (len(ring)-1)] holds the job at absolute
// position s for head <= s < tail (uint32 arithmetic, wrapping). A job
// removed from the middle (Cancel, Lookahead dispatch, Sweep) leaves a nil
// tombstone; tombstones are skipped at both ends at once and compacted away
// when they outnumber the live jobs, so head is always a live job.
type tenantQ struct {
	name       string
	ring       []*Job // length a power of two, or nil
	head, tail uint32
	n          int
	tokens     int64
	deficit    int64
	weight     int64    // 0: Config.DefaultWeight
	maxQueued  int      // meaningful when countSet
	maxTokens  int64    // meaningful when tokensSet
	prev, next *tenantQ // the round (ring of active tenants)
	mark       uint64   // pass in which the tenant was last eligible
	need       int64    // cost of the job it wanted in that pass
	headAt     int64    // Queue.served when the current head job became head
	configured bool     // SetTenant or SetTenantMaxTokens was called: keep when empty
	countSet   bool
	tokensSet  bool
	active     bool
	dep        bool // deprioritised in the pass of mark
	gone       bool // forgotten (no longer in Queue.tenants)
}

// minRing is the smallest ring a tenant gets; rings longer than maxIdleRing
// are released when the tenant's queue empties.
const (
	minRing     = 4
	maxIdleRing = 64
)

func (t *tenantQ) mask() uint32 { return uint32(len(t.ring) - 1) }

// first returns the head job, or nil when the queue is empty.
func (t *tenantQ) first() *Job {
	if t.n == 0 {
		return nil
	}
	return t.ring[t.head&t.mask()]
}

// makeRoom frees one slot in a full ring: by compacting when at least half
// of the slots are tombstones, else by doubling the ring.
func (t *tenantQ) makeRoom() {
	used := int(t.tail - t.head)
	if used < len(t.ring) {
		return
	}
	if used > 0 && used-t.n >= used/2 && t.n < used {
		t.compact()
		return
	}
	t.resize(max(minRing, 2*len(t.ring)))
}

// resize moves the ring to size slots (a power of two, at least the used
// slots). Positions do not change, so no job is touched.
func (t *tenantQ) resize(size int) {
	old, oldMask := t.ring, t.mask()
	t.ring = make([]*Job, size)
	mask := t.mask()
	for s := t.head; s != t.tail; s++ {
		t.ring[s&mask] = old[s&oldMask]
	}
}

// compact moves the live jobs to consecutive positions from head, dropping
// the tombstones, and updates their positions. O(used slots).
func (t *tenantQ) compact() {
	mask := t.mask()
	w := t.head
	for s := t.head; s != t.tail; s++ {
		j := t.ring[s&mask]
		if j == nil {
			continue
		}
		if s != w {
			t.ring[w&mask] = j
			t.ring[s&mask] = nil
			j.pos = w
		}
		w++
	}
	t.tail = w
}

// pushBack appends j at the tail.
func (t *tenantQ) pushBack(j *Job) {
	t.makeRoom()
	j.pos = t.tail
	t.ring[t.tail&t.mask()] = j
	t.tail++
}

// pushFront puts j before the head.
func (t *tenantQ) pushFront(j *Job) {
	t.makeRoom()
	t.head--
	j.pos = t.head
	t.ring[t.head&t.mask()] = j
}

// unlink removes j from the ring (t.n is still counting it): the head and
// the tail skip tombstones, and tombstones are compacted once they outnumber
// the remaining live jobs.
func (t *tenantQ) unlink(j *Job) {
	mask := t.mask()
	t.ring[j.pos&mask] = nil
	switch {
	case t.n == 1:
		t.head, t.tail = 0, 0
		return
	case j.pos == t.head:
		for t.head++; t.ring[t.head&mask] == nil; t.head++ {
		}
	case j.pos == t.tail-1:
		for t.tail--; t.ring[(t.tail-1)&mask] == nil; t.tail-- {
		}
	}
	live := t.n - 1
	used := int(t.tail - t.head)
	if used-live > live && used-live >= minRing {
		t.compact()
	}
	if len(t.ring) > maxIdleRing && live*8 < len(t.ring) && int(t.tail-t.head) <= len(t.ring)/4 {
		t.resize(len(t.ring) / 4)
	}
}

// dbucket holds the deadline tickets of the queued jobs whose deadline falls
// in [key, key+1) * Granularity since the Unix epoch, in the order they were
// given. A ticket has an absolute position (uint32 arithmetic, wrapping, as
// the tenants' rings): tickets[p - base] for head <= p - base < len(tickets).
// A removal clears its job's slot (nil), so the jobs still ticketed are
// exactly the non-nil slots and nothing else is ever read to tell them
// apart; the head skips cleared slots at once. When an append finds the
// slice full, a cleared prefix of at least half the slice is dropped by
// moving the slots down and raising base (positions do not change, so no
// job is touched: the common case, as jobs leave roughly in the order they
// came); else, when at least half the slots are cleared, the live ones are
// compacted and their jobs' positions rewritten; else the slice grows.
type dbucket struct {
	key     int64
	tickets []*Job
	base    uint32 // absolute position of tickets[0]
	head    int    // tickets[:head] are cleared
	live    int    // non-nil slots
	idx     int    // position in the heap
}

// add appends j's ticket and sets j.dpos.
func (b *dbucket) add(j *Job) {
	if n := len(b.tickets); n == cap(b.tickets) && n >= minRing {
		switch {
		case b.head >= n/2:
			kept := copy(b.tickets, b.tickets[b.head:])
			clear(b.tickets[kept:])
			b.tickets = b.tickets[:kept]
			b.base += uint32(b.head)
			b.head = 0
		case n >= 2*b.live:
			b.compact()
		}
	}
	j.dpos = b.base + uint32(len(b.tickets))
	j.ticketed = true
	b.tickets = append(b.tickets, j)
	b.live++
}

// clearTicket clears j's slot; the head skips cleared slots.
func (b *dbucket) clearTicket(j *Job) {
	i := int(j.dpos - b.base)
	b.tickets[i] = nil
	j.ticketed = false
	b.live--
	if i == b.head {
		for b.head < len(b.tickets) && b.tickets[b.head] == nil {
			b.head++
		}
	}
}

// compact moves the live tickets down to positions base, base+1, ... in
// their order and rewrites their jobs' dpos. O(tickets).
func (b *dbucket) compact() {
	w := 0
	for _, j := range b.tickets[b.head:] {
		if j != nil {
			b.tickets[w] = j
			j.dpos = b.base + uint32(w)
			w++
		}
	}
	clear(b.tickets[w:])
	b.tickets = b.tickets[:w]
	b.head = 0
}

type bucketHeap []*dbucket

func (h bucketHeap) Len() int           { return len(h) }
func (h bucketHeap) Less(i, j int) bool { return h[i].key < h[j].key }
func (h bucketHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i]; h[i].idx = i; h[j].idx = j }
func (h *bucketHeap) Push(x any)        { b := x.(*dbucket); b.idx = len(*h); *h = append(*h, b) }
func (h *bucketHeap) Pop() any {
	old := *h
	b := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return b
}

// Queue is a deficit-round-robin fair queue of jobs across tenants. It is not
// safe for concurrent use: the caller holds a lock around every call.
type Queue struct {
	cfg     Config
	tenants map[string]*tenantQ
	total   int

	cur     *tenantQ // tenant whose turn it is; nil when no tenant is active
	granted bool     // cur has received its quantum for this visit
	nActive int
	pass    uint64
	served  int64  // weighted tokens dispatched so far (the aging clock)
	seq     uint32 // arrival number of the latest job enqueued (Job.seq)

	// last is the job the latest Dequeue returned and lastDeficit its
	// tenant's deficit before that job was charged, so that Requeue can undo
	// the Dequeue exactly, even when it emptied the tenant's queue.
	last        *Job
	lastDeficit int64
	lastHeadAt  int64
	// lastPassed is the head job the latest Dequeue's Lookahead passed over
	// (its bypass count raised), nil when it returned the head.
	lastPassed *Job
	sink       int64 // written by warm so that its load is kept

	buckets map[int64]*dbucket
	bheap   bucketHeap
	lastB   *dbucket // bucket of the latest insertion or removal
	freeB   []*dbucket
}

// New returns an empty queue.
func New(cfg Config) *Queue {
	return &Queue{
		cfg:     cfg.normalized(),
		tenants: make(map[string]*tenantQ),
		buckets: make(map[int64]*dbucket),
	}
}

// normalized returns cfg with its defaults filled in.
func (cfg Config) normalized() Config {
	if cfg.Quantum < 1 {
		cfg.Quantum = DefaultQuantum
	}
	if cfg.DefaultWeight < 1 {
		cfg.DefaultWeight = 1
	}
	if cfg.MaxBypass < 1 {
		cfg.MaxBypass = 4
	}
	cfg.MaxBypass = min(cfg.MaxBypass, math.MaxUint8) // Job.bypassed
	if cfg.DeprioritisedDivisor < 1 {
		cfg.DeprioritisedDivisor = DefaultDeprioritisedDivisor
	}
	cfg.Lookahead = max(0, cfg.Lookahead)
	return cfg
}

// SetConfig applies cfg live, to the queue as it stands (issue: "changing
// ... applies to queued work as it stands"): no queued job is dropped or
// reordered and every tenant keeps its deficit and place in the round; a
// new Quantum or weight default applies from the next quantum granted, a
// lower MaxTotal only refuses new jobs, and MaxWaitTokens counts waits from
// when each head job became head (tracked whether aging was on or not).
func (q *Queue) SetConfig(cfg Config) { q.cfg = cfg.normalized() }

func (q *Queue) weight(t *tenantQ) int64 {
	if t.weight > 0 {
		return t.weight
	}
	return q.cfg.DefaultWeight
}

// quantum is what t's deficit gains per visit: Quantum * weight, divided by
// DeprioritisedDivisor (at least 1) while t is deprioritised.
func (q *Queue) quantum(t *tenantQ) int64 {
	per := q.cfg.Quantum * q.weight(t)
	if t.dep {
		per = max(1, per/q.cfg.DeprioritisedDivisor)
	}
	return per
}

func (q *Queue) tenant(name string) *tenantQ {
	t := q.tenants[name]
	if t == nil {
		t = &tenantQ{name: name}
		q.tenants[name] = t
	}
	return t
}

// SetTenant configures a tenant live (from its TenantQuota): weight (below 1
// means Config.DefaultWeight) and maxQueued, the bound on its queued jobs (0:
// no job may be queued, as spec.batch.maxQueuedJobs 0; below 0: no bound). It
// applies to the queue as it stands: queued jobs are never dropped, a lowered
// bound only refuses new jobs, and a new weight applies from the tenant's next
// quantum.
func (q *Queue) SetTenant(tenant string, weight int64, maxQueued int) {
	t := q.tenant(tenant)
	t.configured, t.countSet = true, true
	t.weight = max(0, weight)
	t.maxQueued = maxQueued
}

// SetTenantMaxTokens bounds the weighted tokens tenant may have queued
// (below 1: no bound), alongside the count bound (BC-38). Like SetTenant it
// applies live and never drops queued jobs.
func (q *Queue) SetTenantMaxTokens(tenant string, maxTokens int64) {
	t := q.tenant(tenant)
	t.configured = true
	t.tokensSet = true
	t.maxTokens = maxTokens
}

// RemoveTenant forgets a tenant's configuration (its TenantQuota was
// deleted): it falls back to the defaults. Its queued jobs stay.
func (q *Queue) RemoveTenant(tenant string) {
	t := q.tenants[tenant]
	if t == nil {
		return
	}
	t.configured, t.countSet, t.tokensSet, t.weight = false, false, false, 0
	if t.n == 0 {
		q.forget(t)
	}
}

// forget drops an empty, unconfigured tenant's state; handles on it
// (TenantRef) are redirected to a fresh state on their next use.
func (q *Queue) forget(t *tenantQ) {
	delete(q.tenants, t.name)
	t.gone = true
}

// TenantRef is a handle on one tenant's queue state, from Queue.Tenant:
// EnqueueTo with it spares Enqueue the lookup of the tenant by name (a
// string hash and a map probe, the largest cost of Enqueue with 100k
// tenants). The zero TenantRef is not valid.
type TenantRef struct{ t *tenantQ }

// Name returns the tenant's name.
func (r TenantRef) Name() string { return r.t.name }

// Valid reports whether r is a handle from Queue.Tenant (false for the zero
// TenantRef, which EnqueueTo refuses).
func (r TenantRef) Valid() bool { return r.t != nil }

// Tenant returns a handle on the named tenant's queue state, creating it.
// The state is then kept while empty, as after SetTenant, until
// RemoveTenant; a handle used after RemoveTenant forgot the tenant still
// works (EnqueueTo then queues as Enqueue by name).
func (q *Queue) Tenant(name string) TenantRef {
	t := q.tenant(name)
	t.configured = true
	return TenantRef{t}
}

// Enqueue appends j to its tenant's queue at now. Errors: ErrInvalidJob (nil,
// empty ID, Cost < 1), ErrExpired (deadline at or before now),
// ErrDuplicateID (this *Job is already queued; the queue does not compare
// IDs, the caller keeps them unique), ErrTenantFull (the tenant's count or
// token bound), ErrPoolFull (Config.MaxTotal), each wrapped with details. A
// tenant that was not in the round joins it at the end with a deficit of 0
// (BC-34). O(1) amortised: one tenant map lookup, one ring slot and one
// deadline ticket.
func (q *Queue) Enqueue(now time.Time, j *Job) error {
	if j == nil || j.ID == "" || j.Cost < 1 {
		return ErrInvalidJob
	}
	return q.enqueue(now, q.tenants[j.Tenant], j)
}

// EnqueueTo is Enqueue for the tenant of ref (from Queue.Tenant), with the
// same errors; it sets j.Tenant to the tenant's name. It costs one tenant
// state and one ring slot, without hashing the name. A ref whose tenant was
// forgotten (RemoveTenant, then its queue emptied) queues as Enqueue by name
// would: into the tenant's current state, or a new unconfigured one, which
// is forgotten again once empty.
func (q *Queue) EnqueueTo(now time.Time, ref TenantRef, j *Job) error {
	if j == nil || j.ID == "" || j.Cost < 1 || ref.t == nil {
		return ErrInvalidJob
	}
	t := ref.t
	if t.gone {
		j.Tenant = t.name
		return q.enqueue(now, q.tenants[t.name], j)
	}
	j.Tenant = t.name
	return q.enqueue(now, t, j)
}

// enqueue is Enqueue with j's tenant state looked up (nil: none yet).
func (q *Queue) enqueue(now time.Time, t *tenantQ, j *Job) error {
	if j.expiredAt(now) {
		return ErrExpired
	}
	if j.queued {
		return fmt.Errorf("%w: %q", ErrDuplicateID, j.ID)
	}
	limit, maxTokens := -1, q.cfg.DefaultMaxQueuedTokens // limit -1: no count bound
	if q.cfg.DefaultMaxQueued > 0 {
		limit = q.cfg.DefaultMaxQueued
	}
	n, tokens := 0, int64(0)
	if t != nil {
		n, tokens = t.n, t.tokens
		if t.countSet {
			limit = max(-1, t.maxQueued)
		}
		if t.tokensSet {
			maxTokens = t.maxTokens
		}
	}
	if limit >= 0 && n >= limit {
		return fmt.Errorf("%w: tenant %q has %d jobs queued (max %d)", ErrTenantFull, j.Tenant, n, limit)
	}
	if maxTokens > 0 && tokens+j.Cost > maxTokens {
		return fmt.Errorf("%w: tenant %q has %d weighted tokens queued, job needs %d (max %d)", ErrTenantFull, j.Tenant, tokens, j.Cost, maxTokens)
	}
	if q.cfg.MaxTotal > 0 && q.total >= q.cfg.MaxTotal {
		return fmt.Errorf("%w: %d jobs queued (max %d)", ErrPoolFull, q.total, q.cfg.MaxTotal)
	}
	if t == nil {
		t = q.tenant(j.Tenant)
	}
	j.bypassed = 0
	q.seq++
	j.seq = q.seq
	t.pushBack(j)
	q.added(t, j)
	return nil
}

// added accounts for j, already in t's ring.
func (q *Queue) added(t *tenantQ, j *Job) {
	j.queued = true
	t.n++
	t.tokens += j.Cost
	q.total++
	q.indexDeadline(j)
	if !t.active {
		q.activate(t)
	}
}

// activate puts t at the end of the round with a deficit of 0.
func (q *Queue) activate(t *tenantQ) {
	t.active = true
	t.deficit = 0
	t.headAt = q.served
	if q.cur == nil {
		t.prev, t.next = t, t
		q.cur, q.granted = t, false
	} else {
		t.prev, t.next = q.cur.prev, q.cur
		q.cur.prev.next = t
		q.cur.prev = t
	}
	q.nActive++
}

// deactivate takes an empty tenant out of the round and resets its deficit
// (BC-34); an unconfigured empty tenant is forgotten.
func (q *Queue) deactivate(t *tenantQ) {
	if !t.active {
		return
	}
	t.active = false
	t.deficit = 0
	if t.next == t {
		q.cur = nil
	} else {
		t.prev.next = t.next
		t.next.prev = t.prev
		if q.cur == t {
			q.cur, q.granted = t.next, false
		}
	}
	t.prev, t.next = nil, nil
	q.nActive--
	if len(t.ring) > maxIdleRing {
		t.ring, t.head, t.tail = nil, 0, 0
	}
	if !t.configured && t.n == 0 {
		q.forget(t)
	}
}

// remove takes a queued job out of its tenant's ring and the deadline
// index; it leaves the deficit alone except that a tenant whose queue
// empties leaves the round. It touches no other job (except when a
// compaction of tombstones is due).
func (q *Queue) remove(t *tenantQ, j *Job) {
	if j.pos == t.head { // the next job becomes head: its wait starts now
		t.headAt = q.served
	}
	t.unlink(j)
	q.unindexDeadline(j)
	j.queued = false
	t.n--
	t.tokens -= j.Cost
	q.total--
	if t.n == 0 {
		q.deactivate(t)
	}
}

// advance moves the turn to the next tenant in the round.
// keepTurn restores the turn (cursor and grant) saved at the start of a
// Dequeue that dispatched nothing because no tenant was eligible, so that
// such calls neither move the round on nor grant quanta: a passed-over
// tenant keeps its place.
func (q *Queue) keepTurn(cur *tenantQ, granted, everEligible bool) {
	if everEligible || cur == nil || !cur.active {
		return
	}
	q.cur, q.granted = cur, granted
}

func (q *Queue) advance() {
	q.cur, q.granted = q.cur.next, false
}

// Dequeue returns the next job to dispatch at now by deficit round robin, and
// the expired jobs it dropped on the way (never charged to a deficit, BC-35,
// BC-37). eligible(tenant, job) reports whether the tenant may start that job
// now (its limiter allows it); nil means every tenant is eligible.
//
// The tenant whose turn it is gets Quantum*weight added to its deficit once
// per visit and dispatches its head job if the deficit covers the job's Cost
// (the deficit is charged the Cost); otherwise the turn moves on and the
// deficit is kept, so a job costing several quanta is served after a few
// rounds. An ineligible tenant is passed over without losing its place or its
// deficit and gains nothing while passed over. Dequeue returns nil when no
// job is queued or after one full pass in which no tenant was eligible; it is
// work-conserving: while any tenant is eligible, it returns a job, so a lone
// eligible tenant gets everything. Expired jobs are dropped from the head of
// each tenant visited; a tenant whose turn it still is but whose deficit is
// spent (below 1 weighted token) is passed over without reading its jobs, so
// its expired head jobs are dropped on its next visit or by Sweep. O(1)
// amortised per returned job when tenants are eligible.
func (q *Queue) Dequeue(now time.Time, eligible func(tenant string, head *Job) bool) (next *Job, expired []*Job) {
	if eligible == nil {
		return q.DequeueWith(now, nil)
	}
	return q.DequeueWith(now, func(tenant string, j *Job) Eligibility {
		if eligible(tenant, j) {
			return Eligible
		}
		return Ineligible
	})
}

// DequeueWith is Dequeue with a three-way eligibility test: a tenant whose
// job is Deprioritised (over a soft limit) may dispatch it, but its deficit
// grows by its quantum divided by Config.DeprioritisedDivisor on that visit.
// nil means every tenant is Eligible.
func (q *Queue) DequeueWith(now time.Time, eligible func(tenant string, head *Job) Eligibility) (next *Job, expired []*Job) {
	q.pass++
	seen, anyEligible := 0, false
	// A call that finds no eligible tenant must leave the round as it found
	// it: otherwise the turn would rotate and the tenant at the cursor would be
	// granted a fresh quantum on every such call (for example while the
	// upstream is paused), starving the others.
	startCur, startGranted, everEligible := q.cur, q.granted, false
	for q.cur != nil {
		t := q.cur
		if q.granted && t.deficit < 1 && !q.agedTenant(t) {
			// The tenant has had its quantum for this visit and spent it:
			// no job (Cost >= 1) can go, so its visit ends without reading
			// its jobs. It is not counted as seen, so it comes round again
			// (with a fresh quantum) before this call can give up; its
			// expired head jobs are dropped then or by Sweep.
			q.advance()
			continue
		}
		for j := t.first(); j != nil && j.expiredAt(now); j = t.first() {
			q.remove(t, j)
			expired = append(expired, j)
		}
		if !t.active { // emptied by expiry; remove moved the turn on
			if seen >= q.nActive {
				if !anyEligible || !q.fastForward() {
					q.keepTurn(startCur, startGranted, everEligible)
					return nil, expired
				}
				seen, anyEligible = 0, false
			}
			continue
		}
		if pick, el := q.pick(t, now, eligible); pick != nil {
			anyEligible, everEligible = true, true
			t.mark, t.need, t.dep = q.pass, pick.Cost, el == Deprioritised
			if !q.granted {
				t.deficit += q.quantum(t)
				q.granted = true
			}
			if pick.Cost > t.deficit && q.aged(t, pick) {
				t.deficit = pick.Cost // aging: served on this visit
			}
			if pick.Cost <= t.deficit {
				q.lastPassed, pick.overtook = nil, pick != t.first()
				if pick.overtook {
					q.lastPassed = t.first()
					q.lastPassed.bypassed++
				}
				q.last, q.lastDeficit, q.lastHeadAt = pick, t.deficit, t.headAt
				t.deficit -= pick.Cost
				q.served += pick.Cost
				q.remove(t, pick)
				q.warm()
				return pick, expired
			}
		}
		q.advance()
		seen++
		if seen >= q.nActive {
			if !anyEligible || !q.fastForward() {
				q.keepTurn(startCur, startGranted, everEligible)
				return nil, expired
			}
			seen, anyEligible = 0, false
		}
	}
	return nil, expired
}

// warm reads the head job of the tenant the next Dequeue will examine first
// (the one at the turn, or the next in the round when the one at the turn
// has spent its quantum), so that its
// cache miss overlaps with the caller's work instead of stalling that
// Dequeue: with 1M queued jobs the head job is almost never in cache.
func (q *Queue) warm() {
	t := q.cur
	if t == nil {
		return
	}
	if q.granted && t.deficit < 1 {
		t = t.next
	}
	if t.n > 0 {
		q.sink += t.ring[t.head&t.mask()].Cost
	}
}

// agedTenant reports whether t's head job, whichever it is, has waited as
// head while at least Config.MaxWaitTokens weighted tokens were dispatched.
func (q *Queue) agedTenant(t *tenantQ) bool {
	return q.cfg.MaxWaitTokens > 0 && q.served-t.headAt >= q.cfg.MaxWaitTokens
}

// aged reports whether pick is t's head job and has waited, as head, while
// at least Config.MaxWaitTokens weighted tokens were dispatched.
func (q *Queue) aged(t *tenantQ, pick *Job) bool {
	return q.cfg.MaxWaitTokens > 0 && pick == t.first() && q.served-t.headAt >= q.cfg.MaxWaitTokens
}

// pick returns the job tenant t would dispatch now: its head if eligible,
// else, with Lookahead, the first eligible live job among the next Lookahead
// ones, unless the head has been bypassed MaxBypass times already or a job
// examined is TenantIneligible (no other job of t could start either).
func (q *Queue) pick(t *tenantQ, now time.Time, eligible func(string, *Job) Eligibility) (*Job, Eligibility) {
	head := t.first()
	if eligible == nil {
		return head, Eligible
	}
	el := eligible(t.name, head)
	if el == Eligible || el == Deprioritised {
		return head, el
	}
	if el == TenantIneligible || q.cfg.Lookahead == 0 || int(head.bypassed) >= q.cfg.MaxBypass {
		return nil, Ineligible
	}
	mask := t.mask()
	for s, seen := t.head+1, 0; s != t.tail && seen < q.cfg.Lookahead; s++ {
		j := t.ring[s&mask]
		if j == nil { // tombstone: not a job
			continue
		}
		seen++
		if !j.expiredAt(now) {
			switch el := eligible(t.name, j); el {
			case Eligible, Deprioritised:
				return j, el
			case TenantIneligible:
				return nil, Ineligible
			}
		}
	}
	return nil, Ineligible
}

// fastForward runs, in one step, the rounds in which every eligible tenant
// would only accumulate deficit: after a full pass in which eligible tenants
// existed but none could afford its job, it credits each of them (k-1)
// quanta, k being the fewest rounds any of them needs. The next pass then
// dispatches. It reports false if it found no eligible tenant.
func (q *Queue) fastForward() bool {
	if q.cur == nil {
		return false
	}
	k := int64(math.MaxInt64)
	t := q.cur
	for {
		if t.mark == q.pass {
			per := q.quantum(t)
			rounds := (t.need - t.deficit + per - 1) / per
			k = min(k, max(1, rounds))
		}
		if t = t.next; t == q.cur {
			break
		}
	}
	if k == math.MaxInt64 {
		return false
	}
	for {
		if t.mark == q.pass {
			t.deficit += (k - 1) * q.quantum(t)
		}
		if t = t.next; t == q.cur {
			break
		}
	}
	q.pass++
	return true
}

// Requeue puts a job returned by Dequeue back at the head of its tenant's
// queue (the upstream refused it, e.g. 429) and gives back the deficit it was
// charged, so it is not charged twice. Bounds do not apply (the job was
// already admitted). A job that is queued is left alone.
//
// A job Lookahead dispatched past its tenant's head goes back behind that
// head, which stays head with its wait as head kept; when it undoes the
// latest Dequeue, the head's bypass count is given back too, so that the
// head is passed over at most MaxBypass times in all. That undo is nearly
// always a start refused before anything was sent; it can also be a call
// the provider refused (429, 5xx) with no dispatch since, which the
// scheduler refunds and whose slots it releases before the Requeue: the
// pass took the head nothing it waits for (docs/architecture.md).
// When the tenant's head is no longer a job that came before it (the head
// it passed was dispatched, cancelled or expired meanwhile), it goes back
// at the head like any other job, never behind a job that came after it.
func (q *Queue) Requeue(j *Job) {
	if j == nil || j.ID == "" || j.Cost < 1 || j.queued {
		return
	}
	t := q.tenant(j.Tenant)
	// Undo of the latest Dequeue that emptied the tenant's queue: the tenant
	// left the round then; it comes back at the turn and with the deficit it
	// had, instead of at the end of the round (which would starve a tenant
	// whose last job the throttle keeps refusing).
	undo := j == q.last && !t.active
	last := j == q.last
	q.last = nil
	if h := t.first(); j.overtook && h != nil && h.before(j) {
		j.overtook = false
		if last && h == q.lastPassed && h.bypassed > 0 {
			h.bypassed--
		}
		q.lastPassed = nil
		// In front, then swapped with the head it passed: second.
		t.pushFront(j)
		hs, js := h.pos&t.mask(), j.pos&t.mask()
		t.ring[hs], t.ring[js] = j, h
		h.pos, j.pos = j.pos, h.pos
		q.added(t, j)
		t.deficit += j.Cost
		if last {
			q.served -= j.Cost // the dispatch no longer counts on the aging clock
		}
		return
	}
	j.overtook = false
	q.lastPassed = nil
	t.pushFront(j)
	q.added(t, j)
	t.headAt = q.served // the job is head again; its wait restarts
	if last {
		// The dispatch is undone: it no longer counts on the aging clock,
		// and the job's wait as head resumes where it was.
		q.served -= j.Cost
		t.headAt = q.lastHeadAt
	}
	if undo {
		q.cur, q.granted, t.deficit = t, true, q.lastDeficit
		return
	}
	t.deficit += j.Cost
}

// Cancel removes j from the queue and reports whether it was queued (false:
// never enqueued, or already returned by Dequeue, Cancel or Sweep). O(1)
// amortised: one tenant map lookup; the job's ring slot becomes a tombstone.
// The tenant's deficit is untouched. The queue keeps no index by ID: the
// caller finds the *Job in its own records.
func (q *Queue) Cancel(j *Job) bool {
	if j == nil || !j.queued {
		return false
	}
	q.remove(q.tenants[j.Tenant], j)
	return true
}

// Queued reports whether j is in the queue.
func (q *Queue) Queued(j *Job) bool { return j != nil && j.queued }

// SetCost changes the Cost of a queued job to cost weighted tokens (at least
// 1) and reports whether j was queued. The caller reprices queued jobs when
// the unit of cost changes (the pool's cost model: the scheduler charges a
// job's deficit, like its limiter, in the weighted tokens of the cost model
// in force at dispatch, not of the one at submission), so that two identical
// jobs cost the same whichever was queued first. The job keeps its place;
// the tenant's deficit is untouched and its queued tokens follow; the bounds
// are not checked again (the job was admitted). A job not queued (returned
// by Dequeue and not put back) keeps its Cost: Requeue gives back to the
// deficit what Dequeue charged. O(1).
func (q *Queue) SetCost(j *Job, cost int64) bool {
	if j == nil || !j.queued {
		return false
	}
	cost = max(cost, 1)
	q.tenants[j.Tenant].tokens += cost - j.Cost
	j.Cost = cost
	return true
}

// bucketKey returns the deadline bucket of d and false when d is beyond the
// range of Unix nanoseconds (such a job is never swept, only checked at
// dequeue).
func bucketKey(d time.Time) (int64, bool) {
	const maxSec = math.MaxInt64/int64(time.Second) - 1
	sec := d.Unix()
	if sec > maxSec || sec < -maxSec {
		return 0, false
	}
	ns := sec*int64(time.Second) + int64(d.Nanosecond())
	k := ns / int64(Granularity)
	if ns < 0 && ns%int64(Granularity) != 0 {
		k--
	}
	return k, true
}

// bucket returns the deadline bucket with the given key, or nil.
func (q *Queue) bucket(key int64) *dbucket {
	if b := q.lastB; b != nil && b.key == key {
		return b
	}
	b := q.buckets[key]
	if b != nil {
		q.lastB = b
	}
	return b
}

// indexDeadline gives j a ticket in the bucket of its deadline (none for no
// deadline or one beyond Unix nanoseconds).
func (q *Queue) indexDeadline(j *Job) {
	j.ticketed = false
	if j.Deadline.IsZero() {
		return
	}
	key, ok := bucketKey(j.Deadline)
	if !ok {
		return
	}
	b := q.bucket(key)
	if b == nil {
		if n := len(q.freeB); n > 0 {
			b, q.freeB = q.freeB[n-1], q.freeB[:n-1]
		} else {
			b = &dbucket{}
		}
		b.key = key
		q.buckets[key] = b
		heap.Push(&q.bheap, b)
		q.lastB = b
	}
	b.add(j)
}

// unindexDeadline clears j's ticket (j is leaving the queue); a bucket left
// without tickets is dropped.
func (q *Queue) unindexDeadline(j *Job) {
	if !j.ticketed {
		return
	}
	key, _ := bucketKey(j.Deadline)
	b := q.bucket(key)
	b.clearTicket(j)
	if b.live == 0 {
		q.dropBucket(b)
	}
}

// dropBucket removes an empty bucket from the index and keeps it for reuse
// (its slices too, unless they are large).
func (q *Queue) dropBucket(b *dbucket) {
	heap.Remove(&q.bheap, b.idx)
	delete(q.buckets, b.key)
	if q.lastB == b {
		q.lastB = nil
	}
	if len(q.freeB) < 64 {
		if cap(b.tickets) > 1024 {
			b.tickets = nil
		}
		clear(b.tickets)
		b.tickets, b.base, b.head = b.tickets[:0], 0, 0
		q.freeB = append(q.freeB, b)
	}
}

// Sweep removes every job whose deadline is at or before now, wherever it is
// queued, and returns them in deadline-bucket order (BC-35: expired jobs stop
// counting toward the bounds at once, not when the round reaches them). It
// never touches a deficit, except that a tenant whose queue empties leaves the
// round. When nothing has expired it costs O(1) plus the tickets of the
// current one-second deadline bucket.
func (q *Queue) Sweep(now time.Time) []*Job {
	var out []*Job
	nowKey, ok := bucketKey(now)
	if !ok {
		nowKey = math.MaxInt64
	}
	for len(q.bheap) > 0 {
		b := q.bheap[0]
		if b.key > nowKey {
			break
		}
		whole := b.key < nowKey       // every deadline in b is before now's bucket
		tickets := b.tickets[b.head:] // the last removal may recycle b
		for _, j := range tickets {
			if j != nil && (whole || j.expiredAt(now)) {
				q.remove(q.tenants[j.Tenant], j)
				out = append(out, j)
			}
		}
		if q.bheap.Len() > 0 && q.bheap[0] == b {
			break // jobs of now's bucket that have not expired yet
		}
	}
	return out
}

// Len returns the number of jobs queued for tenant.
func (q *Queue) Len(tenant string) int {
	if t := q.tenants[tenant]; t != nil {
		return t.n
	}
	return 0
}

// Total returns the number of jobs queued in the pool.
func (q *Queue) Total() int { return q.total }

// Deficit returns tenant's deficit, in weighted tokens (0 when the tenant is
// not in the round).
func (q *Queue) Deficit(tenant string) int64 {
	if t := q.tenants[tenant]; t != nil {
		return t.deficit
	}
	return 0
}

// TenantStats is one tenant's queue state: jobs and weighted tokens queued,
// deficit in weighted tokens, and effective weight.
type TenantStats struct {
	Tenant  string
	Queued  int
	Tokens  int64
	Deficit int64
	Weight  int64
}

// Tenants returns the state of every known tenant (queued work or
// configured), sorted by name.
func (q *Queue) Tenants() []TenantStats {
	out := make([]TenantStats, 0, len(q.tenants))
	for _, t := range q.tenants {
		out = append(out, TenantStats{Tenant: t.name, Queued: t.n, Tokens: t.tokens, Deficit: t.deficit, Weight: q.weight(t)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Tenant < out[j].Tenant })
	return out
}

// TenantLoad describes one competing tenant for RoundTokens: its weight and
// the largest Cost among its jobs, in weighted tokens.
type TenantLoad struct {
	Weight, MaxCost int64
}

// RoundTokens returns the most weighted tokens the tenants in others can
// dispatch between two consecutive visits of the round to some other tenant:
// the sum over others of quantum*Weight + MaxCost - 1. A tenant leaves a visit
// with a deficit below the cost of its head job (at most MaxCost-1), gains
// quantum*Weight on its next visit and dispatches at most what it then holds
// (Shreedhar and Varghese 1995, lemma 2; seed 002 section 6, aging).
func RoundTokens(quantum int64, others []TenantLoad) int64 {
	var r int64
	for _, o := range others {
		r += quantum*max(1, o.Weight) + max(1, o.MaxCost) - 1
	}
	return r
}

// WaitBound returns the most weighted tokens dispatched to other tenants
// between a job of the given cost becoming the head of a tenant's queue and
// its dispatch, the tenant having the given weight, with quantum and maxWait
// as Config.Quantum and Config.MaxWaitTokens, and others as for RoundTokens.
// Without aging (maxWait 0) the job needs at most ceil(cost/(quantum*weight))
// visits, each preceded by at most one round: ceil(cost/(quantum*weight)) *
// RoundTokens. With aging the job is dispatched on the first visit at which
// at least maxWait tokens have passed, so the bound is also at most
// maxWait - 1 + RoundTokens; WaitBound returns the smaller. It holds while
// every tenant is eligible, none is deprioritised (a deprioritised tenant's
// quantum is divided by Config.DeprioritisedDivisor), no Lookahead bypass and
// no Requeue happens, and others lists every tenant active during the wait.
// To bound the wait in seconds, divide by the pool's dispatch rate in
// weighted tokens per second.
func WaitBound(quantum, weight, cost, maxWait int64, others []TenantLoad) int64 {
	per := quantum * max(1, weight)
	round := RoundTokens(quantum, others)
	b := (cost + per - 1) / per * round
	if maxWait > 0 {
		b = min(b, maxWait-1+round)
	}
	return b
}
