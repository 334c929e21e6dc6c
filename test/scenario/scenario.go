// Package scenario is the workload of `make demo` and of the e2e test: on a real local
// control plane with the operator, a scheduler and the provider simulator (package
// framework), tenant "bulk" enqueues a large import at once, tenants "small" and
// "premium" (weight 3) enqueue jobs after it and make interactive calls, and the
// outcome (jobs done, tokens, shares, expiries, the small tenant's dispatch positions,
// upstream 429s, the backlog seen in `kubectl get tenantquotas`) is measured.
package scenario

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	quotav1alpha1 "github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/test/framework"
)

// Options size the workload.
type Options struct {
	WorkDir string
	// BulkJobs is the size of the bulk import (2,000 in the demo).
	BulkJobs int
	// SmallJobs and PremiumJobs are enqueued once the bulk import is queued.
	SmallJobs, PremiumJobs int
	// InteractiveCalls is the number of interactive calls each of small and premium makes.
	InteractiveCalls int
	// MaxTokens is every request's max_tokens.
	MaxTokens int
	// Simulator is the provider's quota.
	Simulator framework.SimulatorOptions
	// ProgressEvery is the period of progress lines; KubectlEvery of `kubectl get tenantquotas`.
	ProgressEvery, KubectlEvery time.Duration
	// Timeout bounds the workload part.
	Timeout time.Duration
	// Out receives progress; nil discards it.
	Out io.Writer
	// Hold, when set, is called with the outcome once the workload has
	// finished, before anything is stopped (the demo's -keep: everything
	// stays up until Hold returns); ctx is Run's.
	Hold func(ctx context.Context, env *framework.Env, out *Outcome)
}

// Namespace of the scenario's objects.
const Namespace = "fairshare-demo"

// Tenants of config/samples, in display order.
var Tenants = []string{"bulk", "small", "premium"}

// TenantOutcome is one tenant's result.
type TenantOutcome struct {
	Tenant                                string
	Submitted, Succeeded, Expired, Failed int
	PromptTokens, CompletionTokens        int64
	WeightedTokens                        int64
	Share                                 float64 // of all weighted tokens used
	FirstDispatch, LastDispatch           int64
	LastFinished                          time.Time
	InteractiveOK, InteractiveRejected    int
	InteractiveCodes                      map[int]int
}

// Outcome is the measured result of a run.
type Outcome struct {
	Tenants map[string]*TenantOutcome
	// SmallPositions are the dispatch positions (1-based, pool-wide) of small's jobs.
	SmallPositions []int64
	// SmallEnqueuedAfter is the number of jobs dispatched before small enqueued its first.
	SmallEnqueuedAfter int
	// BulkRemainingWhenSmallDone counts bulk jobs not yet finished when small's last job finished.
	BulkRemainingWhenSmallDone int
	// PremiumToBulkRatio is premium's weighted tokens over bulk's among the jobs dispatched
	// while both had jobs waiting in the queue; -1 when they never were both backlogged.
	PremiumToBulkRatio float64
	// Upstream429 is the count of 429s the simulator sent.
	Upstream429 int64
	// BulkBacklogSeen is the sequence of bulk backlog figures read from TenantQuota status.
	BulkBacklogSeen []int64
	// KubectlSnapshots are the `kubectl get tenantquotas` outputs shown during the run.
	KubectlSnapshots []string
	Duration         time.Duration
}

// Run starts the environment, drives the workload and returns the outcome. It stops
// everything it started before returning.
func Run(ctx context.Context, o Options) (*Outcome, error) {
	out := o.Out
	if out == nil {
		out = io.Discard
	}
	logf := func(format string, args ...any) { fmt.Fprintf(out, "==> "+format+"\n", args...) }
	env, err := framework.StartEnv(ctx, o.WorkDir, Namespace, o.Simulator, logf)
	if err != nil {
		return nil, err
	}
	defer env.Stop()
	logf("waiting for the tenants to be Ready")
	if err := waitTenantsReady(ctx, env); err != nil {
		return nil, err
	}
	snap, _ := framework.Kubectl(ctx, env.CP.Kubeconfig, "get", "tenantquotas", "-n", Namespace)
	fmt.Fprint(out, snap)
	r := &run{env: env, o: o, out: out, outcome: &Outcome{Tenants: map[string]*TenantOutcome{}}}
	for _, t := range Tenants {
		r.outcome.Tenants[t] = &TenantOutcome{Tenant: t, InteractiveCodes: map[int]int{}}
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	if err := r.drive(ctx); err != nil {
		if errors.Is(err, ErrInterrupted) {
			return nil, err // no outcome was collected
		}
		if parent.Err() != nil { // cancelled while a step was under way
			return nil, fmt.Errorf("%w (%v)", ErrInterrupted, err)
		}
		return r.outcome, fmt.Errorf("%w\nscheduler log tail:\n%s", err, env.Scheduler.Tail(40))
	}
	if o.Hold != nil {
		o.Hold(parent, env, r.outcome)
	}
	return r.outcome, nil
}

// ErrInterrupted is Run's error when its context was cancelled (the demo's
// Ctrl-C) before the workload finished: no outcome is returned.
var ErrInterrupted = errors.New("interrupted before the workload finished")

func waitTenantsReady(ctx context.Context, env *framework.Env) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		var list quotav1alpha1.TenantQuotaList
		if err := env.CP.Client.List(ctx, &list, client.InNamespace(Namespace)); err != nil {
			return err
		}
		ready := 0
		for _, tq := range list.Items {
			for _, c := range tq.Status.Conditions {
				if c.Type == quotav1alpha1.ConditionReady && c.Status == "True" {
					ready++
				}
			}
		}
		if ready == len(Tenants) && len(list.Items) == len(Tenants) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("tenants not Ready after 60s (%d of %d)\noperator log:\n%s", ready, len(Tenants), env.Operator.Tail(30))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

type run struct {
	env     *framework.Env
	o       Options
	out     io.Writer
	outcome *Outcome
	mu      sync.Mutex
	start   time.Time
	// submitted is set once every submission and interactive call has returned.
	submitted atomic.Bool
}

var httpClient = &http.Client{Timeout: 60 * time.Second}

// chatBody is the OpenAI-style request every job and call sends.
func chatBody(tenant string, i, maxTokens int, stream bool) map[string]any {
	b := map[string]any{
		"model": "sim-gpt",
		"messages": []map[string]string{
			{"role": "system", "content": "You summarise documents in one paragraph."},
			{"role": "user", "content": fmt.Sprintf("Summarise document %d of tenant %s: quarterly figures, risks and next steps.", i, tenant)},
		},
		"max_tokens": maxTokens,
	}
	if stream {
		b["stream"] = true
	}
	return b
}

func (r *run) do(ctx context.Context, method, tenant, path string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, r.env.SchedulerURL+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Fairshare-Tenant", tenant)
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// submit enqueues n jobs for tenant with `workers` parallel clients.
func (r *run) submit(ctx context.Context, tenant string, n, workers int) error {
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1))
				if i > n || ctx.Err() != nil {
					return
				}
				code, body, err := r.do(ctx, http.MethodPost, tenant, "/v1/jobs", map[string]any{
					"body": chatBody(tenant, i, r.o.MaxTokens, false),
				})
				if err == nil && code != http.StatusAccepted {
					err = fmt.Errorf("POST /v1/jobs for %s: %d %s", tenant, code, body)
				}
				if err != nil {
					once.Do(func() { firstErr = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	r.mu.Lock()
	r.outcome.Tenants[tenant].Submitted += n
	r.mu.Unlock()
	return firstErr
}

// interactive makes n calls for tenant, one a second, alternating plain and streaming.
func (r *run) interactive(ctx context.Context, tenant string, n int) {
	for i := 0; i < n && ctx.Err() == nil; i++ {
		code, _, err := r.do(ctx, http.MethodPost, tenant, "/v1/chat/completions", chatBody(tenant, i, r.o.MaxTokens, i%2 == 1))
		r.mu.Lock()
		t := r.outcome.Tenants[tenant]
		switch {
		case err != nil:
			t.InteractiveCodes[0]++
		case code == http.StatusOK:
			t.InteractiveOK++
			t.InteractiveCodes[code]++
		default:
			t.InteractiveRejected++
			t.InteractiveCodes[code]++
		}
		r.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (r *run) drive(ctx context.Context) error {
	r.start = time.Now()
	fmt.Fprintf(r.out, "==> bulk enqueues %d jobs at once\n", r.o.BulkJobs)
	if err := r.submit(ctx, "bulk", r.o.BulkJobs, 16); err != nil {
		return err
	}
	r.waitForPacing(ctx)
	fmt.Fprintf(r.out, "==> small enqueues %d jobs and premium %d jobs after the import; both make %d interactive calls\n",
		r.o.SmallJobs, r.o.PremiumJobs, r.o.InteractiveCalls)
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, t := range []struct {
		name string
		n    int
	}{{"small", r.o.SmallJobs}, {"premium", r.o.PremiumJobs}} {
		wg.Add(2)
		go func() { defer wg.Done(); errs <- r.submit(ctx, t.name, t.n, 8) }()
		go func() { defer wg.Done(); r.interactive(ctx, t.name, r.o.InteractiveCalls) }()
	}
	progressDone := make(chan struct{})
	go r.progress(ctx, progressDone)
	wg.Wait()
	r.submitted.Store(true)
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	<-progressDone
	switch err := ctx.Err(); {
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("workload did not finish in %s", r.o.Timeout)
	case err != nil:
		return fmt.Errorf("%w (after %s)", ErrInterrupted, time.Since(r.start).Round(time.Second))
	}
	r.outcome.Duration = time.Since(r.start)
	if s, err := framework.Kubectl(ctx, r.env.CP.Kubeconfig, "get", "providerpools", "-n", Namespace, "-o", "wide"); err == nil {
		fmt.Fprintf(r.out, "$ kubectl get providerpools -n %s -o wide\n%s", Namespace, s)
	}
	return r.collect(ctx)
}

// waitForPacing waits (at most a minute) until the import has spent the provider's
// initial burst, so that small and premium arrive while the throttle paces the pool
// and every tenant's jobs wait their turn: the pool's remainingTokens (written by the
// scheduler from the provider's headers) falls below 30% of the model's limit.
func (r *run) waitForPacing(ctx context.Context) {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		var pool quotav1alpha1.ProviderPool
		if err := r.env.CP.Client.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: r.env.Pool}, &pool); err == nil {
			for _, m := range pool.Status.Models {
				if m.RemainingTokens != nil && m.LimitTokens != nil && *m.RemainingTokens*100 < *m.LimitTokens*30 {
					fmt.Fprintf(r.out, "==> the import has spent the provider's burst (%d of %d tokens left): the throttle paces the pool now\n",
						*m.RemainingTokens, *m.LimitTokens)
					return
				}
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// progress prints a line per ProgressEvery and kubectl output per KubectlEvery until every
// job reached a final state.
func (r *run) progress(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	tick := time.NewTicker(r.o.ProgressEvery)
	defer tick.Stop()
	lastKubectl := time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var list quotav1alpha1.TenantQuotaList
		if err := r.env.CP.Client.List(ctx, &list, client.InNamespace(Namespace)); err == nil {
			var parts []string
			for _, tq := range list.Items {
				parts = append(parts, fmt.Sprintf("%s backlog=%s in-flight=%s", tq.Name, num(tq.Status.Backlog), num(tq.Status.InFlight)))
				if tq.Name == "bulk" && tq.Status.Backlog != nil {
					r.outcome.BulkBacklogSeen = append(r.outcome.BulkBacklogSeen, *tq.Status.Backlog)
				}
			}
			fmt.Fprintf(r.out, "[%5.1fs] %s\n", time.Since(r.start).Seconds(), strings.Join(parts, " | "))
		}
		if time.Since(lastKubectl) >= r.o.KubectlEvery {
			lastKubectl = time.Now()
			if s, err := framework.Kubectl(ctx, r.env.CP.Kubeconfig, "get", "tenantquotas", "-n", Namespace); err == nil {
				r.outcome.KubectlSnapshots = append(r.outcome.KubectlSnapshots, s)
				fmt.Fprintf(r.out, "$ kubectl get tenantquotas -n %s\n%s", Namespace, s)
			}
		}
		if r.allFinal(ctx) {
			return
		}
	}
}

func num(p *int64) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprint(*p)
}

// allFinal reports whether every submission has returned and no tenant has a queued or
// running job.
func (r *run) allFinal(ctx context.Context) bool {
	if !r.submitted.Load() {
		return false
	}
	for _, t := range Tenants {
		for _, s := range []string{"queued", "running"} {
			jobs, _, err := r.listPage(ctx, t, s, "", 1)
			if err != nil || len(jobs) > 0 {
				return false
			}
		}
	}
	return true
}

// Job is the part of the job API's job object the scenario reads.
type Job struct {
	ID          string     `json:"id"`
	Tenant      string     `json:"tenant"`
	Status      string     `json:"status"`
	DispatchSeq int64      `json:"dispatch_seq"`
	CreatedAt   *time.Time `json:"created_at"`
	StartedAt   *time.Time `json:"started_at"`
	FinishedAt  *time.Time `json:"finished_at"`
	Usage       *struct {
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
	} `json:"usage"`
}

type jobList struct {
	Data    []Job  `json:"data"`
	HasMore bool   `json:"has_more"`
	LastID  string `json:"last_id"`
}

func (r *run) listPage(ctx context.Context, tenant, status, after string, limit int) ([]Job, bool, error) {
	q := url.Values{"limit": {fmt.Sprint(limit)}}
	if status != "" {
		q.Set("status", status)
	}
	if after != "" {
		q.Set("after", after)
	}
	code, body, err := r.do(ctx, http.MethodGet, tenant, "/v1/jobs?"+q.Encode(), nil)
	if err != nil {
		return nil, false, err
	}
	if code != http.StatusOK {
		return nil, false, fmt.Errorf("GET /v1/jobs: %d %s", code, body)
	}
	var l jobList
	if err := json.Unmarshal(body, &l); err != nil {
		return nil, false, err
	}
	return l.Data, l.HasMore, nil
}

func (r *run) listAll(ctx context.Context, tenant string) ([]Job, error) {
	var all []Job
	after := ""
	for {
		page, more, err := r.listPage(ctx, tenant, "", after, 500)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		if !more || len(page) == 0 {
			return all, nil
		}
		after = page[len(page)-1].ID
	}
}

// dispatchedBefore counts the jobs of every tenant started before the first of
// tenant's jobs was created.
func dispatchedBefore(all map[string][]Job, tenant []Job) int {
	var first time.Time
	for _, j := range tenant {
		if j.CreatedAt != nil && (first.IsZero() || j.CreatedAt.Before(first)) {
			first = *j.CreatedAt
		}
	}
	n := 0
	for _, js := range all {
		for _, j := range js {
			if j.StartedAt != nil && j.StartedAt.Before(first) {
				n++
			}
		}
	}
	return n
}

// backloggedRatio is a's weighted tokens over b's, counting only the jobs
// dispatched while both a and b had other jobs waiting in the queue: the
// share the fair queue gave them under contention; -1 when no job of b
// was dispatched while both were backlogged.
func backloggedRatio(a, b []Job) float64 {
	waiting := func(js []Job, self Job, t time.Time) bool {
		for _, j := range js {
			if j.ID != self.ID && j.CreatedAt != nil && j.StartedAt != nil && !j.CreatedAt.After(t) && j.StartedAt.After(t) {
				return true
			}
		}
		return false
	}
	sum := func(js []Job, other []Job) int64 {
		var n int64
		for _, j := range js {
			if j.StartedAt == nil || j.Usage == nil {
				continue
			}
			if waiting(js, j, *j.StartedAt) && waiting(other, j, *j.StartedAt) {
				n += j.Usage.PromptTokens*inputWeight + j.Usage.CompletionTokens*outputWeight
			}
		}
		return n
	}
	sa, sb := sum(a, b), sum(b, a)
	if sb == 0 {
		return -1 // b never ran while both were backlogged: no ratio
	}
	return float64(sa) / float64(sb)
}

// Output-token weight of the sample pool's cost model (the API default).
const inputWeight, outputWeight = 1, 4

func (r *run) collect(ctx context.Context) error {
	jobs := map[string][]Job{}
	var total int64
	for _, t := range Tenants {
		js, err := r.listAll(ctx, t)
		if err != nil {
			return err
		}
		jobs[t] = js
		to := r.outcome.Tenants[t]
		to.FirstDispatch = -1
		for _, j := range js {
			switch j.Status {
			case "succeeded":
				to.Succeeded++
			case "expired":
				to.Expired++
			default:
				to.Failed++
			}
			if j.Usage != nil {
				to.PromptTokens += j.Usage.PromptTokens
				to.CompletionTokens += j.Usage.CompletionTokens
			}
			if j.DispatchSeq > 0 {
				if to.FirstDispatch < 0 || j.DispatchSeq < to.FirstDispatch {
					to.FirstDispatch = j.DispatchSeq
				}
				to.LastDispatch = max(to.LastDispatch, j.DispatchSeq)
			}
			if j.FinishedAt != nil && j.FinishedAt.After(to.LastFinished) {
				to.LastFinished = *j.FinishedAt
			}
		}
		to.WeightedTokens = to.PromptTokens*inputWeight + to.CompletionTokens*outputWeight
		total += to.WeightedTokens
	}
	for _, t := range Tenants {
		if total > 0 {
			r.outcome.Tenants[t].Share = float64(r.outcome.Tenants[t].WeightedTokens) / float64(total)
		}
	}
	for _, j := range jobs["small"] {
		if j.DispatchSeq > 0 {
			r.outcome.SmallPositions = append(r.outcome.SmallPositions, j.DispatchSeq)
		}
	}
	sort.Slice(r.outcome.SmallPositions, func(a, b int) bool { return r.outcome.SmallPositions[a] < r.outcome.SmallPositions[b] })
	smallDone := r.outcome.Tenants["small"].LastFinished
	for _, j := range jobs["bulk"] {
		if j.FinishedAt == nil || j.FinishedAt.After(smallDone) {
			r.outcome.BulkRemainingWhenSmallDone++
		}
	}
	r.outcome.SmallEnqueuedAfter = dispatchedBefore(jobs, jobs["small"])
	r.outcome.PremiumToBulkRatio = backloggedRatio(jobs["premium"], jobs["bulk"])
	var stats struct {
		Throttled int64 `json:"throttled"`
	}
	resp, err := httpClient.Get(r.env.SimulatorURL + "/stats")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&stats); err != nil {
		return fmt.Errorf("simulator /stats: %w", err)
	}
	r.outcome.Upstream429 = stats.Throttled
	return nil
}

// Print writes the outcome table.
func (o *Outcome) Print(w io.Writer) {
	fmt.Fprintf(w, "\n==> outcome after %s\n", o.Duration.Round(time.Second))
	fmt.Fprintf(w, "%-8s %9s %9s %8s %7s %14s %7s %12s\n", "TENANT", "SUBMITTED", "SUCCEEDED", "EXPIRED", "FAILED", "WEIGHTED-TOKENS", "SHARE", "INTERACTIVE")
	for _, t := range Tenants {
		to := o.Tenants[t]
		fmt.Fprintf(w, "%-8s %9d %9d %8d %7d %14d %6.1f%% %5d ok/%d rej\n", t, to.Submitted, to.Succeeded, to.Expired, to.Failed,
			to.WeightedTokens, 100*to.Share, to.InteractiveOK, to.InteractiveRejected)
	}
	fmt.Fprintf(w, "small enqueued when %d jobs had been dispatched; its jobs were dispatched at positions %v of the pool's dispatch order\n",
		o.SmallEnqueuedAfter, o.SmallPositions)
	fmt.Fprintf(w, "when small's last job finished, %d of bulk's jobs were still to finish\n", o.BulkRemainingWhenSmallDone)
	if o.PremiumToBulkRatio < 0 {
		// A smaller run (-bulk-jobs, -premium-jobs) where the two queues
		// never overlapped: no ratio to show.
		fmt.Fprintln(w, "premium and bulk were never both backlogged: no token ratio to compare with their weights")
	} else {
		fmt.Fprintf(w, "premium (weight 3) got %.2fx the tokens of bulk (weight 1) while both were backlogged\n", o.PremiumToBulkRatio)
	}
	fmt.Fprintf(w, "upstream 429s from the provider: %d\n", o.Upstream429)
}
