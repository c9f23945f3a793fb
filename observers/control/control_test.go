package control

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
	"github.com/leaderrun/leaderrun/runner"
)

// TestMain doubles the test binary as a check-socket server in a process of
// its own (serverMain), whose descriptors a test can exhaust without
// touching its own.
func TestMain(m *testing.M) {
	if os.Getenv("CONTROL_TEST_SERVER") != "" {
		os.Exit(serverMain())
	}
	if os.Getenv("CONTROL_TEST_FLOOD") != "" {
		os.Exit(floodMain())
	}
	os.Exit(m.Run())
}

// helperToken is the token the helper's State reports as leading.
const helperToken = 7

// serverMain serves a leading State on a check socket in $CONTROL_TEST_DIR
// and prints the socket's path. Told "exhaust" on stdin, it lowers
// RLIMIT_NOFILE to 64 and opens /dev/null until the limit is reached, then
// prints "exhausted"; told "release", it closes those files and prints
// "released". It logs to stderr and stops when stdin closes.
func serverMain() int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	state := &State{}
	state.Observe(runner.Event{Kind: runner.Acquired, Token: helperToken, Deadline: time.Now().Add(time.Hour)})
	srv, err := Listen(os.Getenv("CONTROL_TEST_DIR"), state, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(srv.Path())
	var held []int
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch in.Text() {
		case "exhaust":
			lim := syscall.Rlimit{Cur: 64, Max: 64}
			if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
				fmt.Fprintln(os.Stderr, "setrlimit:", err)
				return 1
			}
			for {
				fd, err := syscall.Open("/dev/null", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
				if errors.Is(err, syscall.EMFILE) {
					break
				}
				if err != nil {
					fmt.Fprintln(os.Stderr, "open /dev/null:", err)
					return 1
				}
				held = append(held, fd)
			}
			fmt.Println("exhausted", len(held))
		case "release":
			for _, fd := range held {
				syscall.Close(fd)
			}
			held = nil
			fmt.Println("released")
		}
	}
	if err := srv.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// lockedBuffer collects a process's stderr.
type lockedBuffer = testenv.LockedBuffer

// waitFor polls cond until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// readToEOF asks the socket at path and reads until the server closes the
// connection, which it does after removing the descriptor from its table.
func readToEOF(t *testing.T, path string) {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	// An empty request: the client only shuts down its writing half.
	if err := c.(*net.UnixConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(c)
	var a Answer
	if err != nil || json.Unmarshal(b, &a) != nil || a.Token != helperToken {
		t.Fatalf("answer read to EOF: %q, %v", b, err)
	}
}

// checkServer is serverMain running in a process of its own.
type checkServer struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  *bufio.Scanner
	stderr *lockedBuffer
	path   string
}

func startCheckServer(t *testing.T) *checkServer {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// Not t.TempDir: a path that names the test is too long for a unix
	// socket (108 bytes).
	dir, err := os.MkdirTemp("", "ctl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// Open to every user, as /tmp is: what keeps others out must be the
	// server's own doing.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s := &checkServer{t: t, cmd: exec.Command(self), stderr: &lockedBuffer{}}
	// GORACE: a race-enabled helper otherwise sleeps 1 s at exit, which
	// would hide how long Close takes.
	s.cmd.Env = append(os.Environ(), "CONTROL_TEST_SERVER=1", "CONTROL_TEST_DIR="+dir, "GORACE=atexit_sleep_ms=0")
	if s.stdin, err = s.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := s.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s.lines = bufio.NewScanner(stdout)
	s.cmd.Stderr = s.stderr
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.stop(10 * time.Second) })
	s.path = s.next("")
	return s
}

// tell sends a command to the server.
func (s *checkServer) tell(what string) {
	s.t.Helper()
	if _, err := io.WriteString(s.stdin, what+"\n"); err != nil {
		s.t.Fatal(err)
	}
}

// next reads the server's next line, which must start with prefix.
func (s *checkServer) next(prefix string) string {
	s.t.Helper()
	if !s.lines.Scan() || !strings.HasPrefix(s.lines.Text(), prefix) {
		s.t.Fatalf("check server said %q, want %q; stderr:\n%s", s.lines.Text(), prefix, s.stderr.String())
	}
	return s.lines.Text()
}

// stop closes the server's stdin, which makes it call Close, and requires
// it to exit 0 within limit; it returns how long that took.
func (s *checkServer) stop(limit time.Duration) time.Duration {
	s.t.Helper()
	if s.cmd.ProcessState != nil {
		return 0
	}
	begin := time.Now()
	s.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			s.t.Errorf("check server: %v; stderr:\n%s", err, s.stderr.String())
		}
	case <-time.After(limit):
		_ = s.cmd.Process.Kill()
		<-done
		s.t.Errorf("check server's Close did not return within %v; stderr:\n%s", limit, s.stderr.String())
	}
	return time.Since(begin)
}

// TestAcceptSurvivesExhaustedDescriptors: when the process runs out of
// descriptors, accept on the check socket fails (EMFILE) for real; the
// server logs it once and keeps retrying. Once descriptors are free again
// it answers the check that was waiting, and `leaderrun check` answers as
// before; Close during the failures still ends the loop at once.
func TestAcceptSurvivesExhaustedDescriptors(t *testing.T) {
	tests := []struct {
		name    string
		release bool // free the descriptors (else Close while accept fails)
	}{
		{name: "descriptors freed", release: true},
		{name: "closed while accept fails", release: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := startCheckServer(t)
			if a, err := Query(context.Background(), srv.path); err != nil || !a.Leader || a.Token != helperToken {
				t.Fatalf("before the exhaustion: %+v, %v", a, err)
			}
			// Query returns once the answer is decoded, which can be
			// before the server has closed its end. A connection still
			// open while the helper exhausts its descriptors would be
			// closed afterwards and leave one free, and the check below
			// would then be accepted. The server closes each connection
			// before accepting the next, so reading a second answer to
			// EOF proves both are closed.
			readToEOF(t, srv.path)
			srv.tell("exhaust")
			t.Logf("check server: %s (RLIMIT_NOFILE 64)", srv.next("exhausted"))

			// This check connects (the kernel queues the connection) but
			// cannot be accepted while the server has no descriptor to
			// give it.
			type answer struct {
				a   Answer
				err error
				at  time.Time
			}
			pending := make(chan answer, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				a, err := Query(ctx, srv.path)
				pending <- answer{a, err, time.Now()}
			}()
			waitFor(t, 10*time.Second, "accept failure in the server's log", func() bool {
				return strings.Contains(srv.stderr.String(), "check socket: accept failed")
			})
			if !strings.Contains(srv.stderr.String(), "too many open files") {
				t.Errorf("the accept failure is not EMFILE:\n%s", srv.stderr.String())
			}
			select {
			case got := <-pending:
				t.Fatalf("check answered while the server had no descriptors: %+v", got)
			default:
			}

			if !tt.release {
				took := srv.stop(5 * time.Second)
				t.Logf("Close returned and the server exited %v after stdin closed, while accept was failing", took.Round(time.Millisecond))
				// A pause between retries is at most 100 ms, and Close cuts it.
				if took > 500*time.Millisecond {
					t.Errorf("Close during failing accepts took %v, want well under 500ms", took)
				}
				if got := <-pending; got.err == nil {
					t.Errorf("the waiting check got an answer from a closed server: %+v", got.a)
				}
				return
			}

			srv.tell("release")
			srv.next("released")
			released := time.Now()
			select {
			case got := <-pending:
				if got.err != nil || !got.a.Leader || got.a.Token != helperToken {
					t.Fatalf("the waiting check got %+v, %v", got.a, got.err)
				}
				d := got.at.Sub(released)
				t.Logf("the waiting check was answered %v after descriptors were freed", d.Round(time.Millisecond))
				// Within the second that `leaderrun check` waits.
				if d > time.Second {
					t.Errorf("the waiting check was answered %v after descriptors were freed, want under 1s", d)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("the waiting check got no answer within 10s of descriptors being freed; stderr:\n%s", srv.stderr.String())
			}

			// The command users run, as a job would.
			check := exec.Command(testenv.Leaderrun(t), "check", "-v")
			check.Env = append(os.Environ(), "LEADERRUN_SOCKET="+srv.path)
			out, err := check.CombinedOutput()
			if err != nil || !strings.Contains(string(out), fmt.Sprintf("leader=true token=%d", helperToken)) {
				t.Errorf("leaderrun check after the exhaustion: %v\n%s", err, out)
			}
			waitFor(t, 5*time.Second, "recovery in the server's log", func() bool {
				return strings.Contains(srv.stderr.String(), "check socket: accepting again")
			})
			if n := strings.Count(srv.stderr.String(), "accept failed"); n != 1 {
				t.Errorf("accept failure logged %d times, want once:\n%s", n, srv.stderr.String())
			}
			t.Logf("server log:\n%s", srv.stderr.String())
		})
	}
}

// TestOtherUsersAreRefused: only this user and root get an answer:
// `leaderrun check` run as another user fails (exit 1, its connect
// refused at the socket's directory), as this one succeeds.
func TestOtherUsersAreRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "playing another user needs root")
	}
	srv := startCheckServer(t)
	// A copy of leaderrun that the other user may execute (the test's
	// build sits in a directory only root can enter).
	dir, err := os.MkdirTemp("", "lrbin")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin, err := os.ReadFile(testenv.Leaderrun(t))
	if err != nil {
		t.Fatal(err)
	}
	lr := filepath.Join(dir, "leaderrun")
	testenv.WriteExecutable(t, lr, bin, 0o755)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		uid  uint32
		want int
	}{
		{"this user", 0, 0},
		{"another user", 65534, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check := exec.Command(lr, "check", "-v")
			check.Env = append(os.Environ(), "LEADERRUN_SOCKET="+srv.path)
			check.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: tc.uid, Gid: tc.uid}}
			out, _ := check.CombinedOutput()
			if code := check.ProcessState.ExitCode(); code != tc.want {
				t.Errorf("leaderrun check as uid %d: exit %d, want %d\n%s", tc.uid, code, tc.want, out)
			}
			if tc.want != 0 && strings.Contains(string(out), "token=") {
				t.Errorf("another user was told the token: %s", out)
			}
		})
	}
}
