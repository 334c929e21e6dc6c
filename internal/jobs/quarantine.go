package jobs

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	bolt "go.etcd.io/bbolt"
)

// bucketQuarantine holds the records of the jobs bucket that could not be
// loaded as jobs (BoltStore.Quarantined), moved there unchanged at load:
// nested key -> the record's value, byte for byte.
var bucketQuarantine = []byte("quarantine")

// QuarantinedRecord is a record of the job store file that OpenBolt did not
// load as a job and moved, unchanged, from the "jobs" bucket to the
// "quarantine" bucket of the same file (docs/operations.md "The job store",
// quarantined records). It never holds the record's content, which holds a
// tenant's request body.
type QuarantinedRecord struct {
	// Key is the record's key in the "jobs" bucket, in hex (16 hex digits,
	// the big-endian sequence number, for a well-formed key).
	Key string
	// QuarantineKey is its key in the "quarantine" bucket, in hex: Key, or
	// when a record was already held under Key, Key followed by the hex of
	// "~" and a decimal number from 2 (quarantineKey).
	QuarantineKey string
	// Reason says why it was not loaded, without the record's content.
	Reason string
	// Size is the size of the record's value in bytes.
	Size int
}

// badRecord is a record of the jobs bucket to quarantine at load.
type badRecord struct {
	key, val []byte
	reason   string
}

// checkRecord returns why the record of key k, decoded as j (seq set from
// k), cannot be loaded into m as a job, or "" when it can. legacyOpen is
// whether ids of the earlier form (legacyIDLen) are accepted past
// m.legacyMax (a file whose legacyMax was never recorded: load). The rules
// are the store's own invariants: a sequence number of at least 1, one of
// the six statuses (Status.Valid), a tenant and an id, an id that no loaded
// job has, an idempotency key that no loaded job of the tenant holds (at
// most one job per tenant and key: Store.Create), and an id that is the one newID gives the sequence number under
// the store's key (in any generation), or for an id of the earlier form,
// "job_" and the sequence number in 16 hex digits (seqOf).
func (m *MemStore) checkRecord(j *Job, legacyOpen bool) string {
	switch {
	case j.seq == 0:
		return "sequence number 0 (sequence numbers start at 1)"
	case !j.Status.Valid():
		s := string(j.Status)
		if len(s) > 32 {
			s = s[:32] + "..."
		}
		return fmt.Sprintf("unknown status %q", s)
	case j.ID == "":
		return "empty id"
	case j.Tenant == "":
		return "empty tenant"
	}
	if other, dup := m.byID[j.ID]; dup {
		return fmt.Sprintf("duplicate id: the job of key %016x has the same id", other.job.seq)
	}
	if other, dup := m.byKey[idemKey{j.Tenant, j.IdempotencyKey}]; dup && j.IdempotencyKey != "" {
		return fmt.Sprintf("duplicate idempotency key: the job of key %016x of the same tenant holds it", other.job.seq)
	}
	if len(j.ID) == legacyIDLen && j.ID[:len(idPrefix)] == idPrefix {
		seq, err := strconv.ParseUint(j.ID[len(idPrefix):len(idPrefix)+16], 16, 64)
		switch {
		case err != nil || seq != j.seq:
			return fmt.Sprintf("id of the earlier form does not carry the key's sequence number %d", j.seq)
		case !legacyOpen && seq > m.legacyMax:
			return fmt.Sprintf("id of the earlier form past the last one the store handed out (sequence number %d)", m.legacyMax)
		}
		return ""
	}
	// An id newID made for the key's sequence number, in any generation,
	// as newID writes it (lower-case hex: the API matches ids exactly).
	if seq, ok := m.seqOf(j.ID); !ok || seq != j.seq || j.ID != strings.ToLower(j.ID) {
		return fmt.Sprintf("id is not one of the key's sequence number %d under the store's id key", j.seq)
	}
	return ""
}

// decodeReason describes err, an error of json.Unmarshal of a record,
// without the record's content (a syntax error's offset, a type error's
// field and Go type).
func decodeReason(err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return fmt.Sprintf("not valid JSON (syntax error at byte %d)", syn.Offset)
	case errors.As(err, &typ):
		return fmt.Sprintf("JSON of the wrong shape (field %q holds the wrong type, want Go %s)", typ.Field, typ.Type)
	}
	return "not a JSON job"
}

// quarantineKey returns the key under which a record of key k is kept in
// the quarantine bucket q: k, or when taken, k followed by "~2", "~3", ...
// (the first free one), so that no quarantined record is overwritten.
func quarantineKey(q *bolt.Bucket, k []byte) []byte {
	if q.Get(k) == nil && q.Bucket(k) == nil {
		return k
	}
	for n := 2; ; n++ {
		c := append(append([]byte{}, k...), "~"+strconv.Itoa(n)...)
		if q.Get(c) == nil && q.Bucket(c) == nil {
			return c
		}
	}
}

// quarantine moves the bad records from the jobs bucket jb to the
// quarantine bucket q (in the caller's transaction) and returns what was
// moved.
func quarantine(jb, q *bolt.Bucket, bad []badRecord) ([]QuarantinedRecord, error) {
	var out []QuarantinedRecord
	for _, r := range bad {
		qk := quarantineKey(q, r.key)
		if err := q.Put(qk, r.val); err != nil {
			return nil, fmt.Errorf("quarantining the record of key %x: %w", r.key, err)
		}
		if err := jb.Delete(r.key); err != nil {
			return nil, fmt.Errorf("quarantining the record of key %x: %w", r.key, err)
		}
		out = append(out, QuarantinedRecord{Key: hex.EncodeToString(r.key), QuarantineKey: hex.EncodeToString(qk), Reason: r.reason, Size: len(r.val)})
	}
	return out, nil
}

// keySeq8 returns the sequence number of an 8-byte key.
func keySeq8(k []byte) uint64 { return binary.BigEndian.Uint64(k) }
