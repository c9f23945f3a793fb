// Package signals supervises the child command: its watchdog forks it
// into a process group of its own, forwards signals to the group, stops it
// (kill signal, grace period, SIGKILL), clears whatever the command left
// behind, and turns the way it ended into an exit code.
//
// The processes of a run, and who starts each:
//
//	leaderrun                  (campaigns, renews, sends the deadlines; a child subreaper)
//	└── leaderrun-dog          (the watchdog: this binary re-executed, launched by cmd once
//	    │                       the command line is a run, adopted by Prepare; package
//	    │                       signals/watchdog, entered through package takeover's init)
//	    ├── COMMAND            (leader of its own process group, in a cgroup of its own
//	    │   │                   where possible, SIGKILL as its parent-death signal)
//	    │   └── grandchildren  (same process group unless they leave it)
//	    └── lr-keeper          (the watchdog's copy, forked without exec right after
//	                            the command: it ends the tree if leaderrun and the
//	                            watchdog die together)
//
// The watchdog is the command's parent, so that what must hold while
// leaderrun is frozen, starved or dead (docs/safety.md, S10) is held by a
// process that is none of those: the renew deadline, which leaderrun sends
// after every acknowledged renewal; the one stop sequence (S9, package
// stop), whoever starts it; the whole tree, escapees included, in a cgroup
// of its own (cgroup.kill) or below the watchdog as a child subreaper; and
// SIGKILL to all of it the moment leaderrun's end of the socket closes
// while it runs. The command's parent-death signal ends the command if the
// watchdog dies; leaderrun, a subreaper too, then ends the rest (fallback.go),
// and if leaderrun is gone as well, the keeper does (S11).
//
// The stop sequence is decided in one place, package stop, and carried
// out by three drivers, each with only what is its own: the watchdog (every
// action, on its own clock), leaderrun's backstop (backstop.go: its
// SIGKILL alone, a moment after the watchdog's, for a frozen watchdog), and
// leaderrun's fallback (fallback.go: SIGKILL at once, once the watchdog
// died).
//
// This package is leaderrun's side (Supervisor, Child); the watchdog's is
// package signals/watchdog, which may import only what is initialised
// early (see its doc.go).
package signals
