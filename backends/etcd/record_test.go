package etcd

import (
	"testing"

	"github.com/leaderrun/leaderrun/backends"
)

func TestCandidateValue(t *testing.T) {
	for _, tc := range []struct {
		name     string
		claim    backends.Claim
		value    string
		identity string
		holders  int
	}{
		{"one holder: the identity alone, as always", backends.Claim{Identity: "h:1"}, "h:1", "h:1", 0},
		{"a pool of 1 is one holder", backends.Claim{Identity: "h:1", Holders: 1}, "h:1", "h:1", 0},
		{"a pool of 3", backends.Claim{Identity: "h:1", Holders: 3}, "h:1\nholders=3", "h:1", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := candidateValue(tc.claim)
			if v != tc.value {
				t.Errorf("value %q, want %q", v, tc.value)
			}
			if got := parseValue([]byte(v)); got.identity != tc.identity || got.holders != tc.holders {
				t.Errorf("read back as %+v, want identity %q and %d holders", got, tc.identity, tc.holders)
			}
		})
	}
	// Values that another tool (etcdctl elect) proposed are identities as
	// a whole.
	for _, v := range []string{"", "plain", "two\nlines", "x\nholders=", "x\nholders=1", "x\nholders=three", "x\nholders=3\nmore"} {
		if got := parseValue([]byte(v)); got.identity != v || got.holders != 0 {
			t.Errorf("parseValue(%q) = %+v, want the whole value as identity and no holders", v, got)
		}
	}
}
