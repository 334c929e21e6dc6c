// Command demo is `make demo`: it starts a real local control plane (kube-apiserver and
// etcd from bin/), the operator, the provider simulator and the demo pool's scheduler,
// runs the workload of package scenario while showing progress and
// `kubectl get tenantquotas`, prints the outcome and stops everything it started.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/fairshare-dev/fairshare/test/framework"
	"github.com/fairshare-dev/fairshare/test/scenario"
)

func main() {
	o := scenario.Options{
		Simulator: framework.SimulatorOptions{Latency: 50 * time.Millisecond},
		Out:       os.Stdout,
	}
	// A flag set of its own: the libraries' flags on the default set (such as
	// controller-runtime's -kubeconfig) do not apply to the demo, which
	// starts its own control plane.
	fs := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	fs.IntVar(&o.BulkJobs, "bulk-jobs", 2000, "jobs in tenant bulk's import")
	fs.IntVar(&o.SmallJobs, "small-jobs", 5, "jobs tenant small enqueues after the import")
	fs.IntVar(&o.PremiumJobs, "premium-jobs", 300, "jobs tenant premium (weight 3) enqueues after the import")
	fs.IntVar(&o.InteractiveCalls, "interactive-calls", 10, "interactive calls of small and of premium")
	fs.IntVar(&o.MaxTokens, "max-tokens", 64, "max_tokens of every request")
	fs.Int64Var(&o.Simulator.TokensPerMinute, "provider-tpm", 60000, "the simulated provider's tokens per minute")
	fs.Int64Var(&o.Simulator.RequestsPerMinute, "provider-rpm", 1200, "the simulated provider's requests per minute")
	fs.Int64Var(&o.Simulator.OutputTokens, "output-tokens", 32, "tokens the simulated provider generates per call")
	fs.DurationVar(&o.ProgressEvery, "progress", 3*time.Second, "period of progress lines")
	fs.DurationVar(&o.KubectlEvery, "kubectl", 15*time.Second, "period of the kubectl get tenantquotas lines")
	fs.DurationVar(&o.Timeout, "timeout", 10*time.Minute, "bound of the workload")
	keep := fs.Bool("keep", false, "after the outcome, keep the control plane, operator, scheduler and simulator running until Ctrl-C, to look around with kubectl and helm")
	fs.StringVar(&o.WorkDir, "workdir", filepath.Join(framework.RepoRoot(), ".cache", "demo"), "folder for logs, kubeconfig and binaries")
	_ = fs.Parse(os.Args[1:]) // ExitOnError: exits on a bad flag

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *keep {
		o.Hold = func(ctx context.Context, env *framework.Env, out *scenario.Outcome) {
			out.Print(os.Stdout)
			fmt.Printf("\nEverything keeps running until Ctrl-C. In another terminal:\n"+
				"  export KUBECONFIG=%s\n  kubectl get fairshare -n %s\n"+
				"The scheduler's gateway is %s (tenants by the X-Fairshare-Tenant header), its metrics %s.\n",
				env.CP.Kubeconfig, scenario.Namespace, env.SchedulerURL, env.SchedulerMetricsURL)
			<-ctx.Done()
			fmt.Println("\nstopping every process the demo started")
		}
	}
	_ = os.RemoveAll(o.WorkDir)
	out, err := scenario.Run(ctx, o)
	if errors.Is(err, scenario.ErrInterrupted) {
		fmt.Fprintf(os.Stderr, "demo %v; every process it started is stopped\n", err)
		fmt.Fprintln(os.Stderr, "logs are in", o.WorkDir)
		os.Exit(130)
	}
	if out != nil && !(*keep && err == nil) { // with -keep, Hold printed it
		out.Print(os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		fmt.Fprintln(os.Stderr, "logs are in", o.WorkDir)
		os.Exit(1)
	}
	fmt.Printf("\nlogs of every process are in %s\n", o.WorkDir)
}
