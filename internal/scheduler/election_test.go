package scheduler

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/providersim"
	"github.com/fairshare-dev/fairshare/internal/schedconfig"
	"github.com/fairshare-dev/fairshare/test/framework"
)

func TestLeaseHeldByAnother(t *testing.T) {
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	rec := func(holder string, renewedAgo time.Duration) resourcelock.LeaderElectionRecord {
		return resourcelock.LeaderElectionRecord{HolderIdentity: holder, LeaseDurationSeconds: 15,
			RenewTime: metav1.NewTime(now.Add(-renewedAgo))}
	}
	for _, c := range []struct {
		name string
		rec  resourcelock.LeaderElectionRecord
		want bool
	}{
		{"another, renewed 14 s ago", rec("b", 14*time.Second), true},
		{"another, renewed 15 s ago (expired)", rec("b", 15*time.Second), false},
		{"another, renewed 1 min ago", rec("b", time.Minute), false},
		{"ours", rec("a", 0), false},
		{"released (no holder)", rec("", 0), false},
	} {
		if got := leaseHeldByAnother(c.rec, "a", now); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// startAPI starts envtest with the CRDs and returns its config and a client.
func startAPI(t *testing.T) (*rest.Config, client.Client) {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set: no API server for envtest")
	}
	env := &envtest.Environment{CRDDirectoryPaths: []string{filepath.Join("..", "..", "config", "crd", "bases")}, ErrorIfCRDPathMissing: true}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return cfg, c
}

// hostPort is the host:port of an API server address (https://host:port).
func hostPort(t *testing.T, host string) string {
	t.Helper()
	u, err := url.Parse(host)
	if err != nil || u.Host == "" {
		t.Fatalf("API server address %q: %v", host, err)
	}
	return u.Host
}

// recorders is a recorder.Provider that drops the events.
type recorders struct{}

func (recorders) GetEventRecorderFor(string) record.EventRecorder { return &record.FakeRecorder{} }

// leaderOnlyProbe is a leader-only Runnable that records whether it runs.
type leaderOnlyProbe struct{ started, running atomic.Bool }

func (p *leaderOnlyProbe) Start(ctx context.Context) error {
	p.started.Store(true)
	p.running.Store(true)
	<-ctx.Done()
	p.running.Store(false)
	return nil
}

// TestElectionStandbyTakesOverDuringPartition runs two electors on one
// Lease against a real API server, with shortened durations (lease 3 s,
// renew 2 s, retry 500 ms). The leader reaches the API server through a
// proxy that is cut: it gives up its renewal but keeps its leader-only
// Runnable running and its Start running; the standby, which still reaches
// the API server, acquires the expired Lease and starts its own. When the
// proxy is restored the old leader reads the new holder and its Start
// returns ErrLeaseTaken (the process would exit and restart as a standby).
// A replica that never led does not stop on seeing another holder.
func TestElectionStandbyTakesOverDuringPartition(t *testing.T) {
	cfg, c := startAPI(t)
	ctx := context.Background()
	ns := "partition"
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	proxy := framework.StartCutProxy(t, hostPort(t, cfg.Host))
	viaProxy := rest.CopyConfig(cfg)
	viaProxy.Host = "https://" + proxy.Addr
	fast := timing{lease: 3 * time.Second, renew: 2 * time.Second, retry: 500 * time.Millisecond}
	log := zap.New(zap.UseDevMode(true))

	type replica struct {
		e     *election
		probe *leaderOnlyProbe
		done  chan error
	}
	start := func(cfg *rest.Config) *replica {
		e, err := newElection(cfg, recorders{}, ns, "pool-scheduler", fast, log)
		if err != nil {
			t.Fatal(err)
		}
		r := &replica{e: e, probe: &leaderOnlyProbe{}, done: make(chan error, 1)}
		g := e.gate(r.probe)
		rctx, cancel := context.WithCancel(ctx)
		gateDone := make(chan struct{})
		go func() { defer close(gateDone); _ = g.Start(rctx) }()
		go func() { r.done <- e.Start(rctx); cancel(); <-gateDone }()
		t.Cleanup(func() { cancel(); <-gateDone })
		return r
	}
	holder := func() string {
		var l coordinationv1.Lease
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pool-scheduler"}, &l); err != nil {
			return ""
		}
		return ptr.Deref(l.Spec.HolderIdentity, "")
	}

	a := start(viaProxy)
	poll(t, "a to lead", func() bool { return a.probe.running.Load() && holder() == a.e.Identity() })
	b := start(cfg)
	// b observes a's Lease and stays standby for several lease durations.
	deadline := time.Now().Add(2 * fast.lease)
	for time.Now().Before(deadline) {
		if b.probe.started.Load() {
			t.Fatal("the standby started its leader-only Runnable while a held the Lease")
		}
		time.Sleep(100 * time.Millisecond)
	}
	select {
	case err := <-b.done:
		t.Fatalf("the standby's election returned %v while a led", err)
	default:
	}

	proxy.Cut()
	poll(t, "b to take over the expired Lease", func() bool { return b.probe.running.Load() && holder() == b.e.Identity() })
	poll(t, "a to give up its renewal", func() bool { return a.e.losses.Load() == 1 })
	if !a.probe.running.Load() {
		t.Error("a stopped its leader-only Runnable when its renewal failed")
	}
	select {
	case err := <-a.done:
		t.Fatalf("a's election returned %v while cut from the API server", err)
	default:
	}

	proxy.Restore()
	select {
	case err := <-a.done:
		if !errors.Is(err, ErrLeaseTaken) || !strings.Contains(err.Error(), b.e.Identity()) {
			t.Errorf("a's election returned %v, want ErrLeaseTaken naming %s", err, b.e.Identity())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a's election did not return after the API server showed b holding the Lease")
	}
	if got := holder(); got != b.e.Identity() {
		t.Errorf("Lease holder %q after a stopped, want b %q", got, b.e.Identity())
	}
	select {
	case err := <-b.done:
		t.Fatalf("b's election returned %v", err)
	default:
	}
}

// TestRunServesThroughAPIServerOutage runs the scheduler with leader
// election on and the production durations against a real API server
// reached through a proxy, elected and serving; the proxy is then cut for
// 21 s, more than RenewDeadline + LeaseDuration (the manager's own election
// made the process exit about 10 s into such an outage). Throughout, Run
// does not return; at the end of the cut /readyz is 200 and an interactive
// call with the tenant's key is served on the last known policy. When the
// proxy is restored the scheduler renews its own Lease (same holder, no
// new transition). Then on cancellation it releases the Lease.
func TestRunServesThroughAPIServerOutage(t *testing.T) {
	cfg, c := startAPI(t)
	ctx := context.Background()
	sim := httptest.NewServer(providersim.New(providersim.Config{TokensPerMinute: 10_000_000, RequestsPerMinute: 100_000}))
	t.Cleanup(sim.Close)
	ns := "outage"
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
	proxy := framework.StartCutProxy(t, hostPort(t, cfg.Host))
	viaProxy := rest.CopyConfig(cfg)
	viaProxy.Host = "https://" + proxy.Addr
	httpAddr, healthAddr := freeAddr(t), freeAddr(t)
	s := schedconfig.Settings{APIVersion: schedconfig.APIVersion, PoolName: "pool", Namespace: ns,
		HTTPAddr: httpAddr, MetricsAddr: "0", HealthAddr: healthAddr, LeaderElection: true, LeaseName: "pool-scheduler",
		StatusIntervalSeconds: 1, UpstreamConcurrency: 8}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(runCtx, s, viaProxy, "", zap.New(zap.UseDevMode(true))) }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			cancel()
			<-done
		}
	})

	status := func(url string) int {
		resp, err := http.Get(url)
		if err != nil {
			return 0
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	chat := func() (int, string) {
		req, _ := http.NewRequest("POST", "http://"+httpAddr+"/v1/chat/completions", strings.NewReader(
			`{"model":"`+providersim.DefaultModel+`","messages":[{"role":"user","content":"Hello there"}],"max_tokens":50}`))
		req.Header.Set("Authorization", "Bearer sk-tenant-a")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	lease := func() coordinationv1.Lease {
		var l coordinationv1.Lease
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pool-scheduler"}, &l); err != nil {
			t.Fatal(err)
		}
		return l
	}
	poll(t, "/readyz", func() bool { return status("http://"+healthAddr+"/readyz") == 200 })
	if code, body := chat(); code != 200 {
		t.Fatalf("chat before the outage: %d %s", code, body)
	}
	before := lease()
	holder := ptr.Deref(before.Spec.HolderIdentity, "")
	if holder == "" {
		t.Fatal("no Lease holder while ready")
	}

	proxy.Cut()
	cutAt := time.Now()
	outage := 21 * time.Second
	for time.Since(cutAt) < outage {
		select {
		case err := <-done:
			stopped = true
			t.Fatalf("Run returned %v %s into the API server outage", err, time.Since(cutAt).Round(time.Second))
		case <-time.After(500 * time.Millisecond):
		}
	}
	// The Lease is expired by now (the renewal was given up after 10 s).
	if got := lease(); got.Spec.RenewTime == nil || time.Since(got.Spec.RenewTime.Time) < LeaseDuration {
		t.Fatalf("Lease renewed %v during the outage: the proxy was not cut", got.Spec.RenewTime)
	}
	if code := status("http://" + healthAddr + "/readyz"); code != 200 {
		t.Errorf("/readyz %s into the outage = %d, want 200", time.Since(cutAt).Round(time.Second), code)
	}
	if code, body := chat(); code != 200 || !strings.Contains(body, `"usage"`) {
		t.Errorf("chat %s into the outage: %d %s", time.Since(cutAt).Round(time.Second), code, body)
	}

	proxy.Restore()
	poll(t, "the Lease renewed after the outage", func() bool {
		l := lease()
		return l.Spec.RenewTime != nil && time.Since(l.Spec.RenewTime.Time) < 5*time.Second
	})
	after := lease()
	if got := ptr.Deref(after.Spec.HolderIdentity, ""); got != holder {
		t.Errorf("Lease holder %q after the outage, want %q (kept)", got, holder)
	}
	if ptr.Deref(after.Spec.LeaseTransitions, 0) != ptr.Deref(before.Spec.LeaseTransitions, 0) {
		t.Errorf("Lease transitions %d after the outage, want %d (renewed, not re-acquired)",
			ptr.Deref(after.Spec.LeaseTransitions, 0), ptr.Deref(before.Spec.LeaseTransitions, 0))
	}
	if code, body := chat(); code != 200 {
		t.Errorf("chat after the outage: %d %s", code, body)
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
	if got := ptr.Deref(lease().Spec.HolderIdentity, ""); got != "" {
		t.Errorf("Lease holder %q after a clean stop, want released", got)
	}
}

// TestElectionLeaseOwnedByPool: the Lease a pool's scheduler replicas elect
// their leader on is created owned by the pool (not as its controller), so
// that deleting the pool deletes it with the pool's other objects instead
// of leaving it behind; the elected replica holds it as before.
func TestElectionLeaseOwnedByPool(t *testing.T) {
	cfg, c := startAPI(t)
	ctx, cancel := context.WithCancel(context.Background())
	ns := "owned"
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	pool := &v1alpha1.ProviderPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pool"}, Spec: v1alpha1.ProviderPoolSpec{
		Upstream: v1alpha1.UpstreamSpec{BaseURL: "http://127.0.0.1:1"}, Models: []v1alpha1.ModelSpec{{Name: "m"}}}}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	fast := timing{lease: 3 * time.Second, renew: 2 * time.Second, retry: 500 * time.Millisecond}
	e, err := newElection(cfg, recorders{}, ns, "pool-scheduler", fast, zap.New(zap.UseDevMode(true)))
	if err != nil {
		t.Fatal(err)
	}
	e.owner = poolOwner(c, ns, "pool")
	done := make(chan error, 1)
	go func() { done <- e.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	var lease coordinationv1.Lease
	poll(t, "the replica to hold the Lease", func() bool {
		return c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pool-scheduler"}, &lease) == nil &&
			ptr.Deref(lease.Spec.HolderIdentity, "") == e.Identity()
	})
	want := []metav1.OwnerReference{{APIVersion: "quota.fairshare.dev/v1alpha1", Kind: "ProviderPool", Name: "pool", UID: pool.UID}}
	if diff := cmp.Diff(want, lease.OwnerReferences); diff != "" {
		t.Errorf("Lease owner references (-want +got):\n%s", diff)
	}
}
