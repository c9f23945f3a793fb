package cmd

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/leaderrun/leaderrun/backends"
)

// TestStatusHolders: status shows the pool size a holder recorded
// (--holders), in text only for a pool, in --json whenever one is recorded.
func TestStatusHolders(t *testing.T) {
	for _, tc := range []struct {
		name     string
		holders  int
		text     string // the line wanted, "" for none
		jsonHold bool
	}{
		{"a pool of 3", 3, "holders:  3\n", true},
		{"one holder, nothing recorded", 0, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := backends.Status{Lock: "billing.slot2", Backend: "etcd", Key: "leaderrun/billing.slot2/", Held: true,
				Identity: "web-1", Token: 42, Remaining: -1, Waiting: 0, Holders: tc.holders}
			var out bytes.Buffer
			printStatus(&state{stdout: &out}, s, nil)
			if got := strings.Contains(out.String(), "holders:"); got != (tc.text != "") || !strings.Contains(out.String(), tc.text) {
				t.Errorf("text status:\n%s\nwant the line %q", out.String(), tc.text)
			}
			data, err := json.Marshal(statusJSON{Status: s})
			if err != nil {
				t.Fatal(err)
			}
			var fields map[string]any
			if err := json.Unmarshal(data, &fields); err != nil {
				t.Fatal(err)
			}
			if n, ok := fields["holders"]; ok != tc.jsonHold || ok && n != float64(tc.holders) {
				t.Errorf("--json status %s: holders %v (present %v), want %d present %v", data, n, ok, tc.holders, tc.jsonHold)
			}
		})
	}
}
