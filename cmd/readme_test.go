package cmd

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
)

// readmeTable returns the rows of the first table after the heading, as
// cells without their surrounding spaces.
func readmeTable(t *testing.T, heading string) [][]string {
	t.Helper()
	data, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("README has no heading %q", heading)
	}
	var rows [][]string
	for _, line := range strings.Split(rest, "\n") {
		if !strings.HasPrefix(line, "|") {
			if len(rows) > 0 {
				break
			}
			continue
		}
		line = strings.ReplaceAll(line, `\|`, "\x00")
		var cells []string
		for _, c := range strings.Split(strings.Trim(line, "|"), "|") {
			cells = append(cells, strings.ReplaceAll(strings.TrimSpace(c), "\x00", "|"))
		}
		if !strings.HasPrefix(cells[0], "---") {
			rows = append(rows, cells)
		}
	}
	return rows[1:] // the header
}

// ownRunFlags are the flags of run that the README's table of run's flags
// lists: all but the stores' own, which each backend's section lists.
func ownRunFlags() []cli.Flag {
	var storeOwn []string
	for _, s := range stores {
		for _, f := range s.flags() {
			storeOwn = append(storeOwn, f.Names()[0])
		}
	}
	var own []cli.Flag
	for _, f := range runFlags() {
		if !slices.Contains(storeOwn, f.Names()[0]) {
			own = append(own, f)
		}
	}
	return own
}

// TestReadmeFlagsOfRun: the README's table of run's flags lists every
// flag of run but the stores' own, and nothing else, each with its
// variables and its default.
func TestReadmeFlagsOfRun(t *testing.T) {
	flagName := regexp.MustCompile("^`--([a-z0-9-]+)")
	rows := map[string][]string{}
	for _, r := range readmeTable(t, "### Flags of `run`") {
		m := flagName.FindStringSubmatch(r[0])
		if m == nil || len(r) != 4 {
			t.Errorf("README row %q: want | `--flag ...` | env | default | meaning |", r)
			continue
		}
		rows[m[1]] = r
	}
	for _, f := range ownRunFlags() {
		name := f.Names()[0]
		r, ok := rows[name]
		if !ok {
			t.Errorf("--%s is a flag of run, but the README's table does not list it", name)
			continue
		}
		delete(rows, name)
		for _, alias := range f.Names()[1:] {
			if !strings.Contains(r[0], "`-"+alias+"`") {
				t.Errorf("--%s: the README does not name its alias -%s: %q", name, alias, r[0])
			}
		}
		var env []string
		if ef, ok := f.(interface{ GetEnvVars() []string }); ok {
			env = ef.GetEnvVars()
		}
		for _, v := range env {
			if !strings.Contains(r[1], "`"+v+"`") {
				t.Errorf("--%s is read from %s, but the README says %q", name, v, r[1])
			}
		}
		if len(env) == 0 && r[1] != "" {
			t.Errorf("--%s is read from no variable, but the README says %q", name, r[1])
		}
		if def := defaultOf(f); def != "" && !strings.Contains(r[2], "`"+def+"`") {
			t.Errorf("--%s defaults to %s, but the README says %q", name, def, r[2])
		}
	}
	for name := range rows {
		t.Errorf("the README lists --%s among run's flags, but run has no such flag", name)
	}
}

// defaultOf is a flag's default as the README writes it, "" for none.
func defaultOf(f cli.Flag) string {
	switch f := f.(type) {
	case *cli.DurationFlag:
		switch d := f.Value; {
		case d == 0:
		case d%time.Hour == 0:
			return fmt.Sprintf("%dh", d/time.Hour)
		case d%time.Minute == 0:
			return fmt.Sprintf("%dm", d/time.Minute)
		default:
			return d.String()
		}
	case *cli.IntFlag:
		if f.Value != 0 {
			return fmt.Sprint(f.Value)
		}
	case *cli.StringFlag:
		return f.Value
	}
	return ""
}

// TestExitCodesDocumented: every exit code leaderrun itself chooses is in
// the README's table and in --help's Description.
func TestExitCodesDocumented(t *testing.T) {
	var readme []string
	for _, r := range readmeTable(t, "### Exit codes") {
		readme = append(readme, r[0])
	}
	var help bytes.Buffer
	if code := run([]string{"leaderrun", "--help"}, &help, &help); code != 0 {
		t.Fatalf("--help: exit %d", code)
	}
	for _, code := range []int{ExitNotLeader, ExitNoLeader, ExitUsage, ExitDataErr, ExitUnavailable, ExitSoftware,
		ExitConflict, ExitLost, ExitStalled, ExitNotExec, ExitNotFound} {
		c := fmt.Sprint(code)
		if !slices.ContainsFunc(readme, func(cell string) bool { return slices.Contains(strings.Split(cell, " / "), c) }) {
			t.Errorf("exit code %d is not in the README's table", code)
		}
		if !regexp.MustCompile(`\b` + c + `\b`).MatchString(help.String()) {
			t.Errorf("exit code %d is not in --help", code)
		}
	}
}

// TestReadmeFirstScreen: the README's first 60 lines hold the build line
// (stamping the commit), a first run on the local store and a crontab
// line whose variables name a store; the whole file stays under 450
// lines, each store's detail on its own page.
func TestReadmeFirstScreen(t *testing.T) {
	data, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	if len(lines) >= 450 {
		t.Errorf("README has %d lines, want under 450", len(lines))
	}
	first := strings.Join(lines[:min(60, len(lines))], "\n")
	build := regexp.MustCompile(`(?m)^ {4}CGO_ENABLED=0 go build .*-buildvcs=true.* \. \./cmd/leaderrun-aws$`)
	localRun := regexp.MustCompile(`(?m)^ {4}leaderrun --backend local --lock \S+ -- .+$`)
	cron := regexp.MustCompile(`(?m)^ {4}(\S+ ){5}/usr/local/bin/leaderrun .*--lock \S+ -- \S+$`)
	if !build.MatchString(first) || !localRun.MatchString(first) || !cron.MatchString(first) {
		t.Errorf("the first 60 lines lack the build line (%v), a first run on the local store (%v) or a crontab line (%v)",
			build.MatchString(first), localRun.MatchString(first), cron.MatchString(first))
	}
	var selects []string
	for _, s := range stores {
		for _, f := range s.flags() {
			if ef, ok := f.(*cli.StringFlag); ok && s.selected != nil {
				selects = append(selects, ef.EnvVars...)
			}
		}
	}
	named := false
	for _, v := range selects {
		named = named || regexp.MustCompile(`(?m)^ {4}`+v+`=\S+$`).MatchString(first)
	}
	if !named {
		t.Errorf("the crontab of the first 60 lines sets no store's variable: its line would exit 64 every night")
	}
	for _, l := range lines {
		if regexp.MustCompile(`\b[0-9a-f]{7,12}\b`).MatchString(l) && strings.Contains(l, " at ") {
			t.Errorf("README names a commit (a journal belongs in the history): %q", l)
		}
	}
}
