package testenv

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// AzuriteVersion is the Azurite that scripts/install-azurite.sh installs.
const AzuriteVersion = "3.35.0"

// azuriteStartTimeout bounds the wait for a new blob service to answer:
// Node starts in a second or two on two busy cores.
const azuriteStartTimeout = 60 * time.Second

// AzuriteBinary finds Azurite's blob service launcher (azurite-blob):
// $LEADERRUN_AZURITE_BIN, the cache that scripts/install-azurite.sh fills,
// or PATH. It skips the test if none is found, or fails it under CI=true.
func AzuriteBinary(t testing.TB) string {
	t.Helper()
	return Binary(t, "LEADERRUN_AZURITE_BIN", "azurite-"+AzuriteVersion+"/node_modules/.bin/azurite-blob", "azurite-blob")
}

// Azurite is Azurite's blob service, alone (no queue or table service), on
// 127.0.0.1 and a free port, with its data in a temporary directory. Its
// one storage account has a random name and key, so that no test passes
// on the emulator's well-known credentials and a leaked key can be looked
// for. Requests of every API version are accepted (--skipApiVersionCheck:
// the Go SDK speaks a newer version than the emulator knows); strict mode
// is kept, so that a header or parameter Azurite does not implement is an
// error, not silently ignored. Telemetry is off. It is stopped when the
// test ends.
type Azurite struct {
	// Account and Key are the storage account's name and key (base64).
	Account, Key string

	t    scope
	args []string
	env  []string
	addr string
	log  string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been reaped
}

// StartAzurite starts a blob service and waits until it answers. Ports are
// chosen free just before Node binds them; if another process takes one
// in between, it starts again on another.
func StartAzurite(t testing.TB) *Azurite {
	t.Helper()
	bin := AzuriteBinary(t)
	key := make([]byte, 64)
	_, _ = rand.Read(key)
	dir := t.TempDir()
	a := &Azurite{
		Account: "lr" + randomHex(6),
		Key:     base64.StdEncoding.EncodeToString(key),
		t:       t,
		log:     filepath.Join(dir, "azurite.log"),
	}
	// AZURITE_ACCOUNTS replaces the well-known development account.
	a.env = append(os.Environ(), "AZURITE_ACCOUNTS="+a.Account+":"+a.Key)
	var err error
	for try := 0; try < 3; try++ {
		port := FreePort(t, "127.0.0.1")
		a.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		// --location keeps the data on disk, so that Restart keeps it
		// as an operator's restart would; the directory is the test's.
		a.args = []string{bin, "--blobHost", "127.0.0.1", "--blobPort", strconv.Itoa(port),
			"--location", dir, "--skipApiVersionCheck", "--disableTelemetry", "--silent"}
		if err = a.spawn(); err != nil {
			t.Fatal(err)
		}
		if err = a.waitServing(time.Now().Add(azuriteStartTimeout)); err == nil {
			t.Cleanup(func() { a.terminate(syscall.SIGTERM, 10*time.Second) })
			return a
		}
		a.terminate(syscall.SIGKILL, 10*time.Second)
	}
	t.Fatalf("start azurite: %v", err)
	return nil
}

// Addr is host:port of the blob service.
func (a *Azurite) Addr() string { return a.addr }

// AccountURL is the account's blob endpoint, path-style as the emulator
// serves it: http://127.0.0.1:PORT/ACCOUNT.
func (a *Azurite) AccountURL() string { return "http://" + a.addr + "/" + a.Account }

// AccountURLVia is AccountURL through addr (a proxy in front of Addr).
func (a *Azurite) AccountURLVia(addr string) string { return "http://" + addr + "/" + a.Account }

// ConnectionString is the account's connection string, as the Azure
// portal shows it, with the emulator's blob endpoint.
func (a *Azurite) ConnectionString() string { return a.ConnectionStringVia(a.addr) }

// ConnectionStringVia is ConnectionString through addr.
func (a *Azurite) ConnectionStringVia(addr string) string {
	return fmt.Sprintf("DefaultEndpointsProtocol=http;AccountName=%s;AccountKey=%s;BlobEndpoint=%s;",
		a.Account, a.Key, a.AccountURLVia(addr))
}

// Stop stops the service with SIGTERM, as a service manager would, and
// waits until it is gone.
func (a *Azurite) Stop() { a.terminate(syscall.SIGTERM, 10*time.Second) }

// Start starts a stopped service again, with its data, and waits until it
// answers.
func (a *Azurite) Start() {
	a.t.Helper()
	if err := a.spawn(); err != nil {
		a.t.Fatalf("%v", err)
	}
	if err := a.waitServing(time.Now().Add(azuriteStartTimeout)); err != nil {
		a.t.Fatalf("%v", err)
	}
}

// Restart is Stop then Start.
func (a *Azurite) Restart() {
	a.Stop()
	a.Start()
}

// Pid is the service's process id, 0 if it is not running.
func (a *Azurite) Pid() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cmd == nil {
		return 0
	}
	return a.cmd.Process.Pid
}

func (a *Azurite) spawn() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cmd != nil {
		return fmt.Errorf("azurite %s is already running", a.addr)
	}
	logf, err := os.OpenFile(a.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(a.args[0], a.args[1:]...)
	cmd.Env = a.env
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = serverProcAttr()
	done, err := startServer(cmd)
	if err != nil {
		return fmt.Errorf("start azurite: %w", err)
	}
	a.cmd, a.done = cmd, done
	return nil
}

// terminate signals the service, waits up to grace for it to exit, then
// kills it.
func (a *Azurite) terminate(sig syscall.Signal, grace time.Duration) {
	a.mu.Lock()
	cmd, done := a.cmd, a.done
	a.cmd, a.done = nil, nil
	a.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
		return
	case <-time.After(grace):
	}
	_ = cmd.Process.Kill()
	<-done
}

// waitServing polls the service until it answers an HTTP request (any
// status: an unsigned request is refused, which is an answer): a server
// in another process offers nothing else to wait on.
func (a *Azurite) waitServing(deadline time.Time) error {
	a.mu.Lock()
	done := a.done
	a.mu.Unlock()
	c := &http.Client{Timeout: time.Second}
	for {
		select {
		case <-done:
			return fmt.Errorf("azurite %s exited before it served:\n%s", a.addr, a.tail())
		default:
		}
		resp, err := c.Get(a.AccountURL() + "?comp=properties&restype=service")
		if err == nil {
			resp.Body.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("azurite %s does not answer after %v (last: %v):\n%s", a.addr, azuriteStartTimeout, err, a.tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// tail is the end of the service's log, for failure messages.
func (a *Azurite) tail() string {
	data, _ := os.ReadFile(a.log)
	if len(data) > 4000 {
		data = data[len(data)-4000:]
	}
	return string(data)
}
