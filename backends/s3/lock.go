package s3

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/leaderrun/leaderrun/backends"
)

// maxLossPoll bounds the interval at which a holder reads its object: a
// loss is seen within the second that S3 (docs/safety.md) allows.
const maxLossPoll = 500 * time.Millisecond

// lease is the lock object's content (a free one keeps token and markers).
type lease struct {
	Holder   string          `json:"holder"`
	Owner    string          `json:"owner,omitempty"`
	Token    uint64          `json:"token"`
	LeaseMS  int64           `json:"lease_ms,omitempty"`
	Acquired time.Time       `json:"acquired,omitzero"`
	Renewed  time.Time       `json:"renewed,omitzero"`
	Holders  int             `json:"holders,omitempty"`
	RVN      string          `json:"rvn"`
	Markers  json.RawMessage `json:"markers,omitempty"`
}

// state is the state object's content.
type state struct {
	Mark    uint64          `json:"mark"`
	RVN     string          `json:"rvn"`
	History json.RawMessage `json:"history,omitempty"`
}

// lock is one lock's two objects.
type lock struct {
	s          *Store
	key, state string
}

var _ backends.RecordLock = (*lock)(nil)

// Key implements backends.Lock.
func (l *lock) Key() string { return l.s.bucket + "/" + l.key }

// handle is the Record.Handle of every record the store returns: the lock
// object as the candidacy last read or wrote it, which Keep, Free and a
// marker rewrite whole.
type handle struct {
	mu   sync.Mutex
	obj  lease
	etag string
}

func (h *handle) get() (lease, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.obj, h.etag
}

func (h *handle) set(obj lease, etag string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.obj, h.etag = obj, etag
}

func handleOf(rec backends.Record) *handle { return rec.Handle.(*handle) }

// record is the Record of the lock object obj, read or written with etag.
func record(obj lease, etag string) backends.Record {
	return backends.Record{Holder: obj.Holder, Owner: obj.Owner, Token: obj.Token, Holders: obj.Holders,
		TTL: time.Duration(obj.LeaseMS) * time.Millisecond, Acquired: obj.Acquired, Renewed: obj.Renewed,
		Left: backends.NoClock, Waiting: -1, Version: etag, Handle: &handle{obj: obj, etag: etag}}
}

// Get implements backends.RecordLock.
func (l *lock) Get(ctx context.Context) (backends.Record, error) {
	var obj lease
	etag, err := l.s.read(ctx, l.key, &obj)
	return record(obj, etag), err
}

// Take implements backends.RecordLock: it raises the mark, then writes
// the grant conditional on prev's ETag, keeping prev's markers. Where
// there is no lock object, it creates a free one first and takes that: a
// grant conditional on absence could land, with a lower token, behind a
// later grant whose object was deleted by hand meanwhile.
func (l *lock) Take(ctx context.Context, prev backends.Record, c backends.Claim) (backends.Record, error) {
	l.s.try.CompareAndSwap(0, int64(c.Timings.AttemptTimeout()/2))
	if !prev.Exists() {
		etag, err := l.s.write(ctx, l.key, lease{RVN: newRVN()}, "")
		if err != nil {
			return backends.Record{}, l.s.failed("create", l.key, err)
		}
		prev.Version, prev.Handle = etag, &handle{etag: etag}
	}
	token, err := l.raiseMark(ctx, prev.Token)
	if err != nil {
		return backends.Record{}, err
	}
	prevObj, _ := handleOf(prev).get()
	obj := lease{Holder: c.Identity, Owner: c.Owner, Token: token, Holders: c.Holders, Acquired: time.Now().UTC(),
		LeaseMS: int64((c.Timings.LeaseDuration + time.Millisecond - 1) / time.Millisecond), RVN: newRVN(), Markers: prevObj.Markers}
	obj.Renewed = obj.Acquired
	etag, err := l.s.write(ctx, l.key, obj, prev.Version)
	if conflict(err) { // the SDK's retry of a grant whose answer was lost meets the grant
		var cur lease
		if tag, rerr := l.s.read(ctx, l.key, &cur); rerr == nil && cur.Owner == c.Owner && cur.Token == token {
			return record(cur, tag), nil
		}
	}
	if err != nil {
		return backends.Record{}, l.s.failed("grant", l.key, err)
	}
	return record(obj, etag), nil
}

// raiseMark draws the next token, max(mark, token)+1, and writes it as
// the mark, conditional on the state object as read. A history written
// meanwhile is read again; a mark raised meanwhile is another candidate
// taking the lock: ErrLocked, to look again later rather than race it.
func (l *lock) raiseMark(ctx context.Context, token uint64) (uint64, error) {
	var err error
	var seen uint64
	for try := 0; try < 3; try++ {
		var st state
		etag, rerr := l.s.read(ctx, l.state, &st)
		if rerr != nil {
			return 0, rerr
		} else if try > 0 && st.Mark != seen {
			return 0, fmt.Errorf("s3: %s: another candidate is drawing a token: %w", l.Key(), backends.ErrLocked)
		}
		seen, st.Mark, st.RVN = st.Mark, max(st.Mark, token)+1, newRVN()
		if _, err = l.s.write(ctx, l.state, st, etag); err == nil || !conflict(err) {
			break
		}
	}
	if err != nil {
		return 0, l.s.failed("raise the token's mark in", l.state, err)
	}
	return max(seen, token) + 1, nil
}

// rewrite writes the lock object held has, changed and with a new rvn,
// and once more over what it finds if that is still held's grant (a write
// whose answer was lost, or the grant's marker, changed its ETag); an
// error wrapping ErrLeaseLost if it is not.
func (l *lock) rewrite(ctx context.Context, held backends.Record, op string, change func(*lease)) error {
	h := handleOf(held)
	for try := 0; ; try++ {
		obj, etag := h.get()
		change(&obj)
		obj.RVN = newRVN()
		tag, err := l.s.write(ctx, l.key, obj, etag)
		if err == nil {
			h.set(obj, tag)
			return nil
		} else if !conflict(err) || try > 0 {
			return l.s.failed(op, l.key, err)
		}
		var cur lease
		if tag, err = l.s.read(ctx, l.key, &cur); err == nil {
			err = l.lost(cur, tag, held)
		}
		if err != nil {
			return err
		}
		h.set(cur, tag)
	}
}

// lost says why cur, the lock object as read with etag, is no longer
// held's grant; nil if it is.
func (l *lock) lost(cur lease, etag string, held backends.Record) error {
	switch {
	case etag == "":
		return fmt.Errorf("s3: lock object %s was deleted: %w", l.Key(), backends.ErrLeaseLost)
	case cur.Holder == "":
		return fmt.Errorf("s3: lock object %s was released by someone else: %w", l.Key(), backends.ErrLeaseLost)
	case cur.Owner != held.Owner || cur.Token != held.Token:
		return fmt.Errorf("s3: lock object %s was taken by %q (token %d): %w", l.Key(), cur.Holder, cur.Token, backends.ErrLeaseLost)
	}
	return nil
}

// Keep implements backends.RecordLock: a new rvn and renewal time.
func (l *lock) Keep(ctx context.Context, held backends.Record) (backends.Record, error) {
	err := l.rewrite(ctx, held, "renew", func(obj *lease) { obj.Renewed = time.Now().UTC() })
	obj, etag := handleOf(held).get()
	held.Version, held.Renewed = etag, obj.Renewed
	return held, err
}

// Free implements backends.RecordLock: no holder; the token and the
// markers stay. One no longer held's is left alone.
func (l *lock) Free(ctx context.Context, held backends.Record) error {
	err := l.rewrite(ctx, held, "release", func(obj *lease) {
		*obj = lease{Token: obj.Token, Renewed: time.Now().UTC(), Markers: obj.Markers}
	})
	if errors.Is(err, backends.ErrLeaseLost) {
		return nil
	}
	return err
}

// Follow implements backends.RecordLock. S3 tells nobody of a change:
// waiters get no follower (the driver reads every retry period); a
// holder's asks for a read every retry period, at most every maxLossPoll.
func (l *lock) Follow(_ context.Context, c backends.Claim, held *backends.Record) (backends.Follower, error) {
	if held == nil {
		return nil, nil
	}
	return backends.Poll(min(c.Timings.RetryPeriod, maxLossPoll), nil), nil
}

// newRVN is 128 random bits: no two writes ever have the same content.
func newRVN() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}
