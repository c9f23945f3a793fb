package cmd

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/urfave/cli/v2"
)

// Stamped at release time with -ldflags "-X github.com/leaderrun/leaderrun/cmd.version=... -X ...commit=...".
var (
	version = ""
	commit  = ""
)

// Version is leaderrun's version: the stamped one, else the module version
// that go install recorded, else "dev".
func Version() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

func versionCommand(st *state) *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print leaderrun's version",
		Action: func(c *cli.Context) error {
			v := "leaderrun " + Version()
			if commit != "" {
				v += " (" + commit + ")"
			}
			fmt.Fprintf(st.stdout, "%s %s %s/%s\n", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
			return nil
		},
	}
}
