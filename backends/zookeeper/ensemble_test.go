package zookeeper_test

import (
	"context"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// TestEnsemble runs the tests that need three servers against one
// ensemble.
func TestEnsemble(t *testing.T) {
	z := testenv.StartZooKeeper(t, 3)
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *testenv.ZooKeeper)
	}{
		{"MemberRestarted", testMemberRestarted},
		{"EnsembleLeaderKilled", testEnsembleLeaderKilled},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, z) })
	}
}

// member is the ensemble member a lease's session is connected to.
func member(t *testing.T, z *testenv.ZooKeeper, l lease) *testenv.ZooKeeperMember {
	t.Helper()
	for _, m := range z.Members {
		if m.Addr == l.Server() {
			return m
		}
	}
	t.Fatalf("the session is on %s, not a member", l.Server())
	return nil
}

// survives checks that l outlived a fault: renewals go through again
// within its session timeout of the fault, on the same session and
// znode, and Lost never closed.
func survives(t *testing.T, l lease, sid int64, fault time.Time) {
	t.Helper()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		err := l.Renew(ctx)
		cancel()
		if err == nil {
			break
		}
		if time.Since(fault) > l.SessionTimeout() {
			t.Fatalf("no renewal within the session timeout (%v) of the fault: %v", l.SessionTimeout(), err)
		}
	}
	t.Logf("renewals go through again %v after the fault, on %s", time.Since(fault), l.Server())
	select {
	case <-l.Lost():
		t.Fatalf("lease lost: %v", l.Err())
	default:
	}
	if l.SessionID() != sid {
		t.Errorf("session 0x%x, want 0x%x", l.SessionID(), sid)
	}
}

// testMemberRestarted: the member the leader's session is connected to
// restarts (its data kept); the client moves the session to another member
// within the timeout, and the lease carries on.
func testMemberRestarted(t *testing.T, z *testenv.ZooKeeper) {
	l := campaign(t, openStore(t, z.Servers()), "member-restarted", "a", 8*time.Second)
	sid, m := l.SessionID(), member(t, z, l)
	restart := time.Now()
	m.Restart(t)
	t.Logf("member %d restarted in %v", m.ID, time.Since(restart))
	survives(t, l, sid, restart)
	z.WaitServing(t)
}

// testEnsembleLeaderKilled: the ensemble's leader dies (SIGKILL) while we
// lead, with our session on it or on a follower (which drops its clients
// when it loses the leader); the others elect a new leader, the client
// moves the session if it must, and the session, which the new leader
// times afresh, survives.
func testEnsembleLeaderKilled(t *testing.T, z *testenv.ZooKeeper) {
	for _, tc := range []struct {
		name     string
		onLeader bool
	}{
		{"session on the leader", true},
		{"session on a follower", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t, z.Servers())
			leader := z.Leader(t)
			// The client picks a server at random: campaign until
			// the session is where the case wants it.
			var l lease
			for l.Lease == nil {
				l = campaign(t, s, "leader-killed", "a", 8*time.Second)
				if (member(t, z, l) == leader) != tc.onLeader {
					if err := l.Release(context.Background(), nil); err != nil {
						t.Fatal(err)
					}
					l = lease{}
				}
			}
			sid := l.SessionID()
			t.Logf("ensemble leader is member %d; the session is on %s", leader.ID, l.Server())
			kill := time.Now()
			leader.Kill(t)
			survives(t, l, sid, kill)
			t.Logf("new ensemble leader: member %d", z.Leader(t).ID)
			leader.Start(t)
			z.WaitServing(t)
		})
	}
}
