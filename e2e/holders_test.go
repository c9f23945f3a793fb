//go:build linux

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The pool of testHolders (TestStores/*/Holders): holders slots,
// candidates leaderrun processes.
const (
	poolHolders    = 3
	poolCandidates = 10
)

// testHolders (issue 29): ten leaderrun processes with --holders 3
// share one lock. Their children take flocks on their slot's file and on
// one of three capacity files (childMain): a fourth child at once, or a
// second in one slot, would find them held, and the kernel drops them the
// instant a child dies, however it dies. One holder is killed with
// SIGKILL and another gets SIGTERM; both slots are taken over by waiting
// candidates. Per slot, the tokens strictly increase. A candidate with
// another --holders is refused with exit 64 naming both numbers; --try
// on the full pool exits 75; status lists the three holders.
func testHolders(t *testing.T, e *env) {
	p := &pool{t: t, e: e, lock: e.lock("pool"), events: filepath.Join(t.TempDir(), "events"),
		locks: t.TempDir(), cands: map[string]*proc{}}
	for i := range poolCandidates {
		p.start(fmt.Sprintf("c%d", i))
	}
	evs := waitEvents(t, p.events, 60*time.Second, "three children", func(evs []event) bool { return count(evs, "start") >= poolHolders })
	first := holding(evs)
	if len(first) != poolHolders {
		t.Fatalf("children hold slots %v, want one in each of %d slots\n%s", first, poolHolders, formatEvents(evs))
	}
	p.checkOthers()

	// The holders of slots 0 and 1 go: one killed, one stopped.
	killed, stopped := first[0], first[1]
	at := time.Now()
	if err := syscall.Kill(p.cands[killed.ID].pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.cands[stopped.ID].signal(syscall.SIGTERM)
	limit := e.statusBound + 10*time.Second
	evs = waitEvents(t, p.events, limit, "slots 0 and 1 taken over", func(evs []event) bool {
		h := holding(evs)
		return len(h) == poolHolders && h[0].Pid != killed.Pid && h[1].Pid != stopped.Pid && alive(h[0].Pid) && !alive(killed.Pid)
	})
	after := holding(evs)
	t.Logf("slot 0 taken over %v after its holder's SIGKILL (token %d → %d); slot 1 %v after its holder's SIGTERM (token %d → %d)",
		after[0].At.Sub(at).Round(time.Millisecond), killed.Token, after[0].Token,
		after[1].At.Sub(at).Round(time.Millisecond), stopped.Token, after[1].Token)
	if code := p.cands[stopped.ID].wait(10 * time.Second); code != 0 {
		t.Errorf("the holder stopped with SIGTERM exited %d, want its child's 0", code)
	}
	for id, c := range p.cands {
		if !c.exited() {
			c.signal(syscall.SIGTERM)
		}
		defer func() {
			if code := c.wait(20 * time.Second); code != 0 && code != 128+int(syscall.SIGTERM) && id != killed.ID {
				t.Errorf("%s exited %d after SIGTERM, want 0 (a holder) or 143 (a waiting candidate)", id, code)
			}
		}()
	}
	p.checkInvariants()
}

// pool is one testHolders run on one store.
type pool struct {
	t      *testing.T
	e      *env
	lock   string
	events string
	locks  string
	cands  map[string]*proc
}

func (p *pool) args(id string, extra ...string) []string { return p.e.args(p.lock, id, extra...) }

func (p *pool) start(id string) {
	env := append(append(childEnv(p.events, "forever"), p.e.target.env...),
		"E2E_SLOT_LOCKS="+p.locks, "E2E_CAP="+strconv.Itoa(poolHolders))
	p.cands[id] = start(p.t, env, append(p.args(id, "--holders", strconv.Itoa(poolHolders), "--"), childArgv(p.t)...)...)
}

// holding are the starts of the children that run, by slot.
func holding(evs []event) map[int]event {
	held := map[int]event{}
	for _, e := range evs {
		switch e.Kind {
		case "start":
			held[slotOf(e)] = e
		case "exit":
			for s, h := range held {
				if h.Pid == e.Pid {
					delete(held, s)
				}
			}
		}
	}
	return held
}

func slotOf(e event) int {
	n, err := strconv.Atoi(strings.TrimPrefix(e.Rest, "slot="))
	if err != nil {
		return -1
	}
	return n
}

// checkOthers: while the pool is full, a candidate with another
// --holders is a usage error naming both numbers and the lock, --try
// finds every slot held, and status lists the three holders, with
// --holders or without.
func (p *pool) checkOthers() {
	t := p.t
	out, code := outputEnv(t, p.e.target.env, append(p.args("other", "--holders", "2", "--try", "--"), "true")...)
	if code != 64 || !strings.Contains(out, "--holders 2") || !strings.Contains(out, "--holders 3") || !strings.Contains(out, p.lock) {
		t.Errorf("a candidate with --holders 2: exit %d, want 64 naming --holders 2, --holders 3 and the lock:\n%s", code, out)
	}
	out, code = outputEnv(t, p.e.target.env, append(p.args("late", "--holders", "3", "--try", "--"), "true")...)
	if code != 75 || !strings.Contains(out, "all 3 slots") {
		t.Errorf("--try on the full pool: exit %d, want 75 saying all 3 slots are held:\n%s", code, out)
	}
	out, code = p.e.output(t, "status", p.lock, "--holders", "3")
	if code != 0 || !strings.Contains(out, "3 of 3 slots held") {
		t.Errorf("status --holders 3: exit %d, want 0 and three slots held:\n%s", code, out)
	}
	// Without --holders, status learns the pool's size from slot 0's
	// holder record.
	out, code = p.e.output(t, "status", p.lock)
	if code != 0 || !strings.Contains(out, "3 of 3 slots held") {
		t.Errorf("status without --holders: exit %d, want 0 and the pool's three slots held:\n%s", code, out)
	}
}

// checkInvariants reads the whole record: no child found its slot's or a
// capacity flock held, and each slot's tokens strictly increase.
func (p *pool) checkInvariants() {
	t := p.t
	evs := readEvents(t, p.events)
	if n := count(evs, "overlap") + count(evs, "overcap"); n > 0 {
		t.Errorf("%d children found their slot taken or the pool full:\n%s", n, formatEvents(evs))
	}
	tokens := map[int][]uint64{}
	for _, e := range evs {
		if e.Kind == "start" {
			tokens[slotOf(e)] = append(tokens[slotOf(e)], e.Token)
		}
	}
	for slot, ts := range tokens {
		if slot < 0 || slot >= poolHolders {
			t.Errorf("a child ran in slot %d of a pool of %d", slot, poolHolders)
		}
		if !slices.IsSorted(ts) || len(slices.Compact(slices.Clone(ts))) != len(ts) {
			t.Errorf("slot %d's tokens %v do not strictly increase", slot, ts)
		}
	}
	t.Logf("%d children in %d slots, tokens per slot %v", count(evs, "start"), len(tokens), tokens)
}

// TestHoldersCheckCatches: the flocks testHolders relies on do catch what
// it looks for. The child command alone, without leaderrun: a second
// child in slot 0 records "overlap", and a fourth child of a pool of 3
// (slots 0, 1, 2, 1) records "overcap".
func TestHoldersCheckCatches(t *testing.T) {
	t.Parallel()
	events := filepath.Join(t.TempDir(), "events")
	locks := t.TempDir()
	var children []*exec.Cmd
	t.Cleanup(func() {
		for _, c := range children {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	})
	run := func(slot string, want int) {
		c := exec.Command(childArgv(t)[0])
		c.Env = append(append(os.Environ(), childEnv(events, "forever")...),
			"E2E_SLOT_LOCKS="+locks, "E2E_CAP=3", "LEADERRUN_SLOT="+slot, "FENCE_TOKEN=1", "LEADERRUN_IDENTITY=x")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		children = append(children, c)
		waitEvents(t, events, 10*time.Second, "the child's start", func(evs []event) bool { return count(evs, "start") == want })
	}
	run("0", 1)
	run("0", 2)
	run("1", 3)
	run("2", 4)
	evs := readEvents(t, events)
	if n := count(evs, "overlap"); n != 1 {
		t.Errorf("%d overlap records for two children in slot 0, want 1\n%s", n, formatEvents(evs))
	}
	if n := count(evs, "overcap"); n != 1 {
		t.Errorf("%d overcap records for four children in a pool of 3, want 1\n%s", n, formatEvents(evs))
	}
}
