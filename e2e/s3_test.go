//go:build linux

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	s3api "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// s3TestTimings: the lease is 3 s; the holder renews every 500 ms and
// reads its object as often; waiters read it every retry period and time
// the lease on their own clock from the last change they saw. The child
// is stopped 2 s after the send time of the last acknowledged renewal and
// killed 500 ms later, 500 ms before any waiter may take over.
var s3TestTimings = timings{lease: 3 * time.Second, deadline: 2 * time.Second, retry: 500 * time.Millisecond, grace: 500 * time.Millisecond}

const (
	s3Lease = 3 * time.Second
	s3Retry = 500 * time.Millisecond
	// s3Bucket is the bucket of the store's locks, on a gateway of its
	// own.
	s3Bucket = "e2e-locks"
)

// s3Store is S3 in the scenarios' matrix: versitygw on its posix backend
// (a directory, which a restart keeps), a bucket of the store's own, the
// root account's credentials, the Region and the endpoint in the AWS
// variables (testenv.VersityGW.Env), as the AWS CLI reads them. leaderrun
// hands an S3 run over to leaderrun-aws, built beside it. S3 tells nobody
// of a change: waiters read the lock object every retry period; the
// holder reads it every 500 ms.
func s3Store() *store {
	return &store{
		name: "s3", start: startS3Store, timings: s3TestTimings,
		// The follower times the lease on its own clock from the last
		// renewal it saw, at most a read after it was written.
		takeover: s3Lease + s3Retry + 500*time.Millisecond, handover: s3Retry + 300*time.Millisecond,
		notice: 500*time.Millisecond + 100*time.Millisecond, statusBound: s3Lease + 5*time.Second,
		// The object says the lease; what is left of it, status reckons
		// from the renewal it records.
		expires: true, ttl: true, remaining: true, durable: true, lostTerm: true,
		// A lease of 2 s, for a takeover inside the fleet's --wait 4s
		// after a kill -9; renewals and reads every 300 ms.
		onceTimings:   timings{lease: 2 * time.Second, deadline: 1200 * time.Millisecond, retry: 300 * time.Millisecond, grace: 500 * time.Millisecond},
		escapeTimings: timings{lease: 3 * time.Second, deadline: 2 * time.Second, retry: 500 * time.Millisecond, grace: escapeGrace},
		// No credentials of the store's own: the AWS variables are as
		// often the job's own access to AWS (cmd/s3.go), and reach it.
	}
}

func startS3Store(t *testing.T) *target {
	gw := testenv.StartVersityGW(t)
	gw.CreateBucket(t, s3Bucket)
	flags := []string{"--s3-bucket", s3Bucket}
	key := func(lock string) string { return "leaderrun/" + lock }
	return &target{
		flags: flags, env: gw.Env(), key: keyUnder(s3Bucket + "/leaderrun/%s"),
		// The follower has campaigned, and reads the object at once and
		// then every retry period: its first attempt's log line.
		waiting: logWaiting("campaigning"),
		link:    gw.Addr(),
		via: func(addr string) ([]string, []string) {
			return append(flags, "--s3-endpoint", "http://"+addr), gw.Env()
		},
		// The holder reads its object every 500 ms.
		losses: []loss{
			{name: "Deleted", says: []string{"was deleted"}, do: func(t *testing.T, _ *env, lock string) time.Time {
				gw.DeleteObject(t, s3Bucket, key(lock))
				return time.Time{}
			}},
			{name: "Overwritten", says: []string{`was taken by \"operator\"`}, do: func(t *testing.T, _ *env, lock string) time.Time {
				obj := s3Object(t, gw, key(lock))
				obj["holder"], obj["owner"], obj["rvn"] = "operator", "operator", "by-hand"
				s3Put(t, gw, key(lock), obj)
				return time.Time{}
			}},
		},
		// The state object keeps the token's mark: deleting the lock
		// object does not take it back.
		wipe: func(t *testing.T, lock string) { gw.DeleteObject(t, s3Bucket, key(lock)) },
		// The job lives on for two seconds: long enough for its leader to
		// read its object (every 500 ms), see the loss and stop it, so
		// that the history says "lost".
		loseCommand: func(t *testing.T, lock string) string {
			curl, err := exec.LookPath("curl")
			if err != nil {
				testenv.Missing(t, "curl is not installed")
			}
			return fmt.Sprintf(`%s -sS --fail -o /dev/null -X DELETE -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' --aws-sigv4 'aws:amz:%s:s3' --user '%s:%s' '%s/%s/%s' && sleep 2`,
				curl, testenv.S3Region, gw.AccessKey, gw.SecretKey, gw.URL(), s3Bucket, key(lock))
		},
		record: func(t *testing.T, lock string) string {
			obj, st := s3Object(t, gw, key(lock)), s3Object(t, gw, key(lock)+"~state")
			return fmt.Sprintf("%v %v %v %v, mark %v", obj["holder"], obj["owner"], obj["token"], obj["acquired"], st["mark"])
		},
		marker: func(t *testing.T, lock, k string) string {
			var all []struct{ Key, Identity string }
			if m, ok := s3Object(t, gw, key(lock))["markers"]; ok {
				b, _ := json.Marshal(m)
				_ = json.Unmarshal(b, &all)
			}
			for _, m := range all {
				if m.Key == k {
					return m.Identity
				}
			}
			return ""
		},
		stopServer: func(testing.TB) { gw.Stop() }, startServer: func(testing.TB) { gw.Start() },
	}
}

// s3Object is the JSON object key of the store's bucket, as an operator
// reads it; empty if there is none.
func s3Object(t *testing.T, gw *testenv.VersityGW, key string) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := gw.Client().GetObject(ctx, &s3api.GetObjectInput{Bucket: aws.String(s3Bucket), Key: aws.String(key)})
	var missing *types.NoSuchKey
	if errors.As(err, &missing) {
		return map[string]any{}
	} else if err != nil {
		t.Fatalf("get %s/%s: %v", s3Bucket, key, err)
	}
	defer out.Body.Close()
	data, err := io.ReadAll(out.Body)
	if err != nil {
		t.Fatalf("get %s/%s: %v", s3Bucket, key, err)
	}
	obj := map[string]any{}
	if err := json.Unmarshal(data, &obj); err != nil {
		t.Fatalf("%s/%s: %v: %q", s3Bucket, key, err, data)
	}
	return obj
}

// s3Put writes obj as the object key, unconditionally, as an operator
// (or another tool) would.
func s3Put(t *testing.T, gw *testenv.VersityGW, key string, obj map[string]any) {
	t.Helper()
	data, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := gw.Client().PutObject(ctx, &s3api.PutObjectInput{Bucket: aws.String(s3Bucket), Key: aws.String(key),
		Body: bytes.NewReader(data)}); err != nil {
		t.Fatalf("put %s/%s: %v", s3Bucket, key, err)
	}
}
