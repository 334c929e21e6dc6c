package httpbench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// RequestTimeout bounds one request of a fixed-rate load; a request that
// takes longer counts as an error (a timed-out request is a failure, not noise).
const RequestTimeout = time.Second

// ZipfS is the exponent of the Zipf distribution of tenants (s = 1.1, v = 1)
// in the loads on the 10,000-tenant gateway.
const ZipfS = 1.1

// TenantKey is the API key of tenant i of the gateway peer (the format of
// cmd/gateway's TenantKey).
func TenantKey(i int) string { return fmt.Sprintf("sk-bench-tenant-%d", i) }

// Body gives the body of request n (counted from 1 per target) of a load.
type Body func(n uint64) []byte

// Fixed returns the Body that is b for every request.
func Fixed(b []byte) Body { return func(uint64) []byte { return b } }

// ChatBody is the small chat request of the latency, throughput and memory
// experiments (max_tokens 64): a fixed system prompt and a user message
// numbered per request, as in real chat traffic, where the system prompt
// repeats and the user's text does not. The gateway therefore counts the
// user message's tokens on every request; its per-tenant count cache
// (tokencount.Cache) serves only the system prompt.
func ChatBody(n uint64) []byte {
	return fmt.Appendf(nil, `{"model":"sim","messages":[{"role":"system","content":"You are a concise assistant for a finance team."},`+
		`{"role":"user","content":"Summarise quarterly report %d in three bullet points."}],"max_tokens":64}`, n)
}

// LargeBody asks the mock for its ≈1 MiB chat.completion (model sim-1mb).
var LargeBody = []byte(`{"model":"sim-1mb","messages":[{"role":"user","content":"Write a long essay."}],"max_tokens":64}`)

// StreamBody asks for 64 SSE frames and a usage chunk.
var StreamBody = []byte(`{"model":"sim","messages":[{"role":"user","content":"Count to sixty-four."}],"max_tokens":64,"stream":true,"stream_options":{"include_usage":true}}`)

// keys picks the API key of each request: tenant 0 always (tenants <= 1),
// or a Zipf draw over tenants keys.
type keys struct {
	mu   sync.Mutex
	zipf *rand.Zipf
	auth []string // "Bearer <key>" per tenant
}

func newKeys(tenants int, seed uint64) *keys {
	k := &keys{}
	for i := range max(tenants, 1) {
		k.auth = append(k.auth, "Bearer "+TenantKey(i))
	}
	if tenants > 1 {
		k.zipf = rand.NewZipf(rand.New(rand.NewPCG(seed, 7)), ZipfS, 1, uint64(tenants-1))
	}
	return k
}

func (k *keys) next() string {
	if k.zipf == nil {
		return k.auth[0]
	}
	k.mu.Lock()
	i := k.zipf.Uint64()
	k.mu.Unlock()
	return k.auth[i]
}

// Target is one peer under load: its base URL, its process (nil for
// direct, whose CPU is not counted) and the tenants whose keys it is sent.
type Target struct {
	// Peer is the peer's name in the results ("direct", "proxy",
	// "gateway/tenants=10000").
	Peer string
	// URL is its base URL.
	URL string
	// Proc is the peer's process; nil for direct.
	Proc *Proc
	// Tenants is the number of tenants whose keys are sent (1: tenant 0).
	Tenants int

	keys *keys
	// seq numbers the requests sent to the peer (Body).
	seq atomic.Uint64
	// load is the keep-alive client of the fixed-rate loads (timeout
	// RequestTimeout), shared by the successive vegeta attackers so that
	// connections are reused; client that of the streams (no timeout).
	load, client *http.Client
}

// newTarget returns the Target of a peer, with its own keep-alive client.
func newTarget(peer, url string, p *Proc, tenants int) *Target {
	return &Target{Peer: peer, URL: url, Proc: p, Tenants: tenants, keys: newKeys(tenants, uint64(len(peer))),
		load: &http.Client{Timeout: RequestTimeout, Transport: newTransport()}, client: &http.Client{Transport: newTransport()}}
}

// newTransport returns a keep-alive HTTP/1.1 transport without proxy,
// keeping up to 10,000 idle connections to the peer.
func newTransport() *http.Transport {
	return &http.Transport{Proxy: nil, MaxIdleConns: 10000, MaxIdleConnsPerHost: 10000, IdleConnTimeout: time.Minute,
		DialContext: (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext}
}

// Probe sends one small request with the load's client and fails unless
// it is answered 200.
func (t *Target) Probe() error {
	req, err := http.NewRequest(http.MethodPost, t.URL+"/v1/chat/completions", bytes.NewReader(ChatBody(t.seq.Add(1))))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", t.keys.next())
	resp, err := t.load.Do(req)
	if err != nil {
		return fmt.Errorf("%s: first request: %w", t.Peer, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: first request: status %d", t.Peer, resp.StatusCode)
	}
	return nil
}

// CloseIdle closes the target's idle keep-alive connections.
func (t *Target) CloseIdle() {
	t.load.CloseIdleConnections()
	t.client.CloseIdleConnections()
}

// Sample is the outcome of the loads sent to one peer: raw latencies of
// the successful requests, request and error counts, and the peer's CPU.
type Sample struct {
	// Lat are the latencies of the successful requests.
	Lat []time.Duration
	// N is the number of requests sent, Errors those that failed (transport
	// error, timeout, status other than 200).
	N, Errors int
	// CPUMicros is the peer process's CPU time during the loads, in µs.
	CPUMicros int64
	// FirstErr describes the first error, for messages.
	FirstErr string
}

// Attack sends rate requests a second to the peer's chat completions
// endpoint for d (open loop, vegeta's constant pacer), request n with body
// body(n), and adds the outcome and the peer's CPU time to s.
func (t *Target) Attack(s *Sample, body Body, rate int, d time.Duration) error {
	url := t.URL + "/v1/chat/completions"
	tr := func(tg *vegeta.Target) error {
		tg.Method, tg.URL, tg.Body = http.MethodPost, url, body(t.seq.Add(1))
		tg.Header = http.Header{"Content-Type": {"application/json"}, "Authorization": {t.keys.next()}}
		return nil
	}
	var cpu0 int64
	if t.Proc != nil {
		c, err := t.Proc.CPUMicros()
		if err != nil {
			return err
		}
		cpu0 = c
	}
	// A vegeta Attacker serves one attack (Attack stops it at the end); the
	// client, and so its connections, are the target's.
	atk := vegeta.NewAttacker(vegeta.Client(t.load), vegeta.MaxBody(512), vegeta.Workers(4))
	for r := range atk.Attack(tr, vegeta.Rate{Freq: rate, Per: time.Second}, d, t.Peer) {
		s.N++
		if r.Error != "" || r.Code != http.StatusOK {
			s.Errors++
			if s.FirstErr == "" {
				s.FirstErr = fmt.Sprintf("code %d %s %.200s", r.Code, r.Error, r.Body)
			}
			continue
		}
		s.Lat = append(s.Lat, r.Latency)
	}
	if t.Proc != nil {
		c, err := t.Proc.CPUMicros()
		if err != nil {
			return err
		}
		s.CPUMicros += c - cpu0
	}
	return nil
}

// Percentile returns the exact nearest-rank q-quantile (0 < q <= 1) of
// lat (sorted in place), or 0 when lat is empty.
func Percentile(lat []time.Duration, q float64) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	slices.Sort(lat)
	i := int(math.Ceil(q*float64(len(lat)))) - 1
	return lat[min(max(i, 0), len(lat)-1)]
}

// us converts d to µs rounded to 0.1 µs.
func us(d time.Duration) float64 { return math.Round(float64(d)/100) / 10 }

// Frames is the number of content frames of a mock stream.
const Frames = 64

// StallGap is the inter-frame gap beyond which a frame counts as stalled.
const StallGap = time.Second

// StreamResult is the client-side view of one SSE stream.
type StreamResult struct {
	// TTFT is from sending the request to the first content frame.
	TTFT time.Duration
	// Gaps are the times between successive content frames (Frames-1 of
	// them for a full stream).
	Gaps []time.Duration
	// Frames is the number of content frames received.
	Frames int
	// Err is a transport error or a status other than 200.
	Err error
}

// Stream runs one streaming chat completion against the peer and times
// its content frames; the stream is bounded by timeout.
func (t *Target) Stream(ctx context.Context, timeout time.Duration) StreamResult {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.URL+"/v1/chat/completions", bytes.NewReader(StreamBody))
	if err != nil {
		return StreamResult{Err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", t.keys.next())
	start := time.Now()
	resp, err := t.client.Do(req)
	if err != nil {
		return StreamResult{Err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return StreamResult{Err: fmt.Errorf("status %d", resp.StatusCode)}
	}
	var res StreamResult
	res.Gaps = make([]time.Duration, 0, Frames)
	br := bufio.NewReaderSize(resp.Body, 16<<10)
	last := start
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 && bytes.HasPrefix(line, []byte("data: ")) && bytes.Contains(line, []byte(`"content":"`)) {
			now := time.Now()
			if res.Frames == 0 {
				res.TTFT = now.Sub(start)
			} else {
				res.Gaps = append(res.Gaps, now.Sub(last))
			}
			last = now
			res.Frames++
		}
		if err != nil {
			if err != bufio.ErrBufferFull && !errors.Is(err, io.EOF) {
				res.Err = err
			}
			if err != bufio.ErrBufferFull {
				return res
			}
		}
	}
}
