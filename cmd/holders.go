package cmd

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/leaderrun/leaderrun/backends"
)

// holdersFlag is --holders, for run (the pool to campaign in) and for
// status and history (the pool to show), read from the same variable so
// that one environment serves all three.
func holdersFlag(usage string) cli.Flag {
	return &cli.IntFlag{Name: "holders", Category: categoryLock, EnvVars: []string{"LEADERRUN_HOLDERS"}, Value: 1, Usage: usage}
}

// holdersOf reads --holders: 1 to backends.MaxHolders.
func holdersOf(c *cli.Context) (int, error) {
	n := c.Int("holders")
	if n < 1 || n > backends.MaxHolders {
		return 0, usageErrorf("--holders %d: want 1-%d", n, backends.MaxHolders)
	}
	return n, nil
}

// readPool reads --holders and --once-per-slot; onceKey is the run's
// once-key, which --once-per-slot needs.
func readPool(c *cli.Context, onceKey string) (int, bool, error) {
	n, err := holdersOf(c)
	if err != nil {
		return 0, false, err
	}
	perSlot := c.Bool("once-per-slot")
	if perSlot && onceKey == "" {
		return 0, false, usageErrorf("--once-per-slot needs --once-per or --once-key")
	}
	return n, perSlot, nil
}

// slotStatus is one slot of a pool, as status --json prints it.
type slotStatus struct {
	Slot int `json:"slot"`
	backends.Status
}

// poolJSON is what status --json prints for a pool (--holders N > 1).
type poolJSON struct {
	Lock    string       `json:"lock"`
	Backend string       `json:"backend"`
	Holders int          `json:"holders"`
	Held    int          `json:"held"`
	Slots   []slotStatus `json:"slots"`
}

// poolStatus prints the holder of every slot of a pool of n;
// errNoLeader if no slot is held.
func poolStatus(ctx context.Context, c *cli.Context, st *state, store backends.Store, n int) error {
	p := poolJSON{Lock: c.String("lock"), Backend: store.Name(), Holders: n}
	for i := range n {
		s, err := backends.ReadStatus(ctx, store, backends.SlotLock(p.Lock, i))
		if err != nil {
			return fmt.Errorf("slot %d: %w", i, err)
		}
		if s.Held {
			p.Held++
		}
		p.Slots = append(p.Slots, slotStatus{Slot: i, Status: s})
	}
	if c.Bool("json") {
		if err := json.NewEncoder(st.stdout).Encode(p); err != nil {
			return err
		}
	} else {
		printPool(st, p)
	}
	if p.Held == 0 {
		return errNoLeader
	}
	return nil
}

func printPool(st *state, p poolJSON) {
	w := tabwriter.NewWriter(st.stdout, 0, 0, 2, ' ', 0)
	defer w.Flush()
	fmt.Fprintf(w, "lock:\t%s\n", escape(p.Lock))
	fmt.Fprintf(w, "backend:\t%s\n", p.Backend)
	fmt.Fprintf(w, "holders:\t%d of %d slots held\n", p.Held, p.Holders)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "SLOT\tHOLDER\tTOKEN\tHOLDERS\tLEASE LEFT\tWAITING\tKEY")
	for _, s := range p.Slots {
		holder, token, holders, left, waiting := "none", "-", "-", "-", "-"
		if s.Held {
			holder, token, holders = escape(s.Identity), fmt.Sprint(s.Token), fmt.Sprint(max(s.Holders, 1))
			if s.Remaining >= 0 {
				left = s.Remaining.Round(time.Millisecond).String()
			}
		}
		if s.Waiting >= 0 {
			waiting = fmt.Sprint(s.Waiting)
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Slot, holder, token, holders, left, waiting, escape(s.Key))
	}
}

// slotTerm is one term of a slot of a pool, as history --json prints it.
type slotTerm struct {
	Slot int `json:"slot"`
	backends.Term
}

// poolHistory prints the newest limit terms of all n slots of a pool,
// newest first by when they ended, each with its slot.
func poolHistory(ctx context.Context, c *cli.Context, st *state, store backends.Store, n, limit int) error {
	var all []slotTerm
	for i := range n {
		terms, err := backends.ReadHistory(ctx, store, backends.SlotLock(c.String("lock"), i), limit)
		if err != nil {
			return fmt.Errorf("slot %d: %w", i, err)
		}
		for _, t := range terms {
			all = append(all, slotTerm{Slot: i, Term: t})
		}
	}
	slices.SortStableFunc(all, func(a, b slotTerm) int {
		return cmp.Or(b.Ended.Compare(a.Ended), cmp.Compare(a.Slot, b.Slot))
	})
	all = all[:min(len(all), limit)]
	if c.Bool("json") {
		enc := json.NewEncoder(st.stdout)
		for _, t := range all {
			if err := enc.Encode(t); err != nil {
				return err
			}
		}
		return nil
	}
	printPoolHistory(st, all)
	return nil
}

// printPoolHistory is printHistory with a slot column.
func printPoolHistory(st *state, terms []slotTerm) {
	if len(terms) == 0 {
		return
	}
	w := tabwriter.NewWriter(st.stdout, 0, 0, 2, ' ', 0)
	defer w.Flush()
	fmt.Fprintln(w, "SLOT\tTOKEN\tIDENTITY\tACQUIRED\tRAN\tENDED\tHOW\tONCE-KEY")
	for _, t := range terms {
		fmt.Fprintf(w, "%d\t%s\n", t.Slot, termRow(t.Term))
	}
}
