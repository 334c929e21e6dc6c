// Package e2e runs the demo scenario on the real local control plane with the three
// binaries and asserts its outcome.
package e2e

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/fairshare-dev/fairshare/test/framework"
	"github.com/fairshare-dev/fairshare/test/scenario"
)

func TestDemoScenario(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set: run `make test-e2e` (it builds bin/kube-apiserver and bin/etcd)")
	}
	o := scenario.Options{
		WorkDir:          t.TempDir(),
		BulkJobs:         400,
		SmallJobs:        5,
		PremiumJobs:      150,
		InteractiveCalls: 6,
		MaxTokens:        64,
		Simulator: framework.SimulatorOptions{
			TokensPerMinute: 12000, RequestsPerMinute: 600,
			Latency: 50 * time.Millisecond, OutputTokens: 32,
		},
		ProgressEvery: 2 * time.Second,
		KubectlEvery:  6 * time.Second,
		Timeout:       8 * time.Minute,
		Out:           testWriter{t},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	out, err := scenario.Run(ctx, o)
	if out != nil {
		out.Print(testWriter{t})
	}
	if err != nil {
		t.Fatal(err)
	}

	for name, want := range map[string]int{"bulk": o.BulkJobs, "small": o.SmallJobs, "premium": o.PremiumJobs} {
		to := out.Tenants[name]
		if to.Succeeded != want || to.Expired != 0 || to.Failed != 0 {
			t.Errorf("%s: succeeded %d expired %d failed %d, want %d succeeded and none expired or failed", name, to.Succeeded, to.Expired, to.Failed, want)
		}
	}
	// The small tenant is not stuck behind the import: its jobs finish while most of
	// the import is still to do.
	if min := o.BulkJobs / 2; out.BulkRemainingWhenSmallDone < min {
		t.Errorf("when small finished, %d bulk jobs remained; want at least %d", out.BulkRemainingWhenSmallDone, min)
	}
	// Interleaved, not first-in-first-out: small's jobs run within the next rounds after
	// it enqueued them, not after the import's backlog.
	if n := len(out.SmallPositions); n != o.SmallJobs {
		t.Errorf("small has %d dispatched jobs, want %d", n, o.SmallJobs)
	} else if last := out.SmallPositions[n-1] - int64(out.SmallEnqueuedAfter); last > 60 {
		t.Errorf("small's last job was dispatched %d positions after small enqueued (positions %v, %d dispatched before); want at most 60",
			last, out.SmallPositions, out.SmallEnqueuedAfter)
	}
	// Weight 3 gets about 3x the tokens of weight 1 while both are backlogged.
	if r := out.PremiumToBulkRatio; r < 2.5 || r > 3.5 {
		t.Errorf("premium/bulk token ratio while both backlogged = %.2f, want 3 +- 0.5", r)
	}
	// The throttle paces from the provider's headers: at most a handful of 429s.
	if out.Upstream429 > 5 {
		t.Errorf("upstream 429s = %d, want at most 5", out.Upstream429)
	}
	// Interactive calls are admitted during the import (the reserve).
	for _, name := range []string{"small", "premium"} {
		if ok := out.Tenants[name].InteractiveOK; ok != o.InteractiveCalls {
			t.Errorf("%s: %d of %d interactive calls succeeded (codes %v)", name, ok, o.InteractiveCalls, out.Tenants[name].InteractiveCodes)
		}
	}
	// `kubectl get tenantquotas` showed the backlog falling.
	seen := out.BulkBacklogSeen
	falling := false
	for i := 1; i < len(seen); i++ {
		if seen[i-1] > 0 && seen[i] < seen[i-1] {
			falling = true
		}
	}
	if !falling {
		t.Errorf("bulk backlog in TenantQuota status never fell: %v", seen)
	}
	if len(out.KubectlSnapshots) == 0 {
		t.Error("no kubectl get tenantquotas output was captured")
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
