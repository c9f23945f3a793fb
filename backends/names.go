package backends

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxLockName is the length of the longest lock name ValidateLockName
// accepts.
const MaxLockName = 128

// slotSuffix separates a lock's name from the number of one of its slots.
const slotSuffix = ".slot"

// MaxSlotLockName is the length of the longest name SlotLock returns.
// Stores that bound the names they are given leave room for it.
const MaxSlotLockName = MaxLockName + len(slotSuffix) + 19 // the digits of the largest int

// ValidateLockName returns an error unless name is 1 to 128 characters from
// [A-Za-z0-9._-]. The same name must be safe as a file name, an etcd key and
// a Consul key, hence the narrow alphabet; "." and ".." are refused because
// they name directories. Names that end in ".slot" and digits are refused
// too: they are the names of slots of other locks (see SlotLock).
func ValidateLockName(name string) error {
	ok := len(name) >= 1 && len(name) <= MaxLockName && name != "." && name != ".."
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		ok = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
	}
	if !ok {
		return fmt.Errorf("invalid lock name %q: want 1-128 characters from [A-Za-z0-9._-]", name)
	}
	if i := strings.LastIndex(name, slotSuffix); i >= 0 {
		if d := name[i+len(slotSuffix):]; d != "" && strings.Trim(d, "0123456789") == "" {
			return fmt.Errorf("invalid lock name %q: names that end in %s and digits are reserved for the slots of --holders", name, slotSuffix)
		}
	}
	return nil
}

// SlotLock is the name of slot i of lock: with --holders N, each of the
// slots 0 to N-1 is a lock of its own, with its own lease and its own
// sequence of tokens. Slot 0 is lock itself, so that a pool of one holder
// is exactly the lock it always was; slot i >= 1 is lock + ".slot" + i,
// a name that ValidateLockName refuses, so that no user's lock is ever
// another lock's slot. SlotLock panics if i is negative, as an index out
// of range does.
func SlotLock(lock string, i int) string {
	if i < 0 {
		panic(fmt.Sprintf("backends: slot %d of lock %q: slots are numbered from 0", i, lock))
	}
	if i == 0 {
		return lock
	}
	return lock + slotSuffix + strconv.Itoa(i)
}

// ParseHolders reads a pool size from a holder's record, as a store wrote
// it with strconv.Itoa(Claim.Holders): 0 for anything that is not a
// decimal number of 2 or more (nothing recorded, or a record written by
// hand), which status reports as a lock of one holder.
func ParseHolders(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil || n < 2 {
		return 0
	}
	return n
}

// holdersLine starts the second line of IdentityValue in a pool.
const holdersLine = "holders="

// IdentityValue is the value a queue store keeps for a candidate of c:
// its identity, which is what the store's own tools show (etcdctl elect's
// proposal, a LeaderLatch participant id), and in a pool of more than one
// holder a second line, "holders=N". An identity holds no line break (the
// command line refuses control characters), so the two never mix.
func IdentityValue(c Claim) string {
	if c.Holders > 1 {
		return c.Identity + "\n" + holdersLine + strconv.Itoa(c.Holders)
	}
	return c.Identity
}

// ParseIdentityValue reads IdentityValue's form: an identity, and its
// pool's size (0 if none). A value of any other form (another tool's, an
// older leaderrun's) is an identity, as a whole.
func ParseIdentityValue(v string) (identity string, holders int) {
	identity, rest, _ := strings.Cut(v, "\n")
	if n, ok := strings.CutPrefix(rest, holdersLine); ok && ParseHolders(n) > 0 {
		return identity, ParseHolders(n)
	}
	return v, 0
}
