//go:build linux

package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// startToChild runs leaderrun with args (lock and store flags) to the end,
// its command a shell that writes when it started, and returns the time
// from exec to that line. The run must exit 0.
func startToChild(t *testing.T, args ...string) time.Duration {
	t.Helper()
	stamp := filepath.Join(t.TempDir(), "stamp")
	cmd := exec.Command(testenv.Leaderrun(t), append(args, "--", "/bin/sh", "-c", `date +%s%N > "$STAMP"`)...)
	cmd.Env = append(os.Environ(), "STAMP="+stamp)
	began := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("leaderrun %v: %v\n%s", args, err, out)
	}
	data, err := os.ReadFile(stamp)
	if err != nil {
		t.Fatalf("leaderrun %v: the child did not run: %v", args, err)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return time.Unix(0, ns).Sub(began)
}

// holdFor fails the test if p's child is signalled or p exits within d:
// leadership must simply go on.
func holdFor(t *testing.T, p *proc, events, id string, d time.Duration) {
	t.Helper()
	select {
	case <-p.done:
		t.Fatalf("leaderrun exited %d while it should have kept leading:\n%s", p.code, p.stderr.String())
	case <-time.After(d):
	}
	if evs := readEvents(t, events); count(evs, "signal") > 0 || count(evs, "start") != 1 {
		t.Fatalf("leadership changed:\n%s\nleaderrun's log:\n%s", formatEvents(evs), p.stderr.String())
	}
}

// TestEtcdClusterMembers: on a 3-member cluster with a learner, members
// that cannot serve do not cost a start: with the learner listed first in
// --etcd-endpoints (it refuses what a leader does), or a member that
// accepts connections and never answers, the child starts within 1 s of
// exec (half the dial timeout it would cost to wait on it), every time,
// and a leader on such endpoints keeps its lease.
// Then members are removed from under a leader (a follower, then the
// raft leader): it keeps its lease and its child through two renew
// deadlines after each.
func TestEtcdClusterMembers(t *testing.T) {
	t.Parallel()
	cluster := testenv.StartEtcd(t, 3)
	voters := cluster.Endpoints()
	learner := cluster.AddLearner(t)
	// A listener that is never accepted from: the kernel completes the
	// handshake, and nothing ever answers.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	for _, tc := range []struct {
		name, first string
	}{
		{"LearnerFirst", learner.ClientURL},
		{"SilentFirst", "http://" + silent.Addr().String()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eps := append([]string{tc.first}, voters...)
			var took []time.Duration
			for i := range 5 {
				took = append(took, startToChild(t, "--etcd-endpoints", strings.Join(eps, ","), "--lock", fmt.Sprintf("%s-%d", tc.name, i)))
			}
			t.Logf("start-to-child with %s listed first: %v", tc.first, took)
			// A start that waited on the first endpoint would take the
			// dial timeout (2 s); a loaded machine's start alone has
			// taken over 500 ms.
			if worst := slices.Max(took); worst > time.Second {
				t.Errorf("start-to-child up to %v, want every start under 1s (half the dial timeout)", worst)
			}
			events := etcdEvents(t)
			p := etcdRun(t, events, "forever", eps, tc.name+"-lead", "leader")
			waitEvents(t, events, 10*time.Second, "the leader's child", etcdHas("start", "leader"))
			holdFor(t, p, events, "leader", 3*2*time.Second)
			failed := failedRenewals(p)
			t.Logf("renewals that failed in 3 renew deadlines: %s", failed)
			// A member that cannot serve a renewal refuses it without
			// doing anything: it goes to the next member.
			if strings.Contains(failed, "learner") || strings.Contains(failed, "EOF") {
				t.Errorf("a renewal failed on the learner")
			}
			p.signal(syscall.SIGTERM)
			if code := p.wait(5 * time.Second); code != 0 {
				t.Errorf("leader exited %d, want 0", code)
			}
		})
	}
	t.Run("MemberRemoved", func(t *testing.T) { testMemberRemoved(t, cluster, voters) })
}

func testMemberRemoved(t *testing.T, cluster *testenv.Etcd, voters []string) {
	// Timings with room for a raft election (1 s here) inside the renew
	// deadline.
	const deadline = 4 * time.Second
	events := etcdEvents(t)
	args := append([]string{"--etcd-endpoints", strings.Join(voters, ","), "--lock", "removed", "--identity", "leader",
		"--lease-duration", "6s", "--renew-deadline", deadline.String(), "--retry-period", "500ms", "--kill-grace", "1s", "--"},
		childArgv(t)...)
	p := start(t, childEnv(events, "forever"), args...)
	evs := waitEvents(t, events, 10*time.Second, "the leader's child", etcdHas("start", "leader"))
	child, _ := etcdFind(evs, "start", "leader")
	leader := cluster.RaftLeader(t)
	var follower *testenv.EtcdMember
	for _, m := range cluster.Members {
		if m != leader && !m.Learner {
			follower = m
			break
		}
	}
	for _, m := range []*testenv.EtcdMember{follower, leader} {
		began := time.Now()
		cluster.Remove(t, m)
		t.Logf("removed %s (%s) in %v", m.Name, m.ClientURL, time.Since(began).Round(time.Millisecond))
		holdFor(t, p, events, "leader", 2*deadline)
	}
	st, code := etcdStatusOf(t, voters, "removed")
	if code != 0 || st.Identity != "leader" || st.Token != child.Token || st.Remaining <= 0 {
		t.Fatalf("status after the removals: exit %d, %+v; want held by leader with token %d", code, st, child.Token)
	}
	t.Logf("token %d kept through the removal of a follower and of the raft leader; lease left %v; renewals that failed: %s",
		st.Token, time.Duration(st.Remaining), failedRenewals(p))
	p.signal(syscall.SIGTERM)
	if code := p.wait(5 * time.Second); code != 0 {
		t.Errorf("leader exited %d, want 0", code)
	}
}

// failedRenewals is the number of renewals that p logged as failed, and
// the lines.
func failedRenewals(p *proc) string {
	var lines []string
	for _, l := range strings.Split(p.stderr.String(), "\n") {
		if strings.Contains(l, "lease renewal failed") {
			lines = append(lines, l)
		}
	}
	return fmt.Sprintf("%d %q", len(lines), lines)
}
