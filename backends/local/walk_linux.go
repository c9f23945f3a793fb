package local

import "golang.org/x/sys/unix"

// walkFlag opens the directories of a walk (openDir) without needing
// permission to read them, as a path lookup needs none.
const walkFlag = unix.O_PATH
