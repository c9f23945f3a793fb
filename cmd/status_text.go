package cmd

import (
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/leaderrun/leaderrun/backends"
)

// statusJSON is what status --json prints: the backend's status, and the
// lock's last term if the store keeps a history.
type statusJSON struct {
	backends.Status
	LastTerm *backends.Term `json:"last_term,omitempty"`
}

func printStatus(st *state, s backends.Status, last *backends.Term) {
	w := tabwriter.NewWriter(st.stdout, 0, 0, 2, ' ', 0)
	defer w.Flush()
	fmt.Fprintf(w, "lock:\t%s\n", escape(s.Lock))
	fmt.Fprintf(w, "backend:\t%s\n", s.Backend)
	fmt.Fprintf(w, "key:\t%s\n", escape(s.Key))
	if !s.Held {
		fmt.Fprintf(w, "leader:\tnone\n")
	} else {
		fmt.Fprintf(w, "leader:\t%s\n", escape(s.Identity))
		fmt.Fprintf(w, "token:\t%d\n", s.Token)
		if s.Holders > 1 {
			// A pool's slot (--holders): the holder's N, as it recorded
			// it. Nothing recorded means one holder.
			fmt.Fprintf(w, "holders:\t%d\n", s.Holders)
		}
		if s.TTL > 0 {
			fmt.Fprintf(w, "ttl:\t%v\n", s.TTL)
		}
		if s.Remaining >= 0 {
			fmt.Fprintf(w, "lease left:\t%v\n", s.Remaining.Round(time.Millisecond))
		}
		if s.Node != "" {
			fmt.Fprintf(w, "node:\t%s\n", escape(s.Node))
		}
	}
	if s.Waiting >= 0 {
		fmt.Fprintf(w, "waiting:\t%d\n", s.Waiting)
	}
	if last != nil {
		fmt.Fprintf(w, "last term:\ttoken %d, %s, %s, ended %s\n", last.Token, escape(last.Identity), escape(how(*last)), stamp(last.Ended))
	}
}

// escape makes a value read from the store safe to print on a terminal:
// control characters (escape sequences, carriage returns, newlines that
// would fake another line) and invalid UTF-8 are shown as Go escapes, and
// very long values are cut.
func escape(s string) string {
	const max = 256
	clean := true
	for _, r := range s {
		if r == unicode.ReplacementChar || unicode.IsControl(r) || !unicode.IsPrint(r) && r != ' ' {
			clean = false
			break
		}
	}
	if !clean {
		q := strconv.QuoteToGraphic(s)
		s = q[1 : len(q)-1]
	}
	if len(s) > max {
		s = strings.ToValidUTF8(s[:max], "") + "…"
	}
	return s
}
