package controllers

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/render"
)

// The envtest suite: a real kube-apiserver and etcd from KUBEBUILDER_ASSETS,
// the CRDs from config/crd/bases, and a manager running both reconcilers
// through a client that counts writes. The control plane runs no
// controllers: no pods, no Deployment status, no garbage collection; tests
// set Deployment status themselves and assert owner references instead of
// deletion cascades.

var (
	// skipReason is set when the control plane is unavailable.
	skipReason string
	// testConfig is the admin configuration of the control plane.
	testConfig *rest.Config
	// testScheme holds the client-go types and quota.fairshare.dev/v1alpha1.
	testScheme *runtime.Scheme
	// k8sClient talks to the API server directly (no cache), as a user would.
	k8sClient client.Client
	// counter wraps the manager's client used by both reconcilers.
	counter *countingClient
	// testClock stamps lastTransitionTime; tests step it to prove that
	// unchanged conditions keep their time (BC-42).
	testClock = clocktesting.NewFakePassiveClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	// poolReconciler and tenantReconciler are the instances the manager runs;
	// tests may also call Reconcile on them directly.
	poolReconciler   *ProviderPoolReconciler
	tenantReconciler *TenantQuotaReconciler
)

// testRenderOptions are the operator flags the suite runs with.
var testRenderOptions = render.Options{DefaultImage: "ghcr.io/fairshare-dev/fairshare:v0.1.0", SchedulerClusterRole: "fairshare-scheduler"}

func TestMain(m *testing.M) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		skipReason = "KUBEBUILDER_ASSETS is unset: the envtest suite needs kube-apiserver and etcd " +
			"(build them with hack/bin-tools.sh and set KUBEBUILDER_ASSETS=$PWD/bin)"
		os.Exit(m.Run())
	}
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) int {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapLevel())))
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting envtest control plane:", err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping envtest control plane:", err)
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	done, err := startManager(ctx, cfg)
	if err != nil {
		cancel()
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	cancel()
	<-done
	return code
}

// zapLevel logs errors only, unless FAIRSHARE_TEST_LOG is set.
func zapLevel() zapcore.Level {
	if os.Getenv("FAIRSHARE_TEST_LOG") != "" {
		return zapcore.Level(-2)
	}
	return zapcore.ErrorLevel
}

func startManager(ctx context.Context, cfg *rest.Config) (<-chan struct{}, error) {
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(v1alpha1.AddToScheme(scheme))
	testConfig, testScheme = cfg, scheme
	var err error
	if k8sClient, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		return nil, fmt.Errorf("creating test client: %w", err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  cache.Options{ByObject: CacheByObject()},
	})
	if err != nil {
		return nil, fmt.Errorf("creating manager: %w", err)
	}
	counter = newCountingClient(mgr.GetClient())
	recorder := mgr.GetEventRecorderFor(EventSource)
	poolReconciler = NewProviderPoolReconciler(counter, scheme, recorder, WithClock(testClock), WithRenderOptions(testRenderOptions),
		WithAPIReader(mgr.GetAPIReader()))
	tenantReconciler = NewTenantQuotaReconciler(counter, scheme, recorder, WithClock(testClock))
	if err := poolReconciler.SetupWithManager(mgr); err != nil {
		return nil, err
	}
	if err := tenantReconciler.SetupWithManager(mgr); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "manager stopped:", err)
		}
	}()
	return done, nil
}

// requireEnv skips the test when the control plane is unavailable.
func requireEnv(t *testing.T) {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
}

// countingClient counts the writes the reconcilers make, per kind and
// object: server-side applies of owned objects and status applies.
type countingClient struct {
	client.Client
	mu            sync.Mutex
	applies       map[string]int
	statusApplies map[string]int
}

func newCountingClient(c client.Client) *countingClient {
	return &countingClient{Client: c, applies: map[string]int{}, statusApplies: map[string]int{}}
}

func countKey(obj client.Object) string {
	return fmt.Sprintf("%s %s/%s", obj.GetObjectKind().GroupVersionKind().Kind, obj.GetNamespace(), obj.GetName())
}

func (c *countingClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	c.mu.Lock()
	c.applies[countKey(obj)]++
	c.mu.Unlock()
	return c.Client.Patch(ctx, obj, patch, opts...)
}

func (c *countingClient) Status() client.SubResourceWriter {
	return &countingStatusWriter{SubResourceWriter: c.Client.Status(), c: c}
}

// Applies returns how often obj (kind, namespace, name) was applied.
func (c *countingClient) Applies(kind, namespace, name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.applies[fmt.Sprintf("%s %s/%s", kind, namespace, name)]
}

// StatusApplies returns how often obj's status was written.
func (c *countingClient) StatusApplies(kind, namespace, name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.statusApplies[fmt.Sprintf("%s %s/%s", kind, namespace, name)]
}

type countingStatusWriter struct {
	client.SubResourceWriter
	c *countingClient
}

// Patch counts successful status applies only: one refused by the
// resourceVersion precondition (409, a reconcile that read a stale cache)
// writes nothing.
func (w *countingStatusWriter) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	key := countKey(obj)
	err := w.SubResourceWriter.Patch(ctx, obj, patch, opts...)
	if err == nil {
		w.c.mu.Lock()
		w.c.statusApplies[key]++
		w.c.mu.Unlock()
	}
	return err
}

func (w *countingStatusWriter) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	w.c.mu.Lock()
	w.c.statusApplies[countKey(obj)]++
	w.c.mu.Unlock()
	return w.SubResourceWriter.Update(ctx, obj, opts...)
}
