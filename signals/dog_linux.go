package signals

import (
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// machineDog, where this platform has one, is watchdogScript as a tiny
// static executable (watchdog/watchdog_amd64.asm): its resident set is two
// pages, where a shell's is 1.7 MiB, paid by every leaderrun on a host.

var machine struct {
	once sync.Once
	path string
	err  error
}

// machineWatchdog returns a path that executes machineDog: a sealed,
// close-on-exec memfd, made once per process, named through /proc/self
// so that the forked child, which shares the descriptor until its exec,
// finds it. "" and an error if there is none or it cannot be made.
func machineWatchdog() (string, error) {
	if len(machineDog) == 0 {
		return "", errors.New("no built-in watchdog for this platform")
	}
	machine.once.Do(func() { machine.path, machine.err = memfdExecutable("leaderrun-watchdog", machineDog) })
	return machine.path, machine.err
}

// builtinDog reports whether cmd runs the built-in watchdog.
func builtinDog(cmd *exec.Cmd) bool {
	return machine.path != "" && cmd.Path == machine.path
}

// memfdExecutable writes data to a new memfd, seals it against any change,
// and returns /proc/self/fd/N for it. N is at least 10: the descriptors a
// child is started with (0-2, and 3 for the watchdog's socket) are dup2'd
// over low numbers before the exec, which must still find the memfd.
func memfdExecutable(name string, data []byte) (string, error) {
	flags := unix.MFD_CLOEXEC | unix.MFD_ALLOW_SEALING
	fd, err := unix.MemfdCreate(name, flags|unix.MFD_EXEC)
	if errors.Is(err, unix.EINVAL) {
		fd, err = unix.MemfdCreate(name, flags) // before Linux 6.3, which has no MFD_EXEC
	}
	if err != nil {
		return "", fmt.Errorf("memfd_create: %w", err)
	}
	high, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 10)
	unix.Close(fd)
	if err != nil {
		return "", fmt.Errorf("memfd: %w", err)
	}
	fail := func(what string, err error) (string, error) {
		unix.Close(high)
		return "", fmt.Errorf("memfd: %s: %w", what, err)
	}
	for rest := data; len(rest) > 0; {
		n, err := unix.Write(high, rest)
		if err != nil {
			return fail("write", err)
		}
		rest = rest[n:]
	}
	seals := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(uintptr(high), unix.F_ADD_SEALS, seals); err != nil {
		return fail("seal", err)
	}
	return "/proc/self/fd/" + strconv.Itoa(high), nil
}
