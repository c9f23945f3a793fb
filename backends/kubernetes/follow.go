package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/leaderrun/leaderrun/backends"
)

// Follow implements backends.RecordLock with one watch of the Lease, from
// the state last known, whose newest state Get then takes. It waits for
// the watch's first answer, so that a watch RBAC forbids is refused before
// a grant is handed out. Every change wakes every waiter
// (docs/backends/kubernetes.md says why).
func (l *lock) Follow(ctx context.Context, _ backends.Claim, held *backends.Record) (backends.Follower, error) {
	l.mu.Lock()
	if held != nil {
		l.cur, _ = held.Handle.(*coordinationv1.Lease)
	}
	rv := ""
	if l.cur != nil {
		rv = l.cur.ResourceVersion
	}
	l.mu.Unlock()
	wctx, cancel := context.WithCancel(context.Background())
	w := &watcher{Wake: backends.NewWake(), l: l, opened: make(chan error, 1), cancel: cancel, done: make(chan struct{})}
	go w.run(wctx, rv)
	select {
	case err := <-w.opened:
		if refused(err) {
			w.Close()
			return nil, l.fail("watch", err)
		}
	case <-ctx.Done():
	}
	l.mu.Lock()
	l.w, l.stale, l.broken = w, false, nil
	l.mu.Unlock()
	return w, nil
}

func refused(err error) bool { return err != nil && !transient(err) && !isExpired(err) }

// see takes in a state of the Lease that the watch saw (nil: deleted),
// or what broke the watch for good (Get returns it: a waiter gives up, a
// holder's renewals are its proof), and pokes if it is news.
func (l *lock) see(w *watcher, o *coordinationv1.Lease, broken error) {
	l.mu.Lock()
	news := broken != nil || o == nil || l.cur == nil || newer(o, l.cur)
	if broken != nil {
		l.broken = broken
	} else if news {
		l.cur = o
	}
	l.mu.Unlock()
	if news {
		w.Poke()
	}
}

// newer reports whether o is a later state of the Lease than old, or
// cannot be compared.
func newer(o, old *coordinationv1.Lease) bool {
	a, errA := revision(o)
	b, errB := revision(old)
	return errA != nil || errB != nil || a > b
}

// watcher follows one Lease with client-go watches, each from the last
// version seen, or from a new read if that is too old (410 Gone).
type watcher struct {
	backends.Wake
	l      *lock
	opened chan error // the outcome of the first watch request
	cancel context.CancelFunc
	done   chan struct{}
}

// Behind implements backends.Follower: an apiserver keeps no queue.
func (w *watcher) Behind() bool { return false }

func (w *watcher) Close() {
	w.cancel()
	<-w.done
	w.l.mu.Lock()
	defer w.l.mu.Unlock()
	if w.l.w == w {
		w.l.w = nil
	}
}

// run opens watch after watch until Close.
func (w *watcher) run(ctx context.Context, rv string) {
	defer close(w.done)
	start := wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.5, Steps: 64, Cap: 5 * time.Second}
	backoff := start
	for first := true; ctx.Err() == nil; first = false {
		wi, err := w.l.s.watch(ctx, w.l.name, rv)
		if first {
			if w.opened <- err; refused(err) {
				return
			}
		}
		if err == nil {
			opened := time.Now()
			rv, err = w.follow(ctx, wi, rv)
			// A watch that ran its course is followed by the next one at
			// once; one cut short at once (a proxy that closes streams)
			// by the backoff, so as not to spin.
			switch {
			case time.Since(opened) >= time.Second:
				backoff = start
			case err == nil:
				err = errors.New("kubernetes: watch ended at once")
			}
		}
		if isExpired(err) {
			rv, err = w.resync(ctx)
		}
		if errors.Is(err, errProtocol) {
			w.l.see(w, nil, err)
		}
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(backoff.Step()):
			}
		}
	}
}

// follow reads the events of one watch until it ends (the apiserver's
// timeout, or a broken connection: client-go does not tell them apart),
// and returns the version to go on from.
func (w *watcher) follow(ctx context.Context, wi watch.Interface, rv string) (string, error) {
	defer wi.Stop()
	for {
		var ev watch.Event
		var ok bool
		select {
		case ev, ok = <-wi.ResultChan():
		case <-ctx.Done():
			return rv, ctx.Err()
		}
		if !ok {
			return rv, nil
		}
		if ev.Type == watch.Error {
			return rv, w.watchError(ev.Object)
		}
		o, isLease := ev.Object.(*coordinationv1.Lease)
		if !isLease {
			return rv, fmt.Errorf("%w: watch of lease %s sent a %T", errProtocol, w.l.Key(), ev.Object)
		}
		if o.ResourceVersion != "" {
			rv = o.ResourceVersion // all a bookmark says: where to go on from
		}
		switch {
		case ev.Type == watch.Bookmark, o.Name != w.l.name:
		case ev.Type == watch.Deleted:
			w.l.see(w, nil, nil)
		default:
			w.l.see(w, o, nil)
		}
	}
}

// watchError reads an ERROR event: the apiserver's Status, or client-go's
// own when it could not decode the stream (ClientWatchDecoding: an event
// too large or not JSON).
func (w *watcher) watchError(o any) error {
	st, ok := o.(*metav1.Status)
	switch {
	case !ok:
		return fmt.Errorf("%w: watch of lease %s sent an error of type %T", errProtocol, w.l.Key(), o)
	case st.Details != nil && slices.ContainsFunc(st.Details.Causes,
		func(c metav1.StatusCause) bool { return c.Type == "ClientWatchDecoding" }):
		return fmt.Errorf("watch lease %s: %w: %s", w.l.Key(), errProtocol, st.Message)
	}
	return fmt.Errorf("watch lease %s: %w", w.l.Key(), &apierrors.StatusError{ErrStatus: *st})
}

// resync reads the Lease, and returns where the next watch starts from.
func (w *watcher) resync(ctx context.Context) (string, error) {
	o, err := w.l.read(ctx)
	if err != nil {
		return "", err
	}
	if w.Poke(); o == nil {
		return "", nil
	}
	return o.ResourceVersion, nil
}
