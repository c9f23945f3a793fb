package mysql

// Woken is how many times the waiters of s were told to read their row:
// what a release, a holder's death or a long wait costs the queue.
func (s *Store) Woken() uint64 { return s.woken.Load() }
