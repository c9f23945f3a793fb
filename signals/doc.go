// Package signals supervises the child command: its watchdog forks it
// into a process group of its own, forwards signals to the group, stops it
// (kill signal, grace period, SIGKILL), clears whatever the command left
// behind, and turns the way it ended into an exit code.
//
// Process tree while a command runs:
//
//	leaderrun                  (campaigns, renews, sends the deadlines)
//	└── leaderrun-dog          (the watchdog: this binary re-executed; package signals/watchdog)
//	    └── COMMAND            (leader of its own process group, in a cgroup of its own where possible)
//	        └── grandchildren  (same process group unless they leave it)
//
// The watchdog is the command's parent, so that what must hold while
// leaderrun is frozen, starved or dead (docs/safety.md, S10) is held by a
// process that is none of those: the renew deadline, which leaderrun sends
// after every acknowledged renewal; the one stop sequence (S9), whoever
// starts it; the whole tree, escapees included, in a cgroup of its own
// (cgroup.kill) or below the watchdog as a child subreaper; and SIGKILL to
// all of it the moment leaderrun's end of the socket closes without a word.
// The command's parent-death signal (SIGKILL, set with the watchdog's
// forking thread locked) ends the command if the watchdog itself dies;
// leaderrun, a subreaper too, then ends the rest.
//
// This package is leaderrun's side (Supervisor, Child); the watchdog's is
// package signals/watchdog, which may import only what is initialised
// early (see its doc.go).
package signals
