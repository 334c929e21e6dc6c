package gateway

import (
	"bytes"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/metrics"
	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/tokencount"
)

// Fuzz targets of the request decoders (issue 7, "Fuzzing"): the cost
// extraction of interactive bodies (parseRequest), the job API decoder
// (parseSubmit) and the bulk NDJSON upload (POST /v1/jobs/bulk).
// hack/fuzz.sh runs each for a bounded number of executions; crashers are
// kept in testdata/fuzz and run by every go test.

var fuzzEndpoints = []string{endpointChat, endpointCompletions, endpointEmbeddings}

func fuzzPool() *registry.PoolPolicy {
	return &registry.PoolPolicy{Name: "pool", BaseURL: "http://127.0.0.1:1",
		Models:    []registry.ModelPolicy{{Name: testModel, TokensPerMinute: 1000000, RequestsPerMinute: 1000}},
		CostModel: limiter.CostModel{InputWeight: 1, OutputWeight: 4}, DefaultMaxOutputTokens: 4096, UpstreamTimeout: time.Second}
}

// errorCodes are the codes a decoder may refuse a body with, by status.
var errorCodes = map[string]int{
	codeInvalidJSON: 400, codeInvalidRequest: 400, codeModelNotFound: 400, codeInvalidEndpoint: 400,
	codeInvalidDeadline: 400, codeStreamNotSupported: 400, codeRequestTooLarge: 413,
}

func checkRefusal(t *testing.T, e *apiError) {
	t.Helper()
	if st, ok := errorCodes[e.code]; !ok || st != e.status || e.message == "" || e.typ == "" {
		t.Fatalf("refusal without a known code: %+v", e)
	}
}

// FuzzParseRequest: parseRequest never panics; a refusal carries a code
// and its status; an accepted body has non-negative token counts within the
// cost model's bound, max output = per choice x choices, a weighted cost
// that does not overflow, and the same figures on a recomputation from an
// independent decoding of the body.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"gpt-test","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"gpt-test","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_tokens":10,"n":3,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"gpt-test","prompt":[1,2,3],"max_completion_tokens":5,"max_tokens":7}`,
		`{"model":"gpt-test","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\": 1}"}}]},{"role":"tool","tool_call_id":"c","content":"ok"}],"tools":[ {"type":"function","function":{"name":"f"}} ]}`,
		`{"model":"gpt-test","prompt":[[1,2],[3]],"max_tokens":0}`,
		`{"model":"gpt-test","input":["a","b"]}`,
		`{"model":"gpt-test","messages":[{"role":"user","content":"x"}],"max_tokens":1099511627776,"n":1}`,
		`{"model":"gpt-test","messages":[{"role":"user","content":"x"}],"max_tokens":4611686018427387904,"n":4}`,
		`{"model":"other","messages":[]}`, `[]`, `{"model":"gpt-test","messages":[[[[]]]]}`, `null`,
	} {
		for i := range fuzzEndpoints {
			f.Add(uint8(i), []byte(s))
		}
	}
	pool := fuzzPool()
	// Counted through a count cache: the figures must equal tokencount's
	// (below), on the first parse and on the second (cache hits).
	pc := promptCounter{cache: tokencount.NewCache(64), scope: "tenant"}
	f.Fuzz(func(t *testing.T, ep uint8, body []byte) {
		endpoint := fuzzEndpoints[int(ep)%len(fuzzEndpoints)]
		req, aerr := parseRequest(endpoint, body, pool, pc)
		if aerr != nil {
			checkRefusal(t, aerr)
			return
		}
		if req.promptTokens < 0 || req.maxOutput < 0 || req.maxOutput > maxRequestTokens || req.promptTokens > int64(len(body))*4 {
			t.Fatalf("prompt %d, max output %d", req.promptTokens, req.maxOutput)
		}
		if req.perChoice*req.choices != req.maxOutput && endpoint != endpointEmbeddings {
			t.Fatalf("per choice %d x %d != %d", req.perChoice, req.choices, req.maxOutput)
		}
		cost := pool.CostModel.Cost(req.promptTokens, req.maxOutput)
		if cost.Weighted != req.promptTokens+4*req.maxOutput || cost.Weighted < 0 || cost.ProviderTokens != req.promptTokens+req.maxOutput {
			t.Fatalf("cost %+v of prompt %d and output %d", cost, req.promptTokens, req.maxOutput)
		}
		// Independent recomputation of the output reservation, from a
		// generic decoding with exact (case-sensitive) keys as the
		// provider reads them: encoding/json's struct decoding would
		// match "streAm" to stream (crasher 3d50f69fa2917c4a).
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		var v map[string]any
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("accepted body does not decode: %v", err)
		}
		num := func(k string) (int64, bool) {
			n, ok := v[k].(json.Number)
			if !ok {
				return 0, false
			}
			i, err := n.Int64()
			if err != nil {
				t.Fatalf("%s %v accepted", k, n)
			}
			return i, true
		}
		stream, _ := v["stream"].(bool)
		if v["model"] != req.model || stream != req.stream {
			t.Fatalf("model %v stream %v, parsed %q %v", v["model"], v["stream"], req.model, req.stream)
		}
		var want int64
		if endpoint != endpointEmbeddings {
			want = pool.DefaultMaxOutputTokens
			mt, okT := num("max_tokens")
			mc, okC := num("max_completion_tokens")
			switch {
			case okT && okC:
				want = max(mt, mc)
			case okT:
				want = mt
			case okC:
				want = mc
			}
			if n, ok := num("n"); ok {
				want *= n
			}
		}
		if want != req.maxOutput {
			t.Fatalf("max output %d, recomputed %d", req.maxOutput, want)
		}
		if endpoint == endpointChat {
			// The streaming count equals tokencount.Chat over all messages.
			var fields map[string]json.RawMessage
			var msgs []tokencount.Message
			if err := json.Unmarshal(body, &fields); err != nil || json.Unmarshal(fields["messages"], &msgs) != nil {
				t.Fatalf("accepted messages do not decode: %v", err)
			}
			n, err := tokencount.Chat(msgs)
			defs, derr := tokencount.Tools(fields["tools"], fields["functions"])
			if err != nil || derr != nil || n+defs != req.promptTokens {
				t.Fatalf("prompt %d, tokencount.Chat %d + Tools %d (%v, %v)", req.promptTokens, n, defs, err, derr)
			}
		}
		again, aerr := parseRequest(endpoint, bytes.Clone(body), pool, pc)
		if aerr != nil || again.promptTokens != req.promptTokens || again.maxOutput != req.maxOutput {
			t.Fatalf("not deterministic: %+v %v", again, aerr)
		}
	})
}

// FuzzParseSubmit: the job decoder never panics; a refusal is a 400 with a
// code; an accepted deadline is a finite number of at least 1 ms.
func FuzzParseSubmit(f *testing.F) {
	for _, s := range []string{
		`{"endpoint":"/v1/chat/completions","body":{"model":"gpt-test","messages":[{"role":"user","content":"hi"}]},"deadlineSeconds":60,"metadata":{"a":"b"}}`,
		`{"body":{},"deadlineSeconds":0.0005}`, `{"deadlineSeconds":1e999}`, `{"webhookURL":"http://127.0.0.1/x"}`,
		`{"webhookURL":"ftp://x"}`, `{"endpoint":1}`, `{}`, `[]`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		sr, aerr := parseSubmit(body)
		if aerr != nil {
			checkRefusal(t, aerr)
			if aerr.status != 400 {
				t.Fatalf("status %d", aerr.status)
			}
			return
		}
		if d := sr.DeadlineSeconds; d != nil && (math.IsNaN(*d) || math.IsInf(*d, 0) || *d < minDeadline.Seconds()) {
			t.Fatalf("deadline %v accepted", *d)
		}
	})
}

// FuzzBulkUpload: POST /v1/jobs/bulk never panics and answers either a
// whole refusal with a code, or 200 with one entry per non-blank line, in
// order, each a job or an error with a code and status; the jobs it says
// it queued are in the queue.
func FuzzBulkUpload(f *testing.F) {
	good := `{"body":{"model":"gpt-test","messages":[{"role":"user","content":"hi"}],"max_tokens":5}}`
	for _, s := range []string{good, good + "\n\n" + good, good + "\n{\"body\":\n[]\n", "\n \n", `{"body":{"model":"gpt-test","stream":true,"messages":[{"content":"x"}]}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		fc := clocktesting.NewFakeClock(t0)
		reg := registry.New(fc)
		if err := reg.SetPool(*fuzzPool()); err != nil {
			t.Fatal(err)
		}
		tp := tenant("a", limiter.Limits{WeightedPerMinute: i64(600000), WeightedBurst: i64(100000)})
		tp.MaxQueued = 5
		if err := reg.UpsertTenant(tp); err != nil {
			t.Fatal(err)
		}
		reg.SetTenantsSynced()
		g := New(Options{Registry: reg, Clock: fc, Store: jobs.NewMemStore(fc, 0, 0), Metrics: metrics.New(prometheus.NewRegistry(), nil)})
		r := httptest.NewRequest(http.MethodPost, "/v1/jobs/bulk", bytes.NewReader(body))
		r.Header.Set("Authorization", "Bearer key-a")
		w := httptest.NewRecorder()
		g.ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			var eb errorBody
			if err := json.Unmarshal(w.Body.Bytes(), &eb); err != nil || eb.Error.Code == "" || (w.Code != 400 && w.Code != 413) {
				t.Fatalf("whole refusal %d %q", w.Code, w.Body.Bytes())
			}
			return
		}
		var br struct {
			Queued, Refused int
			Data            []struct {
				Line  int
				Job   *struct{ ID string }
				Error *struct {
					Code   string
					Status int
				}
			}
		}
		if err := json.Unmarshal(w.Body.Bytes(), &br); err != nil {
			t.Fatal(err)
		}
		lines := 0
		var want []int
		for i, l := range bytes.Split(body, []byte("\n")) {
			if len(bytes.TrimSpace(l)) > 0 {
				lines++
				want = append(want, i+1)
			}
		}
		if len(br.Data) != lines || br.Queued+br.Refused != lines {
			t.Fatalf("%d entries, queued %d refused %d, %d lines", len(br.Data), br.Queued, br.Refused, lines)
		}
		queued := 0
		for i, d := range br.Data {
			if d.Line != want[i] || (d.Job == nil) == (d.Error == nil) {
				t.Fatalf("entry %d: %+v", i, d)
			}
			if d.Error != nil && (d.Error.Code == "" || d.Error.Status < 400) {
				t.Fatalf("line %d error %+v", d.Line, *d.Error)
			}
			if d.Job != nil {
				queued++
			}
		}
		if bl := reg.Snapshot(fc.Now()).Backlog; int(bl) != queued || queued != br.Queued {
			t.Fatalf("backlog %d, queued %d, reported %d", bl, queued, br.Queued)
		}
	})
}

// FuzzDecodeRequestFields: the one-pass member reader of request bodies
// (decodeRequestFields) accepts exactly the bodies json.Unmarshal decodes
// into a non-nil map, and keeps for each name it reads the raw value the
// map holds (keys unescaped, exact, last duplicate wins).
func FuzzDecodeRequestFields(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`,
		`{"model":"a","model":"b","mod\u0065l":"c","Model":"d","n":2}`,
		`{"stream":true,"stream_options":{"include_usage":true},"prompt":["x"],"input":[1,2]}`,
		`{"max_completion_tokens" : 7 , "max_tokens":null}`, `null`, `[]`, `{}`, `{"a":`, `{"n":1}x`,
		`{"\u006e":5,"\ud800":1}`, "{\"model\":\"\xff\"}",
		`{"tools":[{"type":"function","function":{"name":"f"}}],"functions":null,"Tools":1,"tool\u0073":2}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var got requestFields
		ok := decodeRequestFields(body, &got)
		var m map[string]json.RawMessage
		err := json.Unmarshal(body, &m)
		if ok != (err == nil && m != nil) {
			t.Fatalf("accepted %v, json.Unmarshal into a map: %v (nil map %v)", ok, err, m == nil)
		}
		if !ok {
			return
		}
		var want requestFields
		for k, v := range m {
			want.set(k, v)
		}
		for _, c := range []struct {
			name      string
			got, want json.RawMessage
		}{
			{"model", got.model, want.model}, {"stream", got.stream, want.stream},
			{"stream_options", got.streamOptions, want.streamOptions}, {"messages", got.messages, want.messages},
			{"prompt", got.prompt, want.prompt}, {"input", got.input, want.input},
			{"max_tokens", got.maxTokens, want.maxTokens},
			{"max_completion_tokens", got.maxCompletionTokens, want.maxCompletionTokens}, {"n", got.n, want.n},
			{"best_of", got.bestOf, want.bestOf},
			{"tools", got.tools, want.tools}, {"functions", got.functions, want.functions},
		} {
			if (c.got == nil) != (c.want == nil) || !bytes.Equal(c.got, c.want) {
				t.Fatalf("%s: %q, map holds %q", c.name, c.got, c.want)
			}
		}
	})
}

// FuzzDecodeMessage: decodeMessage decodes every valid JSON value exactly
// as json.Unmarshal into a tokencount.Message does (its UnmarshalJSON:
// exact member names; the same error or none, the same name and raw
// content).
func FuzzDecodeMessage(f *testing.F) {
	for _, s := range []string{
		`{"role":"user","content":"hi"}`, `{"content":"a","Content":"b","CONTENT":null}`,
		`{"name":"x","name":null}`, `{"name":1}`, `{"NaMe":"y","content":[{"type":"text","text":"t"}]}`,
		`{"conte\u006et":"e"}`, `{"tool_calls":[{"id":"c","function":{"name":"f"}}],"content":null}`,
		`{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}],"Tool_Calls":1,"function_call":null}`,
		`null`, `"s"`, `[]`, `{}`, `{"name":"\u00e9"}`, "{\"\xc5\xbf\":1}", `{ "content" : "x" , "name" : "n" }`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if !json.Valid(raw) {
			return // decodeMessage reads values of a validated body only
		}
		raw = bytes.TrimSpace(raw)
		var got, want tokencount.Message
		gotErr := decodeMessage(raw, &got)
		wantErr := json.Unmarshal(raw, &want)
		if (gotErr == nil) != (wantErr == nil) {
			t.Fatalf("error %v, json.Unmarshal %v", gotErr, wantErr)
		}
		if gotErr != nil {
			return
		}
		if got.Name != want.Name || !bytes.Equal(got.Content, want.Content) || (got.Content == nil) != (want.Content == nil) {
			t.Fatalf("got %q %q, json.Unmarshal %q %q", got.Name, got.Content, want.Name, want.Content)
		}
		for _, c := range [][2]json.RawMessage{{got.ToolCalls, want.ToolCalls}, {got.FunctionCall, want.FunctionCall}} {
			if !bytes.Equal(c[0], c[1]) || (c[0] == nil) != (c[1] == nil) {
				t.Fatalf("tool calls %q, json.Unmarshal %q", c[0], c[1])
			}
		}
	})
}

// TestDecodeRequestFieldsAllocatesNothing: reading a body's members
// allocates nothing, whatever their number: 8 MiB of duplicate members, of
// escaped keys, or of escaped field names (each once cost 16 bytes of
// span and, when escaped, a json.Unmarshal of the key: hundreds of MB for
// one request); the last duplicate still wins.
func TestDecodeRequestFieldsAllocatesNothing(t *testing.T) {
	for name, c := range map[string]struct {
		body []byte
		n    string
	}{
		"duplicates":     {[]byte(`{` + strings.Repeat(`"n":0,`, (8<<20)/6) + `"n":7}`), "7"},
		"escaped keys":   {[]byte(`{` + strings.Repeat(`"\n":0,`, (8<<20)/7) + `"n":3}`), "3"},
		"escaped fields": {[]byte(`{` + strings.Repeat(`"\u006e":1,`, (8<<20)/11) + `"\u006E":2}`), "2"},
		"small request":  {[]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"n":5}`), "5"},
	} {
		var f requestFields
		allocs := testing.AllocsPerRun(2, func() {
			f = requestFields{}
			if !decodeRequestFields(c.body, &f) {
				t.Fatalf("%s: refused", name)
			}
		})
		if allocs != 0 || string(f.n) != c.n {
			t.Errorf("%s: %v allocations, n = %s (want 0, %s)", name, allocs, f.n, c.n)
		}
	}
}
