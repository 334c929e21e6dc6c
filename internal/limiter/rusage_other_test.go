//go:build !unix

package limiter

// cpuNanos is not available on this platform.
func cpuNanos() int64 { return -1 }
