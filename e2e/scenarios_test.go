//go:build linux

package e2e

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A scenario is one end-to-end check that runs the same way on every
// store (stores_test.go): TestStores runs each on each store, as
// TestStores/<store>/<scenario>.
//
// To add a scenario, add one entry to scenarios: a name (CamelCase, also
// the prefix of its locks), a run function that drives leaderrun only
// through the env it is given (e.run, e.status, e.output, e.follower, the
// target's operator actions), and, if it needs a capability that not
// every store has, a skip function that names the missing one. If no
// store field says what it needs yet (the store can be stopped for an
// outage, say), add that field to store or target, fill it in where a
// store can, and skip where it is nil. A scenario that restarts or
// stops the store's server sets own, to get a server of its own.
//
// For example, issue 41's outage (the store's server stopped for 2 s
// while a candidate waits with --wait 30s) is one row,
//
//	{name: "OutageDuringWait", run: testOutageDuringWait, own: true},
//
// whose run calls t.Skip where e.stopServer is nil (the local store has
// no server), and otherwise stops the server with e.stopServer, waits,
// and starts it again with e.startServer; store.durable says whether the
// server kept its data.
//
// Scenarios run in parallel with each other and with the other stores':
// time them from the events the processes record and from leaderrun's
// own clocks, bound them by the store's timings (store.takeover,
// store.handover), and wait on conditions, never on sleeps.
type scenario struct {
	name string
	run  func(t *testing.T, e *env)
	// skip says why the store cannot run the scenario; "" if it can.
	// nil: every store can.
	skip func(s *store) string
	// own: the scenario starts the store's servers for itself rather
	// than share the store's (a serial store's it may use: nothing else
	// runs on them meanwhile).
	own bool
	// alone: the scenario checks a bound of tens of milliseconds that a
	// busy machine could take from leaderrun: TestStoresAlone runs it,
	// on each store in turn, with no other test of the package beside it,
	// on servers of its own.
	alone bool
}

// scenarios are the rows of the matrix; each runs on every store that its
// skip allows. The run functions are in scenario_*_test.go.
var scenarios = []scenario{
	{name: "Handovers", run: testHandovers},
	{name: "LossReported", run: testLossReported},
	{name: "Kill9Leader", run: testKill9Leader},
	{name: "SigtermHandover", run: testSigtermHandover},
	{name: "StalledLeader", run: testStalledLeader},
	{name: "PausedLeader", run: testPausedLeader},
	{name: "TryAndWait", run: testTryAndWait},
	{name: "StatusAndHistory", run: testStatusAndHistory},
	{name: "StatusAfterLeaderKilled", run: testStatusAfterLeaderKilled},
	{name: "Check", run: testCheck},
	{name: "OncePerPeriod", run: testOncePerPeriod, skip: func(s *store) string {
		if s.onceTimings == (timings{}) {
			return "the store's shortest lease does not fit a takeover inside the fleet's --wait 4s"
		}
		return ""
	}},
	{name: "OnceDone", run: testOnceDone},
	{name: "OnceFailures", run: testOnceFailures},
	{name: "Holders", run: testHolders},
	{name: "ProgressTimeout", run: testProgressTimeout},
	{name: "EscapedHelper", run: testEscapedHelper, alone: true, skip: func(s *store) string {
		if s.escapeTimings == (timings{}) {
			return "escape_test.go runs it on " + s.name
		}
		return ""
	}},
	{name: "CredentialsStayOut", run: testCredentialsStayOut, skip: func(s *store) string {
		if len(s.credentials) == 0 {
			return "no credentials of the store's own in the environment to withhold"
		}
		return ""
	}},
	{name: "TokensSurviveRestart", run: testTokensSurviveRestart, own: true, skip: func(s *store) string {
		if !s.durable {
			return "the store's server keeps no data across a restart"
		}
		return ""
	}},
	{name: "OutageDuringWait", run: testOutageDuringWait, own: true},
	{name: "OutagePastWait", run: testOutagePastWait, own: true},
	{name: "KilledTogether", run: testKilledTogether},
}

// TestStores runs every scenario on every store, but those that run
// alone. The stores run side by side; the scenarios of a store share its
// servers and run side by side too, unless the store is serial.
func TestStores(t *testing.T) {
	t.Parallel()
	for _, s := range stores {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			shared := s.start(t)
			for _, sc := range scenarios {
				t.Run(sc.name, func(t *testing.T) {
					if why := skipped(sc, s); why != "" {
						t.Skip(why)
					}
					if sc.alone {
						t.Skip("TestStoresAlone runs it")
					}
					if !s.serial {
						t.Parallel()
					}
					run(t, sc, s, shared)
				})
			}
		})
	}
}

// TestStoresAlone runs the scenarios that run alone, one store after the
// other, on servers of their own: a test that is not parallel runs before
// any parallel one of the package starts.
func TestStoresAlone(t *testing.T) {
	for _, sc := range scenarios {
		if !sc.alone {
			continue
		}
		for _, s := range stores {
			t.Run(s.name+"/"+sc.name, func(t *testing.T) {
				if why := skipped(sc, s); why != "" {
					t.Skip(why)
				}
				run(t, sc, s, s.start(t))
			})
		}
	}
}

// skipped says why the store cannot run the scenario, "" if it can.
func skipped(sc scenario, s *store) string {
	if sc.skip == nil {
		return ""
	}
	return sc.skip(s)
}

// run runs sc on s, on the target given or, if sc needs one of its own,
// on a new one.
func run(t *testing.T, sc scenario, s *store, tg *target) {
	// A copy of the store: a scenario may change its own (its timings,
	// say).
	st := *s
	e := &env{store: &st, target: tg, name: strings.ToLower(sc.name)}
	if sc.own && !s.serial {
		e.target = s.start(t)
	}
	sc.run(t, e)
}

// env is one store, started, as a scenario drives it.
type env struct {
	*store
	*target
	// name is the scenario's, lower case: the prefix of its locks.
	name string
}

// lock is a lock name of the scenario's own: no other scenario on the
// same server uses it. Lower case: a Kubernetes Lease's name must be.
func (e *env) lock(name string) string { return e.name + "-" + strings.ToLower(name) }

// args are a run's flags for lock as identity id, on the store, with the
// store's timings, then extra.
func (e *env) args(lock, id string, extra ...string) []string {
	return e.argsWith(e.flags, lock, id, extra...)
}

func (e *env) argsWith(flags []string, lock, id string, extra ...string) []string {
	a := append(append([]string{"--lock", lock, "--identity", id}, flags...), e.timings.flags()...)
	return append(append(a, e.runFlags...), extra...)
}

// run starts leaderrun on lock as id with the recording child in mode
// (see childMain), recording to events.
func (e *env) run(t *testing.T, events, mode, lock, id string, extra ...string) *proc {
	t.Helper()
	return start(t, append(childEnv(events, mode), e.env...), cmdArgs(t, e.args(lock, id, extra...))...)
}

// runVia is run with the store reached through addr (a proxy in front of
// the target's link).
func (e *env) runVia(t *testing.T, addr, events, mode, lock, id string, extra ...string) *proc {
	t.Helper()
	flags, env := e.via(addr)
	return start(t, append(childEnv(events, mode), env...), cmdArgs(t, e.argsWith(flags, lock, id, extra...))...)
}

// job starts leaderrun on lock as id running argv (after "--" in args),
// with env added.
func (e *env) job(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	return start(t, append(slices.Clone(e.env), env...), args...)
}

// follower starts a candidate on lock, as run does, and waits until it
// waits in line behind the holder.
func (e *env) follower(t *testing.T, events, mode, lock, id string, extra ...string) *proc {
	t.Helper()
	waiting := e.waiting(t, lock)
	p := e.run(t, events, mode, lock, id, extra...)
	waitFor(t, 20*time.Second, id+" to wait for "+lock, func() bool { return p.exited() || waiting(p) })
	if p.exited() {
		t.Fatalf("%s exited %d instead of waiting:\n%s", id, p.code, p.stderr.String())
	}
	return p
}

// leader starts a candidate on lock, as run does, and waits until its
// child runs; it returns the child's start.
func (e *env) leader(t *testing.T, events, mode, lock, id string, extra ...string) (*proc, event) {
	t.Helper()
	p := e.run(t, events, mode, lock, id, extra...)
	evs := waitEvents(t, events, 30*time.Second, id+"'s child", etcdHas("start", id))
	ev, _ := etcdFind(evs, "start", id)
	return p, ev
}

// status is `leaderrun status --json` of lock, parsed, and its exit code.
func (e *env) status(t *testing.T, lock string, extra ...string) (etcdStatus, int) {
	t.Helper()
	return statusOf(t, e.env, append(append([]string{"--lock", lock}, e.flags...), extra...)...)
}

// output runs `leaderrun command --lock lock` on the store, with extra,
// to the end: what a script reads of it (see outputEnv), and its exit
// code.
func (e *env) output(t *testing.T, command, lock string, extra ...string) (string, int) {
	t.Helper()
	return outputEnv(t, e.env, append(append([]string{command, "--lock", lock}, e.flags...), extra...)...)
}

// history is `leaderrun history --json` of lock, parsed, newest first.
func (e *env) history(t *testing.T, lock string) []historyTerm {
	t.Helper()
	out, code := e.output(t, "history", lock, "--json", "--limit", "100")
	if code != 0 {
		t.Fatalf("history --json: exit %d: %s", code, out)
	}
	return parseHistory(t, out)
}

// trials is $E2E_TRIALS, or def: how many times a scenario repeats what
// it measures.
func trials(t *testing.T, def int) int {
	t.Helper()
	s := os.Getenv("E2E_TRIALS")
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("E2E_TRIALS=%q: want a positive number", s)
	}
	return n
}
