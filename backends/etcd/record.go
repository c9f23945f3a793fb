package etcd

import (
	"strconv"
	"strings"

	"github.com/leaderrun/leaderrun/backends"
)

// holdersLine starts the second line of a candidate's value in a pool of
// more than one holder.
const holdersLine = "holders="

// candidateValue is the value of a candidate's key: its identity, which is
// what `etcdctl elect` shows as the leader's proposal, and in a pool of
// more than one holder (Claim.Holders) a second line,
// "holders=N". A lock of one holder keeps exactly the value leaderrun
// always wrote. An identity cannot hold a line break (the CLI refuses
// control characters), so the two never mix.
func candidateValue(c backends.Claim) string {
	if c.Holders > 1 {
		return c.Identity + "\n" + holdersLine + strconv.Itoa(c.Holders)
	}
	return c.Identity
}

// value is what a candidate's key says of it.
type value struct {
	identity string
	holders  int // 0 if none is recorded
}

// parseValue reads a candidate's value: an identity alone (a lock of one
// holder, an older leaderrun, etcdctl elect) or with its pool's size. A
// value of any other form is an identity, as a whole.
func parseValue(v []byte) value {
	identity, rest, ok := strings.Cut(string(v), "\n")
	if ok {
		if n, ok := strings.CutPrefix(rest, holdersLine); ok && backends.ParseHolders(n) > 0 {
			return value{identity: identity, holders: backends.ParseHolders(n)}
		}
	}
	return value{identity: string(v)}
}
