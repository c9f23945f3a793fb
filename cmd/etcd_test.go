package cmd

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// TestEtcdFlags: the etcd flags as a user meets them, through status and
// history. Bad input is exit 64 naming the flag, before anything is
// contacted; endpoints that disagree on TLS are refused (etcd's client
// would speak to all of them as to the first); accepted input reaches the
// store: an endpoint where nothing listens is exit 69 naming it, within
// the dial timeout, which etcdctl's variable sets too. No message shows
// a password.
func TestEtcdFlags(t *testing.T) {
	for _, v := range []string{"LEADERRUN_ETCD_ENDPOINTS", "ETCDCTL_ENDPOINTS", "ETCDCTL_USER", "ETCDCTL_PASSWORD",
		"ETCDCTL_CACERT", "ETCDCTL_CERT", "ETCDCTL_KEY", "ETCDCTL_DIAL_TIMEOUT", "LEADERRUN_ETCD_DIAL_TIMEOUT",
		"LEADERRUN_ZK_SERVERS", "LEADERRUN_CONSUL_ADDR", "CONSUL_HTTP_ADDR", "LEADERRUN_BACKEND"} {
		t.Setenv(v, "") // restored when the test ends
		os.Unsetenv(v)
	}
	const password = "s3cret-Pa55"
	refused := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t, "127.0.0.1"))
	// A listener that is never accepted from: connections complete and
	// nothing ever answers.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	socket := filepath.Join(t.TempDir(), "none.sock")
	fast := []string{"--etcd-dial-timeout", "300ms"}

	for _, tc := range []struct {
		name    string
		args    []string
		env     []string // NAME=value
		code    int
		want    []string // in stderr
		within  time.Duration
		without []string // never in the output
	}{
		{name: "bad endpoint", args: []string{"--etcd-endpoints", "http://"}, code: 64, want: []string{"--etcd-endpoints"}},
		{name: "no endpoint", args: []string{"--backend", "etcd", "--etcd-endpoints", " , "}, code: 64, want: []string{"--etcd-endpoints"}},
		{name: "unixs after http", args: []string{"--etcd-endpoints", "http://" + refused + ",unixs://" + socket}, code: 64,
			want: []string{"--etcd-endpoints", "unixs://" + socket, "TLS"}},
		{name: "http after https", args: []string{"--etcd-endpoints", "https://" + refused + ",http://" + refused}, code: 64,
			want: []string{"--etcd-endpoints", "TLS"}},
		{name: "plain after unixs", args: []string{"--etcd-endpoints", "unixs://" + socket + "," + refused}, code: 64,
			want: []string{"--etcd-endpoints", "TLS"}},
		{name: "user without password", args: []string{"--etcd-endpoints", refused, "--etcd-user", "root"}, code: 64, want: []string{"--etcd-user"}},
		{name: "empty password", args: []string{"--etcd-endpoints", refused, "--etcd-user", "root:"}, code: 64, want: []string{"--etcd-user"}},
		{name: "empty etcdctl password", args: []string{"--etcd-endpoints", refused, "--etcd-user", "root"}, env: []string{"ETCDCTL_PASSWORD="},
			code: 64, want: []string{"--etcd-user"}},
		{name: "cert without key", args: []string{"--etcd-endpoints", refused, "--etcd-cert", "/nonexistent.pem"}, code: 64, want: []string{"--etcd-cert"}},
		{name: "missing CA", args: []string{"--etcd-endpoints", refused, "--etcd-cacert", "/nonexistent.pem"}, code: 64, want: []string{"--etcd-cacert"}},
		{name: "dial timeout 0", args: []string{"--etcd-endpoints", refused, "--etcd-dial-timeout", "0s"}, code: 64, want: []string{"--etcd-dial-timeout"}},
		{name: "etcdctl's dial timeout 0", args: []string{"--etcd-endpoints", refused}, env: []string{"ETCDCTL_DIAL_TIMEOUT=0s"}, code: 64,
			want: []string{"--etcd-dial-timeout"}},
		{name: "refused", args: append([]string{"--etcd-endpoints", refused}, fast...), code: 69, want: []string{refused, "connection refused"},
			within: 2 * time.Second},
		{name: "silent, etcdctl's dial timeout", args: []string{"--etcd-endpoints", "http://" + silent.Addr().String()},
			env: []string{"ETCDCTL_DIAL_TIMEOUT=300ms"}, code: 69, want: []string{silent.Addr().String(), "300ms"}, within: 1500 * time.Millisecond},
		{name: "socket missing", args: append([]string{"--etcd-endpoints", "unix://" + socket}, fast...), code: 69, want: []string{socket},
			within: 2 * time.Second},
		{name: "password of a user", args: append([]string{"--etcd-endpoints", refused, "--etcd-user", "root:" + password}, fast...), code: 69,
			want: []string{refused}, without: []string{password}},
		{name: "password in etcdctl's variable", args: append([]string{"--etcd-endpoints", refused}, fast...),
			env: []string{"ETCDCTL_USER=root", "ETCDCTL_PASSWORD=" + password}, code: 69, want: []string{refused}, without: []string{password}},
		{name: "password in the endpoint", args: append([]string{"--etcd-endpoints", "http://root:" + password + "@" + refused}, fast...), code: 69,
			want: []string{refused}, without: []string{password}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, e := range tc.env {
				name, value, _ := strings.Cut(e, "=")
				t.Setenv(name, value)
			}
			// status and history build the backend as run does (run
			// itself, which signals and forks, is for e2e to test).
			for _, command := range []string{"status", "history"} {
				args := append([]string{"leaderrun", command, "--lock", "etcd-flags"}, tc.args...)
				var stdout, stderr bytes.Buffer
				began := time.Now()
				code := run(args, &stdout, &stderr)
				took := time.Since(began)
				out := stderr.String()
				if code != tc.code {
					t.Errorf("%s: exit %d, want %d; stderr:\n%s", command, code, tc.code, out)
				}
				for _, w := range tc.want {
					if !strings.Contains(out, w) {
						t.Errorf("%s: stderr does not say %q:\n%s", command, w, out)
					}
				}
				for _, w := range tc.without {
					if strings.Contains(out+stdout.String(), w) {
						t.Errorf("%s: the output shows %q:\n%s", command, w, out)
					}
				}
				if tc.within > 0 && took > tc.within {
					t.Errorf("%s: took %v, want within %v", command, took, tc.within)
				}
			}
		})
	}
}
