package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/leaderrun/leaderrun/backends"
)

// candidacy is one bid for the lock, a session and the znode it creates:
// the backends.Ticket and, once its znode leads, the backends.Grant, whose
// goroutine watches for its loss (S3).
type candidacy struct {
	l        *lock
	s        *session
	identity string
	data     []byte // its znode's (backends.IdentityValue)
	guid     string
	try      bool
	ttl      time.Duration // what the grant reports as its TTL
	name     string        // our znode's name in the lock's znode, once created
	won      bool          // then token and acquired are set
	token    uint64
	acquired time.Time

	*backends.Loss                    // Lost and Err
	stop           context.CancelFunc // ends the watcher
	wg             sync.WaitGroup
}

var _ backends.Grant = (*candidacy)(nil)

// open opens a candidacy's session, learning meanwhile, the first time,
// the ensemble's minimum session timeout (leaseTTL).
func (st *Store) open(ctx context.Context, timeout time.Duration) (*session, time.Duration, error) {
	probed := make(chan error, 1)
	go func() { probed <- st.probe(ctx) }()
	s, err := st.connect(ctx, timeout, min(timeout, st.connectTimeout))
	if perr := <-probed; err == nil && perr != nil {
		st.closeLater(s)
		err = perr
	}
	return s, time.Duration(st.minTimeout.Load()), err
}

// probeTimeout is the session timeout asked to learn the ensemble's
// minimum, to which a server raises it. A smaller minimum goes unseen,
// which only widens the margin; a smaller probe would make the library's
// deadlines before the answer too short.
const probeTimeout = 100 * time.Millisecond

// leaseTTL is how long after the send time of an acknowledged renewal the
// runner may count on a session of negotiated timeout T, renewed every
// retry (zero: unknown): T − min(retry, T/3) − minTimeout/4, since an
// ensemble may expire a session that early (docs/backends/zookeeper.md,
// "The timing margin"). At least 1 ns: a zero TTL never expires.
func leaseTTL(timeout, retry, minTimeout time.Duration) time.Duration {
	contact := timeout / 3
	if retry > 0 && retry < contact {
		contact = retry
	}
	return max(timeout-contact-minTimeout/4, time.Nanosecond)
}

// probe learns the ensemble's minimum session timeout, once per store,
// from a session that asks for probeTimeout and is closed at once.
func (st *Store) probe(ctx context.Context) error {
	if st.minTimeout.Load() > 0 {
		return nil
	}
	s, err := st.connect(ctx, probeTimeout, st.connectTimeout)
	if err == nil {
		st.minTimeout.Store(int64(s.Timeout()))
		st.closeLater(s)
	}
	return err
}

// Lead waits, watching the candidate just ahead of ours, until ours is
// first, and queues again if someone deleted our znode. After a failure
// the driver calls it again: our znode lives as long as the session. With
// try it answers within the connect timeout.
func (cd *candidacy) Lead(ctx context.Context) (backends.Grant, error) {
	rctx := ctx
	if cd.try {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(ctx, cd.l.s.connectTimeout)
		defer cancel()
	}
	for {
		sent, rank, ahead, err := cd.look(rctx)
		switch {
		case err != nil:
		case rank < 0:
			err = cd.create(rctx) // deleted by hand, maybe with the lock's znode
		case rank == 0:
			var won bool
			if won, err = cd.win(rctx, sent); won {
				return cd, nil
			}
		case cd.try:
			return nil, fmt.Errorf("zookeeper: %s was taken first by another candidate: %w", cd.l.dir, backends.ErrLocked)
		default:
			err = cd.wait(rctx, ahead)
		}
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case cd.s.isExpired(), errors.Is(err, zk.ErrSessionExpired):
			return nil, fmt.Errorf("zookeeper: session 0x%x expired while waiting in %s: %w", cd.s.ID(), cd.l.dir, backends.ErrEnded)
		default:
			return nil, cd.l.s.failed(ctx, rctx, "wait in "+cd.l.dir, err)
		}
	}
}

// Leave ends the session, which deletes our znode (the library waits a
// second for the ensemble's answer; one out of reach expires the session
// after its timeout).
func (cd *candidacy) Leave(context.Context) error {
	if !cd.won {
		cd.s.close()
	}
	return nil
}

// create queues the candidate, creating the lock's znode if need be. A
// create whose answer was lost with its connection may have landed: it
// looks for its guid before it creates again.
func (cd *candidacy) create(ctx context.Context) error {
	prefix := cd.l.dir + "/" + protectedPrefix + cd.guid + latchName
	for range 3 {
		path, err := call(ctx, cd.s, func(z *zk.Conn) (string, error) {
			path, err := z.Create(prefix, cd.data, zk.FlagEphemeralSequential, cd.l.s.acl)
			if errors.Is(err, zk.ErrNoNode) {
				if err = ensure(z, cd.l.dir, cd.l.s.acl); err == nil {
					path, err = z.Create(prefix, cd.data, zk.FlagEphemeralSequential, cd.l.s.acl)
				}
			}
			if testHookCreate != nil {
				path, err = testHookCreate(z, prefix, path, err)
			}
			return path, err
		})
		switch {
		case err == nil && len(candidates([]string{path[len(cd.l.dir)+1:]})) == 0:
			// Not ours to keep: it would never find itself.
			_, _ = call(ctx, cd.s, func(z *zk.Conn) (struct{}, error) { return struct{}{}, z.Delete(path, -1) })
			return fmt.Errorf("%w (it was named %s)", errSequenceWrapped, path)
		case err == nil:
			cd.name = path[len(cd.l.dir)+1:]
			return nil
		case !errors.Is(err, zk.ErrConnectionClosed):
			return err
		}
		if _, rank, _, err := cd.look(ctx); err != nil || rank >= 0 {
			return err
		}
	}
	return fmt.Errorf("create %s: the connection kept dropping", prefix)
}

// look reads the queue after a sync sent at sent, so as to see the
// ensemble's state after it, not a lagging server's: our place (rank -1 if
// our znode is gone, 0 if we lead) and the candidate ahead of us. Our
// oldest znode is ours; any other with our guid is a retried create that
// landed after all, and goes.
func (cd *candidacy) look(ctx context.Context) (sent time.Time, rank int, ahead string, err error) {
	sent, rank = time.Now(), -1
	cs, err := call(ctx, cd.s, func(z *zk.Conn) ([]candidate, error) {
		if _, err := z.Sync(cd.l.dir); err != nil {
			return nil, err
		}
		children, _, err := z.Children(cd.l.dir)
		return candidates(children), err
	})
	for i, c := range cs {
		switch {
		case c.guid != cd.guid:
		case rank < 0:
			rank, cd.name = i, c.name
			if i > 0 {
				ahead = cs[i-1].name
			}
		default:
			_, _ = call(ctx, cd.s, func(z *zk.Conn) (struct{}, error) { return struct{}{}, z.Delete(cd.l.dir+"/"+c.name, -1) })
		}
	}
	return sent, rank, ahead, ignoreNoNode(err)
}

// wait waits until the candidate ahead of ours changes, our session
// expires, or ctx ends.
func (cd *candidacy) wait(ctx context.Context, ahead string) error {
	w, err := getW(ctx, cd.s, cd.l.dir+"/"+ahead)
	if err != nil {
		return ignoreNoNode(err)
	}
	select {
	case <-w.ch:
		cd.l.s.wakes.Add(1)
		return nil
	case <-cd.s.expired:
		return zk.ErrSessionExpired
	case <-ctx.Done():
		return ctx.Err()
	}
}

func ignoreNoNode(err error) error {
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	return err
}

// win turns the first place in the queue, seen after a sync sent at sent,
// into a grant. It reports false if the znode is gone.
func (cd *candidacy) win(ctx context.Context, sent time.Time) (bool, error) {
	w, err := getW(ctx, cd.s, cd.Path())
	switch {
	case err != nil:
		return false, ignoreNoNode(err)
	case w.stat.EphemeralOwner != cd.s.ID():
		// The library replaced an expired session under us.
		return false, zk.ErrSessionExpired
	}
	wctx, stop := context.WithCancel(context.Background())
	cd.won, cd.token, cd.acquired, cd.stop = true, uint64(w.stat.Czxid), sent, stop
	cd.s.down.Store(false) // what the connection went through while it waited is old news
	cd.s.leader.Store(cd.l.log.With("identity", cd.identity, "token", cd.token))
	cd.wg.Go(func() { cd.watch(wctx, w.ch) })
	return true, nil
}

// watched is a read that set a watch.
type watched struct {
	stat *zk.Stat
	ch   <-chan zk.Event
}

// getW reads path and sets a data watch on it: an exists watch on a znode
// already gone would wait for a creation that never comes (Curator's).
func getW(ctx context.Context, s *session, path string) (watched, error) {
	return call(ctx, s, func(z *zk.Conn) (watched, error) {
		_, stat, ch, err := z.GetW(path)
		return watched{stat, ch}, err
	})
}

func (cd *candidacy) Token() uint64       { return cd.token }
func (cd *candidacy) Acquired() time.Time { return cd.acquired }

// TTL is the session timeout less the margin of leaseTTL.
func (cd *candidacy) TTL() time.Duration { return cd.ttl }

func (cd *candidacy) Path() string { return cd.l.dir + "/" + cd.name }

func (cd *candidacy) lose(format string, args ...any) {
	cd.Set(fmt.Errorf("zookeeper: "+format+": %w", append(args, backends.ErrLeaseLost)...))
}

func (cd *candidacy) expired() { cd.lose("session 0x%x of %s expired", cd.s.ID(), cd.Path()) }

// watch closes Lost when the znode is deleted or the session expires.
func (cd *candidacy) watch(ctx context.Context, ch <-chan zk.Event) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-cd.s.expired:
			cd.expired()
			return
		case ev := <-ch:
			switch {
			case ev.Type == zk.EventNodeDeleted:
				cd.lose("znode %s was deleted", cd.Path())
				return
			case ev.Type == zk.EventNotWatching && errors.Is(ev.Err, zk.ErrSessionExpired):
				cd.expired()
				return
			case ev.Type == zk.EventNotWatching:
				// Release stops this goroutine before it ends the
				// session: someone closed it under us.
				cd.lose("connection closed under %s: %v", cd.Path(), ev.Err)
				return
			}
		}
		// The znode's data changed: a watch fires once, set it again. If
		// that fails, renewals still see a loss.
		w, err := getW(ctx, cd.s, cd.Path())
		if errors.Is(err, zk.ErrNoNode) {
			cd.lose("znode %s was deleted", cd.Path())
			return
		}
		ch = w.ch
	}
}

// Renew: a sync, which passes through the ensemble leader, then a read of
// our znode, answered once the sync is done: proof that the znode existed
// in the ensemble's committed state after the send time.
func (cd *candidacy) Renew(ctx context.Context) error {
	if err := cd.Err(); err != nil {
		return err
	}
	path := cd.Path()
	stat, err := call(ctx, cd.s, func(z *zk.Conn) (*zk.Stat, error) {
		if _, err := z.Sync(path); err != nil {
			return nil, err
		}
		ok, stat, err := z.Exists(path)
		if err == nil && !ok {
			err = zk.ErrNoNode
		}
		return stat, err
	})
	switch {
	case errors.Is(err, zk.ErrSessionExpired), cd.s.isExpired():
		cd.expired()
	case errors.Is(err, zk.ErrNoNode):
		cd.lose("znode %s is gone", path)
	case err != nil:
		return fmt.Errorf("zookeeper %s: renew %s: %w", cd.l.s.list, path, err)
	case stat.EphemeralOwner != cd.s.ID():
		cd.lose("znode %s belongs to another session", path)
	}
	return cd.Err()
}

// WriteDoc writes the document and checks that our znode exists, and so
// our leadership, in one transaction.
func (cd *candidacy) WriteDoc(ctx context.Context, d backends.Doc) error {
	if err := cd.Err(); err != nil {
		return err
	}
	path, op, err := cd.l.docOp(d)
	if err != nil {
		return err
	}
	res, err := call(ctx, cd.s, func(z *zk.Conn) ([]zk.MultiResponse, error) {
		return z.Multi(&zk.CheckVersionRequest{Path: cd.Path(), Version: -1}, op)
	})
	switch {
	case len(res) > 0 && errors.Is(res[0].Error, zk.ErrNoNode):
		cd.lose("znode %s is gone", cd.Path())
	case errors.Is(err, zk.ErrSessionExpired), err != nil && cd.s.isExpired():
		cd.expired()
	default:
		return docError(cd.l.s, path, err)
	}
	return cd.Err()
}

// Release deletes our znode, unless the lease was lost, and ends the
// session, and with it any other of ours.
func (cd *candidacy) Release(ctx context.Context) error {
	if !cd.BeginRelease() {
		return nil
	}
	cd.stop()
	cd.wg.Wait()
	defer cd.s.close()
	if cd.Err() != nil {
		return nil
	}
	_, err := call(ctx, cd.s, func(z *zk.Conn) (struct{}, error) { return struct{}{}, z.Delete(cd.Path(), -1) })
	if ignoreNoNode(err) != nil {
		// Ending the session deletes it, if the ensemble hears of it.
		return fmt.Errorf("zookeeper %s: delete %s: %w", cd.l.s.list, cd.Path(), err)
	}
	return nil
}
