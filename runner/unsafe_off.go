//go:build !leaderrun_unsafe_late_kill

package runner

// unsafeLateKill is false in every real build. See unsafe_on.go.
const unsafeLateKill = false
