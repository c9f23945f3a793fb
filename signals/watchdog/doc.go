// Package watchdog is the command's watchdog: leaderrun re-executed
// (package takeover's init runs Main), the command's parent, which holds
// what must hold while leaderrun is frozen, starved or dead
// (docs/safety.md, S10): the renew deadline; the stop sequence (package
// stop), fed the deadline, the stop requests, its own clock and the tree,
// whose actions it carries out, at once if leaderrun's end of the socket
// closes while the tree runs; the tree, in a cgroup of its own where the
// kernel allows it, else below the watchdog as a child subreaper; a
// descriptor leaderrun hands it (the local backend's lock file) until the
// tree is gone; and the keeper (keeper_linux.go), which ends the tree if
// the watchdog dies together with leaderrun (S11). leaderrun's side is
// package signals, which imports this one for the protocol (wire.go), the
// shared clock (Now) and the tree as leaderrun finds it once the watchdog
// died (Leftovers).
//
// It runs one loop on one locked OS thread (the command's parent-death
// signal belongs to the thread that forks it), polling its socket, a
// timerfd and the tree's descriptors. Its state is split by concept: the
// link to leaderrun (link.go), the command and its guard (command.go), the
// stop sequence (main.go), the keeper, the log (log.go).
//
// # What this package may import
//
// Every package initialised before the takeover is memory the watchdog
// pays for, once per leading instance. Go initialises, at each step, the
// first package in import-path order whose imports are all initialised,
// so this package's imports must be initialised early too: the standard
// packages that fmt and os need already, os/signal, encoding/json (whose
// imports are those), golang.org/x/sys/unix and package stop. Not log/slog,
// os/exec, path/filepath or context: each sorts after github.com/,
// golang.org/, google.golang.org/ and k8s.io/, so every third-party
// package that is ready (protobuf's descriptors, the stores' clients)
// would be initialised before them. Measured on the release build: with
// log/slog, 121 packages and 404 KB of allocations before the takeover;
// without, 82 packages and 83 KB (encoding/json adds none). The log is
// written by hand for that reason (log.go), and an e2e test
// (TestWatchdogInit) fails if a store's client is initialised first.
package watchdog
