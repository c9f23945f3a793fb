//go:build linux

package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// TestRedisHostileAnswers: a Redis server that announces an array of
// 999999999999999999 elements as the answer to EVALSHA (the acquire
// script), or one of 999999999999999998 as the answer to HELLO and then
// sends pairs of 1 MiB strings without end. Multiplied by what the client
// allocates per element, either count wraps around int64; the reply guard
// must refuse both at the header. leaderrun exits 69 within 15 s, without
// a panic, its peak RSS under 64 MiB.
func TestRedisHostileAnswers(t *testing.T) {
	t.Parallel()
	// Pairs of distinct strings: a map that go-redis fills with them
	// keeps every one.
	pair := func(i int) []byte {
		key := []byte("$1048576\r\n" + strings.Repeat("x", 1<<20) + "\r\n$1048576\r\n" + strings.Repeat("y", 1<<20) + "\r\n")
		copy(key[len("$1048576\r\n"):], fmt.Sprintf("%020d", i))
		return key
	}
	for _, tc := range []struct {
		name string
		// answer is what the server writes for a command; then it goes
		// on writing endless(0), endless(1), ... without end, if set.
		answer  func(cmd string) string
		endless func(i int) []byte
	}{
		{name: "array of 999999999999999999 to EVALSHA", answer: func(cmd string) string {
			if cmd == "EVALSHA" || cmd == "EVAL" {
				return "*999999999999999999\r\n"
			}
			return politeAnswer(cmd)
		}},
		{name: "array of 999999999999999998 to HELLO, then 1 MiB pairs", answer: func(cmd string) string {
			if cmd == "HELLO" {
				return "*999999999999999998\r\n"
			}
			return politeAnswer(cmd)
		}, endless: pair},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := serveRESP(t, tc.answer, tc.endless)
			m := testenv.RunMeasured(t, hostileDeadline, testenv.Leaderrun(t),
				"--redis-url", "redis://"+srv.addr, "--lock", "hostile", "--", "true")
			t.Logf("exit %d after %v, peak RSS %.1f MiB, %d connections\n%s", m.Code, m.Took.Round(time.Millisecond),
				float64(m.PeakRSS)/(1<<20), srv.conns.Load(), strings.TrimSpace(m.Output))
			if m.Code != 69 {
				t.Errorf("exit %d, want 69", m.Code)
			}
			if strings.Contains(m.Output, "panic") || strings.Contains(m.Output, "goroutine ") {
				t.Errorf("leaderrun panicked:\n%s", m.Output)
			}
			if m.PeakRSS >= hostileMaxRSS {
				t.Errorf("peak RSS %.1f MiB, want under %d MiB", float64(m.PeakRSS)/(1<<20), hostileMaxRSS>>20)
			}
			if srv.hostile.Load() == 0 {
				t.Error("the hostile answer was never sent: the test tested nothing")
			}
		})
	}
}

// politeAnswer is what a Redis that has nothing to say to leaderrun
// answers: HELLO refused as by Redis 5 (go-redis then sets the name with
// CLIENT SETNAME), anything else OK.
func politeAnswer(cmd string) string {
	if cmd == "HELLO" {
		return "-ERR unknown command 'HELLO'\r\n"
	}
	return "+OK\r\n"
}

// respServer is a TCP server that reads RESP commands and answers each as
// its answer function says; once it has written a reply other than
// politeAnswer's, it writes endless(0), endless(1), ... without end (if
// set).
type respServer struct {
	addr    string
	conns   atomic.Int32
	hostile atomic.Int32 // answers other than politeAnswer's written
}

func serveRESP(t *testing.T, answer func(cmd string) string, endless func(i int) []byte) *respServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &respServer{addr: ln.Addr().String()}
	// leaderrun has exited when the test cleans up: every connection's
	// reads and writes fail, and its goroutine returns.
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.conns.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					cmd, err := readCommand(r)
					if err != nil {
						return
					}
					a := answer(cmd)
					if _, err := io.WriteString(c, a); err != nil {
						return
					}
					if a == politeAnswer(cmd) {
						continue
					}
					s.hostile.Add(1)
					for i := 0; endless != nil; i++ {
						if _, err := c.Write(endless(i)); err != nil {
							return
						}
					}
				}
			}()
		}
	}()
	return s
}

// readCommand reads one command (an array of bulk strings) and returns
// its name in upper case.
func readCommand(r *bufio.Reader) (string, error) {
	n, err := readHeader(r, '*')
	if err != nil {
		return "", err
	}
	var name string
	for i := range n {
		size, err := readHeader(r, '$')
		if err != nil {
			return "", err
		}
		arg := make([]byte, size+2)
		if _, err := io.ReadFull(r, arg); err != nil {
			return "", err
		}
		if i == 0 {
			name = strings.ToUpper(string(arg[:size]))
		}
	}
	return name, nil
}

func readHeader(r *bufio.Reader, typ byte) (int, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return 0, err
	}
	if len(line) < 3 || line[0] != typ {
		return 0, fmt.Errorf("want a %q header, got %q", typ, line)
	}
	n, err := strconv.Atoi(strings.TrimSpace(line[1:]))
	if err != nil || n < 0 || n > 1<<20 {
		return 0, fmt.Errorf("header %q", line)
	}
	return n, nil
}

// TestRedisPasswordWithSlashAndComma: a password that holds "/" and ","
// (as base64 passwords do), written into --redis-url as it is, reaches
// the server whole, and no part of it shows in any message: run, status
// and history work; a wrong one, a bad database and an unreachable server
// are errors that quote the URL without it.
func TestRedisPasswordWithSlashAndComma(t *testing.T) {
	t.Parallel()
	const password = "ab/cd,ef+gh=SECRET"
	r := testenv.StartRedis(t, testenv.RedisOptions{Password: password})
	// Every piece of the password that a parser splitting at "/", ","
	// or ":" would leave behind.
	pieces := []string{"SECRET", "ab/cd", "cd,ef", "ef+gh", "zz/yy", "yy,xx"}
	url := func(pw, rest string) string { return "redis://:" + pw + "@" + rest }
	dead := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t, "127.0.0.1"))
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string // in the output
	}{
		{"status", []string{"status", "--lock", "pw", "--redis-url", url(password, r.Addr()+"/0")}, 3, "leader:   none"},
		{"run", []string{"--lock", "pw", "--redis-url", url(password, r.Addr()+"/0"), "--", "true"}, 0, "leadership released"},
		{"history", []string{"history", "--lock", "pw", "--redis-url", url(password, r.Addr()+"/0")}, 0, "exited 0"},
		{"wrong password", []string{"status", "--lock", "pw", "--redis-url", url("zz/yy,xx=SECRET", r.Addr()+"/0")}, 69, "redis at " + r.Addr()},
		{"bad database", []string{"status", "--lock", "pw", "--redis-url", url(password, r.Addr()+"/x")}, 64, `--redis-url "redis://` + r.Addr() + `/x"`},
		{"unreachable", []string{"--lock", "pw", "--redis-url", url(password, dead+"/0"), "--wait", "1s", "--", "true"}, 69, "redis at " + dead},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, code := combinedOutput(t, nil, tc.args...)
			t.Logf("exit %d:\n%s", code, out)
			if code != tc.code {
				t.Errorf("exit %d, want %d", code, tc.code)
			}
			if !strings.Contains(out, tc.want) {
				t.Errorf("output lacks %q", tc.want)
			}
			for _, p := range pieces {
				if strings.Contains(out, p) {
					t.Errorf("output shows %q, a piece of the password", p)
				}
			}
		})
	}
}

// combinedOutput runs leaderrun to the end, with env added to the test's
// environment, and returns its stdout and stderr together, and its exit
// code.
func combinedOutput(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	return combinedOutputOf(t, testenv.Leaderrun(t), env, args...)
}

// TestForeignOwnedCompanion: leaderrun runs the companion beside it only
// under the rule the state directory is held to: a regular file of this
// user or root that no one else may write, in directories of this user or
// root that no one else may write unless they are sticky. Otherwise
// another user could edit it, or put their own in its place, and have
// root run it. Each case that breaks the rule is exit 69 naming what is
// wrong, and the companion (a script that leaves a mark) never runs.
func TestForeignOwnedCompanion(t *testing.T) {
	requireRoot(t)
	const other = 65534
	bin := testenv.Leaderrun(t)
	for _, tc := range []struct {
		name      string
		fileOwner int
		fileMode  os.FileMode
		dirOwner  int
		dirMode   os.FileMode
		want      string // in the message; "": the companion runs
	}{
		{name: "root's, 0755", dirMode: 0o755},
		{name: "owned by another user", fileOwner: other, fileMode: 0o755, dirMode: 0o755, want: "leaderrun-aws is owned by uid 65534"},
		{name: "owned by another user, 0777", fileOwner: other, fileMode: 0o777, dirMode: 0o755, want: "leaderrun-aws is owned by uid 65534"},
		{name: "writable by everyone", fileMode: 0o777, dirMode: 0o755, want: "leaderrun-aws is writable by others (mode 0777)"},
		{name: "writable by its group", fileMode: 0o775, dirMode: 0o755, want: "leaderrun-aws is writable by others (mode 0775)"},
		{name: "in another user's directory", fileMode: 0o755, dirOwner: other, dirMode: 0o755, want: "bin is owned by uid 65534"},
		{name: "in a directory everyone may write", fileMode: 0o755, dirMode: 0o777, want: "bin is writable by others (mode 0777) and not sticky"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "bin")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			self := filepath.Join(dir, "leaderrun")
			install(t, bin, self)
			mark := filepath.Join(filepath.Dir(dir), "ran")
			companion := filepath.Join(dir, "leaderrun-aws")
			testenv.WriteExecutable(t, companion, []byte("#!/bin/sh\necho ran >"+mark+"\n"), 0o700)
			mode := tc.fileMode
			if mode == 0 {
				mode = 0o755
			}
			for _, set := range []error{os.Chown(companion, tc.fileOwner, tc.fileOwner), os.Chmod(companion, mode),
				os.Chown(dir, tc.dirOwner, tc.dirOwner), os.Chmod(dir, tc.dirMode)} {
				if set != nil {
					t.Fatal(set)
				}
			}
			out, code := combinedOutputOf(t, self, []string{"AWS_REGION=eu-west-1"}, "status", "--dynamodb-table", "ops_locks",
				"--dynamodb-endpoint", "http://127.0.0.1:1", "--lock", "companion")
			_, ranErr := os.Stat(mark)
			ran := ranErr == nil
			t.Logf("exit %d, companion ran: %v\n%s", code, ran, out)
			if tc.want == "" {
				if !ran || code != 0 {
					t.Errorf("a companion of root's, 0755, in root's directory: exit %d, ran %v; want it run", code, ran)
				}
				return
			}
			if ran {
				t.Errorf("the companion ran")
			}
			if code != 69 {
				t.Errorf("exit %d, want 69", code)
			}
			if !strings.Contains(out, tc.want) {
				t.Errorf("output does not say %q", tc.want)
			}
		})
	}
}

// combinedOutputOf is combinedOutput for the leaderrun at path.
func combinedOutputOf(t *testing.T, path string, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	case err != nil:
		t.Fatalf("%s %v: %v", path, args, err)
	}
	return string(out), 0
}

// TestCredentialRiskWarnings: a credential in the arguments (which every
// user of the host reads in ps), one sent across a network in clear text,
// or a certificate check turned off, is said in one warning line at
// start, naming the flag or variable and what to use instead, and never
// the secret; the forms that keep it safe (variables, files, TLS, the
// loopback) draw none. status stands for every command: the line comes
// from choosing the store, before anything is sent.
func TestCredentialRiskWarnings(t *testing.T) {
	t.Parallel()
	const secret = "S3cretPw"
	// Nothing answers at either: the status fails, after the warning.
	local, far := "127.0.0.1:1", "192.0.2.1:1"
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		want []string // in the one warning line; none: no warning
	}{
		{name: "redis password in --redis-url", args: []string{"--redis-url", "redis://:" + secret + "@" + local + "/0"},
			want: []string{"--redis-url holds a secret in the arguments", "use LEADERRUN_REDIS_URL, or the password alone in REDISCLI_AUTH"}},
		{name: "redis password to a remote host over redis://", env: []string{"LEADERRUN_REDIS_URL=redis://:" + secret + "@" + far + "/0"},
			want: []string{"the Redis password and every command cross the network to " + far + " in clear text: use rediss://"}},
		{name: "REDISCLI_AUTH to a remote host over redis://", args: []string{"--redis-url", "redis://" + far}, env: []string{"REDISCLI_AUTH=" + secret},
			want: []string{"cross the network to " + far + " in clear text"}},
		{name: "rediss with skip_verify", env: []string{"LEADERRUN_REDIS_URL=rediss://:" + secret + "@" + local + "/0?skip_verify=true"},
			want: []string{"skip_verify=true in --redis-url: the server's certificate is not checked", "--redis-cacert"}},
		{name: "--redis-sentinel-password", args: []string{"--redis-sentinels", local, "--redis-sentinel-master", "m", "--redis-sentinel-password", secret},
			want: []string{"--redis-sentinel-password holds a secret in the arguments", "use LEADERRUN_REDIS_SENTINEL_PASSWORD"}},
		{name: "sentinel password to remote Sentinels over plain TCP", args: []string{"--redis-sentinels", far, "--redis-sentinel-master", "m"},
			env:  []string{"LEADERRUN_REDIS_SENTINEL_PASSWORD=" + secret},
			want: []string{"the Redis password and every command cross the network to " + far + " in clear text: use rediss://"}},
		{name: "--consul-token", args: []string{"--consul-addr", local, "--consul-token", secret},
			want: []string{"--consul-token holds a secret in the arguments", "--consul-token-file, CONSUL_HTTP_TOKEN_FILE"}},
		{name: "consul token to a remote agent over http", env: []string{"CONSUL_HTTP_ADDR=http://" + far, "CONSUL_HTTP_TOKEN=" + secret},
			want: []string{"the Consul ACL token and every request cross the network to " + far + " in clear text"}},
		{name: "CONSUL_HTTP_SSL_VERIFY=false", env: []string{"CONSUL_HTTP_ADDR=https://" + local, "CONSUL_HTTP_SSL_VERIFY=false"},
			want: []string{"CONSUL_HTTP_SSL_VERIFY=false: the agent's certificate is not checked"}},
		{name: "etcd password in the arguments, to a remote member over http", args: []string{"--etcd-endpoints", "http://" + far, "--etcd-user", "root:" + secret},
			want: []string{"--etcd-user holds a secret in the arguments", "use ETCDCTL_USER and ETCDCTL_PASSWORD",
				"the etcd password and every request cross the network to " + far + " in clear text"}},
		{name: "postgres password in --postgres-url", args: []string{"--postgres-url", "postgres://app:" + secret + "@" + local + "/app"},
			want: []string{"--postgres-url holds a secret in the arguments", "PGPASSWORD or ~/.pgpass"}},
		{name: "azure SAS to a remote endpoint over http", args: []string{"--azure-container", "locks", "--azure-account-url", "http://" + far + "/acct"},
			env:  []string{"AZURE_STORAGE_ACCOUNT=acct", "AZURE_STORAGE_SAS_TOKEN=sv=2024&sig=" + secret},
			want: []string{"the SAS token, or requests signed with the account key, cross the network to " + far + " in clear text: use https://"}},
		{name: "dynamodb to a remote endpoint over http", args: []string{"--dynamodb-endpoint", "http://" + far},
			env:  []string{"AWS_REGION=eu-west-1", "AWS_ACCESS_KEY_ID=AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY=" + secret},
			want: []string{"requests signed with the AWS credentials cross the network to " + far + " in clear text: use https://"}},

		{name: "redis password in the variable, loopback", env: []string{"LEADERRUN_REDIS_URL=redis://:" + secret + "@" + local + "/0"}},
		{name: "redis over TLS, verified", env: []string{"LEADERRUN_REDIS_URL=rediss://:" + secret + "@" + far + "/0"}},
		{name: "consul token from a file, remote over https", args: []string{"--consul-addr", "https://" + far, "--consul-token-file", "/nonexistent"}},
		{name: "etcd password in the variables, loopback", args: []string{"--etcd-endpoints", "http://" + local}, env: []string{"ETCDCTL_USER=root", "ETCDCTL_PASSWORD=" + secret}},
		{name: "dynamodb emulator on the loopback", args: []string{"--dynamodb-endpoint", "http://" + local},
			env: []string{"AWS_REGION=eu-west-1", "AWS_ACCESS_KEY_ID=AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY=" + secret}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"status", "--lock", "risks", "--timeout", "300ms"}, tc.args...)
			out, code := combinedOutput(t, tc.env, args...)
			var warnings []string
			for _, line := range strings.Split(out, "\n") {
				if strings.Contains(line, "level=WARN") {
					warnings = append(warnings, line)
				}
			}
			t.Logf("exit %d:\n%s", code, out)
			if strings.Contains(out, secret) {
				t.Errorf("the output shows the secret")
			}
			if len(tc.want) == 0 {
				if len(warnings) > 0 {
					t.Errorf("warned of a safe setting: %s", warnings)
				}
				return
			}
			if len(warnings) != 1 {
				t.Fatalf("%d warning lines, want 1", len(warnings))
			}
			for _, w := range append([]string{`msg="credentials at risk"`}, tc.want...) {
				if !strings.Contains(warnings[0], w) {
					t.Errorf("the warning does not say %q", w)
				}
			}
		})
	}
}
