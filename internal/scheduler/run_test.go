package scheduler

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/providersim"
	"github.com/fairshare-dev/fairshare/internal/schedconfig"
)

func TestParseFlags(t *testing.T) {
	f, err := ParseFlags([]string{"--config", "/etc/s.json", "--http-addr", ":1", "--metrics-addr", "0", "--health-addr", ":3", "--kubeconfig", "/k", "--zap-log-level", "debug"})
	if err != nil {
		t.Fatal(err)
	}
	if f.Config != "/etc/s.json" || f.HTTPAddr != ":1" || f.MetricsAddr != "0" || f.HealthAddr != ":3" || f.Kubeconfig != "/k" {
		t.Errorf("flags = %+v", f)
	}
	if f.SkipRBACCheck {
		t.Errorf("--skip-rbac-check not given: SkipRBACCheck true")
	}
	if f, err := ParseFlags([]string{"--config", "/etc/s.json", "--skip-rbac-check"}); err != nil || !f.SkipRBACCheck {
		t.Errorf("--skip-rbac-check: SkipRBACCheck %v, error %v; want true", f.SkipRBACCheck, err)
	}
	if f.JobStore != nil {
		t.Errorf("--job-store not given: JobStore = %q, want nil (the settings' path applies)", *f.JobStore)
	}
	if _, err := ParseFlags(nil); err == nil || !strings.Contains(err.Error(), "--config is required") {
		t.Errorf("missing --config: %v", err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--job-store", "/tmp/j.db"}, "/tmp/j.db"},
		{[]string{"--job-store="}, ""},
		{[]string{"--job-store", ""}, ""},
	} {
		f, err := ParseFlags(append([]string{"--config", "/etc/s.json"}, tc.args...))
		if err != nil {
			t.Fatal(err)
		}
		if f.JobStore == nil || *f.JobStore != tc.want {
			t.Errorf("%q: JobStore = %v, want %q", tc.args, f.JobStore, tc.want)
		}
	}
}

// freeAddr returns a 127.0.0.1 address with a port free right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// poll calls cond until it holds, failing after 30 s of real time.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRunEndToEnd runs the scheduler in process against a real API server
// (envtest) and the provider simulator: it becomes ready (leader, pool and
// tenant loaded), serves an interactive call and a batch job with the
// tenant's key from its Secret, writes status under its field manager,
// exports metrics, and returns on cancellation releasing its ports.
func TestRunEndToEnd(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set: no API server for envtest")
	}
	env := &envtest.Environment{CRDDirectoryPaths: []string{filepath.Join("..", "..", "config", "crd", "bases")}, ErrorIfCRDPathMissing: true}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	user, err := env.AddUser(envtest.User{Name: "scheduler-test", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kcPath := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kcPath, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}

	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sim := httptest.NewServer(providersim.New(providersim.Config{TokensPerMinute: 10_000_000, RequestsPerMinute: 100_000}))
	t.Cleanup(sim.Close)

	ns := "e2e"
	wpm := int64(600000)
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "a-key", Namespace: ns}, Data: map[string][]byte{"api-key": []byte("sk-tenant-a")}},
		&v1alpha1.ProviderPool{ObjectMeta: metav1.ObjectMeta{Name: "pool", Namespace: ns}, Spec: v1alpha1.ProviderPoolSpec{
			Upstream: v1alpha1.UpstreamSpec{BaseURL: sim.URL}, Models: []v1alpha1.ModelSpec{{Name: providersim.DefaultModel}}}},
		&v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: "tq-a", Namespace: ns}, Spec: v1alpha1.TenantQuotaSpec{
			PoolRef: v1alpha1.PoolRef{Name: "pool"}, Tokens: &v1alpha1.TokenLimits{WeightedPerMinute: &wpm},
			Credentials: &v1alpha1.TenantCredentials{SecretRef: v1alpha1.SecretKeyRef{Name: "a-key"}}}},
	} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	httpAddr, metricsAddr, healthAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	settings := schedconfig.Settings{APIVersion: schedconfig.APIVersion, PoolName: "pool", Namespace: ns,
		HTTPAddr: "127.0.0.1:1", MetricsAddr: "0", HealthAddr: "0", LeaderElection: true, LeaseName: "pool-scheduler",
		StatusIntervalSeconds: 1, UpstreamConcurrency: 8}
	cfgPath := filepath.Join(dir, "scheduler.json")
	if err := os.WriteFile(cfgPath, settings.Marshal(), 0o600); err != nil {
		t.Fatal(err)
	}

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- Run(runCtx, []string{"--config", cfgPath, "--kubeconfig", kcPath,
			"--http-addr", httpAddr, "--metrics-addr", metricsAddr, "--health-addr", healthAddr})
	}()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			cancel()
			<-done
		}
	})

	get := func(url string) (int, string) {
		resp, err := http.Get(url)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	poll(t, "/readyz", func() bool { code, _ := get("http://" + healthAddr + "/readyz"); return code == 200 })
	if code, _ := get("http://" + healthAddr + "/healthz"); code != 200 {
		t.Errorf("/healthz = %d", code)
	}

	post := func(path, body string) (int, []byte) {
		req, _ := http.NewRequest("POST", "http://"+httpAddr+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer sk-tenant-a")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	chat := `{"model":"` + providersim.DefaultModel + `","messages":[{"role":"user","content":"Hello there"}],"max_tokens":50}`
	code, body := post("/v1/chat/completions", chat)
	if code != 200 || !strings.Contains(string(body), `"usage"`) {
		t.Fatalf("chat: %d %s", code, body)
	}
	code, body = post("/v1/jobs", `{"body":`+chat+`}`)
	if code != 202 {
		t.Fatalf("job: %d %s", code, body)
	}
	var job struct{ ID string }
	_ = json.Unmarshal(body, &job)
	poll(t, "the job to succeed", func() bool {
		req, _ := http.NewRequest("GET", "http://"+httpAddr+"/v1/jobs/"+job.ID, nil)
		req.Header.Set("Authorization", "Bearer sk-tenant-a")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var j struct{ Status string }
		_ = json.NewDecoder(resp.Body).Decode(&j)
		return j.Status == "succeeded"
	})

	poll(t, "the tenant status", func() bool {
		var tq v1alpha1.TenantQuota
		if c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "tq-a"}, &tq) != nil {
			return false
		}
		s := meta.FindStatusCondition(tq.Status.Conditions, v1alpha1.ConditionServing)
		return s != nil && s.Status == metav1.ConditionTrue && tq.Status.CompletedJobs != nil && *tq.Status.CompletedJobs == 1
	})
	// The pool's status is written in its own report after the tenants'; wait for it.
	var pool v1alpha1.ProviderPool
	poll(t, "the pool status", func() bool {
		if c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pool"}, &pool) != nil {
			return false
		}
		return meta.IsStatusConditionTrue(pool.Status.Conditions, v1alpha1.ConditionServing) && pool.Status.Tenants != nil && *pool.Status.Tenants == 1
	})
	managers := map[string]bool{}
	for _, mf := range pool.ManagedFields {
		managers[mf.Manager+"/"+mf.Subresource] = true
	}
	if !managers[v1alpha1.FieldManagerScheduler+"/status"] || pool.Status.Tenants == nil || *pool.Status.Tenants != 1 {
		t.Errorf("pool status %+v, managers %v", pool.Status, managers)
	}

	_, metricsText := get("http://" + metricsAddr + "/metrics")
	for _, want := range []string{
		`fairshare_scheduler_requests_total{outcome="ok",tenant="tq-a"} 1`,
		`fairshare_scheduler_requests_total{outcome="queued",tenant="tq-a"} 1`,
		`fairshare_scheduler_upstream_responses_total{code="200",model="gpt-4o-mini"} 2`,
		`fairshare_scheduler_tenant_queued_jobs{tenant="tq-a"} 0`,
		`fairshare_scheduler_queue_wait_seconds_count 1`,
	} {
		if !strings.Contains(metricsText, want) {
			t.Errorf("metrics lack %q", want)
		}
	}

	cancel()
	select {
	case err := <-done:
		stopped = true
		if err != nil {
			t.Errorf("Run returned %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after cancellation")
	}
	for _, addr := range []string{httpAddr, metricsAddr, healthAddr} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("port %s not released: %v", addr, err)
			continue
		}
		ln.Close()
	}
	_ = fmt.Sprint()
}

func TestApplyFlags(t *testing.T) {
	s := schedconfig.Settings{HTTPAddr: ":8080", MetricsAddr: ":9090", HealthAddr: ":8081", JobStorePath: "/var/lib/fairshare/jobs.db"}
	if got := applyFlags(s, Flags{}); got != s {
		t.Errorf("no flags: %+v, want the settings %+v", got, s)
	}
	path, memory := "/tmp/j.db", ""
	got := applyFlags(s, Flags{HTTPAddr: "127.0.0.1:1", JobStore: &path})
	want := schedconfig.Settings{HTTPAddr: "127.0.0.1:1", MetricsAddr: ":9090", HealthAddr: ":8081", JobStorePath: "/tmp/j.db"}
	if got != want {
		t.Errorf("flags: %+v, want %+v", got, want)
	}
	// --job-store= keeps jobs in memory although the settings name a file.
	got = applyFlags(s, Flags{JobStore: &memory})
	want = schedconfig.Settings{HTTPAddr: ":8080", MetricsAddr: ":9090", HealthAddr: ":8081", JobStorePath: ""}
	if got != want {
		t.Errorf("--job-store=: %+v, want %+v", got, want)
	}
	if storeDescription("") != "memory" || storeDescription(path) != path {
		t.Errorf("storeDescription: %q, %q", storeDescription(""), storeDescription(path))
	}
}

// TestStoreOpenedByTheLeaderOnly runs two schedulers in this process with
// leader election on and the same job store (the settings' jobStorePath),
// against a real API server. The first is elected, opens the store and runs
// a batch job. The second, started meanwhile, loads the pool and tenants
// and stays a standby: not ready, no gateway listening, the Lease still the
// first's; it does not touch the store (opening it before the election
// would block on the first's file lock for StoreLockTimeout, and its
// health and metrics servers would not come up).
// When the first stops (releasing its Lease after closing the store), the
// second is elected, opens the store and serves the first's finished job.
func TestStoreOpenedByTheLeaderOnly(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set: no API server for envtest")
	}
	env := &envtest.Environment{CRDDirectoryPaths: []string{filepath.Join("..", "..", "config", "crd", "bases")}, ErrorIfCRDPathMissing: true}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	user, err := env.AddUser(envtest.User{Name: "scheduler-test", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kcPath := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kcPath, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sim := httptest.NewServer(providersim.New(providersim.Config{TokensPerMinute: 10_000_000, RequestsPerMinute: 100_000}))
	t.Cleanup(sim.Close)
	ns := "ha"
	wpm := int64(600000)
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "a-key", Namespace: ns}, Data: map[string][]byte{"api-key": []byte("sk-tenant-a")}},
		&v1alpha1.ProviderPool{ObjectMeta: metav1.ObjectMeta{Name: "pool", Namespace: ns}, Spec: v1alpha1.ProviderPoolSpec{
			Upstream: v1alpha1.UpstreamSpec{BaseURL: sim.URL}, Models: []v1alpha1.ModelSpec{{Name: providersim.DefaultModel}}}},
		&v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: "tq-a", Namespace: ns}, Spec: v1alpha1.TenantQuotaSpec{
			PoolRef: v1alpha1.PoolRef{Name: "pool"}, Tokens: &v1alpha1.TokenLimits{WeightedPerMinute: &wpm},
			Credentials: &v1alpha1.TenantCredentials{SecretRef: v1alpha1.SecretKeyRef{Name: "a-key"}}}},
	} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	settings := schedconfig.Settings{APIVersion: schedconfig.APIVersion, PoolName: "pool", Namespace: ns,
		HTTPAddr: "127.0.0.1:1", MetricsAddr: "0", HealthAddr: "0", LeaderElection: true, LeaseName: "pool-scheduler",
		StatusIntervalSeconds: 1, UpstreamConcurrency: 8, JobStorePath: filepath.Join(dir, "store", "jobs.db")}
	cfgPath := filepath.Join(dir, "scheduler.json")
	if err := os.WriteFile(cfgPath, settings.Marshal(), 0o600); err != nil {
		t.Fatal(err)
	}

	type replica struct {
		httpAddr, healthAddr, metricsAddr string
		cancel                            context.CancelFunc
		done                              chan error
	}
	start := func() *replica {
		r := &replica{httpAddr: freeAddr(t), healthAddr: freeAddr(t), metricsAddr: freeAddr(t), done: make(chan error, 1)}
		runCtx, cancel := context.WithCancel(ctx)
		r.cancel = cancel
		go func() {
			r.done <- Run(runCtx, []string{"--config", cfgPath, "--kubeconfig", kcPath,
				"--http-addr", r.httpAddr, "--health-addr", r.healthAddr, "--metrics-addr", r.metricsAddr})
		}()
		return r
	}
	stop := func(r *replica) error {
		r.cancel()
		select {
		case err := <-r.done:
			return err
		case <-time.After(60 * time.Second):
			t.Fatal("Run did not return after cancellation")
			return nil
		}
	}
	status := func(url string) int {
		resp, err := http.Get(url)
		if err != nil {
			return 0
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	call := func(r *replica, method, path, body string) (int, []byte) {
		req, _ := http.NewRequest(method, "http://"+r.httpAddr+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer sk-tenant-a")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	jobStatus := func(r *replica, id string) string {
		code, b := call(r, "GET", "/v1/jobs/"+id, "")
		if code != 200 {
			return fmt.Sprintf("HTTP %d", code)
		}
		var j struct{ Status string }
		_ = json.Unmarshal(b, &j)
		return j.Status
	}

	first := start()
	firstStopped := false
	t.Cleanup(func() {
		if !firstStopped {
			_ = stop(first)
		}
	})
	poll(t, "the first scheduler ready", func() bool { return status("http://"+first.healthAddr+"/readyz") == 200 })
	if _, err := os.Stat(settings.JobStorePath); err != nil {
		t.Fatalf("the leader did not open the store at the settings' path: %v", err)
	}
	chat := `{"model":"` + providersim.DefaultModel + `","messages":[{"role":"user","content":"Hello there"}],"max_tokens":50}`
	code, body := call(first, "POST", "/v1/jobs", `{"body":`+chat+`}`)
	if code != 202 {
		t.Fatalf("job: %d %s", code, body)
	}
	var job struct{ ID string }
	if err := json.Unmarshal(body, &job); err != nil || job.ID == "" {
		t.Fatalf("job response %s: %v", body, err)
	}
	poll(t, "the job to succeed", func() bool { return jobStatus(first, job.ID) == "succeeded" })
	var lease coordinationv1.Lease
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pool-scheduler"}, &lease); err != nil {
		t.Fatal(err)
	}
	leader := ptr.Deref(lease.Spec.HolderIdentity, "")

	second := start()
	t.Cleanup(func() { _ = stop(second) })
	// The tenant in the second's metrics: its informers synced and its sync
	// controllers ran, after which its manager starts the election.
	poll(t, "the second scheduler's registry loaded", func() bool {
		resp, err := http.Get("http://" + second.metricsAddr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(b), `fairshare_scheduler_tenant_queued_jobs{tenant="tq-a"}`)
	})
	if got := status("http://" + second.healthAddr + "/readyz"); got != http.StatusInternalServerError {
		t.Errorf("standby /readyz = %d, want 500", got)
	}
	if conn, err := net.DialTimeout("tcp", second.httpAddr, time.Second); err == nil {
		conn.Close()
		t.Errorf("standby gateway listening on %s", second.httpAddr)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pool-scheduler"}, &lease); err != nil {
		t.Fatal(err)
	}
	if got := ptr.Deref(lease.Spec.HolderIdentity, ""); got != leader || leader == "" {
		t.Fatalf("Lease holder %q with a standby running, want the first scheduler %q", got, leader)
	}

	firstStopped = true
	if err := stop(first); err != nil {
		t.Errorf("first Run returned %v", err)
	}
	poll(t, "the second scheduler ready", func() bool { return status("http://"+second.healthAddr+"/readyz") == 200 })
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pool-scheduler"}, &lease); err != nil {
		t.Fatal(err)
	}
	if got := ptr.Deref(lease.Spec.HolderIdentity, ""); got == leader || got == "" {
		t.Errorf("Lease holder %q after the first stopped, want the second scheduler", got)
	}
	if got := jobStatus(second, job.ID); got != "succeeded" {
		t.Errorf("the first's job on the second scheduler: %s, want succeeded (from the shared store)", got)
	}
}
