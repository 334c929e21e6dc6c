package runtimeconfig

import (
	"errors"
	"math"
	"os"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
)

// captured returns a logger at verbosity 1 that appends its lines to lines.
func captured(lines *[]string) logr.Logger {
	return funcr.New(func(prefix, args string) { *lines = append(*lines, args) }, funcr.Options{Verbosity: 1})
}

// keepLimit restores the runtime's memory limit and clears the variables
// automemlimit reads, for the test.
func keepLimit(t *testing.T) {
	t.Helper()
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	for _, k := range []string{"GOMEMLIMIT", "AUTOMEMLIMIT"} {
		t.Setenv(k, "") // restored after the test
		if err := os.Unsetenv(k); err != nil {
			t.Fatal(err)
		}
	}
}

func TestApplyMemoryLimit(t *testing.T) {
	const gib = 1 << 30
	for _, tc := range []struct {
		name       string
		env        map[string]string
		provider   memlimit.Provider
		want       int64 // limit returned and in force
		wantCalled bool
		wantLog    string
	}{
		{name: "container limit 1 GiB: 90% of it", provider: memlimit.Limit(gib),
			want: 966367641, wantCalled: true, wantLog: `"msg"="Go runtime memory limit in force" "bytes"=966367641`},
		{name: "AUTOMEMLIMIT changes the ratio", env: map[string]string{"AUTOMEMLIMIT": "0.5"}, provider: memlimit.Limit(gib),
			want: gib / 2, wantCalled: true, wantLog: `"bytes"=536870912`},
		{name: "no limit: none set", provider: func() (uint64, error) { return 0, memlimit.ErrNoLimit },
			want: math.MaxInt64, wantCalled: true},
		{name: "not in a cgroup: default kept, said at V(1)", provider: func() (uint64, error) { return 0, memlimit.ErrNoCgroup },
			want: 12345678, wantCalled: true, wantLog: `"level"=1 "msg"="no cgroup memory limit found`},
		{name: "unreadable limit: default kept, logged as an error", provider: func() (uint64, error) { return 0, errors.New("permission denied") },
			want: 12345678, wantCalled: true, wantLog: `"error"="failed to set GOMEMLIMIT: permission denied"`},
		{name: "GOMEMLIMIT set: left alone", env: map[string]string{"GOMEMLIMIT": "100MiB"}, provider: memlimit.Limit(gib),
			want: 12345678, wantLog: `"msg"="Go runtime memory limit in force" "bytes"=12345678`},
		{name: "AUTOMEMLIMIT=off: left alone", env: map[string]string{"AUTOMEMLIMIT": "off"}, provider: memlimit.Limit(gib),
			want: 12345678, wantLog: `"bytes"=12345678`},
		{name: "AUTOMEMLIMIT not a ratio: default kept, logged as an error", env: map[string]string{"AUTOMEMLIMIT": "90%"}, provider: memlimit.Limit(gib),
			want: 12345678, wantLog: `"error"="cannot parse AUTOMEMLIMIT: 90%"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keepLimit(t)
			debug.SetMemoryLimit(12345678) // the limit before: what "kept" means
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			called := false
			provider := func() (uint64, error) { called = true; return tc.provider() }
			var lines []string
			got := applyMemoryLimit(captured(&lines), provider)
			if got != tc.want {
				t.Errorf("returned %d, want %d", got, tc.want)
			}
			if inForce := debug.SetMemoryLimit(-1); inForce != tc.want {
				t.Errorf("runtime memory limit %d, want %d", inForce, tc.want)
			}
			if called != tc.wantCalled {
				t.Errorf("provider called %v, want %v", called, tc.wantCalled)
			}
			log := strings.Join(lines, "\n")
			if tc.wantLog == "" && log != "" {
				t.Errorf("logged %q, want nothing", log)
			}
			if tc.wantLog != "" && !strings.Contains(log, tc.wantLog) {
				t.Errorf("logged %q, want it to contain %q", log, tc.wantLog)
			}
		})
	}
}
