package watchdog

import "syscall"

// The stop sequence, as the watchdog runs it (docs/safety.md, S9): one
// SIGKILL instant, fixed when the first kill signal is sent, for the whole
// tree.

// step advances the command's life from what the clock and the tree say.
func (d *dog) step(now Instant) {
	if !d.started || d.gone {
		return
	}
	if d.gaveUp {
		if d.reaped {
			d.setGone()
		}
		return
	}
	if d.killAt == 0 {
		if d.deadline != 0 && now >= d.deadline {
			d.startStop(d.sig, now+Instant(d.grace), StopDeadline)
		} else if !d.reaped {
			return
		} else if d.last = d.t.members(); len(d.last) == 0 {
			d.setGone()
			return
		} else {
			d.startStop(d.sig, now+Instant(d.grace), StopLeftovers)
		}
	}
	d.last = d.t.members()
	if len(d.last) == 0 {
		if d.reaped {
			d.setGone()
		}
		return
	}
	switch {
	case !d.killed && now >= d.killAt:
		d.killed = true
		d.t.kill(d.last)
		d.send(NewFrame(MsgKilled))
		d.logger().Warn("still running at the end of --kill-grace; sent SIGKILL", "pgid", d.pid, "pids", pidsOf(d.last), "grace", d.grace)
	case d.killed && now >= d.killAt+Instant(survivalBound):
		d.logger().Error("processes of the command survived SIGKILL; giving up on them", "pgid", d.pid, "pids", pidsOf(d.last))
		d.gaveUp = true
		if d.reaped {
			d.setGone()
		}
	case d.killed:
		// Whatever appeared since (a fork racing with the SIGKILL) goes
		// the same way at once.
		d.t.kill(d.last)
	default:
		d.signalEscapees(d.last)
	}
}

// startStop begins the stop sequence with sig, SIGKILL at killAt.
func (d *dog) startStop(sig syscall.Signal, killAt Instant, why StopReason) {
	d.killAt, d.stopSig = killAt, sig
	if why == StopDeadline {
		d.logger().Error("renew deadline passed and leaderrun sent no newer one; the watchdog stops the child", "signal", Name(sig))
	}
	d.signalGroup(sig)
	d.last = d.t.members()
	d.signalEscapees(d.last)
	d.send(NewFrame(MsgStopping).U32(uint32(sig)).I64(int64(killAt)).U32(uint32(why)))
}

// signalGroup sends sig to the command's group, then SIGCONT so that a
// stopped group does not sit on it.
func (d *dog) signalGroup(sig syscall.Signal) {
	err := syscall.Kill(-d.pid, sig)
	if err == nil && sig != syscall.SIGKILL && sig != syscall.SIGCONT {
		_ = syscall.Kill(-d.pid, syscall.SIGCONT)
	}
	if err == nil {
		d.logger().Info("signalled child", "signal", Name(sig))
	}
}

// signalEscapees sends the sequence's signal to the members outside the
// command's group that have not had it yet: the group got it as a whole.
func (d *dog) signalEscapees(ms []member) {
	if d.killed {
		return
	}
	for _, m := range ms {
		if m.pgid == d.pid || d.signalled[m.pid] {
			continue
		}
		d.signalled[m.pid] = true
		_ = syscall.Kill(m.pid, d.stopSig)
		_ = syscall.Kill(m.pid, syscall.SIGCONT)
		d.logger().Info("signalled a process that left the command's group", "process", m.pid, "signal", Name(d.stopSig))
	}
}

// orphaned is leaderrun gone without a word: the whole tree gets SIGKILL
// at once (S4, S10).
func (d *dog) orphaned() {
	d.peerGone = true
	if !d.started || d.gone {
		return
	}
	ms := d.t.members()
	d.t.kill(ms)
	if d.killAt == 0 || d.killAt > Now() {
		d.killAt, d.stopSig = Now(), syscall.SIGKILL
	}
	d.killed = true
	d.logger().Error("leaderrun is gone; the watchdog killed the command's tree", "pids", pidsOf(ms), "guard", d.guard)
}

func (d *dog) setGone() {
	d.gone = true
	if d.cg != nil {
		d.removeCgroup()
	}
	d.send(NewFrame(MsgGone))
}

// removeCgroup removes the command's cgroup, once the tree is gone, or
// says why it cannot.
func (d *dog) removeCgroup() {
	if err := d.cg.remove(); err != nil {
		d.logger().Warn("cannot remove the command's cgroup", "cgroup", d.cg.dir, "error", err)
	}
}
