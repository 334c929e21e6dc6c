// Command benchsummary reads Go benchmark results (the benchfmt format `go test -bench` and
// test/httpbench write), computes every performance target of the product brief ("Performance
// targets") from them, each figure the median of its runs and each ratio against a peer measured in
// the same file, and rewrites the summary section of docs/benchmarks.md, the text between
// `<!-- summary:begin -->` and `<!-- summary:end -->`. Everything outside the markers is kept byte for
// byte.
//
// Usage:
//
//	go run ./hack/benchsummary -raw docs/benchmarks.raw.txt [-raw more.txt] -doc docs/benchmarks.md
//
// With -doc omitted the section is written to standard output.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/perf/benchfmt"
)

// The markers around the generated section of the document.
const (
	beginMarker = "<!-- summary:begin -->"
	endMarker   = "<!-- summary:end -->"
)

func main() {
	var raws []string
	flag.Func("raw", "benchmark results file (benchfmt); repeat for several", func(s string) error {
		raws = append(raws, s)
		return nil
	})
	doc := flag.String("doc", "", "markdown file whose summary section is rewritten (default: print the section)")
	command := flag.String("cmd", "make bench", "command named in the summary as the one that produced the results")
	verbose := flag.Bool("v", false, "list, on standard error, the benchmarks of the results that no target reads")
	flag.Parse()
	if len(raws) == 0 {
		fmt.Fprintln(os.Stderr, "benchsummary: at least one -raw file is needed")
		os.Exit(2)
	}
	if err := run(raws, *doc, *command, *verbose); err != nil {
		fmt.Fprintln(os.Stderr, "benchsummary:", err)
		os.Exit(1)
	}
}

func run(raws []string, doc, command string, verbose bool) error {
	set := newResults()
	for _, name := range raws {
		f, err := os.Open(name)
		if err != nil {
			return err
		}
		err = set.read(f, name)
		f.Close()
		if err != nil {
			return err
		}
	}
	m := Machine{
		Nproc:   runtime.NumCPU(),
		CPU:     set.config["cpu"],
		Go:      runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH,
		Memory:  memTotal("/proc/meminfo"),
		Date:    time.Now().UTC().Format("2006-01-02"),
		Command: command,
		Raw:     strings.Join(raws, ", "),
	}
	if goos, goarch := set.config["goos"], set.config["goarch"]; goos != "" && goarch != "" {
		m.Go = runtime.Version() + " " + goos + "/" + goarch
	}
	section := render(m, evaluate(targets, set))
	if verbose {
		for _, n := range unread(targets, set) {
			fmt.Fprintln(os.Stderr, "no target reads", n)
		}
	}
	if doc == "" {
		_, err := io.WriteString(os.Stdout, section)
		return err
	}
	old, err := os.ReadFile(doc)
	if err != nil {
		return err
	}
	updated, err := replaceSection(old, section)
	if err != nil {
		return fmt.Errorf("%s: %w", doc, err)
	}
	info, err := os.Stat(doc)
	if err != nil {
		return err
	}
	return os.WriteFile(doc, updated, info.Mode().Perm())
}

// Results holds every measurement of the raw files: values[name][unit] lists one value per run, in
// file order. Names have no -GOMAXPROCS suffix; units are as the benchmark printed them.
type Results struct {
	values map[string]map[string][]float64
	config map[string]string // file configuration (goos, goarch, cpu, ...): its distinct values joined by "; "
}

func newResults() *Results {
	return &Results{values: map[string]map[string][]float64{}, config: map[string]string{}}
}

// read adds the results of one benchfmt stream.
func (s *Results) read(r io.Reader, fileName string) error {
	br := benchfmt.NewReader(r, fileName)
	for br.Scan() {
		res, ok := br.Result().(*benchfmt.Result)
		if !ok {
			continue // unit metadata; syntax errors are lines that are not results (logs, PASS, ok)
		}
		for _, c := range res.Config {
			if !c.File {
				continue
			}
			v := strings.TrimSpace(string(c.Value))
			if old := s.config[c.Key]; old == "" {
				s.config[c.Key] = v
			} else if v != "" && !slices.Contains(strings.Split(old, "; "), v) {
				s.config[c.Key] = old + "; " + v
			}
		}
		name := benchName(res.Name)
		units := s.values[name]
		if units == nil {
			units = map[string][]float64{}
			s.values[name] = units
		}
		for _, v := range res.Values {
			unit, val := v.Unit, v.Value
			if v.OrigUnit != "" { // the reader tidies ns/op into sec/op; keep the printed unit
				unit, val = v.OrigUnit, v.OrigValue
			}
			units[unit] = append(units[unit], val)
		}
	}
	return br.Err()
}

// benchName is a result's full name, "Benchmark" prefix included (the reader drops it), without
// its -GOMAXPROCS suffix.
func benchName(n benchfmt.Name) string {
	base, parts := n.Parts()
	var b strings.Builder
	b.WriteString("Benchmark")
	b.Write(base)
	for _, p := range parts {
		if len(p) > 0 && p[0] == '-' {
			continue
		}
		b.Write(p)
	}
	return b.String()
}

var tenantsPart = regexp.MustCompile(`/tenants=[^/]*`)

// lookup returns the runs of name's unit. A name not present is matched to the one name of the file
// that differs from it only by a "/tenants=N" part present on one side (the HTTP benchmarks name
// tenants on the gateway's rows only), when there is exactly one.
func (s *Results) lookup(name, unit string) []float64 {
	if units, ok := s.values[name]; ok {
		return units[unit]
	}
	key, hasTenants := tenantsPart.ReplaceAllString(name, ""), tenantsPart.MatchString(name)
	var found []string
	for n := range s.values {
		// Only a tenants part present on one side is ignored, never two different tenant counts.
		if tenantsPart.ReplaceAllString(n, "") == key && (!hasTenants || !tenantsPart.MatchString(n)) {
			found = append(found, n)
		}
	}
	if len(found) != 1 {
		return nil
	}
	return s.values[found[0]][unit]
}

// unread lists, sorted, the benchmarks of the results that no target reads.
func unread(ts []Target, s *Results) []string {
	read := map[string]bool{}
	for _, t := range ts {
		for _, n := range []string{t.Bench, t.PeerBench} {
			if n == "" {
				continue
			}
			read[n] = true
			read[tenantsPart.ReplaceAllString(n, "")] = true
		}
	}
	var out []string
	for n := range s.values {
		if !read[n] && !read[tenantsPart.ReplaceAllString(n, "")] {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// median of the runs, NaN when there are none.
func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

// Outcome is a target's evaluation.
type Outcome int

const (
	Pass Outcome = iota
	Fail
	NotRun
	Reported
	// NoPeerFigure: a throughput target whose peer met no rate of the ladder (0): there is
	// nothing to compare with, which is neither a pass nor a fail.
	NoPeerFigure
)

func (o Outcome) String() string {
	return [...]string{"pass", "**fail**", "not run", "reported", "no peer figure"}[o]
}

// Row is one evaluated target.
type Row struct {
	Target
	Figure, Peer, Ratio float64 // medians; NaN when absent
	Runs, PeerRuns      int
	Also                []float64 // medians of the Also bounds' units, NaN when absent
	Outcome             Outcome
}

// evaluate computes every target from the results.
func evaluate(ts []Target, s *Results) []Row {
	rows := make([]Row, 0, len(ts))
	for _, t := range ts {
		fig := s.lookup(t.Bench, t.Unit)
		r := Row{Target: t, Figure: median(fig), Peer: math.NaN(), Ratio: math.NaN(), Runs: len(fig)}
		missing := len(fig) == 0
		if t.PeerBench != "" {
			peer := s.lookup(t.PeerBench, t.PeerUnit)
			r.Peer, r.PeerRuns = median(peer), len(peer)
			missing = missing || len(peer) == 0
		}
		// Ratios are judged by multiplication, so that a peer figure of 0 (no request met a latency
		// bound, an added latency lost in the noise) has a defined outcome; the ratio itself is shown
		// only when its divisor is positive.
		pass := true
		switch t.Cmp {
		case RatioMax: // a peer at or below 0 allows only a figure at or below 0
			pass = r.Figure <= t.Threshold*max(r.Peer, 0)
			if r.Peer > 0 {
				r.Ratio = r.Figure / r.Peer
			}
		case RatioMin:
			pass = r.Figure >= t.Threshold*r.Peer
			if r.Peer > 0 {
				r.Ratio = r.Figure / r.Peer
			}
		case SpeedupMin:
			pass = r.Peer >= t.Threshold*r.Figure
			if r.Figure > 0 {
				r.Ratio = r.Peer / r.Figure
			}
		case DiffMax:
			r.Ratio = r.Figure - r.Peer
			pass = r.Ratio <= t.Threshold
		case Report: // with a peer, the ratio is shown for reference
			if t.PeerBench != "" && r.Peer > 0 {
				r.Ratio = r.Figure / r.Peer
			}
		case Max:
			pass = r.Figure <= t.Threshold
		case Min:
			pass = r.Figure >= t.Threshold
		}
		for _, b := range t.Also {
			v := s.lookup(t.Bench, b.Unit)
			m := median(v)
			r.Also = append(r.Also, m)
			missing = missing || len(v) == 0
			pass = pass && m <= b.Max
		}
		switch {
		case missing:
			r.Outcome = NotRun
		case t.Cmp == Report:
			r.Outcome = Reported
		case t.Cmp == RatioMin && r.Peer <= 0:
			r.Outcome = NoPeerFigure
		case pass:
			r.Outcome = Pass
		default:
			r.Outcome = Fail
		}
		rows = append(rows, r)
	}
	return rows
}

// Machine describes where and how the results were taken.
type Machine struct {
	Nproc   int
	CPU     string // the "cpu:" line of the benchmark output
	Go      string
	Memory  string // MemTotal of /proc/meminfo
	Date    string
	Command string
	Raw     string
}

// memTotal reads MemTotal from a meminfo file as GiB, or "unknown".
func memTotal(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "unknown"
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseFloat(f[1], 64)
			if err == nil {
				return fmt.Sprintf("%.1f GiB", kb/(1<<20))
			}
		}
	}
	return "unknown"
}

// num formats a figure with about three significant digits.
func num(v float64) string {
	switch a := math.Abs(v); {
	case math.IsNaN(v):
		return "—"
	case v == math.Trunc(v) && a < 1e15:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	default:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}

func figure(v float64, unit string, runs int) string {
	if math.IsNaN(v) {
		return "—"
	}
	s := num(v) + " " + unit
	if runs > 1 {
		s += fmt.Sprintf(" (median of %d)", runs)
	}
	return s
}

// targetText is the target column: the comparison and its threshold, then the extra bounds.
func targetText(t Target) string {
	th := num(t.Threshold)
	var s string
	switch t.Cmp {
	case RatioMax:
		s = "≤ " + th + "x peer"
	case RatioMin:
		s = "≥ " + th + "x peer"
	case SpeedupMin:
		s = "≥ " + th + "x faster than peer"
	case DiffMax:
		s = "≤ peer + " + th + " " + t.Unit
	case Max:
		s = "≤ " + th + " " + t.Unit
	case Min:
		s = "≥ " + th + " " + t.Unit
	case Report:
		s = "—"
	}
	for _, b := range t.Also {
		s += ", ≤ " + num(b.Max) + " " + b.Unit
	}
	return s
}

// comparisonText is the ratio/difference column.
func comparisonText(r Row) string {
	if math.IsNaN(r.Ratio) {
		return "—"
	}
	switch r.Cmp {
	case RatioMax, RatioMin, Report:
		return fmt.Sprintf("%.2fx", r.Ratio)
	case SpeedupMin:
		return fmt.Sprintf("%.2fx faster", r.Ratio)
	case DiffMax:
		return fmt.Sprintf("%+.1f %s", r.Ratio, r.Unit)
	}
	return "—"
}

func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// render writes the summary section (without the markers).
func render(m Machine, rows []Row) string {
	var b strings.Builder
	cpu := m.CPU
	if cpu == "" {
		cpu = "unknown"
	}
	fmt.Fprintf(&b, "\n## Summary against the targets\n\n")
	fmt.Fprintf(&b, "Generated by `go run ./hack/benchsummary` from %s (`%s`). Each figure is the median of its runs;\n", m.Raw, m.Command)
	fmt.Fprintf(&b, "each peer figure comes from the same results. \"not run\": the results lack the figure or its peer.\n\n")
	fmt.Fprintf(&b, "| machine | |\n|---|---|\n")
	fmt.Fprintf(&b, "| `nproc` | %d |\n| cpu | %s |\n| go | %s |\n| memory | %s |\n| date | %s |\n| command | `%s` |\n\n",
		m.Nproc, cell(cpu), cell(m.Go), cell(m.Memory), m.Date, cell(m.Command))
	fmt.Fprintf(&b, "| area | what | figure | peer figure | ratio / difference | target | result | source |\n")
	fmt.Fprintf(&b, "|---|---|---:|---:|---:|---|---|---|\n")
	for _, r := range rows {
		fig := figure(r.Figure, r.Unit, r.Runs)
		for i, v := range r.Also {
			if !math.IsNaN(v) {
				fig += ", " + num(v) + " " + r.Target.Also[i].Unit
			}
		}
		peer := "—"
		if r.PeerBench != "" {
			peer = figure(r.Peer, r.PeerUnit, r.PeerRuns)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", cell(r.Area), cell(r.What), cell(fig), cell(peer),
			comparisonText(r), cell(targetText(r.Target)), r.Outcome, cell(r.Source))
	}
	var pass, fail, notRun int
	for _, r := range rows {
		switch r.Outcome {
		case Pass:
			pass++
		case Fail:
			fail++
		case NotRun:
			notRun++
		}
	}
	fmt.Fprintf(&b, "\n%d pass, %d fail, %d not run.\n\n", pass, fail, notRun)
	return b.String()
}

// replaceSection returns doc with the text between the markers replaced by section; everything
// else, the markers included, is unchanged.
func replaceSection(doc []byte, section string) ([]byte, error) {
	i := bytes.Index(doc, []byte(beginMarker))
	j := bytes.Index(doc, []byte(endMarker))
	switch {
	case i < 0 || j < 0:
		return nil, errors.New("no " + beginMarker + " ... " + endMarker + " section")
	case j < i:
		return nil, errors.New(endMarker + " comes before " + beginMarker)
	case bytes.Count(doc, []byte(beginMarker)) != 1 || bytes.Count(doc, []byte(endMarker)) != 1:
		return nil, errors.New("more than one summary section")
	}
	start := i + len(beginMarker)
	out := make([]byte, 0, len(doc)+len(section))
	out = append(out, doc[:start]...)
	out = append(out, section...)
	out = append(out, doc[j:]...)
	return out, nil
}
