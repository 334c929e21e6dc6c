package explain

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/fairshare-dev/fairshare/test/framework"
)

// explain runs `kubectl explain field` (bin/kubectl, else kubectl from PATH,
// see framework.Kubectl) against kubeconfig until it succeeds
// (the API server publishes a new CRD's OpenAPI schema a moment after the
// CRD is established), at most 30 s.
func explain(t *testing.T, kubeconfig, field string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		out, err := framework.Kubectl(ctx, kubeconfig, "explain", field)
		if err == nil {
			return out
		}
		if ctx.Err() != nil {
			t.Fatalf("kubectl explain %s: %v\n%s", field, err, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestKubectlExplain runs the real kubectl explain against a kube-apiserver
// with the CRDs installed and checks exact lines: field types, units and
// defaults as a user reads them.
func TestKubectlExplain(t *testing.T) {
	framework.RequireAssets(t, "test-envtest")
	ctrllog.SetLogger(logr.Discard())
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(framework.RepoRoot(), "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	user, err := env.AddUser(envtest.User{Name: "explain-admin", Groups: []string{"system:masters"}}, cfg)
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

	tests := map[string][]string{
		"tenantquota.spec": {
			"FIELD: spec <Object>",
			"  poolRef\t<Object> -required-",
			"    poolRef names the ProviderPool in this namespace. Immutable.",
			"  weight\t<integer>",
			"    backlogged. Must be > 0; defaults to 1.",
			"  maxOutputTokensPerRequest\t<integer>",
			"    for, in provider tokens. A request whose max_completion_tokens or",
		},
		"providerpool.spec.scheduler": {
			"FIELD: scheduler <Object>",
			"    scheduler configures the rendered scheduler Deployment. Defaults to {}",
			"  quantumTokens\t<integer>",
			"    quantumTokens is the deficit-round-robin quantum, in weighted tokens:",
			"    what a weight-1 tenant may dispatch per round. Defaults to 4096.",
			"  statusIntervalSeconds\t<integer>",
			"    the pool and tenant status, in seconds; unchanged status is not written.",
			"    only the leader serves. Defaults to 1.",
			"    pool, interactive and batch together. Defaults to 64.",
		},
	}
	for field, want := range tests {
		t.Run(field, func(t *testing.T) {
			out := explain(t, kubeconfig, field)
			lines := map[string]bool{}
			for _, l := range strings.Split(out, "\n") {
				lines[strings.TrimRight(l, " ")] = true
			}
			for _, w := range want {
				if !lines[w] {
					t.Errorf("kubectl explain %s: no line %q in:\n%s", field, w, out)
				}
			}
		})
	}
}
