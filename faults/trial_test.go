package faults

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// candidate is one leaderrun process of a trial.
type candidate struct {
	id      string
	cmd     *exec.Cmd
	proxies []*testenv.Proxy
	out     *lockedBuffer
	done    chan struct{}
	exitAt  time.Time
	code    int
}

type lockedBuffer = testenv.LockedBuffer

func (c *candidate) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// groups are the process groups of the candidate's tree: leaderrun's, its
// watchdog's and the child's (leaderrun's children lead them; the child's
// pid is also known from the ledger).
func (c *candidate) groups(childPid int) []int {
	groups := []int{c.cmd.Process.Pid}
	files, _ := filepath.Glob(filepath.Join("/proc", strconv.Itoa(c.cmd.Process.Pid), "task", "*", "children"))
	for _, f := range files {
		data, _ := os.ReadFile(f)
		for _, s := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(s); err == nil {
				groups = append(groups, pid)
			}
		}
	}
	if pgid, err := syscall.Getpgid(childPid); childPid > 0 && err == nil {
		groups = append(groups, pgid)
	}
	return groups
}

// fault is one kind of trouble, injected on the leader.
type fault struct {
	name string
	// failover: a new leader is expected; otherwise none is.
	failover bool
	// overlapAllowed: the old child may run on, paused, after the new one
	// starts; its writes after the takeover must all be rejected.
	overlapAllowed bool
	// inject breaks things and returns when the fault is over (healed).
	inject func(tr *trial, leader *candidate, childPid int)
	// only restricts the fault to some stores; except leaves some out.
	only, except []string
	// escape makes every child start a helper that leaves its process
	// group (setsid) and ignores SIGTERM, writing to the ledger with the
	// child's token (S9: it must die within --kill-grace of the first
	// kill signal, before the lease can expire).
	escape bool
	// treeGone, if set, is how soon after the fault's start the whole
	// tree of the leader at fault must be gone (invariant (d)).
	treeGone func(timing) time.Duration
	// holders, if set, makes the row a pool's (--holders): see
	// runPoolTrial, which injects the fault on two holders at once.
	holders int
}

var scenarios = []fault{
	{name: "kill -9 leader", failover: true, inject: func(tr *trial, c *candidate, _ int) {
		_ = c.cmd.Process.Signal(syscall.SIGKILL)
	}},
	{name: "kill -9 child", failover: true, inject: func(tr *trial, c *candidate, childPid int) {
		_ = syscall.Kill(childPid, syscall.SIGKILL)
	}},
	{name: "pause group 2x lease", failover: true, overlapAllowed: true, inject: func(tr *trial, c *candidate, childPid int) {
		groups := c.groups(childPid)
		for _, g := range groups {
			_ = syscall.Kill(-g, syscall.SIGSTOP)
		}
		time.Sleep(2 * tr.timing.lease) // the fault itself
		for _, g := range groups {
			_ = syscall.Kill(-g, syscall.SIGCONT)
		}
	}},
	{name: "stall link 2x lease", failover: true, inject: func(tr *trial, c *candidate, _ int) {
		for _, p := range c.proxies {
			p.Stall()
		}
		time.Sleep(2 * tr.timing.lease) // the fault itself
		for _, p := range c.proxies {
			p.Resume()
		}
	}},
	{name: "short link resets", inject: func(tr *trial, c *candidate, _ int) {
		// Three resets spread over less than the renew deadline.
		for range 3 {
			for _, p := range c.proxies {
				p.Reset()
			}
			time.Sleep(tr.timing.deadline / 4)
		}
	}},
	// Not on the emulators: the DynamoDB emulator keeps its tables in
	// memory, so a restart would lose them (faults/dynamodb_test.go), and
	// Azurite reports every lease expired when it restarts
	// (docs/backends/azureblob.md); neither real service does either.
	{name: "store node restart", except: []string{"dynamodb", "azureblob"}, inject: func(tr *trial, _ *candidate, _ int) {
		tr.store.restartNode(tr.t)
	}},
	{name: "raft leader killed", only: []string{"etcd", "zookeeper"}, inject: func(tr *trial, _ *candidate, _ int) {
		if !tr.store.killRaftLeader(tr.t) {
			tr.t.Errorf("no raft leader found to kill")
		}
	}},
	{name: "escaped helper, stalled link", failover: true, escape: true, inject: func(tr *trial, c *candidate, _ int) {
		for _, p := range c.proxies {
			p.Stall()
		}
		time.Sleep(2 * tr.timing.lease) // the fault itself
		for _, p := range c.proxies {
			p.Resume()
		}
	}},
	{name: "SIGTERM handover", failover: true, inject: func(tr *trial, c *candidate, _ int) {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
	}},
	// leaderrun alone frozen (not its watchdog, not its child): the
	// watchdog holds the renew deadline on its own clock, so the child is
	// dead before the lease can expire (S10), and no overlap is allowed.
	{name: "stop leaderrun alone 2x lease", failover: true, inject: func(tr *trial, c *candidate, _ int) {
		_ = c.cmd.Process.Signal(syscall.SIGSTOP)
		time.Sleep(2 * tr.timing.lease) // the fault itself
		_ = c.cmd.Process.Signal(syscall.SIGCONT)
	}},
	// leaderrun killed while its child runs a helper that left its
	// session and ignores SIGTERM: the watchdog kills the whole tree at
	// once (S4, S10), well within --kill-grace + 100 ms.
	{name: "kill -9 leader, escaped helper", failover: true, escape: true,
		treeGone: func(tm timing) time.Duration { return tm.grace + 100*time.Millisecond },
		inject: func(tr *trial, c *candidate, _ int) {
			_ = c.cmd.Process.Signal(syscall.SIGKILL)
		}},
	// A pool of 3 (--holders 3), ten candidates: the holders of two
	// slots killed, or stopped, at once (holders_test.go).
	{name: "holders 3: kill -9 holders", failover: true, holders: 3, inject: func(tr *trial, c *candidate, _ int) {
		_ = c.cmd.Process.Signal(syscall.SIGKILL)
	}},
	{name: "holders 3: SIGTERM handover", failover: true, holders: 3, inject: func(tr *trial, c *candidate, _ int) {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
	}},
}

// trial is one run of one scenario: three candidates, one fault.
type trial struct {
	t      testing.TB
	store  store
	timing timing
	fault  fault
	bin    string
	child  string
	ledger *ledger
	cands  []*candidate

	begin, faultStart, faultEnd, end time.Time
	leaderAtFault                    string
	// tokenAtFault is the token of the leader's child the fault hit.
	tokenAtFault uint64
	exits        map[string]time.Time // identity → leaderrun exit
	orphans      []int                // child pids alive after their leaderrun
	// slots are a pool's trials, one per slot with its own ledger
	// (runPoolTrial); nil for a lock of one holder.
	slots []*trial
}

const candidates = 3

func runTrial(t testing.TB, st store, f fault, bin, child string, n int) *trial {
	if f.holders > 1 {
		return runPoolTrial(t, st, f, bin, child, n)
	}
	tr := &trial{t: t, store: st, timing: st.timings(), fault: f, bin: bin, child: child,
		ledger: newLedger(t), exits: map[string]time.Time{}}
	lock := fmt.Sprintf("faults-%d-%d", time.Now().UnixNano()%1e9, n)
	tr.begin = time.Now()
	for i := range candidates {
		storeArgs, proxies := st.candidate(t)
		id := fmt.Sprintf("c%d", i)
		args := append(append(append([]string{"--lock", lock, "--identity", id}, storeArgs...), tr.timing.args()...), "--", child)
		env := append(append(os.Environ(), candidateEnv(st)...), tr.ledger.env()...)
		if f.escape {
			env = append(env, "FAULTS_ESCAPE=1")
		}
		c := startCandidate(t, bin, id, args, env, proxies)
		tr.cands = append(tr.cands, c)
	}
	defer tr.teardown()

	leader, lf := tr.waitLeader(30*time.Second, "")
	if leader == nil {
		t.Errorf("%s: no leader within 30s", f.name)
		return tr
	}
	if f.escape && !tr.helperWrote(lf, 10*time.Second) {
		// The helper is a process of its own that may start late on a
		// loaded machine: the fault waits for it, or the trial proves
		// nothing about escaped helpers.
		t.Errorf("%s: the leader's escaped helper wrote nothing within 10s", f.name)
		return tr
	}
	tr.leaderAtFault, tr.tokenAtFault = leader.id, lf.Token
	tr.faultStart = time.Now()
	f.inject(tr, leader, lf.Pid)
	tr.faultEnd = time.Now()
	if f.failover {
		if next, _ := tr.waitLeader(3*tr.timing.lease+10*time.Second, leader.id); next == nil {
			t.Errorf("%s: no new leader within %v of the fault", f.name, 3*tr.timing.lease+10*time.Second)
		}
		if f.overlapAllowed {
			// Let the resumed old leader notice and stop its child.
			tr.waitExit(leader, 2*tr.timing.lease)
		}
		// Watch the new leader a little longer: a stale child writing late
		// would show here, and the timeline shows the new leader's bar.
		time.Sleep(time.Second)
	} else {
		// Watch for a false failover for as long as a lease could last.
		time.Sleep(tr.timing.lease + tr.timing.deadline)
	}
	return tr
}

// helperWrote waits until a writer other than lf's child wrote with lf's
// token: its escaped helper.
func (tr *trial) helperWrote(lf life, timeout time.Duration) bool {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		writes, _ := tr.ledger.snapshot()
		for _, w := range writes {
			if w.Token == lf.Token && w.Writer != lf.Writer {
				return true
			}
		}
	}
	return false
}

// waitLeader waits for a child of a candidate other than not that has had
// at least three writes accepted.
func (tr *trial) waitLeader(timeout time.Duration, not string) (*candidate, life) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		_, lives := tr.ledger.snapshot()
		for _, lf := range lives {
			if lf.Identity != not && lf.End.IsZero() && tr.ledger.accepted(lf.Writer) >= 3 {
				for _, c := range tr.cands {
					if c.id == lf.Identity {
						return c, lf
					}
				}
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil, life{}
}

func (tr *trial) waitExit(c *candidate, timeout time.Duration) {
	select {
	case <-c.done:
	case <-time.After(timeout):
	}
}

// teardown stops every candidate, records exits, finds orphaned children
// and closes the ledger.
func (tr *trial) teardown() {
	tr.stopCandidates()
	tr.closeLedger()
}

// stopCandidates stops every candidate and records its exit.
func (tr *trial) stopCandidates() {
	for _, c := range tr.cands {
		if !c.exited() {
			_ = c.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, c := range tr.cands {
		select {
		case <-c.done:
		case <-time.After(20 * time.Second):
			tr.t.Errorf("%s: candidate %s did not exit within 20s of SIGTERM\n%s", tr.fault.name, c.id, c.out.String())
			_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
			<-c.done
		}
		tr.exits[c.id] = c.exitAt
	}
}

// closeLedger finds orphaned children and closes the ledger.
func (tr *trial) closeLedger() {
	// Every child must be gone with its leaderrun: wait briefly for the
	// ledger to see the last connections close, then look.
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) && tr.openLives() > 0 {
		time.Sleep(5 * time.Millisecond)
	}
	_, lives := tr.ledger.snapshot()
	for _, lf := range lives {
		if lf.End.IsZero() {
			tr.orphans = append(tr.orphans, lf.Pid)
			_ = syscall.Kill(lf.Pid, syscall.SIGKILL)
		}
	}
	tr.end = time.Now()
	tr.ledger.close()
}

func (tr *trial) openLives() int {
	_, lives := tr.ledger.snapshot()
	n := 0
	for _, lf := range lives {
		if lf.End.IsZero() {
			n++
		}
	}
	return n
}
