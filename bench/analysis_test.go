package bench

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// analysis explains each goal that was missed, with the run's numbers;
// then, store by store, what the figures that depend on each store's
// design come from; then what the other tools did where they did not do
// the job at all.
func (r *results) analysis() string {
	var b strings.Builder
	b.WriteString("## Analysis\n\n")
	goals := r.goals()
	met := 0
	for _, g := range goals {
		if g.met {
			met++
		}
	}
	if met == len(goals) {
		fmt.Fprintf(&b, "Every goal was met in this run (%d of %d).\n\n", met, len(goals))
	} else {
		fmt.Fprintf(&b, "%d of %d goals were met in this run. Missed:\n\n", met, len(goals))
	}
	up := func(id string) time.Duration { return r.p50(r.startup, id) }
	memoryMissed := false
	for _, g := range goals {
		if g.met {
			continue
		}
		col := columnTitled(g.store)
		fmt.Fprintf(&b, "- **%s** — target %s, measured %s. ", g.name, g.goal, g.measured)
		switch g.kind {
		case goalS2C, goalExit:
			own, other := col.lr, col.ref
			otherBin := map[string]string{"etcd": "etcdctl", "consul": "consul"}[col.name]
			child := r.p50(r.s2c, direct.id)
			segP50 := func(s string) time.Duration { return r.p50(r.segments, own.id+"/"+s) }
			fmt.Fprintf(&b, "The gap is %s at the median (exec-to-exit: %s). Where leaderrun's time goes (p50 of each part, from its own log): %s from the fork to logging \"campaigning\" (process start, flags, store client), %s campaigning until \"leadership acquired\", and %s from there to the child's `main` (the child alone takes %s to start). ",
				fmtDur(r.p50(r.s2c, own.id)-r.p50(r.s2c, other.id)), signed(r.p50(r.exit, own.id)-r.p50(r.exit, other.id)),
				fmtDur(segP50(segStart)), fmtDur(segP50(segCampaign)), fmtDur(segP50(segChild)), fmtDur(child))
			if otherBin != "" {
				otherLock := r.p50(r.s2c, other.id) - up(otherBin) - child
				fmt.Fprintf(&b, "`leaderrun version` starts and exits in %s (`%s version` in %s); %s's start-to-child less its binary's start and the child's leaves about %s for connecting and locking, against leaderrun's %s campaign. ",
					fmtDur(up("leaderrun")), otherBin, fmtDur(up(otherBin)), other.name, fmtDur(otherLock), fmtDur(segP50(segCampaign)))
			}
			if wd, lead := up("watchdog"), segP50(segStart)+segP50(segCampaign); wd > 0 {
				fmt.Fprintf(&b, "leaderrun launches its watchdog (itself, re-executed) as soon as cmd has decided that the command line is a run, and has it fork the child once it leads: the watchdog alone takes %s to become ready (to the end of its package init; its cgroup comes after), against the %s from leaderrun's fork to \"leadership acquired\"", fmtDur(wd), fmtDur(lead))
				if wd > lead {
					fmt.Fprintf(&b, ", so on a free lock the child's fork waits for the watchdog, for up to about %s. ", fmtDur(wd-lead))
				} else {
					b.WriteString(": the watchdog is ready before leaderrun leads. ")
				}
			}
			if c, o := r.cost[own.id], r.cost[other.id]; c != nil && o != nil {
				fmt.Fprintf(&b, "Store requests for one whole run: leaderrun %s; %s %s. ", fmtCounts(c.oneRun), other.name, fmtCounts(o.oneRun))
			}
		case goalPss, goalWatchdog, goalPssRef:
			b.WriteString(r.memoryWhy(col))
			memoryMissed = true
		case goalHerd, goalHerdHO:
			if h := r.herd[col.name]; h != nil {
				var w, n []string
				for _, c := range h.changes {
					w = append(w, fmt.Sprint(c.woken))
					n = append(n, fmt.Sprintf("%.0f", c.requests.total()))
				}
				fmt.Fprintf(&b, "Followers woken per change: %s; followers' requests in each window (not keep-alives): %s; handover p50 %s with %d followers against %s with one. %s",
					strings.Join(w, ", "), strings.Join(n, ", "), fmtDur(percentile(h.handover.vals, .5)), h.followers, fmtDur(r.p50(r.handover, col.lr.id)), herdHow[col.name])
			}
		case goalIdle, goalSecond:
			b.WriteString("See the per-kind rates in the store-cost details below.")
		case goalPool:
			b.WriteString("See the pool section of the details: which trial ran more commands than the pool's size, and what became of the ended holder's command.")
		case goalCrash:
			b.WriteString(crashWhy[col.name])
		case goalCrashOld:
			b.WriteString("leaderrun's watchdog kills the child's process group when leaderrun dies (S4); a survivor means it did not.")
		default:
			b.WriteString("See the distribution in the plot; on 2 shared cores a run that lands on a busy moment waits for a CPU.")
		}
		b.WriteString("\n")
	}

	if memoryMissed {
		b.WriteString(r.memoryCause())
	}
	b.WriteString("\n### What each store's figures come from\n\n")
	for _, col := range storeColumns {
		if !col.latency {
			continue
		}
		fmt.Fprintf(&b, "**%s.** Loss: %s Crash failover: %s (measured p50 %s, max %s", col.title, lossWhy[col.name], crashWhy[col.name],
			fmtDur(r.p50(r.crash, col.lr.id)), fmtDur(r.pmax(r.crash, col.lr.id)))
		if col.ref != nil && r.crash[col.ref.id] != nil {
			fmt.Fprintf(&b, "; %s p50 %s, max %s", col.ref.name, fmtDur(r.p50(r.crash, col.ref.id)), fmtDur(r.pmax(r.crash, col.ref.id)))
		}
		b.WriteString(").")
		if h := r.herd[col.name]; h != nil && len(h.changes) > 0 {
			fmt.Fprintf(&b, " With %d followers: median %d woken per change, handover p50 %s (%s with one follower). %s",
				h.followers, h.medianWoken(), fmtDur(percentile(h.handover.vals, .5)), fmtDur(r.p50(r.handover, col.lr.id)), herdWhy[col.name])
		}
		if c := r.cost[col.lr.id]; c != nil {
			fmt.Fprintf(&b, " An idle follower sends %.2f requests/s (%s)", c.first.total(), fmtRates(c.first))
			if c.perProcess {
				fmt.Fprintf(&b, ", a second waiter %.2f (%s)", c.second.total(), fmtRates(c.second))
			}
			fmt.Fprintf(&b, "; the leader %.2f (%s). %s", c.leader.total(), fmtRates(c.leader), idleWhy[col.name])
		}
		b.WriteString("\n\n")
	}
	if l, c := r.cost[lrConsul.id], r.cost[consulLock.id]; l != nil && c != nil {
		lb, cb := l.first.byClass(), c.first.byClass()
		fmt.Fprintf(&b, "Beside `consul lock`: its idle follower sends %.2f blocking queries/s and %.2f renewals/s, against leaderrun's first in line %.2f and %.2f and its second waiter %.2f and %.2f. `consul lock`'s waiters all sleep in a blocking query on the lock key (its `api.Lock`), so every change of the key wakes every one of them; its leader renews every TTL/2 and writes nothing else, so its waiters are not woken while nothing changes.\n\n",
			cb[classBlocking], cb[classKeepalive], lb[classBlocking], lb[classKeepalive], l.second.byClass()[classBlocking], l.second.byClass()[classKeepalive])
	}
	if lk, cg := r.cost[lrKube.id], r.cost[clientGo.id]; lk != nil && cg != nil {
		fmt.Fprintf(&b, "Beside client-go's elector on the same Lease timings: its leader sends %.2f requests/s (%s) and an idle follower %.2f (%s): client-go polls (a get every retry period, and an update whenever it may take over) where leaderrun watches. Loss reaction p50 %s against leaderrun's %s: client-go sees another holder at its next renewal and stops leading only when its renew deadline has passed; leaderrun's watch sees the change at once. Handover p50 %s against %s (client-go's follower finds the released Lease at its next poll, within a retry period); crash failover p50 %s against %s.\n\n",
			cg.leader.total(), fmtRates(cg.leader), cg.first.total(), fmtRates(cg.first),
			fmtDur(r.p50(r.loss, clientGo.id)), fmtDur(r.p50(r.loss, lrKube.id)),
			fmtDur(r.p50(r.handover, clientGo.id)), fmtDur(r.p50(r.handover, lrKube.id)),
			fmtDur(r.p50(r.crash, clientGo.id)), fmtDur(r.p50(r.crash, lrKube.id)))
	}

	b.WriteString("What the other tools did where they did not do the job (behaviour, not speed):\n\n")
	if s := r.loss[etcdctlLock.id]; s != nil && len(s.vals) == 0 {
		b.WriteString("- `etcdctl lock NAME -- COMMAND` never stops its command when its lease is revoked: while the command runs it does not watch the lease. The command runs on without the lock.\n")
	}
	if s := r.handover[etcdctlLock.id]; s != nil && len(s.vals) == 0 {
		b.WriteString("- `etcdctl lock` catches SIGTERM and does nothing with it while its command runs, so a graceful handover never happens; only the command's own exit releases the lock.\n")
	}
	for _, tl := range []*tool{etcdctlLock, consulLock} {
		if c := r.crashOld[tl.id]; c.survived > 0 {
			fmt.Fprintf(&b, "- After kill -9 of `%s`, its command survived in %d of %d trials and ran alongside the follower's command once the follower took over (%d of %d): nothing ties the command's life to the wrapper's.\n",
				tl.name, c.survived, c.trials, c.overlap, c.trials)
		}
	}
	if s := r.loss[consulLock.id]; s != nil && len(s.vals) > 0 {
		fmt.Fprintf(&b, "- `consul lock` does stop its command when the session is destroyed (p50 %s), when it runs the command directly (`-shell=false`). With its default `-shell` it runs `$SHELL -c COMMAND`; see the notes below for what reached the command then.\n",
			fmtDur(percentile(s.vals, .5)))
	}
	b.WriteString("- client-go's elector leads in process: it runs no command to stop, and hands its callbacks no fencing token; its own package doc says it does not guarantee that only one client acts as leader. What a paused or partitioned client-go leader does until its renew deadline passes is up to the code in its callbacks.\n")
	return b.String()
}

// lossWhy says how each store tells leaderrun's leader that it lost.
var lossWhy = map[string]string{
	"etcd":       "the leader watches its own key; the revocation deletes it and the watch reports the delete at once.",
	"consul":     "the leader holds a blocking query on its key; destroying the session releases the key, which answers the query at once.",
	"postgres":   "a trigger on the lease table sends a notification when a row is deleted or changes holder, and the leader's listening connection receives it at once; the row is then read to confirm.",
	"kubernetes": "the leader watches its Lease; the apiserver sends the change of holder at once.",
	"zookeeper":  "the leader's client watches its own znode; the server sends the deletion at once.",
	"redis":      "the leader's tracking connection has Redis announce every change of a key under the lock's key (client tracking, broadcast mode); on the DEL's announcement the leader reads its key, finds it gone, and stops the child.",
	"azureblob":  "Azure tells nobody that a lease ended: the leader proves its lease by a read of the lock blob's properties with its lease id (412 once the lease is broken) whenever no renewal or read has done so for half a retry period, at most 700 ms; so a break is seen at the next read or renewal, within half a retry period (at most 700 ms) and two round trips, not at once as a notification would be.",
	"mysql":      "MySQL tells the holder of no change: the leader reads its row every retry period (at most 500 ms) besides renewing it, so the delete is seen at the next read or renewal, within a retry period and a round trip, not at once as a notification would be.",
	"s3":         "S3 tells nobody of a change: the leader reads the lock object every retry period (at most 500 ms) besides renewing it with If-Match, so the delete is seen at the next read or renewal, within a retry period and a round trip, not at once as a notification would be.",
}

// crashWhy says what decides the crash failover on each store.
var crashWhy = map[string]string{
	"etcd": "the follower takes over once etcd expires the dead leader's lease (5 s after its last keep-alive, which came at most a retry period before the kill) and deletes its key, which the follower watches.",
	"consul": fmt.Sprintf("each candidate's session is bound to a TTL check of its own on its agent, of the lease's TTL (%v), which it passes at every renewal (every %v); once the leader is dead the agent's timer turns the check critical a lease after it last heard from it, Consul invalidates the session at once, and the first waiter in line, whose blocking query on the key answers at once, acquires it once the lock-delay has passed (%v, --kill-grace + 1 s): about lease + lock-delay after the last renewal, at most %v. `consul lock` waits for Consul to invalidate the session (between TTL and 2×TTL after its last renewal: %v–%v) and then for Consul's default lock-delay (%v)",
		consulTimings.lease, consulTimings.retry, consulLockDelay, consulTimings.lease+consulLockDelay+time.Second, consulLockTTL, 2*consulLockTTL, consulLockLockDelay),
	"postgres":   "the database's clock decides: the row expires a lease duration after the leader's last renewal (at most a retry period before the kill), and the follower, which read the remaining time from the database, sleeps until then and takes the row in one statement.",
	"kubernetes": "the follower times the record as client-go does, on its own monotonic clock from the moment it saw it change (every renewal, every retry period), and takes the Lease with a conditional update once leaseDurationSeconds passed without a change. The client-go elector follows the same rule but polls the Lease every retry period, so it notices up to a retry period (with client-go's jitter, 1.2×) later.",
	"zookeeper":  "the server expires the dead leader's session once it has not heard from it for the negotiated session timeout (the lease asked, 6 s), deleting its ephemeral znode; the next candidate watches that znode and takes over at once.",
	"redis":      "the server's clock decides: the key expires a lease duration after the leader's last renewal (at most a retry period before the kill); the first waiter in the queue read the key's PTTL at its last attempt and sleeps until then (plus 5 ms), and its SET NX succeeds at once.",
	"azureblob":  "Azure's clock decides: the dead leader's lease expires a lease duration after its last renewal (at most a retry period before the kill); a waiter reads the blob's properties every retry period and acquires at the first read that shows the lease expired: between a lease less a retry period and a lease plus a retry period after the kill, then the acquisition and the token's writes.",
	"mysql":      "the database's clock decides: the row expires a lease duration after the leader's last renewal (at most a retry period before the kill). The first waiter in line waits on the holder's named lock, which the server frees when the dead leader's connection closes; it then reads the row, with the time left by the database's clock, and takes it in one transaction once it has run out.",
	"s3":         "S3 has no clock: a waiter reads the lock object every retry period and times the lease on its own monotonic clock from when it last saw the ETag change (every renewal); once a lease has passed without a change, it raises the token's mark in the state object and writes the lock object with If-Match on the ETag it read: between a lease and a lease plus a retry period after the last renewal, then three requests.",
}

// herdWhy says why each store wakes as many followers as it does.
var herdWhy = map[string]string{
	"etcd":       "Each candidate watches only the key just ahead of its own, so a change wakes the next one only.",
	"consul":     "Waiters queue under the lock's prefix; only the first in line watches the lock key, every other waiter the queue entry ahead of it, so a change of leader wakes the first in line (who takes over) and the next, who becomes first.",
	"postgres":   "PostgreSQL sends a notification to every listening connection: every waiter wakes and tries the row once (one statement each), and one wins. That is the cost of waiting on notifications without a queue; each waiter's cost while idle stays one statement per lease duration.",
	"kubernetes": "Every follower watches the one Lease, and the apiserver sends every change of it to every watcher: the release, the new holder's grant and each renewal. The followers that see the Lease free try a conditional update; all but one get 409 Conflict.",
	"zookeeper":  "Each candidate watches only the znode just below its own (the recipe's answer to the herd), so a change wakes the next one only.",
	"redis":      "Waiters queue in a sorted set, each subscribed to a channel of its own; only the first may take a free lock, and the release script publishes to its channel alone.",
	"azureblob":  "There is no queue and no notification: every waiter reads the blob's properties once per retry period, at its own phase, and only those whose read lands between the release and the first acquisition try to acquire, so a change wakes few, and the more waiters there are, the sooner one of them reads after a release.",
	"mysql":      "Waiters queue on a named lock (GET_LOCK): only the first in line waits on the holder's named lock, and reads the row when it is woken; every other waiter waits on the queue's. The first in line that wins keeps the queue's named lock as the holder, so the next waiter sleeps on until that holder releases: a change wakes one waiter, who takes over.",
	"s3":         "There is no queue and no notification: every waiter reads the lock object once per retry period, at its own phase, and only those whose read lands between the release and the first grant try to take it (reading the state object first); all but one fail their conditional write.",
}

// idleWhy says what an idle follower sends on each store, and why.
var idleWhy = map[string]string{
	"etcd":       "A follower keeps its own lease alive (a keep-alive every third of the TTL) and watches the key ahead of it.",
	"consul":     "A follower renews its own session and passes its own TTL check (each every TTL/2) and sleeps in blocking queries; the first in line watches the lock key, the second the first's queue entry, and neither changes while the leader renews (its renewal and its check's pass write nothing to the KV store), so each query lasts its whole wait (5 min).",
	"postgres":   "A follower listens for notifications and otherwise sleeps until the holder's expiry by the database's clock; the leader's renewals send no notification but keep moving the expiry, so the follower tries once per lease duration, and its listening connection is pinged every 30 s.",
	"kubernetes": "A follower sends nothing but its watch of the Lease; it receives every renewal as a watch event.",
	"zookeeper":  "A follower's client sends pings (every third of the session timeout) and holds a watch on the znode below its own.",
	"redis":      "A follower runs the acquire script every retry period (jittered down by up to a quarter): that refreshes its liveness deadline in the queue (three retry periods), and tries the lock once; its pub/sub connection is pinged every 30 s. The leader renews, and reads its key once per renewal, whose change Redis announces to it.",
	"azureblob":  "A follower reads the lock blob's properties (HEAD) once per retry period and sends nothing else; the leader renews every retry period and, between renewals, reads the blob once whenever nothing has proved its lease for half a retry period (at most 700 ms).",
	"mysql":      "The first in line (there is one while the holder took the lock without queueing, as the leader here did) waits in GET_LOCK on the holder's named lock for a lease (in whole seconds) at a time, and reads the row about twice per lease duration (docs/backends/mysql.md); every other waiter waits in GET_LOCK on the queue's named lock for two leases at a time and reads nothing. The leader renews every retry period (an UPDATE, then it keeps its named lock) and reads its row every retry period.",
	"s3":         "A follower reads the lock object (GET) once per retry period and sends nothing else; the leader renews every retry period (a PUT with If-Match on the ETag it last wrote) and reads the object every retry period besides.",
}

func columnTitled(title string) *storeColumn {
	for _, col := range storeColumns {
		if col.title == title {
			return col
		}
	}
	return storeColumns[0]
}

// signed prints a difference with its sign, "+1.90 ms" or "−0.40 ms".
func signed(d time.Duration) string {
	if d < 0 {
		return "−" + fmtDur(-d)
	}
	return "+" + fmtDur(d)
}

// memoryWhy says, for a missed memory goal of col, what one instance's
// private and anonymous pages are; memoryCause, once, where they come from.
func (r *results) memoryWhy(col *storeColumn) string {
	hi := pssCounts[len(pssCounts)-1]
	m := r.pss[col.lr.id][hi]
	if m.watchdogs == 0 {
		return "No watchdog was found as the child's parent: see the memory details."
	}
	return fmt.Sprintf("At %d leaders each leaderrun held %s private (%s anonymous) and each watchdog %s private (%s anonymous). See \"Why the memory goals are missed\" below.",
		hi, mib(m.wrapperPriv/hi), mib(m.wrapperAnon/hi), mib(m.watchdogPriv/m.watchdogs), mib(m.watchdogAnon/m.watchdogs))
}

// memoryCause explains, once, where each instance's private memory comes
// from, with the run's package-init figures.
func (r *results) memoryCause() string {
	var b strings.Builder
	b.WriteString("\n**Why the memory goals are missed.** Pss shares the binary's code among the instances, so what one more instance costs is its private pages: the Go heap, stacks and runtime structures of leaderrun and of its watchdog, each a Go process of its own. ")
	if r.initBytes["leaderrun"] != nil {
		fmt.Fprintf(&b, "Package init allocates %s on every leaderrun's heap before `main` (%d packages; `etcdctl`: %s, %d packages); the largest: %s. ",
			bytesText(int(r.p50(r.initBytes, "leaderrun"))), r.initCount["leaderrun"], bytesText(int(r.p50(r.initBytes, "etcdctl"))), r.initCount["etcdctl"],
			strings.Join(r.topInitAllocs("leaderrun", 5), ", "))
	}
	if r.initBytes[watchdogInit] != nil {
		fmt.Fprintf(&b, "The watchdog initialises the %d packages that come before package signals/watchdog takes it over, allocating %s; the largest: %s. ",
			r.initCount[watchdogInit], bytesText(int(r.p50(r.initBytes, watchdogInit))), strings.Join(r.topInitAllocs(watchdogInit, 3), ", "))
	}
	fmt.Fprintf(&b, "Every backend's client library but the AWS SDK is linked into every run (the binary is %s), and what their packages register at init (protobuf descriptors, client-go's types) is allocated in every process, whichever store it uses. ", r.sizes()["leaderrun"])
	if r.initBytes[companionInit] != nil {
		fmt.Fprintf(&b, "The AWS SDK is linked into `leaderrun-aws` only (%s), which leaderrun becomes for a DynamoDB run: its init allocates %s where leaderrun's allocates %s, paid by DynamoDB runs alone. ",
			r.sizes()[companionInit], bytesText(int(r.p50(r.initBytes, companionInit))), bytesText(int(r.p50(r.initBytes, "leaderrun"))))
	}
	b.WriteString("Going further would take dropping or replacing a library; older SDKs are not pinned, nor are clients written by hand to meet the goal.\n")
	return b.String()
}

// topInitAllocs are the n packages of binary id whose init allocates the
// most, at the median, with their allocation.
func (r *results) topInitAllocs(id string, n int) []string {
	type pa struct {
		pkg   string
		bytes int
	}
	var all []pa
	for k := range r.initPkgBytes {
		if pkg, ok := strings.CutPrefix(k, id+" "); ok {
			all = append(all, pa{pkg, int(r.p50(r.initPkgBytes, k))})
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].bytes > all[j].bytes })
	var out []string
	for _, p := range all[:min(n, len(all))] {
		out = append(out, fmt.Sprintf("`%s` %s", p.pkg, bytesText(p.bytes)))
	}
	return out
}
