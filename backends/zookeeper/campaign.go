package zookeeper

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/leaderrun/leaderrun/backends"
)

// errCandidacyEnded says that a waiting candidacy's session expired (the
// client was cut off from the ensemble for longer than the timeout) before
// it won. A waiting candidate then campaigns again with a new session.
var errCandidacyEnded = errors.New("zookeeper: candidacy ended while waiting")

// errSequenceWrapped says that the lock's sequence counter wrapped:
// ZooKeeper numbers a sequential znode with its parent's cversion, a
// signed 32-bit count of changes to the parent's children (a candidacy
// is two, its create and its delete), so after about 10^9 candidacies it
// names candidates with negative numbers, which would sort before the
// ones ahead of them. Deleting the lock's znode while nobody holds it
// starts the counter again (tokens, czxids, go on growing).
var errSequenceWrapped = errors.New("zookeeper: the lock's sequence counter wrapped (2^31 changes to its children): delete the lock's znode while nobody holds it")

// Campaign implements backends.Backend. Each candidacy opens a session
// whose timeout is opts.LeaseDuration (required), creates its znode and
// waits, watching the candidate just ahead of it, until it leads.
//
// Before the candidate is queued, a session that cannot be established or
// a request that gets no answer within the connect timeout is an error
// wrapping backends.ErrUnavailable; so is a refusal (missing permission,
// or a wrong password, which ZooKeeper reports the same way), at any time.
// Once queued, the candidate waits out disconnections for as long as its
// session lives, re-creates its znode if someone deletes it, and campaigns
// again with a new session if the session expires.
//
// With opts.Try it lists the candidates first and leaves no trace at all
// if there is one; otherwise it creates its znode and withdraws at once if
// another candidate came first.
//
// Cancelling ctx ends the candidacy's session, which deletes its znode,
// before Campaign returns ctx's error. The client library bounds that by
// about a second; if the ensemble cannot be reached, the session expires on
// its own.
func (b *Backend) Campaign(ctx context.Context, opts backends.CampaignOptions) (backends.Lease, error) {
	if opts.LeaseDuration <= 0 {
		return nil, fmt.Errorf("zookeeper: campaign for %s: no lease duration to ask as the session timeout", b.dir)
	}
	var backoff backends.Backoff
	for attempt := 0; ; attempt++ {
		l, err := b.campaign(ctx, opts)
		switch {
		case err == nil:
			return l, nil
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case opts.Try, refused(err), errors.Is(err, errSequenceWrapped), attempt == 0 && !errors.Is(err, errCandidacyEnded):
			return nil, err
		}
		b.log.Warn("campaigning again", "identity", opts.Identity, "reason", err)
		if err := backoff.Sleep(ctx); err != nil {
			return nil, err
		}
	}
}

// campaign is one candidacy, with a session of its own.
func (b *Backend) campaign(ctx context.Context, opts backends.CampaignOptions) (*lease, error) {
	// The lease's TTL depends on the ensemble's minimum session timeout
	// (see leaseTTL): learn it, the first time, while connecting.
	type probe struct {
		min time.Duration
		err error
	}
	probed := make(chan probe, 1)
	go func() {
		d, err := b.minSessionTimeout(ctx)
		probed <- probe{d, err}
	}()
	s, err := b.connect(ctx, opts.LeaseDuration)
	p := <-probed
	if err == nil && p.err != nil {
		b.closeLater(s)
		err = p.err
	}
	if err != nil {
		return nil, err
	}
	c := &candidacy{b: b, s: s, identity: opts.Identity, data: candidateData(opts), guid: newGUID(),
		ttl: leaseTTL(s.Timeout(), b.retry, p.min)}
	// The session's id is what the servers' logs show; the TTL is what
	// the runner checks its timings against, and not the timeout.
	attrs := []any{"identity", opts.Identity, "session", fmt.Sprintf("0x%x", s.ID()), "server", s.conn.Server(),
		"session_timeout", s.Timeout(), "lease_ttl", c.ttl}
	if s.Timeout() != opts.LeaseDuration.Truncate(time.Millisecond) {
		// The ensemble's minSessionTimeout and maxSessionTimeout bound it.
		attrs = append(attrs, "asked", opts.LeaseDuration)
	}
	b.log.Info("zookeeper session opened", attrs...)
	var l *lease
	if opts.Try {
		l, err = c.try(ctx)
	} else {
		l, err = c.wait(ctx)
	}
	if err != nil {
		c.withdraw()
		return nil, err
	}
	return l, nil
}

// candidacy is one bid for the lock: a session and the znode it creates,
// named with the candidacy's guid.
type candidacy struct {
	b        *Backend
	s        *session
	identity string
	data     []byte // its znode's (see candidateData)
	guid     string
	name     string        // our znode's name in the lock's znode, once created
	ttl      time.Duration // what a lease of this session reports as its TTL
}

func (c *candidacy) path() string { return c.b.dir + "/" + c.name }

func (c *candidacy) ended() error {
	return fmt.Errorf("%w: session 0x%x expired", errCandidacyEnded, c.s.ID())
}

// wait queues the candidate and waits until it leads.
func (c *candidacy) wait(ctx context.Context) (*lease, error) {
	if err := c.create(ctx); err != nil {
		return nil, err
	}
	var backoff backends.Backoff
	for {
		v, err := c.look(ctx)
		if err == nil {
			switch {
			case v.ours == "":
				// Deleted by hand, maybe with the lock's znode:
				// queue again.
				err = c.create(ctx)
			case v.rank == 0:
				var l *lease
				if l, err = c.win(ctx, v); l != nil {
					return l, nil
				}
			default:
				err = c.watch(ctx, v.ahead)
			}
		}
		switch {
		case err == nil:
			backoff.Reset()
			continue
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case c.s.isExpired(), errors.Is(err, zk.ErrSessionExpired):
			return nil, c.ended()
		case refused(err), errors.Is(err, errSequenceWrapped):
			if !errors.Is(err, backends.ErrUnavailable) {
				err = c.b.unavailable("wait in "+c.b.dir, err)
			}
			return nil, err
		}
		// The library is reconnecting (a create that timed out
		// included): our znode lives as long as the session does.
		if err := backoff.Sleep(ctx); err != nil {
			return nil, err
		}
	}
}

// try takes the lock only if no candidate is queued, within the connect
// timeout: a --try never waits.
func (c *candidacy) try(ctx context.Context) (*lease, error) {
	rctx, cancel := context.WithTimeout(ctx, c.b.connectTimeout)
	defer cancel()
	children, err := call(rctx, c.s, func(z *zk.Conn) ([]string, error) {
		children, _, err := z.Children(c.b.dir)
		return children, err
	})
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		return nil, c.b.failed(ctx, rctx, "list "+c.b.dir, err)
	}
	if cs := candidates(children); len(cs) > 0 {
		return nil, c.locked(rctx, cs[0], "is held")
	}
	if err := c.create(ctx); err != nil {
		return nil, err
	}
	v, err := c.look(rctx)
	if err == nil && v.ours != "" && v.rank == 0 {
		var l *lease
		if l, err = c.win(rctx, v); l != nil {
			return l, nil
		}
	}
	if err != nil {
		return nil, c.b.failed(ctx, rctx, "read "+c.b.dir, err)
	}
	return nil, c.locked(rctx, v.leader, "was taken first")
}

// locked is ErrLocked, naming the holder if it can be read at once.
func (c *candidacy) locked(ctx context.Context, leader candidate, how string) error {
	if leader.name == "" {
		return fmt.Errorf("zookeeper: %s %s by another candidate: %w", c.b.dir, how, backends.ErrLocked)
	}
	z, err := call(ctx, c.s, func(z *zk.Conn) (znode, error) {
		data, stat, err := z.Get(c.b.dir + "/" + leader.name)
		return znode{data, stat}, err
	})
	if err != nil {
		return fmt.Errorf("zookeeper: %s %s by another candidate: %w", c.b.dir, how, backends.ErrLocked)
	}
	identity, _ := parseData(z.data)
	return fmt.Errorf("zookeeper: %s %s by %q (token %d): %w", c.b.dir, how, identity, z.stat.Czxid, backends.ErrLocked)
}

// create queues the candidate: an ephemeral sequential znode named with the
// candidacy's guid, holding its identity (see candidateData), its parents
// created as needed.
// If the answer to a create is lost with its connection, the znode may
// exist: it looks for its guid before it creates again. It gives up after
// the connect timeout, with an error wrapping backends.ErrUnavailable.
func (c *candidacy) create(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, c.b.connectTimeout)
	defer cancel()
	prefix := c.b.dir + "/" + protectedPrefix + c.guid + latchName
	backoff := backends.Backoff{Min: 20 * time.Millisecond, Max: 500 * time.Millisecond}
	for {
		path, err := call(rctx, c.s, func(z *zk.Conn) (string, error) {
			path, err := z.Create(prefix, c.data, zk.FlagEphemeralSequential, c.b.acl)
			if testHookCreate != nil {
				path, err = testHookCreate(z, prefix, path, err)
			}
			return path, err
		})
		switch {
		case err == nil:
			name := path[len(c.b.dir)+1:]
			if _, ok := parseCandidate(name); !ok {
				// Not ours to keep: it would never find itself.
				_, _ = call(rctx, c.s, func(z *zk.Conn) (struct{}, error) { return struct{}{}, z.Delete(path, -1) })
				return c.b.unavailable("create a candidate in "+c.b.dir, fmt.Errorf("%w (it was named %s)", errSequenceWrapped, name))
			}
			c.name = name
			return nil
		case errors.Is(err, zk.ErrNoNode):
			err = c.b.ensure(rctx, c.s, c.b.dir)
		case errors.Is(err, zk.ErrConnectionClosed):
			var found string
			if found, err = c.find(rctx); found != "" {
				c.name = found
				return nil
			}
		}
		switch {
		case err == nil:
			continue
		case c.s.isExpired(), errors.Is(err, zk.ErrSessionExpired):
			return c.ended()
		case !refused(err) && rctx.Err() == nil:
			if backoff.Sleep(rctx) == nil {
				continue
			}
		}
		return c.b.failed(ctx, rctx, "create a candidate in "+c.b.dir, err)
	}
}

// find returns the name of our oldest znode, "" if there is none.
func (c *candidacy) find(ctx context.Context) (string, error) {
	v, err := c.look(ctx)
	return v.ours, err
}

// view is the queue as one read saw it.
type view struct {
	sent   time.Time // send time of the sync the read followed
	ours   string    // our znode's name; "" if it is gone
	rank   int       // our place in the queue, 0 if we lead
	ahead  string    // the candidate just ahead of ours
	leader candidate // the first candidate, if any
}

// look reads the queue. The read follows a sync, so that it sees the
// ensemble's committed state as of a moment after sent, not a lagging
// server's. Our oldest znode is ours; any other with our guid is a create
// whose lost answer we retried that landed after all, and is deleted.
func (c *candidacy) look(ctx context.Context) (view, error) {
	v := view{sent: time.Now()}
	_, err := call(ctx, c.s, func(z *zk.Conn) (string, error) { return z.Sync(c.b.dir) })
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		return v, err
	}
	children, err := call(ctx, c.s, func(z *zk.Conn) ([]string, error) {
		children, _, err := z.Children(c.b.dir)
		return children, err
	})
	if errors.Is(err, zk.ErrNoNode) {
		return v, nil
	}
	if err != nil {
		return v, err
	}
	cs := candidates(children)
	if len(cs) > 0 {
		v.leader = cs[0]
	}
	for i, cd := range cs {
		switch {
		case cd.guid != c.guid:
		case v.ours == "":
			v.ours, v.rank = cd.name, i
			if i > 0 {
				v.ahead = cs[i-1].name
			}
			c.name = cd.name
		default:
			c.reap(ctx, cd.name)
		}
	}
	return v, nil
}

// reap deletes a second znode of ours. If that fails, it goes with the
// session at the latest.
func (c *candidacy) reap(ctx context.Context, name string) {
	_, _ = call(ctx, c.s, func(z *zk.Conn) (struct{}, error) {
		return struct{}{}, z.Delete(c.b.dir+"/"+name, -1)
	})
}

// watch waits until the candidate ahead of ours changes (it is deleted,
// mostly), our session expires, or ctx ends.
func (c *candidacy) watch(ctx context.Context, ahead string) error {
	path := c.b.dir + "/" + ahead
	// A data watch, as Curator sets: an exists watch on a znode already
	// gone would stay registered for a creation that never comes.
	ch, err := call(ctx, c.s, func(z *zk.Conn) (<-chan zk.Event, error) {
		_, _, ch, err := z.GetW(path)
		return ch, err
	})
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	if err != nil {
		return err
	}
	select {
	case <-ch:
		c.b.wakes.Add(1)
		return nil
	case <-c.s.expired:
		return zk.ErrSessionExpired
	case <-ctx.Done():
		return ctx.Err()
	}
}

// win turns the first place in the queue into a lease, watching our znode
// from now on. It returns nil, nil if the znode is gone.
func (c *candidacy) win(ctx context.Context, v view) (*lease, error) {
	path := c.path()
	w, err := call(ctx, c.s, func(z *zk.Conn) (watched, error) {
		_, stat, ch, err := z.GetW(path)
		return watched{stat, ch}, err
	})
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if w.stat.EphemeralOwner != c.s.ID() {
		// The library replaced an expired session under us.
		return nil, zk.ErrSessionExpired
	}
	return newLease(c, uint64(w.stat.Czxid), v.sent, w.ch), nil
}

// watched is a read that set a watch.
type watched struct {
	stat *zk.Stat
	ch   <-chan zk.Event
}

// withdraw ends a candidacy that did not win: ending its session deletes
// its znode in the same step.
func (c *candidacy) withdraw() { c.s.close() }

// ensure creates path and its parents where missing, with our ACL. It
// looks before it creates: creating a znode that exists can be refused by
// its parent's ACL.
func (b *Backend) ensure(ctx context.Context, s *session, path string) error {
	exists, err := call(ctx, s, func(z *zk.Conn) (bool, error) {
		ok, _, err := z.Exists(path)
		return ok, err
	})
	if err != nil || exists {
		return err
	}
	for i := 2; i <= len(path); i++ {
		if i < len(path) && path[i] != '/' {
			continue
		}
		p := path[:i]
		exists, err := call(ctx, s, func(z *zk.Conn) (bool, error) {
			ok, _, err := z.Exists(p)
			return ok, err
		})
		if err != nil {
			return err
		}
		if exists {
			continue
		}
		_, err = call(ctx, s, func(z *zk.Conn) (string, error) { return z.Create(p, nil, zk.FlagPersistent, b.acl) })
		if err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
	}
	return nil
}

// testHookCreate, set by tests only, sees every create of a candidate's
// znode and may change its answer, as a connection that drops would.
var testHookCreate func(z *zk.Conn, prefix, path string, err error) (string, error)

// newGUID is a random (version 4) UUID, as Curator names protected znodes.
func newGUID() string {
	var u [16]byte
	_, _ = rand.Read(u[:])
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}
