//go:build linux

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// Timings of both sides in the benchmark's failover figures: the same
// lease, deadline and period for leaderrun and client-go (leaderrun's
// --kill-grace 1s on top), short enough to repeat.
const (
	benchLease = 4 * time.Second
	benchRenew = 2 * time.Second
	benchRetry = time.Second
)

// TestKubernetesBench measures, with E2E_BENCH=1, the Kubernetes column
// of the benchmark, for leaderrun (built without the race detector, as
// shipped) and, side by side, the client-go LeaderElector program doing
// the same thing (testenv.K8sElector; "leading" is its OnStartedLeading,
// "stopped" the end of its leading context):
//
//   - start to child (leaderrun) / to OnStartedLeading (client-go) on a
//     free Lease, E2E_BENCH_RUNS alternating runs (default 20);
//   - loss reaction: an operator gives the Lease to someone else; until
//     the child's kill signal / the leading context's end;
//   - handover: SIGTERM to the leader with a follower waiting; from the
//     old leader's end (child exit / stopped) to the follower's start;
//   - crash failover: kill -9 of the leader; from the kill to the
//     follower's start;
//   - apiserver requests per second of a leader and of an idle follower,
//     from the apiserver's audit log, with both tools' default timings
//     (15 s, 10 s, 2 s), over E2E_BENCH_WINDOW (default 30s);
//   - the memory of each leading process.
//
// It asserts nothing about speed: numbers on a shared machine are for
// reading.
func TestKubernetesBench(t *testing.T) {
	if os.Getenv("E2E_BENCH") != "1" {
		t.Skip("set E2E_BENCH=1 to measure")
	}
	runs := 20
	if s := os.Getenv("E2E_BENCH_RUNS"); s != "" {
		runs, _ = strconv.Atoi(s)
	}
	window := 30 * time.Second
	if s := os.Getenv("E2E_BENCH_WINDOW"); s != "" {
		window, _ = time.ParseDuration(s)
	}
	bin := filepath.Join(t.TempDir(), "leaderrun-bench")
	_, file, _, _ := runtime.Caller(0)
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = filepath.Join(filepath.Dir(file), "..")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	e := newKubeEnv(t)
	e.k.Grant(t, e.ns, testenv.KubeOther, "get", "create", "update")
	b := &kubeBench{t: t, e: e, bin: bin, ceKC: e.k.Kubeconfig(t, testenv.KubeOther, e.ns)}
	b.startToLead(runs)
	b.failovers(5)
	b.requests(window)
}

type kubeBench struct {
	t    *testing.T
	e    *kubeEnv
	bin  string
	ceKC string
	seq  int
}

// lr starts the shipped leaderrun with the recording child in mode.
func (b *kubeBench) lr(events, lock, id, mode string, timings ...string) *proc {
	args := append([]string{"--kubeconfig", b.e.kubeconfig, "--lock", lock, "--identity", id, "--quiet"}, timings...)
	return startProgram(b.t, childEnv(events, mode), b.bin, append(append(args, "--"), childArgv(b.t)...)...)
}

func (b *kubeBench) lrShort(events, lock, id string) *proc {
	return b.lr(events, lock, id, "forever", "--lease-duration", benchLease.String(), "--renew-deadline", benchRenew.String(),
		"--retry-period", benchRetry.String(), "--kill-grace", "1s")
}

func (b *kubeBench) ce(lock, id string) *electorProc {
	return startElectorTimed(b.t, b.ceKC, b.e.ns, lock, id, true, benchLease, benchRenew, benchRetry)
}

func (b *kubeBench) lock(what string) string {
	b.seq++
	return fmt.Sprintf("bench-%s-%d", what, b.seq)
}

func (b *kubeBench) startToLead(runs int) {
	t := b.t
	stamp := filepath.Join(t.TempDir(), "stamp")
	lrLock, ceLock := b.lock("start-lr"), b.lock("start-cg")
	var lr, ce []time.Duration
	for i := range runs {
		// leaderrun with the etcd benchmark's child: it writes the time it
		// started and exits, and leaderrun releases the Lease.
		os.Remove(stamp)
		cmd := exec.Command(b.bin, "--kubeconfig", b.e.kubeconfig, "--lock", lrLock, "--quiet", "--",
			"/bin/sh", "-c", `date +%s%N > "$STAMP"`)
		cmd.Env = append(os.Environ(), "STAMP="+stamp)
		began := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("leaderrun: %v\n%s", err, out)
		}
		data, err := os.ReadFile(stamp)
		if err != nil {
			t.Fatal(err)
		}
		ns, _ := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
		lr = append(lr, time.Unix(0, ns).Sub(began))

		began = time.Now()
		p := b.ce(ceLock, fmt.Sprintf("start-%d", i))
		ce = append(ce, p.await("started", 10*time.Second).at.Sub(began))
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		p.exited(10 * time.Second)
	}
	t.Logf("start to leading on a free Lease, %d alternating runs: leaderrun (to its child) %s; client-go (to OnStartedLeading) %s; ratio of medians %.2f",
		runs, summary(lr), summary(ce), float64(median(lr))/float64(median(ce)))
}

func (b *kubeBench) failovers(runs int) {
	t := b.t
	var lrLoss, ceLoss, lrHand, ceHand, lrCrash, ceCrash []time.Duration
	for range runs {
		// Loss: the holder changed by hand.
		events := etcdEvents(t)
		lock := b.lock("loss-lr")
		p := b.lr(events, lock, "leader", "forever", "--retry-period", "1s")
		waitEvents(t, events, 10*time.Second, "the child", etcdHas("start", "leader"))
		before := time.Now()
		b.e.setHolder(t, lock, "operator")
		sig, _ := etcdFind(waitEvents(t, events, 5*time.Second, "the kill signal", etcdHas("signal", "leader")), "signal", "leader")
		lrLoss = append(lrLoss, sig.At.Sub(before))
		p.wait(10 * time.Second)

		lock = b.lock("loss-cg")
		ce := b.ce(lock, "leader")
		ce.await("started", 10*time.Second)
		before = time.Now()
		b.e.setHolder(t, lock, "operator")
		ceLoss = append(ceLoss, ce.await("stopped", 30*time.Second).at.Sub(before))
		ce.exited(10 * time.Second)

		// Handover and crash: a leader, a waiting follower, then SIGTERM
		// or kill -9 of the leader.
		for _, crash := range []bool{false, true} {
			events := etcdEvents(t)
			lock := b.lock("over-lr")
			leader := b.lrShort(events, lock, "leader")
			evs := waitEvents(t, events, 10*time.Second, "the leader's child", etcdHas("start", "leader"))
			old, _ := etcdFind(evs, "start", "leader")
			watches := b.e.k.LeaseWatches(t)
			follower := b.lrShort(events, lock, "follower")
			b.e.watching(t, watches, 1)
			ended := time.Now()
			if crash {
				leader.signal(syscall.SIGKILL)
			} else {
				leader.signal(syscall.SIGTERM)
			}
			evs = waitEvents(t, events, benchLease+5*time.Second, "the follower's child", etcdHas("start", "follower"))
			next, _ := etcdFind(evs, "start", "follower")
			if crash {
				lrCrash = append(lrCrash, next.At.Sub(ended))
				waitFor(t, 2*time.Second, "the old child to die", func() bool { return !alive(old.Pid) })
			} else {
				exit, _ := etcdFind(evs, "exit", "leader")
				lrHand = append(lrHand, next.At.Sub(exit.At))
			}
			follower.signal(syscall.SIGTERM)
			follower.wait(10 * time.Second)

			lock = b.lock("over-cg")
			a := b.ce(lock, "leader")
			a.await("started", 10*time.Second)
			f := b.ce(lock, "follower")
			f.await("leader", 10*time.Second)
			ended = time.Now()
			if crash {
				_ = a.cmd.Process.Signal(syscall.SIGKILL)
			} else {
				_ = a.cmd.Process.Signal(syscall.SIGTERM)
			}
			started := f.await("started", benchLease+5*time.Second)
			if crash {
				ceCrash = append(ceCrash, started.at.Sub(ended))
			} else {
				ceHand = append(ceHand, started.at.Sub(a.await("stopped", time.Second).at))
			}
			a.exited(10 * time.Second)
			_ = f.cmd.Process.Signal(syscall.SIGTERM)
			f.exited(10 * time.Second)
		}
	}
	t.Logf("timings: lease %v, renew deadline %v, retry period %v for both (leaderrun --kill-grace 1s); %d runs each", benchLease, benchRenew, benchRetry, runs)
	t.Logf("loss reaction (holder changed by hand): leaderrun %s; client-go %s", summary(lrLoss), summary(ceLoss))
	t.Logf("handover on SIGTERM (old leader's end to the follower's start): leaderrun %s; client-go %s", summary(lrHand), summary(ceHand))
	t.Logf("crash failover (kill -9 to the follower's start): leaderrun %s; client-go %s", summary(lrCrash), summary(ceCrash))
}

// requests counts, from the audit log, the requests on one Lease from
// start to end.
func (b *kubeBench) requests(window time.Duration) {
	t := b.t
	count := func(lock string, from, to time.Time) (n int, verbs map[string]int) {
		verbs = map[string]int{}
		for _, r := range b.e.k.LeaseRequests(t) {
			if r.Namespace == b.e.ns && r.Name == lock && !r.At.Before(from) && r.At.Before(to) {
				n++
				verbs[r.Verb]++
			}
		}
		return n, verbs
	}
	rate := func(n int) float64 { return float64(n) / window.Seconds() }
	measure := func(name string, leader, follower func(lock, id string) (pid int, stop func())) {
		lock := b.lock("rate")
		lpid, stopLeader := leader(lock, "leader")
		time.Sleep(2 * time.Second) // past the acquisition: steady state
		from := time.Now()
		time.Sleep(window)
		to := time.Now()
		_, fstop := follower(lock, "follower")
		time.Sleep(2 * time.Second) // past the follower's first read
		from2 := time.Now()
		time.Sleep(window)
		to2 := time.Now()
		hwm, rss, _ := testenv.Memory(lpid)
		fstop()
		stopLeader()
		n1, v1 := count(lock, from, to)
		n2, v2 := count(lock, from2, to2)
		t.Logf("%s: leader alone %.2f requests/s %v; leader and an idle follower %.2f requests/s %v: the follower %.2f requests/s; leading process VmRSS %.1f MiB, VmHWM %.1f MiB",
			name, rate(n1), v1, rate(n2), v2, rate(n2)-rate(n1), float64(rss)/1024, float64(hwm)/1024)
	}
	measure("leaderrun (defaults: --lease-duration 15s --renew-deadline 10s --retry-period 2s)",
		func(lock, id string) (int, func()) {
			events := etcdEvents(t)
			p := b.lr(events, lock, id, "forever")
			waitEvents(t, events, 10*time.Second, "the child", etcdHas("start", id))
			return p.pid(), func() { p.signal(syscall.SIGTERM); p.wait(10 * time.Second) }
		},
		func(lock, id string) (int, func()) {
			watches := b.e.k.LeaseWatches(t)
			p := b.lr(etcdEvents(t), lock, id, "forever")
			b.e.watching(t, watches, 1)
			return p.pid(), func() { p.signal(syscall.SIGTERM); p.wait(10 * time.Second) }
		})
	measure("client-go (its defaults: LeaseDuration 15s, RenewDeadline 10s, RetryPeriod 2s)",
		func(lock, id string) (int, func()) {
			p := startElectorTimed(t, b.ceKC, b.e.ns, lock, id, true, 15*time.Second, 10*time.Second, 2*time.Second)
			p.await("started", 10*time.Second)
			return p.cmd.Process.Pid, func() { _ = p.cmd.Process.Signal(syscall.SIGTERM); p.exited(10 * time.Second) }
		},
		func(lock, id string) (int, func()) {
			p := startElectorTimed(t, b.ceKC, b.e.ns, lock, id, true, 15*time.Second, 10*time.Second, 2*time.Second)
			p.await("leader", 10*time.Second)
			return p.cmd.Process.Pid, func() { _ = p.cmd.Process.Signal(syscall.SIGTERM); p.exited(10 * time.Second) }
		})
}
