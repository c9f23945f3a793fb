package zookeeper_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/zookeeper"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

func TestNew(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     zookeeper.Config
		wantErr string // "" if New must succeed
	}{
		{"defaults", zookeeper.Config{Servers: []string{"zk1:2181", "zk2"}, Prefix: "leaderrun/", Lock: "billing"}, ""},
		{"prefix without a slash", zookeeper.Config{Servers: []string{"zk1"}, Prefix: "leaderrun-", Lock: "billing"}, ""},
		{"no servers", zookeeper.Config{Lock: "billing"}, "no servers"},
		{"chroot", zookeeper.Config{Servers: []string{"zk1:2181/apps"}, Lock: "billing"}, "chroot"},
		{"bad lock name", zookeeper.Config{Servers: []string{"zk1"}, Lock: "a/b"}, "invalid lock name"},
		{"empty prefix segment", zookeeper.Config{Servers: []string{"zk1"}, Prefix: "a//", Lock: "b"}, "empty"},
		{"dot segment", zookeeper.Config{Servers: []string{"zk1"}, Prefix: "a/../", Lock: "b"}, "segment"},
		{"system tree", zookeeper.Config{Servers: []string{"zk1"}, Prefix: "zookeeper/", Lock: "b"}, "ZooKeeper's own tree"},
		{"password without a user", zookeeper.Config{Servers: []string{"zk1"}, Lock: "b", Digest: zookeeper.Digest{Password: "pw"}}, "without a user"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := zookeeper.New(tc.cfg)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("New: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("New: %v, want an error saying %q", err, tc.wantErr)
			}
			if b != nil {
				b.Close()
			}
		})
	}
}

// TestCampaignNeedsLeaseDuration: the session timeout is the lease
// duration, which only the runner knows; none is a mistake, not a default.
func TestCampaignNeedsLeaseDuration(t *testing.T) {
	b, err := zookeeper.New(zookeeper.Config{Servers: []string{"127.0.0.1:1"}, Lock: "b"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	_, err = b.Campaign(context.Background(), backends.CampaignOptions{Identity: "a"})
	if err == nil || !strings.Contains(err.Error(), "lease duration") {
		t.Errorf("campaign without a lease duration: %v", err)
	}
}

func TestParseDigest(t *testing.T) {
	for _, tc := range []struct {
		name, in     string
		user, passwd string
		ok           bool
	}{
		{"plain", "leaderrun:s3cret", "leaderrun", "s3cret", true},
		{"final newline", "leaderrun:s3cret\n", "leaderrun", "s3cret", true},
		{"colon in the password", "leaderrun:a:b", "leaderrun", "a:b", true},
		{"no colon", "leaderrun", "", "", false},
		{"no user", ":s3cret", "", "", false},
		{"two lines", "leaderrun:s3cret\nother:s3cret\n", "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := zookeeper.ParseDigest(tc.in)
			if (err == nil) != tc.ok || d.User != tc.user || d.Password != tc.passwd {
				t.Fatalf("ParseDigest(%q) = %#v, %v", tc.in, d, err)
			}
			if err != nil && strings.Contains(err.Error(), "s3cret") {
				t.Errorf("the error shows the password: %v", err)
			}
		})
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
	if ttl := zookeeper.LeaseTTL(15*s, 2*s, 4*s); ttl > 10*s+3*s {
		t.Errorf("at the default timings the TTL is %v, more than D + G = 13s: the runner would accept them", ttl)
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
			var buf syncBuffer
			log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: tc.level}))
			b, err := zookeeper.New(zookeeper.Config{Servers: []string{"127.0.0.1:1"}, Lock: "b", Log: log, ConnectTimeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			if _, err := b.Campaign(ctx, backends.CampaignOptions{Identity: "a", LeaseDuration: 4 * time.Second}); err == nil {
				t.Fatal("campaign against a closed port succeeded")
			}
			got := strings.Contains(buf.String(), "source=go-zookeeper")
			if got != tc.want {
				t.Errorf("library lines in the log at %v: %v, want %v; log:\n%s", tc.level, got, tc.want, buf.String())
			}
		})
	}
}

// syncBuffer is a bytes.Buffer safe for the library's goroutines.
type syncBuffer = testenv.LockedBuffer
