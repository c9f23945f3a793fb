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
// session it carries.
//
// The library reconnects by itself, to any server of the list, and keeps
// the session if it reconnects within the timeout; after an expiry it
// even opens a new session on the same connection. A session here is the
// first one only: expired is closed when the library reports it expired,
// or finds itself with another session id, and nothing of ours survives
// that (its ephemeral znodes are gone).
//
// Session events arrive through the library's callback, which runs on the
// library's own goroutines and must not block: it only closes channels and
// sends, without waiting, on states. The event channel that Connect
// returns is left unread; the library drops what does not fit in it.
type session struct {
	b    *Backend
	conn *zk.Conn

	id       atomic.Int64           // our session's id, from its first connect response
	latestID atomic.Int64           // the id in the latest connect response
	timeout  atomic.Int64           // negotiated timeout, in ns
	dialErr  atomic.Pointer[string] // the latest failed dial or handshake

	handshake time.Duration // how long a server may take to answer a connect request

	connected     chan struct{} // closed when the session is first established
	connectedOnce sync.Once
	expired       chan struct{} // closed when the session is gone for good
	expiredOnce   sync.Once
	states        chan zk.State // connection states, for a lease's log; lossy

	mu        sync.Mutex
	closed    bool
	requests  sync.WaitGroup // requests whose callers stopped waiting
	closeOnce sync.Once
}

// connect opens a session with the given timeout and waits until the
// ensemble established it, at most the connect timeout. A failure wraps
// backends.ErrUnavailable (or is ctx's error).
func (b *Backend) connect(ctx context.Context, timeout time.Duration) (*session, error) {
	return b.connectShare(ctx, timeout, min(timeout, b.connectTimeout))
}

// connectShare is connect where the servers share the time given to
// answer the connect request: as the Java client does, every server gets
// its share, so that one that accepts connections and never answers
// cannot hold the client while the others would serve it.
func (b *Backend) connectShare(ctx context.Context, timeout, share time.Duration) (*session, error) {
	s := &session{
		b:         b,
		connected: make(chan struct{}),
		expired:   make(chan struct{}),
		states:    make(chan zk.State, 16),
		handshake: max(share/time.Duration(len(b.servers)), 100*time.Millisecond),
	}
	conn, _, err := zk.Connect(b.servers, timeout,
		zk.WithLogger(libraryLog{b.log}), zk.WithLogInfo(false),
		zk.WithEventCallback(s.event),
		zk.WithDialer(s.dial),
		zk.WithMaxBufferSize(maxPacket), zk.WithMaxConnBufferSize(maxRequest))
	if err != nil {
		return nil, b.unavailable("connect", err)
	}
	s.conn = conn
	t := time.NewTimer(b.connectTimeout)
	defer t.Stop()
	select {
	case <-s.connected:
	case <-ctx.Done():
		b.closeLater(s)
		return nil, b.ended(ctx, "connect")
	case <-t.C:
		// Closing waits a second for an answer that cannot come.
		b.closeLater(s)
		cause := "no server answered the connect request"
		if e := s.dialErr.Load(); e != nil {
			cause = *e
		}
		return nil, b.unavailable("connect", fmt.Errorf("no session within the connect timeout (%v): %s", b.connectTimeout, cause))
	}
	if b.digest.User != "" {
		rctx, cancel := context.WithTimeout(ctx, b.connectTimeout)
		defer cancel()
		auth := []byte(b.digest.User + ":" + b.digest.Password)
		_, err := call(rctx, s, func(z *zk.Conn) (struct{}, error) { return struct{}{}, z.AddAuth("digest", auth) })
		if err != nil {
			b.closeLater(s)
			return nil, b.failed(ctx, rctx, "authenticate as "+b.digest.User, err)
		}
	}
	return s, nil
}

// ID is the session's id, as ZooKeeper shows it (in hex) in its logs and
// in the ephemeralOwner of our znodes.
func (s *session) ID() int64 { return s.id.Load() }

// Timeout is the session timeout the ensemble granted.
func (s *session) Timeout() time.Duration { return time.Duration(s.timeout.Load()) }

// event is the library's callback.
func (s *session) event(ev zk.Event) {
	if ev.Type != zk.EventSession {
		return
	}
	switch ev.State {
	case zk.StateHasSession:
		latest := s.latestID.Load()
		if !s.id.CompareAndSwap(0, latest) && s.id.Load() != latest {
			s.expire()
		}
		s.connectedOnce.Do(func() { close(s.connected) })
	case zk.StateExpired:
		s.expire()
	}
	select {
	case s.states <- ev.State:
	default:
	}
}

func (s *session) expire() { s.expiredOnce.Do(func() { close(s.expired) }) }

// isExpired reports whether the session is gone.
func (s *session) isExpired() bool {
	select {
	case <-s.expired:
		return true
	default:
		return false
	}
}

// dial connects to one server for the library. It keeps the error of a
// failed dial for the message of a failed connect, and reads the granted
// timeout and session id from the connect response: the library keeps
// them to itself.
func (s *session) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		e := err.Error()
		s.dialErr.Store(&e)
		return nil, err
	}
	return &sniffer{Conn: c, s: s, deadline: time.Now().Add(s.handshake)}, nil
}

// sniffer reads the fixed part of the connect response, which is the
// first thing a server sends on a connection: length (4 bytes), protocol
// version (4), timeout in ms (4), session id (8). Until it has, reads have
// the handshake's deadline: the library would wait ten times two thirds
// of the session timeout for a server to answer, and then for the rest of
// the answer without any deadline. An answer announced longer than
// maxConnectAnswer is refused before the library allocates a buffer for
// it.
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
	if !c.done && err != nil {
		e := fmt.Sprintf("%s did not answer the connect request: %v", c.RemoteAddr(), err)
		c.s.dialErr.Store(&e)
	}
	if !c.done && n > 0 {
		c.head = append(c.head, p[:n]...)
		if len(c.head) >= 4 {
			if size := binary.BigEndian.Uint32(c.head[:4]); size > maxConnectAnswer {
				e := fmt.Sprintf("%s answered the connect request with a packet of %d bytes (at most %d expected)", c.RemoteAddr(), size, maxConnectAnswer)
				c.s.dialErr.Store(&e)
				c.done = true
				c.head = nil
				return 0, errors.New(e)
			}
		}
		if len(c.head) >= 20 {
			c.done = true
			timeout := time.Duration(binary.BigEndian.Uint32(c.head[8:12])) * time.Millisecond
			id := int64(binary.BigEndian.Uint64(c.head[12:20]))
			c.head = nil
			if id != 0 {
				c.s.latestID.Store(id)
				c.s.timeout.Store(int64(timeout))
			}
		}
	}
	return n, err
}

// libraryLog is the client library's logger, routed into leaderrun's log
// at debug level: the library logs every reconnection and failed dial,
// which leaderrun reports once, where it handles the error; with
// --log-level debug the library's own lines are there to read.
type libraryLog struct{ log *slog.Logger }

func (l libraryLog) Printf(format string, args ...any) {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.log.Debug(fmt.Sprintf(format, args...), "source", "go-zookeeper")
	}
}

// errClosed is the answer to a request on a session already closed.
var errClosed = errors.New("zookeeper: session closed")

// call runs req, one request of the client library, which takes no
// context, and returns its answer, or ctx's error if ctx ends first. The
// request then goes on until the library answers it: when the server does,
// or when the connection drops (within two thirds of the session timeout
// if the server falls silent) or is closed. close waits for it.
func call[T any](ctx context.Context, s *session, req func(*zk.Conn) (T, error)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return zero, errClosed
	}
	s.requests.Add(1)
	s.mu.Unlock()
	type answer struct {
		v   T
		err error
	}
	ch := make(chan answer, 1)
	go func() {
		defer s.requests.Done()
		v, err := req(s.conn)
		ch <- answer{v, err}
	}()
	select {
	case a := <-ch:
		return a.v, a.err
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

// close ends the session: the ensemble deletes its ephemeral znodes before
// it answers. The library waits about a second for that answer; if the
// ensemble cannot be reached, the session expires on its own after its
// timeout.
func (s *session) close() {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.conn.Close()
		s.requests.Wait()
	})
}
