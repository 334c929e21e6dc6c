package framework

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/internal/schedconfig"
)

// Helpers for the tests that run the pool's scheduler themselves as local processes
// (test/restart, test/ha), so that they can kill it with SIGKILL and start it again on
// the same durable job store.

// SchedulerSpec is how to run a pool's scheduler locally the way its rendered
// Deployment would: the container's arguments and environment, with the ConfigMap's
// settings written to a local file. Listen addresses and --job-store are set per
// process (NewSchedulerProcess).
type SchedulerSpec struct {
	// Namespace and Name are the rendered Deployment's (and ConfigMap's) namespace and name.
	Namespace, Name string
	// Settings are the scheduler settings parsed from the rendered ConfigMap.
	Settings schedconfig.Settings
	// Replicas is the rendered Deployment's spec.replicas (0 when unset).
	Replicas int32
	// SettingsPath is the local file the settings were written to (work/<SettingsKey>).
	SettingsPath string
	// Args are the container's arguments without --config and --job-store.
	Args []string
	// Env is KUBECONFIG of the control plane followed by the container's environment
	// (downward API fields resolved to the namespace and "<name>-local").
	Env []string
}

// RenderedScheduler waits (at most 60 s) for the operator to render the Deployment and
// ConfigMap namespace/name, parses the settings, writes them to work/<SettingsKey> and
// returns the spec. An environment variable from a source other than a literal value or
// the pod's namespace or name fails the test (the tests' pools have no credentials
// Secret). operator's log tail is printed when nothing is rendered in time.
func RenderedScheduler(ctx context.Context, t testing.TB, cp *ControlPlane, operator *Process, namespace, name, work string) *SchedulerSpec {
	t.Helper()
	var dep appsv1.Deployment
	var cm corev1.ConfigMap
	deadline := time.Now().Add(60 * time.Second)
	for {
		errD := cp.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &dep)
		errC := cp.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &cm)
		if errD == nil && errC == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the operator did not render %s: %v %v\n%s", name, errD, errC, operator.Tail(30))
		}
		time.Sleep(200 * time.Millisecond)
	}
	settings, err := schedconfig.Parse([]byte(cm.Data[schedconfig.SettingsKey]))
	if err != nil {
		t.Fatalf("ConfigMap %s: %v", name, err)
	}
	sp := &SchedulerSpec{
		Namespace:    namespace,
		Name:         name,
		Settings:     settings,
		SettingsPath: filepath.Join(work, schedconfig.SettingsKey),
		Env:          []string{"KUBECONFIG=" + cp.Kubeconfig},
	}
	if dep.Spec.Replicas != nil {
		sp.Replicas = *dep.Spec.Replicas
	}
	// The kubelet's part for a pool with a credentials Secret: its key as
	// a local file, named by the local settings.
	if sp.Settings.ProviderKeyFile, err = LocalProviderKeyFile(ctx, cp.Client, namespace, dep.Spec.Template.Spec, settings.ProviderKeyFile, work); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sp.SettingsPath, sp.Settings.Marshal(), 0o644); err != nil {
		t.Fatal(err)
	}
	c := dep.Spec.Template.Spec.Containers[0]
	for _, a := range c.Args {
		if strings.HasPrefix(a, "--config=") || strings.HasPrefix(a, "--job-store=") {
			continue
		}
		sp.Args = append(sp.Args, a)
	}
	for _, v := range c.Env {
		switch {
		case v.ValueFrom == nil:
			sp.Env = append(sp.Env, v.Name+"="+v.Value)
		case v.ValueFrom.FieldRef != nil && v.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
			sp.Env = append(sp.Env, v.Name+"="+namespace)
		case v.ValueFrom.FieldRef != nil && v.ValueFrom.FieldRef.FieldPath == "metadata.name":
			sp.Env = append(sp.Env, v.Name+"="+name+"-local")
		default:
			t.Fatalf("env %s: unexpected source (the pool has no credentials Secret)", v.Name)
		}
	}
	return sp
}

// SchedulerProcess is one scheduler run locally from a SchedulerSpec with its own
// listen ports on 127.0.0.1 and a job store file. It can be killed with SIGKILL
// (Process only stops gracefully) and started again on the same ports and store; two
// of them on one store are two replicas of the pool.
type SchedulerProcess struct {
	// Name tells replicas apart in logs and messages ("" for a single scheduler).
	Name string
	// GatewayURL is the gateway's base URL (--http-addr).
	GatewayURL string
	// MetricsURL is the metrics endpoint (--metrics-addr, path /metrics).
	MetricsURL string
	// ReadyzURL and HealthzURL are the health server's probes (--health-addr).
	ReadyzURL, HealthzURL string

	bin, work string
	args, env []string
	run       int
	cmd       *exec.Cmd
	done      chan struct{}
	err       error
}

// NewSchedulerProcess picks three free ports and prepares (does not start) the
// scheduler of sp from bin/scheduler with --config=sp.SettingsPath, the listen
// addresses and --job-store=store; its logs go to work.
func NewSchedulerProcess(t testing.TB, sp *SchedulerSpec, bin, work, name, store string) *SchedulerProcess {
	t.Helper()
	ports := make([]int, 3)
	for i := range ports {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = port
	}
	p := &SchedulerProcess{Name: name, bin: bin, work: work, env: sp.Env}
	p.args = append(append([]string{}, sp.Args...),
		"--config="+sp.SettingsPath,
		fmt.Sprintf("--http-addr=127.0.0.1:%d", ports[0]),
		fmt.Sprintf("--metrics-addr=127.0.0.1:%d", ports[1]),
		fmt.Sprintf("--health-addr=127.0.0.1:%d", ports[2]),
		"--job-store="+store)
	p.GatewayURL = fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	p.MetricsURL = fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[1])
	p.ReadyzURL = fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[2])
	p.HealthzURL = fmt.Sprintf("http://127.0.0.1:%d/healthz", ports[2])
	return p
}

// Args returns the scheduler's command-line arguments.
func (p *SchedulerProcess) Args() []string { return append([]string{}, p.args...) }

// RunLogPath is the log file of run n: work/scheduler-<name>-<n>.log, or
// work/scheduler-<n>.log when the process has no name.
func (p *SchedulerProcess) RunLogPath(n int) string {
	if p.Name == "" {
		return filepath.Join(p.work, fmt.Sprintf("scheduler-%d.log", n))
	}
	return filepath.Join(p.work, fmt.Sprintf("scheduler-%s-%d.log", p.Name, n))
}

// LogPath is the log file of the current (last started) run.
func (p *SchedulerProcess) LogPath() string { return p.RunLogPath(p.run) }

// Start runs the process as run n (its log RunLogPath(n)) and registers its Stop with
// t.Cleanup. It does not wait: see WaitReady and WaitHealthy.
func (p *SchedulerProcess) Start(t testing.TB, n int) {
	t.Helper()
	p.run = n
	f, err := os.Create(p.LogPath())
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(p.bin, "scheduler"), p.args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), p.env...)
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatal(err)
	}
	done := make(chan struct{})
	p.cmd, p.done = cmd, done
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(done)
	}()
	t.Cleanup(p.Stop)
}

// WaitReady waits at most limit until /readyz answers 200 (the scheduler serves; with
// leader election, it is the leader). The process exiting first fails the test.
func (p *SchedulerProcess) WaitReady(ctx context.Context, t testing.TB, limit time.Duration) {
	t.Helper()
	p.wait(ctx, t, p.ReadyzURL, limit)
}

// WaitHealthy waits at most limit until /healthz answers 200 (the process is up, leader
// or not). The process exiting first fails the test.
func (p *SchedulerProcess) WaitHealthy(ctx context.Context, t testing.TB, limit time.Duration) {
	t.Helper()
	p.wait(ctx, t, p.HealthzURL, limit)
}

func (p *SchedulerProcess) wait(ctx context.Context, t testing.TB, u string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		select {
		case <-p.done:
			t.Fatalf("scheduler %s exited (%v) before %s answered 200:\n%s", p.label(), p.err, u, p.Tail(30))
		default:
		}
		if code, err := GetStatus(ctx, u, ""); err == nil && code == http.StatusOK {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("scheduler %s: %s not 200 after %s:\n%s", p.label(), u, limit, p.Tail(30))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// label names the process in messages: its Name, or its run number without one.
func (p *SchedulerProcess) label() string {
	if p.Name == "" {
		return strconv.Itoa(p.run)
	}
	return p.Name
}

// Kill sends SIGKILL, waits for the process to exit and returns the time the signal
// was sent (the process may not have handled anything after it).
func (p *SchedulerProcess) Kill(t testing.TB) time.Time {
	t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	<-p.done
	return at
}

// Stop ends the process gracefully (SIGTERM, then SIGKILL after 10 s); safe to repeat
// and before Start.
func (p *SchedulerProcess) Stop() {
	if p.cmd == nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Tail returns the last n lines of the current run's log.
func (p *SchedulerProcess) Tail(n int) string { return TailFile(p.LogPath(), n) }

// TailFile returns the last n lines of the file at path ("" when it cannot be read).
func TailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// GetStatus returns the status code of GET u, sent as tenant (the X-Fairshare-Tenant
// header, when not "") with a 5 s timeout; the body is discarded. Connection errors are
// returned, not fatal, so that a caller can expect them (a standby's gateway).
func GetStatus(ctx context.Context, u, tenant string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	if tenant != "" {
		req.Header.Set("X-Fairshare-Tenant", tenant)
	}
	resp, err := probeClient.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// probeClient is GetStatus's client.
var probeClient = &http.Client{Timeout: 5 * time.Second}

// LogMatch returns the first submatch of re in the first line of the log at path that
// matches it, or "" when no line does. Lines may be up to 1 MiB.
func LogMatch(t testing.TB, path string, re *regexp.Regexp) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			return m[1]
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	return ""
}

// logRecoveredRE matches the scheduler's "recovered stored jobs" log line (JSON), whose
// wereRunning is the number of jobs that were running when the store was last closed.
var logRecoveredRE = regexp.MustCompile(`"recovered stored jobs".*"wereRunning":\s*(\d+)`)

// RecoveredFromLog returns wereRunning of the scheduler's "recovered stored jobs" log
// line in the log at path, or -1 when there is no such line.
func RecoveredFromLog(t testing.TB, path string) int {
	t.Helper()
	if m := LogMatch(t, path, logRecoveredRE); m != "" {
		n, _ := strconv.Atoi(m)
		return n
	}
	return -1
}

// WaitSimSucceeded waits (at most 60 s, polling every 100 ms) until the simulator at
// simURL has answered n requests successfully. check, when not nil, runs at each poll
// (an invariant that must hold meanwhile); p's log tail, when p is not nil, is printed
// on timeout.
func WaitSimSucceeded(ctx context.Context, t testing.TB, simURL string, n int64, p *SchedulerProcess, check func()) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for GetSimStats(ctx, t, simURL).Succeeded < n {
		if check != nil {
			check()
		}
		if time.Now().After(deadline) {
			msg := ""
			if p != nil {
				msg = "\nscheduler log:\n" + p.Tail(30)
			}
			t.Fatalf("the simulator answered fewer than %d requests in 60 s%s", n, msg)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// WaitJobsFinished waits (at most limit, polling every 250 ms) until no job of tenants
// is queued or running at the gateway base; p's log tail, when p is not nil, is printed
// on timeout.
func WaitJobsFinished(ctx context.Context, t testing.TB, base string, tenants []string, limit time.Duration, p *SchedulerProcess) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		open := 0
		for _, tenant := range tenants {
			for _, st := range []string{"queued", "running"} {
				open += len(ListJobs(ctx, t, base, tenant, st, 1000))
			}
		}
		if open == 0 {
			return
		}
		if time.Now().After(deadline) {
			msg := ""
			if p != nil {
				msg = "\nscheduler log:\n" + p.Tail(30)
			}
			t.Fatalf("%d jobs still queued or running after %s%s", open, limit, msg)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// JobRecord is what CheckRecord counted in the job API.
type JobRecord struct {
	// ByStatus is the number of jobs listed under each status.
	ByStatus map[string]int
	// Recovered is the number of jobs with recovered=true.
	Recovered int
	// Attempts is the sum of the jobs' attempts.
	Attempts int
}

// CheckRecord checks at the gateway base, for each tenant, that every submitted job
// (submitted[tenant]: job id -> true) is listed exactly once (pages of 37, a size that
// divides no round batch), belongs to tenant, is in exactly one status list and is
// finished (succeeded or expired), that nothing else is listed, and that a recovered job
// has 2 attempts and a succeeded job that is not recovered has 1 (issue "Durable job
// store"). Per-job errors are reported, the first ten of them printed.
func CheckRecord(ctx context.Context, t testing.TB, base string, tenants []string, submitted map[string]map[string]bool) JobRecord {
	t.Helper()
	bad := 0
	report := func(msg string) {
		if bad++; bad <= 10 {
			t.Error(msg)
		}
	}
	statuses := []string{"queued", "running", "succeeded", "failed", "expired", "cancelled"}
	rec := JobRecord{ByStatus: map[string]int{}}
	for _, tenant := range tenants {
		all := ListJobs(ctx, t, base, tenant, "", 37)
		seen := map[string]int{}
		for _, j := range all {
			seen[j.ID]++
			if j.Tenant != tenant {
				report(fmt.Sprintf("tenant %s lists job %s of tenant %s", tenant, j.ID, j.Tenant))
			}
			if !submitted[tenant][j.ID] {
				report(fmt.Sprintf("tenant %s lists job %s that was not submitted", tenant, j.ID))
			}
			switch {
			case j.Recovered && j.Attempts != 2:
				report(fmt.Sprintf("job %s: recovered with %d attempts, want 2", j.ID, j.Attempts))
			case !j.Recovered && j.Attempts != 1 && j.Status == "succeeded":
				report(fmt.Sprintf("job %s: %d attempts, not recovered, want 1", j.ID, j.Attempts))
			}
			if j.Recovered {
				rec.Recovered++
			}
			rec.Attempts += j.Attempts
		}
		for id := range submitted[tenant] {
			if seen[id] != 1 {
				report(fmt.Sprintf("tenant %s: job %s listed %d times, want 1", tenant, id, seen[id]))
			}
		}
		if len(all) != len(submitted[tenant]) {
			t.Errorf("tenant %s: %d jobs listed, want %d", tenant, len(all), len(submitted[tenant]))
		}
		inStatus := map[string]string{}
		for _, st := range statuses {
			for _, j := range ListJobs(ctx, t, base, tenant, st, 50) {
				if j.Status != st {
					report(fmt.Sprintf("job %s listed under status=%s has status %s", j.ID, st, j.Status))
				}
				if prev, ok := inStatus[j.ID]; ok {
					report(fmt.Sprintf("job %s listed under both %s and %s", j.ID, prev, st))
				}
				inStatus[j.ID] = st
				rec.ByStatus[st]++
			}
		}
		for id := range submitted[tenant] {
			switch st := inStatus[id]; st {
			case "succeeded", "expired":
			case "":
				report(fmt.Sprintf("tenant %s: job %s is in no status list (lost)", tenant, id))
			default:
				report(fmt.Sprintf("tenant %s: job %s is %s, want succeeded or expired", tenant, id, st))
			}
		}
	}
	if bad > 10 {
		t.Errorf("... %d per-job errors in all", bad)
	}
	return rec
}

// CheckAtLeastOnce checks the outcome of a kill in the middle of a backlog of total
// jobs (issue "Durable job store": running jobs are requeued, at-least-once toward the
// provider): every job succeeded or expired; 1 to maxRecovered jobs were recovered (the
// kill came while calls were in flight, at most the upstream concurrency);
// logRecovered, the scheduler's logged wereRunning, equals that count unless it is -1
// (no log line); the simulator received between the succeeded count and total +
// recovered requests, no more than the attempts recorded, and sent no 429.
func CheckAtLeastOnce(t testing.TB, rec JobRecord, sim SimStats, total, maxRecovered, logRecovered int) {
	t.Helper()
	if got := rec.ByStatus["succeeded"] + rec.ByStatus["expired"]; got != total {
		t.Errorf("succeeded + expired = %d, want %d", got, total)
	}
	if rec.Recovered < 1 || rec.Recovered > maxRecovered {
		t.Errorf("%d jobs recovered, want 1 to the upstream concurrency %d", rec.Recovered, maxRecovered)
	}
	if logRecovered >= 0 && logRecovered != rec.Recovered {
		t.Errorf("the scheduler logged %d jobs running when it opened the store, the job API shows %d recovered", logRecovered, rec.Recovered)
	}
	if lo, hi := int64(rec.ByStatus["succeeded"]), int64(total+rec.Recovered); sim.Requests < lo || sim.Requests > hi {
		t.Errorf("simulator received %d requests, want between %d and %d", sim.Requests, lo, hi)
	}
	if sim.Requests > int64(rec.Attempts) {
		t.Errorf("simulator received %d requests, more than the %d attempts recorded", sim.Requests, rec.Attempts)
	}
	if sim.Throttled != 0 {
		t.Errorf("simulator sent %d 429s, want 0 (the pace is set by latency and concurrency only)", sim.Throttled)
	}
}

// RequireAssets skips t unless KUBEBUILDER_ASSETS (the directory of kube-apiserver and
// etcd) is set, naming makeTarget, the make target that builds them and runs the test.
func RequireAssets(t testing.TB, makeTarget string) {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Skipf("KUBEBUILDER_ASSETS is not set: run `make %s` (it builds bin/kube-apiserver and bin/etcd)", makeTarget)
	}
}

// StepLogf returns a t.Logf whose lines begin with the seconds since this call
// ("[ 12.3s] "), to time the steps of a long test.
func StepLogf(t testing.TB) func(format string, args ...any) {
	begin := time.Now()
	return func(format string, args ...any) {
		t.Helper()
		t.Logf("[%5.1fs] "+format, append([]any{time.Since(begin).Seconds()}, args...)...)
	}
}

// PacedSimArgs are the provider simulator's arguments for a quota far above what the
// tests use (6,000,000 tokens and 600,000 requests a minute), latency per call and 16
// output tokens: the pace is set by latency and the pool's upstream concurrency only
// (no 429s).
func PacedSimArgs(latency time.Duration) []string {
	return []string{
		"--tokens-per-minute=6000000", "--requests-per-minute=600000",
		"--latency=" + latency.String(), "--output-tokens=16",
	}
}

// TenantQuotaManifests returns one TenantQuota manifest per tenant, of weight 1 in pool
// with batch.maxQueuedJobs maxQueued, each preceded by a "---" separator line, to append
// to a pool's manifest.
func TenantQuotaManifests(pool string, tenants []string, maxQueued int) string {
	var b strings.Builder
	for _, tenant := range tenants {
		fmt.Fprintf(&b, `---
apiVersion: quota.fairshare.dev/v1alpha1
kind: TenantQuota
metadata:
  name: %s
spec:
  poolRef:
    name: %s
  weight: 1
  batch:
    maxQueuedJobs: %d
`, tenant, pool, maxQueued)
	}
	return b.String()
}

// SimPoolManifest returns a ProviderPool manifest named pool whose upstream is the
// provider simulator at simURL: the one model sim-gpt with a quota hint far above what
// the tests use (6,000,000 tokens and 600,000 requests a minute), tenants identified by
// the trusted header X-Fairshare-Tenant, and a scheduler with quantumTokens 512,
// statusIntervalSeconds and upstreamConcurrency. schedulerExtra (YAML lines indented by
// four spaces, or "") is appended to spec.scheduler.
func SimPoolManifest(pool, simURL string, statusIntervalSeconds, upstreamConcurrency int, schedulerExtra string) string {
	return fmt.Sprintf(`apiVersion: quota.fairshare.dev/v1alpha1
kind: ProviderPool
metadata:
  name: %s
spec:
  upstream:
    baseURL: %s
  models:
  - name: sim-gpt
    tokensPerMinute: 6000000
    requestsPerMinute: 600000
  tenantIdentification:
    mode: TrustedHeader
    header: X-Fairshare-Tenant
  scheduler:
    quantumTokens: 512
    statusIntervalSeconds: %d
    upstreamConcurrency: %d
%s`, pool, simURL, statusIntervalSeconds, upstreamConcurrency, schedulerExtra)
}
