package gateway

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// TestModelsRoutes: GET /v1/models lists the pool's models in spec order to
// an identified tenant and GET /v1/models/{model} (a name with a slash
// included) answers one, without an upstream call; an unknown model is 404
// model_not_found naming "model", a missing key 401 invalid_api_key, a POST
// 405 with Allow: GET, HEAD.
func TestModelsRoutes(t *testing.T) {
	up := newUpstream(t, okJSON(1, 1))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})}, withPool(func(p *registry.PoolPolicy) {
		p.Models = []registry.ModelPolicy{{Name: testModel}, {Name: "meta-llama/Llama-3.1-8B-Instruct"}}
	}))
	resp := e.do("GET", "/v1/models", "key-a", "")
	list := decode[modelList](t, resp)
	want := modelList{Object: "list", Data: []modelObject{
		{ID: testModel, Object: "model", OwnedBy: "fairshare"},
		{ID: "meta-llama/Llama-3.1-8B-Instruct", Object: "model", OwnedBy: "fairshare"},
	}}
	if resp.StatusCode != 200 {
		t.Fatalf("GET /v1/models: %d", resp.StatusCode)
	}
	if d := cmp.Diff(want, list); d != "" {
		t.Errorf("GET /v1/models (-want +got):\n%s", d)
	}
	resp = e.do("GET", "/v1/models/meta-llama/Llama-3.1-8B-Instruct", "key-a", "")
	if got := decode[modelObject](t, resp); resp.StatusCode != 200 || got != want.Data[1] {
		t.Errorf("GET one model: %d %+v, want 200 %+v", resp.StatusCode, got, want.Data[1])
	}
	resp = e.do("GET", "/v1/models/gpt-unknown", "key-a", "")
	if got := decode[errorBody](t, resp); resp.StatusCode != 404 || got.Error.Code != "model_not_found" || got.Error.Param == nil || *got.Error.Param != "model" {
		t.Errorf("GET unknown model: %d %+v, want 404 model_not_found param model", resp.StatusCode, got.Error)
	}
	resp = e.do("GET", "/v1/models", "key-wrong", "")
	if got := decode[errorBody](t, resp); resp.StatusCode != 401 || got.Error.Code != "invalid_api_key" {
		t.Errorf("GET /v1/models with a wrong key: %d %+v, want 401 invalid_api_key", resp.StatusCode, got.Error)
	}
	resp = e.do("POST", "/v1/models", "key-a", "{}")
	readAll(t, resp)
	if resp.StatusCode != 405 || resp.Header.Get("Allow") != "GET, HEAD" {
		t.Errorf("POST /v1/models: %d Allow %q, want 405 \"GET, HEAD\"", resp.StatusCode, resp.Header.Get("Allow"))
	}
	if up.calls.Load() != 0 {
		t.Errorf("%d upstream calls, want 0", up.calls.Load())
	}
}
