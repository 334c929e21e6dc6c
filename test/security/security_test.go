// Package security checks Fairshare's security properties against a real
// kube-apiserver (envtest binaries in bin/) with the operator, a pool's
// scheduler and the provider simulator running as local processes:
//
//   - the scheduler's ServiceAccount, bound the way the operator binds it, may
//     do exactly its documented verbs (SubjectAccessReview), and may GET only
//     the key Secrets of the pool's tenants (the Role the operator renders);
//   - the scheduler runs with exactly those permissions (its kubeconfig
//     impersonates the ServiceAccount) and still loads tenants added later;
//   - in APIKey mode a tenant cannot spend another tenant's quota by adding
//     the identification header, nor read, list or cancel its jobs;
//   - the provider key and the tenant keys appear in no response (body or
//     header), log line, status, event or metric.
//
// The rendered-Deployment checks (non-root, read-only root filesystem, no
// privilege escalation, capabilities dropped, RuntimeDefault seccomp) cover
// the scheduler Deployment the operator applied and the chart's operator
// Deployment (bin/helm template).
package security

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/schedconfig"
	"github.com/fairshare-dev/fairshare/test/framework"
)

const (
	ns        = "sec"
	otherNS   = "sec-other"
	pool      = "demo"
	scheduler = "demo-scheduler"
	// Distinctive keys: any occurrence in captured output is a leak.
	providerKey = "sk-PROVIDERKEY-7d1e9c3a5b"
	keyA        = "sk-TENANTA-4f2b8e6d10"
	keyB        = "sk-TENANTB-9a3c7e1f52"
	keyC        = "sk-TENANTC-0b6d2f8a43"
)

var saUser = "system:serviceaccount:" + ns + ":" + scheduler

// The operator's namespace and ServiceAccount user name.
const (
	operatorNS   = "fairshare-system"
	operatorUser = "system:serviceaccount:" + operatorNS + ":fairshare-operator"
)

// impersonating writes a copy of the admin kubeconfig that acts as the
// ServiceAccount user of namespace ns, and returns its path.
func impersonating(t *testing.T, cp *framework.ControlPlane, work, user, ns string) string {
	t.Helper()
	kc, err := clientcmd.LoadFromFile(cp.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range kc.AuthInfos {
		ai.Impersonate = user
		ai.ImpersonateGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
	}
	path := filepath.Join(work, strings.ReplaceAll(user, ":", "_")+".kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func manifests(simURL string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata: {name: provider-key}
stringData: {api-key: %[2]s}
---
apiVersion: v1
kind: Secret
metadata: {name: a-key}
stringData: {api-key: %[3]s}
---
apiVersion: v1
kind: Secret
metadata: {name: b-key}
stringData: {api-key: %[4]s}
---
apiVersion: v1
kind: Secret
metadata: {name: unrelated}
stringData: {password: not-for-the-scheduler}
---
apiVersion: quota.fairshare.dev/v1alpha1
kind: ProviderPool
metadata: {name: demo}
spec:
  upstream:
    baseURL: %[1]s
    credentialsSecretRef: {name: provider-key}
  models:
  - {name: sim-gpt, tokensPerMinute: 60000, requestsPerMinute: 1200}
  tenantIdentification: {mode: APIKey}
  scheduler: {statusIntervalSeconds: 1, jobStore: {type: Memory}}
---
apiVersion: quota.fairshare.dev/v1alpha1
kind: TenantQuota
metadata: {name: a}
spec:
  poolRef: {name: demo}
  credentials: {secretRef: {name: a-key}}
  tokens: {weightedPerMinute: 2000000}
---
apiVersion: quota.fairshare.dev/v1alpha1
kind: TenantQuota
metadata: {name: b}
spec:
  poolRef: {name: demo}
  credentials: {secretRef: {name: b-key}}
  tokens: {weightedPerMinute: 2000000}
  requests: {perMinute: 1, burst: 1}
`, simURL, providerKey, keyA, keyB)
}

// exchange is one captured HTTP response.
type exchange struct {
	what   string
	status int
	header http.Header
	body   []byte
}

type capture struct {
	t   *testing.T
	all []exchange
}

func (c *capture) do(ctx context.Context, what, method, u, key string, hdr map[string]string, body string) exchange {
	c.t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, u, strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("%s: %v", what, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	e := exchange{what: what, status: resp.StatusCode, header: resp.Header, body: b}
	c.all = append(c.all, e)
	return e
}

func chat(n int) string {
	return fmt.Sprintf(`{"model":"sim-gpt","max_tokens":16,"messages":[{"role":"user","content":"hello %d"}]}`, n)
}

func TestSecurity(t *testing.T) {
	framework.RequireAssets(t, "tools")
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	work := t.TempDir()
	logf := framework.StepLogf(t)

	logf("building the binaries, starting the control plane, the simulator and the operator (metrics on)")
	bin, err := framework.BuildBinaries(ctx, filepath.Join(work, "bin"))
	if err != nil {
		t.Fatal(err)
	}
	cp, err := framework.StartControlPlane(work)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Stop() })
	for _, n := range []string{ns, otherNS, operatorNS} {
		if err := cp.EnsureNamespace(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	port := func() int {
		p, err := framework.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	simPort := port()
	simURL := fmt.Sprintf("http://127.0.0.1:%d", simPort)
	sim, err := framework.Start("providersim", work, filepath.Join(bin, "providersim"), []string{fmt.Sprintf("--addr=127.0.0.1:%d", simPort)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Stop)
	if err := framework.WaitHTTP(ctx, sim, simURL+"/healthz"); err != nil {
		t.Fatal(err)
	}
	// The ClusterRoles as shipped (config/rbac, the chart's copies), and the
	// operator running as its own ServiceAccount bound to its ClusterRole:
	// the API server's RBAC escalation check then proves that the operator's
	// documented verbs suffice to grant the scheduler its Secret Role.
	logf("installing the shipped ClusterRoles; the operator runs as ServiceAccount %s", operatorUser)
	for _, f := range []string{"config/rbac/role.yaml", "config/rbac/scheduler/role.yaml"} {
		if out, err := framework.Kubectl(ctx, cp.Kubeconfig, "apply", "-f", filepath.Join(framework.RepoRoot(), f)); err != nil {
			t.Fatalf("%s: %v\n%s", f, err, out)
		}
	}
	if out, err := framework.Kubectl(ctx, cp.Kubeconfig, "create", "clusterrolebinding", "fairshare-manager",
		"--clusterrole=fairshare-manager", "--serviceaccount="+operatorNS+":fairshare-operator"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	healthPort, opMetricsPort := port(), port()
	operator, err := framework.Start("manager", work, filepath.Join(bin, "manager"), []string{
		"--leader-elect=false", fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", opMetricsPort),
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", healthPort),
	}, "KUBECONFIG="+impersonating(t, cp, work, operatorUser, operatorNS))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(operator.Stop)
	if err := framework.WaitHTTP(ctx, operator, fmt.Sprintf("http://127.0.0.1:%d/readyz", healthPort)); err != nil {
		t.Fatal(err)
	}
	stack := &framework.Stack{Bin: bin, CP: cp, SimURL: simURL, Operator: operator}
	stack.Apply(ctx, t, work, ns, manifests(simURL))

	logf("waiting for the operator's Secret Role to list exactly a-key and b-key")
	waitRoleNames(ctx, t, cp, []string{"a-key", "b-key"})
	// The pool Role is applied after the Secret Role, and the RBAC
	// authorizer sees either a moment after it is written.
	for _, ra := range []authorizationv1.ResourceAttributes{
		{Namespace: ns, Verb: "get", Resource: "secrets", Name: "b-key"},
		{Namespace: ns, Verb: "patch", Group: "quota.fairshare.dev", Resource: "tenantquotas", Subresource: "status", Name: "b"},
	} {
		waitAllowed(ctx, t, cp, ra)
	}

	t.Run("SchedulerRBAC", func(t *testing.T) { checkRBAC(ctx, t, cp) })
	t.Run("RenderedSchedulerDeployment", func(t *testing.T) {
		var d appsv1.Deployment
		if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: scheduler}, &d); err != nil {
			t.Fatal(err)
		}
		checkPodSecurity(t, "scheduler Deployment", d.Spec.Template.Spec)
		checkProviderKeyMount(t, d.Spec.Template.Spec)
	})

	logf("starting the scheduler as its ServiceAccount (impersonating kubeconfig)")
	sched := startSchedulerAsServiceAccount(ctx, t, cp, bin, work)
	sched.WaitReady(ctx, t, 60*time.Second)

	c := &capture{t: t}
	gw := sched.GatewayURL
	t.Run("APIKeyIdentity", func(t *testing.T) {
		if e := c.do(ctx, "A chat", "POST", gw+"/v1/chat/completions", keyA, nil, chat(1)); e.status != 200 {
			t.Fatalf("A chat: %d %s", e.status, e.body)
		}
		if e := c.do(ctx, "wrong key", "POST", gw+"/v1/chat/completions", "sk-wrong", nil, chat(2)); e.status != 401 {
			t.Errorf("wrong key: %d %s, want 401", e.status, e.body)
		}
		if e := c.do(ctx, "no key", "POST", gw+"/v1/chat/completions", "", map[string]string{"X-Fairshare-Tenant": "b"}, chat(3)); e.status != 401 {
			t.Errorf("header without key: %d %s, want 401", e.status, e.body)
		}
		// The key decides: A's key with B named in a header is A, on A's quota.
		e := c.do(ctx, "A job spoofing B", "POST", gw+"/v1/jobs", keyA,
			map[string]string{"X-Fairshare-Tenant": "b", "X-Tenant": "b", "OpenAI-Organization": "b"},
			`{"endpoint":"/v1/chat/completions","body":`+chat(4)+`}`)
		if e.status != 202 {
			t.Fatalf("A submit: %d %s", e.status, e.body)
		}
		var job framework.Job
		if err := json.Unmarshal(e.body, &job); err != nil {
			t.Fatal(err)
		}
		if job.Tenant != "a" {
			t.Errorf("job submitted with A's key and header b belongs to %q, want a", job.Tenant)
		}
		for _, m := range []string{"GET", "DELETE"} {
			if e := c.do(ctx, "B "+m+" A's job", m, gw+"/v1/jobs/"+job.ID, keyB, nil, ""); e.status != 404 {
				t.Errorf("B %s A's job: %d %s, want 404", m, e.status, e.body)
			}
		}
		e = c.do(ctx, "B list", "GET", gw+"/v1/jobs", keyB, nil, "")
		if e.status != 200 || bytes.Contains(e.body, []byte(job.ID)) {
			t.Errorf("B's list: %d %s; must not show A's job %s", e.status, e.body, job.ID)
		}
		if e := c.do(ctx, "A get own job", "GET", gw+"/v1/jobs/"+job.ID, keyA, nil, ""); e.status != 200 {
			t.Errorf("A get own job: %d %s", e.status, e.body)
		}
		// B's limit (1 request a minute, burst 1) answers its second call 429.
		for i, want := range []int{200, 429} {
			if e := c.do(ctx, "B chat", "POST", gw+"/v1/chat/completions", keyB, nil, chat(30+i)); e.status != want {
				t.Errorf("B chat %d: %d %s, want %d", i+1, e.status, e.body, want)
			}
		}
	})

	t.Run("UpstreamErrors", func(t *testing.T) {
		for i, fault := range []string{"status=500,count=1", "throttle,count=1", "status=401,count=1"} {
			resp, err := http.Post(simURL+"/faults?fault="+fault, "", nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode >= 300 {
				t.Logf("simulator refused fault %q: %d %s", fault, resp.StatusCode, b)
				continue
			}
			e := c.do(ctx, "fault "+fault, "POST", gw+"/v1/chat/completions", keyA, nil, chat(10+i))
			t.Logf("fault %s: gateway answered %d", fault, e.status)
			req, _ := http.NewRequest("DELETE", simURL+"/faults", nil)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}
	})

	t.Run("TenantAddedLater", func(t *testing.T) {
		// The Role follows the tenants: a new TenantQuota's Secret becomes
		// readable, and the scheduler (retrying a refused GET) loads its key.
		stack.Apply(ctx, t, work, ns, fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata: {name: c-key}
stringData: {api-key: %s}
---
apiVersion: quota.fairshare.dev/v1alpha1
kind: TenantQuota
metadata: {name: c}
spec:
  poolRef: {name: demo}
  credentials: {secretRef: {name: c-key}}
`, keyC))
		waitRoleNames(ctx, t, cp, []string{"a-key", "b-key", "c-key"})
		deadline := time.Now().Add(30 * time.Second)
		for {
			e := c.do(ctx, "C chat", "POST", gw+"/v1/chat/completions", keyC, nil, chat(20))
			if e.status == 200 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("tenant c not served 30 s after its Role entry: %d %s\n%s", e.status, e.body, sched.Tail(20))
			}
			time.Sleep(500 * time.Millisecond)
		}
		if !allowed(ctx, t, cp, authorizationv1.ResourceAttributes{Namespace: ns, Verb: "get", Resource: "secrets", Name: "c-key"}) {
			t.Error("c-key not readable by the scheduler after tenant c was added")
		}
		// Its status becomes writable too (Role <pool>-scheduler-pool).
		waitAllowed(ctx, t, cp, authorizationv1.ResourceAttributes{Namespace: ns, Verb: "patch", Group: "quota.fairshare.dev",
			Resource: "tenantquotas", Subresource: "status", Name: "c"})
	})

	t.Run("UpstreamRejectsKey", func(t *testing.T) {
		// A provider answering 401 and quoting the key it received (as
		// providers' "Incorrect API key provided: ..." messages do): the
		// tenant must not learn the provider key from the answer. The
		// upstream receives the provider key only: never a tenant's key
		// nor the tenant header.
		var mu sync.Mutex
		var seen []http.Header
		echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			seen = append(seen, r.Header.Clone())
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprintf(w, `{"error":{"message":"Incorrect API key provided: %s","type":"invalid_request_error","code":"invalid_api_key"}}`,
				strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
		}))
		defer echo.Close()
		setBaseURL(ctx, t, cp, echo.URL)
		defer setBaseURL(ctx, t, cp, simURL)
		deadline := time.Now().Add(20 * time.Second)
		for {
			e := c.do(ctx, "A chat, upstream 401", "POST", gw+"/v1/chat/completions", keyA,
				map[string]string{"X-Fairshare-Tenant": "a"}, chat(40))
			mu.Lock()
			n := len(seen)
			mu.Unlock()
			if n > 0 {
				t.Logf("upstream 401 quoting the key: gateway answered %d %s", e.status, e.body)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the scheduler did not call the new baseURL within 20 s (last answer %d)", e.status)
			}
			time.Sleep(200 * time.Millisecond)
		}
		mu.Lock()
		defer mu.Unlock()
		for _, h := range seen {
			if got := h.Get("Authorization"); got != "Bearer "+providerKey {
				t.Errorf("upstream Authorization %q, want the provider key", got)
			}
			if h.Get("X-Fairshare-Tenant") != "" {
				t.Error("the tenant header was sent upstream")
			}
			for k, vs := range h {
				for _, v := range vs {
					for _, tk := range []string{keyA, keyB, keyC} {
						if strings.Contains(v, tk) {
							t.Errorf("upstream header %s carries a tenant key", k)
						}
					}
				}
			}
		}
	})

	t.Run("NoKeyLeaks", func(t *testing.T) {
		checkNoLeaks(ctx, t, cp, c, operator, sched, fmt.Sprintf("http://127.0.0.1:%d/metrics", opMetricsPort))
	})

	t.Run("ChartOperatorDeployment", func(t *testing.T) { checkChart(t) })
}

// setBaseURL points the pool at u (the scheduler reads it live).
func setBaseURL(ctx context.Context, t *testing.T, cp *framework.ControlPlane, u string) {
	t.Helper()
	var p v1alpha1.ProviderPool
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: pool}, &p); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(p.DeepCopy())
	p.Spec.Upstream.BaseURL = u
	if err := cp.Client.Patch(ctx, &p, patch); err != nil {
		t.Fatal(err)
	}
}

// waitRoleNames waits until the pool's Secret Role grants GET on exactly names.
func waitRoleNames(ctx context.Context, t *testing.T, cp *framework.ControlPlane, names []string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var r rbacv1.Role
		err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: scheduler + "-secrets"}, &r)
		if err == nil && len(r.Rules) == 1 && slices.Equal(r.Rules[0].ResourceNames, names) &&
			slices.Equal(r.Rules[0].Verbs, []string{"get"}) && slices.Equal(r.Rules[0].Resources, []string{"secrets"}) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Role %s-secrets: %v %+v, want GET on secrets %v", scheduler, err, r.Rules, names)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitAllowed waits (at most 30 s) until the scheduler's account is
// allowed ra.
func waitAllowed(ctx context.Context, t *testing.T, cp *framework.ControlPlane, ra authorizationv1.ResourceAttributes) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !allowed(ctx, t, cp, ra) {
		if time.Now().After(deadline) {
			t.Fatalf("%s is not allowed %+v", saUser, ra)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func allowed(ctx context.Context, t *testing.T, cp *framework.ControlPlane, ra authorizationv1.ResourceAttributes) bool {
	t.Helper()
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:               saUser,
		Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
		ResourceAttributes: &ra,
	}}
	if err := cp.Client.Create(ctx, sar); err != nil {
		t.Fatal(err)
	}
	return sar.Status.Allowed
}

// checkRBAC asserts the scheduler's documented verbs, and denials around them.
func checkRBAC(ctx context.Context, t *testing.T, cp *framework.ControlPlane) {
	type ra = authorizationv1.ResourceAttributes
	q := "quota.fairshare.dev"
	allow := []ra{
		{Namespace: ns, Verb: "get", Resource: "secrets", Name: "a-key"},
		{Namespace: ns, Verb: "get", Resource: "secrets", Name: "b-key"},
	}
	for _, v := range []string{"get", "list", "watch"} {
		allow = append(allow, ra{Namespace: ns, Verb: v, Group: q, Resource: "providerpools"}, ra{Namespace: ns, Verb: v, Group: q, Resource: "tenantquotas"})
	}
	// Status by server-side apply (PATCH) only, of its pool and its
	// tenants only (Role <pool>-scheduler-pool).
	for _, v := range []string{"get", "patch"} {
		allow = append(allow, ra{Namespace: ns, Verb: v, Group: q, Resource: "providerpools", Subresource: "status", Name: pool},
			ra{Namespace: ns, Verb: v, Group: q, Resource: "tenantquotas", Subresource: "status", Name: "a"},
			ra{Namespace: ns, Verb: v, Group: q, Resource: "tenantquotas", Subresource: "status", Name: "b"})
	}
	// Its own Lease only; any name on create (RBAC cannot see it).
	allow = append(allow, ra{Namespace: ns, Verb: "create", Group: "coordination.k8s.io", Resource: "leases"})
	for _, v := range []string{"get", "update"} {
		allow = append(allow, ra{Namespace: ns, Verb: v, Group: "coordination.k8s.io", Resource: "leases", Name: pool + "-scheduler"})
	}
	for _, v := range []string{"create", "patch"} {
		allow = append(allow, ra{Namespace: ns, Verb: v, Resource: "events"}, ra{Namespace: ns, Verb: v, Group: "events.k8s.io", Resource: "events"})
	}
	deny := []ra{
		// Secrets: only GET, only the tenants' key Secrets, only here.
		{Namespace: ns, Verb: "get", Resource: "secrets", Name: "provider-key"},
		{Namespace: ns, Verb: "get", Resource: "secrets", Name: "unrelated"},
		{Namespace: ns, Verb: "get", Resource: "secrets", Name: "c-key"},
		{Namespace: ns, Verb: "list", Resource: "secrets"},
		{Namespace: ns, Verb: "watch", Resource: "secrets"},
		{Namespace: ns, Verb: "list", Resource: "secrets", Name: "a-key"},
		{Namespace: ns, Verb: "watch", Resource: "secrets", Name: "a-key"},
		{Namespace: ns, Verb: "update", Resource: "secrets", Name: "a-key"},
		{Namespace: ns, Verb: "patch", Resource: "secrets", Name: "a-key"},
		{Namespace: ns, Verb: "delete", Resource: "secrets", Name: "a-key"},
		{Namespace: ns, Verb: "create", Resource: "secrets"},
		{Namespace: otherNS, Verb: "get", Resource: "secrets", Name: "a-key"},
		// Workloads, config, RBAC.
		{Namespace: ns, Verb: "get", Resource: "pods"},
		{Namespace: ns, Verb: "list", Resource: "pods"},
		{Namespace: ns, Verb: "create", Resource: "pods"},
		{Namespace: ns, Verb: "create", Resource: "pods", Subresource: "exec"},
		{Namespace: ns, Verb: "get", Group: "apps", Resource: "deployments"},
		{Namespace: ns, Verb: "patch", Group: "apps", Resource: "deployments"},
		{Namespace: ns, Verb: "get", Resource: "configmaps"},
		{Namespace: ns, Verb: "create", Resource: "configmaps"},
		{Namespace: ns, Verb: "update", Resource: "configmaps"},
		{Namespace: ns, Verb: "create", Resource: "serviceaccounts", Subresource: "token"},
		{Namespace: ns, Verb: "create", Group: "rbac.authorization.k8s.io", Resource: "roles"},
		{Namespace: ns, Verb: "create", Group: "rbac.authorization.k8s.io", Resource: "rolebindings"},
		{Namespace: ns, Verb: "escalate", Group: "rbac.authorization.k8s.io", Resource: "roles"},
		{Namespace: ns, Verb: "delete", Group: "coordination.k8s.io", Resource: "leases"},
		{Namespace: ns, Verb: "list", Group: "coordination.k8s.io", Resource: "leases"},
		// Another pool's status, Lease and tenants' status, and any
		// object's status or Lease by no name (a rule with no names).
		{Namespace: ns, Verb: "patch", Group: q, Resource: "providerpools", Subresource: "status", Name: "other"},
		{Namespace: ns, Verb: "patch", Group: q, Resource: "providerpools", Subresource: "status"},
		{Namespace: ns, Verb: "patch", Group: q, Resource: "tenantquotas", Subresource: "status", Name: "other-tenant"},
		{Namespace: ns, Verb: "patch", Group: q, Resource: "tenantquotas", Subresource: "status"},
		{Namespace: ns, Verb: "get", Group: "coordination.k8s.io", Resource: "leases", Name: "other-scheduler"},
		{Namespace: ns, Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Name: "other-scheduler"},
		{Namespace: ns, Verb: "update", Group: "coordination.k8s.io", Resource: "leases"},
		{Namespace: otherNS, Verb: "patch", Group: q, Resource: "providerpools", Subresource: "status", Name: pool},
		{Namespace: otherNS, Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Name: pool + "-scheduler"},
		// Its own custom resources: status only, no spec writes.
		{Namespace: ns, Verb: "update", Group: q, Resource: "providerpools"},
		{Namespace: ns, Verb: "update", Group: q, Resource: "providerpools", Subresource: "status"},
		{Namespace: ns, Verb: "update", Group: q, Resource: "tenantquotas", Subresource: "status"},
		{Namespace: ns, Verb: "patch", Group: q, Resource: "tenantquotas"},
		{Namespace: ns, Verb: "create", Group: q, Resource: "tenantquotas"},
		{Namespace: ns, Verb: "delete", Group: q, Resource: "tenantquotas"},
		{Namespace: ns, Verb: "delete", Resource: "events"},
		// Another namespace: nothing.
		{Namespace: otherNS, Verb: "get", Group: q, Resource: "providerpools"},
		{Namespace: otherNS, Verb: "list", Group: q, Resource: "tenantquotas"},
		{Namespace: otherNS, Verb: "create", Resource: "events"},
		{Namespace: otherNS, Verb: "create", Group: "coordination.k8s.io", Resource: "leases"},
		// Cluster scope.
		{Verb: "list", Resource: "namespaces"},
		{Verb: "list", Resource: "nodes"},
		{Verb: "list", Resource: "secrets"},
	}
	for _, a := range allow {
		if !allowed(ctx, t, cp, a) {
			t.Errorf("denied, want allowed: %+v", a)
		}
	}
	for _, a := range deny {
		if allowed(ctx, t, cp, a) {
			t.Errorf("allowed, want denied: %+v", a)
		}
	}
	t.Logf("%d allowed and %d denied attributes checked", len(allow), len(deny))
	if out, err := framework.Kubectl(ctx, cp.Kubeconfig, "auth", "can-i", "--list", "-n", ns, "--as", saUser); err == nil {
		t.Logf("kubectl auth can-i --list -n %s --as %s:\n%s", ns, saUser, out)
	} else {
		t.Logf("kubectl auth can-i --list: %v\n%s", err, out)
	}
}

// checkPodSecurity asserts the restricted Pod Security settings on every container.
func checkPodSecurity(t *testing.T, what string, ps corev1.PodSpec) {
	t.Helper()
	psc := ps.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		t.Errorf("%s: pod runAsNonRoot not true: %+v", what, psc)
	}
	podSeccomp := psc != nil && psc.SeccompProfile != nil && psc.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault
	for _, c := range ps.Containers {
		sc := c.SecurityContext
		if sc == nil {
			t.Errorf("%s: container %s has no securityContext", what, c.Name)
			continue
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("%s: container %s readOnlyRootFilesystem not true", what, c.Name)
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("%s: container %s allowPrivilegeEscalation not false", what, c.Name)
		}
		if sc.Privileged != nil && *sc.Privileged {
			t.Errorf("%s: container %s privileged", what, c.Name)
		}
		if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
			t.Errorf("%s: container %s capabilities %+v, want drop [ALL] and no add", what, c.Name, sc.Capabilities)
		}
		if sc.RunAsNonRoot != nil && !*sc.RunAsNonRoot || sc.RunAsUser != nil && *sc.RunAsUser == 0 {
			t.Errorf("%s: container %s may run as root", what, c.Name)
		}
		if !podSeccomp && (sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault) {
			t.Errorf("%s: container %s seccompProfile not RuntimeDefault", what, c.Name)
		}
	}
}

// checkProviderKeyMount: the provider key reaches the scheduler as a file
// of a read-only Secret volume, readable by the pod's fsGroup and no
// other user, never with subPath (the kubelet would not update it after a
// rotation), and neither as an environment variable nor as a literal.
func checkProviderKeyMount(t *testing.T, ps corev1.PodSpec) {
	t.Helper()
	var vol *corev1.Volume
	for i := range ps.Volumes {
		if ps.Volumes[i].Secret != nil {
			if vol != nil {
				t.Errorf("two Secret volumes: %s and %s", vol.Name, ps.Volumes[i].Name)
			}
			vol = &ps.Volumes[i]
		}
	}
	if vol == nil {
		t.Fatal("no Secret volume: the provider key is not mounted")
	}
	if vol.Secret.SecretName != "provider-key" || len(vol.Secret.Items) != 1 {
		t.Errorf("Secret volume %+v: want the one key of Secret provider-key", vol.Secret)
	}
	if m := vol.Secret.DefaultMode; m == nil || *m&0o037 != 0 {
		t.Errorf("Secret volume mode %v: want no group write and nothing for others", m)
	}
	if g := ps.SecurityContext.FSGroup; g == nil || *g == 0 {
		t.Errorf("fsGroup %v: the non-root scheduler cannot read the key file", g)
	}
	for _, c := range ps.Containers {
		for _, e := range c.Env {
			if e.Name == schedconfig.ProviderKeyEnv || e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				t.Errorf("container %s: the provider key is in the environment (%s), fixed until a restart", c.Name, e.Name)
			}
		}
		for _, m := range c.VolumeMounts {
			if m.Name == vol.Name && (!m.ReadOnly || m.SubPath != "" || m.SubPathExpr != "") {
				t.Errorf("container %s: provider key mount %+v: want read-only, without subPath", c.Name, m)
			}
		}
	}
}

// checkChart renders the chart with bin/helm and checks the operator Deployment.
func checkChart(t *testing.T) {
	helm := filepath.Join(framework.RepoRoot(), "bin", "helm")
	if _, err := os.Stat(helm); err != nil {
		t.Skipf("bin/helm not built: %v", err)
	}
	out, err := exec.Command(helm, "template", "fs", filepath.Join(framework.RepoRoot(), "charts", "fairshare"), "-n", "fairshare-system").Output()
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	found := 0
	for _, doc := range strings.Split(string(out), "\n---") {
		var probe struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &probe); err != nil || probe.Kind != "Deployment" {
			continue
		}
		var d appsv1.Deployment
		if err := yaml.Unmarshal([]byte(doc), &d); err != nil {
			t.Fatal(err)
		}
		found++
		checkPodSecurity(t, "chart Deployment "+d.Name, d.Spec.Template.Spec)
	}
	if found != 1 {
		t.Errorf("chart renders %d Deployments, want 1 (the operator)", found)
	}
}

// startSchedulerAsServiceAccount runs the pool's scheduler as the rendered
// Deployment would, with a kubeconfig that impersonates its ServiceAccount, so
// that every API call it makes is authorized as in a cluster.
func startSchedulerAsServiceAccount(ctx context.Context, t *testing.T, cp *framework.ControlPlane, bin, work string) *framework.SchedulerProcess {
	t.Helper()
	var dep appsv1.Deployment
	var cm corev1.ConfigMap
	deadline := time.Now().Add(60 * time.Second)
	for {
		errD := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: scheduler}, &dep)
		errC := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: scheduler}, &cm)
		if errD == nil && errC == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not rendered: %v %v", errD, errC)
		}
		time.Sleep(100 * time.Millisecond)
	}
	settings, err := schedconfig.Parse([]byte(cm.Data[schedconfig.SettingsKey]))
	if err != nil {
		t.Fatal(err)
	}
	// The kubelet's part: mount the provider key as the admin.
	if settings.ProviderKeyFile, err = framework.LocalProviderKeyFile(ctx, cp.Client, ns, dep.Spec.Template.Spec, settings.ProviderKeyFile, work); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(settings.ProviderKeyFile); err != nil || string(b) != providerKey {
		t.Fatalf("provider key not passed to the scheduler: file %q: %v", settings.ProviderKeyFile, err)
	}
	saKubeconfig := impersonating(t, cp, work, saUser, ns)
	sp := &framework.SchedulerSpec{Namespace: ns, Name: scheduler, Settings: settings,
		SettingsPath: filepath.Join(work, schedconfig.SettingsKey), Env: []string{"KUBECONFIG=" + saKubeconfig}}
	if err := os.WriteFile(sp.SettingsPath, settings.Marshal(), 0o644); err != nil {
		t.Fatal(err)
	}
	ctr := dep.Spec.Template.Spec.Containers[0]
	for _, a := range ctr.Args {
		if !strings.HasPrefix(a, "--config=") {
			sp.Args = append(sp.Args, a)
		}
	}
	for _, v := range ctr.Env {
		switch {
		case v.ValueFrom != nil && v.ValueFrom.SecretKeyRef != nil:
			// The kubelet's part: resolve the provider key as the admin.
			var s corev1.Secret
			if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: v.ValueFrom.SecretKeyRef.Name}, &s); err != nil {
				t.Fatal(err)
			}
			sp.Env = append(sp.Env, v.Name+"="+string(s.Data[v.ValueFrom.SecretKeyRef.Key]))
		case v.ValueFrom != nil && v.ValueFrom.FieldRef != nil && v.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
			sp.Env = append(sp.Env, v.Name+"="+ns)
		case v.ValueFrom != nil && v.ValueFrom.FieldRef != nil:
			sp.Env = append(sp.Env, v.Name+"="+scheduler+"-local")
		default:
			sp.Env = append(sp.Env, v.Name+"="+v.Value)
		}
	}
	p := framework.NewSchedulerProcess(t, sp, bin, work, "", filepath.Join(work, "jobs.db"))
	p.Start(t, 1)
	// Stand in for the kubelet once the process is ready (Ready condition).
	go func() {
		for ctx.Err() == nil {
			if code, err := framework.GetStatus(ctx, p.ReadyzURL, ""); err == nil && code == 200 {
				_ = cp.MarkDeploymentAvailable(ctx, ns, scheduler)
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()
	return p
}

// checkNoLeaks greps every captured response, both logs, every object's
// status, every event and both /metrics for the keys.
func checkNoLeaks(ctx context.Context, t *testing.T, cp *framework.ControlPlane, c *capture, operator *framework.Process, sched *framework.SchedulerProcess, opMetrics string) {
	secrets := map[string]string{"provider key": providerKey, "tenant A key": keyA, "tenant B key": keyB, "tenant C key": keyC}
	var sources []struct {
		what string
		data []byte
	}
	add := func(what string, data []byte) {
		sources = append(sources, struct {
			what string
			data []byte
		}{what, data})
	}
	for _, e := range c.all {
		var h bytes.Buffer
		_ = e.header.Write(&h)
		add("response headers of "+e.what, h.Bytes())
		add("response body of "+e.what, e.body)
	}
	for _, p := range []struct{ what, path string }{{"operator log", operator.LogPath}, {"scheduler log", sched.LogPath()}} {
		b, err := os.ReadFile(p.path)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) == 0 {
			t.Errorf("%s is empty: nothing was checked", p.what)
		}
		add(p.what, b)
	}
	for _, u := range []string{sched.MetricsURL, opMetrics} {
		code, body := get(ctx, t, u)
		if code != 200 || len(body) == 0 {
			t.Errorf("%s: %d, %d bytes", u, code, len(body))
		}
		add("metrics "+u, body)
	}
	var pools v1alpha1.ProviderPoolList
	var tqs v1alpha1.TenantQuotaList
	var evs corev1.EventList
	for _, l := range []client.ObjectList{&pools, &tqs, &evs} {
		if err := cp.Client.List(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range pools.Items {
		b, _ := json.Marshal(p.Status)
		add("status of ProviderPool "+p.Name, b)
	}
	for _, q := range tqs.Items {
		b, _ := json.Marshal(q.Status)
		add("status of TenantQuota "+q.Name, b)
	}
	if len(tqs.Items) != 3 || len(evs.Items) == 0 {
		t.Errorf("%d TenantQuotas and %d events captured, want 3 and some", len(tqs.Items), len(evs.Items))
	}
	for _, ev := range evs.Items {
		b, _ := json.Marshal(ev)
		add("event "+ev.Reason, b)
	}
	total := 0
	for _, s := range sources {
		total += len(s.data)
		for name, key := range secrets {
			if bytes.Contains(s.data, []byte(key)) {
				t.Errorf("%s appears in %s", name, s.what)
			}
		}
	}
	t.Logf("checked %d sources (%d responses, 2 logs, 2 metrics, %d statuses, %d events), %d bytes",
		len(sources), len(c.all), len(pools.Items)+len(tqs.Items), len(evs.Items), total)
}

func get(ctx context.Context, t *testing.T, u string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "GET", u, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}
