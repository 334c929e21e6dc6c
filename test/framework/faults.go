package framework

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
)

// Helpers of the process and control-plane fault tests (test/chaos).

// Kill sends SIGKILL to the process group and waits for the process to exit (kill -9:
// nothing runs after it). It is safe once the process has exited.
func (p *Process) Kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// CutProxy is a TCP proxy on 127.0.0.1 in front of one address (the API server) that
// can be cut: while cut, every open connection is closed and new ones are accepted and
// closed at once (the clients see connection resets, as when the server is down).
type CutProxy struct {
	// Addr is the proxy's listen address (127.0.0.1:port).
	Addr   string
	target string
	ln     net.Listener
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// StartCutProxy listens on a free 127.0.0.1 port and forwards to target until t ends.
func StartCutProxy(t testing.TB, target string) *CutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &CutProxy{Addr: ln.Addr().String(), target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.Close)
	return p
}

func (p *CutProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go p.pipe(c)
	}
}

func (p *CutProxy) pipe(c net.Conn) {
	defer p.wg.Done()
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		p.drop(c)
		return
	}
	p.mu.Lock()
	if p.cut {
		p.mu.Unlock()
		up.Close()
		p.drop(c)
		return
	}
	p.conns[up] = struct{}{}
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
	p.drop(c)
	p.drop(up)
	<-done
}

func (p *CutProxy) drop(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

// Cut closes every open connection and refuses new ones until Restore.
func (p *CutProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

// Restore forwards new connections again.
func (p *CutProxy) Restore() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// Close stops the proxy and closes every connection.
func (p *CutProxy) Close() {
	p.Cut()
	_ = p.ln.Close()
	p.wg.Wait()
}

// KubeconfigVia writes to path a copy of the kubeconfig at src whose clusters' server
// is https://addr (a proxy on 127.0.0.1: the API server's certificate covers it).
func KubeconfigVia(src, path, addr string) error {
	cfg, err := clientcmd.LoadFromFile(src)
	if err != nil {
		return err
	}
	if len(cfg.Clusters) == 0 {
		return errors.New("kubeconfig has no cluster")
	}
	for _, c := range cfg.Clusters {
		c.Server = "https://" + addr
	}
	return clientcmd.WriteToFile(*cfg, path)
}

// MetricValue returns the value of the first sample of the Prometheus text exposition
// at u whose line begins with prefix (metric name and labels, e.g.
// `fairshare_scheduler_tenant_kv_blocks{tenant="a"}`), and whether there is one.
func MetricValue(ctx context.Context, u, prefix string) (float64, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, false, err
	}
	resp, err := probeClient.Do(req)
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, false, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, false, fmt.Errorf("GET %s: %d", u, resp.StatusCode)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, prefix+" ") {
			v, err := strconv.ParseFloat(strings.TrimSpace(line[len(prefix):]), 64)
			return v, err == nil, err
		}
	}
	return 0, false, nil
}

// WriteFileOrFail writes b to path or fails t.
func WriteFileOrFail(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// Exited reports whether the current run of the scheduler has ended, and its error
// (false before Start).
func (p *SchedulerProcess) Exited() (bool, error) {
	if p.done == nil {
		return false, nil
	}
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}
