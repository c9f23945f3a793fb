// Package zookeeper is the ZooKeeper backend: the election recipe of the
// ZooKeeper documentation, as Apache Curator packages it in LeaderLatch.
//
// # Znodes
//
// A lock lives in one persistent znode, /<prefix><lock> (prefix
// "leaderrun/": /leaderrun/<lock>), created with its parents when missing.
// Its children are:
//
//	_c_<uuid>-latch-<seq>   one ephemeral sequential znode per candidate,
//	                        holding the candidate's identity (and in a pool
//	                        of N > 1 holders a second line, holders=N)
//	done/<key>              persistent completion markers (JSON), one per once-key
//	history/term-<seq>      persistent sequential terms (JSON), about the last 100
//
// The candidate with the lowest sequence number leads. Every other candidate
// watches only the candidate just ahead of it, so a change wakes one
// waiter, not all of them (no herd); a woken waiter reads the children
// again, since a predecessor that went away does not mean that it leads
// now (a waiter in between may have withdrawn). Only children named like a
// candidate are candidates: done and history can never be taken for one,
// and because they are children of the lock's own znode, locks "a" and
// "a.done" cannot meet. The names are Curator's protected names
// (_c_<uuid>-), so that a candidate whose create lost its answer when a
// connection dropped finds its znode by its uuid instead of creating a
// second one; any other znode with its uuid (a create that landed late) is
// deleted when the candidate next reads the children, and at the latest
// when its session ends. They are the names a Curator LeaderLatch gives
// its own candidates, so a LeaderLatch on the same path should take part
// in the same election (not tested: the tests have no Curator).
//
// # Fencing token
//
// The token is the czxid of the leader's znode: the zxid of the
// transaction that created it. The ensemble's zxid only grows (the epoch
// in its high 32 bits grows with every ensemble leader, the counter below
// with every transaction), and a candidate leads only once every candidate
// created before it is gone, so every leader's token is greater than that
// of every leader before it. Sequence numbers are not the token: deleting
// /<prefix><lock> by hand starts them again at zero, but every znode
// created afterwards still has a greater czxid.
//
// # Sessions and timeouts
//
// Each campaign opens its own connection and ZooKeeper session, with the
// lease duration asked by the runner (CampaignOptions.LeaseDuration) as the
// session timeout; the ensemble clamps it to its minimum and maximum
// session timeouts (2 and 20 ticks by default). Connecting in Campaign
// rather than in New keeps the lease duration in the one place the runner
// sets it, at no cost in start-up latency: the CLI campaigns right after
// it builds the backend. Ending the session when the lease is released (or
// the campaign withdrawn) deletes every ephemeral znode it owns in the
// same step, so no candidate of ours outlives its campaign.
//
// The slots of a pool (--holders) are locks of their own, znodes
// /<prefix><lock>.slot<i> beside the lock's (Backend.Slot). Status,
// History and Completed of every slot read through one session; each
// candidacy still opens its own, whatever its slot, because the session
// is the lease: one session shared by several slots would end all their
// leases when it ends, and a candidate's znode that could not be deleted
// would keep its slot blocked for as long as a sibling kept the session.
//
// Renew sends a sync through the ensemble leader and then reads the
// leader's znode: the answer proves that the znode, and so the session,
// still existed in the ensemble's committed state after the send time. A
// missing znode is ErrLeaseLost. Like any request, these two count as
// contact for the session's timeout; the client library keeps the session
// alive with its own pings anyway (every third of the timeout), so what
// Renew adds is the proof the runner counts its deadline from. At the
// default timings a leader sends 1.2 requests a second, a waiting
// candidate 0.2 (its pings).
//
// Lease.TTL is not the negotiated timeout T but what the runner may count
// on from a renewal's send time: in an ensemble, the ensemble leader times
// a session from the last contact that the client's server reported to
// it, and followers report contacts every half tick. If the link between
// that server and the ensemble leader fails just after a renewal, the
// report of the renewal is lost, and the session may expire up to the
// retry period (or a third of the timeout, the library's ping interval, if
// shorter) plus half a tick earlier than send time + T. So
//
//	TTL = T − min(Config.RetryPeriod, T/3) − minSessionTimeout/4
//
// where the minimum session timeout (two ticks by default, so a quarter
// of it is half a tick) is learned once per backend, while the first
// campaign connects, from a session that asks for 100 ms and is closed at
// once. The runner checks TTL > renew-deadline + kill-grace, so timings
// that the ensemble cannot keep are refused; with a tick of 2 s and a
// retry period of 2 s the lease duration must exceed renew-deadline +
// kill-grace + 3 s. See leaseTTL, and docs/safety.md.
//
// Disconnected is not a loss: the client reconnects, to another server if
// need be, and the session with its znodes survives if that happens within
// the timeout. Until then renewals fail and the runner's deadline runs.
// The session is lost when the client reports it expired (it learns that
// when it reconnects after the timeout) or when anyone deletes the
// leader's znode; a watch reports both at once and Lost is closed (S3).
//
// # ACLs
//
// With digest authentication (Config.Digest) every znode the backend
// creates, the lock's parents included, gets CREATOR_ALL (all permissions
// for the authenticated identity) plus READ for everyone: anyone who can
// reach the ensemble can see who holds a lock and read its history
// (identities and exit statuses, nothing secret), as leaderrun status
// expects, and only the credentials' owner can campaign, delete a candidate
// or write a marker. A wrong password is refused like a missing one:
// ZooKeeper accepts any digest credentials and checks them against each
// znode's ACL. Existing znodes keep their ACLs. Without authentication
// ZooKeeper offers no way to restrict anything, so the znodes are open to
// every client (OPEN_ACL_UNSAFE): any client can then delete the leader's
// znode, which the leader reports as a loss.
//
// # Markers and history
//
// Complete writes done/<key> in one multi-operation transaction with a
// version check of the leader's own znode, so that it succeeds only while
// the znode, and so the session and the leadership, exist. A marker keeps
// its expiry in its data: Completed ignores an expired marker, and
// Complete deletes expired ones (ZooKeeper's TTL znodes would need
// extendedTypesEnabled on every server, which is off by default). Release
// deletes the leader's znode and appends its term to history in one
// transaction, pruning the oldest terms beyond about 100 in the same one;
// after a loss it appends the term alone.
package zookeeper

import (
	"cmp"
	"context"
	"encoding/json"
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

// DefaultConnectTimeout is the default of Config.ConnectTimeout.
const DefaultConnectTimeout = 5 * time.Second

const (
	// readerTimeout is the session timeout of the connection that Status
	// and History read with: it owns no znode, so it hardly matters.
	readerTimeout = 10 * time.Second

	// maxPacket bounds what the client receives in one packet, as the
	// server bounds it by default (jute.maxbuffer, 1 MiB): a child list
	// or a znode's data as large as the server keeps can be read. The
	// library allocates a buffer of this size per connection.
	maxPacket = 1 << 20

	// maxRequest is the library's send buffer per connection, which bounds
	// one request. leaderrun's largest requests are a history term (a few
	// KiB: an identity of at most 256 bytes, a reason, a once-key of at most
	// 128) with at most maxPruned deletions beside it; the library's
	// default, 1.5 MiB, and the 1 MiB this package once set, cost about
	// 1 MiB of memory per instance for nothing (measured: 5.4 MiB of
	// anonymous memory for a leader with a 1 MiB buffer, 4.2 with this
	// one). A request that did not fit would fail, with the library's
	// "buffer too small", without being sent.
	maxRequest = 64 << 10

	// maxPruned bounds the old history terms deleted in the transaction
	// that appends a term, so that the transaction fits maxRequest; a
	// backlog (a history written with a larger limit) shrinks by as many
	// per term.
	maxPruned = 16

	// maxConnectAnswer bounds the server's answer to the connect request
	// (41 bytes in every protocol version): the library reads that answer
	// into a buffer of whatever length the server announces.
	maxConnectAnswer = 1 << 10
)

// Config describes one lock in one ZooKeeper ensemble. The zero value of
// each field is noted.
type Config struct {
	// Servers are the client addresses of the ensemble's servers,
	// host:port (port 2181 if left out). Required. A chroot suffix
	// (host:port/path) is not supported: use Prefix.
	Servers []string

	// Digest authenticates with ZooKeeper's digest scheme, and makes the
	// znodes the backend creates writable by this identity only (see the
	// package doc). Zero: no authentication, and the znodes are open to
	// every client.
	Digest Digest

	// Prefix and Lock name the lock's znode: /<Prefix><Lock>. Lock is
	// required; see backends.ValidateLockName.
	Prefix, Lock string

	// ConnectTimeout bounds the wait for a session, and every request made
	// before a candidate is queued: a store that does not answer within it
	// is ErrUnavailable. Zero: 5 s.
	ConnectTimeout time.Duration

	// RetryPeriod is how often the runner renews a lease (--retry-period).
	// The longer it is, the earlier than "send time + session timeout" an
	// ensemble may expire a session whose follower was cut off from the
	// ensemble leader, and the shorter the TTL that a lease reports (see
	// the package doc). Zero: a third of the session timeout, the client
	// library's ping interval, which bounds it whatever the runner does.
	RetryPeriod time.Duration

	// Log receives a line when a lease's connection drops or comes back,
	// and when a waiting candidate has to campaign again. Nil: nothing is
	// logged. The client library itself never logs.
	Log *slog.Logger
}

// Digest is a credential of ZooKeeper's digest scheme. It never shows its
// password when printed.
type Digest struct {
	User, Password string
}

// ParseDigest reads "user:password", as an auth file holds it (the first
// colon separates them; a final newline is ignored, any other line break
// refused).
func ParseDigest(s string) (Digest, error) {
	s = strings.TrimRight(s, "\r\n")
	user, password, ok := strings.Cut(s, ":")
	if !ok || user == "" || strings.ContainsAny(s, "\r\n") {
		return Digest{}, errors.New("zookeeper: digest credentials must be one line user:password")
	}
	return Digest{User: user, Password: password}, nil
}

// String shows the user only.
func (d Digest) String() string {
	if d.User == "" {
		return "none"
	}
	return d.User + ":<redacted>"
}

// GoString shows the user only.
func (d Digest) GoString() string { return "zookeeper.Digest{" + d.String() + "}" }

// Backend campaigns for one lock in one ZooKeeper ensemble.
type Backend struct {
	servers        []string
	list           string // the servers, for messages
	digest         Digest
	acl            []zk.ACL
	base           string // the lock's znode without the lock: "/" + prefix
	lock           string
	dir            string // the lock's znode
	connectTimeout time.Duration
	retry          time.Duration
	log            *slog.Logger
	logBase        *slog.Logger // log, without the lock
	wakes          atomic.Uint64
	minTimeout     atomic.Int64 // the ensemble's minimum session timeout, in ns, once learned

	mu   sync.Mutex
	held *lease // the lease held now, for Status's TTL

	// rmu is held while the reader connects, which can take the connect
	// timeout: nothing else waits for it.
	rmu    sync.Mutex
	reader *session // Status, History and Completed, connected on first use
	closed bool

	bg sync.WaitGroup // closes of sessions left to finish in the background

	// root is the backend this one is a slot of (see Slot), nil for one
	// that New made: the reading session and what is learned of the
	// ensemble are root's.
	root *Backend
}

var _ backends.Backend = (*Backend)(nil)

// New returns a backend for cfg.Lock. It does not connect: each campaign
// opens its own session, and Status and History connect on first use; an
// ensemble that cannot be reached shows there as an error wrapping
// backends.ErrUnavailable.
func New(cfg Config) (*Backend, error) {
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
	if err := backends.ValidateLockName(cfg.Lock); err != nil {
		return nil, fmt.Errorf("zookeeper: %w", err)
	}
	base := "/" + strings.TrimLeft(cfg.Prefix, "/")
	dir := base + cfg.Lock
	if err := validatePath(dir); err != nil {
		return nil, fmt.Errorf("zookeeper: prefix %q: %w", cfg.Prefix, err)
	}
	if cfg.Digest != (Digest{}) && cfg.Digest.User == "" {
		return nil, errors.New("zookeeper: digest credentials without a user")
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = DefaultConnectTimeout
	}
	if cfg.RetryPeriod < 0 {
		return nil, fmt.Errorf("zookeeper: retry period %v is negative", cfg.RetryPeriod)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	acl := zk.WorldACL(zk.PermAll)
	if cfg.Digest.User != "" {
		acl = append(zk.AuthACL(zk.PermAll), zk.WorldACL(zk.PermRead)...)
	}
	return &Backend{
		servers:        slices.Clone(cfg.Servers),
		list:           backends.Redact(strings.Join(cfg.Servers, ",")),
		digest:         cfg.Digest,
		acl:            acl,
		base:           base,
		lock:           cfg.Lock,
		dir:            dir,
		connectTimeout: cfg.ConnectTimeout,
		retry:          cfg.RetryPeriod,
		log:            cfg.Log.With("backend", "zookeeper", "lock", cfg.Lock),
		logBase:        cfg.Log.With("backend", "zookeeper"),
	}, nil
}

// validatePath accepts what ZooKeeper accepts as a znode path, leaving out
// the system tree.
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

// Name implements backends.Backend.
func (b *Backend) Name() string { return "zookeeper" }

// Wakes counts how often a waiting candidate of this backend was woken by
// the watch on the candidate ahead of it. A release or withdrawal wakes one
// waiter; tests read it to show that no change wakes a herd.
func (b *Backend) Wakes() uint64 { return b.wakes.Load() }

// Slot implements backends.Backend: slot i is the lock
// backends.SlotLock(lock, i), a znode of its own beside the lock's, whose
// Status, History and Completed read through b's session. Each candidacy
// opens a session of its own whatever the slot (see the package doc):
// ZooKeeper's session is the lease.
func (b *Backend) Slot(i int) backends.Backend {
	r := b.top()
	if i == 0 {
		return r
	}
	lock := backends.SlotLock(r.lock, i)
	return &Backend{
		servers:        r.servers,
		list:           r.list,
		digest:         r.digest,
		acl:            r.acl,
		base:           r.base,
		lock:           lock,
		dir:            r.base + lock,
		connectTimeout: r.connectTimeout,
		retry:          r.retry,
		log:            r.logBase.With("lock", lock),
		logBase:        r.logBase,
		root:           r,
	}
}

// top is the backend that New made: b, or the one b is a slot of.
func (b *Backend) top() *Backend {
	if b.root != nil {
		return b.root
	}
	return b
}

// Close implements backends.Backend: it ends the session that Status,
// History and Completed read with, unless b is a slot backend, which
// reads with its root's; either way it waits for the sessions its own
// campaigns left to close. Leases must be released first.
func (b *Backend) Close() error {
	if b.root != nil {
		b.bg.Wait()
		return nil
	}
	b.rmu.Lock()
	r := b.reader
	b.reader, b.closed = nil, true
	b.rmu.Unlock()
	if r != nil {
		r.close()
	}
	b.bg.Wait()
	return nil
}

// Paths of the lock's children.
func (b *Backend) doneDir() string    { return b.dir + "/done" }
func (b *Backend) historyDir() string { return b.dir + "/history" }

// readSession is the session Status, History and Completed read with,
// connected on first use and again if the last one expired; one for a
// backend and its slots.
func (b *Backend) readSession(ctx context.Context) (*session, error) {
	if b.root != nil {
		return b.root.readSession(ctx)
	}
	b.rmu.Lock()
	defer b.rmu.Unlock()
	if b.closed {
		return nil, fmt.Errorf("zookeeper %s: %s: backend closed", b.list, b.dir)
	}
	if b.reader != nil {
		select {
		case <-b.reader.expired:
			b.closeLater(b.reader)
			b.reader = nil
		default:
			return b.reader, nil
		}
	}
	s, err := b.connect(ctx, readerTimeout)
	if err != nil {
		return nil, err
	}
	b.reader = s
	return s, nil
}

// closeLater ends a session without waiting for it; Close waits.
func (b *Backend) closeLater(s *session) {
	b.bg.Go(s.close)
}

// candidate is one child of the lock's znode that is a candidate.
type candidate struct {
	name string
	guid string
	seq  int64
}

// Candidates' names: Curator's protected prefix, then LeaderLatch's name.
const (
	protectedPrefix = "_c_"
	latchName       = "-latch-"
	guidLen         = 36 // a UUID in its canonical text form
)

// candidates picks the candidates among the lock's children, oldest first.
func candidates(children []string) []candidate {
	var cs []candidate
	for _, name := range children {
		if c, ok := parseCandidate(name); ok {
			cs = append(cs, c)
		}
	}
	slices.SortFunc(cs, func(a, b candidate) int { return cmp.Compare(a.seq, b.seq) })
	return cs
}

func parseCandidate(name string) (candidate, bool) {
	rest, ok := strings.CutPrefix(name, protectedPrefix)
	if !ok || len(rest) < guidLen {
		return candidate{}, false
	}
	guid, rest := rest[:guidLen], rest[guidLen:]
	digits, ok := strings.CutPrefix(rest, latchName)
	if !ok || len(digits) == 0 || len(digits) > 18 {
		return candidate{}, false
	}
	var seq int64
	for _, d := range digits {
		if d < '0' || d > '9' {
			return candidate{}, false
		}
		seq = seq*10 + int64(d-'0')
	}
	return candidate{name: name, guid: guid, seq: seq}, true
}

// Status implements backends.Backend. It lists the candidates and reads
// the leader's znode; the time left on a session is not something
// ZooKeeper tells, and the granted timeout is known only for a lease held
// through this backend.
func (b *Backend) Status(ctx context.Context) (backends.Status, error) {
	st := backends.Status{Lock: b.lock, Backend: b.Name(), Key: b.dir, Remaining: -1, Waiting: -1}
	s, err := b.readSession(ctx)
	if err != nil {
		return st, err
	}
	rctx, cancel := context.WithTimeout(ctx, b.connectTimeout)
	defer cancel()
	// A leader that goes between the two reads: read again.
	for range 3 {
		children, err := call(rctx, s, func(z *zk.Conn) ([]string, error) {
			children, _, err := z.Children(b.dir)
			return children, err
		})
		if errors.Is(err, zk.ErrNoNode) {
			st.Waiting = 0
			return st, nil
		}
		if err != nil {
			return st, b.failed(ctx, rctx, "list "+b.dir, err)
		}
		cs := candidates(children)
		st.Waiting = 0
		if len(cs) == 0 {
			return st, nil
		}
		path := b.dir + "/" + cs[0].name
		z, err := call(rctx, s, func(z *zk.Conn) (znode, error) {
			data, stat, err := z.Get(path)
			return znode{data, stat}, err
		})
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			return st, b.failed(ctx, rctx, "read "+path, err)
		}
		st.Held = true
		st.Key = path
		st.Identity, st.Holders = parseData(z.data)
		st.Token = uint64(z.stat.Czxid)
		st.Waiting = len(cs) - 1
		b.mu.Lock()
		if b.held != nil && b.held.path() == path {
			st.TTL = b.held.TTL()
		}
		b.mu.Unlock()
		return st, nil
	}
	return st, b.unavailable("read the leader of "+b.dir, errors.New("the leader changed at every read"))
}

// znode is a Get's answer.
type znode struct {
	data []byte
	stat *zk.Stat
}

// History implements backends.Backend.
func (b *Backend) History(ctx context.Context, limit int) ([]backends.Term, error) {
	s, err := b.readSession(ctx)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, b.connectTimeout)
	defer cancel()
	terms, err := readTerms(rctx, s, b.historyDir())
	if err != nil {
		return nil, b.failed(ctx, rctx, "read "+b.historyDir(), err)
	}
	return backends.NewestFirst(terms, limit), nil
}

// readTerms reads every term in dir, in parallel. A term deleted meanwhile
// (pruned by a writer) is left out.
func readTerms(ctx context.Context, s *session, dir string) ([]backends.Term, error) {
	names, err := call(ctx, s, func(z *zk.Conn) ([]string, error) {
		children, _, err := z.Children(dir)
		return children, err
	})
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	type read struct {
		term backends.Term
		ok   bool
		err  error
	}
	reads := make([]read, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() {
			data, err := call(ctx, s, func(z *zk.Conn) ([]byte, error) {
				data, _, err := z.Get(dir + "/" + name)
				return data, err
			})
			switch {
			case errors.Is(err, zk.ErrNoNode):
			case err != nil:
				reads[i].err = err
			default:
				// A term that does not parse is not ours to show.
				reads[i].ok = json.Unmarshal(data, &reads[i].term) == nil
			}
		})
	}
	wg.Wait()
	var terms []backends.Term
	for _, r := range reads {
		if r.err != nil {
			return nil, r.err
		}
		if r.ok {
			terms = append(terms, r.term)
		}
	}
	return terms, nil
}

// failed turns the error of a request made before leadership, on rctx
// (ctx bounded by the connect timeout), into the error to return: ctx's
// own if it ended, else one wrapping backends.ErrUnavailable.
func (b *Backend) failed(ctx, rctx context.Context, op string, err error) error {
	switch {
	case ctx.Err() != nil:
		return b.ended(ctx, op)
	case rctx.Err() != nil:
		// Not wrapped: a deadline error would read as the caller's own.
		err = fmt.Errorf("no answer within the connect timeout (%v)", b.connectTimeout)
	}
	return b.unavailable(op, err)
}

// ended is the error of a request cut short because ctx ended: a
// cancel is ctx's error alone; a deadline that passed (status --timeout)
// is still ctx's error, wrapped in one that names the servers and wraps
// backends.ErrUnavailable.
func (b *Backend) ended(ctx context.Context, op string) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("zookeeper %s: %s: no answer before the deadline: %w: %w", b.list, op, backends.ErrUnavailable, ctx.Err())
	}
	return ctx.Err()
}

func (b *Backend) unavailable(op string, err error) error {
	if refused(err) {
		op += ": refused"
	}
	return fmt.Errorf("zookeeper %s: %s: %w: %w", b.list, op, backends.ErrUnavailable, err)
}

// refused reports whether ZooKeeper turned a request down for a reason that
// trying again cannot fix: missing permissions (which is also how a wrong
// digest password shows: ZooKeeper accepts any credentials and checks them
// against each znode's ACL) or failed authentication.
func refused(err error) bool {
	return errors.Is(err, zk.ErrNoAuth) || errors.Is(err, zk.ErrAuthFailed) || errors.Is(err, zk.ErrInvalidACL)
}
