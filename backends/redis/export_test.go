package redis

// Attempts is how many times the backend ran the acquire script: what a
// waiter does when it acts on a release, an expiry or its heartbeat.
func (b *Backend) Attempts() uint64 { return b.attempts.Load() }

// Tracking reports whether the lease's tracker proved that Redis
// announces changes of its key (track.go).
func (l *lease) Tracking() bool {
	select {
	case <-l.done:
		return false
	default:
	}
	return l.tracked.Load()
}
