// Command providersim runs the OpenAI-compatible provider simulator; see
// package internal/providersim for flags and behaviour.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/fairshare-dev/fairshare/internal/providersim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := providersim.Main(ctx, os.Args[1:], os.Stdout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "providersim:", err)
		os.Exit(1)
	}
}
