//go:build darwin

package signals

import "sync/atomic"

// BecomeSubreaper is a no-op where the OS has no subreapers.
func BecomeSubreaper() error { return nil }

// subreaper is never set where the OS has no subreapers.
var subreaper atomic.Bool

// ownHelper: the command's tree here is its process group alone (see
// watchdog.Leftovers), which leaderrun's own helpers are never in.
func ownHelper(int) bool { return false }
