// Package cmd is leaderrun's command line: flags and their environment
// variables, read into the runner's configuration (each flag's syntax is
// checked here, how the values relate by runner.New), building a backend,
// what observes a run, and the mapping of errors to exit codes (exit.go).
// Nothing below cmd imports urfave/cli.
package cmd

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/leaderrun/leaderrun/signals"
)

// Main runs leaderrun with args (os.Args) and returns the process's exit
// code. leaderrun re-executed as a command's watchdog never gets here: the
// init of package takeover takes it over first.
func Main(args []string) int {
	return run(args, os.Stdout, os.Stderr)
}

func run(args []string, stdout, stderr io.Writer) int {
	if n := len(args); n > 1 && args[n-1] == "--generate-bash-completion" && slices.Contains(args[:n-1], "--") {
		// Completing the command's own arguments: urfave/cli would parse
		// this as a run and start the command. Let the shell complete files.
		return 0
	}
	if vals := completeValue(args); vals != nil {
		fmt.Fprintln(stdout, strings.Join(vals, "\n"))
		return 0
	}
	st := &state{stdout: stdout, stderr: stderr, codes: defaultCodes}
	by, err := takeHandOver()
	if err != nil {
		st.report(err, ExitUnavailable)
		return ExitUnavailable
	}
	app := newApp(st)
	app.Metadata = map[string]any{argsKey: args, handedOverKey: by}
	if !wantsHelp(args) {
		uncategorize(app)
	}
	args = withDefaultCommand(app, args)
	if len(args) > 1 && args[1] == "run" && !wantsHelp(args) {
		// A run: its watchdog starts now, while the flags are read and
		// the store is reached, and the runner adopts it.
		signals.LaunchWatchdog()
	}
	err = app.Run(args)
	code := exitCode(err, st.codes)
	if err != nil && !silent(err) {
		st.report(err, code)
	}
	return code
}

// state carries what an action decides back to run: the exit codes the
// user chose, and whether an error was already logged.
type state struct {
	stdout, stderr io.Writer
	codes          codes
	// logged is set once an error has been logged where it was handled,
	// so that run does not print it twice.
	logged bool
	// command is "run ", "status " or "check " once one runs, for the
	// usage hint.
	command string
}

func (st *state) report(err error, code int) {
	if st.logged {
		return
	}
	msg := plainMessage(err)
	if code == ExitUsage {
		msg += fmt.Sprintf(" (see leaderrun %s--help)", st.command)
	}
	fmt.Fprintf(st.stderr, "leaderrun: %s\n", msg)
}

// wantsHelp reports whether args may print a command's flags: --help, -h
// or a completion request before "--".
func wantsHelp(args []string) bool {
	for _, a := range args[1:] {
		switch a {
		case "--":
			return false
		case "-h", "--help", "-help", "help", "--generate-bash-completion":
			return true
		}
	}
	return false
}

// uncategorize drops the help categories of every command's flags when
// no help will be printed: urfave/cli formats the usage text of every flag
// of every command to sort them into categories before it parses
// anything, a third of the time the command line takes (about 0.3 ms of
// each start). Flags of other types keep their category.
func uncategorize(app *cli.App) {
	for _, c := range app.Commands {
		for _, f := range c.Flags {
			switch f := f.(type) {
			case *cli.StringFlag:
				f.Category = ""
			case *cli.BoolFlag:
				f.Category = ""
			case *cli.DurationFlag:
				f.Category = ""
			case *cli.IntFlag:
				f.Category = ""
			}
		}
	}
}

// withDefaultCommand makes run the default command: "leaderrun --lock x --
// cmd" is "leaderrun run --lock x -- cmd". Inserting the name, rather than
// giving the app an action, keeps a child called "status" from being taken
// for the status command.
func withDefaultCommand(app *cli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	first := args[1]
	if slices.Contains([]string{"-h", "--help", "help", "-v", "--version", "--generate-bash-completion"}, first) {
		return args
	}
	for _, c := range app.Commands {
		if c.HasName(first) {
			return args
		}
	}
	if near := nearCommand(app, first); near != "" {
		// "leaderrun stauts --lock x" is a mistyped command, not a run of
		// a program called stauts: let the app say so.
		return args
	}
	return append([]string{args[0], "run"}, args[1:]...)
}

// nearCommand is the command that word is a likely typo of (at most two
// edits away, and not a flag), or "".
func nearCommand(app *cli.App, word string) string {
	if word == "" || strings.HasPrefix(word, "-") {
		return ""
	}
	if _, err := exec.LookPath(word); err == nil {
		// A program of that name: with the lock and store in the
		// environment, "leaderrun true" runs it.
		return ""
	}
	for _, c := range app.Commands {
		if !c.Hidden && editDistance(word, c.Name) <= 2 {
			return c.Name
		}
	}
	return ""
}

// editDistance is the Levenshtein distance between two short words.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// formatFlag is urfave/cli's own flag formatter, which help wraps.
var formatFlag = cli.FlagStringer

func newApp(st *state) *cli.App {
	cli.FlagStringer = helpDefaults(formatFlag)
	return &cli.App{
		Name:      "leaderrun",
		Usage:     "run a command only while this host holds a lock in etcd, Consul, PostgreSQL, Kubernetes, ZooKeeper, Redis, DynamoDB, Azure Blob or a local lock file",
		UsageText: "leaderrun [run] --lock NAME [flags] -- COMMAND [ARG...]\nleaderrun status --lock NAME [--holders N] [--json] [store flags]\nleaderrun history --lock NAME [--holders N] [--json] [--limit N] [store flags]\nleaderrun check [--progress] [--min-remaining D] [-v]\nleaderrun version\nleaderrun completion bash|zsh|fish",
		Description: `leaderrun campaigns for the lock NAME and runs COMMAND only while it holds
it. The command gets $FENCE_TOKEN, a number that grows with every grant of
the lock: send it with every write so that a resource can refuse a leader
that was paused and lost its lease. If the lease is lost, leaderrun stops the
command and everything it started (--kill-signal, then SIGKILL after
--kill-grace) before the store can hand the lock to anyone else, and exits 76.
With --holders N, up to N hosts run COMMAND at once, each in a slot 0..N-1
($LEADERRUN_SLOT) whose $FENCE_TOKEN grows with every grant of that slot.

crontab, on every host (one successful run a day; a host that finds the
lock held waits, and runs the job if the leader died before finishing it):
   PATH=/usr/local/bin:/usr/bin:/bin
   LEADERRUN_ETCD_ENDPOINTS=http://10.0.0.1:2379,http://10.0.0.2:2379
   0 2 * * * /usr/local/bin/leaderrun --quiet --wait 50m --once-per 24h --lock billing -- /opt/billing/run

systemd unit (standbys wait; the leader runs the service; see
examples/systemd/ for the commented, sandboxed original):
   [Service]
   Type=notify
   NotifyAccess=main
   Environment=LEADERRUN_ETCD_ENDPOINTS=http://10.0.0.1:2379,http://10.0.0.2:2379
   ExecStart=/usr/local/bin/leaderrun --lock relay -- /usr/bin/relay
   Restart=always
   SuccessExitStatus=76 143
   KillMode=mixed
   TimeoutStopSec=10

Exit codes: the command's own; 128+N if it died of signal N; 1 check: not
leader; 3 status: no leader; 64 usage or unsafe state directory; 65 local
token or state file corrupt; 69 store unreachable or refused; 70 internal
error; 75 not acquired (--try, --wait); 76 leadership lost; 124 no progress
reported for --progress-timeout; 126 command not executable; 127 command not
found; --done-exit-code (0) when --once-per or --once-key finds the run
already done.

Run 'leaderrun run --help' for every flag of run.`,
		Version:              Version(),
		HideHelpCommand:      true,
		EnableBashCompletion: true,
		Writer:               st.stdout,
		ErrWriter:            st.stderr,
		// Only Main turns errors into exit codes.
		ExitErrHandler: func(*cli.Context, error) {},
		OnUsageError:   onUsageError,
		Action: func(c *cli.Context) error {
			if c.Args().First() == "help" {
				return helpAction(c)
			}
			if word := c.Args().First(); word != "" {
				if near := nearCommand(c.App, word); near != "" {
					return usageErrorf("unknown command %q: did you mean %q?", word, near)
				}
			}
			_ = cli.ShowAppHelp(c)
			return usageErrorf("no command given")
		},
		Commands: []*cli.Command{runCommand(st), statusCommand(st), historyCommand(st), checkCommand(st), versionCommand(st), completionCommand(st)},
	}
}

// onUsageError rewrites the flag package's wording ("flag provided but not
// defined: -x", "invalid value ... for flag -x") in the CLI's own terms.
func onUsageError(_ *cli.Context, err error, _ bool) error {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		msg = "unknown flag --" + strings.TrimPrefix(name, "-")
	}
	if before, after, ok := strings.Cut(msg, " for flag -"); ok {
		msg = before + " for --" + strings.TrimPrefix(after, "-")
		if v, ok := badDuration(before, after); ok {
			msg = strings.TrimSuffix(msg, "parse error") + durationHint(v)
		}
	}
	if v, src, ok := badEnvDuration(msg); ok {
		msg = fmt.Sprintf("invalid value %q in %s: %s", v, src, durationHint(v))
	} else if m := badEnv.FindStringSubmatch(msg); m != nil {
		msg = fmt.Sprintf("invalid value %s in %s for --%s: %s", m[1], m[3], m[4], envWant[m[2]])
	}
	if strings.HasSuffix(msg, "-try: parse error") {
		msg = "--try takes no value: it does not wait; to wait a while for the lock, use --wait D (--wait 10s)"
	}
	return &usageError{msg: msg}
}

// badEnv is urfave/cli's message for a variable it could not parse:
// the value, its type, the variable and the flag.
var badEnv = regexp.MustCompile(`^could not parse (".*") as (\w+) value from environment variable "(\w+)" for flag ([\w-]+): `)

// envWant says what a variable of each type takes.
var envWant = map[string]string{
	"bool": "want true or false (or 1 or 0)", "int": "want a whole number", "duration": "want a duration such as 30s or 5m",
}

// badEnvDuration reports the value and variable of urfave/cli's message
// for a duration variable it could not parse, if msg is one for a bare
// number or a number of days.
func badEnvDuration(msg string) (value, source string, ok bool) {
	rest, ok := strings.CutPrefix(msg, "could not parse ")
	if !ok {
		return "", "", false
	}
	q, rest, ok := strings.Cut(rest, " as duration value from environment variable ")
	if !ok {
		return "", "", false
	}
	name, _, _ := strings.Cut(rest, " for flag ")
	value, err := strconv.Unquote(q)
	if err != nil {
		return "", "", false
	}
	if _, err := strconv.ParseFloat(strings.TrimSuffix(value, "d"), 64); err != nil {
		return "", "", false
	}
	return value, strings.Trim(name, `"`), true
}

// badDuration reports the value of an "invalid value "V" for flag -F:
// parse error" that is a duration flag's, from the two halves of the
// message around " for flag -".
func badDuration(before, after string) (string, bool) {
	v, ok := strings.CutPrefix(before, "invalid value ")
	if !ok || !strings.HasSuffix(after, ": parse error") {
		return "", false
	}
	v, err := strconv.Unquote(v)
	if err != nil {
		return "", false
	}
	if _, err := strconv.ParseFloat(strings.TrimSuffix(v, "d"), 64); err == nil {
		return v, true
	}
	return "", false
}

// durationHint says how to write a duration when v is a bare number or a
// number of days, which Go's durations do not take.
func durationHint(v string) string {
	if days, ok := strings.CutSuffix(v, "d"); ok {
		if n, err := strconv.ParseFloat(days, 64); err == nil {
			return fmt.Sprintf("durations take ms, s, m or h, not days: %sd is %gh", days, n*24)
		}
	}
	return fmt.Sprintf("a duration needs a unit (ms, s, m or h): %ss, %sm or %sh", v, v, v)
}
