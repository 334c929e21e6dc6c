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
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/yaml"

	quotav1alpha1 "github.com/fairshare-dev/fairshare/api/v1alpha1"
	rbacconfig "github.com/fairshare-dev/fairshare/config/rbac"
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
	for name, tc := range map[string]struct{ values, at string }{
		"replicas not an integer":           {"operator:\n  replicas: two\n", "/operator/replicas"},
		"threshold not a number":            {"monitoring:\n  prometheusRule:\n    thresholds:\n      backlogMinJobs: many\n", "/monitoring/prometheusRule/thresholds/backlogMinJobs"},
		"duration not a duration":           {"monitoring:\n  serviceMonitor:\n    interval: 30\n", "/monitoring/serviceMonitor/interval"},
		"unknown networkPolicy key":         {"networkPolicy:\n  operator:\n    enable: true\n", "/networkPolicy/operator"},
		"port out of range":                 {"networkPolicy:\n  scheduler:\n    providerPorts: [70000]\n", "/networkPolicy/scheduler/providerPorts/0"},
		"scheduler image with a space":      {"operator:\n  schedulerImage: bad image\n", "/operator/schedulerImage"},
		"scheduler image with an empty tag": {"operator:\n  schedulerImage: 'registry.example.com/fairshare:'\n", "/operator/schedulerImage"},
		"repository in upper case":          {"image:\n  repository: ghcr.io/Fairshare-Dev/fairshare\n", "/image/repository"},
		"repository with a tag":             {"image:\n  repository: ghcr.io/fairshare-dev/fairshare:v1\n", "/image/repository"},
		"tag with a colon":                  {"image:\n  tag: v1:latest\n", "/image/tag"},
		"digest without its algorithm":      {"image:\n  digest: " + strings.Repeat("0f", 32) + "\n", "/image/digest"},
		"digest too short":                  {"image:\n  digest: sha256:0f0f\n", "/image/digest"},
		"duration units out of order":       {"monitoring:\n  serviceMonitor:\n    interval: 30s1m\n", "/monitoring/serviceMonitor/interval"},
		"empty duration":                    {"monitoring:\n  serviceMonitor:\n    interval: ''\n", "/monitoring/serviceMonitor/interval"},
		// An empty port list would render an egress rule of no ports and no
		// peers, which Kubernetes reads as "any destination, any port".
		"no provider port":       {"networkPolicy:\n  scheduler:\n    providerPorts: []\n", "/networkPolicy/scheduler/providerPorts"},
		"no scheduler API port":  {"networkPolicy:\n  scheduler:\n    apiServerPorts: []\n", "/networkPolicy/scheduler/apiServerPorts"},
		"no operator API port":   {"networkPolicy:\n  operator:\n    apiServerPorts: []\n", "/networkPolicy/operator/apiServerPorts"},
		"pod annotation a bool":  {"operator:\n  podAnnotations:\n    prometheus.io/scrape: true\n", "/operator/podAnnotations/prometheus.io~1scrape"},
		"node selector a number": {"operator:\n  nodeSelector:\n    zone: 1\n", "/operator/nodeSelector/zone"},
		"SA annotation a number": {"serviceAccount:\n  annotations:\n    eks.amazonaws.com/role-arn: 12\n", "/serviceAccount/annotations/eks.amazonaws.com~1role-arn"},
	} {
		t.Run(name, func(t *testing.T) {
			f := filepath.Join(t.TempDir(), "values.yaml")
			if err := os.WriteFile(f, []byte(tc.values), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := helm(t, "lint", "charts/fairshare", "-f", f)
			if err == nil {
				t.Fatalf("helm lint accepted %q:\n%s", tc.values, out)
			}
			if !strings.Contains(out, "values don't meet the specifications of the schema") || !strings.Contains(out, "- at '"+tc.at+"': ") {
				t.Fatalf("helm lint did not refuse %s by the schema:\n%s", tc.at, out)
			}
		})
	}
	// The message of a malformed image reference names the value and what was given.
	if out, err := renderChartErr(t, "--set", "operator.schedulerImage=bad image"); err == nil || !strings.Contains(out, "- at '/operator/schedulerImage': 'bad image' does not match pattern '^(") {
		t.Errorf("helm template with operator.schedulerImage=\"bad image\": %v\n%s", err, out)
	}
	// The same files' keys with the right types pass, so the failures above are the types'.
	f := filepath.Join(t.TempDir(), "values.yaml")
	good := "image:\n  repository: registry.example.com:5000/platform/fairshare\n  tag: v0.1.0-rc.1\n" +
		"operator:\n  replicas: 2\n  schedulerImage: registry.example.com:5000/platform/fairshare@sha256:" + strings.Repeat("0f", 32) + "\nmonitoring:\n  serviceMonitor:\n    interval: 1m30s\n    scrapeTimeout: 10s\n  prometheusRule:\n    thresholds:\n      backlogMinJobs: 7\n" +
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

// renderChart renders the chart as release "f" in namespace "fs" with the given extra helm
// arguments (--set ...), failing the test if helm refuses.
func renderChart(t *testing.T, args ...string) []map[string]any {
	t.Helper()
	out, err := renderChartErr(t, args...)
	if err != nil {
		t.Fatalf("helm template %q: %v\n%s", args, err, out)
	}
	return splitDocs(t, out)
}

// renderChartErr is renderChart returning helm's output and error instead of failing.
func renderChartErr(t *testing.T, args ...string) (string, error) {
	t.Helper()
	return helm(t, append([]string{"template", "f", "charts/fairshare", "--namespace", "fs"}, args...)...)
}

// objectNamed returns the rendered object of that kind and name, or nil.
func objectNamed(objs []map[string]any, kind, name string) map[string]any {
	for _, o := range kindsOf(objs, kind) {
		if o["metadata"].(map[string]any)["name"] == name {
			return o
		}
	}
	return nil
}

// field follows a path of map keys and slice indexes through a rendered object.
func field(o any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := o.(map[string]any)
			o = m[k]
		case int:
			s := asSlice(o)
			if k >= len(s) {
				return nil
			}
			o = s[k]
		}
	}
	return o
}

// renderNotes renders the chart's NOTES.txt (which helm template leaves out) with the given
// extra helm arguments: it renders a copy of the chart with one more template that holds the
// notes evaluated with tpl.
func renderNotes(t *testing.T, args ...string) string {
	t.Helper()
	chart := filepath.Join(t.TempDir(), "fairshare")
	if err := os.CopyFS(chart, os.DirFS(filepath.Join(framework.RepoRoot(), "charts", "fairshare"))); err != nil {
		t.Fatal(err)
	}
	notes, err := os.ReadFile(filepath.Join(chart, "templates", "NOTES.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(chart, "notes.txt"), notes, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(chart, "templates", "zz-notes.yaml"), []byte(`notes: {{ tpl (.Files.Get "notes.txt") . | toJson }}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := helm(t, append([]string{"template", "f", chart, "--namespace", "fs", "--show-only", "templates/zz-notes.yaml"}, args...)...)
	if err != nil {
		t.Fatalf("rendering NOTES.txt: %v\n%s", err, out)
	}
	var doc struct {
		Notes string `json:"notes"`
	}
	if err := yaml.Unmarshal([]byte(out), &doc); err != nil || doc.Notes == "" {
		t.Fatalf("rendering NOTES.txt: %v\n%s", err, out)
	}
	return doc.Notes
}

// TestChartServiceAccountName checks that the operator runs as, and the chart's ClusterRole and
// leader-election Role are bound to, serviceAccount.name or else the release's full name, whether
// the chart creates the ServiceAccount or not: never the namespace's "default" ServiceAccount.
func TestChartServiceAccountName(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		want    string
		created bool
	}{
		{"created, default name", nil, "f-fairshare", true},
		{"created, named", []string{"--set", "serviceAccount.name=fairshare-operator"}, "fairshare-operator", true},
		{"existing, default name", []string{"--set", "serviceAccount.create=false"}, "f-fairshare", false},
		{"existing, named", []string{"--set", "serviceAccount.create=false", "--set", "serviceAccount.name=platform-sa"}, "platform-sa", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := renderChart(t, tc.args...)
			if got := field(objectNamed(objs, "Deployment", "f-fairshare"), "spec", "template", "spec", "serviceAccountName"); got != tc.want {
				t.Errorf("Deployment serviceAccountName = %v, want %s", got, tc.want)
			}
			for _, b := range []struct{ kind, name string }{
				{"ClusterRoleBinding", "f-fairshare-manager"},
				{"RoleBinding", "f-fairshare-leader-election"},
			} {
				subjects := asSlice(field(objectNamed(objs, b.kind, b.name), "subjects"))
				want := []any{map[string]any{"kind": "ServiceAccount", "name": tc.want, "namespace": "fs"}}
				if !reflect.DeepEqual(subjects, want) {
					t.Errorf("%s %s subjects = %v, want %v", b.kind, b.name, subjects, want)
				}
			}
			var names []string
			for _, sa := range kindsOf(objs, "ServiceAccount") {
				names = append(names, field(sa, "metadata", "name").(string))
			}
			var want []string
			if tc.created {
				want = []string{tc.want}
			}
			if !slices.Equal(names, want) {
				t.Errorf("rendered ServiceAccounts %q, want %q", names, want)
			}
			notice := "The operator runs as ServiceAccount " + tc.want + " (serviceAccount.create=false): create it in\nnamespace fs if it does not exist yet"
			if notes := renderNotes(t, tc.args...); strings.Contains(notes, notice) == tc.created {
				t.Errorf("install notes with created=%v, want the notice %q only when not created:\n%s", tc.created, notice, notes)
			}
		})
	}
}

// TestChartImage checks the operator's image and the scheduler image it passes to the operator:
// repository:appVersion by default, repository:tag with image.tag, repository@digest with
// image.digest (which wins over a tag), and operator.schedulerImage for the schedulers alone.
func TestChartImage(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	for _, tc := range []struct {
		name                string
		args                []string
		operator, scheduler string
	}{
		{"defaults", nil, "ghcr.io/fairshare-dev/fairshare:" + chartAppVersion(t), "ghcr.io/fairshare-dev/fairshare:" + chartAppVersion(t)},
		{"tag", []string{"--set", "image.tag=v1.2.3"}, "ghcr.io/fairshare-dev/fairshare:v1.2.3", "ghcr.io/fairshare-dev/fairshare:v1.2.3"},
		{"digest wins over the tag", []string{"--set", "image.tag=v1.2.3", "--set", "image.digest=" + digest},
			"ghcr.io/fairshare-dev/fairshare@" + digest, "ghcr.io/fairshare-dev/fairshare@" + digest},
		{"scheduler image apart", []string{"--set", "image.digest=" + digest, "--set", "operator.schedulerImage=registry.example.com/fs:v2"},
			"ghcr.io/fairshare-dev/fairshare@" + digest, "registry.example.com/fs:v2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := field(objectNamed(renderChart(t, tc.args...), "Deployment", "f-fairshare"), "spec", "template", "spec", "containers", 0)
			if got := field(c, "image"); got != tc.operator {
				t.Errorf("operator image = %v, want %s", got, tc.operator)
			}
			if arg := "--scheduler-image=" + tc.scheduler; !slices.Contains(asSlice(field(c, "args")), any(arg)) {
				t.Errorf("operator args %v lack %s", field(c, "args"), arg)
			}
		})
	}
}

// chartAppVersion is Chart.yaml's appVersion.
func chartAppVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(framework.RepoRoot(), "charts", "fairshare", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &c); err != nil || c.AppVersion == "" {
		t.Fatalf("Chart.yaml appVersion: %v", err)
	}
	return c.AppVersion
}

// TestChartRefusesContradictoryValues checks that values which would render without error but
// not do what they ask are refused, with a message naming the values involved, and that the
// nearest values that make sense are accepted.
func TestChartRefusesContradictoryValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"replicas without leader election",
			[]string{"--set", "operator.replicas=3", "--set", "operator.leaderElect=false"},
			"operator.replicas=3 needs operator.leaderElect=true: without leader election every replica reconciles the same pools at once. Set operator.leaderElect=true or operator.replicas=1."},
		{"operator ServiceMonitor without metrics",
			[]string{"--set", "metrics.port=0", "--set", "monitoring.serviceMonitor.enabled=true"},
			"monitoring.serviceMonitor.enabled=true needs metrics.port > 0: with metrics.port=0 the operator serves no metrics to scrape."},
		{"metrics Service without metrics",
			[]string{"--set", "metrics.port=0", "--set", "metrics.service.enabled=true"},
			"metrics.service.enabled=true needs metrics.port > 0: with metrics.port=0 the operator serves no metrics for the Service to expose."},
		{"operator scrape timeout above the interval",
			[]string{"--set", "monitoring.serviceMonitor.enabled=true", "--set", "monitoring.serviceMonitor.interval=1m", "--set", "monitoring.serviceMonitor.scrapeTimeout=1m500ms"},
			"monitoring.serviceMonitor.scrapeTimeout (1m500ms) must not exceed monitoring.serviceMonitor.interval (1m): Prometheus refuses a scrape timeout longer than the interval."},
		{"scheduler scrape timeout above the interval",
			[]string{"--set", "monitoring.schedulerServiceMonitor.enabled=true", "--set", "monitoring.schedulerServiceMonitor.scrapeTimeout=20s"},
			"monitoring.schedulerServiceMonitor.scrapeTimeout (20s) must not exceed monitoring.schedulerServiceMonitor.interval (15s): Prometheus refuses a scrape timeout longer than the interval."},
		{"metrics on the health probe port",
			[]string{"--set", "metrics.port=8081"},
			"metrics.port=8081 is the operator's health probe port (/healthz, /readyz): the operator could not bind both and would exit at start. Choose another port (the default is 8080)."},
		{"the namespace's default ServiceAccount",
			[]string{"--set", "serviceAccount.create=false", "--set", "serviceAccount.name=default"},
			"serviceAccount.name=default is the namespace's default ServiceAccount, which every pod of the namespace without one of its own runs as: they would all get the operator's ClusterRole. Name another ServiceAccount, or leave serviceAccount.name empty for the release's full name."},
		{"scheduler NetworkPolicy without namespaces",
			[]string{"--set", "networkPolicy.scheduler.enabled=true"},
			"networkPolicy.scheduler.enabled=true needs networkPolicy.scheduler.namespaces: list the namespaces of your ProviderPools (a NetworkPolicy selects only the pods of its own namespace)."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := renderChartErr(t, tc.args...)
			if err == nil {
				t.Fatalf("helm template %q rendered:\n%s", tc.args, out)
			}
			if !strings.Contains(out, "): "+tc.want+"\n") {
				t.Fatalf("helm template %q failed with\n%s\nwant the message\n%s", tc.args, out, tc.want)
			}
		})
	}
	// (helm install and upgrade refuse them the same way; helm lint only reports a template's
	// fail as [INFO].)

	// Accepted: one replica without leader election; a scrape timeout equal to the interval,
	// or shorter in another unit; metrics.port=0 with the PrometheusRule, whose operator alerts
	// are then left out; a scheduler NetworkPolicy with a namespace.
	objs := renderChart(t, "--set", "operator.replicas=1", "--set", "operator.leaderElect=false")
	if args := asSlice(field(objectNamed(objs, "Deployment", "f-fairshare"), "spec", "template", "spec", "containers", 0, "args")); !slices.Contains(args, any("--leader-elect=false")) {
		t.Errorf("operator args = %v, want --leader-elect=false", args)
	}
	// operator.skipRBACCheck passes --skip-rbac-check; by default the operator checks its RBAC.
	for _, tc := range []struct {
		set  []string
		want bool
	}{{nil, false}, {[]string{"--set", "operator.skipRBACCheck=true"}, true}} {
		args := asSlice(field(objectNamed(renderChart(t, tc.set...), "Deployment", "f-fairshare"), "spec", "template", "spec", "containers", 0, "args"))
		if got := slices.Contains(args, any("--skip-rbac-check")); got != tc.want {
			t.Errorf("%v: operator args = %v, --skip-rbac-check present %v, want %v", tc.set, args, got, tc.want)
		}
	}
	objs = renderChart(t, "--set", "monitoring.serviceMonitor.enabled=true", "--set", "monitoring.serviceMonitor.interval=1m30s", "--set", "monitoring.serviceMonitor.scrapeTimeout=90s",
		"--set", "monitoring.schedulerServiceMonitor.enabled=true", "--set", "monitoring.schedulerServiceMonitor.interval=1h", "--set", "monitoring.schedulerServiceMonitor.scrapeTimeout=59m59s999ms")
	if got := field(objectNamed(objs, "ServiceMonitor", "f-fairshare-operator"), "spec", "endpoints", 0, "scrapeTimeout"); got != "90s" {
		t.Errorf("operator ServiceMonitor scrapeTimeout = %v, want 90s", got)
	}
	if got := field(objectNamed(objs, "ServiceMonitor", "f-fairshare-schedulers"), "spec", "endpoints", 0, "scrapeTimeout"); got != "59m59s999ms" {
		t.Errorf("scheduler ServiceMonitor scrapeTimeout = %v, want 59m59s999ms", got)
	}
	objs = renderChart(t, "--set", "metrics.port=0", "--set", "monitoring.prometheusRule.enabled=true")
	var groups []any
	for _, g := range asSlice(field(objectNamed(objs, "PrometheusRule", "f-fairshare"), "spec", "groups")) {
		groups = append(groups, field(g, "name"))
	}
	if !slices.Equal(groups, []any{"fairshare-scheduler"}) {
		t.Errorf("PrometheusRule groups with metrics.port=0 = %v, want [fairshare-scheduler]", groups)
	}
	if len(kindsOf(objs, "Service")) != 0 || len(kindsOf(objs, "ServiceMonitor")) != 0 {
		t.Errorf("metrics.port=0 rendered a Service or ServiceMonitor")
	}
	objs = renderChart(t, "--set", "networkPolicy.scheduler.enabled=true", "--set", "networkPolicy.scheduler.namespaces={team-a}")
	if np := objectNamed(objs, "NetworkPolicy", "f-fairshare-scheduler"); field(np, "metadata", "namespace") != "team-a" {
		t.Errorf("scheduler NetworkPolicy = %v, want one in team-a", np)
	}
}

// TestChartNotesPoolUsesTheSecret checks that the ProviderPool the install notes point to is a
// production one (a real provider over HTTPS, tenants identified by API key) that sends the
// provider key Secret the notes tell the user to create.
func TestChartNotesPoolUsesTheSecret(t *testing.T) {
	notes := renderNotes(t)
	m := regexp.MustCompile(`kubectl create secret generic (\S+) --from-literal=([^=\s]+)=`).FindStringSubmatch(notes)
	if m == nil {
		t.Fatalf("the notes create no provider key Secret:\n%s", notes)
	}
	secret, key := m[1], m[2]
	const repoURL = "https://raw.githubusercontent.com/fairshare-dev/fairshare/main/"
	u := regexp.MustCompile(regexp.QuoteMeta(repoURL) + `(\S+providerpool\.yaml)`).FindStringSubmatch(notes)
	if u == nil {
		t.Fatalf("the notes point to no ProviderPool sample:\n%s", notes)
	}
	if want := "kubectl apply -f " + filepath.Base(u[1]) + "\n"; !strings.Contains(notes, want) {
		t.Errorf("the notes do not apply the downloaded pool (%q):\n%s", want, notes)
	}
	b, err := os.ReadFile(filepath.Join(framework.RepoRoot(), filepath.FromSlash(u[1])))
	if err != nil {
		t.Fatalf("the notes point to %s, which is not in the repository: %v", u[1], err)
	}
	pool := &quotav1alpha1.ProviderPool{}
	if err := yaml.UnmarshalStrict(b, pool); err != nil {
		t.Fatalf("%s: %v", u[1], err)
	}
	ref := pool.Spec.Upstream.CredentialsSecretRef
	if ref == nil {
		t.Fatalf("%s has no spec.upstream.credentialsSecretRef: the Secret %q would never be used", u[1], secret)
	}
	refKey := ref.Key
	if refKey == "" {
		refKey = "api-key" // the CRD's default
	}
	if ref.Name != secret || refKey != key {
		t.Errorf("%s sends Secret %q key %q upstream; the notes create Secret %q key %q", u[1], ref.Name, refKey, secret, key)
	}
	if !strings.HasPrefix(pool.Spec.Upstream.BaseURL, "https://") {
		t.Errorf("%s: baseURL %q is not a provider over HTTPS", u[1], pool.Spec.Upstream.BaseURL)
	}
	if mode := pool.Spec.TenantIdentification.Mode; mode != "" && mode != quotav1alpha1.IdentifyByAPIKey {
		t.Errorf("%s identifies tenants by %s, want APIKey", u[1], mode)
	}
	if want := pool.Name; !strings.Contains(notes, `ProviderPool "`+want+`"`) {
		t.Errorf("the notes do not name the pool %q:\n%s", want, notes)
	}
}

// TestValuesCommentsNameRealFields checks that every spec.* field the comments of values.yaml
// mention is a field of the ProviderPool or TenantQuota CRD.
func TestValuesCommentsNameRealFields(t *testing.T) {
	fields := map[string]bool{}
	var walk func(prefix string, schema map[string]any)
	walk = func(prefix string, schema map[string]any) {
		props, _ := schema["properties"].(map[string]any)
		for name, sub := range props {
			fields[prefix+name] = true
			if m, ok := sub.(map[string]any); ok {
				walk(prefix+name+".", m)
				if items, ok := m["items"].(map[string]any); ok {
					walk(prefix+name+".", items)
				}
			}
		}
	}
	crds, err := filepath.Glob(filepath.Join(framework.RepoRoot(), "config", "crd", "bases", "*.yaml"))
	if err != nil || len(crds) == 0 {
		t.Fatalf("no CRDs in config/crd/bases: %v", err)
	}
	for _, f := range crds {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var crd struct {
			Spec struct {
				Versions []struct {
					Schema struct {
						OpenAPIV3Schema map[string]any `json:"openAPIV3Schema"`
					} `json:"schema"`
				} `json:"versions"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal(b, &crd); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, v := range crd.Spec.Versions {
			walk("", v.Schema.OpenAPIV3Schema)
		}
	}
	values, err := os.ReadFile(filepath.Join(framework.RepoRoot(), "charts", "fairshare", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var mentions []string
	for _, line := range strings.Split(string(values), "\n") {
		if _, comment, ok := strings.Cut(line, "#"); ok {
			mentions = append(mentions, regexp.MustCompile(`\bspec(\.[a-zA-Z]+)+`).FindAllString(comment, -1)...)
		}
	}
	if len(mentions) == 0 {
		t.Fatal("values.yaml mentions no spec field: the pattern is wrong")
	}
	for _, m := range mentions {
		if !fields[m] {
			t.Errorf("values.yaml mentions %s, which neither CRD has", m)
		}
	}
}

// TestChartLeaderElectionRoleMatchesConfig: the chart's leader election Role
// (templates/rbac/bindings.yaml, written by hand) grants exactly the rules of
// config/rbac/leader_election_role.yaml, the Role the operator checks at
// start (internal/rbaccheck): a drift would make a chart-installed operator
// refuse to start, or grant more than it needs.
func TestChartLeaderElectionRoleMatchesConfig(t *testing.T) {
	role := objectNamed(renderChart(t), "Role", "f-fairshare-leader-election")
	if role == nil {
		t.Fatal("no Role f-fairshare-leader-election in the rendered chart")
	}
	var want map[string]any
	if err := yaml.Unmarshal(rbacconfig.LeaderElectionRole, &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(role["rules"], want["rules"]) {
		t.Errorf("chart leader election Role rules %v, want config/rbac/leader_election_role.yaml's %v", role["rules"], want["rules"])
	}
}
