package gateway

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/providerkey"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// writeKeyFile replaces the key file's content at once, as the kubelet does
// for a mounted Secret (a new file swapped in, never a partial write).
func writeKeyFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o400); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestProviderKeyRotation: a provider key rotated in the mounted
// credentials Secret is used by the next upstream call after the
// scheduler's next re-read of the file, without a restart; an emptied or
// removed file keeps the last good key (the kubelet swapping files, a
// Secret emptied by mistake); provider bodies have the new key and the one
// it replaced redacted.
func TestProviderKeyRotation(t *testing.T) {
	const oldKey, newKey = "sk-old-provider-key", "sk-new-provider-key"
	var quote atomic.Bool
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if quote.Load() {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":{"message":"keys ` + oldKey + ` and ` + newKey + `","type":"invalid_request_error"}}`))
			return
		}
		okJSON(10, 20)(w, r, body)
	})
	path := filepath.Join(t.TempDir(), "api-key")
	writeKeyFile(t, path, oldKey+"\n")
	key := providerkey.New("")
	fc := clocktesting.NewFakeClock(t0)
	loaded := make(chan error, 1)
	f := &providerkey.File{Path: path, Key: key, Clock: fc, Interval: 10 * time.Second, Log: logr.Discard(),
		Loaded: func(err error) { loaded <- err }}
	if err := f.Load(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = f.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "the re-read ticker", fc.HasWaiters)
	reread := func() error {
		t.Helper()
		fc.Step(10 * time.Second)
		select {
		case err := <-loaded:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("the key file was not read again after the interval")
			return nil
		}
	}

	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})}, withProviderKey(key))
	call := func(want string) {
		t.Helper()
		resp := e.do("POST", "/v1/completions", "key-a", completionsBody(10, 20, ""))
		b := readAll(t, resp)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		e.up.mu.Lock()
		got := e.up.headers[len(e.up.headers)-1].Get("Authorization")
		e.up.mu.Unlock()
		if got != "Bearer "+want {
			t.Errorf("upstream Authorization %q, want %q", got, "Bearer "+want)
		}
	}
	call(oldKey)

	writeKeyFile(t, path, "  "+newKey+"\n")
	if err := reread(); err != nil {
		t.Fatalf("re-read: %v", err)
	}
	call(newKey)

	quote.Store(true)
	resp := e.do("POST", "/v1/completions", "key-a", completionsBody(10, 20, ""))
	b := readAll(t, resp)
	if bytes.Contains(b, []byte(oldKey)) || bytes.Contains(b, []byte(newKey)) || bytes.Count(b, []byte("[REDACTED]")) != 2 {
		t.Errorf("provider body passed on %s, want both keys redacted", b)
	}
	quote.Store(false)

	writeKeyFile(t, path, "\n")
	if err := reread(); !errors.Is(err, providerkey.ErrEmpty) {
		t.Fatalf("re-read of an emptied file: %v, want %v", err, providerkey.ErrEmpty)
	}
	call(newKey)

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := reread(); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("re-read of a removed file: %v, want not exist", err)
	}
	call(newKey)

	writeKeyFile(t, path, oldKey)
	if err := reread(); err != nil {
		t.Fatalf("re-read: %v", err)
	}
	call(oldKey)
}
