package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/leaderrun/leaderrun/backends"
)

// watchTimeoutSeconds asks the apiserver to end each watch after 5
// minutes (it would otherwise pick 30 to 60): the watcher opens the next
// one at once, so a watch that broke silently, where no HTTP/2 ping
// reaches, is replaced within that time. Renewals notice a broken link far
// sooner; this bounds how long a follower may miss a release.
const watchTimeoutSeconds = "300"

// change is one state of the Lease seen by a watch, in the order of the
// writes.
type change struct {
	deleted bool         // the Lease was deleted; obj is its last state
	obj     *leaseObject // the new state
	// gone: a read found no Lease. The deletion's own version is not
	// known, so this is news whatever the consumer knows: no Lease now.
	gone bool
}

// watcher follows one Lease with watch requests, from a known version on,
// and delivers every change on changes. It opens the next watch when one
// ends (the apiserver's timeout, a broken connection), from the last
// version it saw; when that version is too old for the apiserver's window
// (410 Gone) it reads the Lease again and goes on from there. It does not
// judge the changes: the candidate and the lease do.
type watcher struct {
	c         *client
	namespace string
	name      string

	changes chan change
	opened  chan error // the outcome of the first watch request, then closed
	cancel  context.CancelFunc
	done    chan struct{} // closed when the watcher stopped
	// refused is the apiserver's refusal of the first watch request (RBAC
	// denies watch), after which the watcher stops; read it once done is
	// closed.
	refused error
}

// startWatch follows the Lease from its state from (nil: it does not
// exist, or its state is not known).
func startWatch(c *client, namespace, name string, from *leaseObject) *watcher {
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{
		c: c, namespace: namespace, name: name,
		changes: make(chan change),
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

func (w *watcher) run(ctx context.Context, last *leaseObject) {
	defer close(w.done)
	first := true
	var retry backends.Backoff
	for ctx.Err() == nil {
		rv := ""
		if last != nil {
			rv = last.resourceVersion
		}
		body, err := w.open(ctx, rv)
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
		case codeOf(err) == http.StatusGone:
			last, err = w.resync(ctx, last)
		case err == nil:
			opened := time.Now()
			last, err = w.follow(ctx, body, last)
			body.Close()
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

// open sends a watch request for the Lease from version rv ("" from its
// current state, which the apiserver sends first as ADDED).
func (w *watcher) open(ctx context.Context, rv string) (io.ReadCloser, error) {
	q := url.Values{
		"watch":               {"true"},
		"fieldSelector":       {"metadata.name=" + w.name},
		"allowWatchBookmarks": {"true"},
		"timeoutSeconds":      {watchTimeoutSeconds},
	}
	if rv != "" {
		q.Set("resourceVersion", rv)
	}
	resp, err := w.c.send(ctx, http.MethodGet, w.c.leasesPath(w.namespace), q, nil)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		data, _ := io.ReadAll(io.LimitReader(resp.Body, maxBody))
		return nil, statusOf(resp.StatusCode, data)
	}
	return resp.Body, nil
}

// follow reads the events of one watch until it ends, delivering each
// change, and returns the last state seen.
func (w *watcher) follow(ctx context.Context, body io.Reader, last *leaseObject) (*leaseObject, error) {
	dec := json.NewDecoder(body)
	for {
		var ev struct {
			Type   string          `json:"type"`
			Object json.RawMessage `json:"object"`
		}
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) {
				return last, nil // the apiserver's timeout: open the next one
			}
			return last, err
		}
		switch ev.Type {
		case "ADDED", "MODIFIED", "DELETED":
			obj, err := parseLease(ev.Object)
			if err != nil {
				return last, err
			}
			if obj.name != w.name {
				continue
			}
			// A state no newer than the last one is a watch that started
			// again from before it (after a resync): not a change. A
			// deletion carries the revision of the delete, but is never
			// skipped: a repeated one does no harm.
			if ev.Type != "DELETED" && !obj.newer(last) {
				continue
			}
			last = obj
			if !w.deliver(ctx, change{deleted: ev.Type == "DELETED", obj: obj}) {
				return last, ctx.Err()
			}
		case "BOOKMARK":
			// Only metadata.resourceVersion is set: where to start from
			// next, with nothing changed.
			if obj, err := parseLease(ev.Object); err == nil && obj.resourceVersion != "" && last != nil {
				next := last.clone()
				next.resourceVersion = obj.resourceVersion
				last = next
			}
		case "ERROR":
			st := statusOf(0, ev.Object)
			var code struct {
				Code int `json:"code"`
			}
			_ = json.Unmarshal(ev.Object, &code)
			if code.Code == http.StatusGone || st.Reason == "Expired" || st.Reason == "Gone" {
				return last, errExpired
			}
			st.Code = code.Code
			return last, fmt.Errorf("watch lease %s/%s: %w", w.namespace, w.name, st)
		}
	}
}

// resync reads the Lease when the watch cannot go on from the last
// version, delivers its state if it changed, and returns where the next
// watch starts from.
func (w *watcher) resync(ctx context.Context, last *leaseObject) (*leaseObject, error) {
	obj, err := w.c.getLease(ctx, w.namespace, w.name)
	switch {
	case isNotFound(err):
		if last != nil && !w.deliver(ctx, change{deleted: true, obj: last, gone: true}) {
			return last, ctx.Err()
		}
		return nil, nil
	case err != nil:
		return last, err
	}
	if obj.newer(last) {
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
