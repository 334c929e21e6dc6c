// Command scheduler is Fairshare's data plane for one ProviderPool: the
// OpenAI-compatible gateway, the batch job API and the fair dispatcher. See
// internal/scheduler for flags and lifecycle.
package main

import (
	"fmt"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/fairshare-dev/fairshare/internal/scheduler"
)

func main() {
	if err := scheduler.Run(ctrl.SetupSignalHandler(), os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "scheduler:", err)
		os.Exit(1)
	}
}
