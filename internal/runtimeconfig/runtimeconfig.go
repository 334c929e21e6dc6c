// Package runtimeconfig sizes the Go runtime to the container it runs in, for
// the operator and the scheduler.
//
// GOMAXPROCS follows the container's CPU limit by itself since Go 1.25. The
// soft memory limit does not: without one, the garbage collector sizes the
// heap only by GOGC (the heap may grow to twice the live heap before a
// collection) and a pod near its memory limit is OOM-killed instead of
// collecting sooner. ApplyMemoryLimit sets it from the cgroup's memory limit
// with github.com/KimMachineGun/automemlimit, as the Go GC guide
// (go.dev/doc/gc-guide, "Memory limit") recommends for containers.
package runtimeconfig

import (
	"errors"
	"io"
	"log/slog"
	"math"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/go-logr/logr"
)

// DefaultMemoryLimitRatio is the fraction of the container's memory limit
// given to the Go runtime as its soft memory limit (GOMEMLIMIT). The other
// 10% is headroom for memory the limit does not govern well: goroutine
// stacks growing between collections, the binary's mapped pages and the
// kernel's accounting of them.
const DefaultMemoryLimitRatio = 0.9

// ApplyMemoryLimit sets the Go runtime's soft memory limit to
// DefaultMemoryLimitRatio of the cgroup's memory limit (cgroup v2
// memory.max or v1 memory.limit_in_bytes) and returns the limit in force,
// in bytes (math.MaxInt64: none).
//
// It leaves the limit alone when the environment sets GOMEMLIMIT (the Go
// runtime has applied it) or AUTOMEMLIMIT=off; AUTOMEMLIMIT=0.8 changes the
// ratio (automemlimit's variables). A process with no memory limit, or not
// in a cgroup, keeps the runtime's default (no limit). It never fails: a
// limit it cannot read or apply is logged on log (at V(1) when the process
// is not in a cgroup, as on a developer's machine) and the default kept.
func ApplyMemoryLimit(log logr.Logger) int64 {
	return applyMemoryLimit(log, memlimit.FromCgroup)
}

// applyMemoryLimit is ApplyMemoryLimit with the limit read from provider.
func applyMemoryLimit(log logr.Logger, provider memlimit.Provider) int64 {
	limit, err := memlimit.Set(
		memlimit.WithProvider(provider),
		memlimit.WithRatio(DefaultMemoryLimitRatio),
		// automemlimit's own log lines would bypass the process's
		// logger; the outcome is logged below instead.
		memlimit.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
	)
	switch {
	case errors.Is(err, memlimit.ErrCgroupsNotSupported), errors.Is(err, memlimit.ErrNoCgroup):
		log.V(1).Info("no cgroup memory limit found, the Go runtime's memory limit is not set", "reason", err.Error())
	case err != nil:
		log.Error(err, "setting the Go runtime's memory limit from the container's memory limit")
	case limit != math.MaxInt64:
		log.Info("Go runtime memory limit in force", "bytes", limit)
	}
	return limit
}
