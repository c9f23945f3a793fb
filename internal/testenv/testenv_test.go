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
