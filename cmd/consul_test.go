package cmd

import (
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/consul"
)

// TestConsulLockDelay: without --consul-lock-delay the sessions' lock-delay
// is the run's --kill-grace + 1 s, at most Consul's 60 s; an explicit value,
// by flag or variable, wins, 0 included; out of range is a usage error
// naming the flag.
func TestConsulLockDelay(t *testing.T) {
	cases := []struct {
		name  string
		flags func() []cli.Flag
		args  []string
		env   string
		want  time.Duration
		err   string
	}{
		{name: "default kill grace", flags: runFlags, want: 4 * time.Second},
		{name: "derived from --kill-grace", flags: runFlags, args: []string{"--kill-grace", "2s"}, want: 3 * time.Second},
		{name: "derived from LEADERRUN_KILL_GRACE", flags: runFlags, env: "LEADERRUN_KILL_GRACE=500ms", want: 1500 * time.Millisecond},
		{name: "derived, at most 60s", flags: runFlags, args: []string{"--kill-grace", "59500ms"}, want: consul.MaxLockDelay},
		{name: "explicit wins", flags: runFlags, args: []string{"--kill-grace", "2s", "--consul-lock-delay", "15s"}, want: 15 * time.Second},
		{name: "explicit 0s wins", flags: runFlags, args: []string{"--consul-lock-delay", "0s"}, want: 0},
		{name: "explicit by variable", flags: runFlags, env: "LEADERRUN_CONSUL_LOCK_DELAY=7s", want: 7 * time.Second},
		{name: "status takes the flag", flags: storeFlags, args: []string{"--consul-lock-delay", "2s"}, want: 2 * time.Second},
		{name: "too long", flags: runFlags, args: []string{"--consul-lock-delay", "61s"}, err: "--consul-lock-delay 1m1s"},
		{name: "negative", flags: runFlags, args: []string{"--consul-lock-delay", "-1s"}, err: "--consul-lock-delay -1s"},
		{name: "negative by 1ns", flags: runFlags, args: []string{"--consul-lock-delay", "-1ns"}, err: "--consul-lock-delay -1ns"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if name, value, ok := strings.Cut(tc.env, "="); ok {
				t.Setenv(name, value)
			}
			var got time.Duration
			app := &cli.App{Name: "t", Flags: tc.flags(), Action: func(c *cli.Context) error {
				s, _, err := openStore(c)
				if err != nil {
					return err
				}
				// The run's timings, as runConfig reads them (status has none).
				got = s.(*consul.Store).LockDelay(backends.Timings{KillGrace: c.Duration("kill-grace")})
				return s.Close()
			}}
			args := append([]string{"t", "--consul-addr", "127.0.0.1:1", "--lock", "x"}, tc.args...)
			err := app.Run(args)
			switch {
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Errorf("got %v, want an error saying %q", err, tc.err)
			case tc.err == "" && err != nil:
				t.Errorf("unexpected error: %v", err)
			case tc.err == "" && got != tc.want:
				t.Errorf("lock-delay %v, want %v", got, tc.want)
			}
		})
	}
}

// TestConsulAddressWithUserInfo: a --consul-addr (or CONSUL_HTTP_ADDR)
// with a password or token in its user information is a usage error (exit
// 64) that names the flag and the address without the secret, whether or
// not the address parses, for run and status alike. (It used to be the
// request's URL parse error, with the password in it, exit 69.)
func TestConsulAddressWithUserInfo(t *testing.T) {
	const secret = "s3cr3t-tok"
	cases := []struct {
		name string
		args []string
		env  string
	}{
		{name: "run, URL", args: []string{"--consul-addr", "http://user:" + secret + "@127.0.0.1:1", "--lock", "x", "--", "true"}},
		{name: "run, URL that does not parse", args: []string{"--consul-addr", "http://user:" + secret + "%zz@127.0.0.1:1", "--lock", "x", "--", "true"}},
		{name: "run, host:port", args: []string{"--consul-addr", secret + "@127.0.0.1:1", "--lock", "x", "--", "true"}},
		{name: "run, CONSUL_HTTP_ADDR", args: []string{"--lock", "x", "--", "true"}, env: "https://" + secret + "@127.0.0.1:1"},
		{name: "status", args: []string{"status", "--consul-addr", "http://:" + secret + "@127.0.0.1:1", "--lock", "x"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("CONSUL_HTTP_ADDR", tc.env)
			var stdout, stderr strings.Builder
			code := run(append([]string{"leaderrun"}, tc.args...), &stdout, &stderr)
			out := stdout.String() + stderr.String()
			t.Logf("exit %d: %s", code, strings.TrimSpace(out))
			if code != 64 {
				t.Errorf("exit %d, want 64", code)
			}
			if strings.Contains(out, secret) {
				t.Errorf("the message shows the secret: %s", out)
			}
			if !strings.Contains(out, "--consul-addr") || !strings.Contains(out, "127.0.0.1:1") || !strings.Contains(out, "user information") {
				t.Errorf("the message does not name the flag, the address and what is wrong with it: %s", out)
			}
		})
	}
}
