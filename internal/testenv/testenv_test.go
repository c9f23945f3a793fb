package testenv

import (
	"net"
	"strconv"
	"testing"
)

// TestFreePortBelowEphemeralRange: the ports handed to servers are free,
// and on Linux below the range the kernel takes outgoing connections'
// local ports from, so no connection of another process can take one
// before the server binds it.
func TestFreePortBelowEphemeralRange(t *testing.T) {
	low := ephemeralLow()
	if low == 0 {
		t.Skip("no ip_local_port_range on this system")
	}
	for range 50 {
		port := FreePort(t, "127.0.0.1")
		if port < portFloor || port >= low {
			t.Fatalf("FreePort = %d, want within [%d, %d)", port, portFloor, low)
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatalf("FreePort = %d, but it cannot be bound: %v", port, err)
		}
		l.Close()
	}
}

// TestFreePortNeverRepeats: a server's ports are all picked before it
// binds any, so a pick must never return a port handed out before, even
// one nothing listens on yet. With random picks below the ephemeral range
// and no memory, 3,000 picks repeat one almost surely (about 200 pairs).
func TestFreePortNeverRepeats(t *testing.T) {
	seen := map[int]bool{}
	for range 3000 {
		port := FreePort(t, "127.0.0.1")
		if seen[port] {
			t.Fatalf("FreePort returned %d twice", port)
		}
		seen[port] = true
	}
}
