package backends

import "strconv"

// RecordedHolders is the pool size that a grant for opts records in the
// holder's record: opts.Holders when it is more than 1, else 0, which
// records nothing, so that the record of a lock of one holder stays what
// leaderrun always wrote.
func (opts CampaignOptions) RecordedHolders() int {
	if opts.Holders > 1 {
		return opts.Holders
	}
	return 0
}

// ParseHolders reads a pool size from a holder's record, as a backend
// wrote it with strconv.Itoa(RecordedHolders()): 0 for anything that is
// not a decimal number of 2 or more (nothing recorded, or a record written
// by hand), which Status reports as a lock of one holder.
func ParseHolders(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil || n < 2 {
		return 0
	}
	return n
}
