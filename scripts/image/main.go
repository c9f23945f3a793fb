// Command image builds leaderrun's release images as .goreleaser.yaml's
// kos section describes them, with ko and without a Docker daemon, and
// checks them: each image holds its one static binary at /ko-app/NAME,
// its entrypoint, and `NAME version` run from the image's own layer
// prints the stamped version. The base is an empty image served by this
// program on the loopback (the release's base is goreleaser's default, a
// static base without a shell; no registry is reached), so what the check
// sees in the layers is what leaderrun's release adds. Run by
// scripts/image.sh, which installs ko into the cache.
//
//	go run ./scripts/image -ko PATH
package main

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"go.yaml.in/yaml/v3"
)

// release is what the check reads of .goreleaser.yaml.
type release struct {
	Builds []struct {
		ID      string   `yaml:"id"`
		Main    string   `yaml:"main"`
		Binary  string   `yaml:"binary"`
		Env     []string `yaml:"env"`
		Flags   []string `yaml:"flags"`
		Ldflags []string `yaml:"ldflags"`
	} `yaml:"builds"`
	Kos []struct {
		ID        string   `yaml:"id"`
		Build     string   `yaml:"build"`
		Main      string   `yaml:"main"`
		Platforms []string `yaml:"platforms"`
		Bare      bool     `yaml:"bare"`
	} `yaml:"kos"`
}

func main() {
	ko := flag.String("ko", "ko", "the ko binary")
	flag.Parse()
	if err := run(*ko); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(ko string) error {
	data, err := os.ReadFile(".goreleaser.yaml")
	if err != nil {
		return err
	}
	var rel release
	if err := yaml.Unmarshal(data, &rel); err != nil {
		return fmt.Errorf(".goreleaser.yaml: %w", err)
	}
	if len(rel.Kos) == 0 {
		return fmt.Errorf(".goreleaser.yaml has no kos section")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	base := newBase()
	go func() { _ = http.Serve(ln, base) }()
	work, err := os.MkdirTemp("", "leaderrun-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	commit, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return fmt.Errorf("git rev-parse: %w", err)
	}
	stamp := strings.NewReplacer("{{.Version}}", "snapshot", "{{.ShortCommit}}", strings.TrimSpace(string(commit)))
	seen := map[string]bool{}
	for _, k := range rel.Kos {
		b, ok := buildOf(rel, k.Build)
		if !ok {
			return fmt.Errorf("kos %s: no build %q", k.ID, k.Build)
		}
		platform := "linux/" + runtime.GOARCH
		if !contains(k.Platforms, platform) {
			return fmt.Errorf("kos %s: platforms %v lack %s", k.ID, k.Platforms, platform)
		}
		ldflags := make([]string, len(b.Ldflags))
		for i, l := range b.Ldflags {
			ldflags[i] = stamp.Replace(l)
		}
		img := image{id: k.ID, main: k.Main, binary: b.Binary, env: b.Env, flags: b.Flags, ldflags: ldflags,
			base: ln.Addr().String() + "/base:empty", platform: platform, dir: filepath.Join(work, k.ID)}
		if err := img.build(ko); err != nil {
			return err
		}
		if err := img.check(); err != nil {
			return err
		}
		seen[b.Binary] = true
	}
	for _, want := range []string{"leaderrun", "leaderrun-aws"} {
		if !seen[want] {
			return fmt.Errorf("no image holds %s", want)
		}
	}
	return nil
}

type build = struct {
	ID      string   `yaml:"id"`
	Main    string   `yaml:"main"`
	Binary  string   `yaml:"binary"`
	Env     []string `yaml:"env"`
	Flags   []string `yaml:"flags"`
	Ldflags []string `yaml:"ldflags"`
}

func buildOf(rel release, id string) (build, bool) {
	for _, b := range rel.Builds {
		if b.ID == id {
			return b, true
		}
	}
	return build{}, false
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
