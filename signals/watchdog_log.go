package signals

import (
	"log/slog"
	"os"
	"strconv"
	"strings"
)

// The watchdog's log, which follows leaderrun's.

// logger is the watchdog's log: the format and level of leaderrun's, and
// the lock, identity, backend, token and pid of the command once known.
func (d *dog) logger() *slog.Logger {
	if d.log != nil {
		return d.log
	}
	opts := &slog.HandlerOptions{Level: d.level}
	var h slog.Handler = slog.NewTextHandler(os.Stderr, opts)
	if d.format == "json" {
		h = slog.NewJSONHandler(os.Stderr, opts)
	}
	d.log = slog.New(h).With("watchdog", os.Getpid())
	return d.log
}

// logAttrs are the log attributes that leaderrun's own lines carry,
// taken from the command's environment (see runner.childEnv).
func logAttrs(env []string) []any {
	var attrs []any
	for _, kv := range env {
		name, value, _ := strings.Cut(kv, "=")
		switch name {
		case "LEADERRUN_LOCK":
			attrs = append(attrs, "lock", value)
		case "LEADERRUN_IDENTITY":
			attrs = append(attrs, "identity", value)
		case "LEADERRUN_BACKEND":
			attrs = append(attrs, "backend", value)
		case "FENCE_TOKEN":
			if t, err := strconv.ParseUint(value, 10, 64); err == nil {
				attrs = append(attrs, "token", t)
			}
		}
	}
	return attrs
}
