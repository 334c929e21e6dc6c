package kube

import (
	"context"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/render"
)

// readsAs reads through reader and writes through the embedded client: the
// scheduler reads its objects from its cache (list and watch, granted by
// the shared ClusterRole) and writes their status as its ServiceAccount.
type readsAs struct {
	client.Client
	reader client.Reader
}

func (c readsAs) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	return c.reader.Get(ctx, key, obj, opts...)
}

// TestStatusWriterRetriesForbiddenTenant: a tenant's status write that the
// scheduler's ServiceAccount may not make yet (a TenantQuota just added,
// which the operator's pool Role names a moment later) is refused with
// Forbidden, the other objects are written, and the tenant stays dirty: the
// next pass after the Role names it writes it.
func TestStatusWriterRetriesForbiddenTenant(t *testing.T) {
	admin := newClient(t)
	ctx := context.Background()
	ns, pool, tq := fixture(t, admin)
	late := tq.DeepCopy()
	late.ObjectMeta = *late.ObjectMeta.DeepCopy()
	late.Name, late.ResourceVersion, late.UID = "tq-late", "", ""
	if err := admin.Create(ctx, late); err != nil {
		t.Fatal(err)
	}
	user := "system:serviceaccount:" + ns + ":" + render.Name(pool)
	applyRole := func(names ...string) {
		t.Helper()
		objs, err := render.RenderWithTenants(pool, render.Options{DefaultImage: "img", SchedulerClusterRole: "fairshare-scheduler"}, render.Tenants{Names: names})
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range []client.Object{objs.PoolRole, objs.PoolRoleBinding} {
			if err := admin.Patch(ctx, o, client.Apply, client.FieldOwner("test"), client.ForceOwnership); err != nil {
				t.Fatal(err)
			}
		}
		// Wait until the RBAC authorizer has seen the Role.
		deadline := time.Now().Add(10 * time.Second)
		for {
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: user,
				ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: "patch", Group: v1alpha1.GroupVersion.Group,
					Resource: "tenantquotas", Subresource: "status", Name: names[len(names)-1]}}}
			if err := admin.Create(ctx, sar); err != nil {
				t.Fatal(err)
			}
			if sar.Status.Allowed {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s may not patch the status of TenantQuota %s", user, names[len(names)-1])
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	applyRole("tq-a")

	saCfg := rest.CopyConfig(cfg)
	saCfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	sa, err := client.New(saCfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	fc := clocktesting.NewFakeClock(time.Now().Truncate(time.Second))
	reg := registry.New(fc)
	if err := reg.SetPool(PoolPolicy(pool)); err != nil {
		t.Fatal(err)
	}
	for _, q := range []*v1alpha1.TenantQuota{tq, late} {
		if err := reg.UpsertTenant(TenantPolicy(q)); err != nil {
			t.Fatal(err)
		}
	}
	w := &StatusWriter{Client: readsAs{Client: sa, reader: admin}, Registry: reg, State: &State{}, Namespace: ns, PoolName: "pool", Clock: fc}
	reported := func(name string) bool {
		t.Helper()
		var got v1alpha1.TenantQuota
		if err := admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &got); err != nil {
			t.Fatal(err)
		}
		return got.Status.LastReportTime != nil
	}

	r, err := w.Pass(ctx, w.interval())
	if !apierrors.IsForbidden(err) || r.Writes != 2 || r.Dirty != 1 {
		t.Fatalf("first pass: %d writes, %d dirty, %v; want the pool and tq-a written, tq-late Forbidden and dirty", r.Writes, r.Dirty, err)
	}
	if !reported("tq-a") || reported("tq-late") {
		t.Fatalf("first pass: tq-a reported %v, tq-late reported %v; want true, false", reported("tq-a"), reported("tq-late"))
	}

	applyRole("tq-a", "tq-late")
	fc.Step(w.interval())
	r, err = w.Pass(ctx, w.interval())
	if err != nil || r.Writes != 1 || r.Dirty != 0 {
		t.Fatalf("pass after the Role names tq-late: %d writes, %d dirty, %v; want tq-late written", r.Writes, r.Dirty, err)
	}
	if !reported("tq-late") {
		t.Error("tq-late's status is not written once the Role names it")
	}
}
