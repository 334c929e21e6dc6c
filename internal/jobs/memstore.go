package jobs

import (
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
	// DefaultMaxFinished bounds the finished jobs kept across all tenants.
	DefaultMaxFinished = 100000
)

// MemStore is an in-memory Store. Finished jobs are kept for Retention after
// they finish and at most MaxFinished of them (oldest finished first out);
// queued and running jobs are never pruned. Every write and every read
// (Get, List, Counts, UndeliveredWebhooks) prunes at the clock's now, so a
// finished job past its retention is never served, also by an idle store.
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
	finished *list.List // of *entry, in finish order
	counts   map[Status]int

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
}

// tenantJobs are a tenant's entries in submission (seq) order; deleted
// entries are marked gone and compacted lazily.
type tenantJobs struct {
	items []*entry
	gone  int
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
		byID: map[string]*entry{}, byTenant: map[string]*tenantJobs{},
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
	seq := s.seq + 1
	j.seq = seq
	j.ID = s.newID(j.seq)
	if err := s.writeLocked(&j, nil); err != nil {
		return Job{}, err
	}
	s.seq = seq
	e := &entry{job: j}
	s.byID[j.ID] = e
	tj := s.byTenant[j.Tenant]
	if tj == nil {
		tj = &tenantJobs{}
		s.byTenant[j.Tenant] = tj
	}
	tj.items = append(tj.items, e)
	s.counts[j.Status]++
	if j.Status.Finished() {
		e.finished = s.finished.PushBack(e)
	}
	s.pruneLocked(s.clock.Now())
	return j, nil
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
	if err := s.writeLocked(&j, nil); err != nil {
		return e.job, err
	}
	if j.Status != e.job.Status {
		s.counts[e.job.Status]--
		s.counts[j.Status]++
	}
	e.job = j
	if j.Status.Finished() && e.finished == nil {
		e.finished = s.finished.PushBack(e)
	} else if !j.Status.Finished() && e.finished != nil {
		s.finished.Remove(e.finished)
		e.finished = nil
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
	s.counts[e.job.Status]--
	if e.finished != nil {
		s.finished.Remove(e.finished)
		e.finished = nil
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

// Prune drops finished jobs older than the retention period or beyond the
// bounded count, at now. Create and Update prune as well.
func (s *MemStore) Prune(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pruneLocked(now)
	if len(s.pendingDel) > 0 {
		// A failed flush is retried with the next write.
		_ = s.writeLocked(nil, nil)
	}
}

func (s *MemStore) pruneLocked(now time.Time) {
	for front := s.finished.Front(); front != nil; front = s.finished.Front() {
		e := front.Value.(*entry)
		if s.finished.Len() <= s.maxFinished && now.Sub(e.job.FinishedAt) < s.retention {
			return
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
