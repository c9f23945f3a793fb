package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
)

// watcher follows one Lease with client-go watches, from a known version
// on, keeps the newest state it saw, which Get takes without a request,
// and says on Changed when a newer one arrived. When a watch ends (the
// apiserver's timeout, a broken connection) it opens the next from the
// last version it saw, or from a new read if that is too old for the
// apiserver (410 Gone).
type watcher struct {
	l       *lock
	changed chan struct{}
	opened  chan error // the outcome of the first watch request
	cancel  context.CancelFunc
	done    chan struct{}

	mu     sync.Mutex
	cur    *coordinationv1.Lease // the newest state, or the last one (gone)
	gone   bool                  // the Lease was deleted
	stale  bool                  // a write found cur behind: Get reads the Lease
	broken error                 // an event no apiserver sends: Get returns it
}

// startWatch follows l's Lease from its state from (nil: it does not
// exist, or its state is not known).
func startWatch(l *lock, from *coordinationv1.Lease) *watcher {
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{l: l, changed: make(chan struct{}, 1), opened: make(chan error, 1), cancel: cancel,
		done: make(chan struct{}), cur: from, gone: from == nil}
	rv := ""
	if from != nil {
		rv = from.ResourceVersion
	}
	go w.run(ctx, rv)
	return w
}

// Changed implements backends.Follower.
func (w *watcher) Changed() <-chan struct{} { return w.changed }

// Behind implements backends.Follower: an apiserver keeps no queue.
func (w *watcher) Behind() bool { return false }

// Close implements backends.Follower.
func (w *watcher) Close() {
	w.cancel()
	<-w.done
	w.l.w.CompareAndSwap(w, nil)
}

// ready waits for the first watch request's answer: the apiserver's
// refusal (RBAC denies watch), or nil.
func (w *watcher) ready(ctx context.Context) error {
	select {
	case err := <-w.opened:
		if err != nil && !transient(err) && !isExpired(err) {
			return err
		}
	case <-ctx.Done():
	}
	return nil
}

// state is the newest state seen (nil: no Lease), unless a write found it
// behind, or the event that broke the watch: a waiter then gives up, a
// holder relies on its renewals.
func (w *watcher) state() (*coordinationv1.Lease, bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.gone {
		return nil, !w.stale, w.broken
	}
	return w.cur, !w.stale, w.broken
}

// see takes in a state of the Lease (gone: its deletion). One that was
// read replaces what the watch saw; one that the watch saw counts only if
// it is newer, and says Changed.
func (w *watcher) see(o *coordinationv1.Lease, gone, read bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !read && o != nil && w.cur != nil && !newer(o, w.cur) {
		return
	}
	w.cur, w.gone, w.stale = o, gone, w.stale && !read
	if !read {
		select {
		case w.changed <- struct{}{}:
		default:
		}
	}
}

// newer reports whether o is a later state of the Lease than old. States
// whose versions cannot be compared count as newer.
func newer(o, old *coordinationv1.Lease) bool {
	a, errA := revision(o)
	b, errB := revision(old)
	return errA != nil || errB != nil || a > b
}

// invalidate says that a write found the state behind.
func (w *watcher) invalidate() {
	w.mu.Lock()
	w.stale = true
	w.mu.Unlock()
}

// fail says that the watch broke for good.
func (w *watcher) fail(err error) {
	w.mu.Lock()
	w.broken = err
	w.mu.Unlock()
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// run opens watch after watch until Close.
func (w *watcher) run(ctx context.Context, rv string) {
	defer close(w.done)
	start := wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.5, Steps: 64, Cap: 5 * time.Second}
	backoff := start
	for first := true; ctx.Err() == nil; first = false {
		wi, err := w.l.s.client.watch(ctx, w.l.name, rv)
		if first {
			w.opened <- err
			if err != nil && !transient(err) && !isExpired(err) {
				return
			}
		}
		if err == nil {
			opened := time.Now()
			rv, err = w.follow(ctx, wi, rv)
			// A watch that ran its course is followed by the next one at
			// once; one that something cut short at once (a proxy that
			// closes streams) by the backoff, so as not to spin.
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
			w.fail(err)
		}
		if err != nil {
			t := time.NewTimer(backoff.Step())
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
	}
}

// follow reads the events of one watch until it ends, and returns the
// version to go on from. A watch that ends without an error is the
// apiserver's timeout (or a connection that broke, which client-go does
// not tell apart): the caller opens the next one.
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
		if ev.Type != watch.Bookmark && o.Name == w.l.name {
			w.see(o, ev.Type == watch.Deleted, false)
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

// resync reads the Lease when the watch cannot go on from the last
// version, and returns where the next watch starts from.
func (w *watcher) resync(ctx context.Context) (string, error) {
	o, err := w.l.s.client.get(ctx, w.l.name)
	switch {
	case isNotFound(err):
		w.see(nil, true, false)
		return "", nil
	case err != nil:
		return "", err
	}
	w.see(o, false, false)
	return o.ResourceVersion, nil
}
