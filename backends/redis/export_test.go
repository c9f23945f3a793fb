package redis

// Woken is how many times the waiters of s were told to look at their
// lock: what a release, an expiry or a heartbeat costs the queue.
func (s *Store) Woken() uint64 { return s.woken.Load() }
