package cmd

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/s3"
	"github.com/leaderrun/leaderrun/backends/s3/spec"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

// s3Vars are the variables that reach the S3 store, or another: each test
// starts without them.
var s3Vars = []string{"LEADERRUN_BACKEND", "LEADERRUN_ETCD_ENDPOINTS", "ETCDCTL_ENDPOINTS", "LEADERRUN_CONSUL_ADDR", "CONSUL_HTTP_ADDR",
	"LEADERRUN_POSTGRES_URL", "LEADERRUN_ZK_SERVERS", "LEADERRUN_DYNAMODB_TABLE", "LEADERRUN_DYNAMODB_REGION", "LEADERRUN_DYNAMODB_ENDPOINT",
	"LEADERRUN_S3_BUCKET", "LEADERRUN_S3_REGION", "LEADERRUN_S3_ENDPOINT", "LEADERRUN_S3_ADDRESSING_STYLE",
	"AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION"}

// s3Env clears s3Vars and keeps the developer's AWS files and the
// instance metadata out; the credentials are a test's, secret the
// secret key.
func s3Env(t *testing.T, secret string) {
	for _, v := range s3Vars {
		t.Setenv(v, "") // restored when the test ends
		os.Unsetenv(v)
	}
	t.Setenv("AWS_CONFIG_FILE", os.DevNull)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", os.DevNull)
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDTEST")
	t.Setenv("AWS_SECRET_ACCESS_KEY", secret)
}

func openS3ForTest(s spec.Settings) (backends.Store, error) { return s3.Open(s3.Config{Settings: s}) }

// TestS3Flags: which settings select the S3 store, and what bad ones say,
// through run, status and history. Nothing listens at the endpoint, so a
// selected store is exit 69 naming the bucket, the Region and the
// endpoint; the secret key never shows.
func TestS3Flags(t *testing.T) {
	// As in leaderrun-aws (TestS3HandOver: as in leaderrun).
	RegisterS3(openS3ForTest)
	t.Cleanup(func() { RegisterS3(nil) })
	const secret = "aws-secret-hunter2"
	s3Env(t, secret)
	endpoint := "http://" + closedAddr(t)
	region := map[string]string{"AWS_REGION": "eu-west-1"}
	where := "s3 bucket locks in region eu-west-1 at " + endpoint
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		code int
		want []string
	}{
		{name: "bucket flag selects", env: map[string]string{"AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL_S3": endpoint},
			args: []string{"--s3-bucket", "locks"}, code: ExitUnavailable, want: []string{where}},
		{name: "bucket variable selects", env: map[string]string{"AWS_REGION": "eu-west-1", "LEADERRUN_S3_BUCKET": "locks", "AWS_ENDPOINT_URL": endpoint},
			code: ExitUnavailable, want: []string{where}},
		{name: "region flag", args: []string{"--s3-region", "eu-west-1", "--s3-bucket", "locks", "--s3-endpoint", endpoint}, code: ExitUnavailable, want: []string{where}},
		{name: "flag wins over variable", env: map[string]string{"AWS_REGION": "eu-west-1", "LEADERRUN_S3_BUCKET": "from-env"},
			args: []string{"--s3-bucket", "from-flag", "--s3-endpoint", endpoint}, code: ExitUnavailable, want: []string{"s3 bucket from-flag"}},
		{name: "AWS variables alone select nothing", env: map[string]string{"AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL_S3": endpoint},
			code: ExitUsage, want: []string{"no store configured", "--s3-bucket"}},
		{name: "endpoint without a bucket", env: region, args: []string{"--s3-endpoint", endpoint}, code: ExitUsage,
			want: []string{"--s3-bucket (LEADERRUN_S3_BUCKET) is required"}},
		{name: "--backend s3 without a bucket", env: region, args: []string{"--backend", "s3"}, code: ExitUsage, want: []string{"--s3-bucket"}},
		{name: "no region", args: []string{"--s3-bucket", "locks", "--s3-endpoint", endpoint}, code: ExitUsage, want: []string{"no AWS region", "--s3-region"}},
		{name: "bad bucket", env: region, args: []string{"--s3-bucket", "Locks_1"}, code: ExitUsage, want: []string{"--s3-bucket", `"Locks_1"`}},
		{name: "bad addressing style", env: region, args: []string{"--s3-bucket", "locks", "--s3-addressing-style", "dns"}, code: ExitUsage,
			want: []string{"--s3-addressing-style", `"dns"`}},
		{name: "endpoint with a secret", env: region, args: []string{"--s3-bucket", "locks", "--s3-endpoint", "https://ak:" + secret + "@minio:9000"},
			code: ExitUsage, want: []string{"--s3-endpoint", "https://minio:9000", "without user information"}},
		{name: "endpoint that is no URL", env: region, args: []string{"--s3-bucket", "locks", "--s3-endpoint", "minio:9000"}, code: ExitUsage,
			want: []string{"--s3-endpoint", "http:// or https://"}},
		{name: "prefix with ~", env: region, args: []string{"--s3-bucket", "locks", "--prefix", "a~b/"}, code: ExitUsage, want: []string{"--prefix"}},
		{name: "with DynamoDB too", env: region, args: []string{"--s3-bucket", "locks", "--dynamodb-table", "t_locks"}, code: ExitUsage,
			want: []string{"several stores", "dynamodb", "s3"}},
		{name: "a DynamoDB flag with --backend s3", env: region, args: []string{"--backend", "s3", "--s3-bucket", "locks", "--dynamodb-endpoint", endpoint},
			code: ExitUsage, want: []string{"--dynamodb-endpoint is a flag of the dynamodb store"}},
	} {
		for _, command := range []string{"run", "status", "history"} {
			t.Run(tc.name+"/"+command, func(t *testing.T) {
				for k, v := range tc.env {
					t.Setenv(k, v)
				}
				args := append([]string{"leaderrun", command, "--lock", "s3flags"}, tc.args...)
				if command == "run" {
					args = append(args, "--try", "--", "true")
				}
				var stdout, stderr bytes.Buffer
				code := run(args, &stdout, &stderr)
				out := stdout.String() + stderr.String()
				if code != tc.code {
					t.Errorf("exit %d, want %d:\n%s", code, tc.code, out)
				}
				for _, w := range tc.want {
					if command == "run" && tc.code == ExitUnavailable {
						break // run logs to the process's own stderr (e2e reads it)
					}
					if !strings.Contains(out, w) {
						t.Errorf("output does not say %q:\n%s", w, out)
					}
				}
				if strings.Contains(out, secret) {
					t.Errorf("output shows the secret key:\n%s", out)
				}
			})
		}
	}
	t.Run("help", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		if code := run([]string{"leaderrun", "run", "--help"}, &stdout, &stderr); code != 0 {
			t.Fatalf("--help: exit %d\n%s", code, stderr.String())
		}
		for _, w := range []string{"--s3-bucket BUCKET", "$LEADERRUN_S3_BUCKET", "leaderrun-aws", "AWS_ENDPOINT_URL_S3", "--s3-endpoint URL",
			"$LEADERRUN_S3_ENDPOINT", "--s3-region REGION", "--s3-addressing-style STYLE", `(default: "auto")`, "s3, azureblob"} {
			if !strings.Contains(stdout.String(), w) {
				t.Errorf("--help does not say %q", w)
			}
		}
	})
}

// TestS3OnVersityGW: the flags reach a real server: an endpoint from
// AWS_ENDPOINT_URL_S3 alone, with path-style addressing (versitygw serves
// no virtual-hosted buckets), for status and history.
func TestS3OnVersityGW(t *testing.T) {
	RegisterS3(openS3ForTest)
	t.Cleanup(func() { RegisterS3(nil) })
	gw := testenv.StartVersityGW(t)
	gw.CreateBucket(t, "cmd-locks")
	s3Env(t, gw.SecretKey)
	for _, kv := range gw.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	t.Setenv("LEADERRUN_S3_BUCKET", "cmd-locks")
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"leaderrun", "status", "--lock", "job"}, 3, "cmd-locks/leaderrun/job"},
		{[]string{"leaderrun", "history", "--lock", "job"}, 0, ""},
	} {
		var stdout, stderr bytes.Buffer
		code := run(tc.args, &stdout, &stderr)
		if out := stdout.String() + stderr.String(); code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("%v: exit %d, want %d saying %q:\n%s", tc.args[1:], code, tc.code, tc.want, out)
		}
	}
}

// TestS3HandOver: the leaderrun binary has no S3 backend. It checks the S3
// flags itself (a usage error is exit 64, as in leaderrun-aws), and a
// companion that is not beside it is exit 69 naming it (e2e's
// TestCompanion runs the real binaries).
func TestS3HandOver(t *testing.T) {
	if openS3 != nil {
		t.Fatal("the cmd package registers an S3 backend: leaderrun would link the AWS SDK")
	}
	s3Env(t, "x")
	for _, tc := range []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"bad bucket", []string{"--s3-bucket", "a/b"}, ExitUsage, []string{"--s3-bucket", `"a/b"`}},
		{"no companion", []string{"--s3-bucket", "locks"}, ExitUnavailable,
			[]string{"the S3 store is served by leaderrun-aws", "leaderrun-aws is not installed beside", "go install github.com/leaderrun/leaderrun/cmd/leaderrun-aws@"}},
	} {
		for _, command := range []string{"run", "status", "history"} {
			t.Run(tc.name+"/"+command, func(t *testing.T) {
				args := append([]string{"leaderrun", command, "--lock", "handover", "--backend", "s3"}, tc.args...)
				if command == "run" {
					args = append(args, "--", "true")
				}
				var stdout, stderr bytes.Buffer
				if code := run(args, &stdout, &stderr); code != tc.code {
					t.Errorf("exit %d, want %d:\n%s", code, tc.code, stderr.String())
				}
				for _, w := range tc.want {
					if !strings.Contains(stderr.String(), w) {
						t.Errorf("stderr does not say %q:\n%s", w, stderr.String())
					}
				}
			})
		}
	}
}

// TestS3Risks: the start-up warning of requests signed with the AWS
// credentials sent in clear text across the network, and no warning on
// loopback or with https://.
func TestS3Risks(t *testing.T) {
	s3Env(t, "x")
	for _, tc := range []struct {
		name     string
		endpoint string
		env      string
		warn     bool
	}{
		{"flag, http, remote", "http://minio.internal:9000", "", true},
		{"variable, http, remote", "", "http://10.1.2.3:9000", true},
		{"flag, https", "https://minio.internal:9000", "", false},
		{"flag, http, loopback", "http://127.0.0.1:9000", "", false},
		{"none", "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("AWS_ENDPOINT_URL_S3", tc.env)
			var got []string
			app := &cli.App{Flags: s3Flags(), Action: func(c *cli.Context) error { got = s3Risks(c, nil); return nil }}
			args := []string{"x"}
			if tc.endpoint != "" {
				args = append(args, "--s3-endpoint", tc.endpoint)
			}
			if err := app.Run(args); err != nil {
				t.Fatal(err)
			}
			if warned := len(got) == 1 && strings.Contains(got[0], "in clear text"); warned != tc.warn {
				t.Errorf("risks %q; want a clear-text warning: %v", got, tc.warn)
			}
		})
	}
}
