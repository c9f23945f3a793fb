// Package testenv starts the real servers and processes that tests need:
// etcd members, Consul agents, PostgreSQL clusters and PgBouncer,
// kube-apiservers, ZooKeeper ensembles, Redis with Sentinel, Azurite, a
// DynamoDB emulator, a TCP proxy that can stall or cut a link, and
// leaderrun itself. Servers come from what the scripts/install-*.sh
// scripts build or install, found through the LEADERRUN_*_BIN variables
// that scripts/test.sh sets.
//
// A missing binary skips the test on a developer's machine and fails it
// when CI=true: CI must never pass by not testing.
package testenv

import (
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Binary finds a server binary: $envVar, then the cache that the install
// scripts fill ($LEADERRUN_CACHE, default ~/.cache/leaderrun), then PATH.
// It skips the test if none is found, or fails it under CI=true.
func Binary(t testing.TB, envVar, cacheRel, name string) string {
	t.Helper()
	if p := os.Getenv(envVar); p != "" {
		return p
	}
	if p := filepath.Join(cacheDir(), cacheRel); isExecutable(p) {
		return p
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	Missing(t, name+" not found: set "+envVar+" or run scripts/test.sh, which installs it")
	return ""
}

// packaged finds a server binary that comes from a Debian package:
// $envVar, then PATH, then where the package puts it (debian, which may
// not be in every PATH). It skips the test if none is found, or fails it
// under CI=true, naming the install script.
func packaged(t testing.TB, envVar, name, debian, script string) string {
	t.Helper()
	if p := os.Getenv(envVar); p != "" {
		return p
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if isExecutable(debian) {
		return debian
	}
	Missing(t, name+" not found: set "+envVar+" or run scripts/"+script)
	return ""
}

// cacheDir is where the install scripts put the servers they build:
// $LEADERRUN_CACHE, default ~/.cache/leaderrun.
func cacheDir() string {
	if cache := os.Getenv("LEADERRUN_CACHE"); cache != "" {
		return cache
	}
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, _ := os.UserHomeDir()
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "leaderrun")
}

// Missing skips the test, or fails it when CI=true.
func Missing(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and a required server is missing: %s", why)
	}
	t.Skip(why)
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// scope is what starting a server needs of its owner: a test (any
// testing.TB), or the test process itself for a server that all the tests
// of a package share (see SharedKube). Fatalf ends the start-up; Cleanup
// stops the server when the owner ends.
type scope interface {
	Helper()
	TempDir() string
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// FreePort returns a TCP port on ip that is free now, for a server the
// test starts; see freePort.
func FreePort(t testing.TB, ip string) int {
	t.Helper()
	return freePort(t, ip)
}

// freePort returns a TCP port on ip that nothing listens on now and that
// this process has not handed out before, chosen at random below the
// kernel's ephemeral range (ip_local_port_range) when there is room below
// it. A port from the ephemeral range, as a listen on port 0 gives, can be
// taken between our check and the server's bind by any outgoing
// connection on the host, and the tests of other packages run beside with
// hundreds of them: a Consul agent failed to start in CI with "bind:
// address already in use" that way. Below the range, only another test's
// pick can take it, and picks of this process never repeat: a Consul
// agent's three ports are all picked before it binds any, and once two of
// them were the same random port ("Serf Advertise LAN address ... already
// configured for HTTP").
func freePort(t scope, ip string) int {
	t.Helper()
	if low := ephemeralLow(); low > portFloor+1000 {
		for range 100 {
			port := portFloor + rand.IntN(low-portFloor)
			if claim(port) && listenable(ip, port) {
				return port
			}
		}
	}
	for range 100 {
		l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			t.Fatalf("free port on %s: %v", ip, err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if claim(port) {
			return port
		}
	}
	t.Fatalf("free port on %s: every port offered was handed out before", ip)
	return 0
}

// handedOut holds every port freePort has returned in this process.
var handedOut sync.Map

// claim records port as handed out and reports whether it was not before.
func claim(port int) bool {
	_, before := handedOut.LoadOrStore(port, true)
	return !before
}

func listenable(ip string, port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// portFloor is the lowest port freePort picks: above the ports that
// services commonly listen on.
const portFloor = 10000

// ephemeralLow is the first port of the kernel's ephemeral range, 0 if
// unknown (not Linux).
func ephemeralLow() int {
	data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(data))
	if len(fields) == 0 {
		return 0
	}
	low, _ := strconv.Atoi(fields[0])
	return low
}
