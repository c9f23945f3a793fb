package bench

import (
	"fmt"
	"strings"
	"time"
)

// analysis explains each goal that was missed, with the run's numbers, and
// what the other tools did where they did not do the job at all.
func (r *results) analysis() string {
	var b strings.Builder
	b.WriteString("## Analysis\n\n")
	missed := map[string]goalMet{}
	var met []string
	for _, g := range r.goals() {
		if g.met {
			met = append(met, fmt.Sprintf("%s (%s)", g.name, g.measured))
		} else {
			missed[g.name] = g
		}
	}
	if len(missed) == 0 {
		b.WriteString("Every goal was met in this run.\n\n")
	} else {
		fmt.Fprintf(&b, "Met: %s.\n\nMissed:\n\n", strings.Join(met, "; "))
	}
	up := func(id string) time.Duration { return r.p50(r.startup, id) }
	for _, g := range r.goals() {
		if g.met {
			continue
		}
		fmt.Fprintf(&b, "- **%s** — target %s, measured %s. ", g.name, g.goal, g.measured)
		switch {
		case strings.HasPrefix(g.name, "start-to-child"):
			own, other, otherBin := lrEtcd, etcdctlLock, "etcdctl"
			if strings.Contains(g.name, "Consul") {
				own, other, otherBin = lrConsul, consulLock, "consul"
			}
			child := r.p50(r.s2c, direct.id)
			segP50 := func(s string) time.Duration { return r.p50(r.segments, own.id+"/"+s) }
			fmt.Fprintf(&b, "The gap is %s at the median. Where leaderrun's time goes (p50 of each part, from its own log): %s from the fork to logging \"campaigning\" (process start, flags, store client), %s campaigning until \"leadership acquired\", and %s from there to the child's `main`. ",
				fmtDur(r.p50(r.s2c, own.id)-r.p50(r.s2c, other.id)), fmtDur(segP50(segStart)), fmtDur(segP50(segCampaign)), fmtDur(segP50(segChild)))
			fmt.Fprintf(&b, "That last part is %s more than the child alone takes to start (%s): leaderrun forks the child from a locked OS thread (for its parent-death signal) into the process group of its watchdog, which it started while campaigning; %s forks the child with os/exec. ",
				fmtDur(segP50(segChild)-child), fmtDur(child), other.name)
			otherLock := r.p50(r.s2c, other.id) - up(otherBin) - child
			fmt.Fprintf(&b, "The rest is spread over the other two parts. Start: `leaderrun version` starts and exits in %s (`%s version` in %s), and leaderrun logs \"campaigning\" %s after a bare start (flags, validation, the store client). Campaign: %s's start-to-child less its binary's start and the child's leaves about %s for connecting and locking, against leaderrun's %s (%s). ",
				fmtDur(up("leaderrun")), otherBin, fmtDur(up(otherBin)), signed(segP50(segStart)-up("leaderrun")),
				other.name, fmtDur(otherLock), fmtDur(segP50(segCampaign)), signed(segP50(segCampaign)-otherLock))
			if c, o := r.cost[own.id], r.cost[other.id]; c != nil && o != nil {
				fmt.Fprintf(&b, "Store requests for one whole run: leaderrun %s; %s %s. ", fmtCounts(c.oneRun), other.name, fmtCounts(o.oneRun))
			}
		case strings.HasPrefix(g.name, "leading RSS") && strings.Contains(g.name, "watchdog"):
			own := lrEtcd
			if strings.Contains(g.name, "Consul") {
				own = lrConsul
			}
			rec := r.rss[own.id]
			fmt.Fprintf(&b, "leaderrun itself peaks at %s and its watchdog at %s (%s). The watchdog is /bin/sh running a short script; it is what kills the child's process group if leaderrun dies (S4). For comparison, etcdctl lock peaks at %s and consul lock at %s; both leave their child running when they are killed (see crash failover).",
				mib(rec.wrapper), mib(rec.helpers), strings.Join(rec.helperNames, ", "), mib(r.rss[etcdctlLock.id].wrapper), mib(r.rss[consulLock.id].wrapper))
		case strings.HasPrefix(g.name, "leading RSS"):
			fmt.Fprintf(&b, "The etcd and Consul client libraries, gRPC and the Go runtime are most of it; etcdctl lock, with the same etcd client, peaks at %s.", mib(r.rss[etcdctlLock.id].wrapper))
		case strings.HasPrefix(g.name, "followers woken") && strings.Contains(g.name, "Consul"):
			h := r.herd["consul"]
			var wakes, reqs []string
			for _, c := range h.changes {
				wakes = append(wakes, fmt.Sprintf("%d", c.wakes))
				n := 0.0
				for _, v := range c.requests {
					n += v
				}
				reqs = append(reqs, fmt.Sprintf("%.0f", n))
			}
			fmt.Fprintf(&b, "A herd effect. Every waiting leaderrun sleeps in a blocking query on the one lock key, and Consul answers every blocking query on a key when its index moves: when the leader releases the key and again when the winner acquires it. Blocking queries answered by the changes: %s; requests from the followers in each window (not keep-alives): %s, for one winner. In the first change: %s. The session lookups are the followers asking for the new holder's lock-delay (leaderrun reads it whenever the holder changes); the `?acquire`s come from followers that saw the key free before the winner took it. Handover took %s (p50) with %d followers, against %s with one: the winner's requests most likely queue behind the herd's, at the agent and at the counting proxies, which run in the benchmark's process on the same 2 cores. Queuing the followers, each waiting on the key of the one ahead of it as etcd's election does, would wake one. `consul lock` waits the same way as leaderrun (from its source: `api.Lock` sleeps in a blocking query on the key; not measured here).",
				strings.Join(wakes, ", "), strings.Join(reqs, ", "), fmtCounts(h.changes[0].requests), fmtDur(percentile(h.handover.vals, .5)), h.followers, fmtDur(r.p50(r.handover, lrConsul.id)))
		case strings.HasPrefix(g.name, "followers woken"):
			b.WriteString("See the per-change counts in the details below.")
		case strings.HasPrefix(g.name, "idle follower"):
			b.WriteString("See the per-method rates in the details below.")
		case strings.HasPrefix(g.name, "loss reaction"), strings.HasPrefix(g.name, "graceful handover"), strings.HasPrefix(g.name, "crash failover"):
			b.WriteString("See the distribution in the plot; on 2 shared cores a run that lands on a busy moment waits for a CPU.")
		}
		b.WriteString("\n")
	}
	if c, o := r.cost[lrConsul.id], r.cost[consulLock.id]; c != nil && o != nil && len(c.followerBlocking) > 0 {
		by, ob := c.follower.byClass("consul"), o.follower.byClass("consul")
		fmt.Fprintf(&b, "\nNot a goal, but worth knowing: leaderrun's idle follower on Consul sends %.2f blocking queries/s and %.2f renewals/s; `consul lock`'s sends %.2f and %.2f. leaderrun ends each blocking query in time to renew its session (every TTL/2) and asks Consul for 16/17 of the time left, to allow for Consul's jitter; a query that comes back a little early is followed by ever shorter ones until the renewal is due: %d of its %d blocking queries in the windows lasted under 1 s.\n",
			by[classBlocking], by[classKeepalive], ob[classBlocking], ob[classKeepalive], c.shortBlocking(), len(c.followerBlocking))
	}
	if lc, cl := r.p50(r.crash, lrConsul.id), r.p50(r.crash, consulLock.id); lc > 0 && cl > 0 {
		fmt.Fprintf(&b, "\nCrash failover on Consul (no goal) took %s for leaderrun and %s for `consul lock`, with the same settings: Consul invalidates a session between TTL and 2×TTL after its last renewal (15–30 s), and the 15 s lock-delay comes on top. leaderrun's `--lease-duration` and `--consul-lock-delay` shorten it; `consul lock` has no flag for either.\n",
			fmtDur(lc), fmtDur(cl))
	}
	b.WriteString("\nWhat the other tools did where they did not do the job (behaviour, not speed):\n\n")
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
	return b.String()
}

// signed prints a difference with its sign, "+1.90 ms" or "−0.40 ms".
func signed(d time.Duration) string {
	if d < 0 {
		return "−" + fmtDur(-d)
	}
	return "+" + fmtDur(d)
}
