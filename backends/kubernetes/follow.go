package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/leaderrun/leaderrun/backends"
)

// change is one state of the Lease seen by a watch, in the order of the
// writes.
type change struct {
	deleted bool                  // the Lease was deleted; obj is its last state
	obj     *coordinationv1.Lease // the new state
	// gone: a read found no Lease. The deletion's own version is not
	// known, so this is news whatever the consumer knows: no Lease now.
	gone bool
}

// watcher follows one Lease with client-go watches, from a known version
// on, and delivers every change on changes. It opens the next watch when
// one ends (the apiserver's timeout, a broken connection), from the last
// version it saw; when that version is too old for the apiserver's window
// (410 Gone) it reads the Lease again and goes on from there. It does not
// judge the changes: the candidate and the lease do.
type watcher struct {
	c *client

	changes chan change
	// broken carries a watch that failed as no apiserver's does (an
	// event too large or not decodable); the watcher goes on trying. A
	// candidate gives up on it, a holder relies on its renewals.
	broken chan error
	opened chan error // the outcome of the first watch request, then closed
	cancel context.CancelFunc
	done   chan struct{} // closed when the watcher stopped
	// refused is the apiserver's refusal of the first watch request (RBAC
	// denies watch), after which the watcher stops; read it once done is
	// closed.
	refused error
}

// startWatch follows the Lease from its state from (nil: it does not
// exist, or its state is not known).
func startWatch(c *client, from *coordinationv1.Lease) *watcher {
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{
		c:       c,
		changes: make(chan change),
		broken:  make(chan error, 1),
		opened:  make(chan error, 1),
		cancel:  cancel,
		done:    make(chan struct{}),
	}
	go w.run(ctx, from)
	return w
}

// ready waits until the first watch request was answered: nil once the
// watch is open, the apiserver's refusal (RBAC denies watch), or ctx's
// error.
func (w *watcher) ready(ctx context.Context) error {
	select {
	case err, ok := <-w.opened:
		if !ok {
			return nil
		}
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stop ends the watch and waits for its goroutine.
func (w *watcher) stop() {
	w.cancel()
	<-w.done
}

func (w *watcher) run(ctx context.Context, last *coordinationv1.Lease) {
	defer close(w.done)
	first := true
	var retry backends.Backoff
	for ctx.Err() == nil {
		rv := ""
		if last != nil {
			rv = last.ResourceVersion
		}
		wi, err := w.c.watchLease(ctx, rv)
		if first {
			first = false
			w.opened <- err
			close(w.opened)
			if err != nil && isRefusal(err) {
				w.refused = err
				return
			}
		}
		switch {
		case apierrors.IsResourceExpired(err) || apierrors.IsGone(err):
			last, err = w.resync(ctx, last)
		case err == nil:
			opened := time.Now()
			last, err = w.follow(ctx, wi, last)
			// A watch that ran its course is followed by the next one at
			// once; one that something cut short at once (a proxy that
			// closes streams) by the backoff, so as not to spin.
			switch {
			case time.Since(opened) >= time.Second:
				retry.Reset()
			case err == nil:
				err = errShortWatch
			}
		}
		if errors.Is(err, errExpired) {
			last, err = w.resync(ctx, last)
		}
		if errors.Is(err, errProtocol) {
			select {
			case w.broken <- err:
			default:
			}
		}
		if err != nil && ctx.Err() == nil {
			if retry.Sleep(ctx) != nil {
				return
			}
		}
	}
}

// errExpired: the version a watch started from is older than the
// apiserver's window of past events.
var errExpired = errors.New("kubernetes: watch expired")

// errShortWatch: a watch ended within a second of its start.
var errShortWatch = errors.New("kubernetes: watch ended at once")

// follow reads the events of one watch until it ends, delivering each
// change, and returns the last state seen. A watch that ends without an
// error is the apiserver's timeout (or a connection that broke, which
// client-go does not tell apart): the caller opens the next one.
func (w *watcher) follow(ctx context.Context, wi watch.Interface, last *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	defer wi.Stop()
	for {
		var ev watch.Event
		var ok bool
		select {
		case ev, ok = <-wi.ResultChan():
		case <-ctx.Done():
			return last, ctx.Err()
		}
		if !ok {
			return last, nil
		}
		switch ev.Type {
		case watch.Added, watch.Modified, watch.Deleted:
			obj, isLease := ev.Object.(*coordinationv1.Lease)
			if !isLease {
				return last, fmt.Errorf("%w: watch of lease %s/%s sent a %T", errProtocol, w.c.namespace, w.c.name, ev.Object)
			}
			if obj.Name != w.c.name {
				continue
			}
			// A state no newer than the last one is a watch that started
			// again from before it (after a resync): not a change. A
			// deletion carries the revision of the delete, but is never
			// skipped: a repeated one does no harm.
			if ev.Type != watch.Deleted && !newer(obj, last) {
				continue
			}
			last = obj
			if !w.deliver(ctx, change{deleted: ev.Type == watch.Deleted, obj: obj}) {
				return last, ctx.Err()
			}
		case watch.Bookmark:
			// Only metadata.resourceVersion is set: where to start from
			// next, with nothing changed.
			if obj, isLease := ev.Object.(*coordinationv1.Lease); isLease && obj.ResourceVersion != "" && last != nil {
				next := last.DeepCopy()
				next.ResourceVersion = obj.ResourceVersion
				last = next
			}
		case watch.Error:
			return last, w.watchError(ev.Object)
		}
	}
}

// watchError reads an ERROR event: the apiserver's Status, or client-go's
// own when it could not decode the stream (ClientWatchDecoding: an event
// too large or not JSON).
func (w *watcher) watchError(obj any) error {
	st, ok := obj.(*metav1.Status)
	if !ok {
		return fmt.Errorf("%w: watch of lease %s/%s sent an error of type %T", errProtocol, w.c.namespace, w.c.name, obj)
	}
	err := &apierrors.StatusError{ErrStatus: *st}
	if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
		return errExpired
	}
	if st.Details != nil {
		for _, cause := range st.Details.Causes {
			if cause.Type == "ClientWatchDecoding" {
				return fmt.Errorf("watch lease %s/%s: %w: %s", w.c.namespace, w.c.name, errProtocol, st.Message)
			}
		}
	}
	return fmt.Errorf("watch lease %s/%s: %w", w.c.namespace, w.c.name, err)
}

// resync reads the Lease when the watch cannot go on from the last
// version, delivers its state if it changed, and returns where the next
// watch starts from.
func (w *watcher) resync(ctx context.Context, last *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	obj, err := w.c.getLease(ctx)
	switch {
	case isNotFound(err):
		if last != nil && !w.deliver(ctx, change{deleted: true, obj: last, gone: true}) {
			return last, ctx.Err()
		}
		return nil, nil
	case err != nil:
		return last, err
	}
	if newer(obj, last) {
		if !w.deliver(ctx, change{obj: obj}) {
			return last, ctx.Err()
		}
		return obj, nil
	}
	return last, nil
}

// deliver hands a change to the consumer; false if the watch was stopped
// first.
func (w *watcher) deliver(ctx context.Context, ch change) bool {
	select {
	case w.changes <- ch:
		return true
	case <-ctx.Done():
		return false
	}
}
