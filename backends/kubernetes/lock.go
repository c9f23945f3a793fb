package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/leaderrun/leaderrun/backends"
)

// lock is one Lease, a backends.RecordLock. A Record's Handle is the
// Lease as read or written: the next conditional write starts from it.
type lock struct {
	s    *Store
	name string

	last atomic.Pointer[coordinationv1.Lease] // what the last read found: where a waiter's watch starts
	w    atomic.Pointer[watcher]              // the follower whose news Get takes
}

// Key implements backends.Lock: namespace/leases/name.
func (l *lock) Key() string { return l.s.client.namespace + "/leases/" + l.name }

// fail wraps an error of op: ErrUnavailable, and ErrRefused unless asking
// again may help (transient). It names the server, never a credential.
func (l *lock) fail(op string, err error) error {
	if transient(err) {
		return fmt.Errorf("kubernetes at %s: %s lease %s: %w: %w", l.s.client.host, op, l.Key(), backends.ErrUnavailable, err)
	}
	return fmt.Errorf("kubernetes at %s: %s lease %s: %w: %w: %w", l.s.client.host, op, l.Key(), backends.ErrUnavailable, backends.ErrRefused, err)
}

// written is fail for a conditional write: ErrConflict if the Lease
// changed or went away since it was read.
func (l *lock) written(op string, err error) error {
	switch {
	case err == nil:
		return nil
	case isConflict(err), op == "update" && isNotFound(err):
		if w := l.w.Load(); w != nil {
			w.invalidate()
		}
		return fmt.Errorf("kubernetes: %s lease %s: %w", op, l.Key(), backends.ErrConflict)
	}
	return l.fail(op, err)
}

// Get implements backends.RecordLock. While the lock is followed, it is
// the newest state the watch delivered, and costs no request: the watch
// misses no write, and a state that is behind costs one conditional write
// that conflicts, after which the Lease is read again.
func (l *lock) Get(ctx context.Context) (backends.Record, error) {
	w := l.w.Load()
	if w != nil {
		if o, ok, err := w.state(); err != nil {
			return recordOf(nil), l.fail("watch", err)
		} else if ok {
			return recordOf(o), nil
		}
	}
	o, err := l.read(ctx)
	if w != nil && err == nil {
		w.see(o, o == nil, true)
	}
	return recordOf(o), err
}

// read reads the Lease (nil: there is none).
func (l *lock) read(ctx context.Context) (*coordinationv1.Lease, error) {
	o, err := l.s.client.get(ctx, l.name)
	switch {
	case isNotFound(err):
		o = nil
	case err != nil:
		return nil, l.fail("get", err)
	}
	l.last.Store(o)
	return o, nil
}

// granted is the record of o, a grant renewed every retry, with the TTL
// it may count on.
func granted(o *coordinationv1.Lease, retry time.Duration) backends.Record {
	rec := recordOf(o)
	rec.TTL = guaranteedTTL(int32(rec.TTL/time.Second), retry)
	return rec
}

// Take implements backends.RecordLock: one update of the Lease as read,
// conditional on its version, that names c's identity, counts a transition
// and records the grant. A candidate that found no Lease creates a free
// one first (see the package doc on the token).
func (l *lock) Take(ctx context.Context, prev backends.Record, c backends.Claim) (backends.Record, error) {
	o, _ := prev.Handle.(*coordinationv1.Lease)
	if o == nil {
		created, err := l.s.client.create(ctx, freeLease(l.s.client.namespace, l.name, time.Now()))
		if err != nil {
			return backends.Record{}, l.written("create", err)
		}
		o = created
	}
	rv, err := revision(o)
	if err != nil {
		return backends.Record{}, l.fail("update", err)
	}
	g := grant{Token: rv + 1, Holder: c.Identity, Transitions: deref(o.Spec.LeaseTransitions) + 1, Owner: c.Owner}
	if last, ok := lastGrant(o); ok && last.Token >= g.Token {
		g.Token = last.Token + 1
	}
	if c.Holders > 1 {
		g.Holders = c.Holders
	}
	next, now := o.DeepCopy(), time.Now()
	setRecord(next, c.Identity, leaseSeconds(c.Timings.LeaseDuration), now, now, g.Transitions)
	data, _ := json.Marshal(g) // strings and numbers
	setAnnotation(next, annotationToken, string(data))
	got, err := l.s.client.update(ctx, next)
	if err != nil {
		return backends.Record{}, l.written("update", err)
	}
	return granted(got, c.Timings.RetryPeriod), nil
}

// Keep implements backends.RecordLock with one update of renewTime,
// conditional on the version known. A grant whose TTL is all of
// leaseDurationSeconds is renewed a second or more apart (see Take).
func (l *lock) Keep(ctx context.Context, held backends.Record) (backends.Record, error) {
	retry := time.Duration(0)
	if o, _ := held.Handle.(*coordinationv1.Lease); o != nil && held.TTL >= recordOf(o).TTL {
		retry = time.Second
	}
	at, err := renewStamp(ctx, retry, held.Renewed)
	if err != nil {
		return held, err
	}
	got, err := l.rewrite(ctx, held, func(o *coordinationv1.Lease) { o.Spec.RenewTime = new(metav1.NewMicroTime(at)) })
	if err != nil {
		return held, err
	}
	return granted(got, retry), nil
}

// Free implements backends.RecordLock: the Lease released as client-go's
// ReleaseOnCancel writes it, if it is still held's. The grant's annotation
// stays, proof of the last token.
func (l *lock) Free(ctx context.Context, held backends.Record) error {
	_, err := l.rewrite(ctx, held, func(o *coordinationv1.Lease) { release(o, time.Now()) })
	if errors.Is(err, backends.ErrLeaseLost) {
		return nil
	}
	return err
}

// maxAttempts bounds the conflicts one rewrite retries: each is a write by
// someone else that did not take the Lease (a label, a document): rare.
const maxAttempts = 5

// rewrite writes edit(the Lease), conditional on the state of held known,
// and after a conflict on the state read again, while it is still held's;
// once it is not, it writes nothing and says why (ErrLeaseLost).
//
// An update whose connection was closed under it is sent once more:
// client-go closes every connection when an exec plugin's client
// certificate rotates, the request that brought the rotation about
// included, and a server may close an idle connection as a request goes
// out. Had the first been applied, the second conflicts, and the Lease
// read again is still held's.
func (l *lock) rewrite(ctx context.Context, held backends.Record, edit func(*coordinationv1.Lease)) (*coordinationv1.Lease, error) {
	o, _ := held.Handle.(*coordinationv1.Lease)
	resent := false
	for attempt := 1; ; attempt++ {
		if err := l.lostTo(o, held); err != nil {
			return nil, err
		}
		next := o.DeepCopy()
		edit(next)
		got, err := l.s.client.update(ctx, next)
		if err != nil && !resent && connectionClosed(err) && ctx.Err() == nil {
			resent = true
			got, err = l.s.client.update(ctx, next)
		}
		switch {
		case err == nil:
			return got, nil
		case isNotFound(err):
			o = nil
			continue
		case !isConflict(err) || attempt == maxAttempts:
			return nil, l.fail("update", err)
		}
		if o, err = l.read(ctx); err != nil {
			return nil, err
		}
	}
}

// lostTo says how o (nil: no Lease) shows that held no longer holds the
// Lease, wrapping ErrLeaseLost; nil while it does.
func (l *lock) lostTo(o *coordinationv1.Lease, held backends.Record) error {
	rec := recordOf(o)
	how := fmt.Sprintf("was taken by %q", rec.Holder)
	switch {
	case o == nil:
		how = "was deleted"
	case rec.Holder == held.Holder && rec.Token == held.Token && rec.Owner == held.Owner:
		return nil
	case rec.Holder == "":
		how = "was released by someone else (holderIdentity cleared)"
	case rec.Holder == held.Holder:
		how += fmt.Sprintf(" in another grant than this candidacy's (token %d)", held.Token)
	}
	return fmt.Errorf("kubernetes: lease %s %s: %w", l.Key(), how, backends.ErrLeaseLost)
}

// renewStamp is the renewTime of the next renewal: now, unless renewals
// are meant to be a second or more apart and now is still in the whole
// second of prev, the renewTime last written, which a client-go elector
// could not tell from it. Then it waits for the next second (with a retry
// period of 1s or more, no longer than the moment between the runner's
// send time and this call; a wall clock stepped back may make it longer,
// never a second) and returns that. The runner's send time is earlier
// still, so its deadline only gets earlier than the store's view (S2).
func renewStamp(ctx context.Context, retry time.Duration, prev time.Time) (time.Time, error) {
	now := time.Now()
	wait := sameSecondWait(prev, now)
	if retry < time.Second || wait <= 0 {
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
// begins, if now is in the same whole second as prev (of the record's RFC
// 3339 form, which cuts the fraction off); otherwise 0.
func sameSecondWait(prev, now time.Time) time.Duration {
	if prev.IsZero() || now.Unix() != prev.Unix() {
		return 0
	}
	return time.Unix(prev.Unix()+1, 0).Sub(now)
}

// ReadDoc implements backends.Lock: the annotation leaderrun/<name>, and
// the Lease as read for its version (nil: there is no Lease).
func (l *lock) ReadDoc(ctx context.Context, name string) (backends.Doc, error) {
	d := backends.Doc{Name: name}
	o, err := l.read(ctx)
	if err != nil || o == nil {
		return d, err
	}
	v, ok := o.Annotations[annotationDoc+name]
	if len(v) > backends.MaxDoc {
		return d, fmt.Errorf("kubernetes: annotation %s%s of lease %s is %d bytes, more than the %d of a document: %w: %w",
			annotationDoc, name, l.Key(), len(v), backends.MaxDoc, backends.ErrUnavailable, backends.ErrRefused)
	}
	if d.Version = o; ok {
		d.Data = []byte(v)
	}
	return d, nil
}

// WriteDoc implements backends.Lock: an update of the annotation alone,
// conditional on the Lease as read; where there was none, a free Lease
// created with it.
func (l *lock) WriteDoc(ctx context.Context, d backends.Doc) error {
	if o, _ := d.Version.(*coordinationv1.Lease); o != nil {
		return l.writeDoc(ctx, d, o)
	}
	o := freeLease(l.s.client.namespace, l.name, time.Now())
	setAnnotation(o, annotationDoc+d.Name, string(d.Data))
	_, err := l.s.client.create(ctx, o)
	return l.written("create", err)
}

// WriteDocHeld implements backends.RecordLock: WriteDoc, if the Lease as
// read is still held's.
func (l *lock) WriteDocHeld(ctx context.Context, d backends.Doc, held backends.Record) error {
	o, _ := d.Version.(*coordinationv1.Lease)
	if err := l.lostTo(o, held); err != nil {
		return err
	}
	return l.writeDoc(ctx, d, o)
}

func (l *lock) writeDoc(ctx context.Context, d backends.Doc, o *coordinationv1.Lease) error {
	next := o.DeepCopy()
	setAnnotation(next, annotationDoc+d.Name, string(d.Data))
	_, err := l.s.client.update(ctx, next)
	return l.written("update", err)
}

// Follow implements backends.RecordLock with one watch of the Lease, from
// the state last known: the grant for a holder, the last read for a
// waiter. It waits for the watch's first answer, so that a watch that
// RBAC forbids is refused before a grant is handed out. Every watcher of
// an object gets every event of it: every waiter is woken by every change
// (docs/backends/kubernetes.md has the figures).
func (l *lock) Follow(ctx context.Context, _ backends.Claim, held *backends.Record) (backends.Follower, error) {
	from := l.last.Load()
	if held != nil {
		from, _ = held.Handle.(*coordinationv1.Lease)
	}
	w := startWatch(l, from)
	if err := w.ready(ctx); err != nil {
		w.Close()
		return nil, l.fail("watch", err)
	}
	l.w.Store(w)
	return w, nil
}
