package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// refusesStreamOptions is an OpenAI-compatible server with strict request
// validation that does not know stream_options: 400 unknown_parameter to
// any body that carries it; otherwise it streams n deltas " x" (one
// cl100k token each), a finish chunk and [DONE], never a usage chunk.
func refusesStreamOptions(n int) func(w http.ResponseWriter, r *http.Request, body []byte) {
	return func(w http.ResponseWriter, r *http.Request, body []byte) {
		var m map[string]json.RawMessage
		_ = json.Unmarshal(body, &m)
		if _, ok := m["stream_options"]; ok {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"error":{"message":"Unknown parameter: 'stream_options'.","type":"invalid_request_error","param":"stream_options","code":"unknown_parameter"}}`)
			return
		}
		quotaHeaders(w.Header())
		w.Header().Set("Content-Type", "text/event-stream")
		for range n {
			fmt.Fprint(w, "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" x\"}}]}\n\n")
		}
		fmt.Fprint(w, "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
	}
}

// TestStreamUsageCountDeltas: spec.upstream.streamUsage. Under IncludeUsage
// (the default) the gateway adds stream_options.include_usage to a streamed
// call, so a provider that refuses the member answers 400 and the tenant is
// refunded in full; under CountDeltas the body goes upstream unchanged, the
// stream is forwarded whole, and the tenant is charged the prompt (10) plus
// the 5 deltas counted (5), not the 100 reserved. A client that asks for
// usage itself still gets its own stream_options sent and the usage chunk
// forwarded, and is settled from it.
func TestStreamUsageCountDeltas(t *testing.T) {
	const burst = 10000
	tenants := []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(60000), WeightedBurst: i64(burst)})}
	stream := completionsBody(10, 100, `,"stream":true`)

	t.Run("IncludeUsage refused by the provider", func(t *testing.T) {
		up := newUpstream(t, refusesStreamOptions(5))
		e := newEnv(t, up, tenants)
		resp := e.do("POST", "/v1/completions", "key-a", stream)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "unknown_parameter") {
			t.Fatalf("status %d, body %s; want the provider's 400 unknown_parameter", resp.StatusCode, b)
		}
		if so, ok := up.lastBody()["stream_options"].(map[string]any); !ok || so["include_usage"] != true {
			t.Errorf("upstream stream_options = %v, want include_usage true", up.lastBody()["stream_options"])
		}
		if got := e.tokensLeft("a"); got != burst {
			t.Errorf("bucket = %d, want %d (nothing generated, all refunded)", got, burst)
		}
	})

	t.Run("CountDeltas", func(t *testing.T) {
		up := newUpstream(t, refusesStreamOptions(5))
		e := newEnv(t, up, tenants, withPool(func(p *registry.PoolPolicy) { p.StreamUsage = registry.StreamUsageCountDeltas }))
		resp := e.do("POST", "/v1/completions", "key-a", stream)
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			t.Fatalf("status %d, body %s; want 200", resp.StatusCode, b)
		}
		events := readEvents(t, resp)
		if len(events) != 7 || events[6] != "[DONE]" { // 5 deltas, finish, [DONE]
			t.Fatalf("events = %q, want 7 ending in [DONE]", events)
		}
		up.mu.Lock()
		sent := string(up.bodies[0])
		up.mu.Unlock()
		if sent != stream {
			t.Errorf("upstream body %s, want the client's body unchanged %s", sent, stream)
		}
		if got, want := e.tokensLeft("a"), int64(burst-10-5); got != want {
			t.Errorf("bucket = %d, want %d (prompt 10 + 5 counted deltas)", got, want)
		}
	})

	t.Run("CountDeltas, the client asks for usage", func(t *testing.T) {
		up := newUpstream(t, sseStream(3, 10))
		e := newEnv(t, up, tenants, withPool(func(p *registry.PoolPolicy) { p.StreamUsage = registry.StreamUsageCountDeltas }))
		resp := e.do("POST", "/v1/completions", "key-a", completionsBody(10, 100, `,"stream":true,"stream_options":{"include_usage":true}`))
		events := readEvents(t, resp)
		if len(events) != 6 || !strings.Contains(events[4], `"usage"`) { // 3 tokens, finish, usage, [DONE]
			t.Fatalf("events = %q, want 6 with the usage chunk fifth", events)
		}
		if got, want := e.tokensLeft("a"), int64(burst-13); got != want {
			t.Errorf("bucket = %d, want %d (settled from the usage chunk)", got, want)
		}
	})
}
