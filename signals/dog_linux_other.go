//go:build linux && !amd64

package signals

// machineDog: none for this architecture; the shell serves.
var machineDog []byte
