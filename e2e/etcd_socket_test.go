//go:build linux

package e2e

import (
	"bytes"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// TestEtcdUnixSockets: unix:// and unixs:// endpoints, as etcd's client
// speaks them. A member's plain socket, and its TLS socket with the TLS
// flags, get the lock. An unixs:// endpoint speaks TLS from its first
// byte: a listener that records what it receives gets a TLS handshake,
// where an unix:// endpoint sends HTTP/2's preface in clear.
func TestEtcdUnixSockets(t *testing.T) {
	t.Parallel()
	plain := testenv.StartEtcdWith(t, testenv.EtcdOptions{Members: 1, Sockets: true})
	secure := testenv.StartEtcdWith(t, testenv.EtcdOptions{Members: 1, TLS: true, Sockets: true})
	tlsFlags := []string{"--etcd-cacert", secure.TLS.CACert, "--etcd-cert", secure.TLS.Cert, "--etcd-key", secure.TLS.Key}
	events := etcdEvents(t)
	for _, tc := range []struct {
		name, endpoint string
		extra          []string
	}{
		{"unix", plain.Members[0].SocketURL, nil},
		{"unixs", secure.Members[0].SocketURL, tlsFlags},
	} {
		if code := etcdRun(t, events, "exit:0", []string{tc.endpoint}, "socket", tc.name, tc.extra...).wait(10 * time.Second); code != 0 {
			t.Errorf("%s: exit %d, want 0", tc.endpoint, code)
		}
		args := append([]string{"status", "--lock", "socket", "--etcd-endpoints", tc.endpoint}, tc.extra...)
		if out, code := output(t, args...); code != 3 {
			t.Errorf("status on %s: exit %d, want 3 (no leader):\n%s", tc.endpoint, code, out)
		}
	}
	if evs := readEvents(t, events); count(evs, "start") != 2 {
		t.Errorf("children started:\n%s\nwant one per socket", formatEvents(evs))
	}

	for _, tc := range []struct {
		scheme string
		want   []byte
	}{
		{"unixs", []byte{0x16, 0x03}}, // a TLS handshake record
		{"unix", []byte("PRI * HTTP/2.0")},
	} {
		path := filepath.Join(t.TempDir(), "etcd.sock")
		l, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		first := make(chan []byte, 1)
		go func() {
			c, err := l.Accept()
			if err != nil {
				first <- nil
				return
			}
			defer c.Close()
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			b := make([]byte, len(tc.want))
			n, _ := io.ReadFull(c, b)
			first <- b[:n]
		}()
		out, code := output(t, "--lock", "socket", "--etcd-endpoints", tc.scheme+"://"+path, "--etcd-dial-timeout", "1s", "--wait", "1s", "--", "/bin/true")
		l.Close()
		got := <-first
		t.Logf("%s://: first bytes %q; exit %d: %s", tc.scheme, got, code, strings.TrimSpace(finalLine(out)))
		if !bytes.Equal(got, tc.want) {
			t.Errorf("%s:// sent %q first, want %q", tc.scheme, got, tc.want)
		}
		if code != 69 {
			t.Errorf("%s:// to a socket that answers nothing: exit %d, want 69", tc.scheme, code)
		}
	}
}
