package cmd

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/leaderrun/leaderrun/backends"
)

func historyCommand(st *state) *cli.Command {
	return &cli.Command{
		Name:  "history",
		Usage: "list the recent terms of the lock, newest first: who led, with which token, and how it ended",
		UsageText: "leaderrun history --lock NAME [--holders N] [--json] [--limit N] [store flags]\n\n" +
			"A lock never held prints nothing and exits 0.",
		Flags: readFlags("print one JSON object per term, one per line",
			&cli.IntFlag{Name: "limit", Value: 20, Usage: "show the newest `N` terms (the store keeps about 100)"},
			holdersFlag("the lock's pool size `N` (--holders of run): the terms of every slot, merged, with their slot")),
		OnUsageError: func(c *cli.Context, err error, sub bool) error {
			st.command = "history "
			return onUsageError(c, err, sub)
		},
		Action: func(c *cli.Context) error {
			st.command = "history "
			limit := c.Int("limit")
			if limit < 1 || limit > backends.HistoryLimit {
				return usageErrorf("--limit %d: want 1-%d", limit, backends.HistoryLimit)
			}
			holders, err := holdersOf(c)
			if err != nil {
				return err
			}
			return withStore(c, "history", func(ctx context.Context, s backends.Store) error {
				if holders > 1 {
					return poolHistory(ctx, c, st, s, holders, limit)
				}
				terms, err := backends.ReadHistory(ctx, s, c.String("lock"), limit)
				if err != nil {
					return err
				}
				if !c.Bool("json") {
					printHistory(st, terms)
					return nil
				}
				enc := json.NewEncoder(st.stdout)
				for _, t := range terms {
					if err := enc.Encode(t); err != nil {
						return err
					}
				}
				return nil
			})
		},
	}
}

// printHistory prints terms as a table a person reads at a glance; every
// value that came from the store is escaped (escape), so that a hostile
// identity cannot paint the operator's terminal.
func printHistory(st *state, terms []backends.Term) {
	if len(terms) == 0 {
		return
	}
	w := tabwriter.NewWriter(st.stdout, 0, 0, 2, ' ', 0)
	defer w.Flush()
	fmt.Fprintln(w, "TOKEN\tIDENTITY\tACQUIRED\tRAN\tENDED\tHOW\tONCE-KEY")
	for _, t := range terms {
		fmt.Fprintln(w, termRow(t))
	}
}

// termRow is one term's cells of the history table, tab-separated.
func termRow(t backends.Term) string {
	ran := "-"
	if !t.Started.IsZero() {
		ran = t.Ended.Sub(t.Started).Round(time.Millisecond).String()
	}
	key := t.OnceKey
	if key == "" {
		key = "-"
	}
	h := escape(how(t))
	if len(h) > 72 {
		h = strings.ToValidUTF8(h[:72], "") + "…" // --json has it whole
	}
	return fmt.Sprintf("%d\t%s\t%s\t%s\t%s\t%s\t%s", t.Token, escape(t.Identity), stamp(t.Acquired), ran,
		stamp(t.Ended), h, escape(key))
}

// how says in a few words how a term ended.
func how(t backends.Term) string {
	switch t.End {
	case backends.EndExited:
		return "exited " + strconv.Itoa(t.ExitCode)
	case backends.EndSignaled:
		return "killed by " + t.Signal
	case backends.EndStopped:
		return fmt.Sprintf("stopped on %s (exit %d)", t.Signal, t.ExitCode)
	case backends.EndLost:
		return fmt.Sprintf("lost (exit %d): %s", t.ExitCode, t.Reason)
	case backends.EndSkipped:
		return "skipped: already completed"
	case backends.EndNotStarted:
		return "not started: " + t.Reason
	case backends.EndStalled:
		return fmt.Sprintf("stalled (exit %d): %s", t.ExitCode, t.Reason)
	}
	return t.End
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}
