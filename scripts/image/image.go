package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// image is one kos entry, built for this machine's platform into an OCI
// layout under dir.
type image struct {
	id, main, binary    string
	env, flags, ldflags []string
	base, platform, dir string
}

// build runs ko as goreleaser would for the entry: the build's env,
// flags and ldflags (in a .ko.yaml of its own), a bare image, written to
// an OCI layout instead of pushed.
func (m *image) build(ko string) error {
	if err := os.MkdirAll(m.dir, 0o755); err != nil {
		return err
	}
	cfg := map[string]any{
		"defaultBaseImage": m.base,
		"builds":           []map[string]any{{"id": m.id, "main": m.main, "env": m.env, "flags": m.flags, "ldflags": m.ldflags}},
	}
	data, err := json.Marshal(cfg) // JSON is YAML
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(m.dir, ".ko.yaml"), data, 0o644); err != nil {
		return err
	}
	cmd := exec.Command(ko, "build", "--bare", "--push=false", "--oci-layout-path", filepath.Join(m.dir, "layout"),
		"--platform", m.platform, m.main)
	cmd.Env = append(os.Environ(), "KO_CONFIG_PATH="+m.dir, "KO_DOCKER_REPO="+strings.Split(m.base, "/")[0]+"/"+m.id)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ko build %s: %w\n%s", m.main, err, out)
	}
	fmt.Printf("built the %s image (%s)\n", m.id, m.platform)
	return nil
}

type descriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
}

// check reads the image back from its layout: its entrypoint is the
// binary, its layers hold that one file and nothing else but directories,
// the file is a static executable, and it runs.
func (m *image) check() error {
	layout := filepath.Join(m.dir, "layout")
	var manifest struct {
		Config descriptor   `json:"config"`
		Layers []descriptor `json:"layers"`
	}
	if err := readManifest(layout, &manifest); err != nil {
		return err
	}
	var config struct {
		Config struct{ Entrypoint []string } `json:"config"`
	}
	if err := readJSON(layout, manifest.Config.Digest, &config); err != nil {
		return err
	}
	want := "/ko-app/" + m.binary
	if !slices.Equal(config.Config.Entrypoint, []string{want}) {
		return fmt.Errorf("%s image: entrypoint %q, want [%s]", m.id, config.Config.Entrypoint, want)
	}
	files := map[string][]byte{}
	for _, l := range manifest.Layers {
		if err := readLayer(layout, l.Digest, files); err != nil {
			return err
		}
	}
	if len(files) != 1 || files[strings.TrimPrefix(want, "/")] == nil {
		names := slices.Sorted(func(yield func(string) bool) {
			for n := range files {
				if !yield(n) {
					return
				}
			}
		})
		return fmt.Errorf("%s image: files %q, want only %s", m.id, names, want)
	}
	return m.runBinary(files[strings.TrimPrefix(want, "/")])
}

// runBinary checks that the binary from the layer is static, and runs its
// version command.
func (m *image) runBinary(data []byte) error {
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("%s image: /ko-app/%s is not an ELF binary: %w", m.id, m.binary, err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s image: /ko-app/%s is dynamically linked", m.id, m.binary)
		}
	}
	path := filepath.Join(m.dir, m.binary)
	if err := os.WriteFile(path, data, 0o755); err != nil {
		return err
	}
	out, err := exec.Command(path, "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "leaderrun snapshot (") {
		return fmt.Errorf("%s image: /ko-app/%s version: %v: %q, want the stamped version", m.id, m.binary, err, out)
	}
	fmt.Printf("%s image: only /ko-app/%s, static; it says: %s", m.id, m.binary, out)
	return nil
}

// readManifest reads the one image manifest of the layout (following an
// index, as ko writes one).
func readManifest(layout string, v any) error {
	var index struct{ Manifests []descriptor }
	data, err := os.ReadFile(filepath.Join(layout, "index.json"))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, &index); err != nil {
		return err
	}
	for len(index.Manifests) == 1 && strings.HasSuffix(index.Manifests[0].MediaType, "index.v1+json") {
		d := index.Manifests[0].Digest
		index.Manifests = nil
		if err := readJSON(layout, d, &index); err != nil {
			return err
		}
	}
	if len(index.Manifests) != 1 {
		return fmt.Errorf("%s: %d images, want 1", layout, len(index.Manifests))
	}
	return readJSON(layout, index.Manifests[0].Digest, v)
}

func blobPath(layout, digest string) string {
	algo, hex, _ := strings.Cut(digest, ":")
	return filepath.Join(layout, "blobs", algo, hex)
}

func readJSON(layout, digest string, v any) error {
	data, err := os.ReadFile(blobPath(layout, digest))
	if err != nil {
		return err
	}
	return json.Unmarshal(data, v)
}

// readLayer adds the regular files of a gzipped layer to files, by path
// without the leading "/"; anything but a directory or a regular file is
// an error.
func readLayer(layout, digest string, files map[string][]byte) error {
	f, err := os.Open(blobPath(layout, digest))
	if err != nil {
		return err
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		return err
	}
	tr := tar.NewReader(z)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := strings.TrimPrefix(strings.TrimPrefix(h.Name, "./"), "/")
		switch h.Typeflag {
		case tar.TypeDir:
		case tar.TypeReg:
			if files[name], err = io.ReadAll(tr); err != nil {
				return err
			}
		default:
			return fmt.Errorf("layer %s: %s is neither a file nor a directory (type %c)", digest, h.Name, h.Typeflag)
		}
	}
}
