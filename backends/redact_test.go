package backends

import (
	"strings"
	"testing"
)

// TestRedact: no part of a password shows in a redacted address, whatever
// it holds ("/" and "," above all: base64 passwords hold "/", and lists
// are split on ","), and the rest of the address does.
func TestRedact(t *testing.T) {
	for _, tc := range []struct {
		name, addr, want string
	}{
		{"no user information", "redis://host:6379/0", "redis://host:6379/0"},
		{"password", "redis://:SECRET@host:6379/0", "redis://host:6379/0"},
		{"user and password", "redis://leaderrun:SECRET@host:6379/0", "redis://host:6379/0"},
		{"password with /", "redis://:ab/cdSECRET@host/0", "redis://host/0"},
		{"password with ,", "redis://:ab,cdSECRET@host/0", "redis://host/0"},
		{"password with / and ,", "rediss://u:a/b,c+d=SECRET@host:6380/2?dial_timeout=3s", "rediss://host:6380/2?dial_timeout=3s"},
		{"password with @", "redis://u:a@bSECRET@host/0", "redis://host/0"},
		{"password with ?", "redis://:ab?cdSECRET@host/0", "redis://host/0"},
		{"encoded password", "redis://:ab%2FcdSECRET@host/0", "redis://host/0"},
		{"unix socket", "unix://u:pa/ss@SECRET@/run/redis@main/redis.sock", "unix:///run/redis@main/redis.sock"},
		{"unix socket without user information", "unix:///run/redis@main/redis.sock", "unix:///run/redis@main/redis.sock"},
		{"list", "http://u:SECRET@a:2379,https://u:SECRET@b:2379", "http://a:2379,https://b:2379"},
		{"list, password with , and /", "http://u:x,y/SECRET@a:2379,http://b:2379", "http://a:2379,http://b:2379"},
		{"list without schemes", "a:2181,b:2181", "a:2181,b:2181"},
		{"host:port with user information", "u:x,y/SECRET@a:2181", "a:2181"},
		{"list without schemes, password with ,", "a:2181,u:x,SECRET@b:2181", "b:2181"},
		{"schemeless, then a URL", "u:x,SECRET@a:1,http://u:SECRET@b:2", "a:1,http://b:2"},
		{"postgres", "postgres://app:s/e,c@ret@db.example:5432/app?sslmode=require", "postgres://db.example:5432/app?sslmode=require"},
		{"empty", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Redact(tc.addr)
			if got != tc.want {
				t.Errorf("Redact(%q) = %q, want %q", tc.addr, got, tc.want)
			}
			for _, part := range []string{"SECRET", "ret@", "x,y", "a/b", "ab/cd", "ab,cd"} {
				if strings.Contains(got, part) {
					t.Errorf("Redact(%q) = %q shows %q", tc.addr, got, part)
				}
			}
		})
	}
}

// TestSplitUserinfo: the user information is split off before anything
// parses the URL, so that a password with "/", "," or "@" reaches the
// store whole, and the rest of the URL parses without it.
func TestSplitUserinfo(t *testing.T) {
	for _, tc := range []struct {
		name, raw                   string
		stripped, user, password    string
		hasPassword, hasInformation bool
	}{
		{"none", "redis://host:6379/0", "redis://host:6379/0", "", "", false, false},
		{"password only", "redis://:pw@host:6379/0", "redis://host:6379/0", "", "pw", true, true},
		{"user only", "redis://leaderrun@host", "redis://host", "leaderrun", "", false, true},
		{"base64 password", "redis://:ab/cd+e=@host/0", "redis://host/0", "", "ab/cd+e=", true, true},
		{"password with , and @", "rediss://u:a,b@c@host:6380", "rediss://host:6380", "u", "a,b@c", true, true},
		{"encoded password", "redis://u%40x:a%2Fb%3Ac@host", "redis://host", "u@x", "a/b:c", true, true},
		{"invalid escape kept as written", "redis://:50%off@host", "redis://host", "", "50%off", true, true},
		{"unix", "unix://u:p/w@/run/redis@main.sock?db=1", "unix:///run/redis@main.sock?db=1", "u", "p/w", true, true},
		{"unix without user information", "unix:///run/redis@main.sock", "unix:///run/redis@main.sock", "", "", false, false},
		{"no scheme", "host:6379", "host:6379", "", "", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stripped, user, password, hasPassword, ok := SplitUserinfo(tc.raw)
			if stripped != tc.stripped || user != tc.user || password != tc.password || hasPassword != tc.hasPassword || ok != tc.hasInformation {
				t.Errorf("SplitUserinfo(%q) = %q, %q, %q, %v, %v; want %q, %q, %q, %v, %v", tc.raw,
					stripped, user, password, hasPassword, ok, tc.stripped, tc.user, tc.password, tc.hasPassword, tc.hasInformation)
			}
		})
	}
}
