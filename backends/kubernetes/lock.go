package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/leaderrun/leaderrun/backends"
)

// lock is one Lease, a backends.RecordLock. A Record's Handle is the
// Lease as read or written, which the next write is conditional on.
type lock struct {
	s    *Store
	name string

	mu     sync.Mutex
	cur    *coordinationv1.Lease // the newest state known (nil: none)
	w      *watcher              // keeps cur current while it follows
	stale  bool                  // a write found cur behind
	broken error                 // the watch's for good (see)
}

func (l *lock) Key() string { return l.s.namespace + "/leases/" + l.name }

// The annotations of a Lease that leaderrun writes (client-go's electors
// keep them): the last token's grant, and annotationDoc + a document.
const (
	annotationToken = "leaderrun/token"
	annotationDoc   = "leaderrun/"
)

// grant is the annotationToken. It is the holder's only while holder and
// count of transitions match: a client-go elector changes both, and so
// disowns it.
type grant struct {
	Token       uint64 `json:"token,string"`
	Holder      string `json:"holder"`
	Transitions int32  `json:"transitions"`
	Holders     int    `json:"holders,omitempty"`
	Owner       string `json:"owner,omitempty"`
}

func lastGrant(o *coordinationv1.Lease) (g grant) {
	_ = json.Unmarshal([]byte(o.Annotations[annotationToken]), &g)
	return g
}

// recordOf is the record of the Lease o (nil: none). A client-go
// elector's grant reads as Owner "" and Token 0.
func recordOf(o *coordinationv1.Lease) backends.Record {
	rec := backends.Record{Left: -1, Waiting: -1}
	if o == nil {
		return rec
	}
	s := o.Spec
	rec.Holder, rec.Version, rec.Handle = deref(s.HolderIdentity), o.ResourceVersion, o
	rec.TTL = time.Duration(deref(s.LeaseDurationSeconds)) * time.Second
	rec.Acquired, rec.Renewed = deref(s.AcquireTime).Time, deref(s.RenewTime).Time
	if g := lastGrant(o); rec.Holder != "" && g.Holder == rec.Holder && g.Transitions == deref(s.LeaseTransitions) {
		rec.Owner, rec.Token, rec.Holders = g.Owner, g.Token, g.Holders
	}
	return rec
}

// setRecord writes a record into o's spec as client-go's LeaseLock does.
func setRecord(o *coordinationv1.Lease, holder string, seconds int32, at time.Time, transitions int32) {
	s := &o.Spec
	s.HolderIdentity, s.LeaseDurationSeconds, s.LeaseTransitions = new(holder), new(seconds), new(transitions)
	s.AcquireTime, s.RenewTime = new(metav1.NewMicroTime(at)), new(metav1.NewMicroTime(at))
}

// release gives o up as client-go's ReleaseOnCancel does: no holder, a
// lease of one second (for electors older than the empty-holder rule).
func release(o *coordinationv1.Lease, now time.Time) {
	setRecord(o, "", 1, now, deref(o.Spec.LeaseTransitions))
}

func freeLease(namespace, name string, now time.Time) *coordinationv1.Lease {
	o := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
	release(o, now)
	return o
}

func deref[T any](p *T) (v T) {
	if p != nil {
		v = *p
	}
	return v
}

// fail wraps an error of op: ErrUnavailable, and ErrRefused unless asking
// again may help. It names no credential.
func (l *lock) fail(op string, err error) error {
	if transient(err) || l.s.syncing(op, l.name, err) {
		return fmt.Errorf("kubernetes at %s: %s lease %s: %w: %w", l.s.host, op, l.Key(), backends.ErrUnavailable, err)
	}
	return fmt.Errorf("kubernetes at %s: %s lease %s: %w: %w: %w", l.s.host, op, l.Key(), backends.ErrUnavailable, backends.ErrRefused, err)
}

// written is fail for a conditional write: ErrConflict if the Lease
// changed or went away since it was read. The next Get reads the Lease.
func (l *lock) written(op string, err error) error {
	if err == nil {
		return nil
	}
	l.mu.Lock()
	l.stale = true
	l.mu.Unlock()
	if isConflict(err) || op == "update" && isNotFound(err) {
		return fmt.Errorf("kubernetes: %s lease %s: %w", op, l.Key(), backends.ErrConflict)
	}
	return l.fail(op, err)
}

// Get implements backends.RecordLock. While the lock is followed, it is
// the newest state the watch delivered, at no request; a state behind
// costs one conditional write that conflicts, and a read.
func (l *lock) Get(ctx context.Context) (backends.Record, error) {
	l.mu.Lock()
	o, cached, broken := l.cur, l.w != nil && !l.stale, l.broken
	l.mu.Unlock()
	switch {
	case broken != nil:
		return recordOf(nil), l.fail("watch", broken)
	case cached:
		return recordOf(o), nil
	}
	o, err := l.read(ctx)
	return recordOf(o), err
}

func (l *lock) read(ctx context.Context) (*coordinationv1.Lease, error) {
	o, err := l.s.get(ctx, l.name)
	switch {
	case isNotFound(err):
		o = nil
	case err != nil:
		return nil, l.fail("get", err)
	}
	l.mu.Lock()
	l.cur, l.stale = o, false
	l.mu.Unlock()
	return o, nil
}

// granted is the record of the grant o, renewed every retry.
func granted(o *coordinationv1.Lease, retry time.Duration) backends.Record {
	rec := recordOf(o)
	rec.TTL = guaranteedTTL(int32(rec.TTL/time.Second), retry)
	return rec
}

// Take implements backends.RecordLock: an update of the Lease as read that
// names c's identity, counts a transition and records the grant. Where
// there is no Lease, a free one is created first, so that the token is
// drawn from a resourceVersion like any other.
func (l *lock) Take(ctx context.Context, prev backends.Record, c backends.Claim) (backends.Record, error) {
	o, _ := prev.Handle.(*coordinationv1.Lease)
	if o == nil {
		created, err := l.s.create(ctx, freeLease(l.s.namespace, l.name, time.Now()))
		if err != nil {
			return backends.Record{}, l.written("create", err)
		}
		o = created
	}
	rv, err := revision(o)
	if err != nil {
		return backends.Record{}, l.fail("update", err)
	}
	g := grant{Token: max(rv, lastGrant(o).Token) + 1, Holder: c.Identity, Transitions: deref(o.Spec.LeaseTransitions) + 1,
		Holders: c.Holders, Owner: c.Owner}
	next := o.DeepCopy()
	setRecord(next, c.Identity, leaseSeconds(c.Timings.LeaseDuration), time.Now(), g.Transitions)
	data, _ := json.Marshal(g) // strings and numbers
	metav1.SetMetaDataAnnotation(&next.ObjectMeta, annotationToken, string(data))
	got, err := l.s.update(ctx, next)
	if err != nil {
		return backends.Record{}, l.written("update", err)
	}
	return granted(got, c.Timings.RetryPeriod), nil
}

// Keep implements backends.RecordLock with an update of renewTime. A grant
// whose TTL is all of leaseDurationSeconds renews a second or more apart.
func (l *lock) Keep(ctx context.Context, held backends.Record) (backends.Record, error) {
	retry := time.Duration(0)
	if o, _ := held.Handle.(*coordinationv1.Lease); o != nil && held.TTL >= recordOf(o).TTL {
		retry = time.Second
	}
	// Renewals a second or more apart each land in a later whole second,
	// which client-go electors can tell apart (docs/backends/kubernetes.md,
	// "Whole seconds", says why the wait is safe: S2).
	at := time.Now()
	if wait := sameSecondWait(held.Renewed, at); retry >= time.Second && wait > 0 {
		select {
		case <-time.After(wait):
			at = time.Now()
		case <-ctx.Done():
			return held, ctx.Err()
		}
	}
	got, err := l.rewrite(ctx, held, func(o *coordinationv1.Lease) { o.Spec.RenewTime = new(metav1.NewMicroTime(at)) })
	if err != nil {
		return held, err
	}
	return granted(got, retry), nil
}

// Free implements backends.RecordLock: the Lease released, if it is still
// held's. The token annotation stays, proof of the last token.
func (l *lock) Free(ctx context.Context, held backends.Record) error {
	_, err := l.rewrite(ctx, held, func(o *coordinationv1.Lease) { release(o, time.Now()) })
	if errors.Is(err, backends.ErrLeaseLost) {
		return nil
	}
	return err
}

// rewrite writes edit(the Lease held holds), and after a conflict edit of
// the Lease read again, while it is still held's (else ErrLeaseLost). An
// update whose connection was closed under it (an exec plugin's
// certificate rotated) is sent once more: had the first been applied, the
// second conflicts.
func (l *lock) rewrite(ctx context.Context, held backends.Record, edit func(*coordinationv1.Lease)) (*coordinationv1.Lease, error) {
	o, _ := held.Handle.(*coordinationv1.Lease)
	resent := false
	for attempt := 1; ; attempt++ {
		if err := l.lostTo(o, held); err != nil {
			return nil, err
		}
		next := o.DeepCopy()
		edit(next)
		got, err := l.s.update(ctx, next)
		if err != nil && !resent && connectionClosed(err) && ctx.Err() == nil {
			resent = true
			got, err = l.s.update(ctx, next)
		}
		switch {
		case err == nil:
			return got, nil
		case isNotFound(err):
			o = nil
			continue
		case !isConflict(err) || attempt == 5: // others' writes (a label, a document) are rare
			return nil, l.fail("update", err)
		}
		if o, err = l.read(ctx); err != nil {
			return nil, err
		}
	}
}

// lostTo says how o (nil: none) shows the Lease lost to held, if it is.
func (l *lock) lostTo(o *coordinationv1.Lease, held backends.Record) error {
	rec := recordOf(o)
	switch {
	case o == nil:
		return fmt.Errorf("kubernetes: lease %s was deleted: %w", l.Key(), backends.ErrLeaseLost)
	case rec.Holder != held.Holder || rec.Token != held.Token || rec.Owner != held.Owner:
		return fmt.Errorf("kubernetes: lease %s was taken by %q with token %d: %w", l.Key(), rec.Holder, rec.Token, backends.ErrLeaseLost)
	}
	return nil
}

// sameSecondWait is how long from now until the whole second after prev's
// begins, if now is in prev's (the record's RFC 3339 form cuts the
// fraction off); otherwise 0.
func sameSecondWait(prev, now time.Time) time.Duration {
	if prev.IsZero() || now.Unix() != prev.Unix() {
		return 0
	}
	return time.Unix(prev.Unix()+1, 0).Sub(now)
}

// ReadDoc implements backends.Lock: the annotation leaderrun/<name>, with
// the Lease as read for version.
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
// or, where there was no Lease, a free Lease created with it.
func (l *lock) WriteDoc(ctx context.Context, d backends.Doc) (err error) {
	o, _ := d.Version.(*coordinationv1.Lease)
	op := "update"
	if o = o.DeepCopy(); o == nil {
		op, o = "create", freeLease(l.s.namespace, l.name, time.Now())
	}
	metav1.SetMetaDataAnnotation(&o.ObjectMeta, annotationDoc+d.Name, string(d.Data))
	if op == "create" {
		_, err = l.s.create(ctx, o)
	} else {
		_, err = l.s.update(ctx, o)
	}
	return l.written(op, err)
}

// WriteDocHeld implements backends.RecordLock: WriteDoc, if the Lease as
// read is still held's.
func (l *lock) WriteDocHeld(ctx context.Context, d backends.Doc, held backends.Record) error {
	o, _ := d.Version.(*coordinationv1.Lease)
	if err := l.lostTo(o, held); err != nil {
		return err
	}
	return l.WriteDoc(ctx, d)
}
