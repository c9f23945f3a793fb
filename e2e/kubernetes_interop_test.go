//go:build linux

package e2e

import (
	"bufio"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// The client-go electors' timings. client-go's own rule is LeaseDuration >
// RenewDeadline > 1.2 × RetryPeriod, but with ReleaseOnCancel a leader
// whose renewals hang (a stalled link) keeps its OnStartedLeading context
// open while its release attempt waits out another RenewDeadline: it acts
// as the leader for up to RetryPeriod + 2 × RenewDeadline after its last
// renewal, so LeaseDuration must exceed that for client-go to keep its own
// lease, whoever follows (with 3 s, 2 s, 0.5 s this test saw client-go lead
// 1.4 s into leaderrun's term; client-go's defaults, 15 s, 10 s, 2 s, do
// not satisfy it either). See docs/backends/kubernetes.md.
const (
	electorLease = 5 * time.Second
	electorRenew = 2 * time.Second
	electorRetry = 500 * time.Millisecond
)

// electorProc is the client-go LeaderElector program (testenv.K8sElector),
// what a Kubernetes controller runs, as a process of its own.
type electorProc struct {
	t    *testing.T
	id   string
	cmd  *exec.Cmd
	done chan struct{}

	mu     sync.Mutex
	events []electorEvent
	exitAt time.Time
}

// electorEvent is one line of the program's output: started (it leads
// from now on), stopped (it no longer does), leader (it saw arg lead).
type electorEvent struct {
	kind string
	at   time.Time
	arg  string
}

func startElector(t *testing.T, kubeconfig, namespace, lock, id string, release bool) *electorProc {
	t.Helper()
	return startElectorTimed(t, kubeconfig, namespace, lock, id, release, electorLease, electorRenew, electorRetry)
}

// startElectorTimed is startElector with client-go's three timings.
func startElectorTimed(t *testing.T, kubeconfig, namespace, lock, id string, release bool, lease, renew, retry time.Duration) *electorProc {
	t.Helper()
	cmd := exec.Command(testenv.K8sElector(t), "-kubeconfig", kubeconfig, "-namespace", namespace, "-lock", lock, "-identity", id,
		"-lease-duration", lease.String(), "-renew-deadline", renew.String(), "-retry-period", retry.String(),
		"-release-on-cancel="+strconv.FormatBool(release))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &electorProc{t: t, id: id, cmd: cmd, done: make(chan struct{})}
	go func() {
		defer close(p.done)
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
			p.mu.Lock()
			p.events = append(p.events, ev)
			p.mu.Unlock()
		}
		_ = cmd.Wait()
		p.mu.Lock()
		p.exitAt = time.Now()
		p.mu.Unlock()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("elector %s stderr:\n%s", id, stderr.String())
		}
	})
	return p
}

// first is the elector's first event of kind.
func (p *electorProc) first(kind string) (electorEvent, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ev := range p.events {
		if ev.kind == kind {
			return ev, true
		}
	}
	return electorEvent{}, false
}

// await waits for the elector's first event of kind.
func (p *electorProc) await(kind string, timeout time.Duration) electorEvent {
	p.t.Helper()
	var ev electorEvent
	waitFor(p.t, timeout, fmt.Sprintf("elector %s to print %q", p.id, kind), func() bool {
		var ok bool
		ev, ok = p.first(kind)
		return ok
	})
	return ev
}

// exited waits for the process to end and returns when it did.
func (p *electorProc) exited(timeout time.Duration) time.Time {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.t.Fatalf("elector %s still running after %v", p.id, timeout)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exitAt
}

// TestKubernetesInterop: leaderrun and client-go LeaderElectors contend
// for one Lease, the lead passing from one kind to the other 20 times: a
// leaderrun leader ends by its child exiting (release), SIGTERM, kill -9
// or a stalled link; a client-go leader by SIGTERM with ReleaseOnCancel,
// kill -9, a stalled link or SIGTERM without releasing. Each side's
// leadership (leaderrun: its child's run; client-go: from OnStartedLeading
// until its context ends) never overlaps the other's, and leaderrun's
// tokens keep growing across the client-go terms between them.
// It counts the apiserver's open watches of leases: on an apiserver of
// its own, to which no other test adds any.
func TestKubernetesInterop(t *testing.T) {
	t.Parallel()
	e := newKubeEnvOn(t, testenv.StartKube(t))
	// client-go's elector needs get, create and update; it polls, it
	// does not watch.
	e.k.Grant(t, e.ns, testenv.KubeOther, "get", "create", "update")
	events := etcdEvents(t)
	const lock, alternations = "interop", 20
	electorVia := func() (string, *testenv.Proxy) {
		p := testenv.NewProxy(t, e.k.Addr())
		return e.k.KubeconfigVia(t, "https://"+p.Addr(), testenv.KubeOther, e.ns), p
	}
	type term struct {
		who, how   string
		start, end time.Time
	}
	var terms []term
	lrHows := []string{"child exits", "SIGTERM", "kill -9", "stalled link"}
	ceHows := []string{"SIGTERM, released", "kill -9", "stalled link", "SIGTERM, not released"}

	lrID := "lr-0"
	kc, proxy := e.via(t)
	lr := e.runWith(t, kc, events, "forever", lock, lrID)
	waitEvents(t, events, 10*time.Second, "leaderrun's first child", etcdHas("start", lrID))
	var ce *electorProc
	var ceProxy *testenv.Proxy
	for i := range alternations {
		if i%2 == 0 {
			// leaderrun leads; a client-go elector waits, then takes over.
			how := lrHows[(i/2)%len(lrHows)]
			next := ceHows[(i/2)%len(ceHows)] // how that elector will end
			ceID := fmt.Sprintf("ce-%d", i+1)
			var ceKC string
			ceKC, ceProxy = electorVia()
			ce = startElector(t, ceKC, e.ns, lock, ceID, next != "SIGTERM, not released")
			if ev := ce.await("leader", 10*time.Second); ev.arg != lrID {
				t.Fatalf("alternation %d: elector %s saw %q lead, want %s", i, ceID, ev.arg, lrID)
			}
			child, _ := etcdFind(readEvents(t, events), "start", lrID)
			ended := time.Now()
			switch how {
			case "child exits":
				_ = syscall.Kill(child.Pid, syscall.SIGTERM)
			case "SIGTERM":
				lr.signal(syscall.SIGTERM)
			case "kill -9":
				lr.signal(syscall.SIGKILL)
			case "stalled link":
				proxy.Stall()
			}
			end := time.Time{}
			if how == "kill -9" {
				waitFor(t, 2*time.Second, "the killed leaderrun's child to die", func() bool { return !alive(child.Pid) })
				end = time.Now()
			}
			started := ce.await("started", electorLease+5*time.Second)
			proxy.Resume()
			code := lr.wait(15 * time.Second)
			want := map[string]int{"child exits": 0, "SIGTERM": 0, "kill -9": 137, "stalled link": 76}[how]
			if code != want {
				t.Errorf("alternation %d: leaderrun %s (%s) exited %d, want %d", i, lrID, how, code, want)
			}
			if end.IsZero() {
				exit, ok := etcdFind(readEvents(t, events), "exit", lrID)
				if !ok {
					t.Fatalf("alternation %d: leaderrun %s's child recorded no exit", i, lrID)
				}
				end = exit.At
			}
			terms = append(terms, term{who: lrID, how: how, start: child.At, end: end})
			t.Logf("alternation %2d: leaderrun %s ended (%s); client-go %s leads %v later", i, lrID, how, ceID, started.at.Sub(ended).Round(time.Millisecond))
			continue
		}
		// A client-go elector leads; leaderrun waits, then takes over.
		how := ceHows[(i/2)%len(ceHows)]
		started := ce.await("started", time.Second)
		before := e.k.LeaseWatches(t)
		lrID = fmt.Sprintf("lr-%d", i+1)
		kc, proxy = e.via(t)
		lr = e.runWith(t, kc, events, "forever", lock, lrID)
		e.watching(t, before, 1)
		ended := time.Now()
		switch how {
		case "SIGTERM, released", "SIGTERM, not released":
			_ = ce.cmd.Process.Signal(syscall.SIGTERM)
		case "kill -9":
			_ = ce.cmd.Process.Signal(syscall.SIGKILL)
		case "stalled link":
			ceProxy.Stall()
		}
		end := time.Time{}
		if how == "kill -9" {
			end = ce.exited(5 * time.Second)
		}
		evs := waitEvents(t, events, electorLease+5*time.Second, "leaderrun's child", etcdHas("start", lrID))
		child, _ := etcdFind(evs, "start", lrID)
		if end.IsZero() {
			end = ce.await("stopped", 10*time.Second).at
		}
		ceProxy.Resume()
		ce.exited(15 * time.Second)
		terms = append(terms, term{who: ce.id, how: how, start: started.at, end: end})
		t.Logf("alternation %2d: client-go %s ended (%s); leaderrun %s's child runs %v later", i, ce.id, how, lrID, child.At.Sub(ended).Round(time.Millisecond))
	}
	child, _ := etcdFind(readEvents(t, events), "start", lrID)
	lr.signal(syscall.SIGTERM)
	lr.wait(10 * time.Second)
	exit, _ := etcdFind(readEvents(t, events), "exit", lrID)
	terms = append(terms, term{who: lrID, how: "end of test", start: child.At, end: exit.At})

	slices.SortFunc(terms, func(a, b term) int { return a.start.Compare(b.start) })
	overlaps := 0
	var gaps []time.Duration
	for i := 1; i < len(terms); i++ {
		prev, cur := terms[i-1], terms[i]
		gaps = append(gaps, cur.start.Sub(prev.end).Round(time.Millisecond))
		if cur.start.Before(prev.end) {
			overlaps++
			t.Errorf("%s started leading %v before %s (%s) stopped", cur.who, prev.end.Sub(cur.start), prev.who, prev.how)
		}
	}
	t.Logf("%d alternations, %d overlaps; gaps between one side's end and the other's start: %v", alternations, overlaps, gaps)
	var tokens []uint64
	for _, iv := range intervals(readEvents(t, events)) {
		tokens = append(tokens, iv.Token)
	}
	if !slices.IsSorted(tokens) || len(slices.Compact(slices.Clone(tokens))) != len(tokens) {
		t.Errorf("leaderrun's tokens do not grow across the client-go terms: %v", tokens)
	}
	t.Logf("leaderrun's tokens across the client-go terms: %v", tokens)
}
