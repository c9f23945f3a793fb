package cmd

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/leaderrun/leaderrun/backends"
)

func printStatus(st *state, s backends.Status) {
	w := tabwriter.NewWriter(st.stdout, 0, 0, 2, ' ', 0)
	defer w.Flush()
	fmt.Fprintf(w, "lock:\t%s\n", s.Lock)
	fmt.Fprintf(w, "backend:\t%s\n", s.Backend)
	fmt.Fprintf(w, "key:\t%s\n", s.Key)
	if !s.Held {
		fmt.Fprintf(w, "leader:\tnone\n")
	} else {
		fmt.Fprintf(w, "leader:\t%s\n", s.Identity)
		fmt.Fprintf(w, "token:\t%d\n", s.Token)
		if s.TTL > 0 {
			fmt.Fprintf(w, "ttl:\t%v\n", s.TTL)
		}
		if s.Remaining >= 0 {
			fmt.Fprintf(w, "lease left:\t%v\n", s.Remaining.Round(time.Millisecond))
		}
		if s.Node != "" {
			fmt.Fprintf(w, "node:\t%s\n", s.Node)
		}
	}
	if s.Waiting >= 0 {
		fmt.Fprintf(w, "waiting:\t%d\n", s.Waiting)
	}
}
