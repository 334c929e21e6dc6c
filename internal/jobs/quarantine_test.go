package jobs

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	bolt "go.etcd.io/bbolt"
	clocktesting "k8s.io/utils/clock/testing"
)

// goodStore writes a store file at path with three jobs (a queued, a
// succeeded of tenant a; b running, dispatched 5th) and closes it.
func goodStore(t *testing.T, path string) []Job {
	t.Helper()
	s, err := OpenBolt(path, clocktesting.NewFakeClock(t0), 0, 0, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var out []Job
	for _, j := range []Job{
		{Tenant: "a", Status: StatusQueued, Model: "m", CreatedAt: t0, Body: json.RawMessage(`{"model":"m"}`),
			IdempotencyKey: "k1", IdempotencyFingerprint: "f1"},
		{Tenant: "a", Status: StatusSucceeded, Model: "m", CreatedAt: t0, FinishedAt: t0.Add(time.Second), DispatchSeq: 3,
			Response: json.RawMessage(`{"id":"x"}`)},
		{Tenant: "b", Status: StatusRunning, Model: "m", CreatedAt: t0, DispatchSeq: 5, Attempts: 1},
	} {
		j, err := s.Create(j)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, j)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return out
}

// fileIDs returns the id cipher of the store file at path, as a MemStore
// whose newID gives the file's ids.
func fileIDs(t *testing.T, path string) *MemStore {
	t.Helper()
	m := NewMemStore(clocktesting.NewFakeClock(t0), 0, 0)
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_ = db.View(func(tx *bolt.Tx) error {
		m.ids = newIDCipher(bytes.Clone(tx.Bucket(bucketMeta).Get(keyIDKey)))
		return nil
	})
	return m
}

// putRaw writes records (key -> value) into bucket of the file at path
// with bbolt, as a damaged or foreign writer would.
func putRaw(t *testing.T, path string, bucket []byte, records map[string][]byte) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucket)
		if err != nil {
			return err
		}
		for k, v := range records {
			if err := b.Put([]byte(k), v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// rawBucket returns every key (hex) and value of bucket in the file at path.
func rawBucket(t *testing.T, path string, bucket []byte) map[string]string {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	out := map[string]string{}
	_ = db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucket); b != nil {
			return b.ForEach(func(k, v []byte) error { out[hex.EncodeToString(k)] = string(v); return nil })
		}
		return nil
	})
	return out
}

func marshalJob(t *testing.T, j Job) []byte {
	t.Helper()
	b, err := json.Marshal(j)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestBoltStoreQuarantinesBadRecords: each kind of record that cannot be
// loaded as a job is moved unchanged to the quarantine bucket; the store
// opens and serves the good jobs exactly (Get, List, Counts, Pending,
// MaxDispatchSeq), never hands out the bad record's sequence number again,
// and a reopen quarantines nothing more and reports the record still held.
func TestBoltStoreQuarantinesBadRecords(t *testing.T) {
	k10 := string(seqKey(10))
	for _, tc := range []struct {
		name string
		// record returns the bad record's key and value, given the
		// file's ids and the good jobs.
		record  func(ids *MemStore, good []Job) (string, []byte)
		reason  string
		nextSeq uint64 // the sequence number of the next job created
	}{
		{"undecodable JSON", func(*MemStore, []Job) (string, []byte) {
			return k10, []byte(`{"ID":"job_1","Tenant":"a",`)
		}, "not valid JSON (syntax error at byte 27)", 11},
		{"JSON of the wrong shape", func(*MemStore, []Job) (string, []byte) {
			return k10, []byte(`{"Tenant":"a","Attempts":"two"}`)
		}, `JSON of the wrong shape (field "Attempts" holds the wrong type, want Go int)`, 11},
		{"key of 3 bytes", func(ids *MemStore, _ []Job) (string, []byte) {
			return "abc", marshalJob(t, Job{ID: ids.newID(4), Tenant: "a", Status: StatusQueued, DispatchSeq: 99})
		}, "key of 3 bytes, want 8 (a big-endian sequence number)", 4},
		{"unknown status", func(ids *MemStore, _ []Job) (string, []byte) {
			return k10, marshalJob(t, Job{ID: ids.newID(10), Tenant: "a", Status: "archived", DispatchSeq: 99})
		}, `unknown status "archived"`, 11},
		{"empty status", func(ids *MemStore, _ []Job) (string, []byte) {
			return k10, marshalJob(t, Job{ID: ids.newID(10), Tenant: "a", DispatchSeq: 99})
		}, `unknown status ""`, 11},
		{"empty tenant", func(ids *MemStore, _ []Job) (string, []byte) {
			return k10, marshalJob(t, Job{ID: ids.newID(10), Status: StatusQueued, DispatchSeq: 99})
		}, "empty tenant", 11},
		{"empty id", func(ids *MemStore, _ []Job) (string, []byte) {
			return k10, marshalJob(t, Job{Tenant: "a", Status: StatusQueued, DispatchSeq: 99})
		}, "empty id", 11},
		{"duplicate id", func(ids *MemStore, good []Job) (string, []byte) {
			j := good[0]
			j.Tenant, j.DispatchSeq = "c", 99
			return k10, marshalJob(t, j)
		}, "duplicate id: the job of key 0000000000000001 has the same id", 11},
		{"duplicate idempotency key", func(ids *MemStore, good []Job) (string, []byte) {
			return k10, marshalJob(t, Job{ID: ids.newID(10), Tenant: "a", Status: StatusQueued, DispatchSeq: 99,
				IdempotencyKey: "k1", IdempotencyFingerprint: "other"})
		}, "duplicate idempotency key: the job of key 0000000000000001 of the same tenant holds it", 11},
		{"id not matching the key", func(ids *MemStore, _ []Job) (string, []byte) {
			return k10, marshalJob(t, Job{ID: ids.newID(11), Tenant: "a", Status: StatusQueued, DispatchSeq: 99})
		}, "id is not one of the key's sequence number 10 under the store's id key", 11},
		{"id in upper case", func(ids *MemStore, _ []Job) (string, []byte) {
			return k10, marshalJob(t, Job{ID: "job_" + strings.ToUpper(ids.newID(10)[4:]), Tenant: "a", Status: StatusQueued, DispatchSeq: 99})
		}, "id is not one of the key's sequence number 10 under the store's id key", 11},
		{"id of the earlier form in a store that never held such ids", func(*MemStore, []Job) (string, []byte) {
			return k10, marshalJob(t, Job{ID: "job_000000000000000aaaaaaaaa", Tenant: "a", Status: StatusQueued, DispatchSeq: 99})
		}, "id of the earlier form past the last one the store handed out (sequence number 0)", 11},
		{"id of the earlier form of another sequence number", func(*MemStore, []Job) (string, []byte) {
			return k10, marshalJob(t, Job{ID: "job_000000000000000baaaaaaaa", Tenant: "a", Status: StatusQueued, DispatchSeq: 99})
		}, "id of the earlier form does not carry the key's sequence number 10", 11},
		{"sequence number 0", func(ids *MemStore, _ []Job) (string, []byte) {
			return string(seqKey(0)), marshalJob(t, Job{ID: ids.newID(0), Tenant: "a", Status: StatusQueued, DispatchSeq: 99})
		}, "sequence number 0 (sequence numbers start at 1)", 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "jobs.db")
			good := goodStore(t, path)
			key, val := tc.record(fileIDs(t, path), good)
			putRaw(t, path, bucketJobs, map[string][]byte{key: val})
			hexKey := hex.EncodeToString([]byte(key))

			check := func(s *BoltStore) {
				t.Helper()
				for _, want := range good {
					got, err := s.Get(want.ID)
					if err != nil {
						t.Fatalf("good job %s: %v", want.ID, err)
					}
					if d := cmp.Diff(want, got, cmp.AllowUnexported(Job{})); d != "" {
						t.Errorf("good job %s (-want +got):\n%s", want.ID, d)
					}
				}
				if d := cmp.Diff(map[Status]int{StatusQueued: 1, StatusSucceeded: 1, StatusRunning: 1}, s.Counts()); d != "" {
					t.Errorf("counts (-want +got):\n%s", d)
				}
				if d := cmp.Diff([]string{good[0].ID, good[1].ID}, ids(must(s.List("a", Filter{})))); d != "" {
					t.Errorf("tenant a's jobs (-want +got):\n%s", d)
				}
				for _, tenant := range []string{"", "c"} {
					if got := ids(must(s.List(tenant, Filter{}))); len(got) != 0 {
						t.Errorf("tenant %q's jobs: %v, want none", tenant, got)
					}
				}
				if d := cmp.Diff([]string{good[0].ID, good[2].ID}, ids(s.Pending())); d != "" {
					t.Errorf("pending (-want +got):\n%s", d)
				}
				if got, ok := s.ByIdempotencyKey("a", "k1"); !ok || got.ID != good[0].ID || got.IdempotencyFingerprint != "f1" {
					t.Errorf("tenant a's idempotency key k1: %v %s %q, want %s", ok, got.ID, got.IdempotencyFingerprint, good[0].ID)
				}
				if got := s.MaxDispatchSeq(); got != 5 {
					t.Errorf("MaxDispatchSeq = %d, want 5", got)
				}
				if got := s.QuarantinedHeld(); got != 1 {
					t.Errorf("QuarantinedHeld = %d, want 1", got)
				}
			}

			s, err := OpenBolt(path, clocktesting.NewFakeClock(t0), 0, 0, time.Second)
			if err != nil {
				t.Fatalf("open with a bad record: %v", err)
			}
			check(s)
			want := []QuarantinedRecord{{Key: hexKey, QuarantineKey: hexKey, Reason: tc.reason, Size: len(val)}}
			if d := cmp.Diff(want, s.Quarantined()); d != "" {
				t.Errorf("quarantined (-want +got):\n%s", d)
			}
			// The record's sequence number is not handed out again.
			j, err := s.Create(Job{Tenant: "a", Status: StatusQueued})
			if err != nil {
				t.Fatal(err)
			}
			if seq, _ := s.seqOf(j.ID); seq != tc.nextSeq {
				t.Errorf("next job's sequence number = %d, want %d", seq, tc.nextSeq)
			}
			if _, err := s.Update(j.ID, func(j *Job) error { j.Status = StatusCancelled; j.FinishedAt = t0; return nil }); err != nil {
				t.Fatal(err)
			}
			if err := s.Delete(j.ID); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(map[string]string{hexKey: string(val)}, rawBucket(t, path, bucketQuarantine)); d != "" {
				t.Errorf("quarantine bucket (-want +got):\n%s", d)
			}
			if _, ok := rawBucket(t, path, bucketJobs)[hexKey]; ok {
				t.Errorf("the bad record is still in the jobs bucket")
			}

			s, err = OpenBolt(path, clocktesting.NewFakeClock(t0), 0, 0, time.Second)
			if err != nil {
				t.Fatalf("reopen: %v", err)
			}
			defer s.Close()
			check(s)
			if got := s.Quarantined(); got != nil {
				t.Errorf("reopen quarantined %v, want nothing", got)
			}
		})
	}
}

// TestBoltStoreQuarantineKeepsBothRecordsOfAKey: a record quarantined
// under a key the quarantine bucket already holds is kept beside it (key
// "~2"); neither is overwritten.
func TestBoltStoreQuarantineKeepsBothRecordsOfAKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "jobs.db")
	goodStore(t, path)
	k := string(seqKey(10))
	putRaw(t, path, bucketQuarantine, map[string][]byte{k: []byte("first")})
	putRaw(t, path, bucketJobs, map[string][]byte{k: []byte("second")})
	s, err := OpenBolt(path, clocktesting.NewFakeClock(t0), 0, 0, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	hk := hex.EncodeToString([]byte(k))
	want := []QuarantinedRecord{{Key: hk, QuarantineKey: hk + hex.EncodeToString([]byte("~2")), Reason: "not valid JSON (syntax error at byte 1)", Size: 6}}
	if d := cmp.Diff(want, s.Quarantined()); d != "" {
		t.Errorf("quarantined (-want +got):\n%s", d)
	}
	if got := s.QuarantinedHeld(); got != 2 {
		t.Errorf("QuarantinedHeld = %d, want 2", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(map[string]string{hk: "first", hk + hex.EncodeToString([]byte("~2")): "second"}, rawBucket(t, path, bucketQuarantine)); d != "" {
		t.Errorf("quarantine bucket (-want +got):\n%s", d)
	}
}

// TestBoltStoreQuarantinesANestedBucket: a bucket inside the jobs bucket is
// moved whole to the quarantine bucket, its contents unchanged.
func TestBoltStoreQuarantinesANestedBucket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "jobs.db")
	good := goodStore(t, path)
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.Bucket(bucketJobs).CreateBucket(seqKey(10))
		if err != nil {
			return err
		}
		return b.Put([]byte("x"), []byte("y"))
	})
	if err != nil || db.Close() != nil {
		t.Fatal(err)
	}
	s, err := OpenBolt(path, clocktesting.NewFakeClock(t0), 0, 0, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	hk := hex.EncodeToString(seqKey(10))
	if d := cmp.Diff([]QuarantinedRecord{{Key: hk, QuarantineKey: hk, Reason: "a bucket, not a job record"}}, s.Quarantined()); d != "" {
		t.Errorf("quarantined (-want +got):\n%s", d)
	}
	if d := cmp.Diff(map[Status]int{StatusQueued: 1, StatusSucceeded: 1, StatusRunning: 1}, s.Counts()); d != "" {
		t.Errorf("counts (-want +got):\n%s", d)
	}
	// Its key is no job's: the next job takes the sequence number after it.
	j, err := s.Create(Job{Tenant: "a", Status: StatusQueued})
	if err != nil {
		t.Fatal(err)
	}
	if seq, _ := s.seqOf(j.ID); seq != 11 {
		t.Errorf("next job's sequence number = %d, want 11", seq)
	}
	if _, err := s.Get(good[2].ID); err != nil {
		t.Error(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err = bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_ = db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketJobs).Bucket(seqKey(10)) != nil {
			t.Error("the bucket is still in the jobs bucket")
		}
		b := tx.Bucket(bucketQuarantine).Bucket(seqKey(10))
		if b == nil || string(b.Get([]byte("x"))) != "y" {
			t.Error("the bucket is not in the quarantine bucket with its contents")
		}
		return nil
	})
}

// TestBoltStoreIDKeyOfTheWrongSizeFailsTheOpen: without its id key the
// store cannot open; the error names the file and what to do, and the
// file is left as it was.
func TestBoltStoreIDKeyOfTheWrongSizeFailsTheOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "jobs.db")
	goodStore(t, path)
	putRaw(t, path, bucketMeta, map[string][]byte{string(keyIDKey): []byte("short")})
	before := rawBucket(t, path, bucketJobs)
	_, err := OpenBolt(path, clocktesting.NewFakeClock(t0), 0, 0, time.Second)
	want := "job store " + path + ": loading: the job id key (bucket \"meta\", key \"idkey\") is 5 bytes, want 16: " +
		"the file is damaged or was not written by a Fairshare scheduler. Restore the file from a backup, or move it away " +
		"(the scheduler then starts with an empty job store and the jobs in the file are lost)"
	if err == nil || err.Error() != want {
		t.Fatalf("open: %v\nwant: %s", err, want)
	}
	if d := cmp.Diff(before, rawBucket(t, path, bucketJobs)); d != "" {
		t.Errorf("jobs bucket after the failed open (-before +after):\n%s", d)
	}
	if got := rawBucket(t, path, bucketQuarantine); len(got) != 0 {
		t.Errorf("quarantine bucket after the failed open: %v", got)
	}
}

// TestBoltStoreLeavesANestedBucketWhoseKeyIsTaken: a bucket inside the
// jobs bucket whose key the quarantine bucket already holds cannot be moved
// under another key (bbolt moves a bucket under its own key): it is left
// where it is, reported, never loaded, and its sequence number is not
// handed out; the record held in quarantine is kept.
func TestBoltStoreLeavesANestedBucketWhoseKeyIsTaken(t *testing.T) {
	path := filepath.Join(t.TempDir(), "jobs.db")
	goodStore(t, path)
	putRaw(t, path, bucketQuarantine, map[string][]byte{string(seqKey(10)): []byte("held")})
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.Bucket(bucketJobs).CreateBucket(seqKey(10))
		if err != nil {
			return err
		}
		return b.Put([]byte("x"), []byte("y"))
	})
	if err != nil || db.Close() != nil {
		t.Fatal(err)
	}
	for range 2 {
		s, err := OpenBolt(path, clocktesting.NewFakeClock(t0), 0, 0, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		hk := hex.EncodeToString(seqKey(10))
		want := []QuarantinedRecord{{Key: hk, Reason: "a bucket, not a job record; left in the jobs bucket (its key is taken in the quarantine bucket)"}}
		if d := cmp.Diff(want, s.Quarantined()); d != "" {
			t.Errorf("quarantined (-want +got):\n%s", d)
		}
		if got := s.QuarantinedHeld(); got != 1 {
			t.Errorf("QuarantinedHeld = %d, want 1", got)
		}
		if d := cmp.Diff(map[Status]int{StatusQueued: 1, StatusSucceeded: 1, StatusRunning: 1}, s.Counts()); d != "" {
			t.Errorf("counts (-want +got):\n%s", d)
		}
		j, err := s.Create(Job{Tenant: "a", Status: StatusQueued})
		if err != nil {
			t.Fatal(err)
		}
		if seq, _ := s.seqOf(j.ID); seq <= 10 {
			t.Errorf("next job's sequence number = %d, want above 10", seq)
		}
		if err := s.Delete(j.ID); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if d := cmp.Diff(map[string]string{hex.EncodeToString(seqKey(10)): "held"}, rawBucket(t, path, bucketQuarantine)); d != "" {
		t.Errorf("quarantine bucket (-want +got):\n%s", d)
	}
}
