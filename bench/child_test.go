package bench

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The environment of a child (bench/child), which the wrappers pass on to
// their command: the benchmark sets it on the wrapper.
const (
	envSock = "BENCH_SOCK" // the hub's unix socket
	envTag  = "BENCH_TAG"  // names the wrapper that started this child
	envHold = "BENCH_HOLD" // set: run until signalled; unset: exit at once
)

// mono reads CLOCK_MONOTONIC, which every process on the machine shares,
// unlike the monotonic reading inside a time.Time; bench/child reports its
// times on the same clock.
func mono() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Duration(ts.Nano())
}

// kid is what the hub knows about one child. Times are mono() readings;
// zero means "not yet".
type kid struct {
	tag     string
	pid     int
	start   time.Duration
	sig     time.Duration
	sigName string
	exit    time.Duration // when its connection closed: it died
	leader  time.Duration // an elector: when it first knew the leader
}

// hub collects the children's reports. Waiting on it wakes on every
// report: no polling.
type hub struct {
	ln net.Listener

	mu      sync.Mutex
	kids    map[string]*kid // by tag: a wrapper starts at most one child
	conns   map[net.Conn]struct{}
	changed chan struct{} // closed and replaced on every report
	closed  bool
	wg      sync.WaitGroup
}

func newHub(path string) (*hub, error) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	h := &hub{ln: ln, kids: map[string]*kid{}, conns: map[net.Conn]struct{}{}, changed: make(chan struct{})}
	h.wg.Add(1)
	go h.accept()
	return h, nil
}

func (h *hub) accept() {
	defer h.wg.Done()
	for {
		c, err := h.ln.Accept()
		if err != nil {
			return
		}
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			c.Close()
			continue
		}
		h.conns[c] = struct{}{}
		h.mu.Unlock()
		h.wg.Add(1)
		go h.serve(c)
	}
}

// serve reads one child's reports until its connection closes.
func (h *hub) serve(c net.Conn) {
	defer h.wg.Done()
	var tag string
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 {
			continue
		}
		pid, _ := strconv.Atoi(f[2])
		at, _ := strconv.ParseInt(f[3], 10, 64)
		tag = f[1]
		h.update(func() {
			k := h.kids[tag]
			if k == nil {
				k = &kid{tag: tag}
				h.kids[tag] = k
			}
			k.pid = pid
			switch f[0] {
			case "start":
				k.start = time.Duration(at)
			case "sig":
				if k.sig == 0 && len(f) > 4 {
					k.sig, k.sigName = time.Duration(at), f[4]
				}
			}
		})
	}
	gone := mono()
	c.Close()
	h.update(func() {
		delete(h.conns, c)
		if k := h.kids[tag]; k != nil && k.exit == 0 {
			k.exit = gone
		}
	})
}

// report records an event of an elector, which has no child to report
// for it (see bench.electorEvents): "start", "sig", "exit", "leader".
func (h *hub) report(tag string, pid int, event string, at time.Duration, sigName string) {
	h.update(func() {
		k := h.kids[tag]
		if k == nil {
			k = &kid{tag: tag}
			h.kids[tag] = k
		}
		k.pid = pid
		switch event {
		case "start":
			if k.start == 0 {
				k.start = at
			}
		case "sig":
			if k.sig == 0 {
				k.sig, k.sigName = at, sigName
			}
		case "exit":
			if k.exit == 0 {
				k.exit = at
			}
		case "leader":
			if k.leader == 0 {
				k.leader = at
			}
		}
	})
}

func (h *hub) update(f func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f()
	close(h.changed)
	h.changed = make(chan struct{})
}

// wait waits until cond, called with the hub locked, is true, or for at
// most timeout; it reports whether cond became true.
func (h *hub) wait(timeout time.Duration, cond func() bool) bool {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		h.mu.Lock()
		ok, ch := cond(), h.changed
		h.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ch:
		case <-timer.C:
			return false
		}
	}
}

// get is a copy of what the hub knows about tag's child.
func (h *hub) get(tag string) (kid, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if k := h.kids[tag]; k != nil {
		return *k, true
	}
	return kid{}, false
}

// started waits up to timeout for tag's child to report its start.
func (h *hub) started(tag string, timeout time.Duration) (kid, bool) {
	h.wait(timeout, func() bool { k := h.kids[tag]; return k != nil && k.start != 0 })
	k, ok := h.get(tag)
	return k, ok && k.start != 0
}

// live lists the children whose connection is still open.
func (h *hub) live() []kid {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []kid
	for _, k := range h.kids {
		if k.start != 0 && k.exit == 0 {
			out = append(out, *k)
		}
	}
	return out
}

// close stops listening and closes every child's connection; held
// children exit when theirs closes.
func (h *hub) close() {
	h.mu.Lock()
	h.closed = true
	for c := range h.conns {
		c.Close()
	}
	h.mu.Unlock()
	h.ln.Close()
	h.wg.Wait()
}

// TestChild runs bench/child as the tools do: it reports its start on
// the hub's socket, on the hub's clock; in hold mode it reports the signal
// it received and exits 0, and the hub sees its connection close.
func TestChild(t *testing.T) {
	bin := buildChild(t)
	dir, err := os.MkdirTemp("", "lrchild")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	h, err := newHub(filepath.Join(dir, "hub.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer h.close()
	for _, hold := range []bool{false, true} {
		tag := fmt.Sprintf("hold=%v", hold)
		cmd := exec.Command(bin)
		cmd.Env = []string{envSock + "=" + filepath.Join(dir, "hub.sock"), envTag + "=" + tag}
		if hold {
			cmd.Env = append(cmd.Env, envHold+"=1")
		}
		before := mono()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		k, ok := h.started(tag, 10*time.Second)
		if !ok {
			_ = cmd.Process.Kill()
			t.Fatalf("%s: no start reported", tag)
		}
		if k.pid != cmd.Process.Pid || k.start < before || k.start > mono() {
			t.Errorf("%s: reported pid %d at %v, want pid %d between %v and now", tag, k.pid, k.start, cmd.Process.Pid, before)
		}
		if hold {
			_ = cmd.Process.Signal(syscall.SIGTERM)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("%s: %v", tag, err)
		}
		if !h.wait(10*time.Second, func() bool { return h.kids[tag].exit != 0 }) {
			t.Errorf("%s: the hub did not see the child's connection close", tag)
		}
		if k, _ := h.get(tag); hold && (k.sig == 0 || k.sigName != "SIGTERM") {
			t.Errorf("%s: signal reported as %q at %v, want SIGTERM", tag, k.sigName, k.sig)
		}
	}
}
