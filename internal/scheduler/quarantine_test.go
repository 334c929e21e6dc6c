package scheduler

import (
	"context"
	"encoding/binary"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	bolt "go.etcd.io/bbolt"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fairshare-dev/fairshare/internal/gateway"
	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/metrics"
)

// TestOpenStoreReportsQuarantinedRecords: the leader opens a job store
// file holding records that are not jobs; it serves the good job, logs
// each quarantined record by key and reason (never its content), and
// job_store_quarantined_records shows the records the file holds in
// quarantine, also after a reopen that quarantines nothing more.
func TestOpenStoreReportsQuarantinedRecords(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(t0)
	path := filepath.Join(t.TempDir(), "jobs.db")
	s, err := jobs.OpenBolt(path, clk, 0, 0, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	good, err := s.Create(jobs.Job{Tenant: "a", Status: jobs.StatusQueued, CreatedAt: t0})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	secret := `"messages":[{"role":"user","content":"tenant secret"}]`
	cut := `{"Tenant":"a","Body":{` + secret + `},` // 78 bytes, ends mid-object
	keyed := `{"Tenant":"a","Status":"queued","Body":{` + secret + `}}`
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("jobs"))
		var k [8]byte
		binary.BigEndian.PutUint64(k[:], 7)
		if err := b.Put(k[:], []byte(cut)); err != nil {
			return err
		}
		return b.Put([]byte("abc"), []byte(keyed))
	})
	if err != nil || db.Close() != nil {
		t.Fatal(err)
	}

	open := func() (*jobs.BoltStore, float64, []string) {
		t.Helper()
		var logs []string
		prom := prometheus.NewRegistry()
		m := metrics.New(prom, nil)
		l := &leaderGateway{storePath: path, lockTimeout: time.Second,
			log:  funcr.New(func(prefix, args string) { logs = append(logs, args) }, funcr.Options{}),
			opts: gateway.Options{Clock: clk, Metrics: m}}
		bs, err := l.openStore(context.Background())
		if err != nil || bs == nil {
			t.Fatalf("openStore: %v, %v", bs, err)
		}
		return bs, testutil.ToFloat64(m.JobStoreQuarantined), logs
	}
	bs, gauge, logs := open()
	if _, err := bs.Get(good.ID); err != nil {
		t.Errorf("good job: %v", err)
	}
	if gauge != 2 {
		t.Errorf("job_store_quarantined_records = %v, want 2", gauge)
	}
	line := `"level"=0 "msg"="job store record not loaded: moved to the file's quarantine bucket" "path"="` + path + `" `
	wantLogs := []string{
		line + `"key"="0000000000000007" "quarantineKey"="0000000000000007" "reason"="not valid JSON (syntax error at byte 78)" "bytes"=` +
			strconv.Itoa(len(cut)),
		line + `"key"="616263" "quarantineKey"="616263" "reason"="key of 3 bytes, want 8 (a big-endian sequence number)" "bytes"=` +
			strconv.Itoa(len(keyed)),
		`"level"=0 "msg"="opened the job store" "path"="` + path + `" "waited"=`,
	}
	if len(logs) != len(wantLogs) {
		t.Fatalf("logs:\n%s\nwant %d lines", strings.Join(logs, "\n"), len(wantLogs))
	}
	for i, want := range wantLogs {
		if !strings.HasPrefix(logs[i], want) {
			t.Errorf("log line %d:\n%s\nwant it to begin with\n%s", i, logs[i], want)
		}
		if strings.Contains(logs[i], "tenant secret") {
			t.Errorf("log line %d shows a record's content: %s", i, logs[i])
		}
	}
	if !strings.HasSuffix(logs[2], `"quarantinedRecords"=2`) {
		t.Errorf("open log line: %s, want quarantinedRecords 2", logs[2])
	}
	if err := bs.Close(); err != nil {
		t.Fatal(err)
	}

	bs, gauge, logs = open()
	defer bs.Close()
	if gauge != 2 {
		t.Errorf("after a reopen, job_store_quarantined_records = %v, want 2", gauge)
	}
	if len(logs) != 1 || !strings.HasSuffix(logs[0], `"quarantinedRecords"=2`) {
		t.Errorf("reopen logs:\n%s\nwant only the open line, with quarantinedRecords 2", strings.Join(logs, "\n"))
	}
}
