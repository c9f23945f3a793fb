package runner

import (
	"slices"
	"strconv"
	"strings"
)

// Variables leaderrun sets for the child; inherited values are replaced.
// NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID are leaderrun's own
// (systemd) and must not reach the child, or the child could report
// readiness or liveness for it.
var ownVars = []string{"FENCE_TOKEN", "LEADERRUN_LOCK", "LEADERRUN_IDENTITY", "LEADERRUN_BACKEND", "LEADERRUN_SOCKET",
	"LEADERRUN_SLOT", "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"}

// childEnv is the command's environment: base without leaderrun's own
// variables and the store's credentials (cfg.Unset), then leaderrun's,
// for the holder of slot with token.
func childEnv(base []string, cfg Config, token uint64, slot int) []string {
	env := make([]string, 0, len(base)+6)
	for _, kv := range base {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(ownVars, name) && !slices.Contains(cfg.Unset, name) {
			env = append(env, kv)
		}
	}
	env = append(env,
		"FENCE_TOKEN="+strconv.FormatUint(token, 10),
		"LEADERRUN_LOCK="+cfg.Lock,
		"LEADERRUN_IDENTITY="+cfg.Identity,
		"LEADERRUN_BACKEND="+cfg.Store.Name(),
		"LEADERRUN_SLOT="+strconv.Itoa(slot),
	)
	if cfg.Socket != "" {
		env = append(env, "LEADERRUN_SOCKET="+cfg.Socket)
	}
	return env
}
