package mysql

// Woken is how many times the waiters of s were woken: told to read their
// row, or moved up the queue. What a release, a holder's death or a long
// wait costs the queue.
func (s *Store) Woken() uint64 { return s.woken.Load() }

// NamedLocks are the names of lock's named locks in s: the queue's, held
// by the first waiter in line, and the holder's.
func NamedLocks(s *Store, name string) (queue, held string) {
	l := s.Lock(name).(*lock)
	return l.queue, l.held
}
