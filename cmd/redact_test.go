package cmd

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestNoPasswordInAddressMessages: every store's address, given with a
// password that holds "/" and "," (as base64 passwords do), to a port
// where nothing listens: status and history fail, and no piece of the
// password shows in what they print, whatever cuts the address into
// pieces (a URL parser at "/", a list at ",").
func TestNoPasswordInAddressMessages(t *testing.T) {
	const password = "ab/cd,ef+SECRET"
	pieces := []string{"SECRET", "ab/cd", "cd,ef", "ef+"}
	for _, tc := range []struct {
		name string
		args []string
		env  []string
	}{
		{name: "etcd", args: []string{"--etcd-endpoints", "http://root:" + password + "@127.0.0.1:1", "--etcd-dial-timeout", "300ms"}},
		{name: "etcd, second endpoint", args: []string{"--etcd-endpoints", "http://127.0.0.1:1,http://root:" + password + "@127.0.0.1:2", "--etcd-dial-timeout", "300ms"}},
		{name: "consul", args: []string{"--consul-addr", "http://user:" + password + "@127.0.0.1:1"}},
		{name: "consul, variable", env: []string{"CONSUL_HTTP_ADDR=http://user:" + password + "@127.0.0.1:1"}},
		{name: "postgres", args: []string{"--postgres-url", "postgres://leaderrun:" + password + "@127.0.0.1:1/app?connect_timeout=1"}},
		{name: "zookeeper", args: []string{"--zk-servers", "user:" + password + "@127.0.0.1:1"}},
		{name: "redis", args: []string{"--redis-url", "redis://:" + password + "@127.0.0.1:1/0"}},
		{name: "redis, user", args: []string{"--redis-url", "redis://leaderrun:" + password + "@127.0.0.1:1/0"}},
		{name: "redis, bad database", args: []string{"--redis-url", "redis://:" + password + "@127.0.0.1:1/x"}},
		{name: "redis, unix socket", args: []string{"--redis-url", "unix://:" + password + "@/nonexistent/redis.sock"}},
		{name: "redis sentinels", args: []string{"--redis-sentinels", "user:" + password + "@127.0.0.1:1", "--redis-sentinel-master", "m"}},
		{name: "dynamodb", args: []string{"--dynamodb-endpoint", "http://user:" + password + "@127.0.0.1:1"}, env: []string{"AWS_REGION=eu-west-1"}},
		{name: "azure", args: []string{"--azure-container", "locks", "--azure-account-url", "http://user:" + password + "@127.0.0.1:1/acct"},
			env: []string{"AZURE_STORAGE_ACCOUNT=acct", "AZURE_STORAGE_KEY=a2V5"}},
		// A password whose piece before the "/" is a number: a URL
		// parser takes it for a port, the rest for a path.
		{name: "azure, password that parses as a port", args: []string{"--azure-container", "locks", "--azure-account-url", "http://user:12/cd,ef+SECRET@127.0.0.1:1/acct"},
			env: []string{"AZURE_STORAGE_ACCOUNT=acct", "AZURE_STORAGE_KEY=a2V5"}},
		{name: "dynamodb, password that parses as a port", args: []string{"--dynamodb-endpoint", "http://user:12/cd,ef+SECRET@127.0.0.1:1"}, env: []string{"AWS_REGION=eu-west-1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, e := range tc.env {
				name, value, _ := strings.Cut(e, "=")
				t.Setenv(name, value)
			}
			for _, command := range []string{"status", "history"} {
				args := append([]string{"leaderrun", command, "--lock", "pw"}, tc.args...)
				var stdout, stderr bytes.Buffer
				began := time.Now()
				code := run(args, &stdout, &stderr)
				out := stdout.String() + stderr.String()
				t.Logf("%s: exit %d after %v:\n%s", command, code, time.Since(began).Round(time.Millisecond), out)
				if code == 0 || code == 3 {
					t.Errorf("%s: exit %d with nothing listening", command, code)
				}
				for _, p := range pieces {
					if strings.Contains(out, p) {
						t.Errorf("%s: the output shows %q, a piece of the password", command, p)
					}
				}
			}
		})
	}
}
