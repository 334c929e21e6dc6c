package providersim

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
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
// 10 s for in-flight responses). Flags: --addr, --tokens-per-minute,
// --requests-per-minute, --latency, --output-tokens, --frame-interval,
// --dialect. It returns flag, configuration, listen and serve errors;
// flag.ErrHelp for -h.
func Main(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("providersim", flag.ContinueOnError)
	fs.SetOutput(out)
	var cfg Config
	addr := fs.String("addr", DefaultAddr, "listen address")
	fs.Int64Var(&cfg.TokensPerMinute, "tokens-per-minute", 0, "tokens quota per minute (0 = unlimited)")
	fs.Int64Var(&cfg.RequestsPerMinute, "requests-per-minute", 0, "requests quota per minute (0 = unlimited)")
	fs.DurationVar(&cfg.Latency, "latency", 0, "delay before the first byte of a response")
	fs.Int64Var(&cfg.OutputTokens, "output-tokens", DefaultOutputTokens, "tokens generated per response (capped by max_completion_tokens / max_tokens)")
	fs.DurationVar(&cfg.FrameInterval, "frame-interval", 0, "delay between streamed frames")
	fs.StringVar(&cfg.Dialect, "dialect", DialectOpenAI, "rate-limit header dialect (openai)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("providersim: unexpected arguments %q", fs.Args())
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
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
