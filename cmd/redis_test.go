package cmd

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// caFile writes a self-signed CA certificate, PEM-encoded, and returns
// its path.
func caFile(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true,
		BasicConstraintsValid: true, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestRedisFlags: which settings select the Redis store, and what bad
// ones say, through run, status and history. Nothing listens at the
// address, so a selected store is exit 69 naming it; REDISCLI_AUTH alone
// selects nothing; no message shows a password.
func TestRedisFlags(t *testing.T) {
	const secret = "hunter2-redis-secret"
	addr := closedAddr(t)
	url := "redis://:" + secret + "@" + addr
	for _, v := range []string{"LEADERRUN_REDIS_URL", "REDISCLI_AUTH", "LEADERRUN_REDIS_SENTINELS", "LEADERRUN_REDIS_SENTINEL_MASTER",
		"LEADERRUN_REDIS_SENTINEL_PASSWORD", "LEADERRUN_REDIS_MIN_REPLICAS", "LEADERRUN_REDIS_CACERT", "LEADERRUN_REDIS_CERT",
		"LEADERRUN_REDIS_KEY", "LEADERRUN_BACKEND", "LEADERRUN_ETCD_ENDPOINTS", "ETCDCTL_ENDPOINTS", "LEADERRUN_CONSUL_ADDR",
		"CONSUL_HTTP_ADDR", "LEADERRUN_POSTGRES_URL", "LEADERRUN_ZK_SERVERS"} {
		t.Setenv(v, "") // restored when the test ends
		os.Unsetenv(v)
	}
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		code int
		want []string
	}{
		{name: "flag selects", args: []string{"--redis-url", url}, code: ExitUnavailable, want: []string{"redis at " + addr}},
		{name: "variable selects", env: map[string]string{"LEADERRUN_REDIS_URL": url}, code: ExitUnavailable, want: []string{"redis at " + addr}},
		{name: "REDISCLI_AUTH alone selects nothing", env: map[string]string{"REDISCLI_AUTH": secret}, code: ExitUsage,
			want: []string{"no store configured", "--redis-url"}},
		{name: "REDISCLI_AUTH with the URL", env: map[string]string{"REDISCLI_AUTH": secret}, args: []string{"--redis-url", "redis://" + addr},
			code: ExitUnavailable, want: []string{"redis at " + addr}},
		{name: "sentinels select", args: []string{"--redis-sentinels", addr, "--redis-sentinel-master", "mymaster", "--redis-url", "redis://:" + secret + "@"},
			code: ExitUnavailable, want: []string{`Sentinel master "mymaster" via ` + addr}},
		{name: "sentinels without a master", args: []string{"--redis-sentinels", addr}, code: ExitUsage,
			want: []string{"--redis-sentinels and --redis-sentinel-master go together"}},
		{name: "master without sentinels", args: []string{"--backend", "redis", "--redis-sentinel-master", "mymaster"}, code: ExitUsage,
			want: []string{"--redis-sentinels and --redis-sentinel-master go together"}},
		{name: "sentinels with a host in the URL", args: []string{"--redis-sentinels", addr, "--redis-sentinel-master", "m", "--redis-url", url},
			code: ExitUsage, want: []string{"--redis-url", "names no host"}},
		{name: "sentinel that is no address", args: []string{"--redis-sentinels", "sentinel-1", "--redis-sentinel-master", "m"},
			code: ExitUsage, want: []string{`"sentinel-1"`, "HOST:PORT"}},
		{name: "backend without an address", args: []string{"--backend", "redis"}, code: ExitUsage, want: []string{"--redis-url"}},
		{name: "bad scheme", args: []string{"--redis-url", "http://:" + secret + "@" + addr}, code: ExitUsage,
			want: []string{"--redis-url", "redis://, rediss:// or unix://"}},
		{name: "bad database", args: []string{"--redis-url", "redis://:" + secret + "@" + addr + "/x"}, code: ExitUsage,
			want: []string{"--redis-url", "database"}},
		{name: "unknown URL option", args: []string{"--redis-url", url + "?pool=9"}, code: ExitUsage, want: []string{"--redis-url", "pool"}},
		{name: "negative replicas", args: []string{"--redis-url", url, "--redis-min-replicas", "-1"}, code: ExitUsage,
			want: []string{"--redis-min-replicas -1"}},
		{name: "TLS files for redis://", args: []string{"--redis-url", url, "--redis-cacert", caFile(t)}, code: ExitUsage,
			want: []string{"use rediss://"}},
		{name: "CA file that is no certificate", args: []string{"--redis-url", "rediss://:" + secret + "@" + addr, "--redis-cacert", notPEM},
			code: ExitUsage, want: []string{notPEM, "no PEM certificate"}},
		{name: "certificate without its key", args: []string{"--redis-url", "rediss://" + addr, "--redis-cert", notPEM}, code: ExitUsage,
			want: []string{"both the certificate and its key"}},
		{name: "with etcd too", env: map[string]string{"ETCDCTL_ENDPOINTS": "127.0.0.1:2379"}, args: []string{"--redis-url", url},
			code: ExitUsage, want: []string{"several stores", "redis", "etcd"}},
	} {
		for _, command := range []string{"run", "status", "history"} {
			t.Run(tc.name+"/"+command, func(t *testing.T) {
				for k, v := range tc.env {
					t.Setenv(k, v)
				}
				args := append([]string{"leaderrun", command, "--lock", "redisflags"}, tc.args...)
				if command == "run" {
					args = append(args, "--try", "--", "true")
				}
				var stdout, stderr bytes.Buffer
				code := run(args, &stdout, &stderr)
				out := stdout.String() + stderr.String()
				if code != tc.code {
					t.Errorf("exit %d, want %d:\n%s", code, tc.code, out)
				}
				// run logs to the process's own stderr, out of reach
				// here: e2e/redis_test.go reads what it says.
				for _, w := range tc.want {
					if command == "run" && tc.code == ExitUnavailable {
						break
					}
					if !strings.Contains(out, w) {
						t.Errorf("output does not say %q:\n%s", w, out)
					}
				}
				if strings.Contains(out, secret) {
					t.Errorf("output shows the password:\n%s", out)
				}
			})
		}
	}
	t.Run("help", func(t *testing.T) {
		t.Setenv("LEADERRUN_REDIS_URL", url)
		t.Setenv("REDISCLI_AUTH", secret)
		var stdout, stderr bytes.Buffer
		if code := run([]string{"leaderrun", "run", "--help"}, &stdout, &stderr); code != 0 {
			t.Fatalf("--help: exit %d\n%s", code, stderr.String())
		}
		help := stdout.String()
		store := help[strings.Index(help, "Store"):]
		for _, w := range []string{"--redis-url URL", "$LEADERRUN_REDIS_URL", "REDISCLI_AUTH", "rediss://", "unix://",
			"--redis-sentinels HOSTS", "--redis-sentinel-master NAME", "--redis-sentinel-password PASSWORD",
			"--redis-min-replicas N", "$LEADERRUN_REDIS_MIN_REPLICAS", "--redis-cacert FILE", "--redis-cert FILE", "--redis-key FILE",
			"visible to every user", "appendfsync always", "docs/backends/redis.md", "redis,"} {
			if !strings.Contains(store, w) {
				t.Errorf("the Store section of run --help does not say %q", w)
			}
		}
		if strings.Contains(help, secret) {
			t.Errorf("--help shows the password from the environment")
		}
	})
}
