package gateway

import (
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// TestRemovedModelLeavesNoSeries: a model taken out of the pool (a live
// reload of spec.models) must not keep its upstream series (responses,
// durations) exported until the scheduler restarts; a model added again
// counts from zero.
func TestRemovedModelLeavesNoSeries(t *testing.T) {
	up := newUpstream(t, okJSON(10, 5))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
	resp := e.do("POST", "/v1/completions", "key-a", completionsBody(10, 20, ""))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("call: %d %s", resp.StatusCode, readAll(t, resp))
	}
	readAll(t, resp)
	m := e.gw.metrics
	if n := testutil.CollectAndCount(m.UpstreamResponses); n != 1 {
		t.Fatalf("upstream_responses_total series before the reload: %d, want 1", n)
	}
	pool := *e.reg.Pool()
	pool.Models = []registry.ModelPolicy{{Name: "gpt-other", TokensPerMinute: 1000000, RequestsPerMinute: 10000}}
	if err := e.reg.SetPool(pool); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(m.UpstreamResponses); n != 0 {
		t.Errorf("upstream_responses_total series after %s left the pool: %d, want 0", testModel, n)
	}
	if n := testutil.CollectAndCount(m.UpstreamDuration); n != 0 {
		t.Errorf("upstream_request_duration_seconds series after %s left the pool: %d, want 0", testModel, n)
	}
	// Added again: a fresh series that counts.
	pool.Models = append(pool.Models, registry.ModelPolicy{Name: testModel, TokensPerMinute: 1000000, RequestsPerMinute: 10000})
	if err := e.reg.SetPool(pool); err != nil {
		t.Fatal(err)
	}
	resp = e.do("POST", "/v1/completions", "key-a", completionsBody(10, 20, ""))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("call after the model is back: %d %s", resp.StatusCode, readAll(t, resp))
	}
	readAll(t, resp)
	if got := testutil.ToFloat64(m.UpstreamResponses.WithLabelValues(testModel, "200")); got != 1 {
		t.Errorf("upstream_responses_total{model=%q,code=\"200\"} after the model is back: %v, want 1", testModel, got)
	}
}
