// Package zookeeper is the ZooKeeper store: a backends.QueueLock on the
// election recipe of the ZooKeeper documentation, as Apache Curator's
// LeaderLatch packages it. The token is the czxid of the leader's znode.
// In ZooKeeper the session is the lease, so each candidacy has a session
// of its own; what needs no lease (status, documents) reads through one
// more. The library pings a session by protocol, so a renewal extends
// nothing: it proves that the leader's znode, and so its session, still
// existed after its send time (docs/safety.md). docs/backends/zookeeper.md
// describes the znodes, argues the token, and gives the bounds.
package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/leaderrun/leaderrun/backends"
)

// Config describes one ZooKeeper ensemble.
type Config struct {
	// Servers are the ensemble's client addresses, host:port (port 2181
	// if left out). Required. A chroot suffix is refused: use Prefix.
	Servers []string
	// Digest authenticates with ZooKeeper's digest scheme, and gives the
	// znodes the store creates all permissions for this identity and READ
	// for everyone (docs/backends/zookeeper.md, "ACLs"). Zero: no
	// authentication, znodes open to every client.
	Digest Digest
	// Prefix starts the path of every lock's znode: /<Prefix><lock>.
	Prefix string
	// ConnectTimeout bounds the wait for a session, and every request
	// made before a candidate is queued. Zero: 5 s.
	ConnectTimeout time.Duration
	// Log receives session events and, at debug level, the client
	// library's own lines. Nil: nothing is logged.
	Log *slog.Logger
}

const (
	// DefaultConnectTimeout is the default of Config.ConnectTimeout.
	DefaultConnectTimeout = 5 * time.Second
	// readerTimeout is the reading session's timeout: it owns no znode.
	readerTimeout = 10 * time.Second
	// readerIdle is how long the reading session stays open unused: a
	// leader reads when it wins and when it releases.
	readerIdle = 2 * time.Second
	// maxPacket bounds what the client receives in one packet, as the
	// server does by default (jute.maxbuffer).
	maxPacket = 1 << 20
	// maxRequest is the library's send buffer per connection, which bounds
	// one request: a document with its path and headers (its default,
	// 1.5 MiB, costs about a MiB per connection for nothing).
	maxRequest = backends.MaxDoc + 4<<10
	// maxConnectAnswer bounds the server's answer to the connect request
	// (41 bytes in every protocol version), which the library reads into
	// a buffer of whatever length the server announces.
	maxConnectAnswer = 1 << 10
)

// Digest is a credential of ZooKeeper's digest scheme. It never shows its
// password when printed.
type Digest struct{ User, Password string }

func (d Digest) String() string {
	if d.User == "" {
		return "none"
	}
	return d.User + ":<redacted>"
}

func (d Digest) GoString() string { return "zookeeper.Digest{" + d.String() + "}" }

// Store is one ZooKeeper ensemble.
type Store struct {
	servers        []string
	list           string // the servers, for messages
	digest         Digest
	acl            []zk.ACL
	base           string // "/" + prefix
	connectTimeout time.Duration
	log            *slog.Logger
	wakes          atomic.Uint64  // waiters woken by the watch on the one ahead (tests count the herd)
	minTimeout     atomic.Int64   // the ensemble's minimum session timeout, in ns, once learned
	bg             sync.WaitGroup // closes of sessions left to finish in the background

	rmu     sync.Mutex // held while the reader connects
	reader  *session   // for status and documents
	reading int        // reads under way
	idle    *time.Timer
	closed  bool
}

var _ backends.Store = (*Store)(nil)

// Open returns the store of cfg's ensemble. It does not connect.
func Open(cfg Config) (*Store, error) {
	if len(cfg.Servers) == 0 {
		return nil, errors.New("zookeeper: no servers")
	}
	for _, s := range cfg.Servers {
		if strings.Contains(s, "/") {
			return nil, fmt.Errorf("zookeeper: server %q: a chroot is not supported, use the prefix", backends.Redact(s))
		}
		if strings.Contains(s, "@") {
			return nil, fmt.Errorf("zookeeper: server %q: want host:port, without user information (use the auth file)", backends.Redact(s))
		}
		if _, _, err := net.SplitHostPort(zk.FormatServers([]string{s})[0]); err != nil {
			return nil, fmt.Errorf("zookeeper: server %q: want host:port", s)
		}
	}
	base := "/" + strings.TrimLeft(cfg.Prefix, "/")
	// Lock names are [A-Za-z0-9._-], never "." or "..": only the prefix
	// can make a path that ZooKeeper refuses.
	if err := validatePath(base + "lock"); err != nil {
		return nil, fmt.Errorf("zookeeper: prefix %q: %w", cfg.Prefix, err)
	}
	if cfg.Digest != (Digest{}) && cfg.Digest.User == "" {
		return nil, errors.New("zookeeper: digest credentials without a user")
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = DefaultConnectTimeout
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	acl := zk.WorldACL(zk.PermAll)
	if cfg.Digest.User != "" {
		acl = append(zk.AuthACL(zk.PermAll), zk.WorldACL(zk.PermRead)...)
	}
	return &Store{servers: slices.Clone(cfg.Servers), list: backends.Redact(strings.Join(cfg.Servers, ",")),
		digest: cfg.Digest, acl: acl, base: base, connectTimeout: cfg.ConnectTimeout,
		log: cfg.Log.With("backend", "zookeeper")}, nil
}

// validatePath accepts what ZooKeeper accepts as a znode path, but its
// own tree.
func validatePath(p string) error {
	segs := strings.Split(p[1:], "/")
	for _, s := range segs {
		if s == "" || s == "." || s == ".." {
			return fmt.Errorf("znode path %s has an empty, . or .. segment", p)
		}
		for _, r := range s {
			if r < 0x20 || r >= 0x7f && r <= 0x9f || r >= 0xd800 && r <= 0xf8ff || r >= 0xfff0 {
				return fmt.Errorf("znode path %q has a character ZooKeeper refuses", p)
			}
		}
	}
	if segs[0] == "zookeeper" {
		return fmt.Errorf("znode path %s is in ZooKeeper's own tree", p)
	}
	return nil
}

func (s *Store) Name() string { return "zookeeper" }

func (s *Store) Lock(name string) backends.Lock {
	return &lock{s: s, dir: s.base + name, log: s.log.With("lock", name)}
}

func (s *Store) Close() error {
	s.rmu.Lock()
	r := s.reader
	s.reader, s.closed = nil, true
	if s.idle != nil {
		s.idle.Stop()
	}
	s.rmu.Unlock()
	if r != nil {
		r.close()
	}
	s.bg.Wait()
	return nil
}

// read runs req on the reading session, connected if need be, bounded by
// the connect timeout. ErrNoNode comes back as it is, any other failure
// as failed makes it.
func read[T any](ctx context.Context, s *Store, op string, req func(*zk.Conn) (T, error)) (T, error) {
	var zero T
	s.rmu.Lock()
	if s.reader != nil && s.reader.isExpired() {
		s.dropReader()
	}
	var err error
	switch {
	case s.closed:
		err = fmt.Errorf("zookeeper %s: store closed", s.list)
	case s.reader == nil:
		s.reader, err = s.connect(ctx, readerTimeout, s.connectTimeout)
	}
	r := s.reader
	if err == nil {
		s.reading++
	}
	s.rmu.Unlock()
	if err != nil {
		return zero, err
	}
	defer s.doneReading()
	rctx, cancel := context.WithTimeout(ctx, s.connectTimeout)
	defer cancel()
	v, err := call(rctx, r, req)
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		err = s.failed(ctx, rctx, op, err)
	}
	return v, err
}

// doneReading closes the reader once no read used it for readerIdle.
func (s *Store) doneReading() {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	if s.reading--; s.reading > 0 || s.closed {
		return
	}
	if s.idle != nil {
		s.idle.Stop()
	}
	s.idle = time.AfterFunc(readerIdle, func() {
		s.rmu.Lock()
		defer s.rmu.Unlock()
		if s.reading == 0 && !s.closed {
			s.dropReader()
		}
	})
}

func (s *Store) dropReader() { // rmu held
	if s.reader != nil {
		s.closeLater(s.reader)
		s.reader = nil
	}
}

// closeLater ends a session without waiting for it; Close waits.
func (s *Store) closeLater(r *session) { s.bg.Go(r.close) }

// failed is the error of a request made on rctx, ctx bounded by the
// connect timeout: ctx's own if it was cancelled, else one that wraps
// backends.ErrUnavailable (and ctx's error if its deadline passed:
// status --timeout).
func (s *Store) failed(ctx, rctx context.Context, op string, err error) error {
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return fmt.Errorf("zookeeper %s: %s: no answer before the deadline: %w: %w", s.list, op, backends.ErrUnavailable, ctx.Err())
	case ctx.Err() != nil:
		return ctx.Err()
	case rctx.Err() != nil:
		// Not wrapped: a deadline error would read as the caller's own.
		err = fmt.Errorf("no answer within the connect timeout (%v)", s.connectTimeout)
	}
	return s.unavailable(op, err)
}

// unavailable wraps err as the store unavailable, and a refusal as final
// too: missing permissions (also how a wrong digest password shows),
// failed authentication, or the lock's sequence counter wrapped.
func (s *Store) unavailable(op string, err error) error {
	switch {
	case errors.Is(err, backends.ErrUnavailable):
		return err
	case errors.Is(err, zk.ErrNoAuth), errors.Is(err, zk.ErrAuthFailed), errors.Is(err, zk.ErrInvalidACL),
		errors.Is(err, errSequenceWrapped), errors.Is(err, backends.ErrRefused):
		return fmt.Errorf("zookeeper %s: %s: refused: %w: %w: %w", s.list, op, backends.ErrUnavailable, backends.ErrRefused, err)
	}
	return fmt.Errorf("zookeeper %s: %s: %w: %w", s.list, op, backends.ErrUnavailable, err)
}
