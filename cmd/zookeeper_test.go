package cmd

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// TestZooKeeperFlags: the ZooKeeper flags as a user meets them, through
// status and history. Bad input
// is exit 64 naming the flag, before anything is contacted; an auth file
// that others may read is refused like an ssh key; no message ever shows
// the password. Accepted input reaches the store: a port where nothing
// listens is exit 69 naming it.
func TestZooKeeperFlags(t *testing.T) {
	for _, v := range []string{"LEADERRUN_ZK_SERVERS", "LEADERRUN_ZK_AUTH_FILE", "LEADERRUN_ETCD_ENDPOINTS", "ETCDCTL_ENDPOINTS",
		"LEADERRUN_CONSUL_ADDR", "CONSUL_HTTP_ADDR", "LEADERRUN_BACKEND"} {
		t.Setenv(v, "")
	}
	const password = "s3cret-Pa55"
	dir := t.TempDir()
	authFile := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := authFile("good", "leaderrun:"+password+"\n", 0o600)
	open := authFile("open", "leaderrun:"+password+"\n", 0o644)
	groupRW := authFile("group", "leaderrun:"+password+"\n", 0o660)
	noColon := authFile("nocolon", password+"\n", 0o600)
	twoLines := authFile("twolines", "leaderrun:"+password+"\nleaderrun:"+password+"\n", 0o400)
	nowhere := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t, "127.0.0.1"))
	fast := []string{"--zk-connect-timeout", "300ms"}

	for _, tc := range []struct {
		name string
		args []string
		env  []string // NAME=value
		code int
		want []string // in stderr
	}{
		{"no server", []string{"--backend", "zookeeper", "--zk-servers", " , "}, nil, 64, []string{"--zk-servers"}},
		{"backend without servers", []string{"--backend", "zookeeper"}, nil, 64, []string{"--zk-servers"}},
		{"chroot", []string{"--zk-servers", "zk1:2181,zk2:2181/apps"}, nil, 64, []string{"--zk-servers", "chroot", "--prefix"}},
		{"bad port", []string{"--zk-servers", "zk1:x:y"}, nil, 64, []string{"--zk-servers", "zk1:x:y"}},
		{"user information", []string{"--zk-servers", "leaderrun:" + password + "@zk1:2181"}, nil, 64, []string{"--zk-servers", "user information", "zk1:2181"}},
		{"connect timeout 0", []string{"--zk-servers", nowhere, "--zk-connect-timeout", "0s"}, nil, 64, []string{"--zk-connect-timeout"}},
		{"auth file missing", append([]string{"--zk-servers", nowhere, "--zk-auth-file", filepath.Join(dir, "none")}, fast...), nil, 64,
			[]string{"--zk-auth-file", filepath.Join(dir, "none")}},
		{"auth file readable by others", append([]string{"--zk-servers", nowhere, "--zk-auth-file", open}, fast...), nil, 64,
			[]string{"--zk-auth-file " + open, "0644", "chmod 600"}},
		{"auth file writable by group", append([]string{"--zk-servers", nowhere, "--zk-auth-file", groupRW}, fast...), nil, 64,
			[]string{"--zk-auth-file " + groupRW, "0660"}},
		{"auth file without a colon", append([]string{"--zk-servers", nowhere, "--zk-auth-file", noColon}, fast...), nil, 64,
			[]string{"--zk-auth-file " + noColon, "user:password"}},
		{"auth file of two lines", append([]string{"--zk-servers", nowhere, "--zk-auth-file", twoLines}, fast...), nil, 64,
			[]string{"--zk-auth-file " + twoLines, "one line"}},
		{"auth file is a directory", append([]string{"--zk-servers", nowhere, "--zk-auth-file", dir}, fast...), nil, 64,
			[]string{"--zk-auth-file " + dir, "regular file"}},
		{"good auth file reaches the store", append([]string{"--zk-servers", nowhere, "--zk-auth-file", good}, fast...), nil, 69,
			[]string{nowhere}},
		{"servers from the environment", fast, []string{"LEADERRUN_ZK_SERVERS=" + nowhere, "LEADERRUN_ZK_AUTH_FILE=" + good}, 69,
			[]string{nowhere}},
		{"the environment's auth file is checked too", fast, []string{"LEADERRUN_ZK_SERVERS=" + nowhere, "LEADERRUN_ZK_AUTH_FILE=" + open}, 64,
			[]string{"--zk-auth-file " + open}},
		{"two stores", []string{"--zk-servers", nowhere, "--etcd-endpoints", "http://127.0.0.1:2379"}, nil, 64,
			[]string{"several stores", "zookeeper", "etcd"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, e := range tc.env {
				name, value, _ := strings.Cut(e, "=")
				t.Setenv(name, value)
			}
			// status and history build the backend as run does (run
			// itself, which signals and forks, is for e2e to test).
			for _, command := range []string{"status", "history"} {
				args := append([]string{"leaderrun", command, "--lock", "zk-flags"}, tc.args...)
				var stdout, stderr bytes.Buffer
				code := run(args, &stdout, &stderr)
				out := stderr.String()
				if code != tc.code {
					t.Errorf("%s: exit %d, want %d; stderr:\n%s", command, code, tc.code, out)
				}
				for _, w := range tc.want {
					if !strings.Contains(out, w) {
						t.Errorf("%s: stderr does not say %q:\n%s", command, w, out)
					}
				}
				if strings.Contains(out+stdout.String(), password) {
					t.Errorf("%s: the output shows the password:\n%s", command, out)
				}
			}
		})
	}
}

// TestZooKeeperHelp: the ZooKeeper flags are listed under the Store
// category of run's help, with the lease-duration advice.
func TestZooKeeperHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"leaderrun", "run", "--help"}, &stdout, &stderr); code != 0 {
		t.Fatalf("run --help: exit %d: %s", code, stderr.String())
	}
	help := stdout.String()
	store := help[strings.Index(help, "Store"):]
	for _, w := range []string{"--zk-servers HOSTS", "LEADERRUN_ZK_SERVERS", "--zk-auth-file FILE", "--zk-connect-timeout D", "tickTime/2", "zookeeper"} {
		if !strings.Contains(store, w) {
			t.Errorf("the Store section of run --help does not mention %q:\n%s", w, store)
		}
	}
}

// TestParseZKDigest: an auth file's one line, user:password.
func TestParseZKDigest(t *testing.T) {
	for _, tc := range []struct {
		name, in     string
		user, passwd string
		ok           bool
	}{
		{"plain", "leaderrun:s3cret", "leaderrun", "s3cret", true},
		{"final newline", "leaderrun:s3cret\n", "leaderrun", "s3cret", true},
		{"final CRLF", "leaderrun:s3cret\r\n", "leaderrun", "s3cret", true},
		{"colon in the password", "leaderrun:a:b", "leaderrun", "a:b", true},
		{"empty password", "leaderrun:", "leaderrun", "", true},
		{"no colon", "leaderrun", "", "", false},
		{"no user", ":s3cret", "", "", false},
		{"two lines", "leaderrun:s3cret\nother:s3cret\n", "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, ok := parseZKDigest(tc.in)
			if ok != tc.ok || d.User != tc.user || d.Password != tc.passwd {
				t.Fatalf("parseZKDigest(%q) = %#v, %v", tc.in, d, ok)
			}
		})
	}
}
