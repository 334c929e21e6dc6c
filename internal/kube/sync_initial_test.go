package kube

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

type syncedCache struct{}

func (syncedCache) WaitForCacheSync(context.Context) bool { return true }

// flakySecrets fails its first fails Secret GETs with 503.
type flakySecrets struct {
	client.Reader
	fails int
}

func (f *flakySecrets) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if f.fails > 0 {
		f.fails--
		return apierrors.NewServiceUnavailable("the API server is restarting")
	}
	return f.Reader.Get(ctx, key, obj, opts...)
}

// TestInitialSyncRetriesTransientSecretError: a key Secret's GET that
// fails once at start (the API server restarting or shedding load) must not
// stop the scheduler (a Runnable error ends the manager, the process exits
// and the pool's data plane is down through the pod's crash back-off): the
// initial load is tried again, and the registry becomes ready with the
// tenant's key.
func TestInitialSyncRetriesTransientSecretError(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	ns, _, tq := fixture(t, c)
	if err := c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "a-key", Namespace: ns},
		Data: map[string][]byte{"api-key": []byte("sk-a")}}); err != nil {
		t.Fatal(err)
	}
	tq.Spec.Credentials = &v1alpha1.TenantCredentials{SecretRef: v1alpha1.SecretKeyRef{Name: "a-key"}}
	if err := c.Update(ctx, tq); err != nil {
		t.Fatal(err)
	}
	reg := registry.New(clocktesting.NewFakeClock(time.Now()))
	s := &initialSync{cache: syncedCache{},
		pool:    &PoolReconciler{Reader: c, Registry: reg, Namespace: ns, PoolName: "pool", State: &State{}},
		tenants: &TenantReconciler{Reader: c, Secrets: &flakySecrets{Reader: c, fails: 1}, Registry: reg, Namespace: ns, PoolName: "pool"},
		reg:     reg, retry: 10 * time.Millisecond}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Start(sctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for !reg.Ready() || reg.TenantByKey("sk-a") == nil {
		select {
		case err := <-done:
			cancel()
			t.Fatalf("initial sync stopped after a transient Secret error: %v; want it retried", err)
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatal("registry not ready with the tenant's key 10 s after a transient Secret error")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Start returned %v at shutdown; want nil", err)
	}
}
