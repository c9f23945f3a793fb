package zookeeper

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/leaderrun/leaderrun/backends"
)

// errSequenceWrapped: ZooKeeper numbers a sequential znode with its
// parent's cversion, a signed 32-bit count of changes to its children, so
// after about 10^9 candidacies it names candidates with negative numbers,
// which would sort first. Deleting the lock's znode starts it again
// (czxids, the tokens, go on growing).
var errSequenceWrapped = errors.New("zookeeper: the lock's sequence counter wrapped (2^31 changes to its children): delete the lock's znode while nobody holds it")

// lock is one lock's znode.
type lock struct {
	s   *Store
	dir string
	log *slog.Logger
}

var _ backends.QueueLock = (*lock)(nil)

// Key implements backends.Lock: the lock's znode.
func (l *lock) Key() string { return l.dir }

// candidate is a child of the lock's znode named as Curator names a
// LeaderLatch's protected znodes: a candidate whose create lost its answer
// with its connection finds its znode by its uuid.
type candidate struct {
	name, guid string
	seq        int64
}

const (
	protectedPrefix = "_c_"
	latchName       = "-latch-"
	guidLen         = 36 // a UUID in its canonical text form
)

// candidates picks the candidates among the lock's children, oldest first.
func candidates(children []string) []candidate {
	var cs []candidate
	for _, name := range children {
		rest, ok := strings.CutPrefix(name, protectedPrefix)
		if !ok || len(rest) < guidLen {
			continue
		}
		digits, ok := strings.CutPrefix(rest[guidLen:], latchName)
		if !ok || len(digits) == 0 || len(digits) > 18 || strings.Trim(digits, "0123456789") != "" {
			continue
		}
		seq, _ := strconv.ParseInt(digits, 10, 64)
		cs = append(cs, candidate{name: name, guid: rest[:guidLen], seq: seq})
	}
	slices.SortFunc(cs, func(a, b candidate) int { return cmp.Compare(a.seq, b.seq) })
	return cs
}

// holdersLine starts the second line of a candidate's znode data in a
// pool of more than one holder.
const holdersLine = "holders="

// candidateData is the data of a candidate's znode: its identity (as a
// LeaderLatch's participant id reads), and in a pool of more than one
// holder a second line, "holders=N". An identity holds no line break (the
// CLI refuses control characters), so the two never mix.
func candidateData(c backends.Claim) []byte {
	if c.Holders > 1 {
		return []byte(c.Identity + "\n" + holdersLine + strconv.Itoa(c.Holders))
	}
	return []byte(c.Identity)
}

// parseData reads a candidate's znode data: an identity, and its pool's
// size (0 if none). Data of any other form is an identity, as a whole.
func parseData(data []byte) (identity string, holders int) {
	identity, rest, _ := strings.Cut(string(data), "\n")
	if n, ok := strings.CutPrefix(rest, holdersLine); ok && backends.ParseHolders(n) > 0 {
		return identity, backends.ParseHolders(n)
	}
	return string(data), 0
}

// znode is a Get's answer.
type znode struct {
	data []byte
	stat *zk.Stat
}

// Status implements backends.QueueLock. ZooKeeper does not tell how long
// a session has left.
func (l *lock) Status(ctx context.Context) (backends.Status, error) {
	st := backends.Status{Remaining: -1}
	type leader struct {
		znode
		queued int
	}
	lead, err := read(ctx, l.s, "read the leader of "+l.dir, func(z *zk.Conn) (leader, error) {
		for range 3 { // a leader that went between the two reads: again
			children, _, err := z.Children(l.dir)
			cs := candidates(children)
			if err != nil || len(cs) == 0 {
				return leader{}, err
			}
			data, stat, err := z.Get(l.dir + "/" + cs[0].name)
			if !errors.Is(err, zk.ErrNoNode) {
				return leader{znode{data, stat}, len(cs)}, err
			}
		}
		return leader{}, errors.New("the leader changed at every read")
	})
	switch {
	case errors.Is(err, zk.ErrNoNode), err == nil && lead.queued == 0:
		st.Waiting = 0
		return st, nil
	case err != nil:
		return st, err
	}
	st.Held, st.Token, st.Waiting = true, uint64(lead.stat.Czxid), lead.queued-1
	st.Identity, st.Holders = parseData(lead.data)
	return st, nil
}

// Join implements backends.QueueLock: a session whose timeout is the
// lease duration, and the candidate's znode in it, within the connect
// timeout. With try it lists the candidates first, and leaves no trace if
// there is one. On failure it ends the session, and with it a znode whose
// create lost its answer.
func (l *lock) Join(ctx context.Context, c backends.Claim, try bool) (backends.Ticket, error) {
	s, minTimeout, err := l.s.open(ctx, c.Timings.LeaseDuration)
	if err != nil {
		return nil, err
	}
	cd := &candidacy{l: l, s: s, identity: c.Identity, data: candidateData(c), guid: newGUID(), try: try,
		ttl: leaseTTL(s.Timeout(), c.Timings.RetryPeriod, minTimeout), Loss: backends.NewLoss()}
	attrs := []any{"identity", c.Identity, "session", fmt.Sprintf("0x%x", s.ID()), "server", s.conn.Server(),
		"session_timeout", s.Timeout(), "lease_ttl", cd.ttl}
	if s.Timeout() != c.Timings.LeaseDuration.Truncate(time.Millisecond) { // the ensemble's bounds
		attrs = append(attrs, "asked", c.Timings.LeaseDuration)
	}
	l.log.Info("zookeeper session opened", attrs...)
	rctx, cancel := context.WithTimeout(ctx, l.s.connectTimeout)
	defer cancel()
	if try {
		err = cd.tryEnter(rctx)
	} else {
		err = cd.create(rctx)
	}
	if err != nil {
		l.s.closeLater(s)
		if !errors.Is(err, backends.ErrLocked) {
			err = l.s.failed(ctx, rctx, "create a candidate in "+l.dir, err)
		}
		return nil, err
	}
	return cd, nil
}

// open opens a candidacy's session, learning meanwhile, the first time,
// the ensemble's minimum session timeout (see leaseTTL).
func (st *Store) open(ctx context.Context, timeout time.Duration) (*session, time.Duration, error) {
	var minTimeout time.Duration
	probed := make(chan error, 1)
	go func() {
		var err error
		minTimeout, err = st.minSessionTimeout(ctx)
		probed <- err
	}()
	s, err := st.connect(ctx, timeout, min(timeout, st.connectTimeout))
	if perr := <-probed; err == nil && perr != nil {
		st.closeLater(s)
		err = perr
	}
	return s, minTimeout, err
}

// tryEnter queues the candidate only if nobody is queued.
func (cd *candidacy) tryEnter(ctx context.Context) error {
	children, err := call(ctx, cd.s, func(z *zk.Conn) ([]string, error) {
		children, _, err := z.Children(cd.l.dir)
		return children, err
	})
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		return err
	}
	if len(candidates(children)) > 0 {
		return fmt.Errorf("zookeeper: %s is held by another candidate: %w", cd.l.dir, backends.ErrLocked)
	}
	return cd.create(ctx)
}

// Lead implements backends.Ticket: it waits, watching the candidate just
// ahead of ours, until ours is first, and queues again if someone deleted
// our znode. After a failed request (ErrUnavailable) the driver calls it
// again: our znode lives as long as the session. With try it answers
// within the connect timeout.
func (cd *candidacy) Lead(ctx context.Context) (backends.Grant, error) {
	rctx := ctx
	if cd.try {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(ctx, cd.l.s.connectTimeout)
		defer cancel()
	}
	for {
		v, err := cd.look(rctx)
		switch {
		case err != nil:
		case v.ours == "":
			err = cd.create(rctx) // deleted by hand, maybe with the lock's znode
		case v.rank == 0:
			var won bool
			if won, err = cd.win(rctx, v.sent); won {
				return cd, nil
			}
		case cd.try:
			return nil, fmt.Errorf("zookeeper: %s was taken first by another candidate: %w", cd.l.dir, backends.ErrLocked)
		default:
			err = cd.wait(rctx, v.ahead)
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

// Leave implements backends.Ticket: ending the session deletes our znode
// (the library waits a second for the ensemble's answer; one out of reach
// expires the session after its timeout).
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
		if v, err := cd.look(ctx); err != nil || v.ours != "" {
			return err
		}
	}
	return fmt.Errorf("create %s: the connection kept dropping", prefix)
}

// view is the queue as one read saw it.
type view struct {
	sent  time.Time // send time of the sync the read followed
	ours  string    // our znode's name; "" if it is gone
	rank  int       // our place in the queue, 0 if we lead
	ahead string    // the candidate just ahead of ours
}

// look reads the queue after a sync, so as to see the ensemble's state
// after sent, not a lagging server's. Our oldest znode is ours; any other
// with our guid is a retried create that landed after all, and goes.
func (cd *candidacy) look(ctx context.Context) (view, error) {
	v := view{sent: time.Now()}
	cs, err := call(ctx, cd.s, func(z *zk.Conn) ([]candidate, error) {
		if _, err := z.Sync(cd.l.dir); err != nil {
			return nil, err
		}
		children, _, err := z.Children(cd.l.dir)
		return candidates(children), err
	})
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		return v, err
	}
	for i, c := range cs {
		switch {
		case c.guid != cd.guid:
		case v.ours == "":
			v.ours, v.rank, cd.name = c.name, i, c.name
			if i > 0 {
				v.ahead = cs[i-1].name
			}
		default:
			_, _ = call(ctx, cd.s, func(z *zk.Conn) (struct{}, error) { return struct{}{}, z.Delete(cd.l.dir+"/"+c.name, -1) })
		}
	}
	return v, nil
}

// wait waits until the candidate ahead of ours changes, our session
// expires, or ctx ends. A data watch, as Curator's: an exists watch on a
// znode already gone would wait for a creation that never comes.
func (cd *candidacy) wait(ctx context.Context, ahead string) error {
	ch, err := call(ctx, cd.s, func(z *zk.Conn) (<-chan zk.Event, error) {
		_, _, ch, err := z.GetW(cd.l.dir + "/" + ahead)
		return ch, err
	})
	if err != nil {
		return ignoreNoNode(err)
	}
	select {
	case <-ch:
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

// ensure creates path and its parents where missing. It looks before it
// creates: creating a znode that exists can be refused by its parent's ACL.
func ensure(z *zk.Conn, path string, acl []zk.ACL) error {
	for i := 2; i <= len(path); i++ {
		if i < len(path) && path[i] != '/' {
			continue
		}
		exists, _, err := z.Exists(path[:i])
		if err == nil && !exists {
			_, err = z.Create(path[:i], nil, zk.FlagPersistent, acl)
		}
		if err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
	}
	return nil
}

// testHookCreate, set by tests, may change a candidate's create's answer.
var testHookCreate func(z *zk.Conn, prefix, path string, err error) (string, error)

// newGUID is 128 random bits in a UUID's text form, as Curator names
// protected znodes (and as every leaderrun release parses them).
func newGUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// probeTimeout is the session timeout asked to learn the ensemble's
// minimum session timeout, to which a server raises it. A smaller minimum
// goes unseen, which only widens the margin (leaseTTL); a smaller probe
// would make the library's deadlines before the answer too short.
const probeTimeout = 100 * time.Millisecond

// leaseTTL is how long after the send time of an acknowledged renewal the
// runner may count on a session of negotiated timeout T, renewed every
// retry (zero: unknown), on an ensemble whose minimum session timeout is
// minTimeout: T − min(retry, T/3) − minTimeout/4. An ensemble's leader
// times a session from the contacts its followers report, every half tick
// (a quarter of the default minimum), and a follower cut off from it just
// after a renewal never reports it; the last contact it did report came up
// to the retry period, or the library's ping interval T/3, before
// (docs/safety.md, "ZooKeeper: an ensemble may expire a session early").
// The result is at least 1 ns: a zero TTL means one that never expires.
func leaseTTL(timeout, retry, minTimeout time.Duration) time.Duration {
	contact := timeout / 3
	if retry > 0 && retry < contact {
		contact = retry
	}
	return max(timeout-contact-minTimeout/4, time.Nanosecond)
}

// minSessionTimeout is the ensemble's minimum session timeout, learned once
// per store from a session that asks for probeTimeout and is closed at
// once. A failure wraps backends.ErrUnavailable (or is ctx's error).
func (st *Store) minSessionTimeout(ctx context.Context) (time.Duration, error) {
	if d := time.Duration(st.minTimeout.Load()); d > 0 {
		return d, nil
	}
	s, err := st.connect(ctx, probeTimeout, st.connectTimeout)
	if err != nil {
		return 0, err
	}
	d := s.Timeout()
	st.closeLater(s)
	st.minTimeout.Store(int64(d))
	return d, nil
}
