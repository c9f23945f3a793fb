package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"

	"github.com/leaderrun/leaderrun/backends"
)

// maxAttempts bounds the conflicts one write retries: each conflict is a
// write by someone else that did not take the Lease (a label, an
// annotation, a lost leader recording its term), which is rare.
const maxAttempts = 5

// lease is a grant of the Lease. A goroutine started by newLease consumes
// the watch and closes Lost when the Lease is deleted or its record stops
// being this grant's; Release stops it and waits for it.
type lease struct {
	b        *Backend
	identity string
	token    uint64
	seconds  int32         // the leaseDurationSeconds written
	ttl      time.Duration // what the runner may count on (guaranteedTTL)
	acquired time.Time

	*backends.Loss // Lost and Err
	w              *watcher
	stopLoop       chan struct{}
	loopDone       chan struct{}

	mu  sync.Mutex
	cur *coordinationv1.Lease // the latest state known, from our writes and the watch
}

// newLease starts consuming w, which follows the Lease from before cur,
// the answer to the acquiring update.
func newLease(b *Backend, identity string, token uint64, seconds int32, acquired time.Time, cur *coordinationv1.Lease, w *watcher) *lease {
	l := &lease{
		b: b, identity: identity, token: token, seconds: seconds, ttl: guaranteedTTL(seconds, b.retry), acquired: acquired,
		Loss: backends.NewLoss(), w: w, cur: cur,
		stopLoop: make(chan struct{}), loopDone: make(chan struct{}),
	}
	go l.loop()
	return l
}

func (l *lease) Token() uint64       { return l.token }
func (l *lease) TTL() time.Duration  { return l.ttl }
func (l *lease) Acquired() time.Time { return l.acquired }

// ours reports whether obj is a state of this grant: our holder, and our
// token recorded for the current count of transitions.
func (l *lease) ours(obj *coordinationv1.Lease) bool {
	return recordOf(obj).HolderIdentity == l.identity && holderToken(obj) == l.token
}

// lostTo says how obj shows that the Lease is no longer this grant's.
func (l *lease) lostTo(obj *coordinationv1.Lease) error {
	key := l.b.Key()
	if obj == nil {
		return fmt.Errorf("kubernetes: lease %s was deleted: %w", key, backends.ErrLeaseLost)
	}
	switch h := recordOf(obj).HolderIdentity; {
	case h == "":
		return fmt.Errorf("kubernetes: lease %s was released by someone else (holderIdentity cleared): %w", key, backends.ErrLeaseLost)
	case h != l.identity:
		return fmt.Errorf("kubernetes: lease %s was taken by %q: %w", key, h, backends.ErrLeaseLost)
	default:
		return fmt.Errorf("kubernetes: lease %s was granted again to %q, not by this candidacy (token %d): %w",
			key, h, l.token, backends.ErrLeaseLost)
	}
}

// loop follows the watch until the Lease is lost or the lease released.
func (l *lease) loop() {
	defer close(l.loopDone)
	for {
		select {
		case ch := <-l.w.changes:
			if err := l.apply(ch); err != nil {
				l.Set(err)
				return
			}
		case <-l.stopLoop:
			return
		}
	}
}

// apply takes in one change seen by the watch; an error if it shows the
// Lease lost. States older than what we know (the watch started before our
// own update) are skipped.
func (l *lease) apply(ch change) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ch.deleted {
		if !ch.gone && newer(l.cur, ch.obj) {
			return nil // a deletion before our grant: of the Lease we replaced
		}
		return l.lostTo(nil)
	}
	if !newer(ch.obj, l.cur) {
		return nil
	}
	if !l.ours(ch.obj) {
		return l.lostTo(ch.obj)
	}
	l.cur = ch.obj
	return nil
}

// snapshot is a copy of the latest state, to change and send.
func (l *lease) snapshot() *coordinationv1.Lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cur.DeepCopy()
}

// advance records a state of the Lease that one of our writes returned,
// or a fresh read found ours.
func (l *lease) advance(obj *coordinationv1.Lease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if newer(obj, l.cur) {
		l.cur = obj
	}
}

// notOurs says that the Lease is no longer this grant's, and why (an
// error wrapping backends.ErrLeaseLost).
type notOurs struct{ reason error }

func (e *notOurs) Error() string { return e.reason.Error() }
func (e *notOurs) Unwrap() error { return e.reason }

// lossOf is the reason of a notOurs in err's chain, nil if there is none.
func lossOf(err error) error {
	var no *notOurs
	if errors.As(err, &no) {
		return no.reason
	}
	return nil
}

// update writes edit(state) conditional on the latest state, and on a
// conflict reads the Lease again and retries if it is still ours. It
// returns a notOurs if the Lease is deleted or no longer ours, without
// writing.
func (l *lease) update(ctx context.Context, edit func(*coordinationv1.Lease)) error {
	obj := l.snapshot()
	resent := false
	for attempt := 1; ; attempt++ {
		if !l.ours(obj) {
			return &notOurs{l.lostTo(obj)}
		}
		edit(obj)
		got, err := l.b.client.updateLease(ctx, obj)
		if err != nil && !resent && connectionClosed(err) && ctx.Err() == nil {
			// The connection was closed under the request: client-go
			// closes every connection when an exec plugin's client
			// certificate rotates, the request that brought the
			// rotation about included, and a server may close an idle
			// connection as a request goes out. The update is
			// conditional, so sending it once more is safe: had the
			// first one been applied, this one conflicts, and the
			// conflict is handled below.
			resent = true
			got, err = l.b.client.updateLease(ctx, obj)
		}
		switch {
		case err == nil:
			l.advance(got)
			return nil
		case isNotFound(err):
			return &notOurs{l.lostTo(nil)}
		case !isConflict(err) || attempt == maxAttempts:
			return err
		}
		fresh, err := l.b.get(ctx)
		switch {
		case err != nil:
			return err
		case fresh == nil:
			return &notOurs{l.lostTo(nil)}
		}
		l.advance(fresh)
		obj = fresh.DeepCopy()
	}
}

// connectionClosed reports whether err is a connection closed under a
// request, before any answer came.
func connectionClosed(err error) bool {
	return errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// failed turns an error of update into what the caller returns: a loss
// closes Lost and wraps ErrLeaseLost; anything else names the server.
func (l *lease) failed(op string, err error) error {
	if reason := lossOf(err); reason != nil {
		l.Set(reason)
		return l.Err()
	}
	return fmt.Errorf("kubernetes at %s: %s lease %s: %w", l.b.client.host, op, l.b.Key(), err)
}

// Renew implements backends.Lease with one update of renewTime,
// conditional on the latest version known; a conflict that shows the
// Lease deleted or taken is a loss.
func (l *lease) Renew(ctx context.Context) error {
	if err := l.Err(); err != nil {
		return err
	}
	at, err := l.renewStamp(ctx)
	if err != nil {
		return err
	}
	err = l.update(ctx, func(obj *coordinationv1.Lease) {
		rec := recordOf(obj)
		rec.RenewTime = stamp(at)
		rec.LeaseDurationSeconds = l.seconds
		setRecord(obj, rec)
	})
	if err != nil {
		return l.failed("renew", err)
	}
	return nil
}

// renewStamp is the renewTime of the next renewal: now, unless renewals
// are meant to be a second or more apart and now is still in the whole
// second of the renewTime last written, which a client-go elector could
// not tell from it. Then it waits for the next second (with a retry period
// of 1s or more, no longer than the moment between the runner's send time
// and this call; a wall clock stepped back may make it longer, never a
// second) and returns that. The runner's send time is earlier still, so
// its deadline only gets earlier than the store's view (S2).
func (l *lease) renewStamp(ctx context.Context) (time.Time, error) {
	now := time.Now()
	if l.b.retry < time.Second {
		return now, nil // Lease.TTL accounts for the renewals client-go misses
	}
	l.mu.Lock()
	prev := time.Time{}
	if us := recordOf(l.cur).RenewTime; us != 0 {
		prev = time.UnixMicro(us)
	}
	l.mu.Unlock()
	wait := sameSecondWait(prev, now)
	if wait <= 0 {
		return now, nil
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return time.Now(), nil
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	}
}

// sameSecondWait is how long from now until the whole second after prev's
// begins, if now is in the same whole second as prev; otherwise 0. Whole
// seconds are those of the record's RFC 3339 form, which cuts the
// fraction off.
func sameSecondWait(prev, now time.Time) time.Duration {
	if prev.IsZero() || now.Unix() != prev.Unix() {
		return 0
	}
	return time.Unix(prev.Unix()+1, 0).Sub(now)
}

// Completed implements backends.Backend from a fresh read of the Lease.
func (b *Backend) Completed(ctx context.Context, key string) (*backends.Marker, error) {
	obj, err := b.get(ctx)
	if err != nil {
		return nil, fmt.Errorf("kubernetes at %s: read completion markers of lease %s: %w", b.client.host, b.Key(), err)
	}
	if obj == nil {
		return nil, nil
	}
	for _, m := range markers(obj, time.Now()) {
		if m.Key == key {
			return &m, nil
		}
	}
	return nil, nil
}

// Complete implements backends.Lease: the marker goes into the
// leaderrun/markers annotation in an update conditional on a version of
// the Lease that this grant holds.
func (l *lease) Complete(ctx context.Context, m backends.Marker) error {
	if err := l.Err(); err != nil {
		return err
	}
	err := l.update(ctx, func(obj *coordinationv1.Lease) { setMarker(obj, m, time.Now()) })
	if err != nil {
		return l.failed("record completion marker "+m.Key+" on", err)
	}
	return nil
}

// Release implements backends.Lease. It stops the watch first (our own
// release would read as a loss), then, if the Lease is still ours, frees
// it as client-go's ReleaseOnCancel does and appends term to the history in
// the same update. If the Lease was lost, it appends term without touching
// the record, which is someone else's now, retrying on conflicts; if the
// Lease was deleted, it creates a free one to hold the term.
func (l *lease) Release(ctx context.Context, term *backends.Term) error {
	if !l.BeginRelease() {
		return nil
	}
	close(l.stopLoop)
	<-l.loopDone
	l.w.stop()

	if l.Err() == nil {
		err := l.free(ctx, term)
		if err == nil || lossOf(err) == nil {
			return err
		}
	}
	if term == nil {
		return nil
	}
	return l.record(ctx, *term)
}

// free gives the Lease up, with term in its history. If the apiserver
// refuses the history (too large), it gives it up without it: a term that
// cannot be recorded must not keep the lock.
func (l *lease) free(ctx context.Context, term *backends.Term) error {
	edit := func(obj *coordinationv1.Lease) {
		setRecord(obj, released(recordOf(obj), time.Now()))
		if term != nil {
			appendTerm(obj, *term)
		}
	}
	err := l.update(ctx, edit)
	if code := codeOf(err); term != nil && (code == http.StatusUnprocessableEntity || code == http.StatusRequestEntityTooLarge) {
		refused := err
		term = nil
		if err = l.update(ctx, edit); err == nil {
			return fmt.Errorf("kubernetes at %s: lease %s released, but its history was refused: %w", l.b.client.host, l.b.Key(), refused)
		}
	}
	if err != nil && lossOf(err) == nil {
		return fmt.Errorf("kubernetes at %s: release lease %s: %w", l.b.client.host, l.b.Key(), err)
	}
	return err
}

// record appends term to the history of a Lease that is not ours any
// more, leaving its record alone.
func (l *lease) record(ctx context.Context, term backends.Term) error {
	var err error
	for attempt := 0; attempt < 2*maxAttempts; attempt++ {
		var obj *coordinationv1.Lease
		if obj, err = l.b.get(ctx); err != nil {
			break
		}
		if obj == nil {
			now := stamp(time.Now())
			obj = newLeaseObject(l.b.namespace, l.b.lock)
			setRecord(obj, record{LeaseDurationSeconds: 1, AcquireTime: now, RenewTime: now})
			appendTerm(obj, term)
			if _, err = l.b.client.createLease(ctx, obj); !isConflict(err) {
				break
			}
			continue
		}
		appendTerm(obj, term)
		if _, err = l.b.client.updateLease(ctx, obj); !isConflict(err) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("kubernetes at %s: record term %d in the history of lease %s: %w", l.b.client.host, term.Token, l.b.Key(), err)
	}
	return nil
}

// Key is where the Lease lives: namespace/leases/name.
func (l *lease) Key() string { return l.b.Key() }
