// Package watchdog is the command's watchdog: leaderrun re-executed, the
// command's parent, which holds what must hold while leaderrun is frozen,
// starved or dead (docs/safety.md, S10). leaderrun's side of it is package
// signals (signals.Supervisor), which imports this one for the protocol
// between the two (wire.go), their shared clock and the command's tree.
//
// The watchdog is this binary re-executed (the same file, so the same
// pages in memory) with Arg as its first argument. leaderrun
// launches it from this package's init when its arguments look like a run
// (launch.go), or else when the runner is built, so that it starts while
// leaderrun connects and campaigns; once it leads, the watchdog forks and
// execs the command, as its parent, and from then on it holds what must
// hold even if leaderrun is frozen, starved or killed (docs/safety.md,
// S10):
//
//   - the renew deadline: leaderrun sends it after every acknowledged
//     renewal; if it passes with no newer one, the watchdog starts the stop
//     sequence itself;
//   - the stop sequence: kill signal to the whole tree, SIGKILL at the
//     SIGKILL instant, whoever asked first (S9): it runs here, once;
//   - the tree: in a cgroup of its own where the kernel allows it, else
//     below the watchdog, a child subreaper, which every orphan of the tree
//     is re-parented to; when leaderrun dies, the whole tree gets SIGKILL at
//     once;
//   - a descriptor leaderrun hands it (the local backend's lock file),
//     until the tree is gone.
//
// It runs one loop on one locked OS thread (the command's parent-death
// signal belongs to the thread that forks it), polling its socket, a
// timerfd and the tree's descriptors. See wire.go for the protocol.
//
// # What this package may import
//
// The watchdog takes over the process in this package's init, and every
// package initialised before it is memory the watchdog pays for, once per
// leading instance. Go initialises, at each step, the first package in
// import-path order whose imports are all initialised. This package's
// imports must therefore be initialised early too: the standard packages
// that fmt and os need already, os/signal, and golang.org/x/sys/unix. Not
// log/slog, os/exec, path/filepath, math/rand/v2 or context: each sorts
// after github.com/, golang.org/, google.golang.org/ and k8s.io/, so every
// third-party package that is ready (protobuf's descriptors, the stores'
// clients) would be initialised before them, and before the watchdog.
// Measured on the release build: with them, 133 packages and 416 KB of
// allocations before the takeover; without, see docs/performance.md. The
// log is written by hand for that reason (log.go), and an e2e test
// (TestWatchdogInit) fails if a store's client is initialised before the
// takeover.
package watchdog
