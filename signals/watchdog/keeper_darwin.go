//go:build darwin

package watchdog

// No keeper here: nothing but the command's process group is guarded
// (docs/safety.md, "Which guarantee where").
type keeper struct{ pid int }

func (k *keeper) is(pid int) bool                        { return k.pid != 0 && pid == k.pid }
func (k *keeper) start(*cgroupTree, int, []int, *logger) {}
func (k *keeper) dismiss()                               {}
