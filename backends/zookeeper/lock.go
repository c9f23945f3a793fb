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
// parent's cversion, a signed 32-bit count, so after about 10^9
// candidacies new candidates would sort first (docs/backends/zookeeper.md,
// "Caveats").
var errSequenceWrapped = errors.New("zookeeper: the lock's sequence counter wrapped (2^31 changes to its children): delete the lock's znode while nobody holds it")

// lock is one lock's znode.
type lock struct {
	s   *Store
	dir string
	log *slog.Logger
}

var _ backends.QueueLock = (*lock)(nil)

// Key is the lock's znode.
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

// znode is a Get's answer.
type znode struct {
	data []byte
	stat *zk.Stat
}

// Status: ZooKeeper does not tell how long a session has left.
func (l *lock) Status(ctx context.Context) (backends.Status, error) {
	st := backends.Status{Remaining: -1}
	type leader struct {
		znode
		queued int
		name   string
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
				return leader{znode{data, stat}, len(cs), cs[0].name}, err
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
	// The leader's own znode: what an operator deletes to take the lock.
	st.Held, st.Token, st.Waiting, st.Key = true, uint64(lead.stat.Czxid), lead.queued-1, l.dir+"/"+lead.name
	st.Identity, st.Holders = backends.ParseIdentityValue(string(lead.data))
	return st, nil
}

// Join opens a session whose timeout is the lease duration, and creates
// the candidate's znode in it. With try it lists the candidates first,
// and leaves no trace if there is one. On failure it ends the session,
// and with it a znode whose create lost its answer.
func (l *lock) Join(ctx context.Context, c backends.Claim, try bool) (backends.Ticket, error) {
	s, minTimeout, err := l.s.open(ctx, c.Timings.LeaseDuration)
	if err != nil {
		return nil, err
	}
	cd := &candidacy{l: l, s: s, identity: c.Identity, data: []byte(backends.IdentityValue(c)), guid: newGUID(), try: try,
		ttl: leaseTTL(s.Timeout(), c.Timings.RetryPeriod, minTimeout), Loss: backends.NewLoss()}
	attrs := []any{"identity", c.Identity, "session", fmt.Sprintf("0x%x", s.ID()), "server", s.conn.Server(),
		"session_timeout", s.Timeout(), "lease_ttl", cd.ttl}
	if s.Timeout() != c.Timings.LeaseDuration.Truncate(time.Millisecond) { // the ensemble's bounds
		attrs = append(attrs, "asked", c.Timings.LeaseDuration)
	}
	l.log.Info("zookeeper session opened", attrs...)
	rctx, cancel := context.WithTimeout(ctx, l.s.connectTimeout)
	defer cancel()
	var children []string
	if try {
		children, err = call(rctx, s, func(z *zk.Conn) ([]string, error) {
			children, _, err := z.Children(l.dir)
			return children, ignoreNoNode(err)
		})
	}
	switch {
	case err != nil:
	case len(candidates(children)) > 0:
		err = fmt.Errorf("zookeeper: %s is held by another candidate: %w", l.dir, backends.ErrLocked)
	default:
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

// ReadDoc reads the data of the znode of the document's name in the
// lock's, whose data version is the document's. The library bounds an
// answer to a packet; a document longer than backends.MaxDoc is refused.
func (l *lock) ReadDoc(ctx context.Context, name string) (backends.Doc, error) {
	path := l.dir + "/" + name
	z, err := read(ctx, l.s, "read "+path, func(z *zk.Conn) (znode, error) {
		data, stat, err := z.Get(path)
		return znode{data, stat}, err
	})
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return backends.Doc{Name: name}, nil
	case err == nil && len(z.data) > backends.MaxDoc:
		err = l.s.unavailable("read "+path, fmt.Errorf("%w: %d bytes, more than a document's %d", backends.ErrRefused, len(z.data), backends.MaxDoc))
	case err == nil:
		return backends.Doc{Name: name, Data: z.data, Version: z.stat.Version}, nil
	}
	return backends.Doc{Name: name}, err
}

// WriteDoc creates the lock's znode if need be.
func (l *lock) WriteDoc(ctx context.Context, d backends.Doc) error {
	path, op, err := l.docOp(d)
	if err != nil {
		return err
	}
	_, err = read(ctx, l.s, "write "+path, func(z *zk.Conn) ([]zk.MultiResponse, error) {
		res, err := z.Multi(op)
		if errors.Is(err, zk.ErrNoNode) && d.Version == nil {
			if err = ensure(z, l.dir, l.s.acl); err == nil {
				res, err = z.Multi(op)
			}
		}
		return res, err
	})
	return docError(l.s, path, err)
}

// docOp is the write of d: a set at the version read, or a create.
func (l *lock) docOp(d backends.Doc) (string, any, error) {
	path := l.dir + "/" + d.Name
	if len(d.Data) > backends.MaxDoc {
		return path, nil, fmt.Errorf("zookeeper: %s: %d bytes, more than a document's %d", path, len(d.Data), backends.MaxDoc)
	}
	switch v := d.Version.(type) {
	case nil:
		return path, &zk.CreateRequest{Path: path, Data: d.Data, Acl: l.s.acl, Flags: zk.FlagPersistent}, nil
	case int32:
		return path, &zk.SetDataRequest{Path: path, Data: d.Data, Version: v}, nil
	}
	return path, nil, fmt.Errorf("zookeeper: %s: version %v was not read from ZooKeeper", path, d.Version)
}

// docError: a document created, changed or deleted since it was read is
// backends.ErrConflict.
func docError(s *Store, path string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, zk.ErrBadVersion), errors.Is(err, zk.ErrNodeExists), errors.Is(err, zk.ErrNoNode):
		return fmt.Errorf("zookeeper: %s: %w", path, backends.ErrConflict)
	}
	return s.unavailable("write "+path, err)
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
