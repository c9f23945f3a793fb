// Package watchdog is the command's watchdog: leaderrun re-executed, the
// command's parent, which holds what must hold while leaderrun is frozen,
// starved or dead (docs/safety.md, S10). leaderrun's side of it is package
// signals, which imports this one for the protocol between the two
// (wire.go), their shared clock (Now) and the command's tree as leaderrun
// finds it once the watchdog died (Leftovers).
//
// The watchdog is this binary re-executed (the same file, so the same
// pages in memory) with Arg as its first argument; package takeover's init
// runs Main then. It prepares the command's cgroup while leaderrun
// campaigns; once leaderrun leads, it forks and execs the command, as its
// parent, and from then on holds:
//
//   - the renew deadline: leaderrun sends it after every acknowledged
//     renewal;
//   - the stop sequence (package stop): it feeds it the deadline, the stop
//     requests, its clock and the tree, and does what it says: kill signal
//     to the whole tree, SIGKILL at the instant, whoever asked first (S9);
//     at once if leaderrun's end of the socket closes while the tree runs;
//   - the tree: in a cgroup of its own where the kernel allows it, else
//     below the watchdog, a child subreaper, which every orphan of the
//     tree is re-parented to;
//   - a descriptor leaderrun hands it (the local backend's lock file),
//     until the tree is gone;
//   - the keeper (keeper_linux.go), its copy that ends the tree should it
//     die together with leaderrun (S11).
//
// It runs one loop on one locked OS thread (the command's parent-death
// signal belongs to the thread that forks it), polling its socket, a
// timerfd and the tree's descriptors. Its state is split by concept: the
// link to leaderrun (link.go), the command and its guard (command.go), the
// stop sequence (main.go), the keeper, the log (log.go).
//
// # What this package may import
//
// The watchdog takes the process over in package takeover's init, and
// every package initialised before it is memory the watchdog pays for,
// once per leading instance. Go initialises, at each step, the first
// package in import-path order whose imports are all initialised. This
// package's imports must therefore be initialised early too: the standard
// packages that fmt and os need already, os/signal, encoding/json (whose
// imports are those), golang.org/x/sys/unix and package stop. Not
// log/slog, os/exec, path/filepath, math/rand/v2 or context: each sorts
// after github.com/, golang.org/, google.golang.org/ and k8s.io/, so every
// third-party package that is ready (protobuf's descriptors, the stores'
// clients) would be initialised before them, and before the watchdog.
// Measured on the release build: with log/slog, 121 packages and 404 KB of
// allocations before the takeover; without, 82 packages and 83 KB
// (encoding/json adds none). The log is written by hand for that reason
// (log.go), and an e2e test (TestWatchdogInit) fails if a store's client
// is initialised before the takeover.
package watchdog
