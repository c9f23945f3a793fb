//go:build !linux

package local

import "golang.org/x/sys/unix"

// walkFlag opens the directories of a walk (openDir): without O_PATH,
// every directory on the way must be readable.
const walkFlag = unix.O_RDONLY
