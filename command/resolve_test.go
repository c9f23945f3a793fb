package command

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestResolve: what can start resolves to its path; what cannot is
// ErrNotFound (exit 127) or ErrNotExecutable (exit 126), with the reason
// a shell would give, before anything is started.
func TestResolve(t *testing.T) {
	dir := t.TempDir()
	file := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	sh, err := filepath.EvalSymlinks("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	notExec := file("interp-0644", "#!/bin/sh\n", 0o644)
	for _, tc := range []struct {
		name, path string
		want       error  // nil: it resolves
		reason     string // in the message
	}{
		{"a binary", sh, nil, ""},
		{"a script", file("ok.sh", "#!/bin/sh\nexit 0\n", 0o755), nil, ""},
		{"a script through env", file("env.sh", "#!/usr/bin/env sh\nexit 0\n", 0o755), nil, ""},
		{"a missing file", filepath.Join(dir, "missing"), ErrNotFound, "no such file"},
		{"a directory", dir, ErrNotExecutable, "is a directory"},
		{"mode 0644", notExec, ErrNotExecutable, "permission denied"},
		{"a missing interpreter", file("bad-interp.sh", "#!/no/such/shell\n", 0o755), ErrNotFound, "interpreter /no/such/shell (its #! line): no such file"},
		{"an interpreter not executable", file("interp.sh", "#!"+notExec+"\n", 0o755), ErrNotExecutable, "permission denied"},
		{"no #! line", file("plain", "echo hi\n", 0o755), ErrNotExecutable, "exec format error"},
		{"an empty #! line", file("empty.sh", "#!\n", 0o755), ErrNotExecutable, "names no interpreter"},
		{"not in PATH", "leaderrun-no-such-command", ErrNotFound, "command not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Resolve(tc.path)
			switch {
			case tc.want == nil && err != nil:
				t.Fatalf("Resolve(%q): %v, want it to resolve", tc.path, err)
			case tc.want == nil && got == "":
				t.Fatalf("Resolve(%q) resolved to no path", tc.path)
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Fatalf("Resolve(%q): %v, want %v", tc.path, err, tc.want)
			case tc.want != nil && !strings.Contains(err.Error(), tc.reason):
				t.Fatalf("Resolve(%q): %q does not say %q", tc.path, err, tc.reason)
			}
		})
	}
}
