package bench

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The environment of a child. The wrappers pass their environment on to
// their command, so the benchmark sets these on the wrapper.
const (
	envChild = "BENCH_CHILD" // set: this process is a benchmark child
	envSock  = "BENCH_SOCK"  // the hub's unix socket
	envTag   = "BENCH_TAG"   // names the wrapper that started this child
	envHold  = "BENCH_HOLD"  // set: run until signalled; unset: exit at once
)

// mono reads CLOCK_MONOTONIC, which every process on the machine shares,
// unlike the monotonic reading inside a time.Time.
func mono() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Duration(ts.Nano())
}

// childMain is the whole life of a child: report the time it started
// (taken first thing, before connecting), then, in hold mode, wait for
// SIGTERM or SIGINT, report its time and exit 0. It keeps its connection
// open while it lives, so the hub also learns when it died, however it
// died; and it exits if the hub goes away, so that no child outlives the
// benchmark.
func childMain() int {
	at := mono()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	c, err := net.Dial("unix", os.Getenv(envSock))
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench child:", err)
		return 1
	}
	defer c.Close()
	tag := os.Getenv(envTag)
	if _, err := fmt.Fprintf(c, "start %s %d %d\n", tag, os.Getpid(), int64(at)); err != nil {
		return 1
	}
	if os.Getenv(envHold) == "" {
		return 0
	}
	hubGone := make(chan struct{})
	go func() {
		defer close(hubGone)
		_, _ = c.Read(make([]byte, 1))
	}()
	select {
	case s := <-sigs:
		fmt.Fprintf(c, "sig %s %d %d %s\n", tag, os.Getpid(), int64(mono()), unix.SignalName(s.(syscall.Signal)))
		return 0
	case <-hubGone:
		return 1
	}
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
