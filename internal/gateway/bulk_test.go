package gateway

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// bulk posts an NDJSON upload to POST /v1/jobs/bulk over HTTP.
func (e *env) bulk(key, body string) *http.Response {
	e.t.Helper()
	req, err := http.NewRequest("POST", e.srv.URL+"/v1/jobs/bulk", strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp
}

type lineResult struct {
	line   int
	code   string // "" when queued
	status int
}

func summarize(r bulkResponse) []lineResult {
	var out []lineResult
	for _, d := range r.Data {
		switch {
		case d.Job != nil && d.Error == nil:
			out = append(out, lineResult{line: d.Line})
		case d.Error != nil && d.Job == nil:
			out = append(out, lineResult{line: d.Line, code: d.Error.Code, status: d.Error.Status})
		default:
			out = append(out, lineResult{line: d.Line, code: "BOTH_OR_NEITHER"})
		}
	}
	return out
}

// TestBulkUploadPerLineResults: each non-blank line is validated and queued
// on its own, results in line order with physical line numbers; once the
// tenant's queue is full every later line is refused queue_full without
// being tried (line 9, malformed, is refused queue_full too), and the
// response carries Retry-After.
func TestBulkUploadPerLineResults(t *testing.T) {
	up := newUpstream(t, okJSON(1, 1))
	a := tenant("a", limiter.Limits{WeightedPerMinute: i64(6000)})
	a.MaxQueued = 3
	e := newEnv(t, up, []registry.TenantPolicy{a, tenant("b", limiter.Limits{})})
	e.pause(60 * time.Second)

	ok := jobBody(10, 100, "")
	upload := strings.Join([]string{
		ok,             // 1
		`{"endpoint":`, // 2: invalid_json
		"",             // 3: blank, skipped
		`{"endpoint":"/v1/chat/completions","body":{"model":"` + testModel + `","messages":[{"role":"user","content":"x"}],"stream":true}}`, // 4
		jobBody(10, 100, `,"webhookURL":"ftp://example.com/hook"`),                                                                          // 5: invalid_request
		ok,                   // 6
		"  " + ok + "\r",     // 7: surrounding blanks are ignored
		jobBody(10, 290, ""), // 8: queue_full
		ok,                   // 9: not tried
		`nonsense`,           // 10: not tried
	}, "\n") + "\n"
	resp := e.bulk("key-a", upload)
	if resp.StatusCode != 200 || resp.Header.Get("Retry-After") != "3" {
		t.Fatalf("status %d Retry-After %q, want 200 and 3 (300 tokens at 100/s)", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	got := decode[bulkResponse](t, resp)
	want := []lineResult{
		{line: 1},
		{line: 2, code: codeInvalidJSON, status: 400},
		{line: 4, code: codeStreamNotSupported, status: 400},
		{line: 5, code: codeInvalidRequest, status: 400},
		{line: 6},
		{line: 7},
		{line: 8, code: codeQueueFull, status: 429},
		{line: 9, code: codeQueueFull, status: 429},
		{line: 10, code: codeQueueFull, status: 429},
	}
	if d := cmp.Diff(want, summarize(got), cmp.AllowUnexported(lineResult{})); d != "" {
		t.Fatalf("per-line results (-want +got):\n%s", d)
	}
	if got.Object != "bulk" || got.Queued != 3 || got.Refused != 6 {
		t.Errorf("object %q queued %d refused %d, want bulk 3 6", got.Object, got.Queued, got.Refused)
	}
	if ra := got.Data[6].Error.RetryAfter; ra == nil || *ra != 3 {
		t.Errorf("line 8 retry_after = %v, want 3", ra)
	}
	if got.Data[1].Error.RetryAfter != nil {
		t.Errorf("line 2 retry_after = %d, want null", *got.Data[1].Error.RetryAfter)
	}
	list, _, err := e.store.List("a", jobs.Filter{})
	if err != nil || len(list) != 3 {
		t.Fatalf("stored jobs of a: %d (%v), want 3", len(list), err)
	}
	for i, idx := range []int{0, 4, 5} {
		if j := got.Data[idx].Job; j.ID != list[i].ID || j.Status != jobs.StatusQueued || j.Tenant != "a" {
			t.Errorf("line %d job %+v, want stored job %s queued", got.Data[idx].Line, j, list[i].ID)
		}
	}
	// Another tenant is unaffected and does not see a's jobs.
	if other := decode[listResponse](t, e.do("GET", "/v1/jobs", "key-b", "")); len(other.Data) != 0 {
		t.Errorf("tenant b lists %d jobs, want 0", len(other.Data))
	}
	e.submit("key-b", jobBody(10, 100, ""))
}

// TestBulkUploadRefusedWhole: an upload is refused as a whole, nothing
// queued, when unidentified, empty or over maxBulkLines.
func TestBulkUploadRefusedWhole(t *testing.T) {
	up := newUpstream(t, okJSON(1, 1))
	a := tenant("a", limiter.Limits{})
	a.MaxQueued = 2 * maxBulkLines
	e := newEnv(t, up, []registry.TenantPolicy{a})
	e.pause(60 * time.Second)

	cases := []struct {
		name, key, body string
		status          int
		code            string
	}{
		{"no key", "", jobBody(1, 1, ""), 401, codeInvalidAPIKey},
		{"empty", "key-a", "\n \n", 400, codeInvalidRequest},
		{"too many", "key-a", strings.Repeat(jobBody(1, 1, "")+"\n", maxBulkLines+1), 413, codeTooManyJobs},
	}
	for _, c := range cases {
		resp := e.bulk(c.key, c.body)
		body := decode[errorBody](t, resp)
		if resp.StatusCode != c.status || body.Error.Code != c.code {
			t.Errorf("%s: %d %+v, want %d %s", c.name, resp.StatusCode, body.Error, c.status, c.code)
		}
	}
	if list, _, _ := e.store.List("a", jobs.Filter{}); len(list) != 0 {
		t.Errorf("%d jobs stored, want 0", len(list))
	}
	// Exactly maxBulkLines is accepted.
	resp := e.bulk("key-a", strings.Repeat(jobBody(1, 1, "")+"\n", maxBulkLines))
	if got := decode[bulkResponse](t, resp); resp.StatusCode != 200 || got.Queued != maxBulkLines || got.Refused != 0 {
		t.Errorf("%d lines: %d queued %d refused %d", maxBulkLines, resp.StatusCode, got.Queued, got.Refused)
	}
}
