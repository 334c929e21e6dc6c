package controllers

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/render"
)

// readYAMLDocuments decodes every document of a multi-document YAML file.
func readYAMLDocuments(t *testing.T, path string) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var objs []*unstructured.Unstructured
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(doc, &u.Object); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

// TestSamplesAreValid creates every sample in config/samples (server-side
// dry run) against the CRDs' schema and CEL rules.
func TestSamplesAreValid(t *testing.T) {
	requireEnv(t)
	for _, tc := range []struct {
		dir   string
		glob  string
		kinds map[string]int
	}{
		// The demo: one pool on the simulator, three tenants.
		{filepath.Join("..", "config", "samples"), "quota_*.yaml", map[string]int{"ProviderPool": 1, "TenantQuota": 3}},
		// A realistic SaaS: one OpenAI pool, free/pro/enterprise plans and their Secrets.
		{filepath.Join("..", "config", "samples", "saas"), "*.yaml", map[string]int{"ProviderPool": 1, "TenantQuota": 3, "Secret": 4}},
	} {
		t.Run(filepath.Base(tc.dir), func(t *testing.T) {
			ns := newNamespace(t)
			paths, err := filepath.Glob(filepath.Join(tc.dir, tc.glob))
			if err != nil || len(paths) == 0 {
				t.Fatalf("no samples found (%v)", err)
			}
			kinds := map[string]int{}
			for _, path := range paths {
				if filepath.Base(path) == "kustomization.yaml" {
					continue
				}
				for _, u := range readYAMLDocuments(t, path) {
					if u.GetNamespace() != "" {
						t.Errorf("%s: sample %s sets a namespace", path, u.GetName())
					}
					u.SetNamespace(ns)
					if err := k8sClient.Create(context.Background(), u, client.DryRunAll); err != nil {
						t.Errorf("%s: %s %s is invalid: %v", path, u.GetKind(), u.GetName(), err)
					}
					kinds[u.GetKind()]++
				}
			}
			if !maps.Equal(kinds, tc.kinds) {
				t.Errorf("samples = %v, want %v", kinds, tc.kinds)
			}
		})
	}
}

// managerUser is the operator's ServiceAccount as config/rbac binds it.
const managerUser = "system:serviceaccount:fairshare-system:fairshare-manager"

// installRBAC creates the generated ClusterRoles and the operator's
// ClusterRoleBinding from config/rbac.
func installRBAC(t *testing.T) {
	t.Helper()
	for _, file := range []string{"role.yaml", "role_binding.yaml", filepath.Join("scheduler", "role.yaml")} {
		for _, u := range readYAMLDocuments(t, filepath.Join("..", "config", "rbac", file)) {
			err := k8sClient.Create(context.Background(), u)
			if err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatalf("creating %s %s from %s: %v", u.GetKind(), u.GetName(), file, err)
			}
		}
	}
}

// asManager returns an uncached client that impersonates the operator's ServiceAccount.
func asManager(t *testing.T) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(testConfig)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: managerUser, Groups: []string{"system:serviceaccounts", "system:authenticated"}}
	c, err := client.New(cfg, client.Options{Scheme: testScheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestRBACIsSufficient applies a pool's objects as the operator's
// ServiceAccount with only the generated RBAC of config/rbac: every owned
// object is created (the RoleBinding through the `bind` rule on the
// fairshare-scheduler ClusterRole), while binding any other ClusterRole is
// forbidden. The pool exists only in memory, so the suite's own manager (an
// admin) never creates these objects first. The remaining requests of both
// reconcilers are checked with SubjectAccessReviews.
func TestRBACIsSufficient(t *testing.T) {
	requireEnv(t)
	installRBAC(t)
	ctx := context.Background()
	ns := newNamespace(t)
	pool := makePool(ns, "rbac")
	pool.UID = types.UID("3f1c2a9e-0000-4000-8000-000000000001")

	r := NewProviderPoolReconciler(asManager(t), testScheme, record.NewFakeRecorder(16), WithClock(testClock), WithRenderOptions(testRenderOptions))
	if res := r.reconcileObjects(ctx, pool); res.renderErr != nil || res.applyErr != nil {
		t.Fatalf("applying as %s: %v %v", managerUser, res.renderErr, res.applyErr)
	}
	for kind, obj := range ownedObjects() {
		if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "rbac-scheduler"}, obj); err != nil {
			t.Errorf("%s not applied: %v", kind, err)
		}
	}

	// A switch to Memory deletes the claim, with the role's verbs too.
	pool.Spec.Scheduler.JobStore.Type = v1alpha1.JobStoreMemory
	if res := r.reconcileObjects(ctx, pool); res.renderErr != nil || res.applyErr != nil {
		t.Fatalf("switching to Memory as %s: %v %v", managerUser, res.renderErr, res.applyErr)
	}
	claim := &corev1.PersistentVolumeClaim{}
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "rbac-scheduler"}, claim); err == nil && claim.DeletionTimestamp.IsZero() {
		t.Errorf("the job store claim of a pool switched to Memory is not deleted")
	} else if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}

	escalate := makePool(ns, "escalate")
	escalate.UID = types.UID("3f1c2a9e-0000-4000-8000-000000000002")
	r = NewProviderPoolReconciler(asManager(t), testScheme, record.NewFakeRecorder(16),
		WithRenderOptions(render.Options{DefaultImage: "img", SchedulerClusterRole: "cluster-admin"}))
	if res := r.reconcileObjects(ctx, escalate); !apierrors.IsForbidden(res.applyErr) {
		t.Errorf("binding cluster-admin: got %v, want Forbidden", res.applyErr)
	}

	for _, attr := range []authorizationv1.ResourceAttributes{
		{Group: v1alpha1.GroupVersion.Group, Resource: "providerpools", Subresource: "status", Verb: "patch", Namespace: ns},
		{Group: v1alpha1.GroupVersion.Group, Resource: "providerpools", Subresource: "finalizers", Verb: "update", Namespace: ns},
		{Group: v1alpha1.GroupVersion.Group, Resource: "tenantquotas", Verb: "list"},
		{Group: v1alpha1.GroupVersion.Group, Resource: "tenantquotas", Verb: "watch"},
		{Group: v1alpha1.GroupVersion.Group, Resource: "tenantquotas", Subresource: "status", Verb: "patch", Namespace: ns},
		{Group: v1alpha1.GroupVersion.Group, Resource: "providerpools", Verb: "watch"},
		{Group: "", Resource: "events", Verb: "create", Namespace: ns},
		// The provider Secret: one GET to check its key, and the watch of
		// Secrets' metadata in every namespace that triggers its pools.
		{Resource: "secrets", Verb: "get", Namespace: ns, Name: "provider-key"},
		{Resource: "secrets", Verb: "list"},
		{Resource: "secrets", Verb: "watch"},
	} {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: managerUser, ResourceAttributes: &attr}}
		if err := k8sClient.Create(ctx, sar); err != nil {
			t.Fatal(err)
		}
		if !sar.Status.Allowed {
			t.Errorf("%s may not %s %s/%s", managerUser, attr.Verb, attr.Resource, attr.Subresource)
		}
	}
}

// TestRBACGrantsNoUnusedVerb: the operator's ClusterRole grants no verb the
// operator never uses. It applies its objects with server-side apply
// (create, patch) and deletes the job store claim of a pool switched to
// Memory: it never updates a claim, and the claim holds the pool's jobs.
// It only reads Secrets (get, and list and watch for their metadata).
func TestRBACGrantsNoUnusedVerb(t *testing.T) {
	requireEnv(t)
	installRBAC(t)
	ctx := context.Background()
	ns := newNamespace(t)
	for _, attr := range []authorizationv1.ResourceAttributes{
		{Resource: "persistentvolumeclaims", Verb: "update", Namespace: ns},
		{Resource: "secrets", Verb: "update", Namespace: ns},
		{Resource: "secrets", Verb: "patch", Namespace: ns},
		{Resource: "secrets", Verb: "delete", Namespace: ns},
		{Resource: "secrets", Verb: "create", Namespace: ns},
		{Group: "apps", Resource: "deployments", Verb: "delete", Namespace: ns},
	} {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: managerUser, ResourceAttributes: &attr}}
		if err := k8sClient.Create(ctx, sar); err != nil {
			t.Fatal(err)
		}
		if sar.Status.Allowed {
			t.Errorf("%s may %s %s, which the operator never does", managerUser, attr.Verb, attr.Resource)
		}
	}
}
