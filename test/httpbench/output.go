package httpbench

import (
	"bufio"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/perf/benchfmt"
)

// Output writes results in the Go benchmark format (benchfmt.Writer) and
// keeps them for the caller (Results).
type Output struct {
	mu      sync.Mutex
	w       *benchfmt.Writer
	config  []benchfmt.Config
	results []*benchfmt.Result
}

// NewOutput returns an Output writing to w (nil: results are only kept),
// with the file configuration goos, goarch, cpu, nproc, date (RFC 3339,
// UTC), go and pkg.
func NewOutput(w io.Writer) *Output {
	o := &Output{}
	if w != nil {
		o.w = benchfmt.NewWriter(w)
	}
	for _, kv := range [][2]string{{"goos", runtime.GOOS}, {"goarch", runtime.GOARCH}, {"cpu", cpuModel()},
		{"nproc", strconv.Itoa(runtime.NumCPU())}, {"date", time.Now().UTC().Format(time.RFC3339)},
		{"go", runtime.Version()}, {"pkg", "github.com/fairshare-dev/fairshare/test/httpbench"}} {
		o.config = append(o.config, benchfmt.Config{Key: kv[0], Value: []byte(kv[1]), File: true})
	}
	return o
}

// cpuModel returns the "model name" of /proc/cpuinfo ("unknown" if none).
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// Unit is one measurement of a result row: its value and its unit
// (p50-us, rps-p99-5ms, ...).
type Unit struct {
	// Unit names the measurement and its unit, e.g. "p99-us" (µs),
	// "rss-idle-MB" (2^20 bytes), "rps-p99-5ms" (requests/s).
	Unit string
	// Value is the measurement in that unit.
	Value float64
}

// Add writes one result line, BenchmarkName iters value unit ...; name is
// without the "Benchmark" prefix (e.g. "HTTPAddedLatency/upstream=instant/peer=direct").
func (o *Output) Add(name string, iters int, units ...Unit) error {
	r := &benchfmt.Result{Config: o.config, Name: benchfmt.Name(name), Iters: iters}
	for _, u := range units {
		r.Values = append(r.Values, benchfmt.Value{Value: u.Value, Unit: u.Unit})
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.results = append(o.results, r)
	if o.w != nil {
		return o.w.Write(r)
	}
	return nil
}

// Results returns the results added so far.
func (o *Output) Results() []*benchfmt.Result {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]*benchfmt.Result(nil), o.results...)
}
