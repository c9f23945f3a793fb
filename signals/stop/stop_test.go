package stop

import (
	"reflect"
	"syscall"
	"testing"
	"time"
)

// These tests drive the decision function on a made-up clock and made-up
// trees: every rule of the stop sequence (docs/safety.md, S9, S10),
// exactly, with no process and no sleep. The drivers' tests
// (signals/..._test.go, e2e) run the same rules with real processes.

const (
	cmd    = 100 // the command, leader of its group
	grand  = 101 // a grandchild in the group
	helper = 200 // a helper that left the group (setsid)
	late   = 300 // a helper that left the group later
)

var (
	group      = []Member{{cmd, cmd}, {grand, cmd}}
	withHelper = []Member{{cmd, cmd}, {grand, cmd}, {helper, helper}}
)

// step is one call of Next: its input (at, in seconds, and the rest) and
// what it must return.
type step struct {
	at       float64
	deadline float64
	stops    []syscall.Signal
	orphaned bool
	exited   bool
	members  []Member
	// noLook: Next must not read the tree.
	noLook bool
	want   []Action
	wake   float64
}

func at(s float64) Instant { return Instant(s * float64(time.Second)) }

func TestSequence(t *testing.T) {
	cases := []struct {
		name  string
		steps []step
	}{
		{name: "a deadline that passes", steps: []step{
			{at: 9, deadline: 10, members: group, noLook: true, wake: 10},
			{at: 10, deadline: 10, members: group,
				want: []Action{{Kind: Signal, Signal: syscall.SIGTERM, Group: true, Reason: Deadline, KillAt: at(13)}}, wake: 13},
			{at: 12, deadline: 10, members: group, wake: 13},
			{at: 13, deadline: 10, members: group, want: []Action{{Kind: Kill, Pids: []int{cmd, grand}, Reason: Deadline}}, wake: 18},
			{at: 13.001, deadline: 10, exited: true, want: []Action{{Kind: Done}}},
			{at: 14, deadline: 10, exited: true, noLook: true},
		}},
		{name: "a stop request", steps: []step{
			{at: 1, stops: []syscall.Signal{syscall.SIGINT}, members: group,
				want: []Action{{Kind: Signal, Signal: syscall.SIGINT, Group: true, Reason: Asked, KillAt: at(4)}}, wake: 4},
			{at: 4, members: group, want: []Action{{Kind: Kill, Pids: []int{cmd, grand}, Reason: Asked}}, wake: 9},
			{at: 4.01, exited: true, want: []Action{{Kind: Done}}},
		}},
		{name: "a renewed deadline", steps: []step{
			{at: 1, deadline: 10, members: group, noLook: true, wake: 10},
			{at: 2, deadline: 12, members: group, noLook: true, wake: 12},
			{at: 11, deadline: 12, members: group, noLook: true, wake: 12},
			{at: 12, deadline: 12, members: group,
				want: []Action{{Kind: Signal, Signal: syscall.SIGTERM, Group: true, Reason: Deadline, KillAt: at(15)}}, wake: 15},
		}},
		{name: "a deadline renewed after the sequence started is ignored", steps: []step{
			{at: 1, deadline: 10, stops: []syscall.Signal{syscall.SIGTERM}, members: group,
				want: []Action{{Kind: Signal, Signal: syscall.SIGTERM, Group: true, Reason: Asked, KillAt: at(4)}}, wake: 4},
			{at: 2, deadline: 30, members: group, wake: 4},
			{at: 4, deadline: 30, members: group, want: []Action{{Kind: Kill, Pids: []int{cmd, grand}, Reason: Asked}}, wake: 9},
		}},
		{name: "a second stop request does not extend the grace (S9)", steps: []step{
			{at: 1, stops: []syscall.Signal{syscall.SIGTERM}, members: group,
				want: []Action{{Kind: Signal, Signal: syscall.SIGTERM, Group: true, Reason: Asked, KillAt: at(4)}}, wake: 4},
			{at: 3, stops: []syscall.Signal{syscall.SIGINT}, members: group,
				want: []Action{{Kind: Signal, Signal: syscall.SIGINT, Group: true}}, wake: 4},
			{at: 3.5, stops: []syscall.Signal{syscall.SIGTERM}, members: group, wake: 4},
			{at: 4, members: group, want: []Action{{Kind: Kill, Pids: []int{cmd, grand}, Reason: Asked}}, wake: 9},
			{at: 4.5, stops: []syscall.Signal{syscall.SIGINT}, members: group, want: []Action{{Kind: Kill, Pids: []int{cmd, grand}}}, wake: 9},
		}},
		{name: "a stop request after the deadline started the sequence keeps its instant", steps: []step{
			{at: 10, deadline: 10, members: group,
				want: []Action{{Kind: Signal, Signal: syscall.SIGTERM, Group: true, Reason: Deadline, KillAt: at(13)}}, wake: 13},
			{at: 10.2, deadline: 10, stops: []syscall.Signal{syscall.SIGTERM}, members: group, wake: 13},
		}},
		{name: "escapees", steps: []step{
			{at: 1, stops: []syscall.Signal{syscall.SIGTERM}, members: withHelper,
				want: []Action{{Kind: Signal, Signal: syscall.SIGTERM, Group: true, Pids: []int{helper}, Reason: Asked, KillAt: at(4)}}, wake: 4},
			{at: 2, members: append(withHelper, Member{late, late}),
				want: []Action{{Kind: Signal, Signal: syscall.SIGTERM, Pids: []int{late}}}, wake: 4},
			{at: 3, members: append(withHelper, Member{late, late}), wake: 4},
			{at: 4, members: []Member{{helper, helper}, {late, late}},
				want: []Action{{Kind: Kill, Pids: []int{helper, late}, Reason: Asked}}, wake: 9},
			{at: 4.1, members: []Member{{400, 400}}, want: []Action{{Kind: Kill, Pids: []int{400}}}, wake: 9},
			{at: 4.2, exited: true, want: []Action{{Kind: Done}}},
		}},
		{name: "a tree that empties early", steps: []step{
			{at: 1, stops: []syscall.Signal{syscall.SIGTERM}, members: withHelper,
				want: []Action{{Kind: Signal, Signal: syscall.SIGTERM, Group: true, Pids: []int{helper}, Reason: Asked, KillAt: at(4)}}, wake: 4},
			{at: 1.5, members: nil},
			{at: 1.6, exited: true, want: []Action{{Kind: Done}}},
			{at: 4, exited: true, noLook: true},
		}},
		{name: "leaderrun gone while the command runs", steps: []step{
			{at: 2, deadline: 10, orphaned: true, members: withHelper,
				want: []Action{{Kind: Kill, Pids: []int{cmd, grand, helper}, Reason: Orphaned}}, wake: 7},
			{at: 2.01, deadline: 10, orphaned: true, exited: true, want: []Action{{Kind: Done}}},
		}},
		{name: "leaderrun gone during the grace", steps: []step{
			{at: 1, stops: []syscall.Signal{syscall.SIGTERM}, members: group,
				want: []Action{{Kind: Signal, Signal: syscall.SIGTERM, Group: true, Reason: Asked, KillAt: at(4)}}, wake: 4},
			{at: 2, orphaned: true, members: group, want: []Action{{Kind: Kill, Pids: []int{cmd, grand}, Reason: Asked}}, wake: 7},
		}},
		{name: "the command exits and leaves processes behind", steps: []step{
			{at: 5, deadline: 10, exited: true, members: []Member{{helper, helper}},
				want: []Action{{Kind: Signal, Signal: syscall.SIGTERM, Group: true, Pids: []int{helper}, Reason: Leftovers, KillAt: at(8)}}, wake: 8},
			{at: 8, deadline: 10, exited: true, members: []Member{{helper, helper}},
				want: []Action{{Kind: Kill, Pids: []int{helper}, Reason: Leftovers}}, wake: 13},
			{at: 8.1, deadline: 10, exited: true, want: []Action{{Kind: Done}}},
		}},
		{name: "the command exits alone", steps: []step{
			{at: 5, deadline: 10, exited: true, want: []Action{{Kind: Done}}},
		}},
		{name: "processes that survive SIGKILL are given up on", steps: []step{
			{at: 1, stops: []syscall.Signal{syscall.SIGTERM}, members: group,
				want: []Action{{Kind: Signal, Signal: syscall.SIGTERM, Group: true, Reason: Asked, KillAt: at(4)}}, wake: 4},
			{at: 4, members: group, want: []Action{{Kind: Kill, Pids: []int{cmd, grand}, Reason: Asked}}, wake: 9},
			{at: 8.9, exited: true, members: []Member{{grand, cmd}}, want: []Action{{Kind: Kill, Pids: []int{grand}}}, wake: 9},
			{at: 9, exited: true, members: []Member{{grand, cmd}}, want: []Action{{Kind: GiveUp, Pids: []int{grand}}, {Kind: Done}}},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := Sequence{Signal: syscall.SIGTERM, Grace: 3 * time.Second, Group: cmd}
			for i, st := range tc.steps {
				looked := false
				in := Input{Now: at(st.at), Stops: st.stops, Orphaned: st.orphaned, Exited: st.exited,
					Members: func() []Member { looked = true; return st.members }}
				if st.deadline != 0 {
					in.Deadline = at(st.deadline)
				}
				acts, wake := s.Next(in)
				if !reflect.DeepEqual(acts, st.want) {
					t.Errorf("step %d (at %vs): actions\n got %+v\nwant %+v", i, st.at, acts, st.want)
				}
				if want := Instant(0); st.wake != 0 && wake != at(st.wake) || st.wake == 0 && wake != want {
					t.Errorf("step %d (at %vs): wake at %v, want %vs", i, st.at, time.Duration(wake), st.wake)
				}
				if st.noLook && looked {
					t.Errorf("step %d (at %vs): read the tree", i, st.at)
				}
			}
		})
	}
}

// TestKillAtFixedByFirstSignal: whatever comes later, the SIGKILL instant
// is the first signal's plus the grace (S9), and Started says why.
func TestKillAtFixedByFirstSignal(t *testing.T) {
	s := Sequence{Signal: syscall.SIGTERM, Grace: time.Second, Group: cmd}
	if _, ok := s.Started(); ok || s.killAt != 0 {
		t.Fatalf("a new sequence has started (kill at %v)", s.killAt)
	}
	tree := func() []Member { return group }
	s.Next(Input{Now: at(5), Deadline: at(5), Members: tree})
	for _, later := range []Input{
		{Now: at(5.5), Stops: []syscall.Signal{syscall.SIGTERM}, Members: tree},
		{Now: at(5.6), Deadline: at(60), Members: tree},
		{Now: at(5.7), Exited: true, Members: tree},
	} {
		s.Next(later)
		if s.killAt != at(6) {
			t.Errorf("after %+v: kill at %v, want 6s", later, time.Duration(s.killAt))
		}
	}
	if why, ok := s.Started(); !ok || why != Deadline {
		t.Errorf("Started() = %v, %v; want Deadline, true", why, ok)
	}
}

// TestIdleAllocatesNothing: while the command runs and no sequence has
// started, Next allocates nothing (the watchdog calls it at every
// renewal, for hours).
func TestIdleAllocatesNothing(t *testing.T) {
	s := Sequence{Signal: syscall.SIGTERM, Grace: time.Second, Group: cmd}
	tree := func() []Member { return group }
	if n := testing.AllocsPerRun(100, func() { s.Next(Input{Now: at(1), Deadline: at(10), Members: tree}) }); n != 0 {
		t.Errorf("Next allocates %v times while idle", n)
	}
}
