package signals

import _ "embed"

// machineDog is watchdog/watchdog_amd64.asm, assembled by watchdog/build.sh.
//
//go:embed watchdog_linux_amd64.bin
var machineDog []byte
