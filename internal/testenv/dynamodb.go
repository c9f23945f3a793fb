package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// DynamoDBRegion is the Region every test client names; the emulator
// keeps one set of tables whatever the Region.
const DynamoDBRegion = "us-east-1"

var ddbemu struct {
	once sync.Once
	path string
	err  error
}

// DynamoDBEmulatorBinary returns the DynamoDB emulator of
// internal/testenv/ddbemu (minidyn behind a front that plays IAM; a module
// of its own, so that minidyn stays out of leaderrun's go.mod):
// $LEADERRUN_DYNAMODB_EMULATOR_BIN if set (what scripts/test.sh builds
// before the tests), else built once per test process into the cache the
// install scripts use. A missing Go toolchain fails the test under CI=true
// and skips it otherwise.
func DynamoDBEmulatorBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("LEADERRUN_DYNAMODB_EMULATOR_BIN"); p != "" {
		return p
	}
	ddbemu.once.Do(func() {
		dir := filepath.Join(cacheDir(), "ddbemu")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			ddbemu.err = err
			return
		}
		// Built beside and renamed into place: another test process may be
		// running the previous build.
		tmp := filepath.Join(dir, fmt.Sprintf("ddbemu.%d", os.Getpid()))
		_, file, _, _ := runtime.Caller(0)
		cmd := exec.Command("go", "build", "-o", tmp, ".")
		cmd.Dir = filepath.Join(filepath.Dir(file), "ddbemu")
		cmd.Env = append(os.Environ(), "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			ddbemu.err = fmt.Errorf("build the DynamoDB emulator: %w\n%s", err, out)
			return
		}
		ddbemu.path = filepath.Join(dir, "ddbemu")
		ddbemu.err = os.Rename(tmp, ddbemu.path)
	})
	if ddbemu.err != nil {
		Missing(t, ddbemu.err.Error())
	}
	return ddbemu.path
}

// DynamoDB is one emulator process on a free loopback port, stopped when
// the test ends. Its tables live in its memory only: Stop and Start keep
// its port, not its tables.
type DynamoDB struct {
	// URL is the endpoint: http://127.0.0.1:PORT.
	URL string

	srv *Server
}

// StartDynamoDB starts an emulator and waits until it accepts connections.
func StartDynamoDB(t testing.TB) *DynamoDB {
	t.Helper()
	bin := DynamoDBEmulatorBinary(t)
	dir := t.TempDir()
	d := &DynamoDB{}
	var err error
	for try := 0; try < 3; try++ {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t, "127.0.0.1")))
		d.URL = "http://" + addr
		d.srv = &Server{Name: "the DynamoDB emulator", Argv: []string{bin, "-listen", addr}, Log: filepath.Join(dir, "ddbemu.log"),
			StopGrace: 5 * time.Second, StartTimeout: 30 * time.Second, Ready: func() error {
				c, err := net.DialTimeout("tcp", addr, time.Second)
				if err == nil {
					c.Close()
				}
				return err
			}}
		if err = d.srv.Start(); err == nil {
			t.Cleanup(d.srv.Stop)
			return d
		}
	}
	t.Fatal(err)
	return nil
}

// Addr is host:port of the emulator.
func (d *DynamoDB) Addr() string { return strings.TrimPrefix(d.URL, "http://") }

// Stop stops the emulator (its tables are gone) and waits until it is.
func (d *DynamoDB) Stop(t testing.TB) { d.srv.Stop() }

// Start starts a stopped emulator again on its port, without tables.
func (d *DynamoDB) Start(t testing.TB) {
	t.Helper()
	if err := d.srv.Start(); err != nil {
		t.Fatal(err)
	}
}

// Pid is the emulator's process id, 0 if it is not running.
func (d *DynamoDB) Pid() int { return d.srv.Pid() }

// DynamoDBEnv is the environment of a process that reaches the emulator
// with access key id akid (see ddbemu for the keys that play IAM): static
// credentials and the Region, and nothing read from the host's AWS files
// or its instance metadata.
func DynamoDBEnv(akid string) []string {
	return []string{
		"AWS_ACCESS_KEY_ID=" + akid,
		"AWS_SECRET_ACCESS_KEY=test-secret",
		"AWS_REGION=" + DynamoDBRegion,
		"AWS_CONFIG_FILE=" + os.DevNull,
		"AWS_SHARED_CREDENTIALS_FILE=" + os.DevNull,
		"AWS_EC2_METADATA_DISABLED=true",
	}
}

// Credentials are static credentials with access key id akid.
func (d *DynamoDB) Credentials(akid string) aws.CredentialsProvider {
	return credentials.NewStaticCredentialsProvider(akid, "test-secret", "")
}

// Client is an SDK client of the emulator, as an operator's tools would
// be, with every permission.
func (d *DynamoDB) Client() *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		Region:       DynamoDBRegion,
		BaseEndpoint: aws.String(d.URL),
		Credentials:  d.Credentials("admin"),
	})
}

// DeleteItem deletes the item name of table by hand, as an operator would.
func (d *DynamoDB) DeleteItem(t testing.TB, table, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := d.Client().DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName: aws.String(table),
		Key:       map[string]types.AttributeValue{"name": &types.AttributeValueMemberS{Value: name}},
	})
	if err != nil {
		t.Fatalf("delete item %s of table %s: %v", name, table, err)
	}
}

// Item reads the item name of table; nil if there is none.
func (d *DynamoDB) Item(t testing.TB, table, name string) map[string]types.AttributeValue {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := d.Client().GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(table),
		Key:            map[string]types.AttributeValue{"name": &types.AttributeValueMemberS{Value: name}},
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		t.Fatalf("get item %s of table %s: %v", name, table, err)
	}
	return out.Item
}
