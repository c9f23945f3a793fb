package zookeeper_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/zookeeper"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

func TestOpen(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     zookeeper.Config
		wantErr string // "" if Open must succeed
	}{
		{"defaults", zookeeper.Config{Servers: []string{"zk1:2181", "zk2"}, Prefix: "leaderrun/"}, ""},
		{"prefix without a slash", zookeeper.Config{Servers: []string{"zk1"}, Prefix: "leaderrun-"}, ""},
		{"no prefix", zookeeper.Config{Servers: []string{"zk1"}}, ""},
		{"no servers", zookeeper.Config{}, "no servers"},
		{"chroot", zookeeper.Config{Servers: []string{"zk1:2181/apps"}}, "chroot"},
		{"user information", zookeeper.Config{Servers: []string{"u:pw@zk1:2181"}}, "user information"},
		{"bad port", zookeeper.Config{Servers: []string{"zk1:x:y"}}, "host:port"},
		{"empty prefix segment", zookeeper.Config{Servers: []string{"zk1"}, Prefix: "a//"}, "empty"},
		{"dot segment", zookeeper.Config{Servers: []string{"zk1"}, Prefix: "a/../"}, "segment"},
		{"control character", zookeeper.Config{Servers: []string{"zk1"}, Prefix: "a\x01/"}, "refuses"},
		{"system tree", zookeeper.Config{Servers: []string{"zk1"}, Prefix: "zookeeper/"}, "ZooKeeper's own tree"},
		{"password without a user", zookeeper.Config{Servers: []string{"zk1"}, Digest: zookeeper.Digest{Password: "pw"}}, "without a user"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := zookeeper.Open(tc.cfg)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Open: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Open: %v, want an error saying %q", err, tc.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), "pw") {
				t.Errorf("the error shows the password: %v", err)
			}
			if s != nil {
				s.Close()
			}
		})
	}
}

// TestDigestHidesPassword: a digest printed in any form shows its user,
// never its password.
func TestDigestHidesPassword(t *testing.T) {
	d := zookeeper.Digest{User: "leaderrun", Password: "s3cret"}
	cfg := zookeeper.Config{Servers: []string{"zk1"}, Digest: d}
	for _, s := range []string{fmt.Sprint(d), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg), d.String()} {
		if strings.Contains(s, "s3cret") || !strings.Contains(s, "leaderrun") {
			t.Errorf("printed as %q", s)
		}
	}
}

// TestLeaseTTL: the margin arithmetic. A lease's TTL is the session
// timeout less the longest gap between two contacts (the retry period, or
// the library's pings every third of the timeout) and half a tick, taken
// as a quarter of the minimum session timeout. At leaderrun's default
// timings on an ensemble with ZooKeeper's default tick of 2 s, the TTL
// does not exceed --renew-deadline + --kill-grace (10 s + 3 s), so the
// runner refuses them; a lease duration above 16 s passes.
func TestLeaseTTL(t *testing.T) {
	const s = time.Second
	for _, tc := range []struct {
		name                    string
		timeout, retry, minimum time.Duration
		want                    time.Duration
	}{
		{"defaults, tick 2 s", 15 * s, 2 * s, 4 * s, 12 * s},
		{"20 s lease, tick 2 s", 20 * s, 2 * s, 4 * s, 17 * s},
		{"just above 16 s, tick 2 s", 16*s + time.Millisecond, 2 * s, 4 * s, 13*s + time.Millisecond},
		{"pings more often than renewals", 3 * s, 2 * s, 4 * s / 10, 2*s - 100*time.Millisecond},
		{"retry unknown: pings", 15 * s, 0, 4 * s, 9 * s},
		{"a raised minimum only widens the margin", 15 * s, 2 * s, 10 * s, 10500 * time.Millisecond},
		{"test servers, tick 200 ms", 3 * s, 500 * time.Millisecond, 400 * time.Millisecond, 2400 * time.Millisecond},
		{"nothing left", 4 * s, 2 * s, 40 * s, time.Nanosecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := zookeeper.LeaseTTL(tc.timeout, tc.retry, tc.minimum); got != tc.want {
				t.Errorf("LeaseTTL(%v, %v, %v) = %v, want %v", tc.timeout, tc.retry, tc.minimum, got, tc.want)
			}
		})
	}
	if err := backends.DefaultTimings.CheckGranted(zookeeper.LeaseTTL(15*s, 2*s, 4*s)); err == nil {
		t.Error("at the default timings and a tick of 2 s, the runner would accept the TTL")
	}
}

// TestLibraryLog: the client library's own lines (here, its failed dials of
// a port nobody listens on) reach leaderrun's log at debug level, marked
// as the library's, and nothing of them at info level.
func TestLibraryLog(t *testing.T) {
	for _, tc := range []struct {
		name  string
		level slog.Level
		want  bool
	}{
		{"debug", slog.LevelDebug, true},
		{"info", slog.LevelInfo, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf testenv.LockedBuffer
			log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: tc.level}))
			s, err := zookeeper.Open(zookeeper.Config{Servers: []string{"127.0.0.1:1"}, Log: log, ConnectTimeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			if _, err := backends.ReadStatus(ctx, s, "b"); err == nil {
				t.Fatal("status against a closed port succeeded")
			}
			got := strings.Contains(buf.String(), "source=go-zookeeper")
			if got != tc.want {
				t.Errorf("library lines in the log at %v: %v, want %v; log:\n%s", tc.level, got, tc.want, buf.String())
			}
		})
	}
}
