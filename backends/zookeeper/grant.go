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
// the backends.Ticket and, once its znode leads, the backends.Grant. A
// grant's one goroutine watches for its loss, the znode deleted by anyone
// or the session expired, each reported within a round trip of the
// ensemble telling it (S3). A connection that drops is only logged: the
// session survives a reconnection within its timeout, and until then the
// runner's renew deadline runs.
type candidacy struct {
	l        *lock
	s        *session
	identity string
	data     []byte // its znode's (see candidateData)
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

// win turns the first place in the queue, seen after a sync sent at sent,
// into a grant. It reports false if the znode is gone.
func (cd *candidacy) win(ctx context.Context, sent time.Time) (bool, error) {
	w, err := call(ctx, cd.s, func(z *zk.Conn) (watched, error) {
		_, stat, ch, err := z.GetW(cd.Path())
		return watched{stat, ch}, err
	})
	switch {
	case err != nil:
		return false, ignoreNoNode(err)
	case w.stat.EphemeralOwner != cd.s.ID():
		// The library replaced an expired session under us.
		return false, zk.ErrSessionExpired
	}
	for len(cd.s.states) > 0 { // what the connection went through while we waited
		<-cd.s.states
	}
	wctx, stop := context.WithCancel(context.Background())
	cd.won, cd.token, cd.acquired, cd.stop = true, uint64(w.stat.Czxid), sent, stop
	cd.wg.Go(func() { cd.watch(wctx, w.ch) })
	return true, nil
}

// watched is a read that set a watch.
type watched struct {
	stat *zk.Stat
	ch   <-chan zk.Event
}

func (cd *candidacy) Token() uint64       { return cd.token }
func (cd *candidacy) Acquired() time.Time { return cd.acquired }

// TTL implements backends.Grant: the session timeout less the margin by
// which an ensemble may expire the session early (leaseTTL).
func (cd *candidacy) TTL() time.Duration { return cd.ttl }

// SessionTimeout, Path, SessionID and Server are the negotiated timeout,
// our znode, our session's id and the server it is (or was last) on.
func (cd *candidacy) SessionTimeout() time.Duration { return cd.s.Timeout() }
func (cd *candidacy) Path() string                  { return cd.l.dir + "/" + cd.name }
func (cd *candidacy) SessionID() int64              { return cd.s.ID() }
func (cd *candidacy) Server() string                { return cd.s.conn.Server() }

// lose closes Lost, saying why.
func (cd *candidacy) lose(format string, args ...any) {
	cd.Set(fmt.Errorf("zookeeper: "+format+": %w", append(args, backends.ErrLeaseLost)...))
}

func (cd *candidacy) expired() { cd.lose("session 0x%x of %s expired", cd.SessionID(), cd.Path()) }

// watch closes Lost when the znode is deleted or the session expires.
func (cd *candidacy) watch(ctx context.Context, ch <-chan zk.Event) {
	log := cd.l.log.With("identity", cd.identity, "token", cd.token)
	disconnected := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-cd.s.expired:
			cd.expired()
			return
		case st := <-cd.s.states:
			switch {
			case st == zk.StateDisconnected && !disconnected:
				disconnected = true
				log.Warn("connection to zookeeper lost; the session survives a reconnection within its timeout",
					"server", cd.Server(), "session_timeout", cd.SessionTimeout())
			case st == zk.StateHasSession && disconnected:
				disconnected = false
				log.Info("reconnected to zookeeper", "server", cd.Server())
			}
			continue
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
		w, err := call(ctx, cd.s, func(z *zk.Conn) (watched, error) {
			_, stat, ch, err := z.GetW(cd.Path())
			return watched{stat, ch}, err
		})
		if errors.Is(err, zk.ErrNoNode) {
			cd.lose("znode %s was deleted", cd.Path())
			return
		}
		ch = w.ch
	}
}

// Renew implements backends.Grant: a sync, which passes through the
// ensemble leader, then a read of our znode, answered once the sync is
// done: proof that the znode existed in the ensemble's committed state
// after the send time.
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
	case stat.EphemeralOwner != cd.SessionID():
		cd.lose("znode %s belongs to another session", path)
	}
	return cd.Err()
}

// WriteDoc implements backends.Grant: the document's write and a check
// that our znode exists, and so our leadership, in one transaction.
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

// Release implements backends.Grant: it deletes our znode, unless the
// lease was lost, and ends the session, and with it any other of ours.
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
