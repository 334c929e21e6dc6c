//go:build unix

package limiter

import "syscall"

// cpuNanos returns the CPU time (user + system) of the process so far, in
// nanoseconds, or -1 when it is not available.
func cpuNanos() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
