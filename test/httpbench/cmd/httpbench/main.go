// Command httpbench runs the HTTP benchmarks of package httpbench: it builds
// the upstream, proxy and gateway programs into a temporary directory, runs
// the experiments (all, or those matching -run) and writes their results in
// the Go benchmark format to -out (appended) or standard output, with
// progress lines on standard error. -quick shrinks every experiment to a few
// seconds; -profile-dir writes the proxy's and the gateway's CPU and
// allocation profiles (DIR/http-<peer>.cpu.pprof, .alloc.pprof).
//
// A full run takes about 5 minutes on 2 cores (5m07s measured).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"syscall"
	"time"

	"github.com/fairshare-dev/fairshare/test/httpbench"
)

func main() {
	out := flag.String("out", "", "append results to this file (default standard output)")
	quick := flag.Bool("quick", false, "tiny counts: a few seconds in all")
	profileDir := flag.String("profile-dir", "", "write the peers' CPU and allocation profiles to this directory")
	run := flag.String("run", "", "run only the experiments matching this regular expression (e.g. SSE|Memory)")
	flag.Parse()
	if err := main1(*out, *quick, *profileDir, *run); err != nil {
		fmt.Fprintln(os.Stderr, "httpbench:", err)
		os.Exit(1)
	}
}

func main1(out string, quick bool, profileDir, run string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var filter *regexp.Regexp
	if run != "" {
		re, err := regexp.Compile(run)
		if err != nil {
			return fmt.Errorf("-run: %w", err)
		}
		filter = re
	}
	var w io.Writer = os.Stdout
	if out != "" {
		f, err := os.OpenFile(out, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	if profileDir != "" {
		if err := os.MkdirAll(profileDir, 0o755); err != nil {
			return err
		}
	}
	bin, err := os.MkdirTemp("", "httpbench-bin-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(bin)
	start := time.Now()
	if err := httpbench.Build(ctx, bin); err != nil {
		return err
	}
	h := &httpbench.Harness{BinDir: bin, ProfileDir: profileDir, Log: os.Stderr}
	scale := httpbench.Full
	if quick {
		scale = httpbench.Quick
	}
	err = httpbench.Run(ctx, httpbench.Options{Scale: scale, Filter: filter, Harness: h, Out: httpbench.NewOutput(w)})
	if perr := h.MergeProfiles(context.Background()); perr != nil {
		fmt.Fprintln(os.Stderr, "httpbench: profiles:", perr)
	}
	fmt.Fprintf(os.Stderr, "httpbench: done in %v\n", time.Since(start).Round(time.Second))
	return err
}
