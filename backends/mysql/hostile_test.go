package mysql_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/mysql"
)

// floodProxy forwards connections to target until the client sends a
// request holding marker; it then answers that request itself with a
// packet announced as 16 MiB long, and bytes without end, until the
// client stops reading. sent counts what it sent so.
type floodProxy struct {
	ln     net.Listener
	target string
	marker []byte
	sent   atomic.Int64
	wg     sync.WaitGroup
}

func startFloodProxy(t *testing.T, target, marker string) *floodProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &floodProxy{ln: ln, target: target, marker: []byte(marker)}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() { ln.Close(); p.wg.Wait() })
	return p
}

func (p *floodProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		var flooding atomic.Bool
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			buf := make([]byte, 64<<10)
			for {
				n, err := s.Read(buf)
				if flooding.Load() {
					_, _ = io.Copy(io.Discard, s)
					return
				}
				if n > 0 {
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					c.Close()
					return
				}
			}
		}()
		go func() { defer p.wg.Done(); p.up(c, s, &flooding) }()
	}
}

// up copies the client's requests to the server, or floods the client.
func (p *floodProxy) up(c, s net.Conn, flooding *atomic.Bool) {
	defer s.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return
		}
		if !bytes.Contains(buf[:n], p.marker) {
			if _, err := s.Write(buf[:n]); err != nil {
				return
			}
			continue
		}
		flooding.Store(true)
		s.Close()
		junk := bytes.Repeat([]byte{'x'}, 64<<10)
		copy(junk, []byte{0xff, 0xff, 0xff, 1})
		for {
			n, err := c.Write(junk)
			p.sent.Add(int64(n))
			if err != nil {
				c.Close()
				return
			}
			junk[0], junk[1], junk[2], junk[3] = 'x', 'x', 'x', 'x'
		}
	}
}

// testHostile: a server whose answer does not end is read up to a bound,
// and refused: the connection is closed long before the 16 MiB its packet
// announced, and the campaign ends at once, even one that would wait.
func testHostile(t *testing.T, e *env) {
	p := startFloodProxy(t, e.m.Addr(), "GREATEST(TIMESTAMPDIFF")
	s := newStore(t, e, mysql.Config{DSN: "root:" + e.m.RootPassword + "@tcp(" + p.ln.Addr().String() + ")/leaderrun"})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	_, err := backends.Campaign(ctx, s, lockName(), backends.Candidate{Identity: "x", Timings: defaultTimings, Wait: 15 * time.Second})
	if !errors.Is(err, backends.ErrRefused) || time.Since(start) > 5*time.Second {
		t.Errorf("an endless answer: %v after %v, want refused at once", err, time.Since(start))
	}
	// The proxy's count includes what the sockets' buffers took in (some
	// MiB each on loopback); a client that read on would have taken it
	// all until the context ended.
	if n := p.sent.Load(); n > 32<<20 {
		t.Errorf("the client took %d bytes of the endless answer", n)
	}
	t.Logf("refused after %v: %v (the proxy sent %d KiB, socket buffers included)", time.Since(start).Round(time.Millisecond), err, p.sent.Load()>>10)
}
