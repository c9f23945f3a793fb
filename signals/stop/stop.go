// Package stop is the stop sequence of a command's tree as one decision
// function (docs/safety.md, S9): from the deadline, the stop requests,
// the time and the tree's members, Sequence.Next says what to do, and
// does nothing itself. Its drivers keep only who may act and on what
// clock: the watchdog does every action on its own clock (Orphaned once
// leaderrun is gone); leaderrun's backstop, on leaderrun's clock with a
// grace a moment longer, only the SIGKILL, for a frozen watchdog;
// leaderrun's fallback, once the watchdog died, SIGKILL at once
// (Orphaned). It imports nothing that the watchdog's early start may not.
package stop

import (
	"syscall"
	"time"
)

// Instant is a point on the driver's clock, in nanoseconds.
type Instant int64

// Add is i + d.
func (i Instant) Add(d time.Duration) Instant { return i + Instant(d) }

// Member is a live process of the command's tree: its pid and its process
// group. Zombies are not members.
type Member struct{ Pid, Pgid int }

// Reason says what started a sequence.
type Reason uint8

const (
	// Asked: a stop request (leaderrun lost the lease, got a signal, or
	// the command made no progress).
	Asked Reason = iota + 1
	// Deadline: the renew deadline passed with no newer one (S2, S10).
	Deadline
	// Leftovers: the command exited and left processes behind.
	Leftovers
	// Orphaned: nobody else guards the tree any more (leaderrun, or its
	// watchdog, is gone): SIGKILL at once, no grace.
	Orphaned
)

// Survival is how long after its SIGKILL the sequence waits for
// processes that SIGKILL did not end (uninterruptible sleep).
const Survival = 5 * time.Second

// Input is what the driver knows at one instant.
type Input struct {
	Now Instant
	// Deadline is when the tree must have had the kill signal (zero:
	// none); ignored once the sequence runs.
	Deadline Instant
	// Stops are the stop requests since the last call, in order: the
	// first starts the sequence, a later one with another signal is only
	// forwarded to the group (S6).
	Stops    []syscall.Signal
	Orphaned bool // the other guard of the tree is gone
	Exited   bool // the command has been reaped
	// Members lists the tree's live processes; Next calls it at most
	// once, and only once the sequence runs or the command has exited.
	Members func() []Member
}

// Kind is what an Action does.
type Kind uint8

const (
	// Signal sends Signal (then SIGCONT) to the command's group if
	// Group, and to each of Pids (members that left the group). The
	// first of a sequence carries its Reason and KillAt.
	Signal Kind = iota + 1
	// Kill sends SIGKILL to the whole tree (Pids: its members as last
	// seen). The first carries the sequence's Reason.
	Kill
	// GiveUp: Pids survived SIGKILL for Survival.
	GiveUp
	// Done: the tree is gone (or given up on) and the command reaped.
	Done
)

// Action is one thing to do, now.
type Action struct {
	Kind   Kind
	Signal syscall.Signal
	Group  bool
	Pids   []int
	Reason Reason  // the first Signal or Kill of a sequence
	KillAt Instant // the first Signal
}

// Sequence is one command's stop sequence. Set Signal (the first signal
// when the deadline or leftovers start it; a request brings its own),
// Grace (first signal to SIGKILL, for the whole tree: S9) and Group (the
// command's process group) before the first Next.
type Sequence struct {
	Signal syscall.Signal
	Grace  time.Duration
	Group  int

	why                  Reason // zero until it starts
	sig                  syscall.Signal
	killAt               Instant
	killed, gaveUp, done bool
	signalled            map[int]bool // members outside the group that had sig
}

// Started reports whether the sequence runs, and why.
func (s *Sequence) Started() (Reason, bool) { return s.why, s.why != 0 }

// Next decides what to do at in.Now, and when to ask again at the latest
// (zero: when something changes: a message, the tree, the command's exit).
func (s *Sequence) Next(in Input) ([]Action, Instant) {
	if s.done {
		return nil, 0
	}
	t := lazyTree{read: in.Members}
	tree := &t
	var acts []Action
	for _, sig := range in.Stops {
		switch {
		case s.why == 0:
			acts = s.start(acts, in.Now, sig, Asked, tree)
		case sig != s.sig && !s.killed:
			// The sequence runs already: its SIGKILL instant stands;
			// another signal reaches the group as leaderrun forwards it.
			acts = append(acts, Action{Kind: Signal, Signal: sig, Group: true})
		}
	}
	if s.why == 0 {
		switch {
		case in.Orphaned:
			s.why, s.sig, s.killAt = Orphaned, syscall.SIGKILL, in.Now
		case in.Deadline != 0 && in.Now >= in.Deadline:
			acts = s.start(acts, in.Now, s.Signal, Deadline, tree)
		case in.Exited && len(tree.members()) == 0:
			s.done = true
			return append(acts, Action{Kind: Done}), 0
		case in.Exited:
			acts = s.start(acts, in.Now, s.Signal, Leftovers, tree)
		default:
			return acts, in.Deadline
		}
	}
	if in.Orphaned && !s.killed && s.killAt > in.Now {
		s.killAt = in.Now // nobody is left to wait for: no more grace
	}
	return s.follow(acts, in, tree.members())
}

// start begins the sequence with sig, SIGKILL a grace later: the group gets
// sig, and so does every member outside it.
func (s *Sequence) start(acts []Action, now Instant, sig syscall.Signal, why Reason, tree *lazyTree) []Action {
	s.why, s.sig, s.killAt = why, sig, now.Add(s.Grace)
	a := Action{Kind: Signal, Signal: sig, Group: true, Reason: why, KillAt: s.killAt}
	a.Pids = s.escapees(tree.members())
	return append(acts, a)
}

// follow is the sequence once started: until the instant, the signal for
// members that left the group since; then SIGKILL, again for whatever
// appears, giving up Survival later.
func (s *Sequence) follow(acts []Action, in Input, ms []Member) ([]Action, Instant) {
	if len(ms) == 0 || s.gaveUp {
		if in.Exited {
			s.done = true
			acts = append(acts, Action{Kind: Done})
		}
		return acts, 0 // the command's exit wakes the driver
	}
	switch {
	case !s.killed && in.Now >= s.killAt:
		s.killed = true
		acts = append(acts, Action{Kind: Kill, Pids: pidsOf(ms), Reason: s.why})
	case s.killed && in.Now >= s.killAt.Add(Survival):
		s.gaveUp = true
		acts = append(acts, Action{Kind: GiveUp, Pids: pidsOf(ms)})
		if in.Exited {
			s.done = true
			acts = append(acts, Action{Kind: Done})
		}
		return acts, 0
	case s.killed:
		// A fork that raced with the SIGKILL goes the same way.
		acts = append(acts, Action{Kind: Kill, Pids: pidsOf(ms)})
	default:
		if pids := s.escapees(ms); len(pids) > 0 {
			acts = append(acts, Action{Kind: Signal, Signal: s.sig, Pids: pids})
		}
	}
	if s.killed {
		return acts, s.killAt.Add(Survival)
	}
	return acts, s.killAt
}

// escapees are the members outside the group that have not had the
// signal yet (now marked).
func (s *Sequence) escapees(ms []Member) []int {
	var pids []int
	for _, m := range ms {
		if m.Pgid == s.Group || s.signalled[m.Pid] {
			continue
		}
		if s.signalled == nil {
			s.signalled = map[int]bool{}
		}
		s.signalled[m.Pid] = true
		pids = append(pids, m.Pid)
	}
	return pids
}

// lazyTree reads the tree at most once per Next (not a closure: an idle
// Next allocates nothing).
type lazyTree struct {
	read   func() []Member
	ms     []Member
	looked bool
}

func (t *lazyTree) members() []Member {
	if !t.looked && t.read != nil {
		t.ms, t.looked = t.read(), true
	}
	return t.ms
}

func pidsOf(ms []Member) []int {
	pids := make([]int, len(ms))
	for i, m := range ms {
		pids[i] = m.Pid
	}
	return pids
}
