package jobs

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
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

// TestJobRecordSize pins the stored size of a job without body, metadata
// and response (the fixed part of the sizing in the BoltStore doc).
func TestJobRecordSize(t *testing.T) {
	j := fullJob()
	j.ID, j.Body, j.Metadata, j.Response = newID(1), nil, nil, nil
	b, err := json.Marshal(j)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(b); n > 640 {
		t.Errorf("a job record without bodies takes %d bytes, more than 640", n)
	}
	t.Logf("record without bodies: %d bytes", len(b))
}
