package rbaccheck

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	rbacmanifests "github.com/fairshare-dev/fairshare/config/rbac"
)

func TestFromRole(t *testing.T) {
	const manifest = `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: example
rules:
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [quota.fairshare.dev]
  resources: [providerpools/status]
  verbs: [patch]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [clusterroles]
  resourceNames: [a, b]
  verbs: [bind]
`
	got, err := FromRole([]byte(manifest), "ns")
	if err != nil {
		t.Fatal(err)
	}
	want := []Permission{
		{Verb: "create", Group: "", Resource: "events", Namespace: "ns"},
		{Verb: "patch", Group: "", Resource: "events", Namespace: "ns"},
		{Verb: "create", Group: "events.k8s.io", Resource: "events", Namespace: "ns"},
		{Verb: "patch", Group: "events.k8s.io", Resource: "events", Namespace: "ns"},
		{Verb: "patch", Group: "quota.fairshare.dev", Resource: "providerpools", Subresource: "status", Namespace: "ns"},
		{Verb: "bind", Group: "rbac.authorization.k8s.io", Resource: "clusterroles", Name: "a", Namespace: "ns"},
		{Verb: "bind", Group: "rbac.authorization.k8s.io", Resource: "clusterroles", Name: "b", Namespace: "ns"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("FromRole (-want +got):\n%s", diff)
	}
}

func TestFromRoleErrors(t *testing.T) {
	tests := map[string]struct{ manifest, want string }{
		"not YAML": {"rules: [", "parsing the RBAC manifest: error converting YAML to JSON: yaml: line 1: did not find expected node content"},
		"no rules": {"kind: ClusterRole\n", `the RBAC manifest (kind "ClusterRole") has no rules`},
		"non-resource URLs": {"rules:\n- nonResourceURLs: [/metrics]\n  verbs: [get]\n",
			"rule 0 of the RBAC manifest has nonResourceURLs, which this check cannot review"},
		"no verbs": {"rules:\n- apiGroups: ['']\n  resources: [pods]\n", "rule 0 of the RBAC manifest lacks apiGroups, resources or verbs"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := FromRole([]byte(tc.manifest), "")
			if err == nil || err.Error() != tc.want {
				t.Errorf("FromRole error = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestShippedRolesParse: the embedded manifests of config/rbac give the
// permissions the binaries check (the first of each, and how many).
func TestShippedRolesParse(t *testing.T) {
	for name, tc := range map[string]struct {
		manifest []byte
		first    string
		n        int
	}{
		"role.yaml":                 {rbacmanifests.ManagerRole, "create configmaps", 57},
		"leader_election_role.yaml": {rbacmanifests.LeaderElectionRole, "get coordination.k8s.io/leases", 5},
		"scheduler/role.yaml":       {rbacmanifests.SchedulerRole, "create events", 11},
	} {
		perms, err := FromRole(tc.manifest, "")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(perms) != tc.n || perms[0].String() != tc.first {
			t.Errorf("%s: %d permissions, the first %q; want %d, %q", name, len(perms), perms[0], tc.n, tc.first)
		}
	}
}

func TestPermissionString(t *testing.T) {
	for _, tc := range []struct {
		p    Permission
		want string
	}{
		{Permission{Verb: "list", Resource: "secrets"}, "list secrets"},
		{Permission{Verb: "watch", Group: "apps", Resource: "deployments"}, "watch apps/deployments"},
		{Permission{Verb: "patch", Group: "quota.fairshare.dev", Resource: "tenantquotas", Subresource: "status"}, "patch quota.fairshare.dev/tenantquotas/status"},
		{Permission{Verb: "bind", Group: "rbac.authorization.k8s.io", Resource: "clusterroles", Name: "fairshare-scheduler"},
			"bind rbac.authorization.k8s.io/clusterroles named fairshare-scheduler"},
		{Permission{Verb: "create", Group: "coordination.k8s.io", Resource: "leases", Namespace: "ops"}, "create coordination.k8s.io/leases in namespace ops"},
	} {
		if got := tc.p.String(); got != tc.want {
			t.Errorf("%#v: %q, want %q", tc.p, got, tc.want)
		}
	}
}

// reviewer answers SelfSubjectAccessReviews: allowed unless the permission
// (as Permission.String names it) is in denied; it records what it was asked.
func reviewer(denied ...string) (*fake.Clientset, *[]string) {
	cs := fake.NewClientset()
	var asked []string
	cs.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		r := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SelfSubjectAccessReview)
		ra := r.Spec.ResourceAttributes
		p := Permission{Verb: ra.Verb, Group: ra.Group, Resource: ra.Resource, Subresource: ra.Subresource, Name: ra.Name, Namespace: ra.Namespace}
		asked = append(asked, p.String())
		r.Status.Allowed = true
		for _, d := range denied {
			if d == p.String() {
				r.Status.Allowed = false
			}
		}
		return true, r, nil
	})
	return cs, &asked
}

var testSets = []Set{
	{Source: "role A", Permissions: []Permission{{Verb: "get", Resource: "secrets"}, {Verb: "list", Resource: "secrets"}, {Verb: "watch", Group: "apps", Resource: "deployments"}}},
	{Source: "role B", Permissions: []Permission{{Verb: "create", Group: "coordination.k8s.io", Resource: "leases", Namespace: "ops"}}},
}

func TestCheck(t *testing.T) {
	cs, asked := reviewer("list secrets", "watch apps/deployments", "create coordination.k8s.io/leases in namespace ops")
	err := Check(context.Background(), cs.AuthorizationV1().SelfSubjectAccessReviews(), testSets, "Apply the RBAC.")
	const want = "missing RBAC permissions: list secrets, watch apps/deployments (granted by role A); " +
		"create coordination.k8s.io/leases in namespace ops (granted by role B). Apply the RBAC."
	if err == nil || err.Error() != want {
		t.Fatalf("Check error:\n got %v\nwant %s", err, want)
	}
	var m *MissingError
	if !errors.As(err, &m) || len(m.Missing) != 3 || m.Missing[2].Source != "role B" {
		t.Errorf("Check error %#v, want a *MissingError of 3, the last of role B", err)
	}
	wantAsked := []string{"get secrets", "list secrets", "watch apps/deployments", "create coordination.k8s.io/leases in namespace ops"}
	if diff := cmp.Diff(wantAsked, *asked); diff != "" {
		t.Errorf("reviews (-want +got):\n%s", diff)
	}
}

func TestCheckAllowed(t *testing.T) {
	cs, asked := reviewer()
	if err := Check(context.Background(), cs.AuthorizationV1().SelfSubjectAccessReviews(), testSets, "Apply the RBAC."); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if len(*asked) != 4 {
		t.Errorf("%d reviews, want 4 (one per permission)", len(*asked))
	}
}

func TestCheckReviewError(t *testing.T) {
	cs := fake.NewClientset()
	cs.PrependReactor("create", "selfsubjectaccessreviews", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	err := Check(context.Background(), cs.AuthorizationV1().SelfSubjectAccessReviews(), testSets, "Apply the RBAC.")
	const want = `reviewing the RBAC permission "get secrets": connection refused`
	if err == nil || err.Error() != want {
		t.Fatalf("Check error = %v, want %q", err, want)
	}
	var m *MissingError
	if errors.As(err, &m) {
		t.Errorf("a review that could not be made is reported as a missing permission")
	}
}
