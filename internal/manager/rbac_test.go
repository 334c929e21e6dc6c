package manager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	rbacmanifests "github.com/fairshare-dev/fairshare/config/rbac"
	"github.com/fairshare-dev/fairshare/internal/rbaccheck"
	"github.com/fairshare-dev/fairshare/internal/render"
)

// rbacEnv is a kube-apiserver (envtest runs it with authorization mode
// RBAC) and etcd with the CRDs of config/crd/bases, an admin clientset, and
// a way to add users bound to ClusterRoles.
type rbacEnv struct {
	env   *envtest.Environment
	admin kubernetes.Interface
}

func startRBACEnv(t *testing.T) *rbacEnv {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Skip("KUBEBUILDER_ASSETS is unset: this test needs kube-apiserver and etcd " +
			"(build them with hack/bin-tools.sh and set KUBEBUILDER_ASSETS=$PWD/bin)")
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting the control plane: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
	})
	return &rbacEnv{env: env, admin: kubernetes.NewForConfigOrDie(cfg)}
}

// managerRole is the shipped ClusterRole fairshare-manager, renamed name,
// without its rules at the indexes in drop.
func managerRole(t *testing.T, name string, drop ...int) *rbacv1.ClusterRole {
	t.Helper()
	var role rbacv1.ClusterRole
	if err := yaml.Unmarshal(rbacmanifests.ManagerRole, &role); err != nil {
		t.Fatal(err)
	}
	role.Name = name
	var rules []rbacv1.PolicyRule
	for i, r := range role.Rules {
		if !contains(drop, i) {
			rules = append(rules, r)
		}
	}
	role.Rules = rules
	return &role
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// userWith creates role and a user bound to it cluster-wide, and returns
// the user's REST config and kubeconfig file.
func (e *rbacEnv) userWith(t *testing.T, user string, role *rbacv1.ClusterRole) (*rest.Config, string) {
	t.Helper()
	ctx := context.Background()
	if _, err := e.admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	if _, err := e.admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	u, err := e.env.AddUser(envtest.User{Name: user}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := u.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	return u.Config(), path
}

// TestRBACCheck runs the operator's start-up RBAC check on a real API
// server as users bound to the shipped ClusterRole fairshare-manager, whole
// or with rules taken out: the whole role passes; a role without the
// Secrets rule makes manager.Run return at once, before the manager starts,
// with an error naming exactly the missing verbs; and each rule taken out
// alone is reported as exactly that rule's permissions.
func TestRBACCheck(t *testing.T) {
	e := startRBACEnv(t)
	ctx := context.Background()
	defaults, err := ParseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("whole ClusterRole passes", func(t *testing.T) {
		cfg, _ := e.userWith(t, "rbac-whole", managerRole(t, "rbac-whole"))
		sets, err := RequiredPermissions(defaults, "")
		if err != nil {
			t.Fatal(err)
		}
		if err := rbaccheck.Run(ctx, cfg, sets, RBACRemedy); err != nil {
			t.Fatalf("RBAC check with the whole ClusterRole: %v", err)
		}
	})

	t.Run("without the Secrets rule Run fails at once", func(t *testing.T) {
		secrets := ruleIndex(t, "", "secrets")
		_, kubeconfig := e.userWith(t, "rbac-no-secrets", managerRole(t, "rbac-no-secrets", secrets))
		t.Setenv("KUBECONFIG", kubeconfig)
		err := Run(ctx, []string{"--metrics-bind-address=0", "--health-probe-bind-address=0"})
		const want = "missing RBAC permissions: get secrets, list secrets, watch secrets " +
			"(granted by the operator's ClusterRole (config/rbac/role.yaml, the chart's <release>-manager)). " +
			"Apply the RBAC of this operator's version (helm upgrade with the chart of the same version, " +
			"or kubectl apply -k config/rbac of the same release), then restart the operator; " +
			"--skip-rbac-check skips this check, for clusters whose authorizer does not answer SelfSubjectAccessReview as it authorizes requests"
		if err == nil || err.Error() != want {
			t.Fatalf("Run error:\n got %v\nwant %s", err, want)
		}
		var missing *rbaccheck.MissingError
		if !errors.As(err, &missing) {
			t.Errorf("Run error is a %T, want a *rbaccheck.MissingError", err)
		}
	})

	t.Run("leader election Lease in its namespace", func(t *testing.T) {
		cfg, _ := e.userWith(t, "rbac-leader", managerRole(t, "rbac-leader"))
		le := defaults
		le.LeaderElect, le.LeaderElectionNamespace = true, "ops"
		sets, err := RequiredPermissions(le, leaderElectionNamespace(le))
		if err != nil {
			t.Fatal(err)
		}
		// The ClusterRole grants get and update on Leases and the Events
		// verbs cluster-wide; only create is the leader election Role's own.
		const want = "missing RBAC permissions: create coordination.k8s.io/leases in namespace ops " +
			"(granted by the operator's leader election Role (config/rbac/leader_election_role.yaml, the chart's <release>-leader-election)). " + RBACRemedy
		if err := rbaccheck.Run(ctx, cfg, sets, RBACRemedy); err == nil || err.Error() != want {
			t.Fatalf("RBAC check error:\n got %v\nwant %s", err, want)
		}
	})

	t.Run("custom scheduler ClusterRole", func(t *testing.T) {
		// The whole ClusterRole binds fairshare-scheduler only: an operator
		// run with --scheduler-cluster-role=custom needs bind on custom.
		cfg, _ := e.userWith(t, "rbac-custom", managerRole(t, "rbac-custom"))
		custom := defaults
		custom.Render = render.Options{DefaultImage: defaults.Render.DefaultImage, SchedulerClusterRole: "custom"}
		sets, err := RequiredPermissions(custom, "")
		if err != nil {
			t.Fatal(err)
		}
		const want = "missing RBAC permissions: bind rbac.authorization.k8s.io/clusterroles named custom " +
			"(granted by the operator's ClusterRole (config/rbac/role.yaml, the chart's <release>-manager)). " + RBACRemedy
		if err := rbaccheck.Run(ctx, cfg, sets, RBACRemedy); err == nil || err.Error() != want {
			t.Fatalf("RBAC check error:\n got %v\nwant %s", err, want)
		}
	})

	t.Run("each rule taken out is named", func(t *testing.T) {
		whole := managerRole(t, "unused")
		for i, rule := range whole.Rules {
			name := fmt.Sprintf("rbac-without-%d", i)
			cfg, _ := e.userWith(t, name, managerRole(t, name, i))
			sets, err := RequiredPermissions(defaults, "")
			if err != nil {
				t.Fatal(err)
			}
			err = rbaccheck.Run(ctx, cfg, sets, RBACRemedy)
			var missing *rbaccheck.MissingError
			if !errors.As(err, &missing) {
				t.Fatalf("without rule %d %v: error %v, want a *rbaccheck.MissingError", i, rule, err)
			}
			var got []string
			for _, m := range missing.Missing {
				got = append(got, m.Permission.String())
			}
			want := rulePermissions(t, rule)
			if strings.Join(got, ", ") != strings.Join(want, ", ") {
				t.Errorf("without rule %d: missing\n %s\nwant\n %s", i, strings.Join(got, ", "), strings.Join(want, ", "))
			}
		}
	})
}

// ruleIndex is the index of the shipped ClusterRole's rule on resource of
// group.
func ruleIndex(t *testing.T, group, resource string) int {
	t.Helper()
	for i, r := range managerRole(t, "unused").Rules {
		if len(r.APIGroups) == 1 && r.APIGroups[0] == group && len(r.Resources) == 1 && r.Resources[0] == resource {
			return i
		}
	}
	t.Fatalf("no rule of config/rbac/role.yaml on %s/%s alone", group, resource)
	return -1
}

// rulePermissions are the permissions of one rule, as the check names them
// (no two rules of the shipped ClusterRole grant the same permission).
func rulePermissions(t *testing.T, rule rbacv1.PolicyRule) []string {
	t.Helper()
	b, err := yaml.Marshal(rbacv1.ClusterRole{Rules: []rbacv1.PolicyRule{rule}})
	if err != nil {
		t.Fatal(err)
	}
	perms, err := rbaccheck.FromRole(b, "")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range perms {
		out = append(out, p.String())
	}
	return out
}
