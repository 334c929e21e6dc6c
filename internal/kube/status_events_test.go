package kube

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// eventLog is a record.EventRecorder that keeps "<object> <type> <reason>
// <message>" per event, the object by name.
type eventLog struct {
	mu     sync.Mutex
	events []string
}

func (l *eventLog) Event(obj runtime.Object, typ, reason, msg string) {
	name := "?"
	if o, ok := obj.(metav1.Object); ok {
		name = o.GetName()
	}
	l.mu.Lock()
	l.events = append(l.events, fmt.Sprintf("%s %s %s %s", name, typ, reason, msg))
	l.mu.Unlock()
}

func (l *eventLog) Eventf(obj runtime.Object, typ, reason, format string, args ...any) {
	l.Event(obj, typ, reason, fmt.Sprintf(format, args...))
}

func (l *eventLog) AnnotatedEventf(obj runtime.Object, _ map[string]string, typ, reason, format string, args ...any) {
	l.Eventf(obj, typ, reason, format, args...)
}

// take returns the events recorded since the last take.
func (l *eventLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.events
	l.events = nil
	return out
}

// TestDuplicateAPIKeyEvent: two TenantQuotas of an APIKey pool whose
// Secrets hold the same key: the second is refused (Serving False
// InvalidSpec, naming the tenant and TenantQuota that hold the key) and one
// Warning event with that reason and message is recorded on it, once, not
// on every pass; the first one serves.
func TestDuplicateAPIKeyEvent(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	ns, _, tqA := fixture(t, c)
	if err := c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "shared-key", Namespace: ns},
		Data: map[string][]byte{"api-key": []byte("sk-shared")}}); err != nil {
		t.Fatal(err)
	}
	creds := &v1alpha1.TenantCredentials{SecretRef: v1alpha1.SecretKeyRef{Name: "shared-key"}}
	tqA.Spec.Credentials = creds
	if err := c.Update(ctx, tqA); err != nil {
		t.Fatal(err)
	}
	tqB := &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: "tq-b", Namespace: ns},
		Spec: v1alpha1.TenantQuotaSpec{PoolRef: v1alpha1.PoolRef{Name: "pool"}, Credentials: creds}}
	if err := c.Create(ctx, tqB); err != nil {
		t.Fatal(err)
	}
	fc := clocktesting.NewFakeClock(time.Now().UTC().Truncate(time.Second))
	reg := registry.New(fc)
	state := &State{}
	pr := &PoolReconciler{Reader: c, Registry: reg, Namespace: ns, PoolName: "pool", State: state}
	tr := &TenantReconciler{Reader: c, Registry: reg, Namespace: ns, PoolName: "pool"}
	for _, name := range []string{"pool", "tq-a", "tq-b"} {
		r := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}
		var err error
		if name == "pool" {
			_, err = pr.Reconcile(ctx, r)
		} else {
			_, err = tr.Reconcile(ctx, r)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	events := &eventLog{}
	w := &StatusWriter{Client: c, Registry: reg, State: state, Namespace: ns, PoolName: "pool", Clock: fc, Recorder: events}
	for range 2 {
		fc.Step(10 * time.Second)
		if _, err := w.WriteOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	msg := `API key already used by another tenant (tenant "tq-a" of TenantQuota "tq-a")`
	wantCondition(t, "tq-b", tenantConditions(t, c, ns, "tq-b"), v1alpha1.ConditionServing, metav1.ConditionFalse, v1alpha1.ReasonInvalidSpec, msg)
	wantCondition(t, "tq-a", tenantConditions(t, c, ns, "tq-a"), v1alpha1.ConditionServing, metav1.ConditionTrue, v1alpha1.ReasonLoaded,
		fmt.Sprintf("The scheduler serves generation %d.", tqA.Generation))
	want := []string{"tq-b Warning InvalidSpec " + msg}
	if got := events.take(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("events %q, want %q", got, want)
	}
}
