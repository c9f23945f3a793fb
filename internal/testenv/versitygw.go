package testenv

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// VersityGWVersion is the versitygw that scripts/install-versitygw.sh
// builds.
const VersityGWVersion = "v1.8.0"

// S3Region is the Region of the test server and of every test client.
const S3Region = "us-east-1"

// versityStartTimeout bounds the wait for a new gateway to answer; it
// starts in well under a second.
const versityStartTimeout = 30 * time.Second

// VersityGWBinary finds versitygw: $LEADERRUN_VERSITYGW_BIN, the cache
// that scripts/install-versitygw.sh fills, or PATH. It skips the test if
// none is found, or fails it under CI=true.
func VersityGWBinary(t testing.TB) string {
	t.Helper()
	return Binary(t, "LEADERRUN_VERSITYGW_BIN", "versitygw-"+VersityGWVersion+"/versitygw", "versitygw")
}

// VersityGW is versitygw, an S3-compatible server, with its posix backend
// on a temporary directory (a bucket is a directory, an object a file,
// metadata and ETags in extended attributes), listening on 127.0.0.1 and
// a free port only (its default is every interface), its WebUI, admin
// and website servers off. Its one account, the root account, has a
// random access key and secret, handed to it in its environment, not its
// arguments. It is stopped when the test ends; Stop, Start and Restart
// keep its directory, as an operator's restart would.
type VersityGW struct {
	// AccessKey and SecretKey are the root account's credentials.
	AccessKey, SecretKey string
	// Dir is the posix backend's directory: one directory per bucket.
	Dir string

	t    scope
	addr string
	srv  *Server
}

// StartVersityGW starts a gateway and waits until it answers. Its port is
// chosen free just before it binds it; if another process takes it in
// between, it starts again on another.
func StartVersityGW(t testing.TB) *VersityGW {
	t.Helper()
	bin := VersityGWBinary(t)
	dir := t.TempDir()
	g := &VersityGW{AccessKey: "LR" + randomHex(9), SecretKey: randomHex(20), Dir: filepath.Join(dir, "data"),
		t: t}
	if err := os.Mkdir(g.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "ROOT_ACCESS_KEY_ID="+g.AccessKey, "ROOT_SECRET_ACCESS_KEY="+g.SecretKey)
	var err error
	for try := 0; try < 3; try++ {
		g.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t, "127.0.0.1")))
		g.srv = &Server{Name: "versitygw " + g.addr, Env: env, Log: filepath.Join(dir, "versitygw.log"),
			Argv:         []string{bin, "--port", g.addr, "--region", S3Region, "--health", "/health", "posix", g.Dir},
			Ready:        g.serving,
			StartTimeout: versityStartTimeout}
		if err = g.srv.Start(); err == nil {
			t.Cleanup(g.srv.Stop)
			return g
		}
	}
	t.Fatalf("start versitygw: %v", err)
	return nil
}

// Addr is host:port of the gateway.
func (g *VersityGW) Addr() string { return g.addr }

// URL is the gateway's endpoint, http://127.0.0.1:PORT.
func (g *VersityGW) URL() string { return "http://" + g.addr }

// Env is the environment of a process that reaches the gateway with the
// root account: static credentials, the Region and the endpoint, and
// nothing read from the host's AWS files or instance metadata.
func (g *VersityGW) Env() []string {
	return []string{"AWS_ACCESS_KEY_ID=" + g.AccessKey, "AWS_SECRET_ACCESS_KEY=" + g.SecretKey, "AWS_REGION=" + S3Region,
		"AWS_ENDPOINT_URL_S3=" + g.URL(), "AWS_CONFIG_FILE=" + os.DevNull, "AWS_SHARED_CREDENTIALS_FILE=" + os.DevNull,
		"AWS_EC2_METADATA_DISABLED=true"}
}

// Credentials are the root account's, for a client in the test.
func (g *VersityGW) Credentials() aws.CredentialsProvider {
	return credentials.NewStaticCredentialsProvider(g.AccessKey, g.SecretKey, "")
}

// Client is an S3 client of the root account's, path-style, as an
// operator's aws s3api would be.
func (g *VersityGW) Client() *s3.Client {
	return s3.New(s3.Options{Region: S3Region, BaseEndpoint: aws.String(g.URL()), UsePathStyle: true,
		Credentials: g.Credentials(), RetryMaxAttempts: 1})
}

// CreateBucket creates a bucket named name.
func (g *VersityGW) CreateBucket(t testing.TB, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := g.Client().CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(name)}); err != nil {
		t.Fatalf("create bucket %s: %v", name, err)
	}
}

// DeleteObject deletes the object key of bucket, as an operator would;
// one that does not exist is no error.
func (g *VersityGW) DeleteObject(t testing.TB, bucket, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := g.Client().DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)}); err != nil {
		t.Fatalf("delete %s/%s: %v", bucket, key, err)
	}
}

// Stop stops the gateway with SIGTERM, as a service manager would, and
// waits until it is gone.
func (g *VersityGW) Stop() { g.srv.Stop() }

// Kill kills the gateway with SIGKILL and waits until it is gone.
func (g *VersityGW) Kill() { g.srv.Kill() }

// Start starts a stopped gateway again, on the same port and directory,
// and waits until it answers.
func (g *VersityGW) Start() {
	g.t.Helper()
	if err := g.srv.Start(); err != nil {
		g.t.Fatalf("%v", err)
	}
}

// Restart is Stop then Start.
func (g *VersityGW) Restart() {
	g.Stop()
	g.Start()
}

// Pid is the gateway's process id, 0 if it is not running.
func (g *VersityGW) Pid() int { return g.srv.Pid() }

// serving asks the gateway's health path, which answers 200 once it
// serves.
func (g *VersityGW) serving() error {
	c := &http.Client{Timeout: time.Second}
	resp, err := c.Get(g.URL() + "/health")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("health: %s", resp.Status)
	}
	return nil
}
