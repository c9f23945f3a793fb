package control

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// listen opens an abstract socket ("@leaderrun-<pid>-<random>"): it has no
// file, so a leaderrun killed with SIGKILL leaves nothing behind, and no
// other user can plant one in its way. Anyone in the network namespace
// may connect; allowed answers only this user and root.
func listen(string) (net.Listener, string, string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, "", "", fmt.Errorf("control socket name: %w", err)
	}
	path := fmt.Sprintf("@leaderrun-%d-%s", os.Getpid(), hex.EncodeToString(b[:]))
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, "", "", fmt.Errorf("listen on %s: %w", path, err)
	}
	return ln, path, "", nil
}

// allowed reports whether the peer of c runs as this process's user or as
// root (SO_PEERCRED, which the kernel fills in at connect).
func allowed(c net.Conn) bool {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return false
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return false
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil || cerr != nil {
		return false
	}
	return cred.Uid == 0 || int(cred.Uid) == os.Geteuid()
}
