package cel

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/fairshare-dev/fairshare/test/framework"
)

// setStatus writes status onto obj through the status subresource.
func setStatus(t *testing.T, obj *unstructured.Unstructured, status map[string]any) {
	t.Helper()
	obj.Object["status"] = status
	if err := k8s.Status().Update(context.Background(), obj); err != nil {
		t.Fatalf("status of %s: %v", obj.GetName(), err)
	}
}

func condition(typ, status, reason string) map[string]any {
	return map[string]any{"type": typ, "status": status, "reason": reason, "message": "",
		"lastTransitionTime": metav1.Now().UTC().Format(time.RFC3339)}
}

// TestPrinterColumns runs the real kubectl get: PAUSED-UNTIL is the RFC 3339
// time of status.pausedUntil (not a relative age, which reads "<invalid>"
// for a future time), and SERVING, right after READY, is the scheduler's
// Serving condition (a tenant can be Ready but not Serving); -o wide adds
// REASON, the Ready condition's reason.
func TestPrinterColumns(t *testing.T) {
	ctx := context.Background()
	user, err := env.AddUser(envtest.User{Name: "columns-admin", Groups: []string{"system:masters"}}, env.Config)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		t.Fatal(err)
	}

	pool := object(poolGVK, "columns", validPool())
	if err := k8s.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	paused := time.Now().UTC().Add(90 * time.Second).Truncate(time.Second).Format(time.RFC3339)
	setStatus(t, pool, map[string]any{
		"remainingTokens": int64(0), "pausedUntil": paused, "backlog": int64(120),
		"conditions": []any{condition("Ready", "True", "SchedulerAvailable"), condition("Serving", "True", "Loaded")},
	})
	tq := object(tqGVK, "columns", with(validTenant(), "poolRef.name", "columns"))
	if err := k8s.Create(ctx, tq); err != nil {
		t.Fatal(err)
	}
	setStatus(t, tq, map[string]any{
		"backlog": int64(0), "inFlight": int64(0), "tokensRemaining": int64(0), "expiredJobs": int64(0),
		"conditions": []any{condition("Ready", "True", "PoolReady"), condition("Serving", "False", "InvalidSpec")},
	})

	for _, tc := range []struct {
		resource, header string
		row              []string
		wide             bool
	}{
		{"providerpools", "NAME REMAINING PAUSED-UNTIL BACKLOG READY SERVING AGE", []string{"columns", "0", paused, "120", "True", "True"}, false},
		{"tenantquotas", "NAME POOL WEIGHT BACKLOG IN-FLIGHT TOKENS-LEFT EXPIRED READY SERVING AGE", []string{"columns", "columns", "1", "0", "0", "0", "0", "True", "False"}, false},
		// -o wide adds the Ready condition's reason after SERVING (blank
		// cells, such as TIER, are dropped by the split into fields).
		{"providerpools", "NAME REMAINING PAUSED-UNTIL BACKLOG READY SERVING REASON UPSTREAM AGE",
			[]string{"columns", "0", paused, "120", "True", "True", "SchedulerAvailable", "https://api.example.com"}, true},
		{"tenantquotas", "NAME POOL WEIGHT TIER BACKLOG IN-FLIGHT TOKENS-LEFT EXPIRED READY SERVING REASON COMPLETED REJECTIONS MODE BUDGET-LEFT AGE",
			[]string{"columns", "columns", "1", "0", "0", "0", "0", "True", "False", "PoolReady", "Enforce"}, true},
	} {
		args := []string{"get", tc.resource, "columns", "-n", "default"}
		if tc.wide {
			args = append(args, "-o", "wide")
		}
		out, err := framework.Kubectl(ctx, kubeconfig, args...)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 {
			t.Fatalf("kubectl get %s:\n%s", tc.resource, out)
		}
		if got := strings.Join(strings.Fields(lines[0]), " "); got != tc.header {
			t.Errorf("kubectl get %s header = %q, want %q", tc.resource, got, tc.header)
		}
		fields := strings.Fields(lines[1])
		if len(fields) != len(tc.row)+1 || strings.Join(fields[:len(tc.row)], " ") != strings.Join(tc.row, " ") {
			t.Errorf("kubectl get %s row = %q, want %q followed by the age", tc.resource, lines[1], strings.Join(tc.row, " "))
		}
		t.Logf("kubectl get %s:\n%s", tc.resource, out)
	}
}
