// Package chaos injects process and control-plane faults into Fairshare running on the
// real local control plane (kube-apiserver and etcd from bin/), with the operator, the
// provider simulator and a pool's scheduler as local processes (package test/framework),
// issue 7 "Process faults" and "Control-plane faults":
//
//   - TestKillSchedulerWithStreamsInFlight: kill -9 of the scheduler while streaming calls
//     are in flight; the clients see a cut stream; after the restart the tenant's calls in
//     flight and KV blocks are 0 and its budget spend is what status promised. (The kill in
//     the middle of a batch import is test/restart.)
//   - TestKillOperator: kill -9 of the operator and a restart change no object it
//     renders and rewrite no status.
//   - TestAPIServerOutage: the scheduler's connection to the API server is cut for 60 s
//     while traffic flows (a TCP proxy on 127.0.0.1; etcd and the API server stay up);
//     the data path keeps serving with the last known policy, limits enforced, jobs
//     drain; status writes resume afterwards within the writer's bound.
//
// Every test is bounded by its context and stops by itself.
package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/test/framework"
)

// tenantQuota returns a TenantQuota manifest (preceded by "---") of weight 1 in pool,
// with the YAML lines extra (indented by two spaces, under spec) appended.
func tenantQuota(name, pool, extra string) string {
	return fmt.Sprintf(`---
apiVersion: quota.fairshare.dev/v1alpha1
kind: TenantQuota
metadata:
  name: %s
spec:
  poolRef:
    name: %s
  weight: 1
%s`, name, pool, extra)
}

// chat is a chat completion body of model sim-gpt asking for maxTokens output tokens.
func chat(maxTokens int, stream bool) []byte {
	b, _ := json.Marshal(map[string]any{
		"model": "sim-gpt", "stream": stream, "max_tokens": maxTokens,
		"messages": []map[string]string{{"role": "user", "content": "Write a long story about a lighthouse."}},
	})
	return b
}

// post sends body to the gateway's chat completions as tenant and returns the status
// and the error code of a refusal; transport errors fail the test.
func post(ctx context.Context, t testing.TB, base, tenant string, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Fairshare-Tenant", tenant)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST as %s: %v", tenant, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e struct{ Error struct{ Code string } }
	if resp.StatusCode != http.StatusOK {
		_ = json.Unmarshal(b, &e)
	}
	return resp.StatusCode, e.Error.Code
}

// metric returns the gauge prefix at the scheduler's /metrics, failing t when absent.
func metric(ctx context.Context, t testing.TB, u, prefix string) float64 {
	t.Helper()
	v, ok, err := framework.MetricValue(ctx, u, prefix)
	if err != nil || !ok {
		t.Fatalf("metric %s at %s: found=%v err=%v", prefix, u, ok, err)
	}
	return v
}

// waitFor polls cond every 100 ms until it returns "" (met) or limit passes, then
// fails t with its last message.
func waitFor(t testing.TB, limit time.Duration, what string, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		msg := cond()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not met after %s: %s", what, limit, msg)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func getTQ(ctx context.Context, t testing.TB, c client.Client, ns, name string) v1alpha1.TenantQuota {
	t.Helper()
	var tq v1alpha1.TenantQuota
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &tq); err != nil {
		t.Fatal(err)
	}
	return tq
}

func deref(p *int64) int64 {
	if p == nil {
		return -1
	}
	return *p
}

// TestKillSchedulerWithStreamsInFlight makes one short call of a tenant with a budget
// (so that its period spend is above 0), then starts `streams` streaming calls of the
// tenant whose answers take about 20 s (200 frames 100 ms apart), waits until they are
// all in flight, every client has received a first frame and the spend is in the
// TenantQuota's status.budget.used, kills the scheduler with SIGKILL, and checks: every
// client's stream ends in an error (cut, not a clean end); the spend status promised is
// the finished call's (a call in flight is not spent yet); after the restart on the
// same job store, the tenant's calls in flight and KV blocks are 0 (metrics, then
// status) and its budget spend (metric) equals status.budget.used as written before the
// kill (the restart seeds it from status, docs/api.md "budget"); the restarted
// scheduler serves the tenant again.
func TestKillSchedulerWithStreamsInFlight(t *testing.T) {
	framework.RequireAssets(t, "test-chaos")
	const (
		namespace, pool, tenant = "fairshare-chaos-stream", "chaos-stream", "streamer"
		streams                 = 4
		maxTokens               = 200
	)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	work := t.TempDir()
	logf := framework.StepLogf(t)
	st := framework.StartStack(ctx, t, work, namespace, append(framework.PacedSimArgs(0),
		"--frame-interval=100ms", fmt.Sprintf("--output-tokens=%d", maxTokens)), logf)
	st.Apply(ctx, t, work, namespace, framework.SimPoolManifest(pool, st.SimURL, 1, 8, "")+
		tenantQuota(tenant, pool, "  budget:\n    weightedTokens: 100000000\n    period: Month\n"))
	spec := framework.RenderedScheduler(ctx, t, st.CP, st.Operator, namespace, pool+"-scheduler", work)
	sched := framework.NewSchedulerProcess(t, spec, st.Bin, work, "", filepath.Join(work, "jobs.db"))
	sched.Start(t, 1)
	sched.WaitReady(ctx, t, 60*time.Second)
	if err := st.CP.MarkDeploymentAvailable(ctx, namespace, pool+"-scheduler"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("scheduler run 1 (tail):\n%s\nrun 2 (tail):\n%s", framework.TailFile(sched.RunLogPath(1), 20), framework.TailFile(sched.RunLogPath(2), 20))
		}
	})
	inFlight := fmt.Sprintf(`fairshare_scheduler_tenant_in_flight_requests{tenant=%q}`, tenant)
	kv := fmt.Sprintf(`fairshare_scheduler_tenant_kv_blocks{tenant=%q}`, tenant)
	used := fmt.Sprintf(`fairshare_scheduler_tenant_budget_used_weighted_tokens{tenant=%q}`, tenant)

	// One finished call first, so that the period's spend is not 0 (a call in flight
	// is not counted in budget used until it ends).
	if code, reason := post(ctx, t, sched.GatewayURL, tenant, chat(4, false)); code != http.StatusOK {
		t.Fatalf("first call: %d %s", code, reason)
	}
	spent := metric(ctx, t, sched.MetricsURL, used)
	if spent <= 0 {
		t.Fatalf("%s = %v after a finished call, want > 0", used, spent)
	}

	// The streams: each reads until its body ends and records the read error.
	type result struct {
		status int
		frames int
		err    error
	}
	results := make([]result, streams)
	var wg sync.WaitGroup
	// firstFrame is signalled once by each stream at its first frame.
	firstFrame := make(chan struct{}, streams)
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, sched.GatewayURL+"/v1/chat/completions", bytes.NewReader(chat(maxTokens, true)))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Fairshare-Tenant", tenant)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				results[i].err = err
				return
			}
			defer resp.Body.Close()
			results[i].status = resp.StatusCode
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				if strings.HasPrefix(sc.Text(), "data: ") {
					if results[i].frames++; results[i].frames == 1 {
						firstFrame <- struct{}{}
					}
				}
			}
			results[i].err = sc.Err()
			if results[i].err == nil {
				results[i].err = io.EOF // a clean end: the stream was not cut
			}
		}()
	}
	waitFor(t, 30*time.Second, "streams in flight", func() string {
		if v := metric(ctx, t, sched.MetricsURL, inFlight); v != streams {
			return fmt.Sprintf("%s = %v, want %d", inFlight, v, streams)
		}
		return ""
	})
	// Every client is reading its stream (headers and a first frame received).
	for i := range streams {
		select {
		case <-firstFrame:
		case <-time.After(30 * time.Second):
			t.Fatalf("%d of %d streams received a frame in 30 s", i, streams)
		}
	}
	kvBefore := metric(ctx, t, sched.MetricsURL, kv)
	usedBefore := metric(ctx, t, sched.MetricsURL, used)
	// Status promises the charge before the kill (status interval 1 s).
	waitFor(t, 30*time.Second, "status.budget.used written", func() string {
		tq := getTQ(ctx, t, st.CP.Client, namespace, tenant)
		if tq.Status.Budget == nil || float64(deref(tq.Status.Budget.Used)) != usedBefore {
			return fmt.Sprintf("status.budget %+v, metric %v", tq.Status.Budget, usedBefore)
		}
		return ""
	})
	promised := *getTQ(ctx, t, st.CP.Client, namespace, tenant).Status.Budget.Used
	if float64(promised) != spent {
		t.Errorf("status.budget.used %d with the streams in flight, want the finished call's %v (calls in flight are not spent yet)", promised, spent)
	}
	logf("%d streams in flight, %v KV blocks, budget used %v (status.budget.used %d): kill -9", streams, kvBefore, usedBefore, promised)
	sched.Kill(t)
	wg.Wait()
	for i, r := range results {
		if r.status != http.StatusOK {
			t.Errorf("stream %d: status %d, want 200 before the kill", i, r.status)
		}
		if r.err == io.EOF {
			t.Errorf("stream %d ended cleanly after %d frames, want a cut stream", i, r.frames)
		}
		if r.frames >= maxTokens {
			t.Errorf("stream %d: %d frames, want fewer than %d (cut)", i, r.frames, maxTokens)
		}
		logf("stream %d: %d frames, then %v", i, r.frames, r.err)
	}

	sched.Start(t, 2)
	sched.WaitReady(ctx, t, 60*time.Second)
	if v := metric(ctx, t, sched.MetricsURL, inFlight); v != 0 {
		t.Errorf("after restart: %s = %v, want 0", inFlight, v)
	}
	if v := metric(ctx, t, sched.MetricsURL, kv); v != 0 {
		t.Errorf("after restart: %s = %v, want 0", kv, v)
	}
	if v := metric(ctx, t, sched.MetricsURL, used); v != float64(promised) {
		t.Errorf("after restart: %s = %v, want status.budget.used %d", used, v, promised)
	}
	// Status catches up: 0 in flight and 0 KV blocks written for the tenant.
	waitFor(t, 30*time.Second, "status after restart", func() string {
		tq := getTQ(ctx, t, st.CP.Client, namespace, tenant)
		if deref(tq.Status.InFlight) > 0 || deref(tq.Status.KVBlocksInUse) > 0 || tq.Status.Budget == nil || deref(tq.Status.Budget.Used) != promised {
			return fmt.Sprintf("inFlight %d kvBlocksInUse %d budget %+v", deref(tq.Status.InFlight), deref(tq.Status.KVBlocksInUse), tq.Status.Budget)
		}
		return ""
	})
	// The tenant is served again (a short call).
	if code, reason := post(ctx, t, sched.GatewayURL, tenant, chat(1, false)); code != http.StatusOK {
		t.Errorf("after restart: %d %s, want 200", code, reason)
	}
	logf("after restart: in flight 0, KV blocks 0, budget used %d = status; served again", promised)
}

// managedObjects returns "Kind/name" -> resourceVersion of the objects the operator
// renders in namespace (label app.kubernetes.io/managed-by=fairshare): Deployment,
// Service, ConfigMap, RoleBinding, PersistentVolumeClaim, ServiceAccount.
func managedObjects(ctx context.Context, t testing.TB, c client.Client, namespace string) map[string]string {
	t.Helper()
	out := map[string]string{}
	sel := client.MatchingLabels{"app.kubernetes.io/managed-by": "fairshare"}
	for _, l := range managedLists() {
		if err := c.List(ctx, l.list, client.InNamespace(namespace), sel); err != nil {
			t.Fatal(err)
		}
		for name, rv := range l.items() {
			out[l.kind+"/"+name] = rv
		}
	}
	return out
}

// managedList is one kind's list and a function returning its items' name ->
// resourceVersion.
type managedList struct {
	kind  string
	list  client.ObjectList
	items func() map[string]string
}

func managedLists() []managedList {
	deps, svcs, cms := &appsv1.DeploymentList{}, &corev1.ServiceList{}, &corev1.ConfigMapList{}
	rbs, pvcs, sas := &rbacv1.RoleBindingList{}, &corev1.PersistentVolumeClaimList{}, &corev1.ServiceAccountList{}
	rv := func(objs ...client.Object) map[string]string {
		m := map[string]string{}
		for _, o := range objs {
			m[o.GetName()] = o.GetResourceVersion()
		}
		return m
	}
	ptrs := func(n int, get func(int) client.Object) []client.Object {
		out := make([]client.Object, n)
		for i := range n {
			out[i] = get(i)
		}
		return out
	}
	return []managedList{
		{"Deployment", deps, func() map[string]string {
			return rv(ptrs(len(deps.Items), func(i int) client.Object { return &deps.Items[i] })...)
		}},
		{"Service", svcs, func() map[string]string {
			return rv(ptrs(len(svcs.Items), func(i int) client.Object { return &svcs.Items[i] })...)
		}},
		{"ConfigMap", cms, func() map[string]string {
			return rv(ptrs(len(cms.Items), func(i int) client.Object { return &cms.Items[i] })...)
		}},
		{"RoleBinding", rbs, func() map[string]string {
			return rv(ptrs(len(rbs.Items), func(i int) client.Object { return &rbs.Items[i] })...)
		}},
		{"PersistentVolumeClaim", pvcs, func() map[string]string {
			return rv(ptrs(len(pvcs.Items), func(i int) client.Object { return &pvcs.Items[i] })...)
		}},
		{"ServiceAccount", sas, func() map[string]string {
			return rv(ptrs(len(sas.Items), func(i int) client.Object { return &sas.Items[i] })...)
		}},
	}
}

// statusVersions returns "Kind/name" -> resourceVersion of the pool and tenants in
// namespace (a status write changes it).
func statusVersions(ctx context.Context, t testing.TB, c client.Client, namespace string) map[string]string {
	t.Helper()
	out := map[string]string{}
	var pools v1alpha1.ProviderPoolList
	var tqs v1alpha1.TenantQuotaList
	if err := c.List(ctx, &pools, client.InNamespace(namespace)); err != nil {
		t.Fatal(err)
	}
	if err := c.List(ctx, &tqs, client.InNamespace(namespace)); err != nil {
		t.Fatal(err)
	}
	for _, p := range pools.Items {
		out["ProviderPool/"+p.Name] = p.ResourceVersion
	}
	for _, q := range tqs.Items {
		out["TenantQuota/"+q.Name] = q.ResourceVersion
	}
	return out
}

// TestKillOperator renders a pool (with a Volume job store: Deployment, Service,
// ConfigMap, RoleBindings, PersistentVolumeClaim, ServiceAccount), waits until the
// operator has converged (the resourceVersions of what it renders and of the pool's and
// tenants' status are unchanged over two consecutive reads opsSettle apart, the
// Deployment marked available), kills the operator with SIGKILL, starts a new one and
// waits until it is ready and has watched for settle: no object it renders and no
// status has a new resourceVersion (its restart changes nothing that was right). No
// scheduler runs, so nothing else writes.
func TestKillOperator(t *testing.T) {
	framework.RequireAssets(t, "test-chaos")
	const namespace, pool = "fairshare-chaos-operator", "chaos-operator"
	// settle is how long the restarted operator runs before the comparison: its
	// informers have synced and every object has been reconciled at least once by then
	// (the initial list queues them all at start).
	const settle = 15 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	work := t.TempDir()
	logf := framework.StepLogf(t)
	st := framework.StartStack(ctx, t, work, namespace, framework.PacedSimArgs(0), logf)
	st.Apply(ctx, t, work, namespace, framework.SimPoolManifest(pool, st.SimURL, 2, 8, "")+
		tenantQuota("a", pool, "")+tenantQuota("b", pool, "  maxConcurrentRequests: 2\n"))
	framework.RenderedScheduler(ctx, t, st.CP, st.Operator, namespace, pool+"-scheduler", work)
	if err := st.CP.MarkDeploymentAvailable(ctx, namespace, pool+"-scheduler"); err != nil {
		t.Fatal(err)
	}
	snapshot := func() map[string]string {
		m := managedObjects(ctx, t, st.CP.Client, namespace)
		for k, v := range statusVersions(ctx, t, st.CP.Client, namespace) {
			m[k] = v
		}
		return m
	}
	var before map[string]string
	waitFor(t, 60*time.Second, "operator converged", func() string {
		a := snapshot()
		time.Sleep(3 * time.Second)
		b := snapshot()
		if diff := diffVersions(a, b); diff != "" {
			return diff
		}
		before = b
		return ""
	})
	kinds := map[string]int{}
	for k := range before {
		kinds[strings.SplitN(k, "/", 2)[0]]++
	}
	for _, k := range []string{"Deployment", "Service", "ConfigMap", "RoleBinding", "PersistentVolumeClaim", "ServiceAccount", "ProviderPool", "TenantQuota"} {
		if kinds[k] == 0 {
			t.Fatalf("no %s rendered (have %v)", k, kinds)
		}
	}
	logf("converged: %v; kill -9 the operator", kinds)
	st.Operator.Kill()

	healthPort, err := framework.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	op2, err := framework.Start("manager-2", work, filepath.Join(st.Bin, "manager"), []string{
		"--leader-elect=false", "--metrics-bind-address=0",
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", healthPort),
	}, "KUBECONFIG="+st.CP.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(op2.Stop)
	if err := framework.WaitHTTP(ctx, op2, fmt.Sprintf("http://127.0.0.1:%d/readyz", healthPort)); err != nil {
		t.Fatal(err)
	}
	logf("operator restarted and ready; watching %s", settle)
	time.Sleep(settle) // the window observed, not an assertion of timing
	if exited, err := op2.Exited(); exited {
		t.Fatalf("the restarted operator exited: %v\n%s", err, op2.Tail(30))
	}
	after := snapshot()
	if diff := diffVersions(before, after); diff != "" {
		t.Errorf("the operator's restart changed objects: %s\n%s", diff, op2.Tail(20))
	}
	logf("after the restart: %d objects, resourceVersions unchanged", len(after))
}

// diffVersions lists the keys whose resourceVersion differs between a and b ("" when
// none).
func diffVersions(a, b map[string]string) string {
	var d []string
	for k, v := range a {
		if b[k] != v {
			d = append(d, fmt.Sprintf("%s %s -> %s", k, v, b[k]))
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			d = append(d, k+" new")
		}
	}
	return strings.Join(d, "; ")
}
