package bench

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
	"github.com/leaderrun/leaderrun/signals/watchdog"
)

// rotate is order turned by i, so that no tool always runs first, right
// after another one's clean-up.
func rotate[T any](order []T, i int) []T {
	i %= len(order)
	return append(slices.Clone(order[i:]), order[:i]...)
}

// neverGiveUp: a tool that let the awaited event pass in its first runs
// this many times is not run again for that figure; "never" is the answer.
const neverGiveUp = 3

// settle is how long a process is left to reach its steady state (watch
// open, blocking query sent) before it is disturbed. It is outside every
// timed window.
const settle = 300 * time.Millisecond

// measureStartup times `BINARY version`, exec to exit, for each binary:
// what a Go program of that size costs to start before it does any work.
// The watchdog is leaderrun re-executed as one, with /dev/null for a
// socket: it exits 64 at its first check, once the packages it
// initialises are (see signals/watchdog), which is what it costs to
// become ready, bar the cgroup it then makes; with GOMAXPROCS and
// GODEBUG as leaderrun sets them for it.
func (b *bench) measureStartup() {
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		b.t.Fatal(err)
	}
	defer devNull.Close()
	type bin struct {
		id, bin string
		args    []string
		env     []string
		files   []*os.File // from fd 3
		code    int        // the exit status expected
	}
	bins := []bin{
		{id: "leaderrun", bin: b.lr, args: []string{"version"}}, {id: "etcdctl", bin: b.etcdctl, args: []string{"version"}},
		{id: "consul", bin: b.consul, args: []string{"version"}}, {id: "k8selector", bin: b.elector, args: []string{"-h"}, code: -1},
		{id: "child", bin: b.child, args: []string{"version"}},
		{id: "watchdog", bin: b.lr, args: []string{watchdog.Arg}, env: []string{"GOMAXPROCS=1", "GODEBUG=memprofilerate=0"},
			files: []*os.File{devNull}, code: 64}, // fd 3: never a socket
	}
	for _, x := range b.leaderruns()[1:] {
		bins = append(bins, bin{id: x.id, bin: x.bin, args: []string{"version"}})
	}
	for i := range min(b.runs, 20) {
		for _, x := range rotate(bins, i) {
			cmd := exec.Command(x.bin, x.args...)
			cmd.Env = append(b.baseEnv(), x.env...)
			cmd.ExtraFiles = x.files
			t0 := mono()
			err := cmd.Run()
			took := mono() - t0
			if cmd.ProcessState == nil {
				b.t.Errorf("%s %v: %v", x.bin, x.args, err)
				continue
			}
			// flag's -h exits 0 or 2 by Go version (code -1: any)
			if code := cmd.ProcessState.ExitCode(); x.code >= 0 && code != x.code {
				b.t.Errorf("%s %v: exit %d (%v), want %d", x.bin, x.args, code, err, x.code)
				continue
			}
			b.res.sample(b.res.startup, x.id).add(took)
			if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
				b.res.mu.Lock()
				b.res.startupRSS[x.id] = max(b.res.startupRSS[x.id], int(ru.Maxrss))
				b.res.mu.Unlock()
				b.res.sample(b.res.faults, x.id).add(time.Duration(ru.Minflt))
			}
		}
	}
}

// measureStartToChild: a free lock, each tool started and timed from the
// fork to its child's first instruction of main, and to its own exit
// (exec-to-exit: what a cron line waits for); the child exits at once.
// The client-go elector has no child: its figure is to OnStartedLeading,
// and it is told to stop then (no exec-to-exit).
func (b *bench) measureStartToChild() {
	tools := slices.Concat([]*tool{direct}, wrappers, b.compare)
	for i := range b.runs {
		for _, tl := range rotate(tools, i) {
			tag := fmt.Sprintf("%s-s2c-%d", tl.id, i)
			p, err := b.start(tl, tag, tag, b.addr(tl), false)
			if err != nil {
				b.t.Error(err)
				continue
			}
			k, ok := b.hub.started(tag, 15*time.Second)
			if !ok {
				b.t.Errorf("%s: no child within 15 s:\n%s", tl.name, p.tail())
				p.kill()
				continue
			}
			b.res.sample(b.res.s2c, tl.id).add(k.start - p.t0)
			if !p.waitExit(15 * time.Second) {
				b.t.Errorf("%s: still running 15 s after its child exited:\n%s", tl.name, p.tail())
				p.kill()
				continue
			}
			if tl.elector {
				continue
			}
			b.res.sample(b.res.exit, tl.id).add(p.exit - p.t0)
			if ru, ok := p.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok && tl.store != "" {
				b.res.sample(b.res.faults, tl.id).add(time.Duration(ru.Minflt))
			}
			if tl.leaderrun() && tl.bin == "" {
				b.breakdown(tl, p, k)
			}
		}
	}
}

// Where leaderrun's start-to-child goes, from its own log's timestamps
// (wall clock, read against the wall clock at the fork).
const (
	segStart    = "fork → \"campaigning\" logged (process start, flags, store client)"
	segCampaign = "→ \"leadership acquired\" logged (campaign: store round trips)"
	segChild    = "→ child's main (fork, exec, child start)"
)

var segments = []string{segStart, segCampaign, segChild}

func (b *bench) breakdown(tl *tool, p *proc, k kid) {
	ts := p.logTimes("campaigning", "leadership acquired")
	camp, okC := ts["campaigning"]
	won, okW := ts["leadership acquired"]
	if !okC || !okW {
		b.res.note(tl.id, "start-to-child", "a run's log lacked the campaigning/acquired lines")
		return
	}
	childAt := p.wall.Add(k.start - p.t0)
	add := func(seg string, d time.Duration) {
		b.res.sample(b.res.segments, tl.id+"/"+seg).add(d)
	}
	add(segStart, camp.Sub(p.wall))
	add(segCampaign, won.Sub(camp))
	add(segChild, childAt.Sub(won))
}

// rssRounds: RSS is a secondary figure (memory as a host pays it is Pss,
// measurePss), so two rounds, to keep the whole run near 15 minutes.
const rssRounds = 2

// measureRSS runs every wrapper as leader at once, each on its own lock,
// for leadFor, then reads VmHWM: the wrapper's own, and its helper
// processes' (every descendant except the child and what the child
// started); and, from smaps, their anonymous and file-backed pages and
// what the resident set is made of, mapping by mapping. rssRounds rounds;
// the largest counts.
func (b *bench) measureRSS() {
	const leadFor = 3 * time.Second
	for r := range rssRounds {
		procs := map[string]*proc{}
		for _, tl := range slices.Concat(wrappers, b.compare) {
			tag := fmt.Sprintf("%s-rss-%d", tl.id, r)
			p, err := b.start(tl, tag, tag, b.addr(tl), true)
			if err != nil {
				b.t.Error(err)
				continue
			}
			procs[tl.id] = p
		}
		kids := map[string]kid{}
		for id, p := range procs {
			k, ok := b.hub.started(p.tag, 15*time.Second)
			if !ok {
				b.t.Errorf("%s: no child within 15 s:\n%s", id, p.tail())
				continue
			}
			kids[id] = k
		}
		time.Sleep(leadFor) // leading: renewals and watches run meanwhile
		for id, p := range procs {
			k, ok := kids[id]
			if !ok {
				continue
			}
			rec := b.res.rss[id]
			hwm, _, err := testenv.Memory(p.pid())
			if err != nil {
				b.t.Errorf("%s: %v", id, err)
				continue
			}
			rec.wrapper = max(rec.wrapper, hwm)
			sm, err := readSmaps(p.pid())
			if err == nil && sm.anon >= rec.wrapperSmaps.anon {
				rec.wrapperSmaps = sm
			}
			skip := append([]int{k.pid}, descendants(k.pid)...)
			helpers, helperAnon, names := 0, 0, []string{}
			for _, d := range descendants(p.pid()) {
				if slices.Contains(skip, d) {
					continue
				}
				h, _, err := testenv.Memory(d)
				if err == nil {
					helpers += h
					names = append(names, argv0(d))
				}
				if sm, err := readSmaps(d); err == nil {
					helperAnon += sm.anon
					rec.helperSmaps = sm
				}
			}
			rec.helpers = max(rec.helpers, helpers)
			rec.helperAnon = max(rec.helperAnon, helperAnon)
			rec.helperNames = names
			b.res.rss[id] = rec
		}
		// etcdctl lock ignores SIGTERM while its command runs: stop all
		// at once, briefly.
		var wg sync.WaitGroup
		for _, p := range procs {
			wg.Go(func() { p.stop(syscall.SIGTERM, 2*time.Second) })
		}
		wg.Wait()
	}
}

// lossBound is how long a loss trial waits for tl to react.
func lossBound(tl *tool) time.Duration {
	if tl.lossBound > 0 {
		return tl.lossBound
	}
	return 5 * time.Second
}

// latencyRuns is how many loss and handover trials each tool gets: a
// sixth of the runs, at least 5 (5 at the default 30, so that the whole
// run stays near 15 minutes on 2 cores; with 5, p99 is the largest).
func latencyRuns(runs int) int { return max(5, runs/6) }

// measureLoss: the store ends the leader's lease from outside (see
// store.drop); the figure is the time from just before that request to
// the child's receipt of SIGTERM or SIGINT (client-go: the end of its
// leading context). "never" if none comes within the tool's bound.
func (b *bench) measureLoss() {
	runs := latencyRuns(b.runs)
	for i := range runs {
		for _, tl := range rotate(latencyTools, i) {
			s := b.res.sample(b.res.loss, tl.id)
			if len(s.vals) == 0 && s.never >= neverGiveUp {
				continue
			}
			r, err := b.lossTrial(tl, fmt.Sprintf("%s-loss-%d", tl.id, i))
			if err != nil {
				b.t.Error(err)
				continue
			}
			switch {
			case r.sig != 0:
				s.add(r.sig)
			case r.exit != 0:
				// Killed without a catchable signal first: stopped all the same.
				s.add(r.exit)
				b.res.note(tl.id, "loss reaction", "the child was killed without SIGTERM first")
			default:
				s.never++
				b.res.note(tl.id, "loss reaction", fmt.Sprintf("the child was not signalled and still ran %v after the loss; the wrapper %s", lossBound(tl), r.wrapper))
			}
		}
	}
	// consul lock as it runs by default, through a shell, once (unless
	// BENCH_STORES left Consul out).
	if b.stores["consul"] == nil {
		return
	}
	r, err := b.lossTrial(consulLockShell, "cns-loss-0")
	if err != nil {
		b.t.Error(err)
		return
	}
	what := "the command was not signalled"
	if r.sig != 0 {
		what = "the command got SIG" + r.sigName + " after " + fmtDur(r.sig)
	}
	b.res.note(consulLock.id, "loss reaction", fmt.Sprintf("with its default -shell (SHELL=/bin/sh, dash, which forks the command here instead of exec'ing it), one trial: %s; the wrapper %s", what, r.wrapper))
}

// lossResult is one loss trial: times from the loss to the child's
// signal or death (0: did not happen within the bound), and what the
// wrapper did.
type lossResult struct {
	sig, exit time.Duration
	sigName   string
	wrapper   string
}

func (b *bench) lossTrial(tl *tool, tag string) (lossResult, error) {
	var r lossResult
	st := b.storeOf(tl)
	st.prepare(tag)
	addr := b.addr(tl)
	p, err := b.start(tl, tag, tag, addr, true)
	if err != nil {
		return r, err
	}
	defer p.kill()
	k, ok := b.hub.started(tag, 15*time.Second)
	if !ok {
		return r, fmt.Errorf("%s: no child within 15 s:\n%s", tl.name, p.tail())
	}
	defer func() {
		if !tl.elector && alive(k.pid) {
			_ = syscall.Kill(k.pid, syscall.SIGKILL)
		}
	}()
	time.Sleep(settle)
	t0, err := st.drop(tl, tag, addr)
	if err != nil {
		return r, fmt.Errorf("%s: %w", tl.name, err)
	}
	bound := lossBound(tl)
	b.hub.wait(bound, func() bool { k := b.hub.kids[tag]; return k.sig != 0 || k.exit != 0 })
	k, _ = b.hub.get(tag)
	if k.sig != 0 {
		r.sig, r.sigName = k.sig-t0, k.sigName
	}
	if k.exit != 0 {
		r.exit = k.exit - t0
	}
	// leaderrun exits by itself (76) once its child is gone.
	if p.waitExit(3 * time.Second) {
		r.wrapper = fmt.Sprintf("exited %s after the loss (status %d)", fmtDur(p.exit-t0), p.cmd.ProcessState.ExitCode())
	} else {
		r.wrapper = fmt.Sprintf("was still running %v after the loss", bound+3*time.Second)
	}
	return r, nil
}

// measureHandover: a leader and one waiting follower; SIGTERM to the
// leader's wrapper; the figure is the time to the follower's child start.
// "never" if it does not start within 5 s.
func (b *bench) measureHandover() {
	runs := latencyRuns(b.runs)
	for i := range runs {
		for _, tl := range rotate(latencyTools, i) {
			s := b.res.sample(b.res.handover, tl.id)
			if len(s.vals) == 0 && s.never >= neverGiveUp {
				continue
			}
			lock := fmt.Sprintf("%s-ho-%d", tl.id, i)
			a, f, err := b.leaderAndFollower(tl, lock, b.addr(tl))
			if err != nil {
				b.t.Error(err)
				b.killAll()
				continue
			}
			t0 := mono()
			a.signal(syscall.SIGTERM)
			if k, ok := b.hub.started(f.tag, 5*time.Second); ok {
				s.add(k.start - t0)
			} else {
				s.never++
				if ka, _ := b.hub.get(a.tag); ka.sig == 0 && ka.exit == 0 {
					b.res.note(tl.id, "handover", "the leader's child was not signalled and kept running")
				}
			}
			if !a.waitExit(time.Second) {
				a.kill()
			}
			f.stop(syscall.SIGTERM, 5*time.Second)
		}
	}
}

// leaderAndFollower starts a leader of lock and, once its child runs, a
// follower, and returns when the store shows the follower waiting.
func (b *bench) leaderAndFollower(tl *tool, lock, addr string) (leader, follower *proc, err error) {
	b.storeOf(tl).prepare(lock)
	leader, err = b.start(tl, lock, lock+"-a", addr, true)
	if err != nil {
		return nil, nil, err
	}
	if _, ok := b.hub.started(leader.tag, 15*time.Second); !ok {
		return nil, nil, fmt.Errorf("%s: no child within 15 s:\n%s", tl.name, leader.tail())
	}
	follower, err = b.start(tl, lock, lock+"-b", addr, true)
	if err != nil {
		return nil, nil, err
	}
	if err := b.waitCandidates(tl, lock, []*proc{leader, follower}, 2, 15*time.Second); err != nil {
		return nil, nil, fmt.Errorf("%w:\n%s", err, follower.tail())
	}
	time.Sleep(settle)
	return leader, follower, nil
}

// crashResult is one kill -9 trial.
type crashResult struct {
	failover  time.Duration // -1: the follower's child never started
	oldDied   time.Duration // when the old child died after the kill; -1: alive 1 s later
	survived  bool          // the old child was still running 1 s after the kill
	bothAtOne bool          // the old child was still running when the new one started
}

// crashTrial: SIGKILL to the leader's wrapper only; how long until the
// follower's child starts (bounded), and what became of the old child.
func (b *bench) crashTrial(tl *tool, lock string, bound time.Duration) (crashResult, error) {
	res := crashResult{failover: -1, oldDied: -1}
	a, f, err := b.leaderAndFollower(tl, lock, b.addr(tl))
	if err != nil {
		return res, err
	}
	ka, _ := b.hub.get(a.tag)
	t0 := mono()
	a.signal(syscall.SIGKILL)
	if !tl.elector {
		if b.hub.wait(time.Second, func() bool { return b.hub.kids[a.tag].exit != 0 }) {
			ka, _ = b.hub.get(a.tag)
			res.oldDied = ka.exit - t0
		} else {
			res.survived = alive(ka.pid)
		}
	}
	if kf, ok := b.hub.started(f.tag, bound); ok {
		res.failover = kf.start - t0
		ka, _ = b.hub.get(a.tag)
		res.bothAtOne = !tl.elector && (ka.exit == 0 || ka.exit > kf.start)
	}
	if !tl.elector && alive(ka.pid) {
		_ = syscall.Kill(-ka.pid, syscall.SIGKILL)
		_ = syscall.Kill(ka.pid, syscall.SIGKILL)
	}
	a.waitExit(5 * time.Second)
	f.stop(syscall.SIGTERM, 5*time.Second)
	return res, nil
}

// measureCrash runs every store's trials at once, each store's on locks
// of its own: a store's rounds one after the other (each waits out a
// lease: the machine's noise does not matter there), leaderrun's and the
// reference's trial of a round side by side. Consul's trials all run at
// once: each waits out a lease and the lock-delay (consul lock's, a
// session invalidation up to 2×TTL and 15 s).
func (b *bench) measureCrash() {
	type job struct {
		tl   *tool
		lock string
	}
	record := func(j job, r crashResult, err error) {
		if err != nil {
			b.t.Error(err)
			return
		}
		s := b.res.sample(b.res.crash, j.tl.id)
		if r.failover < 0 {
			s.never++
		} else {
			s.add(r.failover)
		}
		if j.tl.elector {
			return
		}
		b.res.mu.Lock()
		defer b.res.mu.Unlock()
		c := b.res.crashOld[j.tl.id]
		c.trials++
		if r.survived {
			c.survived++
		} else if r.oldDied >= 0 {
			c.died = append(c.died, r.oldDied)
		}
		if r.bothAtOne {
			c.overlap++
		}
		b.res.crashOld[j.tl.id] = c
	}
	run := func(jobs []job, bound time.Duration) {
		var wg sync.WaitGroup
		for _, j := range jobs {
			wg.Go(func() {
				r, err := b.crashTrial(j.tl, j.lock, bound)
				record(j, r, err)
			})
		}
		wg.Wait()
	}
	var wg sync.WaitGroup
	for _, col := range storeColumns {
		if !col.latency {
			continue
		}
		tools := []*tool{col.lr}
		if col.ref != nil {
			tools = append(tools, col.ref)
		}
		wg.Go(func() {
			var all []job
			for i := range col.crashTrials {
				for _, tl := range tools {
					all = append(all, job{tl, fmt.Sprintf("%s-crash-%d", tl.id, i)})
				}
			}
			if col.crashTrials <= 2 {
				run(all, col.crashBound)
				return
			}
			for i := 0; i < len(all); i += len(tools) {
				run(all[i:i+len(tools)], col.crashBound)
			}
		})
	}
	wg.Wait()
}
