package zookeeper

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/leaderrun/leaderrun/backends"
)

// lease is won leadership: the candidacy whose znode leads the queue.
//
// One goroutine watches for its loss: a watch on the znode reports its
// deletion by anyone, and the library reports the session's expiry (when
// it reconnects after the timeout), each within a round trip of the
// ensemble telling it. A connection that drops is only logged: the session
// and its znode survive a reconnection within the timeout, and until then
// the runner's renew deadline runs.
type lease struct {
	c        *candidacy
	token    uint64
	acquired time.Time
	ttl      time.Duration

	*backends.Loss                    // Lost and Err
	stop           context.CancelFunc // ends the watcher
	wg             sync.WaitGroup
}

var _ backends.Lease = (*lease)(nil)

func newLease(c *candidacy, token uint64, acquired time.Time, ch <-chan zk.Event) *lease {
	ctx, stop := context.WithCancel(context.Background())
	l := &lease{c: c, token: token, acquired: acquired, ttl: c.ttl, Loss: backends.NewLoss(), stop: stop}
	// What the connection went through while we waited is old news.
	for drained := false; !drained; {
		select {
		case <-c.s.states:
		default:
			drained = true
		}
	}
	c.b.mu.Lock()
	c.b.held = l
	c.b.mu.Unlock()
	l.wg.Go(func() { l.watch(ctx, ch) })
	return l
}

func (l *lease) Token() uint64       { return l.token }
func (l *lease) Acquired() time.Time { return l.acquired }

// TTL is what the runner may count on of the session timeout the
// ensemble negotiated: the timeout, less the margin by which an ensemble
// may expire the session earlier than a renewal's send time + timeout
// (see leaseTTL).
func (l *lease) TTL() time.Duration { return l.ttl }

// SessionTimeout is the session timeout the ensemble negotiated.
func (l *lease) SessionTimeout() time.Duration { return l.c.s.Timeout() }

// Path is the leader's znode.
func (l *lease) Path() string { return l.c.path() }

// SessionID is the id of the session that owns the znode.
func (l *lease) SessionID() int64 { return l.c.s.ID() }

// Server is the server the session is connected to now, or was last.
func (l *lease) Server() string { return l.c.s.conn.Server() }

func (l *lease) path() string { return l.c.path() }

func (l *lease) lostErr(format string, args ...any) error {
	return fmt.Errorf("zookeeper: "+format+": %w", append(args, backends.ErrLeaseLost)...)
}

func (l *lease) expiredErr() error {
	return l.lostErr("session 0x%x of %s expired", l.SessionID(), l.path())
}

// watch closes Lost when the znode is deleted or the session expires.
func (l *lease) watch(ctx context.Context, ch <-chan zk.Event) {
	log := l.c.b.log.With("identity", l.c.identity, "token", l.token)
	var backoff backends.Backoff
	disconnected := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.c.s.expired:
			l.Set(l.expiredErr())
			return
		case st := <-l.c.s.states:
			switch {
			case st == zk.StateDisconnected && !disconnected:
				disconnected = true
				log.Warn("connection to zookeeper lost; the session survives a reconnection within its timeout",
					"server", l.Server(), "session_timeout", l.SessionTimeout())
			case st == zk.StateHasSession && disconnected:
				disconnected = false
				log.Info("reconnected to zookeeper", "server", l.Server())
			}
			continue
		case ev := <-ch:
			switch {
			case ev.Type == zk.EventNodeDeleted:
				l.Set(l.lostErr("znode %s was deleted", l.path()))
				return
			case ev.Type == zk.EventNotWatching && errors.Is(ev.Err, zk.ErrSessionExpired):
				l.Set(l.expiredErr())
				return
			case ev.Type == zk.EventNotWatching:
				// Release stops this goroutine before it closes
				// the session: someone closed the backend under us.
				l.Set(l.lostErr("connection closed under %s: %v", l.path(), ev.Err))
				return
			}
		}
		// The znode's data changed: a watch fires once, set it again.
		for ch = nil; ch == nil; {
			w, err := call(ctx, l.c.s, func(z *zk.Conn) (watched, error) {
				_, stat, ch, err := z.GetW(l.path())
				return watched{stat, ch}, err
			})
			switch {
			case err == nil:
				ch = w.ch
				backoff.Reset()
			case errors.Is(err, zk.ErrNoNode):
				l.Set(l.lostErr("znode %s was deleted", l.path()))
				return
			case backoff.Sleep(ctx) != nil:
				return
			}
		}
	}
}

// Renew implements backends.Lease: a sync, which passes through the
// ensemble leader, then a read of our znode, which the server answers only
// once the sync is done. The answer proves that the znode existed in the
// ensemble's committed state after the send time; a missing znode is
// ErrLeaseLost.
func (l *lease) Renew(ctx context.Context) error {
	if err := l.Err(); err != nil {
		return err
	}
	path := l.path()
	_, err := call(ctx, l.c.s, func(z *zk.Conn) (string, error) { return z.Sync(path) })
	var stat *zk.Stat
	if err == nil {
		stat, err = call(ctx, l.c.s, func(z *zk.Conn) (*zk.Stat, error) {
			ok, stat, err := z.Exists(path)
			if err == nil && !ok {
				err = zk.ErrNoNode
			}
			return stat, err
		})
	}
	switch {
	case errors.Is(err, zk.ErrSessionExpired), l.c.s.isExpired():
		l.Set(l.expiredErr())
	case errors.Is(err, zk.ErrNoNode):
		l.Set(l.lostErr("znode %s is gone", path))
	case err != nil:
		return fmt.Errorf("zookeeper %s: renew %s: %w", l.c.b.list, path, err)
	case stat.EphemeralOwner != l.SessionID():
		l.Set(l.lostErr("znode %s belongs to another session", path))
	}
	return l.Err()
}

// markerPath is where the marker of key lives. A key may hold any byte;
// what a znode name cannot hold, or would read as a path (".", ".."), is
// escaped as %XX.
func (b *Backend) markerPath(key string) string {
	var name strings.Builder
	for i := 0; i < len(key); i++ {
		c := key[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.' && i > 0 {
			name.WriteByte(c)
		} else {
			fmt.Fprintf(&name, "%%%02X", c)
		}
	}
	if name.Len() == 0 {
		name.WriteByte('%')
	}
	return b.doneDir() + "/" + name.String()
}

// Completed implements backends.Backend, with the session Status reads
// with.
func (b *Backend) Completed(ctx context.Context, key string) (*backends.Marker, error) {
	s, err := b.readSession(ctx)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, b.connectTimeout)
	defer cancel()
	path := b.markerPath(key)
	data, err := call(rctx, s, func(z *zk.Conn) ([]byte, error) {
		data, _, err := z.Get(path)
		return data, err
	})
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, b.failed(ctx, rctx, "read marker "+path, err)
	}
	var m backends.Marker
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("zookeeper: marker %s: %w", path, err)
	}
	if !m.Expires.After(time.Now()) {
		return nil, nil
	}
	return &m, nil
}

// Complete implements backends.Lease: the marker is created, or replaced
// at the version just read, in one transaction with a check that our
// znode exists. A marker written meanwhile by someone else (the version
// moved) is read again; the transaction is tried three times at most.
// Expired markers are deleted afterwards, as far as ctx allows.
func (l *lease) Complete(ctx context.Context, m backends.Marker) error {
	if err := l.Err(); err != nil {
		return err
	}
	data, err := json.Marshal(m)
	if err != nil {
		return err
	}
	path, ours := l.c.b.markerPath(m.Key), l.path()
	fail := func(err error) error {
		return fmt.Errorf("zookeeper %s: write marker %s: %w", l.c.b.list, path, err)
	}
	if err := l.c.b.ensure(ctx, l.c.s, l.c.b.doneDir()); err != nil {
		return fail(err)
	}
	for range 3 {
		stat, err := call(ctx, l.c.s, func(z *zk.Conn) (*zk.Stat, error) {
			ok, stat, err := z.Exists(path)
			if !ok {
				stat = nil
			}
			return stat, err
		})
		if err != nil {
			return fail(err)
		}
		ops := []any{&zk.CheckVersionRequest{Path: ours, Version: -1}}
		if stat == nil {
			ops = append(ops, &zk.CreateRequest{Path: path, Data: data, Acl: l.c.b.acl, Flags: zk.FlagPersistent})
		} else {
			ops = append(ops, &zk.SetDataRequest{Path: path, Data: data, Version: stat.Version})
		}
		err = l.multi(ctx, ops)
		switch {
		case err == nil:
			l.pruneMarkers(ctx, path)
			return nil
		case errors.Is(err, backends.ErrLeaseLost):
			return err
		case errors.Is(err, zk.ErrNodeExists), errors.Is(err, zk.ErrBadVersion), errors.Is(err, zk.ErrNoNode):
			continue
		default:
			return fail(err)
		}
	}
	return fail(errors.New("the marker kept changing under us"))
}

// multi runs ops, whose first is a check of our znode, in one transaction.
// A transaction that fails tells only the first error; a missing node is
// ours (ErrLeaseLost, and Lost is closed) if our znode is gone.
func (l *lease) multi(ctx context.Context, ops []any) error {
	_, err := call(ctx, l.c.s, func(z *zk.Conn) ([]zk.MultiResponse, error) { return z.Multi(ops...) })
	if !errors.Is(err, zk.ErrNoNode) {
		return err
	}
	path := l.path()
	gone, eerr := call(ctx, l.c.s, func(z *zk.Conn) (bool, error) {
		ok, _, err := z.Exists(path)
		return !ok, err
	})
	if eerr == nil && gone {
		l.Set(l.lostErr("znode %s is gone", path))
		return l.Err()
	}
	return err
}

// pruneMarkers deletes the markers that expired, except keep. Best
// effort: a marker left behind is ignored when read, and deleted next time.
func (l *lease) pruneMarkers(ctx context.Context, keep string) {
	dir := l.c.b.doneDir()
	names, err := call(ctx, l.c.s, func(z *zk.Conn) ([]string, error) {
		names, _, err := z.Children(dir)
		return names, err
	})
	if err != nil {
		return
	}
	now := time.Now()
	for _, name := range names {
		path := dir + "/" + name
		if path == keep {
			continue
		}
		z, err := call(ctx, l.c.s, func(z *zk.Conn) (znode, error) {
			data, stat, err := z.Get(path)
			return znode{data, stat}, err
		})
		if err != nil {
			continue
		}
		var m backends.Marker
		if json.Unmarshal(z.data, &m) != nil || m.Expires.After(now) {
			continue
		}
		// At the version read: a marker rewritten meanwhile stays.
		_, _ = call(ctx, l.c.s, func(c *zk.Conn) (struct{}, error) { return struct{}{}, c.Delete(path, z.stat.Version) })
	}
}

// termPrefix names the history's znodes: term-<seq>.
const termPrefix = "term-"

// Release implements backends.Lease. With a term, it deletes our znode
// (unless the lease was lost) and appends the term in one transaction;
// then it ends the session, which deletes whatever ephemeral znode of ours
// is left. The lock is released even when the history cannot be written.
func (l *lease) Release(ctx context.Context, term *backends.Term) error {
	if !l.BeginRelease() {
		return nil
	}
	l.stop()
	l.wg.Wait()
	b := l.c.b
	b.mu.Lock()
	if b.held == l {
		b.held = nil
	}
	b.mu.Unlock()
	defer l.c.s.close()

	if term != nil {
		if err := l.appendTerm(ctx, term); err != nil {
			return fmt.Errorf("zookeeper %s: append the term of token %d to %s (the lock is released all the same): %w",
				b.list, l.token, b.historyDir(), err)
		}
		return nil
	}
	if l.Err() != nil {
		return nil
	}
	path := l.path()
	_, err := call(ctx, l.c.s, func(z *zk.Conn) (struct{}, error) { return struct{}{}, z.Delete(path, -1) })
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		// Ending the session deletes it, if the ensemble hears of it.
		return fmt.Errorf("zookeeper %s: delete %s: %w", b.list, path, err)
	}
	return nil
}

// appendTerm writes term as the newest znode of the history, deleting our
// znode in the same transaction while the lease holds, and the oldest
// terms beyond backends.HistoryLimit.
func (l *lease) appendTerm(ctx context.Context, term *backends.Term) error {
	b := l.c.b
	data, err := json.Marshal(term)
	if err != nil {
		return err
	}
	dir := b.historyDir()
	if err := b.ensure(ctx, l.c.s, dir); err != nil {
		return err
	}
	holding := l.Err() == nil
	for range 3 {
		names, err := call(ctx, l.c.s, func(z *zk.Conn) ([]string, error) {
			names, _, err := z.Children(dir)
			return names, err
		})
		if err != nil {
			return err
		}
		var ops []any
		if holding {
			ops = append(ops, &zk.DeleteRequest{Path: l.path(), Version: -1})
		}
		ops = append(ops, &zk.CreateRequest{Path: dir + "/" + termPrefix, Data: data, Acl: b.acl, Flags: zk.FlagSequence})
		for _, old := range oldestTerms(names, min(len(names)+1-backends.HistoryLimit, maxPruned)) {
			ops = append(ops, &zk.DeleteRequest{Path: dir + "/" + old, Version: -1})
		}
		_, err = call(ctx, l.c.s, func(z *zk.Conn) ([]zk.MultiResponse, error) { return z.Multi(ops...) })
		if !errors.Is(err, zk.ErrNoNode) {
			return err
		}
		// Our znode is gone (the lease was lost meanwhile), or another
		// writer pruned an old term first: look again.
		path := l.path()
		holding, err = call(ctx, l.c.s, func(z *zk.Conn) (bool, error) {
			ok, _, err := z.Exists(path)
			return ok, err
		})
		if err != nil {
			return err
		}
	}
	return errors.New("the history kept changing under us")
}

// oldestTerms returns the n oldest of the history's znode names.
func oldestTerms(names []string, n int) []string {
	if n <= 0 {
		return nil
	}
	type term struct {
		name string
		seq  int64
	}
	var ts []term
	for _, name := range names {
		if digits, ok := strings.CutPrefix(name, termPrefix); ok {
			if seq, err := strconv.ParseInt(digits, 10, 64); err == nil {
				ts = append(ts, term{name, seq})
			}
		}
	}
	slices.SortFunc(ts, func(a, b term) int { return cmp.Compare(a.seq, b.seq) })
	var old []string
	for _, t := range ts[:min(n, len(ts))] {
		old = append(old, t.name)
	}
	return old
}

func (l *lease) String() string {
	return fmt.Sprintf("%s (session 0x%x, token %d)", l.path(), l.SessionID(), l.token)
}
