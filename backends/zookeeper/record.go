package zookeeper

import (
	"strconv"
	"strings"

	"github.com/leaderrun/leaderrun/backends"
)

// holdersLine starts the second line of a candidate's znode data in a
// pool of more than one holder.
const holdersLine = "holders="

// candidateData is the data of a candidate's znode: its identity, as a
// Curator LeaderLatch's participant id reads, and in a pool of more than
// one holder (CampaignOptions.Holders) a second line, "holders=N". A lock
// of one holder keeps exactly the data leaderrun always wrote. An identity
// cannot hold a line break (the CLI refuses control characters), so the
// two never mix.
func candidateData(opts backends.CampaignOptions) []byte {
	if n := opts.RecordedHolders(); n > 0 {
		return []byte(opts.Identity + "\n" + holdersLine + strconv.Itoa(n))
	}
	return []byte(opts.Identity)
}

// parseData reads a candidate's znode data: an identity alone (a lock of
// one holder, an older leaderrun, another client) or with its pool's size
// (0 if none). Data of any other form is an identity, as a whole.
func parseData(data []byte) (identity string, holders int) {
	identity, rest, ok := strings.Cut(string(data), "\n")
	if ok {
		if n, ok := strings.CutPrefix(rest, holdersLine); ok && backends.ParseHolders(n) > 0 {
			return identity, backends.ParseHolders(n)
		}
	}
	return string(data), 0
}
