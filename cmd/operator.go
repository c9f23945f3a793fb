package cmd

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/leaderrun/leaderrun/command"
	"github.com/leaderrun/leaderrun/observers/control"
)

// misreadLine says how a run's command line was read when what was taken
// for the command looks like a mistake: leaderrun's own flags follow it
// with no "--" between ("leaderrun stat --lock x", "leaderrun
// --etcd-endpoints URL status --lock x"), and the word is no program on
// PATH or resembles a command of leaderrun's; or it is the value given to
// --try ("--try 10s"). Nil for a line that reads as meant.
func misreadLine(c *cli.Context) error {
	raw, _ := c.App.Metadata[argsKey].([]string)
	if slices.Contains(raw, "--") {
		return nil
	}
	args := c.Args().Slice()
	if len(args) == 0 {
		return nil
	}
	word := args[0]
	if i := slices.Index(raw, word); i > 0 && raw[i-1] == "--try" && isDuration(word) {
		return usageErrorf("--try takes no value: it does not wait; to wait up to %s for the lock, use --wait %s", word, word)
	}
	if !hasOwnFlag(c.App, args[1:]) {
		return nil
	}
	before := flagsBefore(raw, word)
	if sub := resembles(c.App, word); sub != "" {
		line := strings.Join(append(append([]string{"leaderrun", sub}, before...), args[1:]...), " ")
		return usageErrorf("%q was read as the command to run, and %q as its arguments: did you mean `%s`?",
			word, strings.Join(args[1:], " "), line)
	}
	if nearCommand(c.App, word) != "" || !onPath(word) {
		return usageErrorf("%q was read as the command to run, and %q as its arguments: "+
			"put leaderrun's flags before the command, and \"--\" before it: leaderrun %s -- %s",
			word, strings.Join(args[1:], " "), strings.Join(append(before, args[1:]...), " "), word)
	}
	return nil
}

// flagsBefore are the arguments of raw between the command's name (or
// leaderrun's) and word.
func flagsBefore(raw []string, word string) []string {
	i := slices.Index(raw, word)
	if i < 1 {
		return nil
	}
	out := slices.Clone(raw[1:i])
	return slices.DeleteFunc(out, func(a string) bool { return a == "run" })
}

// hasOwnFlag reports whether args hold --lock, --backend or a store's
// address flag: flags that only leaderrun takes.
func hasOwnFlag(app *cli.App, args []string) bool {
	own := map[string]bool{"lock": true, "backend": true, "holders": true}
	for _, s := range stores {
		for _, f := range s.flags() {
			own[f.Names()[0]] = true
		}
	}
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
			if own[name] {
				return true
			}
		}
	}
	return false
}

// resembles is the command of leaderrun's that word names, abbreviates
// (3 letters at least) or misspells by two edits at most, or "".
func resembles(app *cli.App, word string) string {
	for _, c := range app.Commands {
		if c.Hidden || c.Name == "run" {
			continue
		}
		if c.Name == word || len(word) >= 3 && strings.HasPrefix(c.Name, word) || editDistance(word, c.Name) <= 2 {
			return c.Name
		}
	}
	return ""
}

func onPath(word string) bool {
	_, err := command.Resolve(word)
	return err == nil
}

func isDuration(s string) bool {
	if _, err := time.ParseDuration(s); err == nil {
		return true
	}
	_, err := strconv.ParseFloat(strings.TrimSuffix(s, "d"), 64)
	return err == nil
}

// flagAsValue refuses a flag that takes a value given another flag as
// its value ("--lock -q -- true" would name the lock "-q").
func flagAsValue(c *cli.Context) error {
	raw, _ := c.App.Metadata[argsKey].([]string)
	takes := map[string]bool{}
	known := map[string]bool{}
	for _, f := range c.Command.Flags {
		for _, n := range f.Names() {
			known[n] = true
			if _, ok := f.(*cli.BoolFlag); !ok {
				takes[n] = true
			}
		}
	}
	for i := 1; i+1 < len(raw) && raw[i] != "--"; i++ {
		name := strings.TrimLeft(raw[i], "-")
		if !strings.HasPrefix(raw[i], "-") || strings.Contains(name, "=") || !takes[name] {
			continue
		}
		next, _, _ := strings.Cut(strings.TrimLeft(raw[i+1], "-"), "=")
		if strings.HasPrefix(raw[i+1], "-") && (known[next] || raw[i+1] == "--") {
			return usageErrorf("--%s needs a value, but is followed by the flag %s", name, raw[i+1])
		}
	}
	return nil
}

// completeValue lists the values of the flag or command that args (a
// completion request: the last word is --generate-bash-completion) ends
// with, or nil.
func completeValue(args []string) []string {
	n := len(args)
	if n < 3 || args[n-1] != "--generate-bash-completion" {
		return nil
	}
	switch args[n-2] {
	case "--backend":
		names := make([]string, len(stores))
		for i, s := range stores {
			names[i] = s.name
		}
		return names
	case "--log-format":
		return []string{"text", "json"}
	case "--log-level":
		return []string{"debug", "info", "warn", "error"}
	case "--kill-signal":
		return []string{"SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"}
	case "completion":
		return []string{"bash", "zsh", "fish"}
	}
	return nil
}

// helpAction answers "leaderrun help [COMMAND]" as urfave/cli's own help
// command would.
func helpAction(c *cli.Context) error {
	name := c.Args().Get(1)
	if name == "" {
		return cli.ShowAppHelp(c)
	}
	if c.App.Command(name) == nil {
		return usageErrorf("help %s: no such command; the commands are run, status, history, check, version and completion", name)
	}
	return cli.ShowCommandHelp(c, name)
}

// internals are the package prefixes of the sentinel errors that wrapped
// errors end with ("backends: store unavailable"): they name Go packages,
// which mean nothing to the operator.
var internals = strings.NewReplacer("backends: ", "", "signals: ", "", "control: ", "")

var longDuration = regexp.MustCompile(`\b(\d+h)0m0s\b|\b(\d+m)0s\b`)

// plainMessage is err's message for people: one line, without Go package
// names, durations as they would be typed (8784h, not 8784h0m0s).
func plainMessage(err error) string {
	msg := err.Error()
	if strings.Contains(msg, control.ErrNoSocket.Error()) {
		return "check: not inside a command started by leaderrun ($LEADERRUN_SOCKET is not set); call it from the job leaderrun runs"
	}
	msg = internals.Replace(msg)
	msg = strings.ReplaceAll(lineBreaks.Replace(msg), "\t", " ")
	return longDuration.ReplaceAllString(msg, "$1$2")
}

// helpDefaults is urfave/cli's flag formatter, without "(default: 0s)"
// after a duration that is off when zero: its usage says what 0 means.
func helpDefaults(format cli.FlagStringFunc) cli.FlagStringFunc {
	return func(f cli.Flag) string {
		s := format(f)
		if d, ok := f.(*cli.DurationFlag); ok && d.Value == 0 {
			s = strings.Replace(s, fmt.Sprintf(" (default: %v)", time.Duration(0)), "", 1)
		}
		return s
	}
}
