// Command manager is the Fairshare operator: it reconciles ProviderPools into
// scheduler Deployments and sets the Accepted and Ready conditions of pools
// and TenantQuotas. Flags: see internal/manager.ParseFlags.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/fairshare-dev/fairshare/internal/manager"
)

func main() {
	if err := manager.Run(ctrl.SetupSignalHandler(), os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "manager:", err)
		os.Exit(1)
	}
}
