package kube

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// forbiddenReader refuses every GET, as the API server does before the
// operator has added a Secret to the scheduler's Role.
type forbiddenReader struct{ client.Reader }

func (forbiddenReader) Get(_ context.Context, key client.ObjectKey, _ client.Object, _ ...client.GetOption) error {
	return apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, key.Name, fmt.Errorf("not in the Role"))
}

// TestServingFalseWithoutAPIKey: on a pool that identifies tenants by API
// key, a TenantQuota that no key can authenticate as is Serving False with
// the reason and a message naming what to fix: no spec.credentials
// (NoCredentials), a missing Secret, a Secret without the key or with an
// empty value (CredentialsNotFound), a Secret the scheduler may not read
// yet (CredentialsNotReadable). Each refusal but the transient last one is
// a Warning event when its reason appears. Serving is True again once the
// key is there; on a TrustedHeader pool no key is needed.
func TestServingFalseWithoutAPIKey(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	ns, _, tq := fixture(t, c)
	fc := clocktesting.NewFakeClock(time.Now().UTC().Truncate(time.Second))
	reg := registry.New(fc)
	state := &State{}
	pr := &PoolReconciler{Reader: c, Registry: reg, Namespace: ns, PoolName: "pool", State: state}
	tr := &TenantReconciler{Reader: c, Registry: reg, Namespace: ns, PoolName: "pool"}
	req := func(name string) reconcile.Request {
		return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}
	}
	if _, err := pr.Reconcile(ctx, req("pool")); err != nil {
		t.Fatal(err)
	}
	if m := reg.Pool().IdentMode; m != registry.IdentifyAPIKey {
		t.Fatalf("pool mode %q, want APIKey (the default)", m)
	}
	events := &eventLog{}
	w := &StatusWriter{Client: c, Registry: reg, State: state, Namespace: ns, PoolName: "pool", Clock: fc, Recorder: events}
	step := func(what string, reason, msg string, wantEvents ...string) {
		t.Helper()
		if _, err := tr.Reconcile(ctx, req("tq-a")); err != nil {
			t.Fatal(err)
		}
		fc.Step(10 * time.Second)
		if _, err := w.WriteOnce(ctx); err != nil {
			t.Fatal(err)
		}
		conds := tenantConditions(t, c, ns, "tq-a")
		if reason == v1alpha1.ReasonLoaded {
			wantCondition(t, what, conds, v1alpha1.ConditionServing, metav1.ConditionTrue, reason, msg)
		} else {
			wantCondition(t, what, conds, v1alpha1.ConditionServing, metav1.ConditionFalse, reason, msg)
		}
		// The tenant is served all the same: its figures are reported.
		wantCondition(t, what, conds, v1alpha1.ConditionThrottled, metav1.ConditionFalse, v1alpha1.ReasonWithinLimits, "No limit binds.")
		if got := events.take(); fmt.Sprint(got) != fmt.Sprint(wantEvents) {
			t.Errorf("%s: events %q, want %q", what, got, wantEvents)
		}
	}
	update := func(fn func(*v1alpha1.TenantQuota)) {
		t.Helper()
		var cur v1alpha1.TenantQuota
		if err := c.Get(ctx, client.ObjectKeyFromObject(tq), &cur); err != nil {
			t.Fatal(err)
		}
		fn(&cur)
		if err := c.Update(ctx, &cur); err != nil {
			t.Fatal(err)
		}
	}

	msg := "The pool identifies tenants by API key and spec.credentials is not set: no key authenticates as this tenant."
	step("no credentials", ReasonNoCredentials, msg, "tq-a Warning NoCredentials "+msg)
	step("no credentials, unchanged", ReasonNoCredentials, msg) // no second event

	update(func(tq *v1alpha1.TenantQuota) {
		tq.Spec.Credentials = &v1alpha1.TenantCredentials{SecretRef: v1alpha1.SecretKeyRef{Name: "a-key"}}
	})
	msg = `Secret "a-key" (spec.credentials.secretRef) not found: no key authenticates as this tenant until it exists with key "api-key".`
	step("missing Secret", ReasonCredentialsNotFound, msg, "tq-a Warning CredentialsNotFound "+msg)

	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "a-key", Namespace: ns}, Data: map[string][]byte{"token": []byte("sk-a")}}
	if err := c.Create(ctx, sec); err != nil {
		t.Fatal(err)
	}
	step("Secret without the key", ReasonCredentialsNotFound,
		`Secret "a-key" has no key "api-key" (spec.credentials.secretRef.key): no key authenticates as this tenant until it is added.`)

	sec.Data = map[string][]byte{"api-key": []byte(" \n")}
	if err := c.Update(ctx, sec); err != nil {
		t.Fatal(err)
	}
	step("empty key", ReasonCredentialsNotFound,
		`Secret "a-key" has an empty value under key "api-key" (spec.credentials.secretRef.key): no key authenticates as this tenant until it is set.`)

	tr.Secrets = forbiddenReader{}
	step("Secret not readable yet", ReasonCredentialsNotReadable,
		`Secret "a-key" (spec.credentials.secretRef) is not readable by the scheduler yet (the operator grants it in Role "pool-scheduler-secrets"); retried every 5s.`)
	tr.Secrets = nil

	sec.Data = map[string][]byte{"api-key": []byte("sk-a")}
	if err := c.Update(ctx, sec); err != nil {
		t.Fatal(err)
	}
	var cur v1alpha1.TenantQuota
	if err := c.Get(ctx, client.ObjectKeyFromObject(tq), &cur); err != nil {
		t.Fatal(err)
	}
	loaded := fmt.Sprintf("The scheduler serves generation %d.", cur.Generation)
	step("key present", v1alpha1.ReasonLoaded, loaded)
	if reg.TenantByKey("sk-a") == nil {
		t.Error("the key does not authenticate")
	}

	// A pool that trusts a header needs no key.
	update(func(tq *v1alpha1.TenantQuota) { tq.Spec.Credentials = nil })
	var p v1alpha1.ProviderPool
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pool"}, &p); err != nil {
		t.Fatal(err)
	}
	p.Spec.TenantIdentification.Mode = v1alpha1.IdentifyByTrustedHeader
	if err := c.Update(ctx, &p); err != nil {
		t.Fatal(err)
	}
	if _, err := pr.Reconcile(ctx, req("pool")); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(tq), &cur); err != nil {
		t.Fatal(err)
	}
	step("TrustedHeader pool, no credentials", v1alpha1.ReasonLoaded, fmt.Sprintf("The scheduler serves generation %d.", cur.Generation))
}

// TestNoWritesAfterPoolDeleted: once the scheduler's pool reconciler finds
// its ProviderPool deleted, the status writer writes nothing, not even a
// tenant whose Serving would now read True (the KeyIssue applies only
// while a pool identifies tenants by API key): the operator has set
// Serving False PoolNotFound for the gone pool, and a late write of the
// terminating scheduler would bring back a Serving True nothing corrects.
// Writes resume when the pool exists again.
func TestNoWritesAfterPoolDeleted(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	ns, pool, _ := fixture(t, c)
	fc := clocktesting.NewFakeClock(time.Now().UTC().Truncate(time.Second))
	reg := registry.New(fc)
	state := &State{}
	pr := &PoolReconciler{Reader: c, Registry: reg, Namespace: ns, PoolName: "pool", State: state}
	tr := &TenantReconciler{Reader: c, Registry: reg, Namespace: ns, PoolName: "pool"}
	req := func(name string) reconcile.Request {
		return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}
	}
	w := &StatusWriter{Client: c, Registry: reg, State: state, Namespace: ns, PoolName: "pool", Clock: fc}
	if _, err := pr.Reconcile(ctx, req("pool")); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Reconcile(ctx, req("tq-a")); err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteOnce(ctx); err != nil {
		t.Fatal(err)
	}
	wantCondition(t, "pool served", tenantConditions(t, c, ns, "tq-a"), v1alpha1.ConditionServing, metav1.ConditionFalse, ReasonNoCredentials,
		"The pool identifies tenants by API key and spec.credentials is not set: no key authenticates as this tenant.")

	if err := c.Delete(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pr.Reconcile(ctx, req("pool")); err != nil {
		t.Fatal(err)
	}
	fc.Step(time.Minute)
	n, err := w.WriteOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d status writes after the pool was deleted, want 0", n)
	}
	wantCondition(t, "pool deleted", tenantConditions(t, c, ns, "tq-a"), v1alpha1.ConditionServing, metav1.ConditionFalse, ReasonNoCredentials,
		"The pool identifies tenants by API key and spec.credentials is not set: no key authenticates as this tenant.")

	pool2 := &v1alpha1.ProviderPool{ObjectMeta: metav1.ObjectMeta{Name: "pool", Namespace: ns}, Spec: pool.Spec}
	pool2.Spec.TenantIdentification.Mode = v1alpha1.IdentifyByTrustedHeader
	if err := c.Create(ctx, pool2); err != nil {
		t.Fatal(err)
	}
	if _, err := pr.Reconcile(ctx, req("pool")); err != nil {
		t.Fatal(err)
	}
	fc.Step(time.Minute)
	if n, err = w.WriteOnce(ctx); err != nil || n == 0 {
		t.Fatalf("after the pool is created again: %d writes, error %v; want writes", n, err)
	}
	var cur v1alpha1.TenantQuota
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "tq-a"}, &cur); err != nil {
		t.Fatal(err)
	}
	wantCondition(t, "pool created again", cur.Status.Conditions, v1alpha1.ConditionServing, metav1.ConditionTrue, v1alpha1.ReasonLoaded,
		fmt.Sprintf("The scheduler serves generation %d.", cur.Generation))
}
