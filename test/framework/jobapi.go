package framework

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// Helpers of the job API and the simulator's /stats for the tests that drive
// the real binaries (test/restart, test/ha).

// httpClient is the client of the job API helpers.
var httpClient = &http.Client{Timeout: 30 * time.Second}

// Do sends one request to the gateway (or the simulator) as tenant (the
// X-Fairshare-Tenant header, TrustedHeader mode) and returns the body; any
// status other than 200 or 202 fails the test.
func Do(ctx context.Context, t testing.TB, method, u, tenant, contentType string, body []byte) []byte {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("X-Fairshare-Tenant", tenant)
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusAccepted {
		t.Fatalf("%s %s as %s: %d %s", method, u, tenant, resp.StatusCode, b)
	}
	return b
}

// BulkSubmit uploads n chat completion jobs (model sim-gpt, max_tokens 32)
// for tenant as one NDJSON upload to base/v1/jobs/bulk and returns their ids;
// any refused line fails the test.
func BulkSubmit(ctx context.Context, t testing.TB, base, tenant string, n int) map[string]bool {
	t.Helper()
	var nd bytes.Buffer
	enc := json.NewEncoder(&nd)
	for i := range n {
		line := map[string]any{
			"endpoint": "/v1/chat/completions",
			"body": map[string]any{
				"model":      "sim-gpt",
				"messages":   []map[string]string{{"role": "user", "content": fmt.Sprintf("Summarise record %d of %s.", i, tenant)}},
				"max_tokens": 32,
			},
			"metadata": map[string]any{"n": i},
		}
		if err := enc.Encode(line); err != nil {
			t.Fatal(err)
		}
	}
	var out struct {
		Queued, Refused int
		Data            []struct {
			Line int
			Job  *Job
		}
	}
	if err := json.Unmarshal(Do(ctx, t, http.MethodPost, base+"/v1/jobs/bulk", tenant, "application/x-ndjson", nd.Bytes()), &out); err != nil {
		t.Fatal(err)
	}
	if out.Queued != n || out.Refused != 0 || len(out.Data) != n {
		t.Fatalf("bulk upload of %s: queued %d refused %d entries %d, want %d queued", tenant, out.Queued, out.Refused, len(out.Data), n)
	}
	ids := map[string]bool{}
	for _, d := range out.Data {
		if d.Job == nil || d.Job.ID == "" || ids[d.Job.ID] {
			t.Fatalf("bulk upload of %s: line %d has no job or a repeated id", tenant, d.Line)
		}
		ids[d.Job.ID] = true
	}
	return ids
}

// Job is the part of the job API's job object the tests read.
type Job struct {
	ID        string `json:"id"`
	Tenant    string `json:"tenant"`
	Status    string `json:"status"`
	Attempts  int    `json:"attempts"`
	Recovered bool   `json:"recovered"`
}

// ListJobs pages through GET /v1/jobs?status=... for tenant (status "" is
// every job), limit jobs a page.
func ListJobs(ctx context.Context, t testing.TB, base, tenant, status string, limit int) []Job {
	t.Helper()
	var all []Job
	after := ""
	for page := 0; ; page++ {
		if page > 1000 {
			t.Fatalf("listing %s's %q jobs did not end after 1000 pages", tenant, status)
		}
		q := url.Values{"limit": {strconv.Itoa(limit)}}
		if status != "" {
			q.Set("status", status)
		}
		if after != "" {
			q.Set("after", after)
		}
		var l struct {
			Data    []Job   `json:"data"`
			HasMore bool    `json:"has_more"`
			LastID  *string `json:"last_id"`
		}
		if err := json.Unmarshal(Do(ctx, t, http.MethodGet, base+"/v1/jobs?"+q.Encode(), tenant, "", nil), &l); err != nil {
			t.Fatal(err)
		}
		all = append(all, l.Data...)
		if !l.HasMore {
			return all
		}
		if l.LastID == nil || *l.LastID == after {
			t.Fatalf("listing %s's %q jobs: has_more without a new last_id", tenant, status)
		}
		after = *l.LastID
	}
}

// SimStats is the provider simulator's GET /stats.
type SimStats struct {
	Requests  int64 `json:"requests"`
	Succeeded int64 `json:"succeeded"`
	Throttled int64 `json:"throttled"`
}

// GetSimStats reads the simulator's GET /stats at simURL.
func GetSimStats(ctx context.Context, t testing.TB, simURL string) SimStats {
	t.Helper()
	var s SimStats
	if err := json.Unmarshal(Do(ctx, t, http.MethodGet, simURL+"/stats", "", "", nil), &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// Stack is the real control plane with the provider simulator and the
// operator running as local processes, for the tests that then run the
// scheduler themselves (test/restart, test/ha).
type Stack struct {
	// Bin is the directory of the built binaries (manager, scheduler, providersim).
	Bin string
	// CP is the kube-apiserver and etcd.
	CP *ControlPlane
	// SimURL is the simulator's base URL on 127.0.0.1.
	SimURL string
	// Operator is the manager process (leader election off).
	Operator *Process
}

// StartStack builds the binaries into work/bin, starts the control plane with
// namespace, the simulator with simArgs (its --addr is added) and the
// operator, waits for each to be ready, and registers their stop with
// t.Cleanup. Any failure fails the test.
func StartStack(ctx context.Context, t testing.TB, work, namespace string, simArgs []string, logf func(string, ...any)) *Stack {
	t.Helper()
	port := func() int {
		p, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	logf("building the binaries")
	bin, err := BuildBinaries(ctx, filepath.Join(work, "bin"))
	if err != nil {
		t.Fatal(err)
	}
	logf("starting kube-apiserver and etcd")
	cp, err := StartControlPlane(work)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Stop() })
	if err := cp.EnsureNamespace(ctx, namespace); err != nil {
		t.Fatal(err)
	}
	simPort := port()
	simURL := fmt.Sprintf("http://127.0.0.1:%d", simPort)
	sim, err := Start("providersim", work, filepath.Join(bin, "providersim"),
		append([]string{fmt.Sprintf("--addr=127.0.0.1:%d", simPort)}, simArgs...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Stop)
	if err := WaitHTTP(ctx, sim, simURL+"/healthz"); err != nil {
		t.Fatal(err)
	}
	healthPort := port()
	operator, err := Start("manager", work, filepath.Join(bin, "manager"), []string{
		"--leader-elect=false", "--metrics-bind-address=0",
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", healthPort),
	}, "KUBECONFIG="+cp.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(operator.Stop)
	if err := WaitHTTP(ctx, operator, fmt.Sprintf("http://127.0.0.1:%d/readyz", healthPort)); err != nil {
		t.Fatal(err)
	}
	return &Stack{Bin: bin, CP: cp, SimURL: simURL, Operator: operator}
}

// Apply writes manifests to work/manifests.yaml and applies them with
// kubectl in namespace.
func (s *Stack) Apply(ctx context.Context, t testing.TB, work, namespace, manifests string) {
	t.Helper()
	path := filepath.Join(work, "manifests.yaml")
	if err := os.WriteFile(path, []byte(manifests), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := Kubectl(ctx, s.CP.Kubeconfig, "apply", "-n", namespace, "-f", path); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}
