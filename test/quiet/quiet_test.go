// Package quiet measures the API writes of a converged installation during
// one quiet minute (issue 6, "no write when nothing changed: a test counts
// API writes during a quiet minute"; regression case BC-42). The real local
// control plane (kube-apiserver and etcd), the operator, the provider
// simulator and a pool's scheduler run as processes (package
// test/framework); a pool with three tenants converges, then nothing is
// sent to anything for 60 s while the API server's own counter
// apiserver_request_total is read before and after.
package quiet

import (
	"bufio"
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/test/framework"
)

const (
	namespace = "fairshare-quiet"
	pool      = "quiet"
	// quietMinute is the measured window: real time, no traffic.
	quietMinute = 60 * time.Second
	// statusIntervalSeconds is the pool's scheduler status interval: 30
	// status passes of the scheduler fall in the quiet minute, none of which
	// may write an unchanged status.
	statusIntervalSeconds = 2
	// retryPeriod is controller-runtime's default leader election
	// RetryPeriod (2 s; the scheduler does not change it, see
	// internal/scheduler/run.go): a leader renews its Lease once per
	// retryPeriod, so one elector writes its Lease at most
	// quietMinute/retryPeriod + 1 = 31 times in the quiet minute.
	retryPeriod = 2 * time.Second
	// apiserverLeaseRenew is how often kube-apiserver renews its own
	// identity Lease in kube-system (the APIServerIdentity feature: every
	// 10 s), at most quietMinute/apiserverLeaseRenew + 1 = 7 writes.
	apiserverLeaseRenew = 10 * time.Second
	// maxPoolHeartbeats bounds the scheduler's writes of the unchanged pool
	// status in the quiet minute: it rewrites it every 5 minutes
	// (kube.DefaultForceRefresh) so lastReportTime shows it is alive; a
	// minute holds at most one.
	maxPoolHeartbeats = 1
)

var tenants = []string{"alpha", "beta", "gamma"}

// writeVerbs are the apiserver_request_total verbs that write.
var writeVerbs = map[string]bool{"POST": true, "PUT": true, "PATCH": true, "APPLY": true, "DELETE": true, "DELETECOLLECTION": true}

// resourceKey names a resource in the counts: "group/resource[/subresource]"
// with "core" for the core group.
func resourceKey(group, resource, subresource string) string {
	if group == "" {
		group = "core"
	}
	k := group + "/" + resource
	if subresource != "" {
		k += "/" + subresource
	}
	return k
}

// mustBeZero are the resources nothing may write once converged.
var mustBeZero = []string{
	"quota.fairshare.dev/providerpools",
	"quota.fairshare.dev/tenantquotas",
	"quota.fairshare.dev/tenantquotas/status",
	"apps/deployments",
	"apps/deployments/status",
	"core/services",
	"core/configmaps",
	"core/serviceaccounts",
	"core/persistentvolumeclaims",
	"core/events",
	"events.k8s.io/events",
	"rbac.authorization.k8s.io/roles",
	"rbac.authorization.k8s.io/rolebindings",
}

// parseWrites sums the write requests of apiserver_request_total in the
// Prometheus text exposition by resourceKey.
func parseWrites(text string) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		end := strings.LastIndexByte(line, '}')
		if end < 0 {
			return nil, fmt.Errorf("malformed sample %q", line)
		}
		labels := map[string]string{}
		for _, kv := range splitLabels(line[len("apiserver_request_total{"):end]) {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return nil, fmt.Errorf("malformed label %q in %q", kv, line)
			}
			uq, err := strconv.Unquote(v)
			if err != nil {
				return nil, fmt.Errorf("label %q in %q: %w", kv, line, err)
			}
			labels[k] = uq
		}
		if !writeVerbs[labels["verb"]] {
			continue
		}
		val, err := strconv.ParseFloat(strings.TrimSpace(line[end+1:]), 64)
		if err != nil {
			return nil, fmt.Errorf("value of %q: %w", line, err)
		}
		out[resourceKey(labels["group"], labels["resource"], labels["subresource"])] += val
	}
	return out, sc.Err()
}

// splitLabels splits `a="x",b="y,z"` at the commas outside quotes.
func splitLabels(s string) []string {
	var parts []string
	inQuote, escaped, start := false, false, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case escaped:
			escaped = false
		case c == '\\':
			escaped = true
		case c == '"':
			inQuote = !inQuote
		case c == ',' && !inQuote:
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	if start < len(s) {
		parts = append(parts, s[start:])
	}
	return parts
}

func TestParseWrites(t *testing.T) {
	text := `# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="configmaps",scope="resource",subresource="",verb="GET",version="v1"} 40
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="configmaps",scope="resource",subresource="",verb="APPLY",version="v1"} 3
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="configmaps",scope="resource",subresource="",verb="POST",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="quota.fairshare.dev",resource="providerpools",scope="resource",subresource="status",verb="APPLY",version="v1alpha1"} 5
apiserver_request_total{code="409",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 1.5e+01
`
	got, err := parseWrites(text)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"core/configmaps": 5, "quota.fairshare.dev/providerpools/status": 5, "coordination.k8s.io/leases": 15}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("parseWrites = %v, want %v", got, want)
	}
}

// scrape returns the API server's write counts by resource.
func scrape(ctx context.Context, t *testing.T, cs *kubernetes.Clientset) map[string]float64 {
	t.Helper()
	body, err := cs.RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	w, err := parseWrites(string(body))
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// conditionTrue returns nil when obj's condition condType is True.
func conditionTrue(conds []metav1.Condition, name, condType string) error {
	if c := apimeta.FindStatusCondition(conds, condType); c == nil || c.Status != metav1.ConditionTrue {
		return fmt.Errorf("%s: %s is %v", name, condType, c)
	}
	return nil
}

func TestQuietMinute(t *testing.T) {
	framework.RequireAssets(t, "test-quiet")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	work := t.TempDir()
	logf := framework.StepLogf(t)

	st := framework.StartStack(ctx, t, work, namespace, framework.PacedSimArgs(10*time.Millisecond), logf)
	logf("applying the pool and tenants %v", tenants)
	// Two replicas (jobs in memory, as a shared claim needs ReadWriteMany):
	// the scheduler runs leader election, so its Lease renewals are part of
	// the measure. One process runs: it is the leader.
	st.Apply(ctx, t, work, namespace, framework.SimPoolManifest(pool, st.SimURL, statusIntervalSeconds, 4,
		"    replicas: 2\n    jobStore:\n      type: Memory\n")+
		framework.TenantQuotaManifests(pool, tenants, 100))
	spec := framework.RenderedScheduler(ctx, t, st.CP, st.Operator, namespace, pool+"-scheduler", work)
	sched := framework.NewSchedulerProcess(t, spec, st.Bin, work, "", filepath.Join(work, "jobs.db"))
	sched.Start(t, 1)
	sched.WaitReady(ctx, t, 60*time.Second)
	if err := st.CP.MarkDeploymentAvailable(ctx, namespace, pool+"-scheduler"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("operator log (tail):\n%s\nscheduler log (tail):\n%s", st.Operator.Tail(30), sched.Tail(30))
		}
	})

	// Converged: the pool Ready and Serving, every tenant Ready and Serving,
	// each at its current generation.
	c := st.CP.Client
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := converged(ctx, c)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not converged after 60 s: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Let the scheduler's status pass that saw the last change land (it
	// runs every statusIntervalSeconds) before the window opens.
	time.Sleep(2*statusIntervalSeconds*time.Second + time.Second)
	logf("converged: pool and %d tenants Ready and Serving", len(tenants))

	cs, err := kubernetes.NewForConfig(st.CP.Config)
	if err != nil {
		t.Fatal(err)
	}
	// Leases are expected writes: count them per Lease with a watch (a read).
	leases, err := cs.CoordinationV1().Leases("").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer leases.Stop()
	before := scrape(ctx, t, cs)
	begin := time.Now()
	renewals := map[string]int{}
	timer := time.NewTimer(quietMinute)
	defer timer.Stop()
collect:
	for {
		select {
		case ev, ok := <-leases.ResultChan():
			if !ok {
				t.Fatal("lease watch closed during the quiet minute")
			}
			if l, isLease := ev.Object.(*coordinationv1.Lease); isLease && ev.Type == watch.Modified {
				renewals[l.Namespace+"/"+l.Name]++
			}
		case <-timer.C:
			break collect
		}
	}
	after := scrape(ctx, t, cs)
	logf("quiet window: %s", time.Since(begin).Round(time.Millisecond))

	writes := map[string]int{}
	var keys []string
	for k, v := range after {
		if d := int(v - before[k]); d != 0 {
			writes[k] = d
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		logf("writes during the quiet minute: %-45s %d", k, writes[k])
	}
	var leaseNames []string
	for k := range renewals {
		leaseNames = append(leaseNames, k)
	}
	sort.Strings(leaseNames)
	for _, k := range leaseNames {
		logf("lease renewals (watch): %-60s %d", k, renewals[k])
	}

	for _, k := range mustBeZero {
		if writes[k] != 0 {
			t.Errorf("%s: %d writes during the quiet minute, want 0", k, writes[k])
		}
	}
	if got := writes["quota.fairshare.dev/providerpools/status"]; got > maxPoolHeartbeats {
		t.Errorf("providerpools/status: %d writes during the quiet minute, want at most %d (the scheduler's heartbeat)", got, maxPoolHeartbeats)
	}
	// Leases: the scheduler's (leader election, renewed every retryPeriod)
	// and kube-apiserver's own identity Lease; the operator runs without
	// leader election here.
	perElector := int(quietMinute/retryPeriod) + 1
	maxLeases := perElector + int(quietMinute/apiserverLeaseRenew) + 1
	if got := writes["coordination.k8s.io/leases"]; got > maxLeases {
		t.Errorf("leases: %d writes during the quiet minute, want at most %d (%d for the scheduler's Lease + %d for kube-apiserver's)",
			got, maxLeases, perElector, maxLeases-perElector)
	}
	if !spec.Settings.LeaderElection {
		t.Fatalf("fixture: the rendered scheduler of %d replicas runs without leader election", spec.Replicas)
	}
	if got := renewals[namespace+"/"+spec.Settings.LeaseName]; got < 1 || got > perElector {
		t.Errorf("scheduler Lease %s: %d renewals, want 1..%d (one per %s)", spec.Settings.LeaseName, got, perElector, retryPeriod)
	}
	for _, k := range keys {
		switch k {
		case "coordination.k8s.io/leases", "quota.fairshare.dev/providerpools/status":
		default:
			if !contains(mustBeZero, k) {
				t.Errorf("unexpected writes to %s during the quiet minute: %d", k, writes[k])
			}
		}
	}
	sched.Stop()
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// converged returns nil when the pool is Ready and Serving and every tenant
// is Ready and Serving, each with status.observedGeneration current.
func converged(ctx context.Context, c client.Client) error {
	p := &v1alpha1.ProviderPool{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: pool}, p); err != nil {
		return err
	}
	if p.Status.ObservedGeneration != p.Generation {
		return fmt.Errorf("pool observedGeneration %d, generation %d", p.Status.ObservedGeneration, p.Generation)
	}
	for _, ct := range []string{v1alpha1.ConditionReady, v1alpha1.ConditionServing} {
		if err := conditionTrue(p.Status.Conditions, "pool", ct); err != nil {
			return err
		}
	}
	for _, name := range tenants {
		tq := &v1alpha1.TenantQuota{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, tq); err != nil {
			return err
		}
		if tq.Status.ObservedGeneration != tq.Generation {
			return fmt.Errorf("tenant %s observedGeneration %d, generation %d", name, tq.Status.ObservedGeneration, tq.Generation)
		}
		for _, ct := range []string{v1alpha1.ConditionReady, v1alpha1.ConditionServing} {
			if err := conditionTrue(tq.Status.Conditions, "tenant "+name, ct); err != nil {
				return err
			}
		}
	}
	return nil
}
