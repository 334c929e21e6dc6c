package scheduler

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	rbacmanifests "github.com/fairshare-dev/fairshare/config/rbac"
	"github.com/fairshare-dev/fairshare/internal/rbaccheck"
	"github.com/fairshare-dev/fairshare/internal/schedconfig"
)

// TestRBACCheck runs the scheduler's start-up RBAC check on a real API
// server (authorization mode RBAC) as users bound in the pool's namespace,
// as the operator's RoleBinding binds the scheduler, to the shipped
// ClusterRole fairshare-scheduler, whole or without its rule on
// ProviderPools and TenantQuotas: the whole role passes; without the rule
// Run returns at once, before its manager starts, with an error naming
// exactly the missing verbs in that namespace.
func TestRBACCheck(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set: no API server for envtest")
	}
	env := &envtest.Environment{CRDDirectoryPaths: []string{filepath.Join("..", "..", "config", "crd", "bases")}, ErrorIfCRDPathMissing: true}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	admin := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	const ns = "pool-ns"
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// user binds a ClusterRole named user, the shipped one without the
	// rules on resource, to user in ns, and returns its kubeconfig file.
	user := func(t *testing.T, name, dropResource string) string {
		t.Helper()
		var role rbacv1.ClusterRole
		if err := yaml.Unmarshal(rbacmanifests.SchedulerRole, &role); err != nil {
			t.Fatal(err)
		}
		role.Name = name
		var rules []rbacv1.PolicyRule
		for _, r := range role.Rules {
			if r.Resources[0] != dropResource {
				rules = append(rules, r)
			}
		}
		if len(rules) == len(role.Rules) && dropResource != "" {
			t.Fatalf("config/rbac/scheduler/role.yaml has no rule on %s", dropResource)
		}
		role.Rules = rules
		if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		binding := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: name}},
		}
		if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		u, err := env.AddUser(envtest.User{Name: name}, nil)
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
		return path
	}
	settings := schedconfig.Settings{APIVersion: schedconfig.APIVersion, PoolName: "pool", Namespace: ns,
		HTTPAddr: "127.0.0.1:0", MetricsAddr: "0", HealthAddr: "0", StatusIntervalSeconds: 1, UpstreamConcurrency: 8}
	cfgPath := filepath.Join(t.TempDir(), "scheduler.json")
	if err := os.WriteFile(cfgPath, settings.Marshal(), 0o600); err != nil {
		t.Fatal(err)
	}

	t.Run("whole ClusterRole passes", func(t *testing.T) {
		kc := user(t, "sched-whole", "")
		sets, err := Permissions(ns)
		if err != nil {
			t.Fatal(err)
		}
		ucfg, err := restConfig(kc)
		if err != nil {
			t.Fatal(err)
		}
		if err := rbaccheck.Run(ctx, ucfg, sets, RBACRemedy); err != nil {
			t.Fatalf("RBAC check with the whole ClusterRole: %v", err)
		}
	})

	t.Run("without the pool rule Run fails at once", func(t *testing.T) {
		kc := user(t, "sched-no-pools", "providerpools")
		err := Run(ctx, []string{"--config", cfgPath, "--kubeconfig", kc})
		const want = "missing RBAC permissions: " +
			"get quota.fairshare.dev/providerpools in namespace pool-ns, list quota.fairshare.dev/providerpools in namespace pool-ns, " +
			"watch quota.fairshare.dev/providerpools in namespace pool-ns, get quota.fairshare.dev/tenantquotas in namespace pool-ns, " +
			"list quota.fairshare.dev/tenantquotas in namespace pool-ns, watch quota.fairshare.dev/tenantquotas in namespace pool-ns " +
			"(granted by the scheduler's ClusterRole (config/rbac/scheduler/role.yaml, the chart's fairshare-scheduler), " +
			"bound in the pool's namespace by the RoleBinding the operator renders). " +
			"Apply the ClusterRole fairshare-scheduler of this scheduler's version (helm upgrade with the chart of the same version, " +
			"or kubectl apply -f config/rbac/scheduler/role.yaml of the same release; with the operator's --scheduler-cluster-role, that ClusterRole), " +
			"then restart the scheduler; the operator's --skip-rbac-check renders --skip-rbac-check, which skips this check, " +
			"for clusters whose authorizer does not answer SelfSubjectAccessReview as it authorizes requests"
		if err == nil || err.Error() != want {
			t.Fatalf("Run error:\n got %v\nwant %s", err, want)
		}
	})
}
