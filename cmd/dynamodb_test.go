package cmd

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/dynamodb"
	"github.com/leaderrun/leaderrun/backends/dynamodb/spec"
)

// TestDynamoDBFlags: which settings select the DynamoDB store, and what
// bad ones say. Nothing listens at the endpoint, so a selected store is
// exit 69 naming the table, the Region and the endpoint; the secret key
// never shows.
func TestDynamoDBFlags(t *testing.T) {
	// As in leaderrun-aws (TestDynamoDBHandOver: as in leaderrun).
	RegisterDynamoDB(openDynamoDBForTest)
	t.Cleanup(func() { RegisterDynamoDB(nil) })
	const secret = "aws-secret-hunter2"
	endpoint := "http://" + closedAddr(t)
	for _, v := range []string{"LEADERRUN_BACKEND", "LEADERRUN_ETCD_ENDPOINTS", "ETCDCTL_ENDPOINTS", "LEADERRUN_CONSUL_ADDR", "CONSUL_HTTP_ADDR",
		"LEADERRUN_POSTGRES_URL", "LEADERRUN_ZK_SERVERS", "LEADERRUN_DYNAMODB_TABLE", "LEADERRUN_DYNAMODB_REGION", "LEADERRUN_DYNAMODB_ENDPOINT",
		"AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_DYNAMODB", "AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION"} {
		t.Setenv(v, "") // restored when the test ends
		os.Unsetenv(v)
	}
	// The developer's AWS files and the instance metadata stay out.
	t.Setenv("AWS_CONFIG_FILE", os.DevNull)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", os.DevNull)
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDTEST")
	t.Setenv("AWS_SECRET_ACCESS_KEY", secret)
	region := map[string]string{"AWS_REGION": "eu-west-1"}
	where := "dynamodb table leaderrun_locks in region eu-west-1 at " + endpoint
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		code int
		want []string
	}{
		{name: "endpoint flag selects", env: region, args: []string{"--dynamodb-endpoint", endpoint}, code: ExitUnavailable, want: []string{where}},
		{name: "table variable selects", env: map[string]string{"AWS_REGION": "eu-west-1", "LEADERRUN_DYNAMODB_TABLE": "ops_locks", "AWS_ENDPOINT_URL_DYNAMODB": endpoint},
			code: ExitUnavailable, want: []string{"dynamodb table ops_locks in region eu-west-1"}},
		{name: "region flag selects", args: []string{"--dynamodb-region", "eu-west-1", "--dynamodb-endpoint", endpoint}, code: ExitUnavailable, want: []string{where}},
		{name: "AWS variables alone select nothing", env: map[string]string{"AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL_DYNAMODB": endpoint},
			code: ExitUsage, want: []string{"no store configured", "--dynamodb-table"}},
		{name: "a variable that only shares the prefix selects nothing",
			env:  map[string]string{"AWS_REGION": "eu-west-1", "LEADERRUN_DYNAMODB_EMULATOR_BIN": "/bin/true"},
			code: ExitUsage, want: []string{"no store configured"}},
		{name: "AWS_ENDPOINT_URL_DYNAMODB with --backend dynamodb", env: map[string]string{"AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL_DYNAMODB": endpoint},
			args: []string{"--backend", "dynamodb"}, code: ExitUnavailable, want: []string{"dynamodb table leaderrun_locks in region eu-west-1"}},
		{name: "flag wins over variable", env: map[string]string{"AWS_REGION": "eu-west-1", "LEADERRUN_DYNAMODB_TABLE": "from_env"},
			args: []string{"--dynamodb-table", "from_flag", "--dynamodb-endpoint", endpoint}, code: ExitUnavailable, want: []string{"dynamodb table from_flag"}},
		{name: "no region", args: []string{"--dynamodb-endpoint", endpoint}, code: ExitUsage, want: []string{"no AWS region", "AWS_REGION"}},
		{name: "with etcd too", env: map[string]string{"ETCDCTL_ENDPOINTS": "127.0.0.1:2379"}, args: []string{"--dynamodb-table", "t_locks"},
			code: ExitUsage, want: []string{"several stores", "dynamodb", "etcd"}},
		{name: "bad table", env: region, args: []string{"--dynamodb-table", "a/b"}, code: ExitUsage, want: []string{"--dynamodb-table", `"a/b"`}},
		{name: "bad endpoint", env: region, args: []string{"--dynamodb-endpoint", "ftp://x:" + secret + "@host"}, code: ExitUsage,
			want: []string{"--dynamodb-endpoint", "ftp://host"}},
		{name: "prefix with #", env: region, args: []string{"--dynamodb-endpoint", endpoint, "--prefix", "a#b"}, code: ExitUsage, want: []string{"--prefix"}},
	} {
		for _, command := range []string{"run", "status", "history"} {
			t.Run(tc.name+"/"+command, func(t *testing.T) {
				for k, v := range tc.env {
					t.Setenv(k, v)
				}
				args := append([]string{"leaderrun", command, "--lock", "ddbflags"}, tc.args...)
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
		for _, w := range []string{"--dynamodb-table TABLE", `"leaderrun_locks"`, "$LEADERRUN_DYNAMODB_TABLE", "--dynamodb-endpoint URL",
			"AWS_ENDPOINT_URL_DYNAMODB", "--dynamodb-region REGION", "dynamodb"} {
			if !strings.Contains(stdout.String(), w) {
				t.Errorf("--help does not say %q", w)
			}
		}
	})
}

func openDynamoDBForTest(s spec.Settings) (backends.Store, error) {
	return dynamodb.Open(dynamodb.Config{Settings: s})
}

// TestDynamoDBHandOver: the leaderrun binary has no DynamoDB backend. It
// checks the DynamoDB flags itself (a usage error is exit 64, as in
// leaderrun-aws), and a companion that is not beside it is exit 69
// naming it (e2e's TestCompanion runs the real binaries).
func TestDynamoDBHandOver(t *testing.T) {
	if openDynamoDB != nil {
		t.Fatal("the cmd package registers a DynamoDB backend: leaderrun would link the AWS SDK")
	}
	for _, v := range []string{"LEADERRUN_BACKEND", "LEADERRUN_DYNAMODB_TABLE", "LEADERRUN_DYNAMODB_REGION", "LEADERRUN_DYNAMODB_ENDPOINT"} {
		t.Setenv(v, "")
		os.Unsetenv(v)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"bad table", []string{"--dynamodb-table", "a/b"}, ExitUsage, []string{"--dynamodb-table", `"a/b"`}},
		{"no companion", []string{"--dynamodb-table", "ops_locks"}, ExitUnavailable,
			[]string{"served by leaderrun-aws", "leaderrun-aws is not installed beside", "go install github.com/leaderrun/leaderrun/cmd/leaderrun-aws@"}},
	} {
		for _, command := range []string{"run", "status", "history"} {
			t.Run(tc.name+"/"+command, func(t *testing.T) {
				args := append([]string{"leaderrun", command, "--lock", "handover", "--backend", "dynamodb"}, tc.args...)
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

// TestHandedOver: a companion removes the variable that says who handed
// the run over before anything else (the command must not see it),
// refuses a run handed over by another release, and never hands over
// again.
func TestHandedOver(t *testing.T) {
	t.Setenv("LEADERRUN_BACKEND", "")
	os.Unsetenv("LEADERRUN_BACKEND")
	t.Run("another release", func(t *testing.T) {
		t.Setenv(handedOverVar, "v0.0.1 0123abc")
		var stdout, stderr bytes.Buffer
		code := run([]string{"leaderrun", "--lock", "x", "--backend", "local", "--", "true"}, &stdout, &stderr)
		if code != ExitUnavailable {
			t.Errorf("exit %d, want %d:\n%s", code, ExitUnavailable, stderr.String())
		}
		for _, w := range []string{`"v0.0.1 0123abc"`, release(), "install both from the same release"} {
			if !strings.Contains(stderr.String(), w) {
				t.Errorf("stderr does not say %q:\n%s", w, stderr.String())
			}
		}
		if _, ok := os.LookupEnv(handedOverVar); ok {
			t.Errorf("%s is still in the environment", handedOverVar)
		}
	})
	t.Run("handed over again", func(t *testing.T) {
		t.Setenv(handedOverVar, release())
		var stdout, stderr bytes.Buffer
		code := run([]string{"leaderrun", "status", "--lock", "x", "--dynamodb-table", "ops_locks"}, &stdout, &stderr)
		if code != ExitUnavailable || !strings.Contains(stderr.String(), "has no DynamoDB backend either") {
			t.Errorf("exit %d, want %d saying it has no DynamoDB backend either:\n%s", code, ExitUnavailable, stderr.String())
		}
		if _, ok := os.LookupEnv(handedOverVar); ok {
			t.Errorf("%s is still in the environment", handedOverVar)
		}
	})
}
