//go:build leaderrun_unsafe_late_kill

package runner

// unsafeLateKill deliberately breaks S2 and S3: with the build tag
// leaderrun_unsafe_late_kill the runner stops the child only long after the
// lease has expired in the store. It exists for one reason: the fault suite
// (faults/) must show that it catches a leaderrun that is unsafe. Never
// ship a binary built with this tag.
const unsafeLateKill = true
