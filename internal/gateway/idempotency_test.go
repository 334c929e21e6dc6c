package gateway

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fairshare-dev/fairshare/internal/fairqueue"
	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// doKeyed POSTs body to path as the tenant of key tenantKey with one
// Idempotency-Key field per value of idem.
func (e *env) doKeyed(path, tenantKey, body string, idem ...string) *http.Response {
	e.t.Helper()
	req, err := http.NewRequest("POST", e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tenantKey)
	req.Header.Set("Content-Type", "application/json")
	for _, v := range idem {
		req.Header.Add("Idempotency-Key", v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp
}

// submitKeyed submits body under idem and wants 202; it returns the job and
// whether the answer said it was a replay.
func (e *env) submitKeyed(tenantKey, body, idem string) (jobView, bool) {
	e.t.Helper()
	resp := e.doKeyed("/v1/jobs", tenantKey, body, idem)
	if resp.StatusCode != http.StatusAccepted {
		e.t.Fatalf("keyed submit: %d %s", resp.StatusCode, readAll(e.t, resp))
	}
	replayed := resp.Header.Get("Idempotent-Replayed")
	if replayed != "" && replayed != "true" {
		e.t.Fatalf("Idempotent-Replayed: %q", replayed)
	}
	v := decode[jobView](e.t, resp)
	if loc := resp.Header.Get("Location"); loc != "/v1/jobs/"+v.ID {
		e.t.Fatalf("Location %q, want /v1/jobs/%s", loc, v.ID)
	}
	return v, replayed == "true"
}

// wantError wants resp to be status with the error code and param.
func wantError(t *testing.T, resp *http.Response, status int, code, param string) {
	t.Helper()
	body := decode[errorBody](t, resp)
	p := ""
	if body.Error.Param != nil {
		p = *body.Error.Param
	}
	if resp.StatusCode != status || body.Error.Code != code || p != param {
		t.Fatalf("answer %d %s (param %q) %q, want %d %s (param %q)", resp.StatusCode, body.Error.Code, p, body.Error.Message, status, code, param)
	}
}

func (e *env) queueTotal() int {
	var n int
	e.reg.WithQueue(func(q *fairqueue.Queue) { n = q.Total() })
	return n
}

const idemUUID = "8e03978e-40d5-43e8-bc93-6894a57f9324"

// TestIdempotencyKeyRetryReturnsTheSameJob: a submission retried with its
// Idempotency-Key (quoted or bare, the body re-serialised with other
// whitespace) is answered 202 with the same job, Location and
// Idempotent-Replayed: true, and creates no job: the store, the queue and
// the tenant's bucket are as after the first.
func TestIdempotencyKeyRetryReturnsTheSameJob(t *testing.T) {
	up := newUpstream(t, okJSON(10, 20))
	var creates atomic.Int64
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(100000)})},
		withStore(func(m *jobs.MemStore, _ *clocktesting.FakeClock) jobs.Store {
			return countingStore{MemStore: m, creates: &creates, deletes: &atomic.Int64{}}
		}))
	e.pause(60 * time.Second)
	body := jobBody(10, 100, `,"metadata":{"batch":"b1"},"deadlineSeconds":600`)
	first, replayed := e.submitKeyed("key-a", body, `"`+idemUUID+`"`)
	if replayed || first.Status != jobs.StatusQueued {
		t.Fatalf("first answer: replayed %v, %+v", replayed, first)
	}
	tokens := e.tokensLeft("a")
	retries := []struct{ name, body, idem string }{
		{"the same request", body, `"` + idemUUID + `"`},
		{"the key unquoted", body, idemUUID},
		{"the body re-spaced", strings.ReplaceAll(body, ",", ", "), " \"" + idemUUID + "\"\t"},
	}
	for _, r := range retries {
		got, replayed := e.submitKeyed("key-a", r.body, r.idem)
		if !replayed {
			t.Errorf("%s: not marked Idempotent-Replayed", r.name)
		}
		if diff := cmp.Diff(first, got); diff != "" {
			t.Errorf("%s: the replayed job differs (-first +replay):\n%s", r.name, diff)
		}
	}
	if c := creates.Load(); c != 1 {
		t.Errorf("store creates %d, want 1", c)
	}
	if diff := cmp.Diff(map[jobs.Status]int{jobs.StatusQueued: 1}, e.store.Counts()); diff != "" {
		t.Errorf("store counts (-want +got):\n%s", diff)
	}
	if n := e.queueTotal(); n != 1 {
		t.Errorf("jobs queued %d, want 1", n)
	}
	if got := e.tokensLeft("a"); got != tokens {
		t.Errorf("tenant's tokens %d after the retries, want %d", got, tokens)
	}
	if j, err := e.store.Get(first.ID); err != nil || j.IdempotencyKey != idemUUID || len(j.IdempotencyFingerprint) != 64 {
		t.Errorf("stored job %+v %v, want key %s and a 64-digit fingerprint", j, err, idemUUID)
	}
}

// TestIdempotencyKeyReplaysTheJobsCurrentView: a retry after the job has
// run is answered 202 with the job as it is now (succeeded, its response),
// and the provider is not called again.
func TestIdempotencyKeyReplaysTheJobsCurrentView(t *testing.T) {
	up := newUpstream(t, okJSON(10, 20))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
	first, _ := e.submitKeyed("key-a", jobBody(10, 100, ""), "k1")
	waitFor(t, "the job to succeed", func() bool { return e.storeStatus(first.ID) == jobs.StatusSucceeded })
	got, replayed := e.submitKeyed("key-a", jobBody(10, 100, ""), "k1")
	if !replayed || got.ID != first.ID || got.Status != jobs.StatusSucceeded || got.Usage == nil || got.Usage.CompletionTokens != 20 {
		t.Fatalf("replay: replayed %v, %+v; want job %s succeeded with 20 completion tokens", replayed, got, first.ID)
	}
	if n := up.calls.Load(); n != 1 {
		t.Errorf("provider calls %d, want 1", n)
	}
}

// TestIdempotencyKeyReusedForAnotherRequest: the same key with another
// job (body, metadata, deadline, endpoint or webhook) is 422
// idempotency_key_reused and creates nothing.
func TestIdempotencyKeyReusedForAnotherRequest(t *testing.T) {
	up := newUpstream(t, okJSON(10, 20))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
	e.pause(60 * time.Second)
	e.submitKeyed("key-a", jobBody(10, 100, ""), "k1")
	for name, body := range map[string]string{
		"another body":     jobBody(10, 101, ""),
		"metadata":         jobBody(10, 100, `,"metadata":{"n":1}`),
		"a deadline":       jobBody(10, 100, `,"deadlineSeconds":60`),
		"a webhook":        jobBody(10, 100, `,"webhookURL":"https://example.com/hook"`),
		"another endpoint": `{"endpoint":"/v1/chat/completions","body":{"model":"gpt-test","messages":[{"role":"user","content":"hi"}]}}`,
	} {
		wantError(t, e.doKeyed("/v1/jobs", "key-a", body, "k1"), http.StatusUnprocessableEntity, codeIdempotencyKeyReused, "Idempotency-Key")
		_ = name
	}
	if diff := cmp.Diff(map[jobs.Status]int{jobs.StatusQueued: 1}, e.store.Counts()); diff != "" {
		t.Errorf("store counts (-want +got):\n%s", diff)
	}
}

// TestIdempotencyKeyIsPerTenant: another tenant's job never answers a key:
// the same key (with the same or another body) is a new job of tenant b,
// not a replay and not a 422.
func TestIdempotencyKeyIsPerTenant(t *testing.T) {
	up := newUpstream(t, okJSON(10, 20))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{}), tenant("b", limiter.Limits{})})
	e.pause(60 * time.Second)
	a, _ := e.submitKeyed("key-a", jobBody(10, 100, ""), "shared")
	b, replayed := e.submitKeyed("key-b", jobBody(10, 100, ""), "shared")
	if replayed || b.ID == a.ID || b.Tenant != "b" {
		t.Fatalf("tenant b's submission: replayed %v, %+v; want a new job of b", replayed, b)
	}
	c, replayed := e.submitKeyed("key-b", jobBody(10, 100, ""), "other")
	if replayed || c.ID == a.ID || c.ID == b.ID {
		t.Fatalf("tenant b's second key: replayed %v, %+v", replayed, c)
	}
	resp := e.doKeyed("/v1/jobs", "key-a", jobBody(10, 100, ""), "other")
	if resp.StatusCode != http.StatusAccepted || resp.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("tenant a with b's key: %d, replayed %q; want a new job", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"))
	}
	if diff := cmp.Diff(map[jobs.Status]int{jobs.StatusQueued: 4}, e.store.Counts()); diff != "" {
		t.Errorf("store counts (-want +got):\n%s", diff)
	}
}

// TestIdempotencyKeyConcurrentRetriesCreateOneJob: N submissions with one
// key at once create exactly one job; every answer is 202 with that job
// (once new, else replayed) or 409 idempotency_key_in_use.
func TestIdempotencyKeyConcurrentRetriesCreateOneJob(t *testing.T) {
	up := newUpstream(t, okJSON(10, 20))
	var creates atomic.Int64
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})},
		withStore(func(m *jobs.MemStore, _ *clocktesting.FakeClock) jobs.Store {
			return countingStore{MemStore: m, creates: &creates, deletes: &atomic.Int64{}}
		}))
	e.pause(60 * time.Second)
	const n = 16
	type answer struct {
		status   int
		id, code string
		replayed bool
	}
	answers := make([]answer, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			resp := e.doKeyed("/v1/jobs", "key-a", jobBody(10, 100, ""), "k1")
			b := readAll(t, resp)
			a := answer{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true"}
			var v struct {
				ID    string      `json:"id"`
				Error errorDetail `json:"error"`
			}
			_ = json.Unmarshal(b, &v)
			a.id, a.code = v.ID, v.Error.Code
			answers[i] = a
		})
	}
	close(start)
	wg.Wait()
	var id string
	fresh := 0
	for _, a := range answers {
		switch {
		case a.status == http.StatusAccepted:
			if id == "" {
				id = a.id
			}
			if a.id != id {
				t.Errorf("answers name jobs %s and %s", id, a.id)
			}
			if !a.replayed {
				fresh++
			}
		case a.status == http.StatusConflict && a.code == codeIdempotencyKeyInUse:
		default:
			t.Errorf("answer %+v, want 202 or 409 %s", a, codeIdempotencyKeyInUse)
		}
	}
	if fresh != 1 {
		t.Errorf("%d answers created a job, want 1", fresh)
	}
	if c := creates.Load(); c != 1 {
		t.Errorf("store creates %d, want 1", c)
	}
	if diff := cmp.Diff(map[jobs.Status]int{jobs.StatusQueued: 1}, e.store.Counts()); diff != "" {
		t.Errorf("store counts (-want +got):\n%s", diff)
	}
}

// TestIdempotencyKeyStoreCreateChecksUnderItsLock: jobs.Store.Create with a
// key a stored job of the tenant holds stores nothing and returns that job
// with jobs.ErrIdempotencyKeyHeld, from any number of goroutines at once;
// the gateway answers such a Create (another process on the same store) as
// a replay.
func TestIdempotencyKeyStoreCreateChecksUnderItsLock(t *testing.T) {
	s := jobs.NewMemStore(clocktesting.NewFakeClock(t0), 0, 0)
	const n = 16
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			j, err := s.Create(jobs.Job{Tenant: "a", Status: jobs.StatusQueued, IdempotencyKey: "k1", IdempotencyFingerprint: "f"})
			ids[i], errs[i] = j.ID, err
		})
	}
	wg.Wait()
	held := 0
	for i := range n {
		if errs[i] != nil && errs[i] != jobs.ErrIdempotencyKeyHeld {
			t.Fatalf("Create: %v", errs[i])
		}
		if errs[i] != nil {
			held++
		}
		if ids[i] != ids[0] {
			t.Fatalf("Create returned jobs %s and %s", ids[0], ids[i])
		}
	}
	if held != n-1 {
		t.Errorf("%d Creates found the key held, want %d", held, n-1)
	}
	if diff := cmp.Diff(map[jobs.Status]int{jobs.StatusQueued: 1}, s.Counts()); diff != "" {
		t.Errorf("store counts (-want +got):\n%s", diff)
	}

	// The gateway's lookup misses (the job is created by another process
	// between its lookup and its Create): its Create is answered as a
	// replay.
	up := newUpstream(t, okJSON(10, 20))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})},
		withStore(func(m *jobs.MemStore, _ *clocktesting.FakeClock) jobs.Store { return blindStore{m} }))
	e.pause(60 * time.Second)
	first, _ := e.submitKeyed("key-a", jobBody(10, 100, ""), "k1")
	got, replayed := e.submitKeyed("key-a", jobBody(10, 100, ""), "k1")
	if !replayed || got.ID != first.ID {
		t.Errorf("second submission: replayed %v, job %s; want a replay of %s", replayed, got.ID, first.ID)
	}
	wantError(t, e.doKeyed("/v1/jobs", "key-a", jobBody(10, 5, ""), "k1"), http.StatusUnprocessableEntity, codeIdempotencyKeyReused, "Idempotency-Key")
	if diff := cmp.Diff(map[jobs.Status]int{jobs.StatusQueued: 1}, e.store.Counts()); diff != "" {
		t.Errorf("gateway's store counts (-want +got):\n%s", diff)
	}
}

// blindStore never finds a job by its idempotency key, as a store written
// by another process since the lookup.
type blindStore struct{ *jobs.MemStore }

func (blindStore) ByIdempotencyKey(string, string) (jobs.Job, bool) { return jobs.Job{}, false }

// TestIdempotencyKeyFreedWhenTheJobIsPruned: once the job is pruned
// (retention), its key makes a new job.
func TestIdempotencyKeyFreedWhenTheJobIsPruned(t *testing.T) {
	up := newUpstream(t, okJSON(10, 20))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
	first, _ := e.submitKeyed("key-a", jobBody(10, 100, ""), "k1")
	waitFor(t, "the job to succeed", func() bool { return e.storeStatus(first.ID) == jobs.StatusSucceeded })
	e.clock.Step(jobs.DefaultRetention - time.Second)
	if got, replayed := e.submitKeyed("key-a", jobBody(10, 100, ""), "k1"); !replayed || got.ID != first.ID {
		t.Fatalf("within retention: replayed %v, job %s; want a replay of %s", replayed, got.ID, first.ID)
	}
	e.clock.Step(time.Second)
	second, replayed := e.submitKeyed("key-a", jobBody(10, 100, ""), "k1")
	if replayed || second.ID == first.ID {
		t.Fatalf("after retention: replayed %v, job %s; want a new job", replayed, second.ID)
	}
	if _, err := e.store.Get(first.ID); err != jobs.ErrNotFound {
		t.Errorf("the first job is still stored: %v", err)
	}
}

// TestIdempotencyKeyOfARefusedSubmissionStaysFree: a submission refused
// (a full queue, an invalid body) stores nothing, so its key makes the job
// when the retry is accepted, with a request that may differ from the
// refused one.
func TestIdempotencyKeyOfARefusedSubmissionStaysFree(t *testing.T) {
	up := newUpstream(t, okJSON(10, 20))
	tp := tenant("a", limiter.Limits{})
	tp.MaxQueued = 1
	e := newEnv(t, up, []registry.TenantPolicy{tp})
	e.pause(60 * time.Second)
	dequeued := e.trackDequeued()
	blocker := e.submit("key-a", jobBody(10, 100, ""))
	e.waitPutBack(t, dequeued, blocker.ID)
	wantError(t, e.doKeyed("/v1/jobs", "key-a", jobBody(10, 100, ""), "k1"), http.StatusTooManyRequests, codeQueueFull, "")
	wantError(t, e.doKeyed("/v1/jobs", "key-a", `{"endpoint":"/v1/completions","body":{"model":"nope","prompt":"x"}}`, "k1"), http.StatusBadRequest, codeModelNotFound, "body.model")
	if resp := e.do("DELETE", "/v1/jobs/"+blocker.ID, "key-a", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("cancel: %d %s", resp.StatusCode, readAll(t, resp))
	}
	got, replayed := e.submitKeyed("key-a", jobBody(10, 100, ""), "k1")
	if replayed || got.ID == blocker.ID || got.Status != jobs.StatusQueued {
		t.Fatalf("retry: replayed %v, %+v; want a new queued job", replayed, got)
	}
	if diff := cmp.Diff(map[jobs.Status]int{jobs.StatusQueued: 1, jobs.StatusCancelled: 1}, e.store.Counts()); diff != "" {
		t.Errorf("store counts (-want +got):\n%s", diff)
	}
}

// TestIdempotencyKeyMalformed: a malformed, empty, too long or repeated
// Idempotency-Key, or an idempotencyKey member in POST /v1/jobs's body, is
// 400 invalid_idempotency_key and stores nothing.
func TestIdempotencyKeyMalformed(t *testing.T) {
	up := newUpstream(t, okJSON(10, 20))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
	e.pause(60 * time.Second)
	for _, c := range []struct {
		name string
		idem []string
	}{
		{"empty string", []string{`""`}},
		{"empty field", []string{``}},
		{"no closing quote", []string{`"abc`}},
		{"a bad escape", []string{`"a\bc"`}},
		{"parameters", []string{`"abc";p=1`}},
		{"two strings", []string{`"abc", "def"`}},
		{"a bare key with a space", []string{`a b`}},
		{"a bare key with a comma", []string{`a,b`}},
		{"not ASCII", []string{"\"caf\xc3\xa9\""}},
		{"a bare key not ASCII", []string{"caf\xc3\xa9"}},
		{"256 characters", []string{`"` + strings.Repeat("k", 256) + `"`}},
		{"two fields", []string{`"a"`, `"a"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			wantError(t, e.doKeyed("/v1/jobs", "key-a", jobBody(10, 100, ""), c.idem...), http.StatusBadRequest, codeInvalidIdempotencyKey, "Idempotency-Key")
		})
	}
	wantError(t, e.doKeyed("/v1/jobs", "key-a", jobBody(10, 100, `,"idempotencyKey":"k1"`)), http.StatusBadRequest, codeInvalidIdempotencyKey, "idempotencyKey")
	if n := len(e.store.Counts()); n != 0 {
		t.Fatalf("store counts %v, want none", e.store.Counts())
	}
	// The bounds: 255 characters, escapes, and every printable character.
	long := strings.Repeat("k", 255)
	if j, _ := e.submitKeyed("key-a", jobBody(10, 100, ""), `"`+long+`"`); j.ID == "" {
		t.Fatal("no job")
	}
	j, _ := e.submitKeyed("key-a", jobBody(10, 100, ""), `"a \"b\" \\ c"`)
	if s, _ := e.store.Get(j.ID); s.IdempotencyKey != `a "b" \ c` {
		t.Errorf("stored key %q, want %q", s.IdempotencyKey, `a "b" \ c`)
	}
}

// TestIdempotencyKeyPerBulkLine: each line of a bulk upload may carry its
// idempotencyKey; the upload retried is answered with the same jobs,
// "replayed": true, none queued; a line whose key holds another job is 422;
// an Idempotency-Key field on the upload is 400.
func TestIdempotencyKeyPerBulkLine(t *testing.T) {
	up := newUpstream(t, okJSON(10, 20))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
	e.pause(60 * time.Second)
	upload := jobBody(10, 100, `,"idempotencyKey":"l1"`) + "\n" + jobBody(10, 100, `,"idempotencyKey":"l2"`) + "\n" + jobBody(10, 100, "") + "\n"
	first := decode[bulkResponse](t, e.bulk("key-a", upload))
	if first.Queued != 3 || first.Refused != 0 {
		t.Fatalf("first upload: %+v", first)
	}
	again := decode[bulkResponse](t, e.bulk("key-a", upload))
	if again.Queued != 1 || again.Refused != 0 || len(again.Data) != 3 {
		t.Fatalf("retried upload: %+v, want 1 queued (the line without a key)", again)
	}
	for i := range 2 {
		if l := again.Data[i]; !l.Replayed || l.Job == nil || l.Job.ID != first.Data[i].Job.ID {
			t.Errorf("line %d: %+v, want job %s replayed", i+1, l, first.Data[i].Job.ID)
		}
	}
	if l := again.Data[2]; l.Replayed || l.Job == nil || l.Job.ID == first.Data[2].Job.ID {
		t.Errorf("line 3 (no key): %+v, want a new job", l)
	}
	// A key given by POST /v1/jobs answers a bulk line of the same job.
	single, _ := e.submitKeyed("key-a", jobBody(10, 100, ""), "s1")
	mixed := decode[bulkResponse](t, e.bulk("key-a", jobBody(10, 100, `,"idempotencyKey":"s1"`)+"\n"+jobBody(10, 7, `,"idempotencyKey":"l1"`)+"\n"))
	if l := mixed.Data[0]; !l.Replayed || l.Job == nil || l.Job.ID != single.ID {
		t.Errorf("line of the single submission: %+v, want job %s replayed", l, single.ID)
	}
	if l := mixed.Data[1]; l.Error == nil || l.Error.Status != http.StatusUnprocessableEntity || l.Error.Code != codeIdempotencyKeyReused || l.Error.Param == nil || *l.Error.Param != "idempotencyKey" {
		t.Errorf("line reusing l1 for another job: %+v, want 422 %s", l, codeIdempotencyKeyReused)
	}
	if mixed.Queued != 0 || mixed.Refused != 1 {
		t.Errorf("mixed upload: queued %d refused %d, want 0 and 1", mixed.Queued, mixed.Refused)
	}
	wantError(t, e.doKeyed("/v1/jobs/bulk", "key-a", upload, "u1"), http.StatusBadRequest, codeInvalidIdempotencyKey, "Idempotency-Key")
	if diff := cmp.Diff(map[jobs.Status]int{jobs.StatusQueued: 5}, e.store.Counts()); diff != "" {
		t.Errorf("store counts (-want +got):\n%s", diff)
	}
}

// TestIdempotencyKeyBulkAfterAFullQueue: once a line is refused for a full
// queue, a later line whose key holds its job is still answered with it.
func TestIdempotencyKeyBulkAfterAFullQueue(t *testing.T) {
	up := newUpstream(t, okJSON(10, 20))
	tp := tenant("a", limiter.Limits{})
	tp.MaxQueued = 1
	e := newEnv(t, up, []registry.TenantPolicy{tp})
	e.pause(60 * time.Second)
	held, _ := e.submitKeyed("key-a", jobBody(10, 100, ""), "l2")
	resp := decode[bulkResponse](t, e.bulk("key-a", jobBody(10, 100, `,"idempotencyKey":"l1"`)+"\n"+jobBody(10, 100, `,"idempotencyKey":"l2"`)+"\n"+jobBody(10, 100, `,"idempotencyKey":"l3"`)+"\n"))
	if l := resp.Data[0]; l.Error == nil || l.Error.Code != codeQueueFull {
		t.Errorf("line 1: %+v, want %s", l, codeQueueFull)
	}
	if l := resp.Data[1]; !l.Replayed || l.Job == nil || l.Job.ID != held.ID {
		t.Errorf("line 2: %+v, want job %s replayed", l, held.ID)
	}
	if l := resp.Data[2]; l.Error == nil || l.Error.Code != codeQueueFull {
		t.Errorf("line 3: %+v, want %s", l, codeQueueFull)
	}
	if resp.Queued != 0 || resp.Refused != 2 {
		t.Errorf("queued %d refused %d, want 0 and 2", resp.Queued, resp.Refused)
	}
}

// TestIdempotencyKeyHeldUntilARefusedJobIsRemoved: a keyed submission
// stored and then refused for a full queue, whose removal the store failed
// to write, keeps its key in flight until the removal is made: a retry
// meanwhile is 409 idempotency_key_in_use, not a replay of the refused job
// (which the client was told was refused and which is about to go); once
// removed, the key is free.
func TestIdempotencyKeyHeldUntilARefusedJobIsRemoved(t *testing.T) {
	up := newUpstream(t, okJSON(10, 20))
	tp := tenant("a", limiter.Limits{})
	tp.MaxQueued = 1
	e, fs := newFaultStoreEnv(t, up, []registry.TenantPolicy{tp})
	e.pause(60 * time.Second)
	fill := func() { e.submit("key-a", jobBody(10, 100, "")) }
	fs.beforeCreate.Store(&fill)
	fs.deleteFails.Store(1)
	wantError(t, e.doKeyed("/v1/jobs", "key-a", jobBody(10, 100, ""), "k1"), http.StatusTooManyRequests, codeQueueFull, "")
	if _, ok := e.store.ByIdempotencyKey("a", "k1"); !ok {
		t.Fatal("the refused job's record is gone already; the test needs its removal to have failed")
	}
	wantError(t, e.doKeyed("/v1/jobs", "key-a", jobBody(10, 100, ""), "k1"), http.StatusConflict, codeIdempotencyKeyInUse, "")
	e.clock.Step(storeRetry)
	e.gw.dispatch.wake()
	waitFor(t, "the refused job to be removed", func() bool {
		_, ok := e.store.ByIdempotencyKey("a", "k1")
		return !ok
	})
	waitFor(t, "the key to be released", func() bool {
		resp := e.doKeyed("/v1/jobs", "key-a", jobBody(10, 100, ""), "k1")
		body := decode[errorBody](t, resp)
		return resp.StatusCode == http.StatusTooManyRequests && body.Error.Code == codeQueueFull
	})
}
