package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/throttle"
	"github.com/fairshare-dev/fairshare/internal/tokencount"
)

// tenantSnap returns the registry snapshot of tenant id.
func (e *env) tenantSnap(id string) registry.TenantSnapshot {
	e.t.Helper()
	for _, ts := range e.reg.Snapshot(e.clock.Now()).Tenants {
		if ts.ID == id {
			return ts
		}
	}
	e.t.Fatalf("tenant %q not in the snapshot", id)
	return registry.TenantSnapshot{}
}

// TestReviewDryRunBudgetRefusalChargesNothing: a DryRun tenant's call that
// Enforce would refuse with budget_exhausted must not be charged to the
// limiter (api.md spec.mode: "admitted without being charged to the
// limiter, so the figures stay those of Enforce"). Bucket 10 000, budget
// 700: the first call of 500 is charged, the second would be refused by
// the budget, so the bucket must read 9 500 as under Enforce.
func TestReviewDryRunBudgetRefusalChargesNothing(t *testing.T) {
	up := newUpstream(t, noUsageJSON)
	tp := tenant("a", limiter.Limits{WeightedPerMinute: i64(60_000), WeightedBurst: i64(10_000)})
	tp.DryRun = true
	tp.Budget = &registry.BudgetPolicy{WeightedTokens: 700, Period: registry.BudgetDay}
	e := newEnv(t, up, []registry.TenantPolicy{tp})
	for i := range 2 {
		resp := e.do("POST", "/v1/completions", "key-a", completionsBody(100, 400, ""))
		if b := readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("call %d: %d %s", i, resp.StatusCode, b)
		}
	}
	if got := e.tokensLeft("a"); got != 9_500 {
		t.Errorf("bucket = %d, want 9500: Enforce would have refused the second call, so DryRun must not charge it", got)
	}
	if got, _ := e.gw.metrics.Tenant(e.reg.Tenant("a")).Charged().Value(); got != 500 {
		t.Errorf("charged_weighted_tokens_total = %v, want 500", got)
	}
}

// TestReviewDryRunCountedOnce: a DryRun call that both the budget and the
// token bucket would refuse is ONE would-be refusal, with the code Enforce
// would answer (budget_exhausted: the budget is checked first).
func TestReviewDryRunCountedOnce(t *testing.T) {
	up := newUpstream(t, noUsageJSON)
	tp := tenant("a", limiter.Limits{WeightedPerMinute: i64(60_000), WeightedBurst: i64(600)})
	tp.DryRun = true
	tp.Budget = &registry.BudgetPolicy{WeightedTokens: 700, Period: registry.BudgetDay}
	e := newEnv(t, up, []registry.TenantPolicy{tp})
	for i := range 2 {
		resp := e.do("POST", "/v1/completions", "key-a", completionsBody(100, 400, ""))
		if b := readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("call %d: %d %s", i, resp.StatusCode, b)
		}
	}
	if got := e.tenantSnap("a").DryRunRejections; got != 1 {
		t.Errorf("dryRunRejections = %d, want 1 (one request, one would-be refusal)", got)
	}
	if got := testutil.ToFloat64(e.gw.metrics.DryRunRejections.WithLabelValues("a", "budget_exhausted")); got != 1 {
		t.Errorf("dry_run_rejections_total{budget_exhausted} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(e.gw.metrics.DryRunRejections.WithLabelValues("a", "token_rate_limit")); got != 0 {
		t.Errorf("dry_run_rejections_total{token_rate_limit} = %v, want 0 (Enforce answers budget_exhausted)", got)
	}
}

// TestReviewDryRunReasonIsTheCodeEnforceAnswers: a call costing more than
// the whole budget is 413 request_too_large under Enforce; under DryRun
// the metric's reason must be that code (operations.md: "reason is the
// error code it would have answered").
func TestReviewDryRunReasonIsTheCodeEnforceAnswers(t *testing.T) {
	up := newUpstream(t, noUsageJSON)
	tp := tenant("a", limiter.Limits{})
	tp.Budget = &registry.BudgetPolicy{WeightedTokens: 1000, Period: registry.BudgetDay}
	enf := newEnv(t, up, []registry.TenantPolicy{tp})
	resp := enf.do("POST", "/v1/completions", "key-a", completionsBody(600, 500, ""))
	body := readAll(t, resp)
	if resp.StatusCode != 413 || decodeCode(body) != "request_too_large" {
		t.Fatalf("Enforce: %d %s, want 413 request_too_large", resp.StatusCode, body)
	}
	tp.DryRun = true
	dry := newEnv(t, up, []registry.TenantPolicy{tp})
	resp = dry.do("POST", "/v1/completions", "key-a", completionsBody(600, 500, ""))
	if b := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("DryRun: %d %s, want 200", resp.StatusCode, b)
	}
	if got := testutil.ToFloat64(dry.gw.metrics.DryRunRejections.WithLabelValues("a", "request_too_large")); got != 1 {
		t.Errorf("dry_run_rejections_total{request_too_large} = %v, want 1 (budget_exhausted = %v)", got,
			testutil.ToFloat64(dry.gw.metrics.DryRunRejections.WithLabelValues("a", "budget_exhausted")))
	}
}

// TestReviewDryRunDoesNotRefuseOverTheOutputCap: spec.mode DryRun "refuses
// nothing" (api.md, issue: "decisions computed, counted in metrics and
// status, nothing refused"); the plan's maxOutputTokensPerRequest is a
// decision of the plan like any other, so a DryRun tenant asking 600 of a
// cap of 500 is served and the would-be refusal counted.
func TestReviewDryRunDoesNotRefuseOverTheOutputCap(t *testing.T) {
	up := newUpstream(t, noUsageJSON)
	tp := tenant("a", limiter.Limits{})
	tp.DryRun = true
	tp.MaxOutputTokensPerRequest = 500
	e := newEnv(t, up, []registry.TenantPolicy{tp})
	resp := e.do("POST", "/v1/completions", "key-a", completionsBody(100, 600, ""))
	body := readAll(t, resp)
	if resp.StatusCode != 200 {
		t.Fatalf("DryRun tenant over the output cap: %d %s, want 200 (DryRun refuses nothing)", resp.StatusCode, body)
	}
	if got := testutil.ToFloat64(e.gw.metrics.DryRunRejections.WithLabelValues("a", "max_tokens_too_large")); got != 1 {
		t.Errorf("dry_run_rejections_total{max_tokens_too_large} = %v, want 1", got)
	}
}

// TestReviewDryRunJobCountedOnce: a DryRun tenant's job that does not fit
// its budget is one would-be refusal, not one at submission and another at
// dispatch. It costs 210, more than the whole budget of 100, so the code
// Enforce would have answered is 413 request_too_large.
func TestReviewDryRunJobCountedOnce(t *testing.T) {
	up := newUpstream(t, okJSON(10, 100))
	tp := tenant("a", limiter.Limits{})
	tp.DryRun = true
	tp.Budget = &registry.BudgetPolicy{WeightedTokens: 100, Period: registry.BudgetDay}
	e := newEnv(t, up, []registry.TenantPolicy{tp})
	j := e.submit("key-a", jobBody(10, 200, ""))
	waitFor(t, "the job to succeed", func() bool { return e.storeStatus(j.ID) == jobs.StatusSucceeded })
	if got := e.tenantSnap("a").DryRunRejections; got != 1 {
		t.Errorf("dryRunRejections = %d, want 1 for one job", got)
	}
	if got := testutil.ToFloat64(e.gw.metrics.DryRunRejections.WithLabelValues("a", "request_too_large")); got != 1 {
		t.Errorf("dry_run_rejections_total{request_too_large} = %v, want 1 for one job", got)
	}
	// The budget counts the real spend: 10 + 100.
	if st, _ := e.reg.Tenant("a").Budget(e.clock.Now()); st.Used != 110 || st.Reserved != 0 {
		t.Errorf("budget %+v, want used 110, nothing reserved", st)
	}
}

// TestReviewSuccessResetCoversDebt: on a success the tokens Reset (and the
// IETF t) is "the seconds until the bucket is full again" (api.md). A Soft
// tenant whose bucket (capacity 100, 10 tokens/s) is 100 in debt needs 20 s
// to be full, not the 10 s a floored remaining of 0 suggests.
func TestReviewSuccessResetCoversDebt(t *testing.T) {
	up := newUpstream(t, okJSON(50, 50))
	e := newEnv(t, up, []registry.TenantPolicy{
		tenant("a", limiter.Limits{WeightedPerMinute: i64(600), WeightedBurst: i64(100), Soft: true}),
	})
	var resp *http.Response
	for i := range 2 {
		resp = e.do("POST", "/v1/completions", "key-a", completionsBody(50, 50, ""))
		if b := readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("call %d: %d %s", i, resp.StatusCode, b)
		}
	}
	if got := resp.Header.Get("X-Ratelimit-Reset-Tokens"); got != "20" {
		t.Errorf("X-RateLimit-Reset-Tokens = %q, want 20 (bucket -100 of 100 at 10/s)", got)
	}
	if got := resp.Header.Get("Ratelimit"); got != `"tokens";r=0;t=20` {
		t.Errorf("RateLimit = %q, want \"tokens\";r=0;t=20", got)
	}
}

// exitUpstream answers by the request's "user" field: ok (usage 30 + 7),
// stream (5 deltas, usage when asked), e500, e400, slow (never answers
// within the upstream timeout), broken (the body breaks off).
func exitUpstream(w http.ResponseWriter, r *http.Request, body []byte) {
	var req struct {
		User string `json:"user"`
	}
	_ = json.Unmarshal(body, &req)
	switch req.User {
	case "ok":
		okJSON(30, 7)(w, r, body)
	case "stream":
		sseStream(5, 30)(w, r, body)
	case "e500":
		w.WriteHeader(500)
		_, _ = w.Write([]byte(`{"error":{"message":"boom","type":"server_error"}}`))
	case "e400":
		w.WriteHeader(400)
		_, _ = w.Write([]byte(`{"error":{"message":"bad","type":"invalid_request_error"}}`))
	case "slow":
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	case "broken":
		hj, ok := w.(http.Hijacker)
		if !ok {
			return
		}
		conn, bw, err := hj.Hijack()
		if err != nil {
			return
		}
		_, _ = bw.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{\"choices\":[")
		_ = bw.Flush()
		_ = conn.Close()
	}
}

// TestReviewEveryExitPathSettlesOnce: 24 parallel clients, 10 calls each,
// spread over every exit path (success, stream, provider 500 and 400,
// upstream timeout, broken body) and over the refusals of the tenant's
// concurrency and the pool's concurrency. At the end nothing is held (no
// call in flight, no KV blocks, no budget reserved, no upstream slot), and
// the bucket and the budget both equal the capacity minus exactly what the
// successful exits used: ok 37, stream 35, broken the full charge 30 + 20,
// every other exit 0.
func TestReviewEveryExitPathSettlesOnce(t *testing.T) {
	up := newUpstream(t, exitUpstream)
	tp := tenant("a", limiter.Limits{WeightedPerMinute: i64(600_000_000), WeightedBurst: i64(10_000_000),
		MaxConcurrent: i64(6), MaxKVBlocks: i64(1000)})
	tp.Budget = &registry.BudgetPolicy{WeightedTokens: 10_000_000, Period: registry.BudgetMonth}
	e := newEnv(t, up, []registry.TenantPolicy{tp}, withConcurrency(4), withPool(func(p *registry.PoolPolicy) {
		p.UpstreamTimeout = 150 * time.Millisecond
		p.CostModel.KVBlockTokens = 16
	}))
	kinds := []string{"ok", "stream", "e500", "e400", "slow", "broken"}
	var mu sync.Mutex
	var used int64
	statuses := map[string]int{}
	var wg sync.WaitGroup
	for c := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				kind := kinds[(c+i)%len(kinds)]
				extra := `,"user":"` + kind + `"`
				if kind == "stream" {
					extra += `,"stream":true`
				}
				resp := e.do("POST", "/v1/completions", "key-a", completionsBody(30, 20, extra))
				b := readAll(t, resp)
				var u int64
				switch {
				case resp.StatusCode == 200 && kind == "ok":
					u = 37
				case resp.StatusCode == 200 && kind == "stream":
					if !strings.HasSuffix(strings.TrimSpace(string(b)), "[DONE]") {
						t.Errorf("stream not complete: %q", b)
					}
					u = 35
				case resp.StatusCode == 502 && kind == "broken":
					u = 50
				case resp.StatusCode == 429 || resp.StatusCode == 503 || resp.StatusCode == 500 ||
					resp.StatusCode == 400 || resp.StatusCode == 504:
				default:
					t.Errorf("%s: unexpected %d %s", kind, resp.StatusCode, b)
				}
				mu.Lock()
				used += u
				statuses[fmt.Sprintf("%s:%d", kind, resp.StatusCode)]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	t.Logf("outcomes: %v", statuses)
	ta := e.reg.Tenant("a")
	waitFor(t, "every call to settle", func() bool { return ta.Limiter.Snapshot(e.clock.Now()).InFlight == 0 && len(e.gw.sem) == 0 })
	s := ta.Limiter.Snapshot(e.clock.Now())
	if s.KVBlocks != 0 {
		t.Errorf("KV blocks held: %d", s.KVBlocks)
	}
	if got := e.tokensLeft("a"); got != 10_000_000-used {
		t.Errorf("bucket = %d, want %d (capacity - used %d)", got, 10_000_000-used, used)
	}
	st, _ := ta.Budget(e.clock.Now())
	if st.Reserved != 0 || st.Used != used {
		t.Errorf("budget %+v, want used %d, nothing reserved", st, used)
	}
}

// TestReviewClientDisconnectsReleaseEverything: 16 parallel streams whose
// clients leave after the first event while the provider keeps the stream
// open: every slot, KV block and budget reservation is released, and each
// call is charged at least its prompt and at most prompt + the deltas sent.
func TestReviewClientDisconnectsReleaseEverything(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		for range 50 {
			_, _ = w.Write([]byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" x\"}}]}\n\n"))
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	tp := tenant("a", limiter.Limits{WeightedPerMinute: i64(600_000_000), WeightedBurst: i64(10_000_000), MaxKVBlocks: i64(100_000)})
	tp.Budget = &registry.BudgetPolicy{WeightedTokens: 10_000_000, Period: registry.BudgetMonth}
	e := newEnv(t, up, []registry.TenantPolicy{tp}, withPool(func(p *registry.PoolPolicy) { p.CostModel.KVBlockTokens = 16 }))
	const n = 16
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", e.srv.URL+"/v1/completions", strings.NewReader(completionsBody(100, 1000, `,"stream":true`)))
			req.Header.Set("Authorization", "Bearer key-a")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			br := bufio.NewReader(resp.Body)
			if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
				t.Errorf("first line %q %v", line, err)
			}
			cancel()
			resp.Body.Close()
		}()
	}
	wg.Wait()
	ta := e.reg.Tenant("a")
	waitFor(t, "every stream to settle", func() bool { return ta.Limiter.Snapshot(e.clock.Now()).InFlight == 0 && len(e.gw.sem) == 0 })
	if s := ta.Limiter.Snapshot(e.clock.Now()); s.KVBlocks != 0 {
		t.Errorf("KV blocks held: %d", s.KVBlocks)
	}
	st, _ := ta.Budget(e.clock.Now())
	spent := 10_000_000 - e.tokensLeft("a")
	if st.Reserved != 0 || st.Used != spent {
		t.Errorf("budget %+v, want nothing reserved and used = the limiter's spend %d", st, spent)
	}
	if spent < n*101 || spent > n*150 {
		t.Errorf("spent %d, want between %d (prompt + 1) and %d (prompt + 50) per call", spent, n*101, n*150)
	}
}

// streamEvents serves events as SSE data lines, without a usage chunk
// (a provider that ignores include_usage), and returns what the client got
// and what the call was charged.
func streamEvents(t *testing.T, events []string, clientBody string) (got []string, charged int64) {
	t.Helper()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range events {
			fmt.Fprintf(w, "data: %s\n\n", ev)
		}
	})
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(600_000_000), WeightedBurst: i64(10_000_000)})})
	resp := e.do("POST", "/v1/chat/completions", "key-a", clientBody)
	raw := readAll(t, resp)
	for _, line := range strings.Split(string(raw), "\n") {
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			got = append(got, d)
		} else if line != "" {
			t.Logf("line that is not an SSE data line: %.60q (%d bytes)", line, len(line))
		}
	}
	waitFor(t, "the stream to settle", func() bool { return e.reg.Tenant("a").Limiter.Snapshot(e.clock.Now()).InFlight == 0 })
	return got, 10_000_000 - e.tokensLeft("a")
}

const hiStreamBody = `{"model":"` + testModel + `","messages":[{"role":"user","content":"hi"}],"max_tokens":100000,"stream":true}`

func hiPromptTokens(t *testing.T) int64 {
	p, err := tokencount.Chat([]tokencount.Message{{Content: json.RawMessage(`"hi"`)}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func contentEvent(field string, v any) string {
	b, _ := json.Marshal(map[string]any{"choices": []any{map[string]any{"index": 0, "delta": map[string]any{field: v}}}})
	return string(b)
}

// TestReviewStreamToolCallDeltasCounted: a stream without usage carrying
// tool-call argument deltas and a malformed chunk: every event is forwarded
// unchanged and the call is charged the prompt plus the tokens of the
// argument pieces joined, as the provider tokenizes its output (streamText;
// the malformed chunk counts 0).
func TestReviewStreamToolCallDeltasCounted(t *testing.T) {
	args := []string{`{"city":`, `"Paris",`, `"unit":"c"}`}
	var events []string
	for _, a := range args {
		events = append(events, contentEvent("tool_calls", []any{map[string]any{"index": 0, "function": map[string]any{"arguments": a}}}))
	}
	events = append(events, `{"choices":[{"index":0,"delta":{"content":"oops"`, "[DONE]")
	got, charged := streamEvents(t, events, hiStreamBody)
	if strings.Join(got, "\n") != strings.Join(events, "\n") {
		t.Errorf("forwarded %q, want %q", got, events)
	}
	k, _ := tokencount.Text(strings.Join(args, ""))
	if want := hiPromptTokens(t) + k; charged != want {
		t.Errorf("charged %d, want prompt + tokens of the joined arguments = %d", charged, want)
	}
}

// TestReviewStreamChunkLargerThanReaderBuffer: an event of 96 000 bytes,
// three times the gateway's 32 KiB reader buffer, must reach the client
// byte for byte and be counted (with the delta before it, joined).
func TestReviewStreamChunkLargerThanReaderBuffer(t *testing.T) {
	huge := strings.Repeat("lorem ipsum ", 8000)
	events := []string{contentEvent("content", "a"), contentEvent("content", huge), "[DONE]"}
	got, charged := streamEvents(t, events, hiStreamBody)
	if len(got) != len(events) {
		t.Errorf("forwarded %d SSE events, want %d: the big event was corrupted", len(got), len(events))
	} else if got[1] != events[1] {
		t.Errorf("the big event was altered (%d bytes, want %d)", len(got[1]), len(events[1]))
	}
	k, _ := tokencount.Text("a" + huge)
	if want := hiPromptTokens(t) + k; charged != want {
		t.Errorf("charged %d, want prompt + %d = %d", charged, k, want)
	}
}

// TestReviewBudgetMonthEndRoll: a monthly budget of 1000 on the fake clock
// at 2026-01-31T23:59:59.6Z: 600 is spent, another 600 is 429
// budget_exhausted with Retry-After 1 (0.4 s rounded up, at least 1) and no
// quota fields of the token bucket; one second later (February) the same
// call is admitted, and the figures read used 600 with the reset at March 1.
func TestReviewBudgetMonthEndRoll(t *testing.T) {
	up := newUpstream(t, noUsageJSON)
	tp := tenant("a", limiter.Limits{})
	tp.Budget = &registry.BudgetPolicy{WeightedTokens: 1000, Period: registry.BudgetMonth}
	e := newEnv(t, up, []registry.TenantPolicy{tp})
	e.clock.SetTime(time.Date(2026, 1, 31, 23, 59, 59, 600_000_000, time.UTC))
	post := func() (*http.Response, []byte) {
		resp := e.do("POST", "/v1/completions", "key-a", completionsBody(100, 500, ""))
		return resp, readAll(t, resp)
	}
	if resp, b := post(); resp.StatusCode != 200 {
		t.Fatalf("first: %d %s", resp.StatusCode, b)
	}
	resp, b := post()
	if resp.StatusCode != 429 || decodeCode(b) != "budget_exhausted" || resp.Header.Get("Retry-After") != "1" ||
		!strings.Contains(string(b), "2026-02-01T00:00:00Z") {
		t.Fatalf("second: %d Retry-After %q %s; want 429 budget_exhausted, 1, reset 2026-02-01", resp.StatusCode, resp.Header.Get("Retry-After"), b)
	}
	e.clock.Step(time.Second)
	if resp, b := post(); resp.StatusCode != 200 {
		t.Fatalf("after the roll: %d %s", resp.StatusCode, b)
	}
	st, _ := e.reg.Tenant("a").Budget(e.clock.Now())
	if st.Used != 600 || st.Remaining != 400 || !st.ResetTime.Equal(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("February budget %+v, want used 600, remaining 400, reset 2026-03-01", st)
	}
}

// TestReviewBudgetSeedAcrossRestart: a new scheduler (a fresh registry)
// seeded with the status of the current period starts from its used
// figure, a seed of the previous period is ignored, and a live update with
// a smaller seed never lowers the count (BudgetSeed, api.md).
func TestReviewBudgetSeedAcrossRestart(t *testing.T) {
	up := newUpstream(t, noUsageJSON)
	tp := tenant("a", limiter.Limits{})
	tp.Budget = &registry.BudgetPolicy{WeightedTokens: 1000, Period: registry.BudgetDay}
	tp.BudgetSeed = &registry.BudgetSeed{Used: 700, ResetTime: t0.Add(24 * time.Hour)}
	e := newEnv(t, up, []registry.TenantPolicy{tp})
	resp := e.do("POST", "/v1/completions", "key-a", completionsBody(100, 250, ""))
	if b := readAll(t, resp); resp.StatusCode != 429 || decodeCode(b) != "budget_exhausted" {
		t.Fatalf("350 with 300 left after the seed: %d %s", resp.StatusCode, b)
	}
	tp.BudgetSeed = &registry.BudgetSeed{Used: 100, ResetTime: t0.Add(24 * time.Hour)}
	if err := e.reg.UpsertTenant(tp); err != nil {
		t.Fatal(err)
	}
	if st, _ := e.reg.Tenant("a").Budget(e.clock.Now()); st.Used != 700 {
		t.Errorf("used %d after a smaller seed, want 700 kept", st.Used)
	}
	tp2 := tp
	tp2.BudgetSeed = &registry.BudgetSeed{Used: 900, ResetTime: t0} // the previous day
	e2 := newEnv(t, up, []registry.TenantPolicy{tp2})
	if st, _ := e2.reg.Tenant("a").Budget(e2.clock.Now()); st.Used != 0 {
		t.Errorf("used %d from the previous period's seed, want 0", st.Used)
	}
}

// TestReviewSoftOverLimitNoInteractiveReserve: the provider's limit is 1000
// tokens per minute with half reserved for interactive calls, 400 of it
// taken by a call in flight. A Soft tenant within its limit may use the
// reserve for an interactive call of 300 provider tokens; the same tenant
// over its limit (bucket drained by a call in flight) may not: 503
// upstream_quota_exhausted, charged nothing.
func TestReviewSoftOverLimitNoInteractiveReserve(t *testing.T) {
	for _, over := range []bool{false, true} {
		t.Run(fmt.Sprintf("over=%v", over), func(t *testing.T) {
			up := newUpstream(t, noUsageJSON)
			e := newEnv(t, up, []registry.TenantPolicy{
				tenant("a", limiter.Limits{WeightedPerMinute: i64(6000), WeightedBurst: i64(1000), Soft: true}),
			}, withPool(func(p *registry.PoolPolicy) {
				p.ReservePercent = 50
				p.Models = []registry.ModelPolicy{{Name: testModel, TokensPerMinute: 1000, RequestsPerMinute: 10000}}
			}))
			if over {
				hold(t, e, 1000, 0, unitCost)
			}
			if _, ok, _ := e.reg.Model(testModel).Throttle.TryStart(e.clock.Now(), 400, throttle.Interactive); !ok {
				t.Fatal("taking 400 of the provider's 1000 refused")
			}
			before := e.tokensLeft("a")
			resp := e.do("POST", "/v1/completions", "key-a", completionsBody(100, 200, ""))
			b := readAll(t, resp)
			switch {
			case !over && resp.StatusCode != 200:
				t.Errorf("within the limit: %d %s, want 200 (the interactive reserve is open)", resp.StatusCode, b)
			case over && (resp.StatusCode != 503 || decodeCode(b) != "upstream_quota_exhausted"):
				t.Errorf("over the soft limit: %d %s, want 503 upstream_quota_exhausted (no interactive reserve)", resp.StatusCode, b)
			case over && e.tokensLeft("a") != before:
				t.Errorf("bucket %d after the refusal, want %d (nothing charged)", e.tokensLeft("a"), before)
			}
		})
	}
}

// TestReviewDeleteTenantWithCallInFlight: a TenantQuota deleted while one of
// its streams is in flight: new calls with its key are 401 at once, the
// stream finishes and settles (the limiter holds nothing), and the upstream
// slot is released.
func TestReviewDeleteTenantWithCallInFlight(t *testing.T) {
	release := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" x\"}}]}\n\n")
		w.(http.Flusher).Flush()
		<-release
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n")
	})
	tp := tenant("a", limiter.Limits{WeightedPerMinute: i64(600_000), MaxConcurrent: i64(2)})
	tp.Budget = &registry.BudgetPolicy{WeightedTokens: 100_000, Period: registry.BudgetDay}
	e := newEnv(t, up, []registry.TenantPolicy{tp})
	ta := e.reg.Tenant("a")
	resp := e.do("POST", "/v1/completions", "key-a", completionsBody(10, 100, `,"stream":true`))
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q %v", line, err)
	}
	if e.reg.RemoveTenant("a") == nil {
		t.Fatal("RemoveTenant found nothing")
	}
	r2 := e.do("POST", "/v1/completions", "key-a", completionsBody(10, 100, ""))
	if b := readAll(t, r2); r2.StatusCode != 401 {
		t.Errorf("call after delete: %d %s, want 401", r2.StatusCode, b)
	}
	close(release)
	readAll(t, resp)
	waitFor(t, "the stream to settle", func() bool { return ta.Limiter.Snapshot(e.clock.Now()).InFlight == 0 && len(e.gw.sem) == 0 })
	if st, _ := ta.Budget(e.clock.Now()); st.Reserved != 0 || st.Used != 11 {
		t.Errorf("budget %+v, want used 11, nothing reserved", st)
	}
}

// TestReviewModeSwitchWithCallsInFlight: a call admitted under Enforce and
// settled after the tenant switched to DryRun (and one admitted under
// DryRun as a shadow, settled after switching back) settle by the mode they
// were admitted under: the Enforce call's refund lands in the bucket, the
// shadow's settlement changes nothing, and the budget counts both spends.
func TestReviewModeSwitchWithCallsInFlight(t *testing.T) {
	release := make(chan struct{}, 2)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		<-release
		okJSON(100, 50)(w, r, body)
	})
	tp := tenant("a", limiter.Limits{WeightedPerMinute: i64(60_000), WeightedBurst: i64(1000)})
	tp.Budget = &registry.BudgetPolicy{WeightedTokens: 100_000, Period: registry.BudgetDay}
	e := newEnv(t, up, []registry.TenantPolicy{tp})
	ta := e.reg.Tenant("a")
	var wg sync.WaitGroup
	send := func() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp := e.do("POST", "/v1/completions", "key-a", completionsBody(100, 800, ""))
			if b := readAll(t, resp); resp.StatusCode != 200 {
				t.Errorf("%d %s", resp.StatusCode, b)
			}
		}()
	}
	send() // Enforce: charged 900, bucket 100
	waitFor(t, "the first call upstream", func() bool { return up.calls.Load() == 1 })
	tp.DryRun = true
	if err := e.reg.UpsertTenant(tp); err != nil {
		t.Fatal(err)
	}
	send() // DryRun: 900 > 100 left, a shadow
	waitFor(t, "the second call upstream", func() bool { return up.calls.Load() == 2 })
	if got := e.tokensLeft("a"); got != 100 {
		t.Errorf("bucket %d with both in flight, want 100", got)
	}
	tp.DryRun = false
	if err := e.reg.UpsertTenant(tp); err != nil {
		t.Fatal(err)
	}
	release <- struct{}{}
	release <- struct{}{}
	wg.Wait()
	// The Enforce call used 150 of 900: 750 back. The shadow changed nothing.
	if got := e.tokensLeft("a"); got != 850 {
		t.Errorf("bucket %d, want 850", got)
	}
	if st, _ := ta.Budget(e.clock.Now()); st.Used != 300 || st.Reserved != 0 {
		t.Errorf("budget %+v, want used 300 (both calls' real spend), nothing reserved", st)
	}
	if got := e.tenantSnap("a").DryRunRejections; got != 1 {
		t.Errorf("dryRunRejections %d, want 1", got)
	}
}

// TestReviewUpstream429ReleasesEverything: a provider 429 refunds the call in
// full (bucket, request, budget), releases the slot, and pauses the model;
// the next call is 503 with Retry-After >= 1 and charges nothing.
func TestReviewUpstream429ReleasesEverything(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Retry-After", "0.2")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"error":{"message":"slow down","type":"tokens","code":"rate_limit_exceeded"}}`))
	})
	tp := tenant("a", limiter.Limits{WeightedPerMinute: i64(60_000), WeightedBurst: i64(1000), RequestsPerMinute: i64(60), MaxConcurrent: i64(1)})
	tp.Budget = &registry.BudgetPolicy{WeightedTokens: 100_000, Period: registry.BudgetDay}
	e := newEnv(t, up, []registry.TenantPolicy{tp})
	for i, want := range []int{503, 503} {
		resp := e.do("POST", "/v1/completions", "key-a", completionsBody(100, 100, ""))
		b := readAll(t, resp)
		if resp.StatusCode != want || decodeCode(b) != "upstream_quota_exhausted" || resp.Header.Get("Retry-After") != "1" {
			t.Errorf("call %d: %d Retry-After %q %s, want %d upstream_quota_exhausted Retry-After 1", i, resp.StatusCode, resp.Header.Get("Retry-After"), b, want)
		}
	}
	ta := e.reg.Tenant("a")
	s := ta.Limiter.Snapshot(e.clock.Now())
	if s.InFlight != 0 || s.TokensRemaining != 1000 || s.RequestsRemaining != 10 || len(e.gw.sem) != 0 {
		t.Errorf("after the 429: %+v, slots %d; want nothing held, bucket 1000, requests 10", s, len(e.gw.sem))
	}
	if st, _ := ta.Budget(e.clock.Now()); st.Used != 0 || st.Reserved != 0 {
		t.Errorf("budget %+v, want nothing used or reserved", st)
	}
	if up.calls.Load() != 1 {
		t.Errorf("upstream calls %d, want 1 (the model is paused after the 429)", up.calls.Load())
	}
}

// TestReviewChoicesAbove128: n is capped at 128 for the charge
// (architecture.md), but the provider is asked for n as sent: a request
// with n = 200 and max_tokens 10 must either be refused or be charged
// 200 x 10 output tokens, never 128 x 10 while the provider may produce
// 2000.
func TestReviewChoicesAbove128(t *testing.T) {
	up := newUpstream(t, noUsageJSON)
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(6_000_000), WeightedBurst: i64(100_000)})})
	resp := e.do("POST", "/v1/completions", "key-a", completionsBody(10, 10, `,"n":200`))
	b := readAll(t, resp)
	if resp.StatusCode == 400 {
		return
	}
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	sentN := up.lastBody()["n"]
	if charged := 100_000 - e.tokensLeft("a"); sentN == float64(200) && charged != 10+2000 {
		t.Errorf("provider asked for n=%v, charged %d; want 2010 (or a 400)", sentN, charged)
	}
}
