// Package providerkey holds the pool's provider API key for the gateway and
// keeps it current from a file: the pool's credentials Secret mounted by the
// kubelet, which rewrites the file within about a minute of a change of the
// Secret. A rotated key is thereby used without restarting the scheduler,
// which an environment variable (fixed at container start) could not do.
//
// The key is never logged.
package providerkey

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
)

// DefaultInterval is how often File re-reads the key file.
const DefaultInterval = 10 * time.Second

// redacted replaces a provider key in a body passed to tenants or stored.
var redacted = []byte("[REDACTED]")

// Key is the current provider key, safe for concurrent use: read on every
// upstream call (one atomic load, no allocation), replaced by Set.
type Key struct {
	mu  sync.Mutex // serialises Set
	cur atomic.Pointer[value]
}

type value struct {
	key string
	// auth is the Authorization header value, "Bearer <key>"; "" without
	// a key.
	auth string
	// prev is the key before the last rotation: still redacted, since a
	// call sent just before the rotation may be answered after it.
	prev string
}

// New returns a Key holding key ("" for none).
func New(key string) *Key {
	k := &Key{}
	k.cur.Store(newValue(key, ""))
	return k
}

func newValue(key, prev string) *value {
	v := &value{key: key, prev: prev}
	if key != "" {
		v.auth = "Bearer " + key
	}
	return v
}

func (k *Key) load() *value {
	if v := k.cur.Load(); v != nil {
		return v
	}
	return &value{}
}

// Authorization returns the upstream Authorization header value,
// "Bearer <key>", or "" when there is no key.
func (k *Key) Authorization() string { return k.load().auth }

// Present reports whether there is a key.
func (k *Key) Present() bool { return k.load().key != "" }

// Set makes key the current key and reports whether it changed; the
// key it replaces is still redacted until the next change.
func (k *Key) Set(key string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	old := k.load()
	if old.key == key {
		return false
	}
	k.cur.Store(newValue(key, old.key))
	return true
}

// Redact returns b with every occurrence of the current key and of the
// one before the last rotation replaced by "[REDACTED]": the backstop for
// provider bodies passed to tenants or stored with jobs. b is returned as
// is when neither occurs in it.
func (k *Key) Redact(b []byte) []byte {
	v := k.load()
	return redact(redact(b, v.key), v.prev)
}

func redact(b []byte, key string) []byte {
	if key == "" || !bytes.Contains(b, []byte(key)) {
		return b
	}
	return bytes.ReplaceAll(b, []byte(key), redacted)
}

// File keeps Key current from the file at Path: Load reads it once, Start
// every Interval. Surrounding whitespace is trimmed (a trailing newline of
// a Secret made from a file), as for the tenants' keys. An empty or
// unreadable file keeps the current key; the error is logged once for each
// change of the error, not on every read.
type File struct {
	// Path of the key file (the mounted Secret's item).
	Path string
	// Key receives the file's key.
	Key *Key
	// Clock drives the re-reads; nil is the real clock.
	Clock clock.WithTicker
	// Interval between re-reads; <= 0 means DefaultInterval.
	Interval time.Duration
	// Log receives the rotations and read errors, never the key.
	Log logr.Logger
	// Loaded, when set, is called after each read by Start with its
	// error (tests).
	Loaded func(error)

	// lastErr is the last error logged, "" after a good read (Load and
	// Start's loop only, never concurrently).
	lastErr string
}

// ErrEmpty is Load's error for a file holding only whitespace.
var ErrEmpty = errors.New("the provider key file is empty")

// Load reads the file once and makes its key current when it differs
// (logged as a rotation after the first key). On error the current key is
// kept and the error returned.
func (f *File) Load() error {
	key, err := f.read()
	if err != nil {
		if msg := err.Error(); msg != f.lastErr {
			f.lastErr = msg
			f.Log.Error(err, "keeping the current provider key", "path", f.Path, "keyPresent", f.Key.Present())
		}
		return err
	}
	if f.lastErr != "" {
		f.lastErr = ""
		f.Log.Info("the provider key file is readable again", "path", f.Path)
	}
	had := f.Key.Present()
	if f.Key.Set(key) && had {
		f.Log.Info("the provider key changed; upstream calls use the new key", "path", f.Path)
	}
	return nil
}

func (f *File) read() (string, error) {
	b, err := os.ReadFile(f.Path)
	if err != nil {
		return "", fmt.Errorf("reading the provider key file: %w", err)
	}
	key := strings.TrimSpace(string(b))
	if key == "" {
		return "", ErrEmpty
	}
	return key, nil
}

// Start re-reads the file every Interval until ctx is done (a
// controller-runtime Runnable, run on every replica so that a standby
// taking over has the current key).
func (f *File) Start(ctx context.Context) error {
	clk := f.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	interval := f.Interval
	if interval <= 0 {
		interval = DefaultInterval
	}
	t := clk.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
			err := f.Load()
			if f.Loaded != nil {
				f.Loaded(err)
			}
		}
	}
}

// NeedLeaderElection: every replica keeps its key current.
func (f *File) NeedLeaderElection() bool { return false }
