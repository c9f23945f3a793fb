package watchdog

import (
	"encoding/json"
	"testing"

	"github.com/leaderrun/leaderrun/signals/stop"
)

// TestDeadlineOrder: the allocation-free reading of the order sent at
// every renewal takes exactly what encoding/json writes for it, and leaves
// every other line to json.Unmarshal.
func TestDeadlineOrder(t *testing.T) {
	for _, d := range []stop.Instant{1, 42, 1234567890123456, 999999999999999999} {
		line, err := json.Marshal(Order{Deadline: d})
		if err != nil {
			t.Fatal(err)
		}
		if got := deadlineOrder(line); got != d {
			t.Errorf("deadlineOrder(%s) = %d, want %d", line, got, d)
		}
	}
	for _, line := range []string{`{"stop":15}`, `{"deadline":}`, `{"deadline":-5}`, `{"deadline":12x}`, `{"deadline":1} `,
		`{"deadline":1234567890123456789}`, `{"start":{"path":"/bin/true"},"deadline":5}`, ``} {
		if got := deadlineOrder([]byte(line)); got != 0 {
			t.Errorf("deadlineOrder(%q) = %d, want 0 (json.Unmarshal's to read)", line, got)
		}
	}
	if n := testing.AllocsPerRun(100, func() { deadlineOrder([]byte(`{"deadline":1234567890123}`)) }); n != 0 {
		t.Errorf("deadlineOrder allocates %v times", n)
	}
}
