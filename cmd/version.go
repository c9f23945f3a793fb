package cmd

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/urfave/cli/v2"
)

// Stamped at release time with -ldflags "-X github.com/leaderrun/leaderrun/cmd.version=... -X ...commit=...".
var (
	version = ""
	commit  = ""
)

// Version is leaderrun's version: the stamped one, else the module version
// that go install recorded (go install ...@v1.2.3), else "devel".
func Version() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}

// revision is the commit leaderrun was built from: the stamped one, else
// the VCS revision that go build -buildvcs=true recorded from a clone
// (12 digits, "-dirty" if the tree had changes), else "".
func revision() string {
	if commit != "" {
		return commit
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	rev, dirty := "", ""
	for _, s := range bi.Settings {
		switch {
		case s.Key == "vcs.revision":
			rev = s.Value[:min(12, len(s.Value))]
		case s.Key == "vcs.modified" && s.Value == "true":
			dirty = "-dirty"
		}
	}
	if rev == "" {
		return ""
	}
	return rev + dirty
}

// versionLine is what version prints: leaderrun v1.2.3 (0123456789ab)
// go1.26.7 linux/amd64.
func versionLine() string {
	v := "leaderrun " + Version()
	if r := revision(); r != "" && !strings.Contains(v, strings.TrimSuffix(r, "-dirty")) {
		v += " (" + r + ")"
	}
	return fmt.Sprintf("%s %s %s/%s", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

func versionCommand(st *state) *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print leaderrun's version, the commit it was built from and the Go release",
		Action: func(c *cli.Context) error {
			fmt.Fprintln(st.stdout, versionLine())
			return nil
		},
	}
}
