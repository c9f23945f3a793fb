package testenv

import (
	"os"
	"syscall"
	"testing"
)

// WriteExecutable writes data to path as an executable with the given mode,
// so that it can be run at once. A file that is open for writing cannot be
// executed (ETXTBSY), and a child forked by another test while the file is
// open holds a copy of that descriptor until its own exec closes it. So
// the file is opened, written and closed under syscall.ForkLock's read
// lock, which every fork in this process waits for.
func WriteExecutable(t testing.TB, path string, data []byte, mode os.FileMode) {
	t.Helper()
	syscall.ForkLock.RLock()
	err := os.WriteFile(path, data, mode)
	syscall.ForkLock.RUnlock()
	if err != nil {
		t.Fatal(err)
	}
}

// CopyExecutable installs the executable from at to, as WriteExecutable
// writes one.
func CopyExecutable(t testing.TB, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	WriteExecutable(t, to, data, 0o755)
}
