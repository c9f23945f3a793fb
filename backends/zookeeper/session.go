package zookeeper

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"
)

// session is one connection of the client library and the ZooKeeper
// session it carries. The library reconnects by itself, and after an
// expiry even opens a new session on the same connection: a session here
// is the first one only, and expired is closed once that one is gone.
type session struct {
	conn *zk.Conn

	id       atomic.Int64           // our session's id, from its first connect response
	latestID atomic.Int64           // the id in the latest connect response
	timeout  atomic.Int64           // negotiated timeout, in ns
	dialErr  atomic.Pointer[string] // the latest failed dial or handshake

	handshake time.Duration               // how long a server may take to answer a connect request
	connected chan struct{}               // closed when the session is first established
	expired   chan struct{}               // closed when the session is gone for good
	leader    atomic.Pointer[slog.Logger] // a grant's log, which hears of connections lost and found
	down      atomic.Bool                 // the connection was lost
	connect   func()                      // closes connected, once
	expire    func()                      // closes expired, once
	close     func()                      // ends the session, once

	mu       sync.Mutex
	closed   bool
	requests sync.WaitGroup // requests whose callers stopped waiting
}

// connect opens a session that asks for timeout, and waits at most the
// connect timeout for it. The servers share the time to answer the
// connect request (share), as with the Java client, so that one that
// never answers cannot hold the client.
func (st *Store) connect(ctx context.Context, timeout, share time.Duration) (*session, error) {
	s := &session{connected: make(chan struct{}), expired: make(chan struct{}),
		handshake: max(share/time.Duration(len(st.servers)), 100*time.Millisecond)}
	s.connect = sync.OnceFunc(func() { close(s.connected) })
	s.expire = sync.OnceFunc(func() { close(s.expired) })
	s.close = sync.OnceFunc(s.end)
	conn, _, err := zk.Connect(st.servers, timeout, zk.WithLogger(libraryLog{st.log}), zk.WithLogInfo(false),
		zk.WithEventCallback(s.event), zk.WithDialer(s.dial),
		zk.WithMaxBufferSize(maxPacket), zk.WithMaxConnBufferSize(maxRequest))
	if err != nil {
		return nil, st.unavailable("connect", err)
	}
	s.conn = conn
	t := time.NewTimer(st.connectTimeout)
	defer t.Stop()
	select {
	case <-s.connected:
	case <-ctx.Done():
		st.closeLater(s)
		return nil, st.failed(ctx, ctx, "connect", ctx.Err())
	case <-t.C:
		// Closing waits a second for an answer that cannot come.
		st.closeLater(s)
		cause := "no server answered the connect request"
		if e := s.dialErr.Load(); e != nil {
			cause = *e
		}
		return nil, st.unavailable("connect", fmt.Errorf("no session within the connect timeout (%v): %s", st.connectTimeout, cause))
	}
	if st.digest.User != "" {
		rctx, cancel := context.WithTimeout(ctx, st.connectTimeout)
		defer cancel()
		auth := []byte(st.digest.User + ":" + st.digest.Password)
		if _, err := call(rctx, s, func(z *zk.Conn) (struct{}, error) { return struct{}{}, z.AddAuth("digest", auth) }); err != nil {
			st.closeLater(s)
			return nil, st.failed(ctx, rctx, "authenticate as "+st.digest.User, err)
		}
	}
	return s, nil
}

// ID is the session's id: the ephemeralOwner of our znodes.
func (s *session) ID() int64 { return s.id.Load() }

// Timeout is the session timeout the ensemble granted.
func (s *session) Timeout() time.Duration { return time.Duration(s.timeout.Load()) }

// event is the library's callback, which must not block. A leader's
// connection that drops is only logged: the session survives a
// reconnection within its timeout, and until then the renew deadline runs.
func (s *session) event(ev zk.Event) {
	log := s.leader.Load()
	switch {
	case ev.Type != zk.EventSession:
	case ev.State == zk.StateHasSession:
		latest := s.latestID.Load()
		if !s.id.CompareAndSwap(0, latest) && s.id.Load() != latest {
			s.expire()
		}
		s.connect()
		if s.down.Swap(false) && log != nil {
			log.Info("reconnected to zookeeper", "server", ev.Server)
		}
	case ev.State == zk.StateExpired:
		s.expire()
	case ev.State == zk.StateDisconnected && !s.down.Swap(true) && log != nil:
		log.Warn("connection to zookeeper lost; the session survives a reconnection within its timeout",
			"server", ev.Server, "session_timeout", s.Timeout())
	}
}

func (s *session) isExpired() bool {
	select {
	case <-s.expired:
		return true
	default:
		return false
	}
}

// dial connects to one server for the library, keeping a failure for the
// message of a failed connect.
func (s *session) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		s.failedDial(err.Error())
		return nil, err
	}
	return &sniffer{Conn: c, s: s, deadline: time.Now().Add(s.handshake)}, nil
}

func (s *session) failedDial(e string) { s.dialErr.Store(&e) }

// sniffer reads the fixed part of the connect response, the first thing a
// server sends: length (4 bytes), protocol version (4), timeout in ms (4),
// session id (8), which the library keeps to itself. Until then reads have
// the handshake's deadline (the library's would be far longer), and an
// answer announced longer than maxConnectAnswer is refused before the
// library allocates a buffer for it.
type sniffer struct {
	net.Conn
	s        *session
	deadline time.Time
	head     []byte
	done     bool
}

func (c *sniffer) SetReadDeadline(t time.Time) error {
	if !c.done {
		t = c.deadline
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *sniffer) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.done {
		return n, err
	}
	if err != nil {
		c.s.failedDial(fmt.Sprintf("%s did not answer the connect request: %v", c.RemoteAddr(), err))
	}
	c.head = append(c.head, p[:n]...)
	if len(c.head) >= 4 {
		if size := binary.BigEndian.Uint32(c.head[:4]); size > maxConnectAnswer {
			e := fmt.Sprintf("%s answered the connect request with a packet of %d bytes (at most %d expected)", c.RemoteAddr(), size, maxConnectAnswer)
			c.s.failedDial(e)
			c.done, c.head = true, nil
			return 0, errors.New(e)
		}
	}
	if len(c.head) >= 20 {
		timeout := time.Duration(binary.BigEndian.Uint32(c.head[8:12])) * time.Millisecond
		if id := int64(binary.BigEndian.Uint64(c.head[12:20])); id != 0 {
			c.s.latestID.Store(id)
			c.s.timeout.Store(int64(timeout))
		}
		c.done, c.head = true, nil
	}
	return n, err
}

// libraryLog routes the library's lines (every reconnection and failed
// dial) to debug level: leaderrun reports an error once, where it handles
// it.
type libraryLog struct{ log *slog.Logger }

func (l libraryLog) Printf(format string, args ...any) {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.log.Debug(fmt.Sprintf(format, args...), "source", "go-zookeeper")
	}
}

// call runs req, a request of the library, which takes no context, and
// returns its answer; or ctx's error if ctx ends first, or
// zk.ErrSessionExpired once the session expired. The request then goes on
// until the library answers it (at the latest when the connection closes);
// end waits for it.
func call[T any](ctx context.Context, s *session, req func(*zk.Conn) (T, error)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return zero, errors.New("zookeeper: session closed")
	}
	s.requests.Add(1)
	s.mu.Unlock()
	var v T
	var err error
	done := make(chan struct{})
	go func() {
		defer s.requests.Done()
		defer close(done)
		v, err = req(s.conn)
	}()
	select {
	case <-done:
		return v, err
	case <-ctx.Done():
		return zero, ctx.Err()
	case <-s.expired:
		return zero, zk.ErrSessionExpired
	}
}

// end ends the session: the ensemble deletes its ephemeral znodes before
// it answers.
func (s *session) end() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.conn.Close()
	s.requests.Wait()
}
