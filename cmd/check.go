package cmd

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/leaderrun/leaderrun/observers/control"
)

func checkCommand(st *state) *cli.Command {
	return &cli.Command{
		Name:  "check",
		Usage: "inside the command: exit 0 while leadership is held, 1 otherwise",
		UsageText: "leaderrun check [--progress] [--min-remaining D] [-v]\n\n" +
			"Call it before each side effect of a shell job: it asks the leaderrun that\n" +
			"started the job, through $LEADERRUN_SOCKET, and fails once leadership is\n" +
			"lost, or when less than D is left before leaderrun would stop the job.\n" +
			"With --progress it first reports progress, for leaderrun's --progress-timeout.",
		Flags: []cli.Flag{
			&cli.DurationFlag{Name: "min-remaining", Usage: "also fail when less than `D` is left before the renew deadline"},
			&cli.BoolFlag{Name: "verbose", Aliases: []string{"v"}, Usage: "print the token and the time left"},
			&cli.BoolFlag{Name: "progress", Usage: "report progress to leaderrun first (see run's --progress-timeout), then check as usual"},
		},
		OnUsageError: func(c *cli.Context, err error, sub bool) error {
			st.command = "check "
			return onUsageError(c, err, sub)
		},
		Action: func(c *cli.Context) error {
			if c.Duration("min-remaining") < 0 {
				return usageErrorf("--min-remaining %v: must not be negative", c.Duration("min-remaining"))
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			req := control.RequestCheck
			if c.Bool("progress") {
				req = control.RequestProgress
			}
			a, err := control.Ask(ctx, os.Getenv("LEADERRUN_SOCKET"), req)
			if err != nil {
				// No answer is no leadership.
				fmt.Fprintf(st.stderr, "leaderrun: %s\n", plainMessage(err))
				return errNotLeader
			}
			minimum := c.Duration("min-remaining")
			if c.Bool("verbose") {
				fmt.Fprintf(st.stdout, "leader=%t token=%d remaining=%v\n", a.Leader, a.Token, a.Remaining.Round(time.Millisecond))
			}
			switch {
			case !a.Leader:
				return errNotLeader
			case a.Remaining < minimum:
				// Leading, and yet a failure: say why, or -v's
				// "leader=true" and exit 1 contradict each other.
				if c.Bool("verbose") {
					fmt.Fprintf(st.stderr, "leaderrun check: %v left before the renew deadline, less than --min-remaining %v\n",
						a.Remaining.Round(time.Millisecond), minimum)
				}
				return errNotLeader
			}
			return nil
		},
	}
}
