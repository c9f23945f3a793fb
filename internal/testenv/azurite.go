package testenv

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
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
	addr string
	srv  *Server
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
	}
	a.srv = &Server{Name: "azurite", Log: filepath.Join(dir, "azurite.log"), StartTimeout: azuriteStartTimeout, Ready: a.serving,
		// AZURITE_ACCOUNTS replaces the well-known development account.
		Env: append(os.Environ(), "AZURITE_ACCOUNTS="+a.Account+":"+a.Key)}
	var err error
	for try := 0; try < 3; try++ {
		port := FreePort(t, "127.0.0.1")
		a.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		// --location keeps the data on disk, so that Restart keeps it
		// as an operator's restart would; the directory is the test's.
		a.srv.Argv = []string{bin, "--blobHost", "127.0.0.1", "--blobPort", strconv.Itoa(port),
			"--location", dir, "--skipApiVersionCheck", "--disableTelemetry", "--silent"}
		if err = a.srv.Start(); err == nil {
			t.Cleanup(a.srv.Stop)
			return a
		}
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
func (a *Azurite) Stop() { a.srv.Stop() }

// Start starts a stopped service again, with its data, and waits until it
// answers.
func (a *Azurite) Start() {
	a.t.Helper()
	if err := a.srv.Start(); err != nil {
		a.t.Fatalf("%v", err)
	}
}

// Restart is Stop then Start.
func (a *Azurite) Restart() {
	a.Stop()
	a.Start()
}

// Pid is the service's process id, 0 if it is not running.
func (a *Azurite) Pid() int { return a.srv.Pid() }

// serving asks the service for its properties: any answer will do (an
// unsigned request is refused, which is an answer).
func (a *Azurite) serving() error {
	c := &http.Client{Timeout: time.Second}
	resp, err := c.Get(a.AccountURL() + "?comp=properties&restype=service")
	if err == nil {
		resp.Body.Close()
	}
	return err
}
