package jobs

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
	"k8s.io/utils/clock"
)

// DefaultPath is where the scheduler keeps its job store when the job store
// setting is given without a path: a file on the volume the operator mounts
// at /var/lib/fairshare.
const DefaultPath = "/var/lib/fairshare/jobs.db"

// DefaultLockTimeout bounds how long Open waits for the file lock held by
// another process: 5 seconds.
const DefaultLockTimeout = 5 * time.Second

// Bucket and key names of the bbolt file.
var (
	bucketJobs = []byte("jobs") // 8-byte big-endian sequence -> JSON of Job
	bucketMeta = []byte("meta")
	keySeq     = []byte("seq") // 8-byte big-endian: the last sequence handed out
	// keyIDKey holds the store's job id key (16 bytes, MemStore.newID),
	// written when the file is created or first opened by a version that
	// encrypts ids, so that the ids handed out stay valid cursors after a
	// restart and on the replica that opens the file next.
	keyIDKey = []byte("idkey")
	// keyLegacyMax holds MemStore.legacyMax (8-byte big-endian), written
	// when the file gets its id key (0 for a new file). A file given its
	// key by a version that did not write it accepts the ids of the
	// earlier form it holds (load).
	keyLegacyMax = []byte("legacymax")
)

// BoltStore is a durable Store in a single bbolt file (issue "Durable job
// store"): queued and finished jobs survive a restart of the scheduler.
//
// It is a MemStore with write-through: every Create, Update and Delete is
// written to the file in one bbolt transaction (fsync'ed) before it is
// applied in memory, so reads (Get, List, Counts) never touch the disk and
// the retention rules are MemStore's exactly: queued and running jobs are
// never pruned; finished jobs are kept for the retention period and at most
// maxFinished of them, and over that bound the oldest finished job of the
// tenant holding the most finished jobs goes first (ties: the tenant whose
// oldest finished job finished first), so a tenant holding no more than
// maxFinished / (number of tenants holding finished jobs) loses none to
// the bound. Open loads the whole file into memory, orders the finished
// jobs (the pool's and each tenant's) by FinishedAt, ties in submission
// order, and prunes by the same rules at the clock's now, deleting what it
// pruned from the file: a file written under a larger bound loses, at an
// open with a smaller one, the oldest finished jobs of the tenants holding
// the most.
//
// Encoding: each job is the JSON of the whole Job struct (field names as
// in Go), keyed by its 8-byte big-endian sequence number, so fields added
// to Job are persisted without a change here; renaming a field loses its
// stored value. JSON bodies are stored compacted (the same JSON value).
//
// Sizing: a job takes at most 640 bytes of JSON (589 with every field set,
// TestJobRecordSize) plus its request body, metadata and response, and,
// when it was submitted with an idempotency key, the key plus about 110
// bytes (its fingerprint and the two member names: at most 1,024 bytes
// with a 255-character key, 956 measured); bbolt
// pages are filled to about 50% after random deletes, so count twice that
// on disk. The file holds the queued and running jobs plus at most
// maxFinished finished ones: for the default 100,000 finished jobs with
// 2 KiB bodies and 2 KiB responses, about 100,000 x (0.6 + 4) KiB x 2 =
// 0.9 GB; size the volume at twice the
// estimate (bbolt grows the file in steps and never shrinks it; freed pages
// are reused). Memory holds the same jobs once (as MemStore does).
//
// Each write is one fsync'ed transaction under the store's lock, so
// submissions and state changes are bounded by the disk's fsync rate
// (typically 1,000 to 10,000 per second on SSD-backed volumes).
//
// Only one process may open the file: bbolt takes an exclusive file lock,
// so only the elected leader opens the file (internal/scheduler), and
// several replicas need a ReadWriteMany volume.
type BoltStore struct {
	*MemStore
	db *bolt.DB
	// quarantined are the records moved to the quarantine bucket by this
	// open; quarantinedHeld is the number of records that bucket holds
	// (of this open and earlier ones). Both are set by load and never
	// changed.
	quarantined     []QuarantinedRecord
	quarantinedHeld int
}

// OpenBolt opens (creating it and its directory when missing) the job store
// at path, loads it and prunes it at clk's now. retention and maxFinished
// are MemStore's (<= 0: the defaults). lockTimeout <= 0 means
// DefaultLockTimeout; when another process holds the file for longer, the
// error says so.
//
// A record of the "jobs" bucket that cannot be loaded as a job (a key that
// is not 8 bytes, a value that is not the JSON of a Job, a sequence number
// of 0, a status that is not one of the six, an empty id or tenant, an id
// another loaded job has, an idempotency key another loaded job of its
// tenant holds, an id that is not one of its key's sequence number:
// MemStore.checkRecord) is not loaded: it is moved unchanged to
// the "quarantine" bucket of the file in the load's transaction, and the
// store serves the other jobs (Quarantined, QuarantinedHeld). A job id key
// of the wrong size in the "meta" bucket fails the open: the error names
// the file and what to do.
func OpenBolt(path string, clk clock.PassiveClock, retention time.Duration, maxFinished int, lockTimeout time.Duration) (*BoltStore, error) {
	if lockTimeout <= 0 {
		lockTimeout = DefaultLockTimeout
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("job store %s: creating its directory: %w", path, err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: lockTimeout, FreelistType: bolt.FreelistMapType})
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			return nil, fmt.Errorf("job store %s: the file is locked by another process (another scheduler replica?); gave up after %s: %w", path, lockTimeout, err)
		}
		return nil, fmt.Errorf("job store %s: opening: %w", path, err)
	}
	s := &BoltStore{MemStore: NewMemStore(clk, retention, maxFinished), db: db}
	if err := s.load(); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("job store %s: loading: %w", path, err)
	}
	return s, nil
}

func seqKey(seq uint64) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], seq)
	return k[:]
}

// Quarantined returns the records this open moved from the "jobs" bucket
// to the "quarantine" bucket (OpenBolt), in key order (buckets nested in
// the jobs bucket last), or nil when none was.
func (s *BoltStore) Quarantined() []QuarantinedRecord { return slices.Clone(s.quarantined) }

// QuarantinedHeld returns the number of records the file's "quarantine"
// bucket holds, moved there by this open or an earlier one and not removed
// since (docs/operations.md "The job store").
func (s *BoltStore) QuarantinedHeld() int { return s.quarantinedHeld }

// load reads every job into the in-memory index, in sequence order,
// quarantining the records that cannot be loaded as jobs (OpenBolt), then
// prunes by the retention rules and deletes what was pruned.
func (s *BoltStore) load() error {
	m := s.MemStore
	m.mu.Lock()
	defer m.mu.Unlock()
	var finished []*entry
	err := s.db.Update(func(tx *bolt.Tx) error {
		jb, err := tx.CreateBucketIfNotExists(bucketJobs)
		if err != nil {
			return err
		}
		mb, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		if v := mb.Get(keySeq); len(v) == 8 {
			m.seq = binary.BigEndian.Uint64(v)
		}
		legacyOpen := true // legacyMax not recorded: raised by the legacy ids held
		keyCreated := false
		if v := mb.Get(keyLegacyMax); len(v) == 8 {
			m.legacyMax = binary.BigEndian.Uint64(v)
			legacyOpen = false
		}
		switch key := mb.Get(keyIDKey); {
		case key == nil:
			key = make([]byte, idKeySize)
			_, _ = rand.Read(key) // never fails (crypto/rand)
			if err := mb.Put(keyIDKey, key); err != nil {
				return err
			}
			m.ids = newIDCipher(key)
			// Every id handed out so far has the earlier form: legacyMax
			// is recorded after the walk.
			m.legacyMax, legacyOpen, keyCreated = m.seq, true, true
		case len(key) == idKeySize:
			m.ids = newIDCipher(key)
		default:
			// Without its key the store can neither check the ids it
			// holds nor hand out new ones that stay valid cursors.
			return fmt.Errorf("the job id key (bucket %q, key %q) is %d bytes, want %d: the file is damaged or "+
				"was not written by a Fairshare scheduler. Restore the file from a backup, or move it away "+
				"(the scheduler then starts with an empty job store and the jobs in the file are lost)",
				bucketMeta, keyIDKey, len(key), idKeySize)
		}
		qb, err := tx.CreateBucketIfNotExists(bucketQuarantine)
		if err != nil {
			return err
		}
		// Records that cannot be loaded as jobs are moved to the
		// quarantine bucket, unchanged, after the walk (a bucket must not
		// change while it is walked); the store serves the rest.
		var bad []badRecord
		var nested [][]byte
		err = jb.ForEach(func(k, v []byte) error {
			if len(k) == 8 {
				// A sequence number is never handed out again, also
				// that of a record that is not loaded.
				m.seq = max(m.seq, keySeq8(k))
			}
			if v == nil {
				nested = append(nested, bytes.Clone(k))
				return nil
			}
			reject := func(reason string) error {
				bad = append(bad, badRecord{key: bytes.Clone(k), val: bytes.Clone(v), reason: reason})
				return nil
			}
			if len(k) != 8 {
				return reject(fmt.Sprintf("key of %d bytes, want 8 (a big-endian sequence number)", len(k)))
			}
			var j Job
			if err := json.Unmarshal(v, &j); err != nil {
				return reject(decodeReason(err))
			}
			j.seq = keySeq8(k)
			if reason := m.checkRecord(&j, legacyOpen); reason != "" {
				return reject(reason)
			}
			if len(j.ID) == legacyIDLen && legacyOpen {
				// A file given its key by a version that did not record
				// legacyMax: its legacy ids still held are cursors.
				m.legacyMax = max(m.legacyMax, j.seq)
			}
			for _, raw := range []*json.RawMessage{&j.Body, &j.Metadata, &j.Response} {
				if bytes.Equal(*raw, []byte("null")) {
					*raw = nil
				}
			}
			e := &entry{job: j}
			// addLocked also rebuilds the idempotency index from the
			// persisted keys.
			m.addLocked(e)
			if j.Status.Finished() {
				finished = append(finished, e)
			}
			return nil
		})
		if err != nil {
			return err
		}
		if s.quarantined, err = quarantine(jb, qb, bad); err != nil {
			return err
		}
		for _, k := range nested {
			// A bucket inside the jobs bucket (no job is one) is moved
			// whole when its key is free in the quarantine bucket, and
			// left where it is otherwise; it is never loaded.
			r := QuarantinedRecord{Key: hex.EncodeToString(k), QuarantineKey: hex.EncodeToString(k), Reason: "a bucket, not a job record"}
			if qb.Get(k) != nil || qb.Bucket(k) != nil {
				r.QuarantineKey, r.Reason = "", r.Reason+"; left in the jobs bucket (its key is taken in the quarantine bucket)"
			} else if err := tx.MoveBucket(k, jb, qb); err != nil {
				return fmt.Errorf("quarantining the bucket of key %x: %w", k, err)
			}
			s.quarantined = append(s.quarantined, r)
		}
		if keyCreated {
			// Recorded also when 0 (a new file): ids of the earlier form
			// are then accepted by no later open.
			if err := mb.Put(keyLegacyMax, seqKey(m.legacyMax)); err != nil {
				return err
			}
		}
		s.quarantinedHeld = 0
		return qb.ForEach(func([]byte, []byte) error { s.quarantinedHeld++; return nil })
	})
	if err != nil {
		return err
	}
	// The finish order, the store's and each tenant's, is by FinishedAt
	// (ties: submission order); pruning then applies MemStore's rules.
	slices.SortStableFunc(finished, func(a, b *entry) int { return a.job.FinishedAt.Compare(b.job.FinishedAt) })
	for _, e := range finished {
		m.addFinishedLocked(e)
	}
	m.persist = s
	m.pruneLocked(m.clock.Now())
	if len(m.pendingDel) > 0 {
		return m.writeLocked(nil, nil)
	}
	return nil
}

// write implements persister: one transaction, fsync'ed by bbolt.
func (s *BoltStore) write(put *Job, seq uint64, del []uint64) error {
	var val []byte
	if put != nil {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(put); err != nil {
			return fmt.Errorf("encoding job %s: %w", put.ID, err)
		}
		val = bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		jb := tx.Bucket(bucketJobs)
		for _, d := range del {
			if err := jb.Delete(seqKey(d)); err != nil {
				return err
			}
		}
		if put != nil {
			if err := jb.Put(seqKey(put.seq), val); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketMeta).Put(keySeq, seqKey(seq))
	})
}

// Close writes the deletions of pruned jobs still pending and closes the
// file (releasing its lock). The store must not be used afterwards.
func (s *BoltStore) Close() error {
	m := s.MemStore
	m.mu.Lock()
	var err error
	if len(m.pendingDel) > 0 {
		err = m.writeLocked(nil, nil)
	}
	m.persist = closedPersister{}
	m.mu.Unlock()
	return errors.Join(err, s.db.Close())
}

// closedPersister refuses writes after Close.
type closedPersister struct{}

func (closedPersister) write(*Job, uint64, []uint64) error { return errors.New("job store is closed") }

var _ Store = (*BoltStore)(nil)
var _ PendingLister = (*BoltStore)(nil)
