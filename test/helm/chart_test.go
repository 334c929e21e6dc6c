// Package helm tests the Helm chart charts/fairshare with the real helm binary (bin/helm,
// built by `make tools`): the alert and dashboard queries name only metrics that exist,
// values.schema.json refuses wrong values, and the chart installs onto a real local API
// server where the operator, run with the chart's arguments and RBAC, reconciles a pool.
package helm

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/yaml"

	quotav1alpha1 "github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/metrics"
	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/render"
	"github.com/fairshare-dev/fairshare/test/framework"
)

// nonDefaultValues turns every optional template of the chart on.
const nonDefaultValues = "hack/testdata/values-nondefault.yaml"

// operatorMetrics are the series of the operator (controller-runtime's registry) and of
// Prometheus itself that the chart's alerts may use, besides the scheduler's. The install
// test scrapes the real operator and checks that the controller-runtime ones exist.
var operatorMetrics = []string{
	"controller_runtime_reconcile_errors_total",
	"leader_election_master_status",
}

// prometheusMetrics are series Prometheus makes itself for every target.
var prometheusMetrics = []string{"up"}

// helmBin returns bin/helm, skipping the test when it is not built.
func helmBin(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(framework.RepoRoot(), "bin", "helm")
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("bin/helm not found: run `make tools` (or `make test-helm`): %v", err)
	}
	return bin
}

// helm runs bin/helm in the repository root and returns its combined output.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helmBin(t), args...)
	cmd.Dir = framework.RepoRoot()
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// splitDocs parses a multi-document YAML stream into generic objects, skipping empty documents.
func splitDocs(t *testing.T, manifest string) []map[string]any {
	t.Helper()
	var objs []map[string]any
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(manifest, -1) {
		var o map[string]any
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("parsing rendered YAML: %v\n%s", err, doc)
		}
		if len(o) > 0 {
			objs = append(objs, o)
		}
	}
	return objs
}

// captureRegisterer records the collectors registered on it.
type captureRegisterer struct{ collectors []prometheus.Collector }

func (c *captureRegisterer) Register(col prometheus.Collector) error {
	c.collectors = append(c.collectors, col)
	return nil
}
func (c *captureRegisterer) MustRegister(cs ...prometheus.Collector) {
	c.collectors = append(c.collectors, cs...)
}
func (c *captureRegisterer) Unregister(prometheus.Collector) bool { return false }

var fqNameRE = regexp.MustCompile(`fqName: "([^"]+)"`)

// schedulerMetricNames returns every series name the scheduler registers with
// internal/metrics.New, including the scrape-time gauges and a histogram's
// _bucket, _sum and _count series, read from the collectors' descriptions.
func schedulerMetricNames(t *testing.T) map[string]bool {
	t.Helper()
	reg := &captureRegisterer{}
	metrics.New(reg, nil)
	// The gauge collector is registered only with a snapshot function; describe it too.
	withGauges := &captureRegisterer{}
	metrics.New(withGauges, func() registry.Snapshot { return registry.Snapshot{} })
	names := map[string]bool{}
	for _, col := range withGauges.collectors {
		_, isHistogram := col.(prometheus.Histogram)
		if _, ok := col.(*prometheus.HistogramVec); ok {
			isHistogram = true
		}
		ch := make(chan *prometheus.Desc, 64)
		go func() { col.Describe(ch); close(ch) }()
		for d := range ch {
			m := fqNameRE.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("no fqName in %s", d)
			}
			names[m[1]] = true
			if isHistogram {
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					names[m[1]+suffix] = true
				}
			}
		}
	}
	if len(withGauges.collectors) != len(reg.collectors)+1 {
		t.Fatalf("metrics.New registered %d collectors with a snapshot and %d without: want one more (the gauges)",
			len(withGauges.collectors), len(reg.collectors))
	}
	return names
}

// promqlKeywords are PromQL words that are not metric names.
var promqlKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "by": true, "without": true, "on": true, "ignoring": true,
	"group_left": true, "group_right": true, "bool": true, "offset": true, "inf": true, "nan": true,
	// Aggregation operators, which may be followed by a by/without clause before "(".
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true,
}

// metricNames returns the metric names a PromQL expression selects: identifiers outside
// label matchers {...}, range selectors [...] and strings that are neither function
// calls nor keywords, and not the label list of by/without/on/ignoring/group_*.
func metricNames(expr string) []string {
	var names []string
	depthBrace, depthBracket := 0, 0
	skipLabelList := false
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			for j < len(expr) && expr[j] != c {
				if expr[j] == '\\' {
					j++
				}
				j++
			}
			i = j + 1
		case c == '{':
			depthBrace++
			i++
		case c == '}':
			depthBrace--
			i++
		case c == '[':
			depthBracket++
			i++
		case c == ']':
			depthBracket--
			i++
		case c == '(' && skipLabelList:
			j := strings.IndexByte(expr[i:], ')')
			if j < 0 {
				return names
			}
			i += j + 1
			skipLabelList = false
		case c == '_' || c == ':' || (c|0x20 >= 'a' && c|0x20 <= 'z'):
			j := i
			for j < len(expr) && (expr[j] == '_' || expr[j] == ':' || (expr[j]|0x20 >= 'a' && expr[j]|0x20 <= 'z') || (expr[j] >= '0' && expr[j] <= '9')) {
				j++
			}
			word := expr[i:j]
			i = j
			if depthBrace > 0 || depthBracket > 0 {
				continue
			}
			k := j
			for k < len(expr) && expr[k] == ' ' {
				k++
			}
			switch {
			case word == "by" || word == "without" || word == "on" || word == "ignoring" || word == "group_left" || word == "group_right":
				skipLabelList = true
			case promqlKeywords[strings.ToLower(word)]:
			case k < len(expr) && expr[k] == '(':
				// A function or aggregation call.
			default:
				names = append(names, word)
			}
		case c >= '0' && c <= '9' || c == '.':
			j := i
			for j < len(expr) && (expr[j] >= '0' && expr[j] <= '9' || expr[j] == '.' || expr[j] == 'e' || expr[j] == 'E') {
				j++
			}
			i = j
		default:
			i++
		}
	}
	return names
}

func TestMetricNamesParser(t *testing.T) {
	got := metricNames(`sum by (namespace, pool) (rate(a_total{job="x",outcome=~"failed|dropped"}[5m])) > 0.5 and on (pool) deriv(b[1h]) > 0 or absent(up{job="y"} == 1) unless histogram_quantile(0.9, sum by (le) (rate(c_bucket{pool=~"$pool"}[$__rate_interval])))`)
	want := []string{"a_total", "b", "up", "c_bucket"}
	if !slices.Equal(got, want) {
		t.Fatalf("metricNames = %q, want %q", got, want)
	}
}

// renderNonDefault renders the chart with every optional template on.
func renderNonDefault(t *testing.T) []map[string]any {
	t.Helper()
	out, err := helm(t, "template", "fairshare", "charts/fairshare", "--namespace", "fairshare-system", "-f", nonDefaultValues)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	return splitDocs(t, out)
}

func kindsOf(objs []map[string]any, kind string) []map[string]any {
	var out []map[string]any
	for _, o := range objs {
		if o["kind"] == kind {
			out = append(out, o)
		}
	}
	return out
}

func TestPrometheusRuleMetricsExist(t *testing.T) {
	known := schedulerMetricNames(t)
	for _, n := range append(slices.Clone(operatorMetrics), prometheusMetrics...) {
		known[n] = true
	}
	rules := kindsOf(renderNonDefault(t), "PrometheusRule")
	if len(rules) != 1 {
		t.Fatalf("rendered %d PrometheusRules, want 1", len(rules))
	}
	var alerts []string
	var spec struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				For         string            `json:"for"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	}
	b, _ := json.Marshal(rules[0]["spec"])
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	for _, g := range spec.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			names := metricNames(r.Expr)
			if len(names) == 0 {
				t.Errorf("alert %s: no metric name in %q", r.Alert, r.Expr)
			}
			for _, n := range names {
				if !known[n] {
					t.Errorf("alert %s: metric %q is not exported (expr %q)", r.Alert, n, r.Expr)
				}
			}
			if r.For == "" || r.Annotations["runbook_url"] != "https://docs.example.com/fairshare/operations#"+strings.ToLower(r.Alert) {
				t.Errorf("alert %s: for %q, runbook_url %q", r.Alert, r.For, r.Annotations["runbook_url"])
			}
		}
	}
	want := []string{
		"FairshareBatchBacklogGrowing", "FairshareJobsExpiring", "FairshareOperatorDown", "FairshareOperatorNoLeader",
		"FairshareOperatorReconcileErrors", "FairsharePoolPausedLong", "FairshareSchedulerAbsent", "FairshareSchedulerDown",
		"FairshareTenantUsageOutlier", "FairshareUpstreamHeadersMalformed", "FairshareUpstreamThrottled", "FairshareWebhookFailures",
	}
	sort.Strings(alerts)
	if !slices.Equal(alerts, want) {
		t.Fatalf("alerts = %q, want %q", alerts, want)
	}
	// Each alert has a runbook section in docs/operations.md.
	doc, err := os.ReadFile(filepath.Join(framework.RepoRoot(), "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range want {
		if !bytes.Contains(doc, []byte("\n### "+a+"\n")) {
			t.Errorf("docs/operations.md has no section \"### %s\"", a)
		}
	}
}

func TestDashboardMetricsExist(t *testing.T) {
	known := schedulerMetricNames(t)
	var cm map[string]any
	for _, o := range kindsOf(renderNonDefault(t), "ConfigMap") {
		if strings.HasSuffix(o["metadata"].(map[string]any)["name"].(string), "-dashboard") {
			cm = o
		}
	}
	if cm == nil {
		t.Fatal("no dashboard ConfigMap rendered")
	}
	md := cm["metadata"].(map[string]any)
	if md["namespace"] != "grafana" || md["labels"].(map[string]any)["grafana_dashboard"] != "1" {
		t.Fatalf("dashboard ConfigMap metadata = %v", md)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	data := cm["data"].(map[string]any)["fairshare.json"].(string)
	if err := json.Unmarshal([]byte(data), &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	var exprs []string
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		// label_values(<series selector>, <label>)
		if sel, ok := strings.CutPrefix(v.Definition, "label_values("); ok {
			exprs = append(exprs, sel[:strings.LastIndex(sel, ",")])
		}
	}
	seen := map[string]bool{}
	for _, e := range exprs {
		for _, n := range metricNames(e) {
			seen[n] = true
			if !known[n] {
				t.Errorf("dashboard query names metric %q, which the scheduler does not export: %q", n, e)
			}
		}
	}
	for _, n := range []string{
		"fairshare_scheduler_upstream_remaining_tokens", "fairshare_scheduler_upstream_throttled_total",
		"fairshare_scheduler_queued_jobs", "fairshare_scheduler_requests_total",
		"fairshare_scheduler_queue_wait_seconds_bucket", "fairshare_scheduler_webhook_deliveries_total",
		"fairshare_scheduler_upstream_request_duration_seconds_bucket", "fairshare_scheduler_used_weighted_tokens_total",
	} {
		if !seen[n] {
			t.Errorf("the dashboard has no panel on %s", n)
		}
	}
}

func TestSchemaRejectsWrongValues(t *testing.T) {
	for name, values := range map[string]string{
		"replicas not an integer":   "operator:\n  replicas: two\n",
		"threshold not a number":    "monitoring:\n  prometheusRule:\n    thresholds:\n      backlogMinJobs: many\n",
		"duration not a duration":   "monitoring:\n  serviceMonitor:\n    interval: 30\n",
		"unknown networkPolicy key": "networkPolicy:\n  operator:\n    enable: true\n",
		"port out of range":         "networkPolicy:\n  scheduler:\n    providerPorts: [70000]\n",
	} {
		t.Run(name, func(t *testing.T) {
			f := filepath.Join(t.TempDir(), "values.yaml")
			if err := os.WriteFile(f, []byte(values), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := helm(t, "lint", "charts/fairshare", "-f", f)
			if err == nil {
				t.Fatalf("helm lint accepted %q:\n%s", values, out)
			}
			if !strings.Contains(out, "values don't meet the specifications of the schema") {
				t.Fatalf("helm lint failed for another reason than the schema:\n%s", out)
			}
		})
	}
	// The same files' keys with the right types pass, so the failures above are the types'.
	f := filepath.Join(t.TempDir(), "values.yaml")
	good := "operator:\n  replicas: 2\nmonitoring:\n  serviceMonitor:\n    interval: 30s\n  prometheusRule:\n    thresholds:\n      backlogMinJobs: 7\n" +
		"networkPolicy:\n  operator:\n    enabled: true\n  scheduler:\n    providerPorts: [8443]\n"
	if err := os.WriteFile(f, []byte(good), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := helm(t, "lint", "charts/fairshare", "-f", f); err != nil {
		t.Fatalf("helm lint refused valid values: %v\n%s", err, out)
	}
}

// TestSchedulerSelectorsMatchRender checks that the scheduler ServiceMonitor and
// NetworkPolicies select what internal/render puts on the scheduler Service and pods:
// its labels and the Service port named "metrics".
func TestSchedulerSelectorsMatchRender(t *testing.T) {
	objs := renderNonDefault(t)
	sample, err := os.ReadFile(filepath.Join(framework.RepoRoot(), "config", "samples", "quota_v1alpha1_providerpool.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	pool := &quotav1alpha1.ProviderPool{}
	if err := yaml.Unmarshal(sample, pool); err != nil {
		t.Fatal(err)
	}
	pool.Namespace, pool.UID = "team-a", "00000000-0000-0000-0000-000000000001"
	rendered, err := render.Render(pool, render.Options{DefaultImage: "example.com/fairshare:test", SchedulerClusterRole: "fairshare-scheduler"})
	if err != nil {
		t.Fatal(err)
	}
	svc, labels := rendered.Service, rendered.Service.Labels
	podLabels := rendered.Deployment.Spec.Template.Labels
	var metricsPort int64
	for _, p := range svc.Spec.Ports {
		if p.Name == "metrics" {
			metricsPort = int64(p.Port)
		}
	}
	if metricsPort == 0 {
		t.Fatalf("render.Service has no port named metrics: %+v", svc.Spec.Ports)
	}
	matches := func(sel map[string]any, labels map[string]string) bool {
		for k, v := range sel["matchLabels"].(map[string]any) {
			if labels[k] != v {
				return false
			}
		}
		for _, e := range asSlice(sel["matchExpressions"]) {
			e := e.(map[string]any)
			if _, ok := labels[e["key"].(string)]; e["operator"] != "Exists" || !ok {
				return false
			}
		}
		return true
	}
	var schedulerSM map[string]any
	for _, o := range kindsOf(objs, "ServiceMonitor") {
		if strings.HasSuffix(o["metadata"].(map[string]any)["name"].(string), "-schedulers") {
			schedulerSM = o
		}
	}
	if schedulerSM == nil {
		t.Fatal("no scheduler ServiceMonitor rendered")
	}
	spec := schedulerSM["spec"].(map[string]any)
	if !matches(spec["selector"].(map[string]any), labels) {
		t.Errorf("scheduler ServiceMonitor selector %v does not match the rendered Service labels %v", spec["selector"], labels)
	}
	if ep := asSlice(spec["endpoints"])[0].(map[string]any); ep["port"] != "metrics" {
		t.Errorf("scheduler ServiceMonitor port = %v, want metrics", ep["port"])
	}
	if ns := spec["namespaceSelector"].(map[string]any); ns["any"] != nil || len(asSlice(ns["matchNames"])) != 2 {
		t.Errorf("scheduler ServiceMonitor namespaceSelector = %v, want matchNames [team-a team-b] only", ns)
	}
	var schedulerNP int
	for _, o := range kindsOf(objs, "NetworkPolicy") {
		spec := o["spec"].(map[string]any)
		if !strings.HasSuffix(o["metadata"].(map[string]any)["name"].(string), "-scheduler") {
			continue
		}
		schedulerNP++
		if !matches(spec["podSelector"].(map[string]any), podLabels) {
			t.Errorf("scheduler NetworkPolicy podSelector %v does not match the rendered pod labels %v", spec["podSelector"], podLabels)
		}
		var ports []int64
		for _, rule := range asSlice(spec["ingress"]) {
			for _, p := range asSlice(rule.(map[string]any)["ports"]) {
				ports = append(ports, int64(p.(map[string]any)["port"].(float64)))
			}
		}
		if !slices.Equal(ports, []int64{int64(render.HTTPPort), metricsPort}) {
			t.Errorf("scheduler NetworkPolicy ingress ports = %v, want [%d %d]", ports, render.HTTPPort, metricsPort)
		}
	}
	if schedulerNP != 2 {
		t.Errorf("rendered %d scheduler NetworkPolicies, want 2 (team-a, team-b)", schedulerNP)
	}
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}
