package providersim

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// DefaultAddr is the listen address of the providersim binary.
const DefaultAddr = "127.0.0.1:8090"

// shutdownGrace bounds how long Main waits for in-flight responses on shutdown.
const shutdownGrace = 10 * time.Second

// Main runs the providersim binary: it parses args (without the program
// name), listens, writes one line "providersim listening on http://HOST:PORT"
// to out once the listener is bound (so --addr 127.0.0.1:0 is usable by
// tests), and serves until ctx is done, then shuts down gracefully (up to
// 10 s for in-flight responses). Flags (each sets the Config field of the
// same meaning): --addr, --tokens-per-minute, --requests-per-minute,
// --input-tokens-per-minute, --output-tokens-per-minute, --latency, --output-tokens, --frame-interval, --dialect (Dialect),
// --window (Window), --sub-window (SubWindow), --classic-reset
// (ClassicResetForm), --anthropic-remaining-step (AnthropicRemainingStep),
// --anthropic-headers (AnthropicHeaders),
// --retry-after-http-date (RetryAfterHTTPDate), --fault (Fault, the form of
// ParseFault). It returns flag,
// configuration, listen and serve errors; flag.ErrHelp for -h.
func Main(ctx context.Context, args []string, out io.Writer) error {
	cfg, addr, err := parseFlags(args, out)
	if err != nil {
		return err
	}
	return serve(ctx, cfg, addr, out)
}

// parseFlags maps Main's flags to a validated Config and the listen address.
func parseFlags(args []string, out io.Writer) (Config, string, error) {
	fs := flag.NewFlagSet("providersim", flag.ContinueOnError)
	fs.SetOutput(out)
	var cfg Config
	addr := fs.String("addr", DefaultAddr, "listen address")
	fs.Int64Var(&cfg.TokensPerMinute, "tokens-per-minute", 0, "tokens quota per minute (0 = unlimited)")
	fs.Int64Var(&cfg.RequestsPerMinute, "requests-per-minute", 0, "requests quota per minute (0 = unlimited)")
	fs.Int64Var(&cfg.InputTokensPerMinute, "input-tokens-per-minute", 0, "anthropic: input tokens quota per minute, ITPM (0 = unlimited)")
	fs.Int64Var(&cfg.OutputTokensPerMinute, "output-tokens-per-minute", 0, "anthropic: output tokens quota per minute, OTPM, charged max_tokens then refunded (0 = unlimited)")
	fs.DurationVar(&cfg.Latency, "latency", 0, "delay before the first byte of a response")
	fs.Int64Var(&cfg.OutputTokens, "output-tokens", DefaultOutputTokens, "tokens generated per response (capped by max_completion_tokens / max_tokens)")
	fs.DurationVar(&cfg.FrameInterval, "frame-interval", 0, "delay between streamed frames")
	fs.StringVar(&cfg.Dialect, "dialect", DialectOpenAI, "rate-limit header dialect: "+strings.Join(Dialects, ", "))
	fs.DurationVar(&cfg.Window, "window", 0, "fixed window of the classic, ietf and ietf-legacy dialects, whole seconds <= 60s (0 = 60s)")
	fs.DurationVar(&cfg.SubWindow, "sub-window", 0, "azure: also enforce the per-minute limits per sub-window of this length, e.g. 10s or 1s (0 = off)")
	fs.StringVar(&cfg.ClassicResetForm, "classic-reset", ClassicResetDelta, "classic X-RateLimit-Reset form: delta, epoch or epochms")
	fs.Int64Var(&cfg.AnthropicRemainingStep, "anthropic-remaining-step", DefaultAnthropicRemainingStep, "anthropic: tokens remaining rounded to a multiple of this (nearest with inout headers, down with tokens; 1 = exact)")
	fs.StringVar(&cfg.AnthropicHeaders, "anthropic-headers", AnthropicHeadersInOut, "anthropic token headers: inout (input-tokens, output-tokens and, with --tokens-per-minute, tokens triplets, remaining rounded to nearest) or tokens (tokens triplet only, rounded down)")
	fs.BoolVar(&cfg.RetryAfterHTTPDate, "retry-after-http-date", false, "send Retry-After on 429 as an HTTP-date instead of delay-seconds (not azure)")
	fs.Func("fault", "inject an upstream fault into chat completions: KIND[=ARG][,KEY=VALUE]...; kinds: "+
		"status=5xx (with retry-after=S, retry-after-ms=MS), reset, hang=DURATION, malformed, cut=FRAMES, no-usage, throttle "+
		"(429 without Retry-After or rate-limit headers); keys count=N (next N requests) and every=K (1 request in K); "+
		"changed at run time with POST /faults?fault=SPEC, cleared with DELETE /faults", func(v string) error {
		f, err := ParseFault(v)
		cfg.Fault = f
		return err
	})
	if err := fs.Parse(args); err != nil {
		return cfg, "", err
	}
	if fs.NArg() > 0 {
		return cfg, "", fmt.Errorf("providersim: unexpected arguments %q", fs.Args())
	}
	return cfg, *addr, cfg.Validate()
}

// serve listens on addr and serves a Server of cfg until ctx is done.
func serve(ctx context.Context, cfg Config, addr string, out io.Writer) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: New(cfg), ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(out, "providersim listening on http://%s\n", ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
