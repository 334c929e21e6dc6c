package jobs

import (
	"container/heap"
	"container/list"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"sort"
	"strconv"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// Defaults of MemStore retention.
const (
	// DefaultRetention is how long finished jobs stay readable: 24 hours.
	DefaultRetention = 24 * time.Hour
	// DefaultMaxFinished bounds the finished jobs kept across all tenants:
	// 100,000, shared between them by the rule of MemStore.
	DefaultMaxFinished = 100000
)

// MemStore is an in-memory Store. Queued and running jobs are never pruned.
// Finished jobs (succeeded, failed, expired, cancelled) are pruned by two
// rules, applied at the clock's now by every write and every read (Get,
// List, Counts, UndeliveredWebhooks), so a finished job past its retention
// is never served, also by an idle store:
//
//   - Retention: a finished job goes once retention has passed since its
//     FinishedAt, whatever its tenant, oldest finished first.
//   - Bound: while the pool holds more than maxFinished finished jobs, the
//     oldest finished job of the tenant that holds the most finished jobs
//     goes (ties: the tenant whose oldest finished job finished first).
//     This is longest queue drop, the fair buffer-sharing policy of
//     per-flow queueing (Suter et al., "Design considerations for
//     supporting TCP with per-flow queueing", INFOCOM 1998): a tenant
//     holding no more than maxFinished / (number of tenants holding
//     finished jobs) finished jobs loses none of them to the bound, so a
//     tenant that finishes a large import pushes out its own oldest
//     results, not those of tenants holding few.
//
// "Finished first" is the order in which jobs reached a finished status in
// this store (for jobs loaded by a BoltStore: by FinishedAt, ties in
// submission order). Each prune costs O(log t) for t tenants holding
// finished jobs (a heap of tenants by finished count), with no scan over
// tenants or jobs; a tenant's share of the index is released once it
// holds no jobs.
type MemStore struct {
	clock       clock.PassiveClock
	retention   time.Duration
	maxFinished int

	// ids turns sequence numbers into job ids and back (newID, seqOf):
	// AES-128 under the store's own key, set before the store is used and
	// never changed.
	ids cipher.Block
	// legacyMax is the largest sequence number an id of the earlier form
	// (legacyIDLen) may carry: the store's sequence when a version that
	// encrypts ids first opened its file (0: the store never held such
	// ids). Set before the store is used and never changed.
	legacyMax uint64
	// gen is a random number drawn when the store is made (never 0) and
	// written into every id it hands out (newID), so that a store opened
	// on an older copy of its file (a restored backup), whose sequence
	// numbers go back, never hands out an id it handed out before.
	gen uint32

	mu       sync.Mutex
	seq      uint64
	byID     map[string]*entry
	byTenant map[string]*tenantJobs
	// byKey indexes the jobs stored with an idempotency key by (tenant,
	// key): a map entry of two string headers and a pointer (40 bytes,
	// about 80 with the map's overhead) per keyed job; the strings are the
	// job's own. The job holds the key and its 64-byte fingerprint.
	byKey    map[idemKey]*entry
	finished *list.List // of *entry, in finish order
	// finSeq numbers the jobs in finish order (entry.finSeq): the last
	// number given.
	finSeq uint64
	// fullest are the tenants holding finished jobs, as a heap: the tenant
	// that holds the most first, ties by the finSeq of its oldest finished
	// job (tenantHeap.Less). The bound prunes the oldest finished job of
	// fullest[0].
	fullest tenantHeap
	counts  map[Status]int

	// persist, when set (BoltStore), writes every change through before it
	// is applied in memory; pendingDel are the sequence numbers of jobs
	// pruned from memory (by a write or a read) and not yet deleted from it
	// (flushed with the next write, by Prune and by Close; a job still in
	// the file is pruned again when it is loaded).
	persist    persister
	pendingDel []uint64
}

// persister is the write-through backend of a MemStore: write stores put
// (when not nil) under its sequence number, records seq as the store's
// sequence and deletes the jobs of sequence numbers del, in one atomic
// transaction. When it fails nothing was written.
type persister interface {
	write(put *Job, seq uint64, del []uint64) error
}

type entry struct {
	job      Job
	finished *list.Element
	gone     bool
	// finSeq is the job's place in the store's finish order (MemStore.finSeq);
	// finPrev and finNext link the finished jobs of its tenant in that order
	// (tenantJobs.finHead). Set while finished is not nil.
	finSeq           uint64
	finPrev, finNext *entry
}

// idemKey is a job's place in MemStore.byKey: its tenant and idempotency
// key.
type idemKey struct{ tenant, key string }

// indexKeyLocked adds e to byKey when its job has an idempotency key.
func (s *MemStore) indexKeyLocked(e *entry) {
	if e.job.IdempotencyKey != "" {
		s.byKey[idemKey{e.job.Tenant, e.job.IdempotencyKey}] = e
	}
}

// tenantJobs are a tenant's entries in submission (seq) order; deleted
// entries are marked gone and compacted lazily. Its finished entries are
// also linked in finish order, from finHead (the oldest) to finTail;
// nFinished counts them, and heapIdx is the tenant's index in
// MemStore.fullest (-1 when it holds no finished job).
type tenantJobs struct {
	items []*entry
	gone  int

	finHead, finTail *entry
	nFinished        int
	heapIdx          int
}

// tenantHeap is a heap (container/heap) of the tenants holding finished
// jobs: the one holding the most first, ties by the earliest finish order
// (finSeq) of their oldest finished job. Swap keeps tenantJobs.heapIdx.
type tenantHeap []*tenantJobs

func (h tenantHeap) Len() int { return len(h) }

func (h tenantHeap) Less(i, j int) bool {
	if h[i].nFinished != h[j].nFinished {
		return h[i].nFinished > h[j].nFinished
	}
	return h[i].finHead.finSeq < h[j].finHead.finSeq
}

func (h tenantHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx, h[j].heapIdx = i, j
}

func (h *tenantHeap) Push(x any) {
	tj := x.(*tenantJobs)
	tj.heapIdx = len(*h)
	*h = append(*h, tj)
}

// Pop removes the last tenant; the backing array is halved once a quarter
// of it is in use (beyond 64 slots), so that tenants gone release it.
func (h *tenantHeap) Pop() any {
	old := *h
	tj := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	if c := cap(*h); c > 64 && len(*h) < c/4 {
		*h = append(make(tenantHeap, 0, c/2), *h...)
	}
	tj.heapIdx = -1
	return tj
}

// addFinishedLocked puts e, just finished, last in the store's finish order
// and in its tenant's, and moves the tenant up the fullest heap: O(log t).
func (s *MemStore) addFinishedLocked(e *entry) {
	s.finSeq++
	e.finSeq = s.finSeq
	e.finished = s.finished.PushBack(e)
	tj := s.byTenant[e.job.Tenant]
	e.finPrev, e.finNext = tj.finTail, nil
	if tj.finTail != nil {
		tj.finTail.finNext = e
	} else {
		tj.finHead = e
	}
	tj.finTail = e
	tj.nFinished++
	if tj.heapIdx < 0 {
		heap.Push(&s.fullest, tj)
	} else {
		heap.Fix(&s.fullest, tj.heapIdx)
	}
}

// dropFinishedLocked takes e out of the finish orders (the store's and its
// tenant's) and moves its tenant down the fullest heap, or out of it when
// e was its last finished job: O(log t).
func (s *MemStore) dropFinishedLocked(e *entry) {
	s.finished.Remove(e.finished)
	e.finished = nil
	tj := s.byTenant[e.job.Tenant]
	if e.finPrev != nil {
		e.finPrev.finNext = e.finNext
	} else {
		tj.finHead = e.finNext
	}
	if e.finNext != nil {
		e.finNext.finPrev = e.finPrev
	} else {
		tj.finTail = e.finPrev
	}
	e.finPrev, e.finNext = nil, nil
	tj.nFinished--
	if tj.nFinished == 0 {
		heap.Remove(&s.fullest, tj.heapIdx)
	} else {
		heap.Fix(&s.fullest, tj.heapIdx)
	}
}

// NewMemStore returns an empty store that reads time from clk. retention <=
// 0 means DefaultRetention; maxFinished <= 0 means DefaultMaxFinished.
func NewMemStore(clk clock.PassiveClock, retention time.Duration, maxFinished int) *MemStore {
	if retention <= 0 {
		retention = DefaultRetention
	}
	if maxFinished <= 0 {
		maxFinished = DefaultMaxFinished
	}
	return &MemStore{
		clock: clk, retention: retention, maxFinished: maxFinished, ids: newIDCipher(nil), gen: newGen(),
		byID: map[string]*entry{}, byTenant: map[string]*tenantJobs{}, byKey: map[idemKey]*entry{},
		finished: list.New(), counts: map[Status]int{},
	}
}

// newGen returns a random id generation (MemStore.gen), never 0.
func newGen() uint32 {
	var b [4]byte
	for {
		_, _ = rand.Read(b[:]) // never fails (crypto/rand)
		if g := binary.BigEndian.Uint32(b[:]); g != 0 {
			return g
		}
	}
}

// idKeySize is the size of a store's job id key: AES-128.
const idKeySize = 16

// newIDCipher returns the job id cipher of key, or of a new random key when
// key is nil.
func newIDCipher(key []byte) cipher.Block {
	if key == nil {
		key = make([]byte, idKeySize)
		_, _ = rand.Read(key) // never fails (crypto/rand)
	}
	b, err := aes.NewCipher(key)
	if err != nil {
		panic("jobs: job id key: " + err.Error()) // key sizes are checked by the callers
	}
	return b
}

// newID returns the id of the job of sequence number seq: "job_" and 32
// hex digits, the AES-128 encryption under the store's key of seq (8 bytes,
// big-endian), the store's generation (4 bytes, MemStore.gen) and 4 zero
// bytes. The sequence is pool-wide, so ids that showed it would let a
// tenant count the jobs other tenants submitted between two of its own;
// encrypted, they show nothing and cannot be forged (seqOf refuses a block
// whose last 4 bytes do not decrypt to zero: one forgery in 2^32 tries),
// and they still carry the sequence that list cursors need (Filter.After,
// also for a job deleted since). The generation differs at each open, so a
// store whose sequence went back (a file restored from an older copy)
// hands out ids other than those it handed out before: a client holding
// one gets 404, never another job. Ids made before generations existed
// carry generation 0 and stay valid.
func (s *MemStore) newID(seq uint64) string {
	var b [aes.BlockSize]byte
	binary.BigEndian.PutUint64(b[:8], seq)
	binary.BigEndian.PutUint32(b[8:12], s.gen)
	s.ids.Encrypt(b[:], b[:])
	var out [len(idPrefix) + 2*aes.BlockSize]byte
	copy(out[:], idPrefix)
	hex.Encode(out[len(idPrefix):], b[:])
	return string(out[:])
}

// idPrefix begins every job id.
const idPrefix = "job_"

// legacyIDLen is the length of the ids of earlier versions, which a durable
// store may still hold: "job_", 16 hex digits of the sequence number in the
// clear and 8 random hex digits.
const legacyIDLen = len(idPrefix) + 16 + 8

// seqOf returns the sequence number of an id made by newID (or of a legacy
// id, up to legacyMax), and false for any other string. Legacy ids carry
// their sequence number in the clear and cannot be checked: accepted past
// the ids the store held in that form, forged ones would let a tenant
// place its own jobs in the pool-wide sequence by listing after them.
func (s *MemStore) seqOf(id string) (uint64, bool) {
	switch {
	case len(id) == len(idPrefix)+2*aes.BlockSize && id[:len(idPrefix)] == idPrefix:
		var b [aes.BlockSize]byte
		if _, err := hex.Decode(b[:], []byte(id[len(idPrefix):])); err != nil {
			return 0, false
		}
		s.ids.Decrypt(b[:], b[:])
		if binary.BigEndian.Uint32(b[12:]) != 0 { // any generation

			return 0, false
		}
		return binary.BigEndian.Uint64(b[:8]), true
	case len(id) == legacyIDLen && id[:len(idPrefix)] == idPrefix:
		seq, err := strconv.ParseUint(id[len(idPrefix):len(idPrefix)+16], 16, 64)
		return seq, err == nil && seq >= 1 && seq <= s.legacyMax
	}
	return 0, false
}

// Create implements Store.
func (s *MemStore) Create(j Job) (Job, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if j.IdempotencyKey != "" {
		// Pruned first, so that a key whose job is past its retention is
		// free, as ByIdempotencyKey says.
		s.pruneLocked(s.clock.Now())
		if e, ok := s.byKey[idemKey{j.Tenant, j.IdempotencyKey}]; ok {
			return e.job, ErrIdempotencyKeyHeld
		}
	}
	seq := s.seq + 1
	j.seq = seq
	j.ID = s.newID(j.seq)
	if err := s.writeLocked(&j, nil); err != nil {
		return Job{}, err
	}
	s.seq = seq
	e := &entry{job: j}
	s.addLocked(e)
	if j.Status.Finished() {
		s.addFinishedLocked(e)
	}
	s.pruneLocked(s.clock.Now())
	return j, nil
}

// addLocked indexes e, a new job (not yet in the finish order), under its
// id, its idempotency key (if any) and last among its tenant's jobs, and
// counts it.
func (s *MemStore) addLocked(e *entry) {
	s.byID[e.job.ID] = e
	s.indexKeyLocked(e)
	tj := s.byTenant[e.job.Tenant]
	if tj == nil {
		tj = &tenantJobs{heapIdx: -1}
		s.byTenant[e.job.Tenant] = tj
	}
	tj.items = append(tj.items, e)
	s.counts[e.job.Status]++
}

// ByIdempotencyKey implements Store.
func (s *MemStore) ByIdempotencyKey(tenant, key string) (Job, bool) {
	if key == "" {
		return Job{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pruneLocked(s.clock.Now())
	e, ok := s.byKey[idemKey{tenant, key}]
	if !ok {
		return Job{}, false
	}
	return e.job, true
}

// Get implements Store.
func (s *MemStore) Get(id string) (Job, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pruneLocked(s.clock.Now())
	e, ok := s.byID[id]
	if !ok {
		return Job{}, ErrNotFound
	}
	return e.job, nil
}

// Update implements Store.
func (s *MemStore) Update(id string, fn func(j *Job) error) (Job, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.byID[id]
	if !ok {
		return Job{}, ErrNotFound
	}
	j := e.job
	if err := fn(&j); err != nil {
		return e.job, err
	}
	j.ID, j.Tenant, j.seq = e.job.ID, e.job.Tenant, e.job.seq
	j.IdempotencyKey, j.IdempotencyFingerprint = e.job.IdempotencyKey, e.job.IdempotencyFingerprint
	if err := s.writeLocked(&j, nil); err != nil {
		return e.job, err
	}
	if j.Status != e.job.Status {
		s.counts[e.job.Status]--
		s.counts[j.Status]++
	}
	e.job = j
	if j.Status.Finished() && e.finished == nil {
		s.addFinishedLocked(e)
	} else if !j.Status.Finished() && e.finished != nil {
		s.dropFinishedLocked(e)
	}
	s.pruneLocked(s.clock.Now())
	return j, nil
}

// Delete implements Store.
func (s *MemStore) Delete(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.byID[id]
	if !ok {
		return ErrNotFound
	}
	if err := s.writeLocked(nil, []uint64{e.job.seq}); err != nil {
		return err
	}
	s.removeLocked(e)
	return nil
}

// writeLocked writes put and the deletions pending (plus del) through to
// the persister, if any; the pending deletions are cleared once written.
func (s *MemStore) writeLocked(put *Job, del []uint64) error {
	if s.persist == nil {
		return nil
	}
	seq := s.seq
	if put != nil {
		seq = max(seq, put.seq)
	}
	if err := s.persist.write(put, seq, append(del, s.pendingDel...)); err != nil {
		return err
	}
	s.pendingDel = s.pendingDel[:0]
	return nil
}

func (s *MemStore) removeLocked(e *entry) {
	delete(s.byID, e.job.ID)
	if k := (idemKey{e.job.Tenant, e.job.IdempotencyKey}); k.key != "" && s.byKey[k] == e {
		delete(s.byKey, k)
	}
	s.counts[e.job.Status]--
	if e.finished != nil {
		s.dropFinishedLocked(e)
	}
	e.gone = true
	tj := s.byTenant[e.job.Tenant]
	tj.gone++
	if tj.gone == len(tj.items) {
		delete(s.byTenant, e.job.Tenant)
		return
	}
	if tj.gone > 64 && tj.gone*2 > len(tj.items) {
		live := tj.items[:0]
		for _, it := range tj.items {
			if !it.gone {
				live = append(live, it)
			}
		}
		clear(tj.items[len(live):])
		tj.items, tj.gone = live, 0
	}
}

// Prune drops, at now, the finished jobs past their retention and those
// over the bound of maxFinished, by the rules of MemStore (the oldest
// finished job of the tenant holding the most goes first). Every other
// write and read prunes as well.
func (s *MemStore) Prune(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pruneLocked(now)
	if len(s.pendingDel) > 0 {
		// A failed flush is retried with the next write.
		_ = s.writeLocked(nil, nil)
	}
}

// pruneLocked applies the two rules of MemStore at now: the oldest
// finished job of the pool goes while it is past its retention, then, while
// the pool holds more than maxFinished finished jobs, the oldest finished
// job of the tenant holding the most (fullest[0]); the retention is checked
// again after each job pruned by the bound. O(log t) per job pruned.
func (s *MemStore) pruneLocked(now time.Time) {
	for front := s.finished.Front(); front != nil; front = s.finished.Front() {
		e := front.Value.(*entry)
		if now.Sub(e.job.FinishedAt) < s.retention {
			if s.finished.Len() <= s.maxFinished {
				return
			}
			e = s.fullest[0].finHead
		}
		s.removeLocked(e)
		if s.persist != nil {
			s.pendingDel = append(s.pendingDel, e.job.seq)
		}
	}
}

// Pending returns the jobs that are queued or running, of all tenants, in
// submission order: what a restarted scheduler must queue again.
func (s *MemStore) Pending() []Job {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Job
	for _, e := range s.byID {
		if !e.job.Status.Finished() {
			out = append(out, e.job)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].seq < out[j].seq })
	return out
}

// MaxDispatchSeq returns the largest DispatchSeq of the stored jobs (0
// when none was dispatched): DispatchSeqLister.
func (s *MemStore) MaxDispatchSeq() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var m int64
	for _, e := range s.byID {
		m = max(m, e.job.DispatchSeq)
	}
	return m
}

// UndeliveredWebhooks returns the finished jobs whose completion webhook
// was still being delivered (WebhookStatus "pending") when the store was
// last written, of all tenants, in submission order: what a restarted
// scheduler delivers again.
func (s *MemStore) UndeliveredWebhooks() []Job {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pruneLocked(s.clock.Now())
	var out []Job
	for _, e := range s.byID {
		if e.job.Status.Finished() && e.job.WebhookURL != "" && e.job.WebhookStatus == WebhookPending {
			out = append(out, e.job)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].seq < out[j].seq })
	return out
}

// List implements Store.
func (s *MemStore) List(tenant string, f Filter) ([]Job, bool, error) {
	var after uint64
	if f.After != "" {
		var ok bool
		if after, ok = s.seqOf(f.After); !ok {
			return nil, false, ErrInvalidCursor
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pruneLocked(s.clock.Now())
	tj := s.byTenant[tenant]
	if tj == nil {
		return []Job{}, false, nil
	}
	i := sort.Search(len(tj.items), func(i int) bool { return tj.items[i].job.seq > after })
	out := []Job{}
	for ; i < len(tj.items); i++ {
		e := tj.items[i]
		if e.gone || (f.Status != "" && e.job.Status != f.Status) {
			continue
		}
		if f.Limit > 0 && len(out) == f.Limit {
			return out, true, nil
		}
		out = append(out, e.job)
	}
	return out, false, nil
}

// Counts implements Store.
func (s *MemStore) Counts() map[Status]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pruneLocked(s.clock.Now())
	out := make(map[Status]int, len(s.counts))
	for k, v := range s.counts {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

var _ Store = (*MemStore)(nil)
