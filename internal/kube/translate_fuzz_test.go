package kube

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// Seeds of the fuzz targets: the samples' specs, the API's limits and
// values past them (the API server's validation is not assumed: a spec
// stored before a rule existed, or built in Go, reaches the translation
// too).
var (
	poolSeeds = []string{
		`{"upstream":{"baseURL":"http://127.0.0.1:8090"},"models":[{"name":"sim-gpt","tokensPerMinute":60000,"requestsPerMinute":1200}],"reserve":{"interactivePercent":20},"tenantIdentification":{"mode":"TrustedHeader","header":"X-Fairshare-Tenant"},"scheduler":{"quantumTokens":512,"statusIntervalSeconds":2}}`,
		`{"upstream":{"baseURL":"https://api.openai.com/v1","dialect":"azure","timeoutSeconds":2147483647},"models":[{"name":"a"},{"name":"a"}],"tenantIdentification":{"mode":"APIKey"}}`,
		`{"upstream":{"baseURL":"ftp://x"},"models":[],"reserve":{"interactivePercent":-1,"batchBorrowAfterSeconds":-2147483648},"costModel":{"inputTokenWeight":-5,"outputTokenWeight":2147483647,"kvBlockTokens":-1,"defaultMaxOutputTokens":0}}`,
		`{"upstream":{"baseURL":"http://h"},"models":[{"name":"m","tokensPerMinute":-9223372036854775808,"requestsPerMinute":9223372036854775807}],"scheduler":{"quantumTokens":-1,"maxWaitTokens":-1,"maxQueuedJobs":-9223372036854775808},"usageMonitoring":{"windowSeconds":-1,"costRatioThreshold":2147483647,"minTierSize":-3,"minWeightedTokens":-1,"rejectionPercentThreshold":101,"minRejections":-1}}`,
		`{"upstream":{"baseURL":"http://h"},"models":[{"name":""}],"tenantIdentification":{"mode":"Bogus","header":""}}`,
		`{}`,
	}
	tenantSeeds = []string{
		`{"poolRef":{"name":"pool"},"weight":3,"tokens":{"weightedPerMinute":2000000},"maxConcurrentRequests":32,"batch":{"maxQueuedJobs":5000}}`,
		`{"poolRef":{"name":"pool"},"tenantID":"t","weight":-1,"tier":"gold","tokens":{"weightedPerMinute":0,"burst":-1,"inputPerMinute":-9223372036854775808,"outputPerMinute":9223372036854775807},"requests":{"perMinute":-1,"burst":0},"maxConcurrentRequests":-2147483648,"maxKVBlocks":-1}`,
		`{"poolRef":{"name":"pool"},"batch":{"maxQueuedJobs":-1,"defaultDeadlineSeconds":9223372036854775807},"budget":{"weightedTokens":-1,"period":"Fortnight"},"enforcement":"Soft","mode":"DryRun","maxOutputTokensPerRequest":-1}`,
		`{"poolRef":{"name":"pool"},"batch":{"defaultDeadlineSeconds":-9223372036854775808},"budget":{"weightedTokens":100,"period":"Month"}}`,
		`{}`,
	}
)

// goPointer matches a Go pointer printed into a message (a heap address
// such as 0xc000123456), not a hexadecimal-looking fragment of the input
// the message quotes (such as the URL "A000x000").
var goPointer = regexp.MustCompile(`\b0xc[0-9a-f]{9,}\b`)

// checkErr fails on an error that does not explain itself: empty, a
// formatting mistake, or a bare Go value.
func checkErr(t *testing.T, what string, err error) {
	t.Helper()
	msg := err.Error()
	if strings.TrimSpace(msg) == "" || strings.Contains(msg, "%!") || strings.Contains(msg, "<nil>") || goPointer.MatchString(msg) {
		t.Fatalf("%s refused with an unclear error %q", what, msg)
	}
}

// FuzzPoolPolicy: any ProviderPool spec (decoded from JSON, values beyond
// the CRD's validation included) translates without panicking into a
// policy the registry either accepts, serving exactly the spec's models
// with a positive upstream timeout, or refuses with a clear error while
// keeping the previous policy (BC: an invalid spec never replaces a valid
// one).
func FuzzPoolPolicy(f *testing.F) {
	for _, s := range poolSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var spec v1alpha1.ProviderPoolSpec
		if json.Unmarshal(data, &spec) != nil {
			return
		}
		p := &v1alpha1.ProviderPool{Spec: spec}
		p.Name, p.Namespace, p.Generation = "pool", "ns", 2
		pol := PoolPolicy(p)
		reg := registry.New(clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0)))
		prev := validPool()
		if err := reg.SetPool(prev); err != nil {
			t.Fatalf("seed pool refused: %v", err)
		}
		err := reg.SetPool(pol)
		if err != nil {
			checkErr(t, "pool spec "+string(data), err)
			if got := reg.Pool(); got == nil || got.Generation != prev.Generation {
				t.Fatalf("refused spec replaced the previous policy: %+v", got)
			}
			return
		}
		got := reg.Pool()
		if got == nil || got.Generation != 2 || len(got.Models) != len(spec.Models) {
			t.Fatalf("accepted policy not served as given: %+v", got)
		}
		if got.UpstreamTimeout <= 0 || got.ReservePercent < 0 || got.ReservePercent > 99 {
			t.Fatalf("accepted policy with timeout %v, reserve %d%%", got.UpstreamTimeout, got.ReservePercent)
		}
		_ = reg.Snapshot(time.Unix(1_700_000_060, 0))
	})
}

// FuzzTenantPolicy: any TenantQuota spec translates without panicking
// into a policy the registry either serves under the tenant's id, with a
// positive default deadline, or refuses with a clear error recorded for
// the status writer.
func FuzzTenantPolicy(f *testing.F) {
	for _, s := range tenantSeeds {
		f.Add([]byte(s), "premium")
	}
	f.Fuzz(func(t *testing.T, data []byte, name string) {
		var spec v1alpha1.TenantQuotaSpec
		if json.Unmarshal(data, &spec) != nil {
			return
		}
		tq := &v1alpha1.TenantQuota{Spec: spec}
		tq.Name, tq.Namespace, tq.Generation = name, "ns", 3
		pol := TenantPolicy(tq)
		pol.KeyHashes = []registry.KeyHash{registry.HashKey("sk-fuzz")}
		reg := registry.New(clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0)))
		if err := reg.SetPool(validPool()); err != nil {
			t.Fatal(err)
		}
		if err := reg.UpsertTenant(pol); err != nil {
			checkErr(t, "tenant spec "+string(data), err)
			if reg.Tenant(pol.ID) != nil {
				t.Fatalf("refused tenant %q is served", pol.ID)
			}
			return
		}
		tn := reg.Tenant(pol.ID)
		if tn == nil || reg.TenantByKey("sk-fuzz") != tn {
			t.Fatalf("accepted tenant %q not served or not found by its key", pol.ID)
		}
		if d := tn.Policy().DefaultDeadline; d <= 0 {
			t.Fatalf("accepted tenant with default deadline %v", d)
		}
		_ = reg.Snapshot(time.Unix(1_700_000_060, 0))
		reg.RemoveTenant(name)
	})
}

func validPool() registry.PoolPolicy {
	p := &v1alpha1.ProviderPool{}
	p.Name, p.Generation = "pool", 1
	p.Spec.Upstream.BaseURL = "http://127.0.0.1:8090"
	p.Spec.Models = []v1alpha1.ModelSpec{{Name: "m"}}
	p.Spec.TenantIdentification.Mode = v1alpha1.TenantIdentificationMode("APIKey")
	p.Spec.CostModel = v1alpha1.CostModel{InputTokenWeight: 1, OutputTokenWeight: 4, DefaultMaxOutputTokens: 1024}
	p.Spec.Scheduler.QuantumTokens = 4096
	return PoolPolicy(p)
}
