package backends

import (
	"context"
	"fmt"
	"time"
)

// ReadStatus reports who holds lock in s, without campaigning.
func ReadStatus(ctx context.Context, s Store, lock string) (Status, error) {
	lk := s.Lock(lock)
	st, err := lockStatus(ctx, lk)
	if err != nil {
		return Status{}, err
	}
	st.Lock, st.Backend = lock, s.Name()
	if st.Key == "" {
		// A queue store may name the leader's own key instead.
		st.Key = lk.Key()
	}
	return st, nil
}

// ReadHistory returns the most recent terms of lock in s, newest first, at
// most limit of them (limit <= 0: all the store keeps, at most
// HistoryLimit). A lock never held has an empty history.
func ReadHistory(ctx context.Context, s Store, lock string, limit int) ([]Term, error) {
	d, err := s.Lock(lock).ReadDoc(ctx, DocHistory)
	if err != nil {
		return nil, err
	}
	return NewestFirst(DecodeTerms(d.Data), limit), nil
}

// ReadMarker returns the completion marker of the once-key key in lock,
// nil if there is none or it expired. It needs no lease.
func ReadMarker(ctx context.Context, s Store, lock, key string) (*Marker, error) {
	return completedIn(ctx, s.Lock(lock), key, time.Now())
}

func lockStatus(ctx context.Context, lk Lock) (Status, error) {
	switch lk := lk.(type) {
	case QueueLock:
		return lk.Status(ctx)
	case RecordLock:
		rec, err := lk.Get(ctx)
		if err != nil {
			return Status{}, err
		}
		return recordStatus(rec, time.Now()), nil
	}
	return Status{}, fmt.Errorf("backends: a lock of type %T is neither a record nor a queue", lk)
}

// recordStatus is what rec, read at now, says of who holds the lock. For
// a store without a clock, the time left is the holder's own guess (its
// last renewal by its wall clock), and a record whose holder stopped
// renewing longer ago than its lease duration counts as free: status is
// for people, and decides nothing.
func recordStatus(rec Record, now time.Time) Status {
	st := Status{Waiting: rec.Waiting, Remaining: -1}
	if !rec.Exists() || rec.Holder == "" || rec.Left == 0 {
		st.Remaining = 0
		return st
	}
	switch {
	case rec.Left > 0:
		st.Remaining = rec.Left
	case rec.Left == NoClock && rec.TTL > 0 && !rec.Renewed.IsZero():
		st.Remaining = rec.Renewed.Add(rec.TTL).Sub(now)
		if st.Remaining <= 0 {
			st.Remaining = 0
			return st
		}
	}
	st.Held, st.Identity, st.Token, st.TTL, st.Node, st.Holders = true, rec.Holder, rec.Token, rec.TTL, rec.Node, rec.Holders
	return st
}
