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

// readFlags are the flags of the commands that read the store (status,
// history), before the store flags.
func readFlags(jsonUsage string, more ...cli.Flag) []cli.Flag {
	flags := append([]cli.Flag{
		&cli.BoolFlag{Name: "json", Usage: jsonUsage},
		&cli.DurationFlag{Name: "timeout", Value: 5 * time.Second, Usage: "give up on the store after `D`"},
	}, more...)
	return append(flags, storeFlags()...)
}

// withStore opens the chosen store for a command that reads it, and runs
// read with a context bounded by --timeout. A store that does not answer in
// time is unreachable (exit 69), whatever the backend said.
func withStore(c *cli.Context, what string, read func(context.Context, backends.Store) error) error {
	if _, err := newLogger(c, os.Stderr); err != nil {
		return err
	}
	s, _, err := openStore(c)
	if err != nil {
		return err
	}
	defer s.Close()
	timeout := c.Duration("timeout")
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err = read(ctx, s)
	if errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, backends.ErrUnavailable) {
		err = fmt.Errorf("no answer from %s within --timeout %v: %w: %w", s.Name(), timeout, backends.ErrUnavailable, err)
	}
	if err != nil && !errors.Is(err, errNoLeader) {
		return fmt.Errorf("%s of %q: %w", what, c.String("lock"), err)
	}
	return err
}

func statusCommand(st *state) *cli.Command {
	flags := readFlags("print the status as one JSON object", holdersFlag("the lock's pool size `N` (--holders of run): list the holder of every slot"))
	return &cli.Command{
		Name:      "status",
		Usage:     "show who holds the lock (exit 0 with a leader, 3 with none)",
		UsageText: "leaderrun status --lock NAME [--holders N] [--json] [store flags]",
		Flags:     flags,
		OnUsageError: func(c *cli.Context, err error, sub bool) error {
			st.command = "status "
			return onUsageError(c, err, sub)
		},
		Action: func(c *cli.Context) error {
			st.command = "status "
			return withStore(c, "status", func(ctx context.Context, s backends.Store) error {
				return status(ctx, c, st, s)
			})
		},
	}
}

// status prints who holds the lock; errNoLeader if nobody does.
func status(ctx context.Context, c *cli.Context, st *state, store backends.Store) error {
	lock := c.String("lock")
	if n, err := holdersOf(c); err != nil || n > 1 {
		if err != nil {
			return err
		}
		return poolStatus(ctx, c, st, store, n)
	}
	s, err := backends.ReadStatus(ctx, store, lock)
	if err != nil {
		return err
	}
	if !c.IsSet("holders") && s.Held && s.Holders > 1 {
		// The lock's holder campaigns in a pool: show every slot, as
		// --holders would.
		return poolStatus(ctx, c, st, store, min(s.Holders, backends.MaxHolders))
	}
	// The last term is a courtesy: a store that cannot read its history
	// still gives its status.
	var last *backends.Term
	if terms, err := backends.ReadHistory(ctx, store, lock, 1); err == nil && len(terms) == 1 {
		last = &terms[0]
	}
	if c.Bool("json") {
		if err := json.NewEncoder(st.stdout).Encode(statusJSON{Status: s, LastTerm: last}); err != nil {
			return err
		}
	} else {
		printStatus(st, s, last)
	}
	if !s.Held {
		return errNoLeader
	}
	return nil
}
