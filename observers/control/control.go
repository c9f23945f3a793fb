// Package control answers `leaderrun check` from inside the child: the
// runner's state is kept by an Observer and served as one JSON object on a
// unix socket whose path the child gets in LEADERRUN_SOCKET.
//
// The protocol: the client connects, sends one request line ("check", or
// "progress" to report progress first; nothing at all is "check") and
// shuts down its writing half; the server reads at most one short line,
// acts on it, writes the answer and closes.
package control

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/leaderrun/leaderrun/runner"
)

// Answer is what the socket says.
type Answer struct {
	// Leader is true while the lease is held and the local deadline has
	// not passed.
	Leader bool `json:"leader"`
	// Token is the fencing token of the current grant.
	Token uint64 `json:"token,omitempty"`
	// Remaining is how long until the local renew deadline, at which the
	// child would be stopped unless a renewal is acknowledged first.
	Remaining time.Duration `json:"remaining_ns"`
}

// State follows the runner's events. Its zero value is not leading.
type State struct {
	// Progress, if set, hears the job's progress reports (Set before
	// Listen). Nil: a progress request is answered as a check.
	Progress *runner.Progress

	mu       sync.Mutex
	leading  bool
	token    uint64
	deadline time.Time
}

// Observe implements runner.Observer.
func (s *State) Observe(e runner.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch e.Kind {
	case runner.Acquired, runner.ChildStarted, runner.Renewed:
		s.leading, s.token = true, e.Token
		if !e.Deadline.IsZero() {
			s.deadline = e.Deadline
		}
	case runner.Lost, runner.Stopping, runner.Stalled, runner.Released:
		s.leading = false
	}
}

// Answer computes the answer now.
func (s *State) Answer() Answer {
	s.mu.Lock()
	defer s.mu.Unlock()
	left := time.Until(s.deadline)
	return Answer{Leader: s.leading && left > 0, Token: s.token, Remaining: max(left, 0)}
}

// Server serves a State on a unix socket in a private directory.
type Server struct {
	path string
	dir  string
	ln   net.Listener
	log  *slog.Logger
	wg   sync.WaitGroup
	// stop ends a pause between failed accepts when Close is called.
	stop   context.Context
	cancel context.CancelFunc
}

// Listen creates the socket and serves state on it: a file in a new
// directory of mode 0700 under dir (os.TempDir if empty, or if dir would
// let another user replace that directory: see checkBase), so that only
// this user and root can connect (see listen). Close removes both; what a
// leaderrun killed with SIGKILL leaves behind, the next Listen in the same
// dir removes. log, if not nil, hears when accepting fails and when it
// works again.
func Listen(dir string, state *State, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if dir != "" {
		if err := checkBase(dir); err != nil {
			// Another user's $XDG_RUNTIME_DIR, say, kept by su.
			log.Info("check socket: not in this directory; in the temporary directory instead", "error", err, "temp_dir", os.TempDir())
			dir = ""
		}
	}
	ln, path, d, err := listen(dir)
	if err != nil {
		return nil, err
	}
	s := &Server{path: path, dir: d, ln: ln, log: log}
	s.stop, s.cancel = context.WithCancel(context.Background())
	s.wg.Add(1)
	go s.serve(state)
	return s, nil
}

// Path is the socket's path, for LEADERRUN_SOCKET.
func (s *Server) Path() string { return s.path }

// acceptBackoff paces retries while accept fails. Check gives up after a
// second, so the longest pause is short enough for a check that arrived
// during the failure to be answered within its second once a descriptor
// is free again.
func acceptBackoff() wait.Backoff {
	return wait.Backoff{Duration: 5 * time.Millisecond, Factor: 2, Steps: 8, Cap: 100 * time.Millisecond}
}

func (s *Server) serve(state *State) {
	defer s.wg.Done()
	retry, failed := acceptBackoff(), 0
	busy := make(chan struct{}, maxConns)
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors (EMFILE, ENFILE) or kernel memory: the
			// pending connection stays queued, and accept works again once
			// the job or the store's client closes something. Ending here
			// would leave every later check hanging while we still lead.
			if failed == 0 {
				s.log.Warn("check socket: accept failed; retrying", "socket", s.path, "error", err)
			}
			failed++
			t := time.NewTimer(retry.Step())
			select {
			case <-s.stop.Done():
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		if failed > 0 {
			s.log.Info("check socket: accepting again", "socket", s.path, "failed_accepts", failed)
			retry, failed = acceptBackoff(), 0
		}
		if !allowed(c) {
			c.Close()
			continue
		}
		// A few connections at once, each bounded by its second: a peer
		// that connects and sends nothing delays no other check.
		busy <- struct{}{}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-busy }()
			defer c.Close()
			s.answer(c, state)
		}()
	}
}

// maxConns bounds the connections answered at once.
const maxConns = 8

// The requests a client may send.
const (
	RequestCheck    = "check"
	RequestProgress = "progress"
)

// maxRequest bounds a request line, newline included: the longest request
// is "progress\n".
const maxRequest = 64

// answer serves one connection from an allowed peer: one request, one
// answer, within a second.
func (s *Server) answer(c net.Conn, state *State) {
	_ = c.SetDeadline(time.Now().Add(time.Second))
	req, err := readRequest(c)
	if err != nil {
		s.log.Debug("check socket: bad request", "error", err)
		return
	}
	switch req {
	case "", RequestCheck:
	case RequestProgress:
		// Recorded before the answer is written, so that a job that
		// has its answer knows leaderrun has its report.
		if state.Progress != nil {
			state.Progress.Report(time.Now())
		}
	default:
		s.log.Debug("check socket: unknown request", "request", req)
		return
	}
	_ = json.NewEncoder(c).Encode(state.Answer())
}

// readRequest reads one request line of at most maxRequest bytes, ended by
// a newline or by the client shutting down its writing half.
func readRequest(c net.Conn) (string, error) {
	var buf [maxRequest]byte
	n := 0
	for n < len(buf) {
		m, err := c.Read(buf[n:])
		n += m
		if i := bytes.IndexByte(buf[:n], '\n'); i >= 0 {
			return string(buf[:i]), nil
		}
		if errors.Is(err, io.EOF) {
			return string(buf[:n]), nil
		}
		if err != nil {
			return "", fmt.Errorf("read request: %w", err)
		}
	}
	return "", fmt.Errorf("request longer than %d bytes", maxRequest)
}

// Close stops serving and removes the socket.
func (s *Server) Close() error {
	s.cancel()
	err := s.ln.Close()
	s.wg.Wait()
	if s.dir != "" {
		os.RemoveAll(s.dir)
	}
	return err
}

// ErrNoSocket means LEADERRUN_SOCKET is not set: check is not running under
// leaderrun.
var ErrNoSocket = errors.New("control: LEADERRUN_SOCKET is not set (check runs inside a command started by leaderrun)")

// Query asks the socket at path whether leadership is held.
func Query(ctx context.Context, path string) (Answer, error) {
	return Ask(ctx, path, RequestCheck)
}

// Ask sends req (RequestCheck or RequestProgress) to the socket at path
// and returns the answer.
func Ask(ctx context.Context, path, req string) (Answer, error) {
	if path == "" {
		return Answer{}, ErrNoSocket
	}
	c, err := dial(ctx, path)
	if err != nil {
		return Answer{}, fmt.Errorf("ask leaderrun at %s: %w", path, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	// A failed write shows as a failed read below; a server that answers
	// without reading (an older leaderrun) has its answer read all the
	// same.
	_, _ = io.WriteString(c, req+"\n")
	if uc, ok := c.(*net.UnixConn); ok {
		_ = uc.CloseWrite()
	}
	var a Answer
	if err := json.NewDecoder(c).Decode(&a); err != nil {
		return Answer{}, fmt.Errorf("read answer from %s: %w", path, err)
	}
	return a, nil
}

// dialBackoff paces connects that find the backlog full.
func dialBackoff() wait.Backoff {
	return wait.Backoff{Duration: time.Millisecond, Factor: 2, Steps: 8, Cap: 20 * time.Millisecond}
}

// dial connects to the socket at path. A connect that finds the
// listener's backlog full (EAGAIN: connections of the job's own that the
// server has not accepted yet) is tried again until ctx ends: the server
// accepts them in microseconds, and a check that gave up at once would
// report leadership lost while it is held.
func dial(ctx context.Context, path string) (net.Conn, error) {
	var d net.Dialer
	retry := dialBackoff()
	var full error // the latest EAGAIN: what to report when ctx ends
	for {
		c, err := d.DialContext(ctx, "unix", path)
		switch {
		case err == nil:
			return c, nil
		case errors.Is(err, syscall.EAGAIN):
			full = err
		case full != nil && (ctx.Err() != nil || timedOut(err)):
			// The budget ran out during a connect.
			return nil, full
		default:
			return nil, err
		}
		t := time.NewTimer(retry.Step())
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, full
		case <-t.C:
		}
	}
}

// timedOut reports whether err is a deadline that passed.
func timedOut(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
