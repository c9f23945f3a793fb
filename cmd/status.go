package cmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/leaderrun/leaderrun/backends"
)

func statusCommand(st *state) *cli.Command {
	flags := append([]cli.Flag{
		&cli.BoolFlag{Name: "json", Usage: "print the status as one JSON object"},
		&cli.DurationFlag{Name: "timeout", Value: 5 * time.Second, Usage: "give up on the store after `D`"},
	}, storeFlags()...)
	return &cli.Command{
		Name:         "status",
		Usage:        "show who holds the lock (exit 0 with a leader, 3 with none)",
		UsageText:    "leaderrun status --lock NAME [--json] [store flags]",
		Flags:        flags,
		OnUsageError: onUsageError,
		Action: func(c *cli.Context) error {
			st.command = "status "
			if _, err := newLogger(c, os.Stderr); err != nil {
				return err
			}
			backend, _, err := openBackend(c)
			if err != nil {
				return err
			}
			defer backend.Close()
			ctx, cancel := context.WithTimeout(context.Background(), c.Duration("timeout"))
			defer cancel()
			s, err := backend.Status(ctx)
			if err != nil {
				return fmt.Errorf("status of %q: %w", c.String("lock"), noAnswer(err, backend, c.Duration("timeout")))
			}
			// The last term is a courtesy: a store that cannot read its
			// history still gives its status.
			var last *backends.Term
			if terms, err := backend.History(ctx, 1); err == nil && len(terms) == 1 {
				last = &terms[0]
			}
			if c.Bool("json") {
				enc := json.NewEncoder(st.stdout)
				if err := enc.Encode(statusJSON{Status: s, LastTerm: last}); err != nil {
					return err
				}
			} else {
				printStatus(st, s, last)
			}
			if !s.Held {
				return errNoLeader
			}
			return nil
		},
	}
}

// noAnswer makes a store that did not answer within --timeout a store that
// cannot be reached (exit 69), whatever the backend said.
func noAnswer(err error, b backends.Backend, timeout time.Duration) error {
	if errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, backends.ErrUnavailable) {
		return fmt.Errorf("no answer from %s within --timeout %v: %w: %w", b.Name(), timeout, backends.ErrUnavailable, err)
	}
	return err
}
