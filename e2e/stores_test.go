//go:build linux

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// A store is one coordination store as the scenarios (scenarios_test.go)
// run leaderrun on it. Each entry of stores gets every scenario that its
// capabilities allow, as TestStores/<store>/<scenario>.
//
// To add a store, add one entry to stores, with:
//   - name: the --backend name, which status --json reports too;
//   - start: starts its server(s) for a test (testenv.StartX, which
//     stops them when the test ends) and returns a target: the flags and
//     environment that point leaderrun at it, and what an operator can do
//     to it (take the lease away, delete the lock's record, read it,
//     restart the server, put a proxy in the link);
//   - timings, and the bounds derived from them: how soon a waiting
//     follower takes over after a kill -9 (takeover) or a release
//     (handover);
//   - its capabilities, each of which a scenario may need: a field left
//     at its zero value (nil, false) says the store cannot, and the
//     scenarios that need it are skipped with the reason.
//
// A store's own tests, that no other store could run (its TLS, its
// authentication, its hostile servers, its clusters), stay in its own
// file and start its servers with internal/testenv as start does.
type store struct {
	name string
	// start starts the store's servers for t, stopped when t ends, and
	// returns a target on them. The scenarios of one store share one
	// start (each with locks of its own), except those that need one of
	// their own (scenario.own).
	start func(t *testing.T) *target
	// timings are the run's timings in most scenarios: short, so that
	// failovers take seconds, within the store's limits (Consul's TTL is
	// at least 10 s, Azure's lease 15 s).
	timings timings
	// runFlags are flags of a run (not of status or history) added to
	// every run.
	runFlags []string

	// takeover bounds how long after its leader's SIGKILL, or the stall
	// of its link, a waiting follower acquires the lock (by its log): the
	// store's expiry of the lease, plus how the follower learns of it (at
	// once, or at its next poll).
	takeover time.Duration
	// handover bounds how long after the leader's child exited on SIGTERM
	// a waiting follower acquires the lock (the median of a few trials):
	// the release, and the follower told of it, or polling for it.
	handover time.Duration
	// notice bounds how long after an operator took the lease away
	// (target.losses) its holder knows it, as `leaderrun check` in its
	// child tells: at once where the store tells it (a watch, a
	// notification), at its next read where it polls. The child's kill
	// signal comes within a second on every store (S3).
	notice time.Duration
	// statusBound is how long after its leader's SIGKILL status may still
	// say the lock is held: the lease by the store's own measure, and the
	// store's slack in noticing (see each store's page in docs/backends).
	statusBound time.Duration

	// expires: the store lets a lease go by itself once its holder stops
	// renewing; false for the local store, whose flock goes only with
	// the last process that holds it.
	expires bool
	// waiters: status reports how many candidates wait (queues, and the
	// local store); the others say -1 (waiters leave no trace, or the
	// store does not count them).
	waiters bool
	// ttl: status reports the lease's TTL; remaining: what is left of it.
	// Where a store does not tell, status says 0 (TTL) and -1.
	ttl, remaining bool
	// serial: the store's scenarios run one at a time, on one server,
	// because waiting counts what the whole server does (Kubernetes:
	// the apiserver's open watches of leases).
	serial bool
	// durable: the store keeps its data across a restart of its server
	// (target.stopServer and startServer), tokens included.
	durable bool
	// lostTerm: a job that takes its own lock away (loseCommand) and then
	// exits 0 ends a term that history calls lost: its leader knows of the
	// loss before the job's exit. Where it may learn of it only at the
	// marker's fenced write, the term may read as the job's exit 0.
	lostTerm bool

	// onceTimings are timings short enough for a takeover after a kill -9
	// to fit inside the cron fleet's --wait 4s (OncePerPeriod); zero:
	// the store's shortest lease cannot.
	onceTimings timings
	// escapeTimings leave one grace of margin, lease = deadline + 0.9 s
	// --kill-grace + 0.1 s, for EscapedHelper; zero: not run on this
	// store here.
	escapeTimings timings
	// credentials are environment variables, given to leaderrun, that
	// carry the store's credentials and must not reach the job unless
	// --pass-credentials; kept are variables of the same kind that a job
	// uses for its own work and that reach it always.
	credentials, kept []string
}

// timings are a run's --lease-duration, --renew-deadline, --retry-period
// and --kill-grace.
type timings struct{ lease, deadline, retry, grace time.Duration }

func (tm timings) flags() []string {
	return []string{"--lease-duration", tm.lease.String(), "--renew-deadline", tm.deadline.String(),
		"--retry-period", tm.retry.String(), "--kill-grace", tm.grace.String()}
}

// A target is one started store: how to reach it and what an operator can
// do to it. Fields left nil are what the store cannot do.
type target struct {
	// flags and env point leaderrun (run, status and history) at the
	// store.
	flags, env []string
	// link is host:port of the server leaderrun connects to; via gives
	// the flags and environment that reach the store through addr
	// instead, a testenv.Proxy in front of link that a scenario stalls
	// (nil: no link to break, as on the local store).
	link string
	via  func(addr string) (flags, env []string)
	// waiting, called before a candidate for lock starts, returns a
	// condition that holds once that candidate, p, waits in line: it has
	// read the holder's record and will be told of its release, or polls
	// for it.
	waiting func(t *testing.T, lock string) func(p *proc) bool
	// losses are the ways an operator takes the lease from its holder;
	// the first is the one scenarios use when they need one.
	losses []loss
	// settled, if not nil, reports whether the holder p is fully set up
	// to learn of a loss (PostgreSQL: it listens for notifications), which
	// a scenario waits for before it takes the lease away.
	settled func(p *proc) bool
	// marker, if not nil, is the identity that lock's completion marker
	// for key names, as the store keeps it; "" for none.
	marker func(t *testing.T, lock, key string) string
	// loseCommand is a shell command that takes lock from its holder, for
	// a job to run (OnceFailures).
	loseCommand func(t *testing.T, lock string) string
	// wipe deletes the lock's record by hand while no one holds it.
	wipe func(t *testing.T, lock string)
	// record is the lock's record as an operator reads it: --try, a
	// --wait that gives up and a withdrawn waiter leave it as it was.
	record func(t *testing.T, lock string) string
	// key is what status reports as lock's key, or how it begins.
	key func(lock string) string
	// stopServer stops the store's server(s), keeping their data and
	// ports, and startServer starts them again and waits until they
	// serve, as an operator's restart would: an outage in between.
	stopServer, startServer func(t testing.TB)
}

// loss is one way an operator takes the lease from its holder (S3): the
// holder must see it and signal its child within a second.
type loss struct {
	name string
	// extra are the leader's run flags for this loss.
	extra []string
	// do takes the lease from lock's holder and returns what the child's
	// signal is timed from; the zero time: from when do was called.
	do func(t *testing.T, e *env, lock string) time.Time
	// says is what the leader's log must say of it.
	says []string
	// takeover: a follower waits meanwhile and must take over, with a
	// greater token.
	takeover bool
}

// stores is every store the scenarios run on. The entries' start
// functions and operator actions are in each store's file.
var stores = []*store{
	etcdStore(),
	consulStore(),
	postgresStore(),
	kubernetesStore(),
	zookeeperStore(),
	redisStore(),
	dynamodbStore(),
	mysqlStore(),
	s3Store(),
	azureblobStore(),
	localStore(),
}

// statusWaiting is target.waiting for a store whose status reports the
// candidates that wait: one more than before p started.
func statusWaiting(flags, env []string) func(t *testing.T, lock string) func(p *proc) bool {
	return func(t *testing.T, lock string) func(p *proc) bool {
		st, _ := statusOf(t, env, append([]string{"--lock", lock}, flags...)...)
		before := max(st.Waiting, 0)
		waits := every(20*time.Millisecond, func() bool {
			st, _ := statusOf(t, env, append([]string{"--lock", lock}, flags...)...)
			return st.Waiting > before
		})
		return func(*proc) bool { return waits() }
	}
}

// logWaiting is target.waiting for a store that tells nobody of its
// waiters: the candidate's own log says it waits.
func logWaiting(says string) func(t *testing.T, lock string) func(p *proc) bool {
	return func(*testing.T, string) func(p *proc) bool {
		return func(p *proc) bool { return strings.Contains(p.stderr.String(), says) }
	}
}

// keyUnder is target.key for a key made of the prefix, the lock and
// what follows.
func keyUnder(format string) func(lock string) string {
	return func(lock string) string { return fmt.Sprintf(format, lock) }
}
