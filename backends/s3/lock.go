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
// loss is then seen within half a second and a read, inside the second
// that S3 (docs/safety.md) allows, whatever the retry period.
const maxLossPoll = 500 * time.Millisecond

// lease is the lock object's content. Holder is "" when the lock is free;
// the token stays, as proof of the last one granted, and so do the
// markers, which outlive the grants.
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

// state is the state object's content: the token's high-water mark and
// the history.
type state struct {
	Mark    uint64          `json:"mark"`
	RVN     string          `json:"rvn"`
	History json.RawMessage `json:"history,omitempty"`
}

// lock is one lock's two objects.
type lock struct {
	s     *Store
	key   string // the lock object
	state string // the state object
}

var _ backends.RecordLock = (*lock)(nil)

// Key implements backends.Lock: bucket/<prefix><lock>.
func (l *lock) Key() string { return l.s.bucket + "/" + l.key }

// handle is the Record.Handle of every record the store returns: the lock
// object as last read or written by this candidacy, which Keep, Free and
// a marker's write rewrite whole, and when a write last proved it ours.
type handle struct {
	mu     sync.Mutex
	obj    lease
	etag   string
	proved time.Time
}

func (h *handle) get() (lease, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.obj, h.etag
}

// set records obj as written with etag by a request sent at sent (zero:
// only read).
func (h *handle) set(obj lease, etag string, sent time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.obj, h.etag = obj, etag
	if sent.After(h.proved) {
		h.proved = sent
	}
}

func (h *handle) due(every time.Duration) time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.proved.Add(every)
}

// handleOf is rec's handle; one made of rec alone for a record that has
// none.
func handleOf(rec backends.Record) *handle {
	if h, ok := rec.Handle.(*handle); ok {
		return h
	}
	return &handle{obj: lease{Holder: rec.Holder, Owner: rec.Owner, Token: rec.Token}, etag: rec.Version}
}

// record is the Record of the lock object obj, read or written with etag.
func record(obj lease, etag string, sent time.Time) backends.Record {
	h := &handle{}
	h.set(obj, etag, sent)
	return backends.Record{Holder: obj.Holder, Owner: obj.Owner, Token: obj.Token, Holders: obj.Holders,
		TTL: time.Duration(obj.LeaseMS) * time.Millisecond, Acquired: obj.Acquired, Renewed: obj.Renewed,
		Left: backends.NoClock, Waiting: -1, Version: etag, Handle: h}
}

// ours reports whether obj is still the grant held.
func ours(obj lease, held backends.Record) bool {
	return obj.Holder != "" && obj.Owner == held.Owner && obj.Token == held.Token
}

// Get implements backends.RecordLock.
func (l *lock) Get(ctx context.Context) (backends.Record, error) {
	var obj lease
	etag, err := l.s.read(ctx, l.key, &obj)
	if err != nil {
		return backends.Record{}, err
	}
	return record(obj, etag, time.Time{}), nil
}

// Take implements backends.RecordLock: it raises the mark in the state
// object to the new token, conditional on the state as read, then writes
// the grant, conditional on prev's ETag, keeping prev's markers. Where
// there is no lock object, it first creates a free one (If-None-Match: *)
// and takes that: a grant conditional on there being none could land
// behind a later grant whose object was deleted by hand meanwhile, with a
// lower token.
func (l *lock) Take(ctx context.Context, prev backends.Record, c backends.Claim) (backends.Record, error) {
	l.s.learn(c.Timings)
	if !prev.Exists() {
		free := lease{RVN: newRVN()}
		etag, err := l.s.write(ctx, l.key, free, "")
		if err != nil {
			return backends.Record{}, l.writeFailed("create", l.key, err)
		}
		prev = record(free, etag, time.Time{})
	}
	token, err := l.raiseMark(ctx, prev.Token)
	if err != nil {
		return backends.Record{}, err
	}
	now := timeNow()
	obj := lease{Holder: c.Identity, Owner: c.Owner, Token: token, Holders: c.Holders, Acquired: now, Renewed: now,
		LeaseMS: int64((c.Timings.LeaseDuration + time.Millisecond - 1) / time.Millisecond), RVN: newRVN()}
	if prev.Exists() {
		prevObj, _ := handleOf(prev).get()
		obj.Markers = prevObj.Markers
	}
	sent := time.Now()
	etag, err := l.s.write(ctx, l.key, obj, prev.Version)
	if conflict(err) {
		// The SDK's retry of a grant whose first answer was lost meets
		// the grant itself.
		var cur lease
		if tag, rerr := l.s.read(ctx, l.key, &cur); rerr == nil && cur.Owner == c.Owner && cur.Token == obj.Token {
			return record(cur, tag, sent), nil
		}
	}
	if err != nil {
		return backends.Record{}, l.writeFailed("grant", l.key, err)
	}
	return record(obj, etag, sent), nil
}

// raiseMark draws the next token, max(mark, token)+1, and writes it as
// the new mark, conditional on the state object as read. A history written
// meanwhile is read again; a mark raised meanwhile is another candidate
// taking the lock, and this one looks again a retry period later
// (ErrLocked) rather than race it.
func (l *lock) raiseMark(ctx context.Context, token uint64) (uint64, error) {
	var err error
	for try, seen := 0, uint64(0); try < 3; try++ {
		var st state
		etag, rerr := l.s.read(ctx, l.state, &st)
		switch {
		case rerr != nil:
			return 0, rerr
		case try > 0 && st.Mark != seen:
			return 0, fmt.Errorf("s3: %s: another candidate is drawing a token: %w", l.Key(), backends.ErrLocked)
		}
		seen, st.Mark, st.RVN = st.Mark, max(st.Mark, token)+1, newRVN()
		if _, err = l.s.write(ctx, l.state, st, etag); err == nil {
			return st.Mark, nil
		} else if !conflict(err) {
			break
		}
	}
	return 0, l.writeFailed("raise the token's mark in", l.state, err)
}

// writeFailed wraps the error of a conditional write: a conflict if its
// condition did not hold.
func (l *lock) writeFailed(op, key string, err error) error {
	if conflict(err) {
		return fmt.Errorf("s3: %s %s/%s: %w: %w", op, l.s.bucket, key, backends.ErrConflict, err)
	}
	return l.s.failed(op, key, err)
}

// rewrite writes obj, with a new rvn, over the lock object held has, and
// again once over what it finds if that is still held's grant: a write
// whose answer was lost, or the grant's own marker, changed its ETag.
// It returns obj as written, an error wrapping ErrLeaseLost if the object
// is no longer held's (gone, released or taken).
func (l *lock) rewrite(ctx context.Context, held backends.Record, op string, change func(*lease)) error {
	h := handleOf(held)
	for try := 0; ; try++ {
		obj, etag := h.get()
		change(&obj)
		obj.RVN = newRVN()
		sent := time.Now()
		tag, err := l.s.write(ctx, l.key, obj, etag)
		switch {
		case err == nil:
			h.set(obj, tag, sent)
			return nil
		case !conflict(err) || try > 0:
			return l.writeFailed(op, l.key, err)
		}
		var cur lease
		tag, err = l.s.read(ctx, l.key, &cur)
		switch {
		case err != nil:
			return err
		case tag == "":
			return fmt.Errorf("s3: lock object %s was deleted: %w", l.Key(), backends.ErrLeaseLost)
		case cur.Holder == "":
			return fmt.Errorf("s3: lock object %s was released by someone else: %w", l.Key(), backends.ErrLeaseLost)
		case !ours(cur, held):
			return fmt.Errorf("s3: lock object %s was taken by %q (token %d): %w", l.Key(), cur.Holder, cur.Token, backends.ErrLeaseLost)
		}
		h.set(cur, tag, time.Time{})
	}
}

// Keep implements backends.RecordLock: the lock object rewritten with a
// new rvn and renewal time.
func (l *lock) Keep(ctx context.Context, held backends.Record) (backends.Record, error) {
	err := l.rewrite(ctx, held, "renew", func(obj *lease) { obj.Renewed = timeNow() })
	if err == nil {
		obj, etag := handleOf(held).get()
		held.Version, held.Renewed = etag, obj.Renewed
	}
	return held, err
}

// Free implements backends.RecordLock: the lock object rewritten without
// a holder, keeping the token and the markers. One no longer held's is
// left alone.
func (l *lock) Free(ctx context.Context, held backends.Record) error {
	err := l.rewrite(ctx, held, "release", func(obj *lease) {
		*obj = lease{Token: obj.Token, Renewed: timeNow(), Markers: obj.Markers}
	})
	if errors.Is(err, backends.ErrLeaseLost) {
		return nil
	}
	return err
}

// Follow implements backends.RecordLock. S3 tells nobody of a change:
// waiters get no follower (the driver reads every retry period), and a
// holder's follower asks for a read every retry period, at most every
// maxLossPoll, unless a write proved the grant meanwhile.
func (l *lock) Follow(_ context.Context, c backends.Claim, held *backends.Record) (backends.Follower, error) {
	if held == nil {
		return nil, nil
	}
	every, h := min(c.Timings.RetryPeriod, maxLossPoll), handleOf(*held)
	return backends.Poll(every, func() time.Time { return h.due(every) }), nil
}

// newRVN is 128 random bits, so that no two writes, by any host, ever
// write the same content.
func newRVN() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}
