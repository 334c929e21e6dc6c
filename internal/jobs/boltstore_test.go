package jobs

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
	clocktesting "k8s.io/utils/clock/testing"
)

// fullJob has every field of Job set (except ID and the sequence).
func fullJob() Job {
	return Job{
		Tenant: "a", Status: StatusSucceeded, Endpoint: "/v1/chat/completions", Model: "gpt-test",
		Body:         json.RawMessage(`{"model":"gpt-test","messages":[{"role":"user","content":"<hi> & bye"}]}`),
		PromptTokens: 12, MaxOutputTokens: 4096,
		Metadata:  json.RawMessage(`{"batch":"b1"}`),
		CreatedAt: t0, StartedAt: t0.Add(1500 * time.Millisecond), FinishedAt: t0.Add(2 * time.Second),
		Deadline: t0.Add(time.Hour),
		Attempts: 2, DispatchSeq: 7, QueueWait: 1500 * time.Millisecond,
		Usage:     &Usage{PromptTokens: 12, CompletionTokens: 30},
		Response:  json.RawMessage(`{"id":"cmpl-1"}`),
		Error:     &Error{Code: "upstream_error", Message: "retried"},
		Recovered: true,
		// The longest key the gateway accepts, and a SHA-256 in hex.
		IdempotencyKey:         strings.Repeat("k", 255),
		IdempotencyFingerprint: strings.Repeat("f", 64),
	}
}

func TestBoltStoreRoundTripsEveryField(t *testing.T) {
	fc := clocktesting.NewFakeClock(t0.Add(3 * time.Second))
	path := filepath.Join(t.TempDir(), "jobs.db")
	s, err := OpenBolt(path, fc, 0, 0, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	full, err := s.Create(fullJob())
	if err != nil {
		t.Fatal(err)
	}
	bare, err := s.Create(Job{Tenant: "b", Status: StatusQueued, CreatedAt: t0})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = OpenBolt(path, fc, 0, 0, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, want := range []Job{full, bare} {
		got, err := s.Get(want.ID)
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(want, got, cmp.AllowUnexported(Job{})); d != "" {
			t.Errorf("job %s after reopen (-want +got):\n%s", want.ID, d)
		}
	}
	if d := cmp.Diff([]string{bare.ID}, ids(s.Pending())); d != "" {
		t.Errorf("pending (-want +got):\n%s", d)
	}
}

func TestBoltStoreLockedFileTimesOut(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "jobs.db")
	fc := clocktesting.NewFakeClock(t0)
	s, err := OpenBolt(path, fc, 0, 0, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = OpenBolt(path, fc, 0, 0, 50*time.Millisecond)
	if !errors.Is(err, bolterrors.ErrTimeout) || !strings.Contains(err.Error(), "locked by another process") {
		t.Fatalf("second open: %v", err)
	}
}

func TestBoltStoreClosedRefusesWrites(t *testing.T) {
	s, err := OpenBolt(filepath.Join(t.TempDir(), "jobs.db"), clocktesting.NewFakeClock(t0), 0, 0, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	j, _ := s.Create(Job{Tenant: "a", Status: StatusQueued})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(Job{Tenant: "a", Status: StatusQueued}); err == nil {
		t.Error("create after close succeeded")
	}
	if _, err := s.Update(j.ID, func(j *Job) error { j.Status = StatusRunning; return nil }); err == nil {
		t.Error("update after close succeeded")
	}
	if got, _ := s.Get(j.ID); got.Status != StatusQueued {
		t.Errorf("a refused update changed the job in memory: %s", got.Status)
	}
}

// TestBoltStoreRebuildsTheIdempotencyIndex: after a reopen, a job's
// idempotency key is still held (ByIdempotencyKey finds it, Create with it
// returns it with ErrIdempotencyKeyHeld and stores nothing) and is freed
// by the job's deletion, which also survives a reopen.
func TestBoltStoreRebuildsTheIdempotencyIndex(t *testing.T) {
	fc := clocktesting.NewFakeClock(t0)
	path := filepath.Join(t.TempDir(), "jobs.db")
	s, err := OpenBolt(path, fc, 0, 0, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	keyed, err := s.Create(Job{Tenant: "a", Status: StatusQueued, IdempotencyKey: "k1", IdempotencyFingerprint: "f1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	reopen := func() *BoltStore {
		t.Helper()
		s, err := OpenBolt(path, fc, 0, 0, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s = reopen()
	if got, ok := s.ByIdempotencyKey("a", "k1"); !ok || got.ID != keyed.ID || got.IdempotencyFingerprint != "f1" {
		t.Fatalf("ByIdempotencyKey after reopen: %+v %v, want job %s", got, ok, keyed.ID)
	}
	if _, ok := s.ByIdempotencyKey("b", "k1"); ok {
		t.Error("tenant b found tenant a's key")
	}
	got, err := s.Create(Job{Tenant: "a", Status: StatusQueued, IdempotencyKey: "k1", IdempotencyFingerprint: "f2"})
	if !errors.Is(err, ErrIdempotencyKeyHeld) || got.ID != keyed.ID {
		t.Fatalf("Create with the held key after reopen: %s %v, want %s and ErrIdempotencyKeyHeld", got.ID, err, keyed.ID)
	}
	if d := cmp.Diff(map[Status]int{StatusQueued: 1}, s.Counts()); d != "" {
		t.Errorf("counts (-want +got):\n%s", d)
	}
	if err := s.Delete(keyed.ID); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.ByIdempotencyKey("a", "k1"); ok {
		t.Fatal("the deleted job's key is still held")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = reopen()
	defer s.Close()
	if _, ok := s.ByIdempotencyKey("a", "k1"); ok {
		t.Fatal("the deleted job's key is held after reopen")
	}
	if j, err := s.Create(Job{Tenant: "a", Status: StatusQueued, IdempotencyKey: "k1", IdempotencyFingerprint: "f2"}); err != nil || j.ID == keyed.ID {
		t.Fatalf("Create with the freed key: %s %v", j.ID, err)
	}
}

// TestJobRecordSize pins the stored size of a job without body, metadata
// and response (the fixed part of the sizing in the BoltStore doc), with
// the longest idempotency key (255 characters) and its fingerprint.
func TestJobRecordSize(t *testing.T) {
	j := fullJob()
	j.ID, j.Body, j.Metadata, j.Response = NewMemStore(clocktesting.NewFakeClock(t0), 0, 0).newID(1), nil, nil, nil
	b, err := json.Marshal(j)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(b); n > 1024 {
		t.Errorf("a job record without bodies takes %d bytes, more than 1024", n)
	}
	// Without a key, the record has no idempotency members.
	j.IdempotencyKey, j.IdempotencyFingerprint = "", ""
	if b, _ := json.Marshal(j); len(b) > 640 {
		t.Errorf("a job record without bodies and key takes %d bytes, more than 640", len(b))
	}
	t.Logf("record without bodies: %d bytes", len(b))
}

// A job store file written by an earlier version (legacy ids, no id key)
// opens: its jobs keep their ids, which page as cursors; the store gets a
// key, kept in the file, and new jobs get encrypted ids that still page
// after the next reopen.
func TestBoltStoreOpensAFileWithLegacyIDs(t *testing.T) {
	fc := clocktesting.NewFakeClock(t0)
	path := filepath.Join(t.TempDir(), "jobs.db")
	s, err := OpenBolt(path, fc, 0, 0, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := s.Create(Job{Tenant: "a", Status: StatusQueued}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Make it the file of an earlier version.
	legacy := []string{"job_0000000000000001aaaaaaaa", "job_0000000000000002bbbbbbbb", "job_0000000000000003cccccccc"}
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketMeta).Delete(keyIDKey); err != nil {
			return err
		}
		jb := tx.Bucket(bucketJobs)
		for i, id := range legacy {
			var j Job
			if err := json.Unmarshal(jb.Get(seqKey(uint64(i+1))), &j); err != nil {
				return err
			}
			j.ID = id
			v, err := json.Marshal(j)
			if err != nil {
				return err
			}
			if err := jb.Put(seqKey(uint64(i+1)), v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil || db.Close() != nil {
		t.Fatal(err)
	}

	s, err = OpenBolt(path, fc, 0, 0, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(legacy[1]); err != nil {
		t.Errorf("legacy id %s: %v", legacy[1], err)
	}
	if d := cmp.Diff(legacy[1:], ids(must(s.List("a", Filter{After: legacy[0]})))); d != "" {
		t.Errorf("after a legacy id (-want +got):\n%s", d)
	}
	j, err := s.Create(Job{Tenant: "a", Status: StatusQueued})
	if err != nil {
		t.Fatal(err)
	}
	if len(j.ID) != len("job_")+32 {
		t.Errorf("new id %q is not encrypted", j.ID)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = OpenBolt(path, fc, 0, 0, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if d := cmp.Diff([]string{j.ID}, ids(must(s.List("a", Filter{After: legacy[2]})))); d != "" {
		t.Errorf("after the last legacy id (-want +got):\n%s", d)
	}
	// The earlier form is a cursor up to the last legacy id only: beyond
	// it, it would show the sequence number of new jobs.
	if _, _, err := s.List("a", Filter{After: "job_0000000000000004dddddddd"}); !errors.Is(err, ErrInvalidCursor) {
		t.Errorf("legacy-form cursor past the legacy ids: %v, want ErrInvalidCursor", err)
	}
	k, err := s.Create(Job{Tenant: "a", Status: StatusQueued})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{k.ID}, ids(must(s.List("a", Filter{After: j.ID})))); d != "" {
		t.Errorf("after an id from before the reopen (-want +got):\n%s", d)
	}
}

// TestRestoredStoreHandsOutNoIDAgain: a store opened on an older copy of
// its file (a restored backup) goes back in its sequence numbers, but never
// hands out an id it handed out before: the client holding such an id gets
// ErrNotFound, never the job another submission got since. The ids handed
// out before the restore stay valid list cursors. An id of generation 0
// (made before ids carried one) is still a cursor.
func TestRestoredStoreHandsOutNoIDAgain(t *testing.T) {
	fc := clocktesting.NewFakeClock(t0)
	dir := t.TempDir()
	path, backup := filepath.Join(dir, "jobs.db"), filepath.Join(dir, "backup.db")
	s, err := OpenBolt(path, fc, 0, 0, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	first, err := s.Create(Job{Tenant: "a", Status: StatusQueued, CreatedAt: t0})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(backup, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err = OpenBolt(path, fc, 0, 0, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	lost, err := s.Create(Job{Tenant: "a", Status: StatusQueued, CreatedAt: t0})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// The backup, taken before lost was submitted, is restored.
	s, err = OpenBolt(backup, fc, 0, 0, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	again, err := s.Create(Job{Tenant: "a", Status: StatusQueued, CreatedAt: t0, Model: "again"})
	if err != nil {
		t.Fatal(err)
	}
	if again.seq != lost.seq {
		t.Fatalf("sequence numbers: %d after the restore, %d before: the test needs them equal", again.seq, lost.seq)
	}
	if again.ID == lost.ID {
		t.Fatalf("the restored store handed out %s again", lost.ID)
	}
	if _, err := s.Get(lost.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get(id handed out before the restore): %v, want ErrNotFound", err)
	}
	if got, _, err := s.List("a", Filter{After: lost.ID}); err != nil || len(got) != 0 {
		t.Errorf("List after the id handed out before the restore: %d jobs, %v; want 0, nil", len(got), err)
	}
	got, _, err := s.List("a", Filter{After: first.ID})
	if err != nil || len(got) != 1 || got[0].ID != again.ID {
		t.Errorf("List after the first id: %v, %v; want [%s]", got, err, again.ID)
	}
	gen0 := s.MemStore.gen
	s.MemStore.gen = 0
	old := s.newID(first.seq)
	s.MemStore.gen = gen0
	if seq, ok := s.seqOf(old); !ok || seq != first.seq {
		t.Errorf("seqOf(id of generation 0) = %d, %v; want %d, true", seq, ok, first.seq)
	}
}
