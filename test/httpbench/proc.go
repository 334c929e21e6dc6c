package httpbench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// modulePath is the Go module of the peer programs.
const modulePath = "github.com/fairshare-dev/fairshare/test/httpbench/cmd/"

// clockTickUS is the length of one /proc clock tick in µs (CLK_TCK = 100 on
// Linux).
const clockTickUS = 10_000

// Timeouts of the process management.
const (
	// startTimeout bounds the wait for a program's "listening" line.
	startTimeout = 15 * time.Second
	// stopTimeout bounds a program's exit after SIGTERM before it is killed.
	stopTimeout = 5 * time.Second
)

// Build compiles the upstream, proxy and gateway programs into dir (go build
// run in the source directory of this package, so inside its module).
func Build(ctx context.Context, dir string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+string(os.PathSeparator),
		modulePath+"upstream", modulePath+"proxy", modulePath+"gateway")
	if _, file, _, ok := runtime.Caller(0); ok {
		cmd.Dir = filepath.Dir(file)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go build: %w: %s", err, out)
	}
	return nil
}

// Proc is one running program (upstream or peer).
type Proc struct {
	// Name identifies the process in messages ("upstream", "proxy",
	// "gateway/tenants=1").
	Name string
	// Addr is the address it listens on (127.0.0.1:PORT).
	Addr string
	cmd  *exec.Cmd
	done chan struct{}
	err  *lockedBuffer // its standard error, shown when it fails
}

// lockedBuffer is a bytes.Buffer safe for one writer and readers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() > 64<<10 { // keep the first 64 KiB only
		return len(p), nil
	}
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// URL returns the process's base URL, http://127.0.0.1:PORT.
func (p *Proc) URL() string { return "http://" + p.Addr }

// Pid returns the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// start runs bin with args and waits (up to startTimeout) for its first
// line of standard output, "listening ADDR".
func start(name, bin string, args ...string) (*Proc, error) {
	cmd := exec.Command(bin, args...)
	// Killed with this process even if it dies without stopping it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p := &Proc{Name: name, cmd: cmd, done: make(chan struct{}), err: &lockedBuffer{}}
	cmd.Stderr = p.err
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			line <- sc.Text()
		} else {
			line <- ""
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case l := <-line:
		addr, ok := strings.CutPrefix(l, "listening ")
		if !ok || !strings.HasPrefix(addr, "127.0.0.1:") {
			p.Stop()
			return nil, fmt.Errorf("%s: unexpected first line %q; stderr: %s", name, l, p.err.String())
		}
		p.Addr = addr
		return p, nil
	case <-time.After(startTimeout):
		p.Stop()
		return nil, fmt.Errorf("%s: not listening after %v; stderr: %s", name, startTimeout, p.err.String())
	}
}

// Stop sends SIGTERM and waits up to stopTimeout for the exit (the peers
// write their profiles then), then kills the process. It is idempotent.
func (p *Proc) Stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(stopTimeout):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Alive reports whether the process is still running.
func (p *Proc) Alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// RSSMB returns the process's resident set (VmRSS of /proc/PID/status), in
// MB of 2^20 bytes: anonymous memory (heap, stacks) plus the pages of the
// binary and of other files it has touched.
func (p *Proc) RSSMB() (float64, error) { return rssMB(p.Pid()) }

// AnonMB returns the anonymous part of the resident set (RssAnon of
// /proc/PID/status: heap, stacks, runtime structures), in MB of 2^20 bytes;
// VmRSS minus it is file-backed (the binary's code and read-only data).
func (p *Proc) AnonMB() (float64, error) { return statusMB(p.Pid(), "RssAnon:") }

// CPUMicros returns the process's CPU time so far (utime + stime of
// /proc/PID/stat), in µs, with the resolution of a clock tick (10,000 µs).
func (p *Proc) CPUMicros() (int64, error) { return cpuMicros(p.Pid()) }

// rssMB returns VmRSS of process pid, in MB of 2^20 bytes.
func rssMB(pid int) (float64, error) { return statusMB(pid, "VmRSS:") }

// statusMB returns the field of /proc/PID/status named by key (with its
// colon, a figure in kB), in MB of 2^20 bytes.
func statusMB(pid int, key string) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for l := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(l, key); ok {
			f := strings.Fields(v) // "12345 kB"
			if len(f) != 2 || f[1] != "kB" {
				return 0, fmt.Errorf("%s unexpected %q", key, l)
			}
			kb, err := strconv.ParseFloat(f[0], 64)
			return kb / 1024, err
		}
	}
	return 0, fmt.Errorf("%s not found", key)
}

// cpuMicros returns utime + stime of process pid, in µs.
func cpuMicros(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// fields are counted after the last ')'; utime and stime are fields 14
	// and 15, so 12th and 13th after it.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("/proc stat: no command name")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, errors.New("/proc stat: too few fields")
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return (ut + st) * clockTickUS, nil
}

// Harness starts the programs of the experiments and keeps track of them so
// that every one is stopped at the end (Close).
type Harness struct {
	// BinDir holds the built programs (Build).
	BinDir string
	// ProfileDir, when not empty, receives the peers' CPU and allocation
	// profiles (see MergeProfiles).
	ProfileDir string
	// Log receives progress lines (standard error in cmd/httpbench).
	Log io.Writer

	mu    sync.Mutex
	procs []*Proc
	parts map[string][]string // "proxy.cpu" -> profile files of each start
	seq   int
}

// StartUpstream starts the mock upstream with the given header latency and
// SSE frame gap.
func (h *Harness) StartUpstream(latency, frameGap time.Duration) (*Proc, error) {
	return h.start("upstream", "upstream", "--latency", latency.String(), "--frame-gap", frameGap.String())
}

// StartProxy starts the httputil.ReverseProxy peer in front of up.
func (h *Harness) StartProxy(up *Proc) (*Proc, error) {
	return h.start("proxy", "proxy", append([]string{"--upstream", up.URL()}, h.profileArgs("proxy")...)...)
}

// StartGateway starts the gateway peer in front of up with tenants tenants
// and an upstream concurrency of GatewayUpstreamConcurrency.
func (h *Harness) StartGateway(up *Proc, tenants int) (*Proc, error) {
	args := []string{"--upstream", up.URL(), "--tenants", strconv.Itoa(tenants),
		"--upstream-concurrency", strconv.Itoa(GatewayUpstreamConcurrency)}
	return h.start(fmt.Sprintf("gateway/tenants=%d", tenants), "gateway", append(args, h.profileArgs("gateway")...)...)
}

// GatewayUpstreamConcurrency is the gateway's pool upstreamConcurrency in
// the benchmarks: 1024 calls in flight, the proxy's connection pool
// (MaxIdleConnsPerHost), so that 512 concurrent streams are not queued by
// the pool's default bound of 64.
const GatewayUpstreamConcurrency = 1024

func (h *Harness) start(name, prog string, args ...string) (*Proc, error) {
	p, err := start(name, filepath.Join(h.BinDir, prog), args...)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	h.procs = append(h.procs, p)
	h.mu.Unlock()
	return p, nil
}

// profileArgs returns the --cpuprofile/--memprofile flags of one start of
// peer kind ("proxy" or "gateway"), recording the files for MergeProfiles.
func (h *Harness) profileArgs(kind string) []string {
	if h.ProfileDir == "" {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seq++
	dir := filepath.Join(h.ProfileDir, "parts")
	_ = os.MkdirAll(dir, 0o755)
	cpu := filepath.Join(dir, fmt.Sprintf("http-%s-%d.cpu.pprof", kind, h.seq))
	mem := filepath.Join(dir, fmt.Sprintf("http-%s-%d.alloc.pprof", kind, h.seq))
	if h.parts == nil {
		h.parts = map[string][]string{}
	}
	h.parts[kind+".cpu"] = append(h.parts[kind+".cpu"], cpu)
	h.parts[kind+".alloc"] = append(h.parts[kind+".alloc"], mem)
	return []string{"--cpuprofile", cpu, "--memprofile", mem}
}

// StopAll stops every process started so far (SIGTERM, then SIGKILL after
// stopTimeout), the peers first.
func (h *Harness) StopAll() {
	h.mu.Lock()
	procs := h.procs
	h.procs = nil
	h.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range procs {
		if p.Name == "upstream" {
			continue
		}
		wg.Go(p.Stop)
	}
	wg.Wait()
	for _, p := range procs {
		wg.Go(p.Stop)
	}
	wg.Wait()
	for _, p := range procs {
		if e := p.err.String(); e != "" && h.Log != nil {
			if len(e) > 2000 {
				e = e[:2000] + "..."
			}
			fmt.Fprintf(h.Log, "%s stderr:\n%s\n", p.Name, e)
		}
	}
}

// MergeProfiles stops every process, then merges the profiles of all starts
// of each peer kind into ProfileDir/http-<kind>.cpu.pprof and
// http-<kind>.alloc.pprof (`go tool pprof -proto`); the per-start files stay
// in ProfileDir/parts.
func (h *Harness) MergeProfiles(ctx context.Context) error {
	h.StopAll()
	if h.ProfileDir == "" {
		return nil
	}
	var errs []error
	for key, files := range h.parts {
		var have []string
		for _, f := range files {
			if st, err := os.Stat(f); err == nil && st.Size() > 0 {
				have = append(have, f)
			}
		}
		if len(have) == 0 {
			continue
		}
		kind, typ, _ := strings.Cut(key, ".")
		out := filepath.Join(h.ProfileDir, fmt.Sprintf("http-%s.%s.pprof", kind, typ))
		b, err := exec.CommandContext(ctx, "go", append([]string{"tool", "pprof", "-proto"}, have...)...).Output()
		if err != nil {
			errs = append(errs, fmt.Errorf("merging %s: %w", out, err))
			continue
		}
		errs = append(errs, os.WriteFile(out, b, 0o644))
	}
	return errors.Join(errs...)
}
