package control

import (
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// allowed reports whether the peer of c runs as this process's user or as
// root (SO_PEERCRED, which the kernel fills in at connect). The socket's
// directory already keeps other users out; this holds should its mode
// ever be changed.
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
