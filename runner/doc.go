// Package runner owns the leadership loop: campaign, start the child with its
// fencing token, renew the lease and watch for its loss, stop the child, and
// release the lease only once the child is gone.
//
// New validates a Config and readies the command's watchdog; Run
// campaigns and runs the command while leading.
//
// The runner owns time; backends only speak to their store. The promises it
// keeps are S1-S10 of docs/safety.md, which also argues why they hold. It
// measures the renew deadline on the monotonic clock from the send time of
// the last renewal the store acknowledged (S2), so that the child is
// stopped before the store can let another candidate take over.
//
// What the runner cannot guarantee: a process that is paused (GC, SIGSTOP,
// VM freeze) cannot act during the pause. It signals the child the moment it
// resumes (S7), but the child may have resumed too and may issue a write in
// between. Resources must check $FENCE_TOKEN to be safe against that.
package runner
