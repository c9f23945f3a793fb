// Package signals supervises the child command: its watchdog forks it
// into a process group of its own, forwards signals to the group, stops it
// (kill signal, grace period, SIGKILL), clears whatever the command left
// behind, and turns the way it ended into an exit code.
//
// The processes of a run:
//
//	leaderrun                  (campaigns, renews, sends the deadlines; a child subreaper)
//	└── leaderrun-dog          (the watchdog: this binary re-executed, launched by cmd once
//	    │                       the command line is a run, adopted by Prepare; package
//	    │                       signals/watchdog, entered through package takeover's init)
//	    ├── COMMAND            (leader of its own process group, in a cgroup of its own
//	    │   └── grandchildren   where possible, SIGKILL as its parent-death signal)
//	    └── lr-keeper          (the watchdog's copy, forked right after the command: it
//	                            ends the tree if leaderrun and the watchdog die together)
//
// The watchdog is the command's parent, so that what must hold while
// leaderrun is frozen, starved or dead (docs/safety.md, S10) is held by a
// process that is none of those. If the watchdog dies, the command dies of
// its parent-death signal and leaderrun, a subreaper too, ends the rest
// (fallback.go); if leaderrun is gone as well, the keeper does (S11).
//
// The stop sequence is decided in one place, package stop, and carried out
// by three drivers, each with only who may act and on what clock: the
// watchdog (every action, on its own clock), leaderrun's backstop
// (backstop.go: only its SIGKILL, a moment after the watchdog's, for a
// frozen watchdog), and leaderrun's fallback (SIGKILL at once, once the
// watchdog died).
package signals
