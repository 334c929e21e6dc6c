package main

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// sample is a small raw file as `go test -bench` and test/httpbench print it: three runs of the
// single-tenant admission pair, one header-parsing pair, HTTP rows (the proxy's latency row without
// a tenants part) and lines that are not results.
const sample = `goos: linux
goarch: amd64
pkg: github.com/fairshare-dev/fairshare/internal/limiter
cpu: Test CPU 9000    
BenchmarkAdmit-2                	 1000000	       100.0 ns/op	      96 B/op	       0 allocs/op
BenchmarkAdmit-2                	 1000000	       120.0 ns/op	      96 B/op	       0 allocs/op
BenchmarkAdmit-2                	 1000000	       300.0 ns/op	      96 B/op	       0 allocs/op
BenchmarkXRate2AllowN-2         	 1000000	        80.0 ns/op	       0 B/op	       0 allocs/op
BenchmarkXRate2AllowN-2         	 1000000	        90.0 ns/op	       0 B/op	       0 allocs/op
BenchmarkXRate2AllowN-2         	 1000000	        10.0 ns/op	       0 B/op	       0 allocs/op
PASS
ok  	github.com/fairshare-dev/fairshare/internal/limiter	12.3s
pkg: github.com/fairshare-dev/fairshare/internal/throttle
BenchmarkHeaderParse/dialect=openai/ParseHeaders-2     	 5000000	       250 ns/op	       0 B/op	       0 allocs/op
BenchmarkHeaderParse/dialect=openai/strconv.ParseInt-2 	 5000000	       100 ns/op	       0 B/op	       0 allocs/op
--- BENCH: BenchmarkSomething
    bench_test.go:12: a log line
pkg: github.com/fairshare-dev/fairshare/test/httpbench
BenchmarkHTTPAddedLatency/upstream=instant/peer=proxy 	 20000	 40 p50-us	 90 p99-us	 150 p99.9-us	 20 p50-added-us	 60 p99-added-us	 35 cpu-us/req	 0 errors
BenchmarkHTTPAddedLatency/upstream=instant/peer=gateway/tenants=1 	 20000	 44 p50-us	 100 p99-us	 170 p99.9-us	 24 p50-added-us	 100 p99-added-us	 40 cpu-us/req	 0 errors
BenchmarkHTTPSSE/streams=512/peer=proxy 	 1 	 100 gap-p50-us	 400 gap-p99-us	 900 gap-max-us	 0 stalls	 800 ttft-p99-us
BenchmarkHTTPSSE/streams=512/peer=gateway 	 1 	 110 gap-p50-us	 450 gap-p99-us	 950 gap-max-us	 1 stalls	 900 ttft-p99-us
BenchmarkHTTPMemory/peer=proxy 	 1 	 10.5 rss-idle-MB	 20 rss-steady-MB	 21 rss-after-MB
BenchmarkHTTPMemory/peer=gateway/tenants=1 	 1 	 25.0 rss-idle-MB	 40 rss-steady-MB	 41 rss-after-MB
BenchmarkGoodput/dialect=openai/client=gateway-2 	 1 	 99.5 util%	 0 429s	 0 warmup429s
cpu: Other CPU
BenchmarkHTTPFrontier/upstream=instant/peer=proxy 	 1 	 0 rps-p99-5ms	 0 rps-p99-10ms	 400 rps-p99-50ms
BenchmarkHTTPFrontier/upstream=instant/peer=gateway/tenants=10000 	 1 	 0 rps-p99-5ms	 200 rps-p99-10ms	 300 rps-p99-50ms
BenchmarkHTTPAddedLatency/upstream=20ms/peer=proxy 	 1 	 -5 p50-added-us	 0 p99-added-us
BenchmarkHTTPAddedLatency/upstream=20ms/peer=gateway/tenants=1 	 1 	 -7 p50-added-us	 3 p99-added-us
`

func loadSample(t *testing.T) *Results {
	t.Helper()
	s := newResults()
	if err := s.read(strings.NewReader(sample), "sample.txt"); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestReadNamesUnitsMedians(t *testing.T) {
	s := loadSample(t)
	if got := s.config["cpu"]; got != "Test CPU 9000; Other CPU" {
		t.Errorf("cpu = %q", got)
	}
	for _, c := range []struct {
		name, unit string
		runs       []float64
		median     float64
	}{
		{"BenchmarkAdmit", "ns/op", []float64{100, 120, 300}, 120},
		{"BenchmarkAdmit", "B/op", []float64{96, 96, 96}, 96},
		{"BenchmarkXRate2AllowN", "ns/op", []float64{80, 90, 10}, 80},
		{"BenchmarkHeaderParse/dialect=openai/strconv.ParseInt", "ns/op", []float64{100}, 100},
		{"BenchmarkHTTPMemory/peer=gateway/tenants=1", "rss-idle-MB", []float64{25}, 25},
		{"BenchmarkGoodput/dialect=openai/client=gateway", "util%", []float64{99.5}, 99.5},
		// No tenants part in the file: matched with it stripped.
		{"BenchmarkHTTPAddedLatency/upstream=instant/peer=proxy/tenants=1", "p99-added-us", []float64{60}, 60},
	} {
		got := s.lookup(c.name, c.unit)
		if len(got) != len(c.runs) {
			t.Errorf("%s %s: runs %v, want %v", c.name, c.unit, got, c.runs)
			continue
		}
		for i := range got {
			if got[i] != c.runs[i] {
				t.Errorf("%s %s: runs %v, want %v", c.name, c.unit, got, c.runs)
			}
		}
		if m := median(got); m != c.median {
			t.Errorf("%s %s: median %v, want %v", c.name, c.unit, m, c.median)
		}
	}
	for _, absent := range []string{
		"BenchmarkHTTPAddedLatency/upstream=50ms/peer=proxy",
		// Another tenant count is another benchmark, not a fallback.
		"BenchmarkHTTPAddedLatency/upstream=instant/peer=gateway/tenants=10000",
	} {
		if got := s.lookup(absent, "p50-added-us"); got != nil {
			t.Errorf("absent benchmark %s: %v", absent, got)
		}
	}
	if m := median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Errorf("even median %v, want 2.5", m)
	}
}

func TestEvaluate(t *testing.T) {
	ts := []Target{
		{Area: "a", What: "ratio with bytes bound", Bench: "BenchmarkAdmit", Unit: "ns/op", PeerBench: "BenchmarkXRate2AllowN", PeerUnit: "ns/op",
			Cmp: RatioMax, Threshold: 2, Also: []Bound{{Unit: "B/op", Max: 0}}},
		{Area: "a", What: "ratio only", Bench: "BenchmarkAdmit", Unit: "ns/op", PeerBench: "BenchmarkXRate2AllowN", PeerUnit: "ns/op",
			Cmp: RatioMax, Threshold: 2},
		{Area: "a", What: "ratio too tight", Bench: "BenchmarkAdmit", Unit: "ns/op", PeerBench: "BenchmarkXRate2AllowN", PeerUnit: "ns/op",
			Cmp: RatioMax, Threshold: 1.49},
		{Area: "h", What: "header", Bench: "BenchmarkHeaderParse/dialect=openai/ParseHeaders", Unit: "ns/op",
			PeerBench: "BenchmarkHeaderParse/dialect=openai/strconv.ParseInt", PeerUnit: "ns/op", Cmp: RatioMax, Threshold: 3,
			Also: []Bound{{Unit: "allocs/op", Max: 1}}},
		{Area: "s", What: "speed-up", Bench: "BenchmarkXRate2AllowN", Unit: "ns/op", PeerBench: "BenchmarkAdmit", PeerUnit: "ns/op",
			Cmp: SpeedupMin, Threshold: 1.5},
		{Area: "l", What: "p99 added", Bench: "BenchmarkHTTPAddedLatency/upstream=instant/peer=gateway/tenants=1", Unit: "p99-added-us",
			PeerBench: "BenchmarkHTTPAddedLatency/upstream=instant/peer=proxy", PeerUnit: "p99-added-us", Cmp: RatioMax, Threshold: 1.5},
		{Area: "l", What: "p50 added", Bench: "BenchmarkHTTPAddedLatency/upstream=instant/peer=gateway/tenants=1", Unit: "p50-added-us",
			PeerBench: "BenchmarkHTTPAddedLatency/upstream=instant/peer=proxy", PeerUnit: "p50-added-us", Cmp: RatioMax, Threshold: 1.25},
		{Area: "sse", What: "gap", Bench: "BenchmarkHTTPSSE/streams=512/peer=gateway", Unit: "gap-p99-us",
			PeerBench: "BenchmarkHTTPSSE/streams=512/peer=proxy", PeerUnit: "gap-p99-us", Cmp: DiffMax, Threshold: 50},
		{Area: "sse", What: "stalls", Bench: "BenchmarkHTTPSSE/streams=512/peer=gateway", Unit: "stalls", Cmp: Max, Threshold: 0},
		{Area: "g", What: "util", Bench: "BenchmarkGoodput/dialect=openai/client=gateway", Unit: "util%", Cmp: Min, Threshold: 95},
		{Area: "g", What: "util missing", Bench: "BenchmarkGoodput/dialect=azure/client=gateway", Unit: "util%", Cmp: Min, Threshold: 95},
		{Area: "m", What: "peer missing", Bench: "BenchmarkHTTPMemory/peer=gateway/tenants=1", Unit: "rss-idle-MB",
			PeerBench: "BenchmarkHTTPMemory/peer=direct", PeerUnit: "rss-idle-MB", Cmp: RatioMax, Threshold: 2},
		{Area: "m", What: "bound unit missing", Bench: "BenchmarkHTTPMemory/peer=gateway/tenants=1", Unit: "rss-idle-MB",
			Cmp: Max, Threshold: 100, Also: []Bound{{Unit: "allocs/op", Max: 0}}},
		{Area: "m", What: "memory", Bench: "BenchmarkHTTPMemory/peer=gateway/tenants=1", Unit: "rss-idle-MB",
			PeerBench: "BenchmarkHTTPMemory/peer=proxy", PeerUnit: "rss-idle-MB", Cmp: RatioMax, Threshold: 2},
		{Area: "f", What: "frontier", Bench: "BenchmarkHTTPSSE/streams=512/peer=gateway", Unit: "gap-p50-us",
			PeerBench: "BenchmarkHTTPSSE/streams=512/peer=proxy", PeerUnit: "gap-p50-us", Cmp: RatioMin, Threshold: 0.85},
		{Area: "u", What: "reported", Bench: "BenchmarkHTTPSSE/streams=512/peer=proxy", Unit: "ttft-p99-us", Cmp: Report},
		{Area: "z", What: "both 0", Bench: "BenchmarkHTTPFrontier/upstream=instant/peer=gateway/tenants=10000", Unit: "rps-p99-5ms",
			PeerBench: "BenchmarkHTTPFrontier/upstream=instant/peer=proxy", PeerUnit: "rps-p99-5ms", Cmp: RatioMin, Threshold: 0.85},
		{Area: "z", What: "peer 0", Bench: "BenchmarkHTTPFrontier/upstream=instant/peer=gateway/tenants=10000", Unit: "rps-p99-10ms",
			PeerBench: "BenchmarkHTTPFrontier/upstream=instant/peer=proxy", PeerUnit: "rps-p99-10ms", Cmp: RatioMin, Threshold: 0.85},
		{Area: "z", What: "below", Bench: "BenchmarkHTTPFrontier/upstream=instant/peer=gateway/tenants=10000", Unit: "rps-p99-50ms",
			PeerBench: "BenchmarkHTTPFrontier/upstream=instant/peer=proxy", PeerUnit: "rps-p99-50ms", Cmp: RatioMin, Threshold: 0.85},
		{Area: "z", What: "negative peer, negative figure", Bench: "BenchmarkHTTPAddedLatency/upstream=20ms/peer=gateway/tenants=1", Unit: "p50-added-us",
			PeerBench: "BenchmarkHTTPAddedLatency/upstream=20ms/peer=proxy", PeerUnit: "p50-added-us", Cmp: RatioMax, Threshold: 1.25},
		{Area: "z", What: "zero peer, positive figure", Bench: "BenchmarkHTTPAddedLatency/upstream=20ms/peer=gateway/tenants=1", Unit: "p99-added-us",
			PeerBench: "BenchmarkHTTPAddedLatency/upstream=20ms/peer=proxy", PeerUnit: "p99-added-us", Cmp: RatioMax, Threshold: 1.5},
	}
	want := []struct {
		fig, peer, ratio float64
		outcome          Outcome
	}{
		{120, 80, 1.5, Fail}, // ratio passes, 96 B/op does not
		{120, 80, 1.5, Pass},
		{120, 80, 1.5, Fail},
		{250, 100, 2.5, Pass},
		{80, 120, 1.5, Pass},
		{100, 60, 100.0 / 60, Fail},
		{24, 20, 1.2, Pass},
		{450, 400, 50, Pass}, // equal to the threshold passes
		{1, math.NaN(), math.NaN(), Fail},
		{99.5, math.NaN(), math.NaN(), Pass},
		{math.NaN(), math.NaN(), math.NaN(), NotRun},
		{25, math.NaN(), math.NaN(), NotRun},
		{25, math.NaN(), math.NaN(), NotRun},
		{25, 10.5, 25 / 10.5, Fail},
		{110, 100, 1.1, Pass},
		{800, math.NaN(), math.NaN(), Reported},
		{0, 0, math.NaN(), NoPeerFigure}, // the proxy met no rate either: nothing to compare
		{200, 0, math.NaN(), NoPeerFigure},
		{300, 400, 0.75, Fail},
		{-7, -5, math.NaN(), Pass},
		{3, 0, math.NaN(), Fail},
	}
	rows := evaluate(ts, loadSample(t))
	if len(rows) != len(want) {
		t.Fatalf("%d rows, want %d", len(rows), len(want))
	}
	same := func(a, b float64) bool { return a == b || math.IsNaN(a) && math.IsNaN(b) || math.Abs(a-b) < 1e-12 }
	for i, r := range rows {
		w := want[i]
		if !same(r.Figure, w.fig) || !same(r.Peer, w.peer) || !same(r.Ratio, w.ratio) || r.Outcome != w.outcome {
			t.Errorf("%s: figure %v peer %v ratio %v %v; want %v %v %v %v", r.What, r.Figure, r.Peer, r.Ratio, r.Outcome,
				w.fig, w.peer, w.ratio, w.outcome)
		}
	}
}

func TestRender(t *testing.T) {
	m := Machine{Nproc: 2, CPU: "Test CPU 9000", Go: "go1.26.8 linux/amd64", Memory: "23.5 GiB", Date: "2026-12-01",
		Command: "make bench", Raw: "docs/benchmarks.raw.txt"}
	got := render(m, evaluate(targets, loadSample(t)))
	for _, line := range []string{
		"| `nproc` | 2 |",
		"| cpu | Test CPU 9000 |",
		"| go | go1.26.8 linux/amd64 |",
		"| memory | 23.5 GiB |",
		"| date | 2026-12-01 |",
		"| command | `make bench` |",
		"| admission | Admit (1 tenant, no lookup, returns a new *Reservation) vs 2 AllowN | 120 ns/op (median of 3) | 80 ns/op (median of 3) | 1.50x | ≤ 2x peer | pass | brief: Performance targets |",
		"| header parsing | openai Auto vs strconv.ParseInt; ≤ 1 alloc | 250 ns/op, 0 allocs/op | 100 ns/op | 2.50x | ≤ 3x peer, ≤ 1 allocs/op | pass | brief: Performance targets |",
		"| header parsing | openai dialect set vs strconv.ParseInt; ≤ 1 alloc | — | 100 ns/op | — | ≤ 3x peer, ≤ 1 allocs/op | not run | brief: Performance targets |",
		"| goodput | openai: quota used in steady state, % | 99.50 util% | — | — | ≥ 95 util% | pass | brief: Performance targets |",
		"| goodput | openai: upstream 429s in steady state | 0 429s | — | — | ≤ 0 429s | pass | brief: Performance targets |",
		"| goodput | azure: upstream 429s in steady state | — | — | — | ≤ 0 429s | not run | brief: Performance targets |",
		"| HTTP latency | added p99 µs, upstream instant, 1 tenants, vs reverse proxy | 100 p99-added-us | 60 p99-added-us | 1.67x | ≤ 1.50x peer | **fail** | brief: Performance targets |",
		"| HTTP latency | added p50 µs, upstream instant, 1 tenants, vs reverse proxy | 24 p50-added-us | 20 p50-added-us | 1.20x | ≤ 1.25x peer | pass | brief: Performance targets |",
		"| HTTP streaming | SSE frame gap p99 µs, 512 streams, minus reverse proxy's | 450 gap-p99-us | 400 gap-p99-us | +50.0 gap-p99-us | ≤ peer + 50 gap-p99-us | pass | brief: Performance targets |",
		"| HTTP streaming | SSE stalls, 512 stream(s) | 1 stalls | — | — | ≤ 0 stalls | **fail** | brief: Performance targets |",
		"| HTTP throughput | req/s at p99-5ms, upstream instant, 10000 tenants, vs reverse proxy | 0 rps-p99-5ms | 0 rps-p99-5ms | — | ≥ 0.85x peer | no peer figure | brief: Performance targets |",
		"| HTTP throughput | req/s at p99-50ms, upstream instant, 10000 tenants, vs reverse proxy | 300 rps-p99-50ms | 400 rps-p99-50ms | 0.75x | ≥ 0.85x peer | **fail** | brief: Performance targets |",
		"| HTTP memory | idle RSS MB, 1 tenant, vs reverse proxy | 25 rss-idle-MB | 10.50 rss-idle-MB | 2.38x | ≤ 2x peer | **fail** | brief: Performance targets |",
		fmt.Sprintf("\n%d pass, %d fail, %d not run.\n", 7, 5, len(targets)-15), // 7 pass + 5 fail + 2 without a peer figure + one reported row (CPU per small request, 1 tenant)
	} {
		if !strings.Contains(got, line) {
			t.Errorf("rendered section lacks %q\n%s", line, got)
		}
	}
	if n := strings.Count(got, "\n| ") - 1 - 6 - 1; n != len(targets) { // header rows and the machine table
		t.Errorf("%d table rows, want %d (one per target)", n, len(targets))
	}
}

func TestReplaceSection(t *testing.T) {
	before := "# Title\n\nmachine table\n\n" + beginMarker + "\nold summary\n| x |\n" + endMarker + "\n\n## Section\n\ntext  \n"
	got, err := replaceSection([]byte(before), "\nNEW\n")
	if err != nil {
		t.Fatal(err)
	}
	want := "# Title\n\nmachine table\n\n" + beginMarker + "\nNEW\n" + endMarker + "\n\n## Section\n\ntext  \n"
	if string(got) != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
	// Idempotent: rewriting with the same section changes nothing.
	again, err := replaceSection(got, "\nNEW\n")
	if err != nil || string(again) != want {
		t.Errorf("second rewrite: %q, %v", again, err)
	}
	for _, bad := range []string{
		"no markers",
		beginMarker + " only",
		endMarker + " " + beginMarker,
		beginMarker + endMarker + beginMarker + endMarker,
	} {
		if _, err := replaceSection([]byte(bad), "x"); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestTargetsWellFormed(t *testing.T) {
	seen := map[string]bool{}
	for _, tg := range targets {
		key := tg.Bench + " " + tg.Unit + " " + tg.PeerBench
		if seen[key] {
			t.Errorf("duplicate target %s", key)
		}
		seen[key] = true
		if !strings.HasPrefix(tg.Bench, "Benchmark") || tg.Unit == "" || tg.Source == "" || tg.Area == "" || tg.What == "" {
			t.Errorf("incomplete target %+v", tg)
		}
		hasPeer := tg.Cmp == RatioMax || tg.Cmp == RatioMin || tg.Cmp == SpeedupMin || tg.Cmp == DiffMax
		if tg.Cmp == Report { // a reported figure may show a ratio to a peer, or stand alone
			hasPeer = tg.PeerBench != ""
		}
		if hasPeer != (tg.PeerBench != "" && tg.PeerUnit != "") {
			t.Errorf("%s %s: comparison %d and peer %q disagree", tg.Bench, tg.Unit, tg.Cmp, tg.PeerBench)
		}
	}
}

func TestMemTotal(t *testing.T) {
	if got := memTotal("/nonexistent/meminfo"); got != "unknown" {
		t.Errorf("missing file: %q", got)
	}
}

func TestUnread(t *testing.T) {
	got := unread(targets, loadSample(t))
	if len(got) != 0 { // every benchmark of the sample is a figure or a peer of some target
		t.Errorf("unread %v, want none", got)
	}
	got = unread(targets[:1], loadSample(t))
	if len(got) != 13 || got[0] != "BenchmarkGoodput/dialect=openai/client=gateway" {
		t.Errorf("unread with one target: %v", got)
	}
}
