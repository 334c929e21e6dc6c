package helm

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	quotav1alpha1 "github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/test/framework"
)

const (
	release   = "fairshare"
	releaseNS = "fairshare-system"
	// poolNS holds the sample pool; the chart's scheduler NetworkPolicy goes there too.
	poolNS = "team-a"
	// schedulerImage is set through the chart and must reach the rendered scheduler Deployment.
	schedulerImage = "registry.example.com/fairshare:helm-test"
)

// TestHelmInstall installs the chart with `helm install` onto a real kube-apiserver and
// etcd (no CRDs preinstalled: the chart brings them), checks the CRDs and RBAC, then runs
// the operator binary as a local process with the arguments of the chart's Deployment
// (only the listen addresses are made local) and the identity of the chart's
// ServiceAccount (impersonated, so the chart's RBAC is what it gets), applies the sample
// ProviderPool and waits for the pool's Accepted condition and its scheduler Deployment.
// Finally `helm uninstall` must leave the CRDs and the pool in place (crds.keep), and a
// new install of the same release must adopt the kept CRDs.
func TestHelmInstall(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set: run `make test-helm` (it builds bin/kube-apiserver and bin/etcd)")
	}
	helmBin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	work := t.TempDir()

	// Build the operator while the control plane starts. The build has a
	// bound of its own: on a fresh machine (an empty build cache) it can
	// take longer than every cluster step together.
	buildCtx, cancelBuild := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancelBuild()
	built := make(chan error, 1)
	manager := filepath.Join(work, "manager")
	go func() {
		cmd := exec.CommandContext(buildCtx, "go", "build", "-o", manager, "./cmd/manager")
		cmd.Dir = framework.RepoRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := cmd.CombinedOutput()
		if err != nil {
			err = fmt.Errorf("go build ./cmd/manager: %w\n%s", err, out)
		}
		built <- err
	}()

	ctrllog.SetLogger(logr.Discard())
	env := &envtest.Environment{BinaryAssetsDirectory: os.Getenv("KUBEBUILDER_ASSETS")}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting the control plane: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
	})
	user, err := env.AddUser(envtest.User{Name: "fairshare-admin", Groups: []string{"system:masters"}}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(work, "kubeconfig")
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme, quotav1alpha1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{}
	ns.Name = poolNS
	if err := c.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}

	helmEnv := []string{"KUBECONFIG=" + kubeconfig, "HELM_CACHE_HOME=" + filepath.Join(work, "helm-cache"),
		"HELM_CONFIG_HOME=" + filepath.Join(work, "helm-config"), "HELM_DATA_HOME=" + filepath.Join(work, "helm-data")}
	runHelm := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, helmBin(t), args...)
		cmd.Dir = framework.RepoRoot()
		cmd.Env = append(os.Environ(), helmEnv...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	// The Prometheus Operator CRDs are absent here: ServiceMonitor and PrometheusRule stay off.
	runHelm("install", release, "charts/fairshare", "--namespace", releaseNS, "--create-namespace",
		"--set", "operator.schedulerImage="+schedulerImage,
		"--set", "metrics.service.enabled=true",
		"--set", "monitoring.dashboard.enabled=true",
		"--set", "networkPolicy.operator.enabled=true",
		"--set", "networkPolicy.scheduler.enabled=true",
		"--set", "networkPolicy.scheduler.namespaces={"+poolNS+"}")

	// CRDs, with the keep policy; RBAC; the optional objects that need no extra CRDs.
	for _, name := range []string{"providerpools.quota.fairshare.dev", "tenantquotas.quota.fairshare.dev"} {
		var crd apiextensionsv1.CustomResourceDefinition
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &crd); err != nil {
			t.Fatalf("CRD %s: %v", name, err)
		}
		if got := crd.Annotations["helm.sh/resource-policy"]; got != "keep" {
			t.Errorf("CRD %s: helm.sh/resource-policy = %q, want keep", name, got)
		}
	}
	for _, name := range []string{"fairshare-manager", "fairshare-scheduler"} {
		var cr rbacv1.ClusterRole
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &cr); err != nil {
			t.Fatalf("ClusterRole %s: %v", name, err)
		}
	}
	for _, o := range []client.Object{
		&rbacv1.ClusterRoleBinding{ObjectMeta: objMeta("", "fairshare-manager")},
		&rbacv1.Role{ObjectMeta: objMeta(releaseNS, "fairshare-leader-election")},
		&rbacv1.RoleBinding{ObjectMeta: objMeta(releaseNS, "fairshare-leader-election")},
		&corev1.ServiceAccount{ObjectMeta: objMeta(releaseNS, "fairshare")},
		&corev1.Service{ObjectMeta: objMeta(releaseNS, "fairshare-metrics")},
		&corev1.ConfigMap{ObjectMeta: objMeta(releaseNS, "fairshare-dashboard")},
		&networkingv1.NetworkPolicy{ObjectMeta: objMeta(releaseNS, "fairshare-operator")},
		&networkingv1.NetworkPolicy{ObjectMeta: objMeta(poolNS, "fairshare-scheduler")},
	} {
		if err := c.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
			t.Fatalf("%T %s: %v", o, client.ObjectKeyFromObject(o), err)
		}
	}

	// The operator's arguments, from the Deployment helm installed.
	args := operatorArgs(t, runHelm("get", "manifest", release, "--namespace", releaseNS))
	metricsPort, err := framework.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	healthPort, err := framework.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	var local []string
	for _, a := range args {
		switch {
		case strings.HasPrefix(a, "--metrics-bind-address="):
			a = fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", metricsPort)
		case strings.HasPrefix(a, "--health-probe-bind-address="):
			a = fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", healthPort)
		}
		local = append(local, a)
	}
	// Outside a pod the Lease namespace and the identity come from flags and the kubeconfig.
	saKubeconfig := impersonatingKubeconfig(t, kubeconfig, "system:serviceaccount:"+releaseNS+":fairshare", work)
	local = append(local, "--kubeconfig="+saKubeconfig, "--leader-election-namespace="+releaseNS)
	if !slices.Contains(local, "--leader-elect=true") || !slices.Contains(local, "--scheduler-image="+schedulerImage) {
		t.Fatalf("the chart's operator arguments lack leader election or the scheduler image: %q", args)
	}

	if err := <-built; err != nil {
		t.Fatal(err)
	}
	// The operator's steps get their own 2 minutes, whatever the build took.
	ctx, cancelOp := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancelOp()
	op, err := framework.Start("manager", work, manager, local)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(op.Stop)
	if err := framework.WaitHTTP(ctx, op, fmt.Sprintf("http://127.0.0.1:%d/readyz", healthPort)); err != nil {
		t.Fatal(err)
	}

	if out, err := framework.Kubectl(ctx, kubeconfig, "apply", "-n", poolNS, "-f",
		filepath.Join(framework.RepoRoot(), "config", "samples", "quota_v1alpha1_providerpool.yaml")); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var pool quotav1alpha1.ProviderPool
	var dep appsv1.Deployment
	poll(ctx, t, op, "the pool's Accepted condition and Deployment demo-scheduler", func() bool {
		if err := c.Get(ctx, client.ObjectKey{Namespace: poolNS, Name: "demo"}, &pool); err != nil {
			return false
		}
		if !meta.IsStatusConditionTrue(pool.Status.Conditions, quotav1alpha1.ConditionAccepted) {
			return false
		}
		return c.Get(ctx, client.ObjectKey{Namespace: poolNS, Name: "demo-scheduler"}, &dep) == nil
	})
	if got := dep.Spec.Template.Spec.Containers[0].Image; got != schedulerImage {
		t.Errorf("scheduler image = %q, want %q (operator.schedulerImage)", got, schedulerImage)
	}
	// The scheduler's RoleBinding to the chart's ClusterRole: the operator may only create
	// it if the chart's RBAC grants it what fairshare-scheduler grants.
	var rb rbacv1.RoleBinding
	if err := c.Get(ctx, client.ObjectKey{Namespace: poolNS, Name: "demo-scheduler"}, &rb); err != nil {
		t.Fatalf("scheduler RoleBinding: %v", err)
	}
	if rb.RoleRef.Kind != "ClusterRole" || rb.RoleRef.Name != "fairshare-scheduler" {
		t.Errorf("scheduler RoleBinding roleRef = %+v, want ClusterRole fairshare-scheduler", rb.RoleRef)
	}
	// The operator took the Lease in the release namespace (leader election through the chart's Role).
	if out, err := framework.Kubectl(ctx, kubeconfig, "get", "lease", "-n", releaseNS,
		"fairshare-manager.quota.fairshare.dev", "-o", "jsonpath={.spec.holderIdentity}"); err != nil || out == "" {
		t.Errorf("operator Lease: holder %q, %v", out, err)
	}

	// The operator's metrics (controller-runtime) carry the series the chart's alerts use.
	body := scrape(ctx, t, fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort))
	for _, name := range operatorMetrics {
		if !strings.Contains(body, "\n"+name+"{") {
			t.Errorf("operator /metrics has no series %s", name)
		}
	}
	for _, ctl := range []string{"providerpool", "tenantquota"} {
		if !strings.Contains(body, `controller_runtime_reconcile_errors_total{controller="`+ctl+`"}`) {
			t.Errorf("operator /metrics has no reconcile errors series for controller %q (FairshareOperatorReconcileErrors)", ctl)
		}
	}

	op.Stop()
	runHelm("uninstall", release, "--namespace", releaseNS)
	var crd apiextensionsv1.CustomResourceDefinition
	if err := c.Get(ctx, client.ObjectKey{Name: "providerpools.quota.fairshare.dev"}, &crd); err != nil {
		t.Errorf("after helm uninstall the ProviderPool CRD is gone (crds.keep): %v", err)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: poolNS, Name: "demo"}, &pool); err != nil {
		t.Errorf("after helm uninstall the pool is gone: %v", err)
	}
	// The same release takes the kept CRDs over again (docs/operations.md, "Install with Helm").
	runHelm("install", release, "charts/fairshare", "--namespace", releaseNS)
}

// objMeta names an object for a Get.
func objMeta(namespace, name string) (m metav1.ObjectMeta) {
	m.Namespace, m.Name = namespace, name
	return m
}

// operatorArgs returns the command line (command without the program, then args) of the
// manager container of the Deployment in a helm manifest.
func operatorArgs(t *testing.T, manifest string) []string {
	t.Helper()
	for _, o := range splitDocs(t, manifest) {
		if o["kind"] != "Deployment" {
			continue
		}
		b, err := yaml.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		var d appsv1.Deployment
		if err := yaml.Unmarshal(b, &d); err != nil {
			t.Fatal(err)
		}
		for _, ctr := range d.Spec.Template.Spec.Containers {
			if ctr.Name == "manager" {
				if len(ctr.Command) != 1 || ctr.Command[0] != "/manager" {
					t.Fatalf("manager command = %q, want [/manager]", ctr.Command)
				}
				return ctr.Args
			}
		}
	}
	t.Fatalf("no Deployment with a manager container in the release manifest:\n%s", manifest)
	return nil
}

// impersonatingKubeconfig writes a copy of the admin kubeconfig that acts as user,
// so a process using it has exactly that user's RBAC permissions.
func impersonatingKubeconfig(t *testing.T, adminPath, user, dir string) string {
	t.Helper()
	kc, err := clientcmd.LoadFromFile(adminPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range kc.AuthInfos {
		ai.Impersonate = user
	}
	path := filepath.Join(dir, "kubeconfig-operator")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// poll checks cond every 200 ms until it holds; it fails the test when ctx ends or the
// operator exits first.
func poll(ctx context.Context, t *testing.T, op *framework.Process, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if exited, err := op.Exited(); exited {
			t.Fatalf("the operator exited (%v) while waiting for %s:\n%s", err, what, op.Tail(30))
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v\noperator log:\n%s", what, ctx.Err(), op.Tail(30))
		case <-tick.C:
		}
	}
}

// scrape returns the body of a GET of url.
func scrape(ctx context.Context, t *testing.T, url string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d, %v", url, resp.StatusCode, err)
	}
	return string(b)
}
