package runner_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/local"
	"github.com/leaderrun/leaderrun/internal/testenv"
	"github.com/leaderrun/leaderrun/runner"
	"github.com/leaderrun/leaderrun/signals"
)

// poolEnv is a lock of the local backend whose slots a test holds from a
// second backend of its own, beside the runner under test.
type poolEnv struct {
	t      *testing.T
	dir    string
	events string
	other  backends.Store // another candidate's store
}

func newPoolEnv(t *testing.T) *poolEnv {
	dir := t.TempDir()
	other := local.Open(dir)
	t.Cleanup(func() { other.Close() })
	return &poolEnv{t: t, dir: dir, events: filepath.Join(dir, "events"), other: other}
}

// hold takes slot i for another candidate of a pool of holders, with --try.
func (e *poolEnv) hold(i, holders int) *backends.Lease {
	e.t.Helper()
	// A pool's candidate takes the lowest free slot: hold the free ones
	// below i meanwhile.
	var below []*backends.Lease
	var l *backends.Lease
	for {
		var err error
		l, err = backends.Campaign(context.Background(), e.other, "runner", backends.Candidate{Identity: "other", Try: true,
			Timings: backends.DefaultTimings, Holders: holders})
		if err != nil {
			e.t.Fatalf("hold slot %d: %v", i, err)
		}
		if l.Slot() == i {
			break
		}
		if l.Slot() > i {
			e.t.Fatalf("hold slot %d: took slot %d", i, l.Slot())
		}
		below = append(below, l)
	}
	for _, b := range below {
		_ = b.Release(context.Background(), nil)
	}
	e.t.Cleanup(func() { _ = l.Release(context.Background(), nil) })
	return l
}

// config is the runner's configuration for a pool of holders.
func (e *poolEnv) config(holders int) runner.Config {
	cfg := baseConfig(e.t, local.Open(e.dir), e.events)
	cfg.Holders = holders
	return cfg
}

// start runs the runner in the background; the returned function cancels
// it and returns what Run returned.
func (e *poolEnv) start(cfg runner.Config) func() error {
	r, err := runner.New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := r.Run(ctx)
		done <- err
	}()
	e.t.Cleanup(cancel)
	return func() error {
		cancel()
		return <-done
	}
}

// started waits for the child and returns its token and slot.
func (e *poolEnv) started() (token, slot string) {
	e.t.Helper()
	recorded(e.t, e.events, "start")
	data, _ := os.ReadFile(e.events)
	f := strings.Fields(strings.SplitN(string(data), "\n", 2)[0])
	if len(f) != 4 {
		e.t.Fatalf("child's record %q: want what, time, token and slot", data)
	}
	return f[2], f[3]
}

// TestPoolTakesLowestFreeSlot: with slots 0 and 2 held, a candidate of a
// pool of 3 takes slot 1, and its child gets LEADERRUN_SLOT=1 and slot
// 1's token.
func TestPoolTakesLowestFreeSlot(t *testing.T) {
	for _, try := range []bool{true, false} {
		t.Run(map[bool]string{true: "try", false: "wait"}[try], func(t *testing.T) {
			e := newPoolEnv(t)
			e.hold(0, 3)
			e.hold(2, 3)
			cfg := e.config(3)
			cfg.Try = try
			stop := e.start(cfg)
			token, slot := e.started()
			if slot != "1" {
				t.Errorf("child got LEADERRUN_SLOT=%s, want 1, the lowest free slot", slot)
			}
			st, err := backends.ReadStatus(context.Background(), e.other, backends.SlotLock("runner", 1))
			if err != nil || !st.Held || st.Identity != t.Name() || st.Holders != 3 {
				t.Errorf("status of slot 1: %+v, %v; want held by the runner, recording 3 holders", st, err)
			}
			if got := st.Token; token != strconv.FormatUint(got, 10) {
				t.Errorf("child's FENCE_TOKEN %s, slot 1's token %d", token, got)
			}
			if err := stop(); err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
}

// TestPoolAllHeld: --try on a pool whose every slot is held tries each
// once, and --wait gives up after its time; both return ErrNotAcquired,
// saying so, and nothing runs.
func TestPoolAllHeld(t *testing.T) {
	e := newPoolEnv(t)
	for i := range 3 {
		e.hold(i, 3)
	}
	for _, tc := range []struct {
		name string
		try  bool
		wait time.Duration
		want string
	}{
		{"try", true, 0, "all 3 slots of lock \"runner\" are held (--try)"},
		{"wait", false, 300 * time.Millisecond, "all 3 slots of lock \"runner\" still held after --wait 300ms"},
	} {
		cfg := e.config(3)
		cfg.Try, cfg.Wait = tc.try, tc.wait
		began := time.Now()
		_, err := run(context.Background(), cfg)
		if !errors.Is(err, runner.ErrNotAcquired) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Run: %v, want ErrNotAcquired saying %q", tc.name, err, tc.want)
		}
		if took := time.Since(began); took < tc.wait || took > tc.wait+5*time.Second {
			t.Errorf("%s: gave up after %v, want after %v", tc.name, took, tc.wait)
		}
	}
	if _, err := os.Stat(e.events); err == nil {
		t.Error("the child ran although every slot was held")
	}
}

// TestPoolWaitsForAnySlot: with every slot held, a waiting candidate of a
// pool campaigns in all of them and takes the first that frees; its other
// campaigns are withdrawn, so a slot freed after that stays free.
func TestPoolWaitsForAnySlot(t *testing.T) {
	e := newPoolEnv(t)
	held := []*backends.Lease{e.hold(0, 3), e.hold(1, 3), e.hold(2, 3)}
	cfg := e.config(3)
	var log testenv.LockedBuffer
	cfg.Log = slog.New(slog.NewTextHandler(&log, nil))
	stop := e.start(cfg)
	waitUntil(t, func() bool { return strings.Contains(log.String(), "waiting for the first to free") })
	if err := held[2].Release(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if _, slot := e.started(); slot != "2" {
		t.Fatalf("child in slot %s, want 2, the slot that was freed", slot)
	}
	if err := held[0].Release(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	st, err := backends.ReadStatus(context.Background(), e.other, "runner")
	if err != nil || st.Held {
		t.Errorf("slot 0 after its holder released it: %+v, %v; want free (the runner withdrew from it)", st, err)
	}
	if err := stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
	terms, err := backends.ReadHistory(context.Background(), e.other, "runner", 0)
	if err != nil || len(terms) != 0 {
		t.Errorf("slot 0's history %+v, %v; want none (no term for a slot where nothing ran)", terms, err)
	}
}

// TestPoolDisagreement: a candidate whose --holders differs from what a
// holder of any slot recorded gets a *ConfigError naming both numbers and
// the lock, and runs nothing; a holder that recorded nothing counts as 1.
func TestPoolDisagreement(t *testing.T) {
	for _, tc := range []struct {
		name          string
		slot, holders int
		want          string
	}{
		{"pool of 2 in slot 1", 1, 2, `--holders 3: slot 1 of lock "runner" is held by "other", which runs with --holders 2`},
		{"one holder in slot 0", 0, 0, `--holders 3: slot 0 of lock "runner" is held by "other", which runs with --holders 1`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newPoolEnv(t)
			e.hold(tc.slot, tc.holders)
			for _, try := range []bool{true, false} {
				cfg := e.config(3)
				cfg.Try = try
				_, err := run(context.Background(), cfg)
				var ce *runner.ConfigError
				if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("try=%v: Run: %v, want a *ConfigError containing %q", try, err, tc.want)
				}
			}
			if _, err := os.Stat(e.events); err == nil {
				t.Error("the child ran although the pool sizes disagree")
			}
		})
	}
}

// TestPoolOnceMarkers: by default a marker in any slot of the pool makes
// the run done; with OncePerSlot only the own slot's marker counts.
func TestPoolOnceMarkers(t *testing.T) {
	e := newPoolEnv(t)
	l := e.hold(1, 3)
	m := backends.Marker{Key: "k", Identity: "other", Token: l.Token(), At: time.Now(), Expires: time.Now().Add(time.Hour)}
	if err := l.Complete(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	e.hold(1, 3) // so that the runner takes slot 0
	cfg := e.config(3)
	cfg.Try, cfg.OnceKey, cfg.OnceKeep = true, "k", time.Hour
	cfg.Child = signals.Spec{Path: "/bin/sh", Args: []string{"sh", "-c", "exit 0"}}
	_, err := run(context.Background(), cfg)
	var done *runner.DoneError
	if !errors.As(err, &done) || done.Marker.Identity != "other" {
		t.Fatalf("Run with slot 1's marker: %v, want a *DoneError naming slot 1's holder", err)
	}
	cfg.OncePerSlot = true
	status, err := run(context.Background(), cfg)
	if err != nil || status.ExitCode() != 0 {
		t.Fatalf("Run with --once-per-slot: %v, %v; want the command run in slot 0", status, err)
	}
	if m, err := backends.ReadMarker(context.Background(), e.other, "runner", "k"); err != nil || m == nil || m.Identity != t.Name() {
		t.Errorf("slot 0's marker after the run: %+v, %v; want one written by the runner", m, err)
	}
}
