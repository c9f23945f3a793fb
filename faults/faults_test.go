package faults

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

func TestMain(m *testing.M) {
	if os.Getenv("FAULTS_CHILD") != "" {
		os.Exit(childMain())
	}
	os.Exit(m.Run())
}

func newStore(t testing.TB, name string) store {
	switch name {
	case "etcd":
		return newEtcdStore(t)
	case "consul":
		return newConsulStore(t)
	case "postgres":
		return newPostgresStore(t)
	case "zookeeper":
		return newZooKeeperStore(t)
	case "kubernetes":
		return newKubeStore(t)
	case "redis":
		return newRedisStore(t)
	case "dynamodb":
		return newDynamoStore(t)
	case "azureblob":
		return newAzureStore(t)
	case "mysql":
		return newMySQLStore(t)
	case "s3":
		return newS3Store(t)
	case "local":
		return newLocalStore(t)
	}
	t.Fatalf("unknown store %q", name)
	return nil
}

// TestFaults is the suite. scripts/faults.sh runs it with
// FAULTS_TRIALS (per scenario), FAULTS_BACKEND (a comma-separated list of
// stores, or all), FAULTS_ONLY (--only, for the report's command line; the
// script passes it to -run) and FAULTS_OUT (where the table and timelines
// go).
func TestFaults(t *testing.T) {
	trials, _ := strconv.Atoi(os.Getenv("FAULTS_TRIALS"))
	if trials <= 0 {
		t.Skip("the fault suite runs through scripts/faults.sh (FAULTS_TRIALS not set)")
	}
	backends := []string{"etcd", "consul", "postgres", "zookeeper", "kubernetes", "redis", "dynamodb", "azureblob", "mysql", "s3", "local"}
	backendFlag := "all"
	if b := os.Getenv("FAULTS_BACKEND"); b != "" && b != "all" {
		backends, backendFlag = strings.Split(b, ","), b
	}
	out := os.Getenv("FAULTS_OUT")
	if out == "" {
		out = t.TempDir()
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := testenv.Leaderrun(t)
	child, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// FAULTS_PARALLEL stores run at once, each with its own servers (the
	// scenarios of one store always run one after the other).
	parallel, _ := strconv.Atoi(os.Getenv("FAULTS_PARALLEL"))
	started := time.Now()
	byStore := make([][]*row, len(backends))
	t.Run("stores", func(t *testing.T) {
		for k, name := range backends {
			t.Run(name, func(t *testing.T) {
				if parallel > 1 {
					t.Parallel()
				}
				byStore[k] = runStore(t, name, trials, bin, child, out)
			})
		}
	})
	var rows []*row
	for _, rs := range byStore {
		for _, r := range rs {
			// A scenario left out by --only ran no trial: no row.
			if r.trials > 0 {
				rows = append(rows, r)
			}
		}
	}
	tbl := table(rows)
	fmt.Println()
	fmt.Print(tbl)
	commit := os.Getenv("FAULTS_COMMIT")
	if commit == "" {
		commit = "unknown"
	}
	cmdline := fmt.Sprintf("scripts/faults.sh --trials %d --backend %s", trials, backendFlag)
	if parallel > 1 {
		cmdline += fmt.Sprintf(" --parallel %d", parallel)
	}
	if only := os.Getenv("FAULTS_ONLY"); only != "" {
		cmdline += fmt.Sprintf(" --only '%s'", only)
	}
	report := fmt.Sprintf("# Fault-injection results\n\nProduced by `%s` at commit %s on %s (%d cores, %s/%s, %s), in %v.\n\n%s\n%s",
		cmdline, commit, time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), runtime.GOOS, runtime.GOARCH,
		runtime.Version(), time.Since(started).Round(time.Second), tbl, legend)
	if err := os.WriteFile(filepath.Join(out, "faults.md"), []byte(report), 0o644); err != nil {
		t.Error(err)
	}
	t.Logf("table and timelines written to %s", out)
}

// runStore runs every scenario of one store, trials times each, and
// returns its rows of the table.
func runStore(t *testing.T, name string, trials int, bin, child, out string) []*row {
	st := newStore(t, name)
	var rows []*row
	for _, f := range scenarios {
		if f.only != nil && !slices.Contains(f.only, name) || slices.Contains(f.except, name) {
			continue
		}
		if a, ok := st.(interface{ applies(fault) bool }); ok && !a.applies(f) {
			continue
		}
		r := &row{store: name, scenario: f.name, expectFailover: f.failover}
		rows = append(rows, r)
		drawn := false
		for i := range trials {
			t.Run(fmt.Sprintf("%s/%d", strings.ReplaceAll(f.name, " ", "_"), i), func(t *testing.T) {
				tr := runTrial(t, st, f, bin, child, i)
				v := tr.check()
				if f.escape {
					// The scenario proves nothing unless the
					// helper really ran beside the child the fault
					// hit. (The new leader's child may be stopped
					// before its own helper wrote: that proves
					// nothing either way.)
					for _, tm := range termsOf(v.lives) {
						if tm.Token == tr.tokenAtFault && len(tm.writers) < 2 {
							t.Errorf("%s: the child of %s (token %d) has no escaped helper in the ledger", f.name, tm.Identity, tm.Token)
						}
					}
				}
				r.add(v)
				if v.violations() > 0 {
					t.Errorf("%s %s trial %d: %d violations:\n%s", name, f.name, i, v.violations(), v.problems())
					for _, c := range tr.cands {
						t.Logf("candidate %s (exit %d):\n%s", c.id, c.code, c.out.String())
					}
				}
				// One timeline per scenario: the first trial, or the
				// first that broke an invariant.
				if !drawn || v.violations() > 0 {
					drawn = true
					file := filepath.Join(out, fmt.Sprintf("%s-%s.svg", name, slug(f.name)))
					title := fmt.Sprintf("%s: %s (trial %d)", name, f.name, i)
					if err := os.WriteFile(file, []byte(timeline(title, tr, v)), 0o644); err != nil {
						t.Error(err)
					}
				}
			})
		}
		t.Logf("%s %-22s trials=%d changes=%d violations=%d stale-rejected=%d failover p50=%s max=%s",
			name, f.name, r.trials, r.leaderChanges, r.violations(), r.staleRejected,
			fmtDur(percentile(r.failovers, .5)), fmtDur(percentile(r.failovers, 1)))
	}
	return rows
}

const legend = `
Invariants, checked on every trial from the ledger and the process records:
(a) two leaders' trees (a child, and any helper it started that left its process group) never run at the same time, except after a whole-group pause, where every write of the stale child after the takeover must be rejected (leaderrun alone stopped is no such pause: its watchdog holds the deadline); in the pool rows (--holders 3, 10 candidates), (a) to (d) hold per slot, each slot with its own ledger, and (a) also counts any instant at which more than 3 children of the pool ran;
(b) the token strictly increases at every change of leader;
(c) no write is accepted with a token lower than one already accepted;
(d) no child outlives its leaderrun (by more than 1 s: the ledger sees a closed connection a moment late), and after a kill -9 of leaderrun with an escaped helper, every process of its tree is gone within --kill-grace + 100 ms of the kill;
(e) no failover where none is expected (short link resets, store node restarts, raft leader killed).
Failover time is from the fault's start to the new leader's child starting; for the pause, stop and stall rows it includes the 2× lease of the fault window only as far as the store waits out the lease.
`

func slug(s string) string {
	s = strings.ToLower(s)
	var b strings.Builder
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	return strings.Trim(b.String(), "-")
}

// TestSuiteCatchesUnsafeBuild runs one stall trial against a leaderrun
// built to stop its child only after the lease has expired, and requires
// the suite to report the overlap: a fault suite that cannot fail proves
// nothing.
func TestSuiteCatchesUnsafeBuild(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "leaderrun-unsafe")
	build := exec.Command("go", "build", "-tags", "leaderrun_unsafe_late_kill", "-o", bin, ".")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build unsafe leaderrun: %v\n%s", err, out)
	}
	child, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	st := newEtcdStore(t)
	var stall fault
	for _, f := range scenarios {
		if f.name == "stall link 2x lease" {
			stall = f
		}
	}
	tr := runTrial(t, st, stall, bin, child, 0)
	v := tr.check()
	if len(v.overlap) == 0 {
		t.Fatalf("the suite saw no overlap with a leaderrun that kills late; lives: %+v", v.lives)
	}
	r := &row{store: "etcd", scenario: stall.name, expectFailover: true}
	r.add(v)
	if r.a == 0 || !strings.Contains(table([]*row{r}), fmt.Sprintf("| %d |", r.a)) {
		t.Errorf("the table does not report the overlap:\n%s", table([]*row{r}))
	}
	t.Logf("reported as expected:\n%s", v.problems())
}

// TestLedger: the ledger accepts a token at least the highest so far and
// rejects a lower one.
func TestLedger(t *testing.T) {
	l := newLedger(t)
	defer l.close()
	addr := strings.TrimPrefix(l.env()[1], "FAULTS_LEDGER=")
	cases := []struct {
		token uint64
		want  int
	}{{5, 200}, {5, 200}, {7, 200}, {6, 409}, {8, 200}}
	for _, c := range cases {
		resp, err := httpPost(fmt.Sprintf("http://%s/write?token=%d&writer=w", addr, c.token))
		if err != nil {
			t.Fatal(err)
		}
		if resp != c.want {
			t.Errorf("write with token %d: status %d, want %d", c.token, resp, c.want)
		}
	}
}
