package kubernetes_test

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/backendtest"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

// Timings of both sides in the interop test: client-go's rule
// LeaseDuration > RenewDeadline > 1.2 × RetryPeriod, short enough to keep
// the crash cases quick.
const (
	interopLease = 3 * time.Second
	interopRenew = 2 * time.Second
	interopRetry = 500 * time.Millisecond
	// leaderrunRetry is how often leaderrun renews. client-go's electors
	// compare records with their times cut to whole seconds, so they miss
	// a renewal in the same second as the one before and may take over up
	// to a second early; renewals at least a second apart are all seen
	// (see the package doc).
	leaderrunRetry = 1200 * time.Millisecond
)

// elector is the client-go LeaderElector program (testenv.K8sElector) as
// a process of its own.
type elector struct {
	t      *testing.T
	cmd    *exec.Cmd
	events chan electorEvent
	done   chan struct{}
}

type electorEvent struct {
	kind string // started, stopped, leader
	at   time.Time
	arg  string
}

func startElector(t *testing.T, c *cluster, lock, identity string) *elector {
	t.Helper()
	cmd := exec.Command(testenv.K8sElector(t),
		"-kubeconfig", c.k.Kubeconfig(t, testenv.KubeOther, c.ns), "-namespace", c.ns, "-lock", lock, "-identity", identity,
		"-lease-duration", interopLease.String(), "-renew-deadline", interopRenew.String(), "-retry-period", interopRetry.String())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	e := &elector{t: t, cmd: cmd, events: make(chan electorEvent, 100), done: make(chan struct{})}
	go func() {
		defer close(e.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) < 2 {
				continue
			}
			ns, _ := strconv.ParseInt(f[1], 10, 64)
			ev := electorEvent{kind: f[0], at: time.Unix(0, ns)}
			if len(f) > 2 {
				ev.arg = f[2]
			}
			e.events <- ev
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(func() { e.signal(syscall.SIGKILL); <-e.done })
	return e
}

func (e *elector) signal(sig syscall.Signal) { _ = e.cmd.Process.Signal(sig) }

// next waits for the elector's next event of kind, skipping the others.
func (e *elector) next(kind string, timeout time.Duration) electorEvent {
	e.t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case ev := <-e.events:
			if ev.kind == kind {
				return ev
			}
		case <-e.done:
			e.t.Fatalf("the elector exited while waiting for %q", kind)
		case <-deadline:
			e.t.Fatalf("no %q from the elector within %v", kind, timeout)
		}
	}
}

// exited waits for the process to end.
func (e *elector) exited(timeout time.Duration) {
	e.t.Helper()
	select {
	case <-e.done:
	case <-time.After(timeout):
		e.t.Fatalf("the elector did not exit within %v", timeout)
	}
}

// interval is a time when one side acted as the leader.
type interval struct {
	who        string
	start, end time.Time
}

// holding renews a leaderrun lease every leaderrunRetry, as the runner
// would, until stopped or lost.
type holding struct {
	l        *backends.Lease
	start    time.Time
	stop     chan struct{}
	done     chan struct{}
	mu       sync.Mutex
	lastSent time.Time // send time of the last acknowledged renewal
}

func hold(l *backends.Lease) *holding {
	h := &holding{l: l, start: time.Now(), stop: make(chan struct{}), done: make(chan struct{}), lastSent: l.Acquired()}
	go func() {
		defer close(h.done)
		tick := time.NewTicker(leaderrunRetry)
		defer tick.Stop()
		for {
			select {
			case <-h.stop:
				return
			case <-l.Lost():
				return
			case <-tick.C:
			}
			sent := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), leaderrunRetry)
			if l.Renew(ctx) == nil {
				h.mu.Lock()
				h.lastSent = sent
				h.mu.Unlock()
			}
			cancel()
		}
	}()
	return h
}

// end stops renewing and returns when leaderrun stopped acting: before
// the lease is released, or when it stopped renewing (a crash).
func (h *holding) end() time.Time {
	close(h.stop)
	<-h.done
	return time.Now()
}

func (h *holding) last() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lastSent
}

// TestClientGoInterop: a client-go LeaderElector (a separate process,
// with ReleaseOnCancel) and leaderrun contend for one Lease through
// releases both ways, SIGTERM of the elector, kill -9 of the elector and
// a leaderrun that stops renewing. They never lead at once: each takes
// over only after the other stopped, and after a crash only after the
// lease duration measured from the last renewal.
func TestClientGoInterop(t *testing.T) {
	c := newCluster(t)
	c.k.Grant(t, c.ns, testenv.KubeOther, "get", "create", "update", "watch")
	const lock = "interop"
	s := c.store(t, testenv.KubeLimited)
	tm := backends.Timings{LeaseDuration: interopLease, RenewDeadline: interopRenew, RetryPeriod: leaderrunRetry, KillGrace: 500 * time.Millisecond}
	var intervals []interval
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	campaignAsync := func() <-chan *backends.Lease {
		ch := make(chan *backends.Lease, 1)
		go func() {
			l, err := backends.Campaign(ctx, s, lock, candidate("leaderrun", tm))
			if err != nil {
				t.Errorf("leaderrun campaign: %v", err)
			}
			ch <- l
		}()
		return ch
	}
	got := func(ch <-chan *backends.Lease, within time.Duration) *backends.Lease {
		t.Helper()
		select {
		case l := <-ch:
			if l == nil {
				t.FailNow()
			}
			return l
		case <-time.After(within):
			t.Fatalf("leaderrun did not get the Lease within %v", within)
		}
		return nil
	}

	for round := range 2 {
		// The elector leads; leaderrun waits; SIGTERM makes the elector
		// stop and release, and leaderrun takes over at once.
		e := startElector(t, c, lock, fmt.Sprintf("client-go-%d", round))
		started := e.next("started", 10*time.Second)
		waiting := campaignAsync()
		time.Sleep(interopLease + interopRetry) // longer than a lease: its renewals keep leaderrun out
		select {
		case l := <-waiting:
			t.Fatalf("round %d: leaderrun took the Lease (token %v) while the elector renewed it", round, l)
		default:
		}
		e.signal(syscall.SIGTERM)
		stopped := e.next("stopped", 5*time.Second)
		intervals = append(intervals, interval{"client-go", started.at, stopped.at})
		l := got(waiting, 2*time.Second)
		h := hold(l)
		t.Logf("round %d: leaderrun took over %v after the elector stopped", round, h.start.Sub(stopped.at))
		e.exited(5 * time.Second)

		// leaderrun leads; a new elector waits; leaderrun releases and the
		// elector takes over within its retry period.
		e = startElector(t, c, lock, fmt.Sprintf("client-go-%d-b", round))
		time.Sleep(interopLease + interopRetry)
		end := h.end()
		intervals = append(intervals, interval{"leaderrun", h.start, end})
		backendtest.Release(t, l)
		started = e.next("started", 5*time.Second)
		t.Logf("round %d: the elector took over %v after leaderrun released", round, started.at.Sub(end))
		if round == 1 {
			// kill -9 of the elector while it leads: leaderrun takes over
			// once the record has not changed for the lease duration.
			waiting = campaignAsync()
			time.Sleep(interopRetry)
			e.signal(syscall.SIGKILL)
			killed := time.Now()
			e.exited(5 * time.Second)
			intervals = append(intervals, interval{"client-go", started.at, killed})
			l = got(waiting, interopLease+3*time.Second)
			took := l.Acquired().Sub(killed)
			t.Logf("after kill -9 of the elector, leaderrun took over %v later (lease %v)", took, interopLease)
			// The elector's last renewal was at most a retry period (with
			// client-go's jitter) before the kill.
			if took < interopLease-interopRetry*12/10-50*time.Millisecond {
				t.Errorf("leaderrun took over %v after the elector was killed, before its lease could have run out", took)
			}
			h = hold(l)

			// leaderrun stops renewing (as if it were killed): a new
			// elector takes over no earlier than the lease duration
			// after the last renewal, and leaderrun's lease reports the
			// loss.
			e = startElector(t, c, lock, "client-go-last")
			time.Sleep(interopRetry)
			end = h.end()
			last := h.last()
			intervals = append(intervals, interval{"leaderrun", h.start, end})
			started = e.next("started", interopLease+5*time.Second)
			t.Logf("after leaderrun stopped renewing, the elector took over %v after its last renewal", started.at.Sub(last))
			if started.at.Sub(last) < interopLease {
				t.Errorf("the elector took over %v after leaderrun's last renewal, before the lease duration %v", started.at.Sub(last), interopLease)
			}
			select {
			case <-l.Lost():
			case <-time.After(time.Second):
				t.Error("leaderrun's lease did not report the takeover within 1s")
			}
			backendtest.Release(t, l)
		}
		e.signal(syscall.SIGTERM)
		stopped = e.next("stopped", 5*time.Second)
		intervals = append(intervals, interval{"client-go", started.at, stopped.at})
		e.exited(5 * time.Second)
	}

	for i, a := range intervals {
		for _, b := range intervals[i+1:] {
			if a.start.Before(b.end) && b.start.Before(a.end) {
				t.Errorf("%s led %v-%v and %s led %v-%v: overlap", a.who, a.start.Format(time.StampMicro), a.end.Format(time.StampMicro),
					b.who, b.start.Format(time.StampMicro), b.end.Format(time.StampMicro))
			}
		}
	}
	t.Logf("%d terms, alternating, without overlap", len(intervals))
}
