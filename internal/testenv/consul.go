package testenv

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ConsulBinary finds the consul binary that scripts/install-consul.sh
// builds (v1.14.8, the last MPL-2.0 release line), or skips the test.
func ConsulBinary(t testing.TB) string {
	t.Helper()
	return Binary(t, "LEADERRUN_CONSUL_BIN", "consul-v1.14.8/bin/consul", "consul")
}

// ConsulOptions tune a Consul server started for a test.
type ConsulOptions struct {
	// ACLToken, if set, turns ACLs on with a default policy of deny and
	// this initial management token. Zero value: no ACLs.
	ACLToken string
}

// ConsulAgent is one Consul server process started for a test, on free
// ports and with its data in the test's temp dir. It is stopped when the
// test ends. Its methods are not safe for concurrent use.
type ConsulAgent struct {
	t     testing.TB
	name  string // node name
	addr  string // host:port of the HTTP API
	token string // management token, if ACLs are on
	srv   *Server
}

// StartConsul starts a single dev agent (server and client in one, state
// in memory) on 127.0.0.1 and waits until it can create sessions.
func StartConsul(t testing.TB, opts ConsulOptions) *ConsulAgent {
	t.Helper()
	bin := ConsulBinary(t)
	dir := t.TempDir()
	ports := consulPorts{http: FreePort(t, "127.0.0.1"), lan: FreePort(t, "127.0.0.1"), server: FreePort(t, "127.0.0.1")}
	argv := append(consulArgs(bin, "dev1", "127.0.0.1", ports), "-dev")
	if opts.ACLToken != "" {
		argv = append(argv, "-hcl", fmt.Sprintf(`acl { enabled = true, default_policy = "deny", tokens { initial_management = %q } }`, opts.ACLToken))
	}
	a := &ConsulAgent{t: t, name: "dev1", addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports.http)),
		token: opts.ACLToken, srv: &Server{Name: "consul dev1", Argv: argv, Log: filepath.Join(dir, "consul.log")}}
	t.Cleanup(a.Stop)
	a.Start()
	return a
}

// StartConsulCluster starts n servers (at most 9) on 127.0.0.1,
// 127.0.0.2, ... that elect a leader among themselves, with data on disk so
// that a restarted server rejoins with its state. It waits until every
// server sees the leader.
func StartConsulCluster(t testing.TB, n int) []*ConsulAgent {
	t.Helper()
	if n < 1 || n > 9 {
		t.Fatalf("StartConsulCluster: %d servers, want 1 to 9", n)
	}
	bin := ConsulBinary(t)
	dir := t.TempDir()
	ports := make([]consulPorts, n)
	for i := range ports {
		ip := fmt.Sprintf("127.0.0.%d", i+1)
		ports[i] = consulPorts{http: FreePort(t, ip), lan: FreePort(t, ip), server: FreePort(t, ip)}
	}
	agents := make([]*ConsulAgent, n)
	for i := range agents {
		ip, name := fmt.Sprintf("127.0.0.%d", i+1), fmt.Sprintf("s%d", i+1)
		argv := append(consulArgs(bin, name, ip, ports[i]), "-server",
			"-bootstrap-expect", strconv.Itoa(n), "-data-dir", filepath.Join(dir, name+".data"),
			"-hcl", `gossip_lan { gossip_interval = "100ms", probe_interval = "200ms", probe_timeout = "100ms" }`)
		// A server that starts before the others listen fails to join
		// them, and by default tries again only 30 s later.
		argv = append(argv, "-retry-interval", "500ms")
		for j := range agents {
			if j != i {
				argv = append(argv, "-retry-join", net.JoinHostPort(fmt.Sprintf("127.0.0.%d", j+1), strconv.Itoa(ports[j].lan)))
			}
		}
		agents[i] = &ConsulAgent{t: t, name: name, addr: net.JoinHostPort(ip, strconv.Itoa(ports[i].http)),
			srv: &Server{Name: "consul " + name, Argv: argv, Log: filepath.Join(dir, name+".log")}}
		t.Cleanup(agents[i].Stop)
	}
	// A server elects no leader before bootstrap-expect servers run, so
	// start them all before waiting for any.
	for _, a := range agents {
		a.spawn()
	}
	waitConsulReady(t, agents)
	return agents
}

type consulPorts struct{ http, lan, server int }

func consulArgs(bin, node, ip string, p consulPorts) []string {
	return []string{bin, "agent", "-node", node, "-bind", ip, "-client", ip, "-disable-host-node-id",
		"-hcl", fmt.Sprintf("ports { http = %d, serf_lan = %d, server = %d, serf_wan = -1, dns = -1, grpc = -1, grpc_tls = -1, https = -1 }",
			p.http, p.lan, p.server),
		"-hcl", "disable_update_check = true",
		"-hcl", "performance { raft_multiplier = 1 }",
		"-hcl", `log_level = "warn"`,
	}
}

// Addr is host:port of the agent's HTTP API.
func (a *ConsulAgent) Addr() string { return a.addr }

// URL is the agent's HTTP API base URL.
func (a *ConsulAgent) URL() string { return "http://" + a.addr }

// Node is the agent's node name.
func (a *ConsulAgent) Node() string { return a.name }

// Start starts the agent, if it is not running, on the same ports as
// before, and waits until it is ready. A dev agent starts with empty state.
func (a *ConsulAgent) Start() {
	a.t.Helper()
	a.spawn()
	a.waitReady()
}

func (a *ConsulAgent) spawn() {
	a.t.Helper()
	if err := a.srv.Spawn(); err != nil {
		a.t.Fatal(err)
	}
}

// waitReady polls the agent until it knows a leader and its node's
// serfHealth check passes: Consul refuses to create sessions before. An
// agent is another process with nothing to wait on but its API.
func (a *ConsulAgent) waitReady() {
	a.t.Helper()
	waitConsulReady(a.t, []*ConsulAgent{a})
}

// waitConsulReady waits, for at most 60 s, until every agent is ready
// (see waitReady). An agent that exits meanwhile fails the test at once
// with its log: a cluster short of a server never elects a leader (a
// server expects them all before the first election). On a timeout, every
// agent's log is shown, not only the one that was not ready.
func waitConsulReady(t testing.TB, agents []*ConsulAgent) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var late *ConsulAgent
		var leader, health string
		for _, a := range agents {
			if !a.srv.Running() {
				t.Fatalf("consul %s exited while starting:\n%s", a.name, a.srv.Tail())
			}
			if late != nil {
				continue
			}
			leader, health = a.get("/v1/status/leader"), a.get("/v1/health/node/"+a.name)
			if !strings.Contains(leader, ":") || !strings.Contains(health, `"serfHealth"`) || !strings.Contains(health, `"passing"`) {
				late = a
			}
		}
		if late == nil {
			return
		}
		if time.Now().After(deadline) {
			var logs strings.Builder
			for _, a := range agents {
				fmt.Fprintf(&logs, "--- consul %s:\n%s\n", a.name, a.srv.Tail())
			}
			t.Fatalf("consul %s not ready after 60s (leader %q, health %q):\n%s", late.name, leader, health, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// get returns the body of a 200 answer to path, or "".
func (a *ConsulAgent) get(path string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.URL()+path, nil)
	if err != nil {
		return ""
	}
	if a.token != "" {
		req.Header.Set("X-Consul-Token", a.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return ""
	}
	return string(body)
}

// Stop stops the agent with SIGTERM, or SIGKILL if it is still running 10 s
// later, and waits until it is gone. Stopping a stopped agent does nothing.
func (a *ConsulAgent) Stop() { a.srv.Stop() }

// Pid is the agent's process id, 0 if it is not running.
func (a *ConsulAgent) Pid() int { return a.srv.Pid() }

// Restart stops the agent and starts it again on the same ports.
func (a *ConsulAgent) Restart() {
	a.t.Helper()
	a.Stop()
	a.Start()
}
