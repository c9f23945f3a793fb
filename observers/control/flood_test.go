package control

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// floodMain connects to the socket at $CONTROL_TEST_FLOOD and closes the
// connection, again and again, as fast as it can, until its stdin closes.
// It prints "started: <how the first connect went>" and, at the end,
// "connected N refused M: <the last error>".
func floodMain() int {
	path := os.Getenv("CONTROL_TEST_FLOOD")
	var stop atomic.Bool
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		stop.Store(true)
	}()
	var connected, refused int
	var last error
	for i := 0; !stop.Load(); i++ {
		c, err := net.Dial("unix", path)
		if err == nil {
			connected++
			c.Close()
		} else {
			refused++
			last = err
		}
		if i == 0 {
			fmt.Printf("started: %v\n", err)
		}
	}
	fmt.Printf("connected %d refused %d: %v\n", connected, refused, last)
	return 0
}

// TestBacklogFloodFromAnotherUser: four processes of another user (uid
// 65534) connect to the check socket and close again in a loop, as fast
// as they can, while `leaderrun check` runs 20 times as the job would.
// They must not get as far as the listener's backlog, where their
// connections would crowd out the job's (EAGAIN): each connect fails with
// EACCES at the socket's directory, and every check says "leader".
func TestBacklogFloodFromAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "playing another user needs root")
	}
	srv := startCheckServer(t)
	// A copy of this test binary that the other user may execute (the
	// build sits in a directory only root can enter).
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "ctlflood")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "flood")
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WriteExecutable(t, bin, data, 0o755)
	type flooder struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		lines *bufio.Scanner
	}
	var flooders []flooder
	for range 4 {
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(), "CONTROL_TEST_FLOOD="+srv.path)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		f := flooder{cmd: cmd, stdin: stdin, lines: bufio.NewScanner(stdout)}
		flooders = append(flooders, f)
		t.Cleanup(func() {
			f.stdin.Close()
			_ = f.cmd.Wait()
		})
		// Flooding from here on.
		if !f.lines.Scan() {
			t.Fatalf("flooder said nothing: %v", f.lines.Err())
		}
		t.Logf("flooder %d: %s", cmd.Process.Pid, f.lines.Text())
	}

	var failed []string
	for i := range 20 {
		check := exec.Command(testenv.Leaderrun(t), "check", "-v")
		check.Env = append(os.Environ(), "LEADERRUN_SOCKET="+srv.path)
		out, err := check.CombinedOutput()
		if err != nil || !strings.Contains(string(out), fmt.Sprintf("leader=true token=%d", helperToken)) {
			failed = append(failed, fmt.Sprintf("check %d: %v: %s", i, err, strings.TrimSpace(string(out))))
		}
	}
	if len(failed) > 0 {
		t.Errorf("%d of 20 checks failed while another user flooded the socket:\n%s", len(failed), strings.Join(failed, "\n"))
	}

	for _, f := range flooders {
		f.stdin.Close()
		if !f.lines.Scan() {
			t.Fatalf("flooder %d said nothing at the end: %v", f.cmd.Process.Pid, f.lines.Err())
		}
		line := f.lines.Text()
		t.Logf("flooder %d: %s", f.cmd.Process.Pid, line)
		if !strings.HasPrefix(line, "connected 0 ") || !strings.HasSuffix(line, "permission denied") {
			t.Errorf("flooder %d: %s; want every connect refused with EACCES", f.cmd.Process.Pid, line)
		}
	}
}

// TestAskRetriesFullBacklog: a connect that finds the listener's backlog
// full (EAGAIN: connections of the job's own that the server has not yet
// accepted) is tried again until the context ends, not failed at once.
func TestAskRetriesFullBacklog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s")
	// A listener with the smallest backlog, that accepts nothing.
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	// Fill the backlog until a connect says EAGAIN.
	for i := 0; ; i++ {
		c, err := net.Dial("unix", path)
		if errors.Is(err, syscall.EAGAIN) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if i > 100 {
			t.Fatal("the backlog never filled")
		}
	}
	const budget = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	began := time.Now()
	_, err = Ask(ctx, path, RequestCheck)
	took := time.Since(began)
	t.Logf("Ask against a full backlog: %v after %v", err, took.Round(time.Millisecond))
	if err == nil {
		t.Fatal("Ask got an answer from a listener that accepts nothing")
	}
	if !errors.Is(err, syscall.EAGAIN) {
		t.Errorf("error %v does not say the backlog was full (EAGAIN)", err)
	}
	if took < budget*3/4 {
		t.Errorf("Ask gave up after %v, want it to try again for its budget of %v", took, budget)
	}
}
