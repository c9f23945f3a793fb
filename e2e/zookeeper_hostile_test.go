//go:build linux

package e2e

import (
	"encoding/binary"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// TestZooKeeperHostileServer: a ZooKeeper server that (a) announces an
// answer of 1 GiB to the connect request and sends it without end, or
// (b) answers the connect request as a server does and then announces a
// packet of 1 GiB and sends it without end. leaderrun exits 69 within
// 15 s with its peak RSS under 64 MiB: the client library reads the
// connect answer into a buffer of whatever length the server announces,
// which leaderrun refuses beyond 1 KiB, and refuses later packets beyond
// 1 MiB (the server's own default bound) itself.
func TestZooKeeperHostileServer(t *testing.T) {
	t.Parallel()
	// A connect answer as ZooKeeper writes it: protocol version 0, the
	// session timeout in ms, a session id and a password of 16 bytes.
	answer := binary.BigEndian.AppendUint32(nil, 36)
	answer = binary.BigEndian.AppendUint32(answer, 0)
	answer = binary.BigEndian.AppendUint32(answer, 20000)
	answer = binary.BigEndian.AppendUint64(answer, 0x1234)
	answer = binary.BigEndian.AppendUint32(answer, 16)
	answer = append(answer, make([]byte, 16)...)
	huge := binary.BigEndian.AppendUint32(nil, 1<<30)
	for _, tc := range []struct {
		name  string
		first []byte
	}{
		{"endless connect answer", huge},
		{"endless packet after the handshake", append(append([]byte(nil), answer...), huge...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			accepted := serveForever(t, tc.first)
			m := testenv.RunMeasured(t, hostileDeadline, testenv.Leaderrun(t),
				"--zk-servers", accepted.addr, "--zk-connect-timeout", "2s", "--lease-duration", "20s",
				"--lock", "hostile", "--wait", "5s", "--", "true")
			t.Logf("exit %d after %v, peak RSS %.1f MiB, %d connections\n%s", m.Code, m.Took.Round(time.Millisecond),
				float64(m.PeakRSS)/(1<<20), accepted.n.Load(), strings.TrimSpace(m.Output))
			if m.Code != 69 {
				t.Errorf("exit %d, want 69", m.Code)
			}
			if m.PeakRSS >= hostileMaxRSS {
				t.Errorf("peak RSS %.1f MiB, want under %d MiB", float64(m.PeakRSS)/(1<<20), hostileMaxRSS>>20)
			}
			if accepted.n.Load() == 0 {
				t.Error("leaderrun never connected: the test tested nothing")
			}
		})
	}
}

// hostileListener is a TCP listener that writes first, once the client's
// connect request has come, then zeros without end, on every connection.
type hostileListener struct {
	addr string
	n    atomic.Int32
}

func serveForever(t *testing.T, first []byte) *hostileListener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &hostileListener{addr: ln.Addr().String()}
	// leaderrun has exited when the test cleans up, so every connection's
	// reads and writes fail and its goroutine returns.
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.n.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				// The connect request: its length, then as much.
				var head [4]byte
				if _, err := io.ReadFull(c, head[:]); err != nil {
					return
				}
				if _, err := io.ReadFull(c, make([]byte, binary.BigEndian.Uint32(head[:])%4096)); err != nil {
					return
				}
				if _, err := c.Write(first); err != nil {
					return
				}
				zeros := make([]byte, 64<<10)
				for {
					if _, err := c.Write(zeros); err != nil {
						return
					}
				}
			}()
		}
	}()
	return h
}
