// Command proxy is the peer of the HTTP benchmarks (package httpbench): a
// plain httputil.NewSingleHostReverseProxy to --upstream with a Transport of
// MaxIdleConnsPerHost 1024, and nothing else (only the standard library, so
// that its RSS and CPU are those of the bare proxy).
//
// The request body is read in full before it is proxied, as every gateway
// does: streamed straight through, the HTTP/1 server closes the inbound body
// when the response headers are written, the transport's last read of it
// then fails and tears down the upstream connection mid-response
// (golang/go#40747, "ReverseProxy read error during body copy: use of closed
// network connection"), which cut a few 1 MiB responses and streams. It
// listens on
// 127.0.0.1, prints "listening 127.0.0.1:PORT" as its first line of standard
// output and exits cleanly on SIGTERM or SIGINT, writing the profiles asked
// for by --cpuprofile (CPU from start to exit) and --memprofile (the allocs
// profile at exit).
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address (loopback only)")
	upstream := flag.String("upstream", "", "upstream base URL, e.g. http://127.0.0.1:41234")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile (start to exit) to this file")
	memprofile := flag.String("memprofile", "", "write the allocs profile at exit to this file")
	flag.Parse()
	u, err := url.Parse(*upstream)
	if err != nil || u.Host == "" {
		fmt.Fprintln(os.Stderr, "--upstream: a base URL is required")
		os.Exit(2)
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer func() { pprof.StopCPUProfile(); _ = f.Close() }()
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     90 * time.Second,
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("listening %s\n", ln.Addr())
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "reading the request body", http.StatusBadRequest)
			return
		}
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
		rp.ServeHTTP(w, r)
	})
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() { _ = srv.Serve(ln) }()
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if *memprofile != "" {
		if f, err := os.Create(*memprofile); err == nil {
			_ = pprof.Lookup("allocs").WriteTo(f, 0)
			_ = f.Close()
		}
	}
}
