package httpbench

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"golang.org/x/perf/benchfmt"
)

// TestChatBody: the small chat request is valid JSON with the fixed
// system prompt and a user message that carries its number.
func TestChatBody(t *testing.T) {
	want := `{"model":"sim","messages":[{"role":"system","content":"You are a concise assistant for a finance team."},` +
		`{"role":"user","content":"Summarise quarterly report 7 in three bullet points."}],"max_tokens":64}`
	if got := string(ChatBody(7)); got != want {
		t.Fatalf("ChatBody(7) = %s", got)
	}
	if !json.Valid(ChatBody(12345)) || bytes.Equal(ChatBody(1), ChatBody(2)) {
		t.Fatal("bodies must be valid JSON and differ per request")
	}
	if b := Fixed([]byte("x"))(9); string(b) != "x" {
		t.Fatalf("Fixed: %q", b)
	}
}

// TestPercentile checks the nearest-rank percentiles on 1..100 ms.
func TestPercentile(t *testing.T) {
	var lat []time.Duration
	for i := 100; i >= 1; i-- {
		lat = append(lat, time.Duration(i)*time.Millisecond)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 50 * time.Millisecond}, {0.99, 99 * time.Millisecond}, {0.999, 100 * time.Millisecond}, {1, 100 * time.Millisecond}, {0.001, time.Millisecond}} {
		if got := Percentile(lat, c.q); got != c.want {
			t.Errorf("Percentile(1..100ms, %v) = %v, want %v", c.q, got, c.want)
		}
	}
	if got := Percentile(nil, 0.5); got != 0 {
		t.Errorf("Percentile(empty) = %v, want 0", got)
	}
	if got := us(1234567 * time.Nanosecond); got != 1234.6 {
		t.Errorf("us(1234567ns) = %v, want 1234.6", got)
	}
}

// TestProcStats reads this process's RSS and CPU from /proc.
// TestFrontierBounds: the frontier's bounds are the upstream's latency plus
// 5, 10 and 50 ms, named by the whole bound.
func TestFrontierBounds(t *testing.T) {
	for _, c := range []struct {
		lat  time.Duration
		want []frontierBound
	}{
		{0, []frontierBound{{5 * time.Millisecond, "rps-p99-5ms"}, {10 * time.Millisecond, "rps-p99-10ms"}, {50 * time.Millisecond, "rps-p99-50ms"}}},
		{20 * time.Millisecond, []frontierBound{{25 * time.Millisecond, "rps-p99-25ms"}, {30 * time.Millisecond, "rps-p99-30ms"}, {70 * time.Millisecond, "rps-p99-70ms"}}},
	} {
		if got := frontierBounds(c.lat); !reflect.DeepEqual(got, c.want) {
			t.Errorf("frontierBounds(%v) = %v, want %v", c.lat, got, c.want)
		}
	}
}

func TestProcStats(t *testing.T) {
	rss, err := rssMB(os.Getpid())
	if err != nil || rss <= 0 || math.IsInf(rss, 0) {
		t.Fatalf("rssMB(self) = %v, %v; want > 0", rss, err)
	}
	cpu, err := cpuMicros(os.Getpid())
	if err != nil || cpu < 0 || cpu%clockTickUS != 0 {
		t.Fatalf("cpuMicros(self) = %v, %v; want a multiple of %d >= 0", cpu, err, clockTickUS)
	}
}

// expected lists, per benchmark name of a quick run, the units its row must
// carry and the iteration count it must have (0: any > 0).
func expected() map[string]struct {
	units []string
	iters int
} {
	type row = struct {
		units []string
		iters int
	}
	m := map[string]row{}
	m["HTTPUpstreamCeiling/upstream=instant"] = row{[]string{"rps-p99-5ms"}, 0}
	lat := []string{"p50-us", "p99-us", "p99.9-us", "p50-added-us", "p99-added-us", "errors"}
	for _, up := range []string{"instant", "20ms"} {
		for _, p := range []string{"direct", "proxy", "gateway/tenants=1", "gateway/tenants=10000"} {
			u := lat
			if p != "direct" {
				u = append(append([]string(nil), lat...), "cpu-us/req")
			}
			m["HTTPAddedLatency/upstream="+up+"/peer="+p] = row{u, 0}
		}
		fu := []string{"rps-p99-5ms", "rps-p99-10ms", "rps-p99-50ms"}
		if up == "20ms" { // bounds above the upstream's own 20 ms
			fu = []string{"rps-p99-25ms", "rps-p99-30ms", "rps-p99-70ms"}
		}
		for _, p := range []string{"direct", "proxy", "gateway/tenants=10000"} {
			m["HTTPFrontier/upstream="+up+"/peer="+p] = row{fu, 0}
		}
	}
	q := Quick
	for _, p := range []string{"direct", "proxy", "gateway/tenants=10000"} {
		m["HTTPSSE/streams=1/peer="+p] = row{[]string{"ttft-p50-us", "ttft-p99-us", "ttft-added-p50-us", "ttft-added-p99-us",
			"gap-p50-us", "gap-p99-us", "stalls"}, q.SSERounds * q.SSEPerRound}
		m["HTTPSSE/streams=16/peer="+p] = row{[]string{"gap-p50-us", "gap-p99-us", "gap-max-us", "stalls", "ttft-p99-us"},
			q.SSEConcurrent * q.SSEConcRounds}
	}
	for _, p := range []string{"direct", "proxy", "gateway/tenants=1"} {
		u := []string{"p50-us", "p99-us", "errors"}
		if p != "direct" {
			u = append(u, "cpu-us/req")
		}
		m["HTTPUsage1MB/peer="+p] = row{u, 0}
	}
	for _, p := range []string{"proxy", "gateway/tenants=1", "gateway/tenants=10000"} {
		m["HTTPMemory/peer="+p] = row{[]string{"rss-idle-MB", "rss-anon-idle-MB", "rss-steady-MB", "rss-after-MB", "errors"}, 0}
	}
	return m
}

// TestQuickRun builds the programs and runs every experiment at the Quick
// scale, then checks the output: one row per (experiment, peer) with the
// expected units, parseable as Go benchmark results; no failed request
// (errors 0), every stream complete (stalls 0); latencies, RSS and
// iteration counts > 0, percentiles ordered, added figures 0 for direct;
// frontier figures ordered by bound. No timing is asserted.
func TestQuickRun(t *testing.T) {
	if Quick.SSEConcurrent != 16 {
		t.Fatalf("Quick.SSEConcurrent = %d; expected() names streams=16", Quick.SSEConcurrent)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	bin := t.TempDir()
	if err := Build(ctx, bin); err != nil {
		t.Fatal(err)
	}
	var out, log bytes.Buffer
	h := &Harness{BinDir: bin, Log: &log}
	o := NewOutput(&out)
	err := Run(ctx, Options{Scale: Quick, Harness: h, Out: o})
	t.Logf("progress:\n%s", log.String())
	if err != nil {
		t.Fatal(err)
	}

	// The text output parses back to the same rows.
	rd := benchfmt.NewReader(bytes.NewReader(out.Bytes()), "out")
	parsed := 0
	for rd.Scan() {
		switch rec := rd.Result(); rec := rec.(type) {
		case *benchfmt.Result:
			parsed++
			if rec.GetConfig("nproc") == "" || rec.GetConfig("go") == "" || rec.GetConfig("date") == "" {
				t.Errorf("%s: config nproc/go/date missing", rec.Name)
			}
		case *benchfmt.SyntaxError:
			t.Errorf("output: %v", rec)
		}
	}
	results := o.Results()
	if parsed != len(results) {
		t.Errorf("output has %d result lines, want %d", parsed, len(results))
	}

	want := expected()
	seen := map[string]bool{}
	for _, r := range results {
		name := string(r.Name)
		w, ok := want[name]
		if !ok {
			t.Errorf("unexpected row %s", name)
			continue
		}
		if seen[name] {
			t.Errorf("row %s written twice", name)
		}
		seen[name] = true
		if r.Iters <= 0 || (w.iters > 0 && r.Iters != w.iters) {
			t.Errorf("%s: iterations %d, want %d (0: any > 0)", name, r.Iters, w.iters)
		}
		var units []string
		vals := map[string]float64{}
		for _, v := range r.Values {
			units = append(units, v.Unit)
			vals[v.Unit] = v.Value
			if math.IsNaN(v.Value) || math.IsInf(v.Value, 0) {
				t.Errorf("%s: %s = %v, not finite", name, v.Unit, v.Value)
			}
		}
		if strings.Join(units, " ") != strings.Join(w.units, " ") && !sameSet(units, w.units) {
			t.Errorf("%s: units %v, want %v", name, units, w.units)
		}
		direct := strings.Contains(name, "peer=direct")
		for u, v := range vals {
			switch {
			case u == "errors" || u == "stalls":
				if v != 0 {
					t.Errorf("%s: %s = %v, want 0", name, u, v)
				}
			case strings.Contains(u, "added"):
				if direct && v != 0 {
					t.Errorf("%s: %s = %v, want 0 for direct", name, u, v)
				}
			case strings.HasPrefix(u, "rps-") || u == "cpu-us/req":
				if v < 0 {
					t.Errorf("%s: %s = %v, want >= 0", name, u, v)
				}
			default: // latencies, gaps, RSS
				if v <= 0 {
					t.Errorf("%s: %s = %v, want > 0", name, u, v)
				}
			}
		}
		for _, ord := range [][]string{{"p50-us", "p99-us", "p99.9-us"}, {"ttft-p50-us", "ttft-p99-us"},
			{"gap-p50-us", "gap-p99-us", "gap-max-us"}, {"rps-p99-5ms", "rps-p99-10ms", "rps-p99-50ms"},
			{"rps-p99-25ms", "rps-p99-30ms", "rps-p99-70ms"}} {
			for i := 1; i < len(ord); i++ {
				a, okA := vals[ord[i-1]]
				b, okB := vals[ord[i]]
				if okA && okB && a > b {
					t.Errorf("%s: %s = %v > %s = %v", name, ord[i-1], a, ord[i], b)
				}
			}
		}
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("row %s missing", name)
		}
	}
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]int{}
	for _, x := range a {
		m[x]++
	}
	for _, x := range b {
		m[x]--
	}
	for _, n := range m {
		if n != 0 {
			return false
		}
	}
	return true
}
