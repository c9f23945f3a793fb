//go:build !linux

package control

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
)

// listen creates the socket under a new 0700 directory in dir (os.TempDir
// if empty), so that only this user can reach it.
func listen(dir string) (net.Listener, string, string, error) {
	d, err := os.MkdirTemp(dir, "leaderrun-")
	if err != nil {
		return nil, "", "", fmt.Errorf("create control socket directory: %w", err)
	}
	path := filepath.Join(d, "check.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		os.RemoveAll(d)
		return nil, "", "", fmt.Errorf("listen on %s: %w", path, err)
	}
	return ln, path, d, nil
}

// allowed: the directory's mode already keeps other users out.
func allowed(net.Conn) bool { return true }
