package testenv

import (
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy forwards TCP connections from a loopback port to a target and can
// break the link the way networks do: Stall holds every byte in both
// directions without closing anything (a partition as TCP sees it), Resume
// lets them flow again, Reset closes every connection (a short outage).
type Proxy struct {
	ln      net.Listener
	targets []string
	ready   func(target string) bool
	next    int // the target the next connection tries first

	mu      sync.Mutex
	stalled bool
	resume  chan struct{} // closed by Resume
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

// NewProxy listens on 127.0.0.1 and forwards to target until the test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	return NewBalancer(t, nil, target)
}

// NewBalancer is a Proxy in front of several targets, as a load balancer
// in front of the servers of a highly available service: each new
// connection goes to the next target in turn that ready reports ready (its
// health check; nil: any target that accepts the connection). Open
// connections stay with their target until it closes them.
func NewBalancer(t testing.TB, ready func(target string) bool, targets ...string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &Proxy{ln: ln, targets: targets, ready: ready, resume: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	close(p.resume)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr is host:port of the proxy.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Stall holds all traffic from now on, on open and new connections alike.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stalled {
		p.stalled = true
		p.resume = make(chan struct{})
	}
}

// Resume lets held traffic flow again.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled {
		p.stalled = false
		close(p.resume)
	}
}

// Reset closes every open connection; new ones are accepted as before.
func (p *Proxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() {
	p.ln.Close()
	p.Resume()
	p.Reset()
	p.wg.Wait()
}

func (p *Proxy) gate() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.resume
}

func (p *Proxy) track(c net.Conn, add bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if add {
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := p.dial()
		if err != nil {
			in.Close()
			continue
		}
		p.track(in, true)
		p.track(out, true)
		p.wg.Add(2)
		go p.pipe(in, out)
		go p.pipe(out, in)
	}
}

// dial connects to the first target, from p.next on, that is ready and
// accepts the connection.
func (p *Proxy) dial() (net.Conn, error) {
	var last error
	for i := range p.targets {
		n := (p.next + i) % len(p.targets)
		target := p.targets[n]
		if p.ready != nil && !p.ready(target) {
			last = fmt.Errorf("proxy: %s is not ready", target)
			continue
		}
		c, err := net.Dial("tcp", target)
		if err != nil {
			last = err
			continue
		}
		p.next = n + 1
		return c, nil
	}
	return nil, last
}

// pipe copies src to dst, waiting at the gate before every write.
func (p *Proxy) pipe(src, dst net.Conn) {
	defer p.wg.Done()
	defer func() {
		src.Close()
		dst.Close()
		p.track(src, false)
		p.track(dst, false)
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			<-p.gate()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				return
			}
			return
		}
	}
}
