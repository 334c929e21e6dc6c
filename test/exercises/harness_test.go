package exercises

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/utils/clock"

	"github.com/fairshare-dev/fairshare/internal/gateway"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/providersim"
	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/tokencount"
)

// model is the one model of the exercise pool (the simulator serves any name).
const model = "gpt-4o-mini"

// Cost model of the exercises: the pool default (brief "cost model"; seed 002
// section 3): weighted = input x 1 + output x 4, KV block = 16 tokens.
var costModel = limiter.DefaultCostModel

func i64(v int64) *int64 { return &v }

// harness is the real data plane of one pool in this process: the provider
// simulator and the gateway, each on its own 127.0.0.1 listener, on the real
// clock.
type harness struct {
	sim    *providersim.Server
	reg    *registry.Registry
	gw     *gateway.Gateway
	url    string // the gateway's base URL
	client *http.Client
}

// newHarness starts the simulator with sim, a gateway whose pool points at
// it (the model's hints are the simulator's quota, no interactive reserve,
// the default cost model) and the given tenants, ready to serve. Everything
// stops at the end of the test.
func newHarness(t *testing.T, sim providersim.Config, tenants ...registry.TenantPolicy) *harness {
	t.Helper()
	s := providersim.New(sim)
	simSrv := httptest.NewServer(s)
	t.Cleanup(simSrv.Close)

	reg := registry.New(clock.RealClock{})
	pool := registry.PoolPolicy{
		Name:    "exercises",
		BaseURL: simSrv.URL,
		Models: []registry.ModelPolicy{{Name: model, TokensPerMinute: sim.TokensPerMinute,
			RequestsPerMinute: sim.RequestsPerMinute}},
		CostModel:       costModel,
		UpstreamTimeout: 30 * time.Second,
	}
	if err := reg.SetPool(pool); err != nil {
		t.Fatal(err)
	}
	for _, tp := range tenants {
		if err := reg.UpsertTenant(tp); err != nil {
			t.Fatal(err)
		}
	}
	reg.SetTenantsSynced()
	gw := gateway.New(gateway.Options{Registry: reg})
	srv := httptest.NewServer(gw)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = gw.Run(ctx) }()
	client := &http.Client{Transport: &http.Transport{MaxIdleConns: 64, MaxIdleConnsPerHost: 64}, Timeout: 60 * time.Second}
	t.Cleanup(func() {
		client.CloseIdleConnections()
		cancel()
		<-done
		srv.Close()
	})
	return &harness{sim: s, reg: reg, gw: gw, url: srv.URL, client: client}
}

// tenantPolicy is a tenant with limits l and API key "key-<id>".
func tenantPolicy(id string, l limiter.Limits) registry.TenantPolicy {
	return registry.TenantPolicy{ID: id, Name: id, Limits: l, Weight: 1, MaxQueued: 10,
		KeyHashes: []registry.KeyHash{registry.HashKey("key-" + id)}}
}

// chatBody is a chat completion body whose prompt is exactly prompt tokens as
// the gateway and the simulator count them (cl100k_base: " the" is one
// token; one message costs tokencount.MessageOverheadTokens and the reply
// tokencount.ReplyPrimingTokens), with the given max_tokens.
func chatBody(t *testing.T, prompt, maxTokens int64) []byte {
	t.Helper()
	content := prompt - tokencount.MessageOverheadTokens - tokencount.ReplyPrimingTokens
	text := strings.Repeat(" the", int(content))
	if n, err := tokencount.Text(text); err != nil || n != content {
		t.Fatalf("filler of %d tokens counts %d (%v)", content, n, err)
	}
	b, err := json.Marshal(map[string]any{
		"model":      model,
		"messages":   []map[string]string{{"role": "user", "content": text}},
		"max_tokens": maxTokens,
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// reply is what a client learns from one response of the gateway.
type reply struct {
	status int
	code   string // the error code of a refusal ("" on success)
	usage  limiter.Usage
	header http.Header
	err    error // transport error
}

// post sends one chat completion for tenant id and reads the reply.
func (h *harness) post(id string, body []byte) reply {
	req, err := http.NewRequest(http.MethodPost, h.url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return reply{err: err}
	}
	req.Header.Set("Authorization", "Bearer key-"+id)
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.client.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{status: resp.StatusCode, header: resp.Header, err: err}
	}
	r := reply{status: resp.StatusCode, header: resp.Header}
	if resp.StatusCode == http.StatusOK {
		var ok struct {
			Usage *struct {
				PromptTokens     int64 `json:"prompt_tokens"`
				CompletionTokens int64 `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(b, &ok); err != nil || ok.Usage == nil {
			r.err = fmt.Errorf("200 without usage: %.200s", b)
			return r
		}
		r.usage = limiter.Usage{PromptTokens: ok.Usage.PromptTokens, OutputTokens: ok.Usage.CompletionTokens, Known: true}
		return r
	}
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(b, &e)
	r.code = e.Error.Code
	if r.code == "" {
		r.code = "http_" + strconv.Itoa(resp.StatusCode)
	}
	return r
}

// retryAfter returns the reply's Retry-After in whole seconds (RFC 9110
// section 10.2.3, delay-seconds form), and whether it was present and valid.
func (r reply) retryAfter() (time.Duration, bool) {
	s := r.header.Get("Retry-After")
	n, err := strconv.ParseInt(s, 10, 64)
	if s == "" || err != nil || n < 0 {
		return 0, false
	}
	return time.Duration(n) * time.Second, true
}

// tally counts one client's outcome. Safe for concurrent use.
type tally struct {
	mu                sync.Mutex
	sent, ok          int64
	rejected          map[string]int64 // by error code
	transportErrors   int64
	prompt, output    int64 // provider tokens of the successful calls, from usage
	firstSent, lastOK time.Time
}

func (t *tally) add(r reply, sentAt time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.rejected == nil {
		t.rejected = map[string]int64{}
	}
	if t.firstSent.IsZero() || sentAt.Before(t.firstSent) {
		t.firstSent = sentAt
	}
	t.sent++
	switch {
	case r.err != nil:
		t.transportErrors++
	case r.status == http.StatusOK:
		t.ok++
		t.lastOK = time.Now()
		t.prompt += r.usage.PromptTokens
		t.output += r.usage.OutputTokens
	default:
		t.rejected[r.code]++
	}
}

// elapsed is the time from the first request sent to the last success.
func (t *tally) elapsed() time.Duration {
	if t.lastOK.IsZero() {
		return 0
	}
	return t.lastOK.Sub(t.firstSent)
}

// weighted is the weighted tokens of the successful calls (input x 1 +
// output x 4).
func (t *tally) weighted() int64 { return costModel.Weighted(t.prompt, t.output) }

// provider is the provider tokens of the successful calls (prompt + output).
func (t *tally) provider() int64 { return t.prompt + t.output }

// rejections is the number of refusals of any code.
func (t *tally) rejections() int64 {
	var n int64
	for _, v := range t.rejected {
		n += v
	}
	return n
}

// codes renders the refusals by code, sorted, e.g. "request_rate_limit=12".
func (t *tally) codes() string {
	if len(t.rejected) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(t.rejected))
	for k := range t.rejected {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, t.rejected[k])
	}
	return strings.Join(parts, " ")
}

// sleepUntil sleeps d, but not past deadline; false when deadline has passed.
func sleepUntil(d time.Duration, deadline time.Time) bool {
	if left := time.Until(deadline); d > left {
		d = left
	}
	if d > 0 {
		time.Sleep(d)
	}
	return time.Now().Before(deadline)
}

// ratio is a/b, or +Inf when b is 0.
func ratio(a, b int64) float64 {
	if b == 0 {
		return math.Inf(1)
	}
	return float64(a) / float64(b)
}
