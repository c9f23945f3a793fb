package backends

import (
	"strings"
	"testing"
)

func TestValidateLockName(t *testing.T) {
	for _, tc := range []struct {
		name string
		lock string
		ok   bool
	}{
		{"plain", "billing", true},
		{"every character", "a-Z_0.9", true},
		{"longest", strings.Repeat("a", MaxLockName), true},
		{"empty", "", false},
		{"too long", strings.Repeat("a", MaxLockName+1), false},
		{"dot", ".", false},
		{"dot dot", "..", false},
		{"slash", "a/b", false},
		{"colon", "a:b", false},
		{"slot 1", "billing.slot1", false},
		{"slot 0", "billing.slot0", false},
		{"slot many digits", "billing.slot0042", false},
		{"only a slot suffix", ".slot7", false},
		{"a slot of a slot", "a.slot1.slot2", false},
		{"slot without digits", "billing.slot", true},
		{"slot and a letter", "billing.slot1a", true},
		{"slot in the middle", "billing.slot1.daily", true},
		{"slot without the dot", "billingslot1", true},
		{"slot with a dash", "billing-slot1", true},
		{"upper case slot", "billing.SLOT1", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateLockName(tc.lock)
			if (err == nil) != tc.ok {
				t.Errorf("ValidateLockName(%q) = %v, want ok %v", tc.lock, err, tc.ok)
			}
		})
	}
}

func TestSlotLock(t *testing.T) {
	for _, tc := range []struct {
		lock string
		i    int
		want string
	}{
		{"billing", 0, "billing"},
		{"billing", 1, "billing.slot1"},
		{"billing", 12, "billing.slot12"},
		{"a.b", 3, "a.b.slot3"},
	} {
		got := SlotLock(tc.lock, tc.i)
		if got != tc.want {
			t.Errorf("SlotLock(%q, %d) = %q, want %q", tc.lock, tc.i, got, tc.want)
		}
		// Every slot but 0 is a name no user may give a lock, so that no
		// user's lock is ever another lock's slot.
		if err := ValidateLockName(got); (err == nil) != (tc.i == 0) {
			t.Errorf("ValidateLockName(SlotLock(%q, %d)) = %v", tc.lock, tc.i, err)
		}
	}
	longest := SlotLock(strings.Repeat("a", MaxLockName), int(^uint(0)>>1))
	if len(longest) != MaxSlotLockName {
		t.Errorf("the longest slot name has %d characters, MaxSlotLockName says %d", len(longest), MaxSlotLockName)
	}
	defer func() {
		if recover() == nil {
			t.Error("SlotLock with a negative slot did not panic")
		}
	}()
	SlotLock("billing", -1)
}

func TestIdentityValue(t *testing.T) {
	for _, tc := range []struct {
		name     string
		claim    Claim
		value    string
		identity string
		holders  int
	}{
		{"one holder: the identity alone, as always", Claim{Identity: "h:1"}, "h:1", "h:1", 0},
		{"a pool of 1 is one holder", Claim{Identity: "h:1", Holders: 1}, "h:1", "h:1", 0},
		{"a pool of 3", Claim{Identity: "h:1", Holders: 3}, "h:1\nholders=3", "h:1", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := IdentityValue(tc.claim)
			if v != tc.value {
				t.Errorf("value %q, want %q", v, tc.value)
			}
			if id, n := ParseIdentityValue(v); id != tc.identity || n != tc.holders {
				t.Errorf("read back as %q, %d; want %q and %d holders", id, n, tc.identity, tc.holders)
			}
		})
	}
	// Values that another tool (etcdctl elect, a LeaderLatch) proposed
	// are identities as a whole.
	for _, v := range []string{"", "plain", "two\nlines", "x\nholders=", "x\nholders=1", "x\nholders=three", "x\nholders=3\nmore"} {
		if id, n := ParseIdentityValue(v); id != v || n != 0 {
			t.Errorf("ParseIdentityValue(%q) = %q, %d; want the whole value as identity and no holders", v, id, n)
		}
	}
}
