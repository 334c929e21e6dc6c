// Command upstream is the loopback mock of an OpenAI-compatible provider used
// by the HTTP benchmarks (package httpbench): POST /v1/chat/completions
// answers a ≈1 KB chat.completion JSON with usage and OpenAI x-ratelimit-*
// headers far above any load (so the gateway's throttle never binds), a
// ≈1 MiB one for the model "sim-1mb", or, with "stream":true, 64 SSE
// chat.completion.chunk frames (one content token each, flushed one by one,
// --frame-gap apart), then a usage chunk when stream_options.include_usage
// is set, then "data: [DONE]".
//
// It listens on 127.0.0.1 (port --addr, default any) and prints
// "listening 127.0.0.1:PORT" as its first line of standard output. It exits
// on SIGTERM or SIGINT.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// frames is the number of content frames of a stream.
const frames = 64

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address (loopback only)")
	latency := flag.Duration("latency", 0, "delay before the response headers (e.g. 0 or 20ms)")
	gap := flag.Duration("frame-gap", 20*time.Millisecond, "gap between SSE frames")
	flag.Parse()

	small := completion(900)
	large := completion(1 << 20)
	h := &handler{latency: *latency, gap: *gap, small: small, large: large}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("listening %s\n", ln.Addr())
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() { _ = srv.Serve(ln) }()
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
}

// completion returns a chat.completion JSON body whose content string has n
// bytes (usage last).
func completion(n int) []byte {
	content := strings.Repeat("lorem ipsum dolor sit amet ", n/27+1)[:n]
	return fmt.Appendf(nil, `{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"sim",`+
		`"choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],`+
		`"usage":{"prompt_tokens":12,"completion_tokens":%d,"total_tokens":%d}}`, content, n/4, 12+n/4)
}

type handler struct {
	latency, gap time.Duration
	small, large []byte
}

type request struct {
	Model         string `json:"model"`
	Stream        bool   `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		http.Error(w, `{"error":{"message":"not found","type":"invalid_request_error"}}`, http.StatusNotFound)
		return
	}
	body, err := io.ReadAll(r.Body)
	var req request
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	if err != nil {
		http.Error(w, `{"error":{"message":"bad request","type":"invalid_request_error"}}`, http.StatusBadRequest)
		return
	}
	if h.latency > 0 {
		t := time.NewTimer(h.latency)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	hd := w.Header()
	hd.Set("x-ratelimit-limit-requests", "100000000")
	hd.Set("x-ratelimit-remaining-requests", "99999999")
	hd.Set("x-ratelimit-reset-requests", "1ms")
	hd.Set("x-ratelimit-limit-tokens", "100000000000")
	hd.Set("x-ratelimit-remaining-tokens", "99999999999")
	hd.Set("x-ratelimit-reset-tokens", "1ms")
	if req.Stream {
		h.stream(w, r, req.StreamOptions != nil && req.StreamOptions.IncludeUsage)
		return
	}
	b := h.small
	if req.Model == "sim-1mb" {
		b = h.large
	}
	hd.Set("Content-Type", "application/json")
	hd.Set("Content-Length", strconv.Itoa(len(b)))
	_, _ = w.Write(b)
}

// stream writes the 64 frames, flushing each, gap apart.
func (h *handler) stream(w http.ResponseWriter, r *http.Request, usage bool) {
	hd := w.Header()
	hd.Set("Content-Type", "text/event-stream")
	hd.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	var t *time.Timer
	for i := range frames {
		if i > 0 && h.gap > 0 {
			if t == nil {
				t = time.NewTimer(h.gap)
			} else {
				t.Reset(h.gap)
			}
			select {
			case <-t.C:
			case <-r.Context().Done():
				return
			}
		}
		if _, err := fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"sim\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d \"},\"finish_reason\":null}]}\n\n", i); err != nil {
			return
		}
		if rc.Flush() != nil {
			return
		}
	}
	if usage {
		_, _ = io.WriteString(w, "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"sim\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":64,\"total_tokens\":76}}\n\n")
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
	_ = rc.Flush()
}
