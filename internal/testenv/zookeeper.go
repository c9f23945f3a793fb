package testenv

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// Debian's zookeeper package (3.8) puts the server's jar, whose manifest
// names every library it needs, in /usr/share/java; slf4j-simple, from a
// package it depends on, turns the server's log into lines on stderr.
const (
	debianZooKeeperJar = "/usr/share/java/zookeeper.jar"
	debianSlf4jSimple  = "/usr/share/java/slf4j-simple.jar"
)

// ZooKeeperTickTime is the tick of the test servers: ZooKeeper grants
// session timeouts of 2 to 20 ticks by default, expires sessions in steps
// of one tick, and counts its own failure detection in ticks, so a short
// tick keeps the tests short. The servers raise the longest session
// timeout to ZooKeeperMaxSessionTimeout, so that tests can also use the
// timings of a real deployment.
const (
	ZooKeeperTickTime          = 200 * time.Millisecond
	ZooKeeperMinSessionTimeout = 2 * ZooKeeperTickTime
	ZooKeeperMaxSessionTimeout = 60 * time.Second
)

// zkStartTimeout bounds the wait for a new server or ensemble to serve:
// a JVM starts in seconds on two busy cores.
const zkStartTimeout = 60 * time.Second

// ZooKeeperRuntime finds java and the class path of a ZooKeeper server:
// $LEADERRUN_JAVA or java on PATH, and $LEADERRUN_ZOOKEEPER_CLASSPATH
// (what scripts/install-zookeeper.sh prints) or Debian's package. It skips
// the test if either is missing, or fails it under CI=true.
func ZooKeeperRuntime(t testing.TB) (java, classpath string) {
	t.Helper()
	java = os.Getenv("LEADERRUN_JAVA")
	if java == "" {
		p, err := exec.LookPath("java")
		if err != nil {
			Missing(t, "java not found: set LEADERRUN_JAVA or run scripts/install-zookeeper.sh")
			return "", ""
		}
		java = p
	}
	classpath = os.Getenv("LEADERRUN_ZOOKEEPER_CLASSPATH")
	if classpath == "" {
		if _, err := os.Stat(debianZooKeeperJar); err != nil {
			Missing(t, "ZooKeeper not found: set LEADERRUN_ZOOKEEPER_CLASSPATH or run scripts/install-zookeeper.sh")
			return "", ""
		}
		classpath = debianZooKeeperJar
		if _, err := os.Stat(debianSlf4jSimple); err == nil {
			classpath += ":" + debianSlf4jSimple
		}
	}
	return java, classpath
}

// ZooKeeper is a real ZooKeeper server, standalone or an ensemble of three,
// on 127.0.0.1 with data in the test's temporary directories. It is stopped
// when the test ends.
type ZooKeeper struct {
	Members []*ZooKeeperMember

	java, classpath string
}

// ZooKeeperMember is one server process. Stop, Kill, Start and Restart keep
// its id, ports and data, as an operator's restart would.
type ZooKeeperMember struct {
	// ID is the server's myid (1 for a standalone server).
	ID int
	// Addr is the client address, 127.0.0.1:port.
	Addr string
	srv  *Server
}

// StartZooKeeper starts a standalone server (members 1) or an ensemble of
// three, with a tick of ZooKeeperTickTime, and waits until every member
// serves clients (an ensemble: with a leader elected). Ports are chosen
// free just before the JVMs bind them; if another process takes one in
// between, it starts again on other ports.
func StartZooKeeper(t testing.TB, members int) *ZooKeeper {
	t.Helper()
	return StartZooKeeperTick(t, members, ZooKeeperTickTime)
}

// StartZooKeeperTick is StartZooKeeper with another tick, such as
// ZooKeeper's default of 2 s; the minimum session timeout is then two
// ticks, as by default.
func StartZooKeeperTick(t testing.TB, members int, tick time.Duration) *ZooKeeper {
	t.Helper()
	if members != 1 && members != 3 {
		t.Fatalf("StartZooKeeper: %d members; want 1 or 3", members)
	}
	if tick < time.Millisecond || 2*tick > ZooKeeperMaxSessionTimeout {
		t.Fatalf("StartZooKeeper: tick %v; want 1ms to %v", tick, ZooKeeperMaxSessionTimeout/2)
	}
	java, classpath := ZooKeeperRuntime(t)
	var lastErr error
	for try := 0; try < 3; try++ {
		z, err := newZooKeeper(t, java, classpath, members, tick)
		if err != nil {
			t.Fatal(err)
		}
		if lastErr = z.start(); lastErr == nil {
			t.Cleanup(z.stop)
			return z
		}
		z.stop()
	}
	t.Fatalf("start zookeeper: %v", lastErr)
	return nil
}

func newZooKeeper(t testing.TB, java, classpath string, members int, tick time.Duration) (*ZooKeeper, error) {
	z := &ZooKeeper{java: java, classpath: classpath}
	var quorum []string
	for i := 1; i <= members; i++ {
		z.Members = append(z.Members, &ZooKeeperMember{ID: i, Addr: fmt.Sprintf("127.0.0.1:%d", FreePort(t, "127.0.0.1"))})
		if members > 1 {
			quorum = append(quorum, fmt.Sprintf("server.%d=127.0.0.1:%d:%d", i, FreePort(t, "127.0.0.1"), FreePort(t, "127.0.0.1")))
		}
	}
	for _, m := range z.Members {
		dir := t.TempDir()
		data := filepath.Join(dir, "data")
		if err := os.Mkdir(data, 0o700); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(data, "myid"), fmt.Appendf(nil, "%d\n", m.ID), 0o600); err != nil {
			return nil, err
		}
		_, port, _ := net.SplitHostPort(m.Addr)
		cfg := []string{
			fmt.Sprintf("tickTime=%d", tick.Milliseconds()),
			fmt.Sprintf("maxSessionTimeout=%d", ZooKeeperMaxSessionTimeout.Milliseconds()),
			// Followers: 4 s to join, 2 s without the leader before they give up on it.
			"initLimit=20",
			"syncLimit=10",
			"dataDir=" + data,
			"clientPort=" + port,
			"clientPortAddress=127.0.0.1",
			// Tests open hundreds of sessions from one address.
			"maxClientCnxns=0",
			"admin.enableServer=false",
			// srvr finds the leader and tells when a server serves; cons
			// counts a connection's requests.
			"4lw.commands.whitelist=*",
			// The disk is shared with other tests: no fsync per
			// transaction (a killed JVM still leaves its log in the
			// page cache, so restarts keep the data) and small log files.
			"forceSync=no",
			"preAllocSize=1024",
		}
		cfg = append(cfg, quorum...)
		path := filepath.Join(dir, "zoo.cfg")
		if err := os.WriteFile(path, []byte(strings.Join(cfg, "\n")+"\n"), 0o600); err != nil {
			return nil, err
		}
		m.srv = &Server{Name: fmt.Sprintf("zookeeper member %d", m.ID), Log: filepath.Join(dir, "zookeeper.log"),
			StartTimeout: zkStartTimeout, Ready: func() error { _, err := m.Mode(); return err }}
		m.srv.Argv = []string{java,
			// A small heap and a quick start: these servers hold a few
			// thousand znodes at most.
			"-Xmx64m", "-Xss512k", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData",
			"-Djava.net.preferIPv4Stack=true",
			"-Dzookeeper.jmx.log4j.disable=true",
			"-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
			"-Dorg.slf4j.simpleLogger.showDateTime=true",
			"-cp", classpath,
			"org.apache.zookeeper.server.quorum.QuorumPeerMain", path,
		}
	}
	return z, nil
}

func (z *ZooKeeper) start() error {
	for _, m := range z.Members {
		if err := m.srv.Spawn(); err != nil {
			return err
		}
	}
	return z.waitServing(time.Now().Add(zkStartTimeout))
}

func (z *ZooKeeper) stop() {
	var wg sync.WaitGroup
	for _, m := range z.Members {
		wg.Go(m.srv.Stop)
	}
	wg.Wait()
}

// Servers are the members' client addresses, host:port.
func (z *ZooKeeper) Servers() []string {
	s := make([]string, len(z.Members))
	for i, m := range z.Members {
		s[i] = m.Addr
	}
	return s
}

// CLICommand is the argv of ZooKeeper's own command-line client (what
// zkCli.sh runs) against the members, without its command: append one,
// such as "deleteall", "/leaderrun/x", and it runs it and exits.
func (z *ZooKeeper) CLICommand() []string {
	return []string{z.java, "-Xmx64m", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData",
		"-Dorg.slf4j.simpleLogger.defaultLogLevel=error",
		"-cp", z.classpath, "org.apache.zookeeper.ZooKeeperMain",
		"-server", strings.Join(z.Servers(), ",")}
}

// CLI runs ZooKeeper's command-line client with args (a command such as
// "deleteall", "/leaderrun/x") and returns what it printed. The client
// exits 0 even when its command fails: look at the output.
func (z *ZooKeeper) CLI(t testing.TB, args ...string) (string, error) {
	t.Helper()
	argv := append(z.CLICommand(), args...)
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	return string(out), err
}

// WaitServing waits until every running member serves clients.
func (z *ZooKeeper) WaitServing(t testing.TB) {
	t.Helper()
	if err := z.waitServing(time.Now().Add(zkStartTimeout)); err != nil {
		t.Fatal(err)
	}
}

func (z *ZooKeeper) waitServing(deadline time.Time) error {
	for _, m := range z.Members {
		if m.Pid() == 0 {
			continue
		}
		if err := m.srv.WaitReady(deadline); err != nil {
			return err
		}
	}
	return nil
}

// Leader is the member that the running members agree leads the
// ensemble (the standalone server, alone). It waits for an election if
// one is under way.
func (z *ZooKeeper) Leader(t testing.TB) *ZooKeeperMember {
	t.Helper()
	deadline := time.Now().Add(zkStartTimeout)
	for {
		var leaders []*ZooKeeperMember
		for _, m := range z.Members {
			if mode, _ := m.Mode(); mode == "leader" || mode == "standalone" {
				leaders = append(leaders, m)
			}
		}
		if len(leaders) == 1 {
			return leaders[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no single zookeeper leader after %v (%d claim it)", zkStartTimeout, len(leaders))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop stops the member with SIGTERM, as a service manager would, and
// waits until it is gone.
func (m *ZooKeeperMember) Stop(t testing.TB) {
	t.Helper()
	m.srv.Stop()
}

// Kill stops the member with SIGKILL and waits until it is gone.
func (m *ZooKeeperMember) Kill(t testing.TB) {
	t.Helper()
	m.srv.Kill()
}

// Start starts a stopped member again, with its data, and waits until it
// serves clients.
func (m *ZooKeeperMember) Start(t testing.TB) {
	t.Helper()
	if err := m.srv.Start(); err != nil {
		t.Fatal(err)
	}
}

// Restart is Stop then Start.
func (m *ZooKeeperMember) Restart(t testing.TB) {
	t.Helper()
	m.Stop(t)
	m.Start(t)
}

// Pid is the member's process id, 0 if it is not running.
func (m *ZooKeeperMember) Pid() int { return m.srv.Pid() }

// FourLetter sends a four-letter-word command (srvr, cons, mntr, wchs, ...)
// to the member's client port and returns the answer.
func (m *ZooKeeperMember) FourLetter(cmd string) (string, error) {
	c, err := net.DialTimeout("tcp", m.Addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, cmd); err != nil {
		return "", err
	}
	out, err := io.ReadAll(c)
	return string(out), err
}

var zkMode = regexp.MustCompile(`(?m)^Mode: (\w+)`)

// Mode is what the member says it is: "leader", "follower" or
// "standalone"; an error if it does not serve clients.
func (m *ZooKeeperMember) Mode() (string, error) {
	out, err := m.FourLetter("srvr")
	if err != nil {
		return "", err
	}
	if mm := zkMode.FindStringSubmatch(out); mm != nil {
		return mm[1], nil
	}
	return "", fmt.Errorf("zookeeper %s does not serve: %q", m.Addr, strings.TrimSpace(out))
}
