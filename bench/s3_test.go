package bench

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// s3Timings are the fault suite's (faults/s3_test.go), as DynamoDB's: S3
// has no clock a client can read; a waiter takes over a whole lease after
// it last saw the ETag change, on its own clock.
var s3Timings = timings{lease: 5 * time.Second, deadline: 3 * time.Second, retry: 500 * time.Millisecond, grace: time.Second}

// s3Bucket holds every lock of the benchmark.
const s3Bucket = "bench"

// lrS3 is leaderrun on versitygw, served by the companion leaderrun-aws,
// with the gateway's credentials and Region in its environment (set when
// the gateway starts: they are random) and nothing read from the host's
// AWS files.
var lrS3 = leaderrunOn("lrs", "leaderrun (S3)", "s3", func(addr string) []string {
	return []string{"--s3-bucket", s3Bucket, "--s3-endpoint", addr}
}, s3Timings)

// s3Column is S3, on versitygw. There is no queue and no notification:
// a waiter reads the lock object every retry period, and the holder
// every retry period (at most 500 ms) besides its renewals, so a loss is
// seen and a release taken over within a period, not milliseconds: the
// loss and handover goals of the other stores are not met, and say so.
var s3Column = &storeColumn{name: "s3", title: "S3 (versitygw)", lr: lrS3, tm: s3Timings, latency: true,
	crashGoal: s3Timings.lease + s3Timings.retry + 500*time.Millisecond, crashGoalText: "lease + retry period + 0.5 s",
	crashBound: s3Timings.lease + 10*time.Second, crashTrials: 5,
	newStore: func() store { return &s3Store{} }}

// s3Store is one versitygw gateway on a posix directory, the benchmark's
// bucket created beforehand.
type s3Store struct{ gw *testenv.VersityGW }

func (s *s3Store) start(b *bench) {
	s.gw = testenv.StartVersityGW(b.t)
	s.gw.CreateBucket(b.t, s3Bucket)
	lrS3.env = s.gw.Env()
}

func (s *s3Store) addr(*tool) string { return s.gw.URL() }
func (s *s3Store) prepare(string)    {}

// candidates counts the processes that have campaigned: S3 keeps no
// trace of waiters.
func (s *s3Store) candidates(_ *tool, _, _ string, procs []*proc) (int, error) {
	n := 0
	for _, p := range procs {
		if p.logged(`"msg":"campaigning"`) {
			n++
		}
	}
	return n, nil
}

// drop deletes the lock object, as an operator would (aws s3 rm); the
// state object, with the token's mark, stays.
func (s *s3Store) drop(_ *tool, lock, _ string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	at := mono()
	_, err := s.gw.Client().DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(s3Bucket), Key: aws.String("leaderrun/" + lock)})
	return at, err
}

func (s *s3Store) dropText() string {
	return "the lock object (`leaderrun/LOCK` in the bucket) deleted"
}

func (s *s3Store) meter(*bench, *tool) meter { return &s3Meter{target: s.gw.Addr()} }

// s3Meter puts an HTTP proxy that records every request in front of the
// gateway for each process.
type s3Meter struct {
	target string
	proxySet[*azureProxy]
}

func (m *s3Meter) addr(_ *tool, tag string) string {
	p, err := newRecordingProxy(m.target, s3Key, func(k reqKey) bool { return k.name == s3ReadMark })
	if err != nil {
		benchT.Fatal(err)
	}
	m.add(tag, p)
	return "http://" + p.ln.Addr().String()
}

func (m *s3Meter) mark() mark { return mark{at: mono(), wall: time.Now()} }

func (m *s3Meter) how() string {
	return "an HTTP reverse proxy in front of the gateway for each process, which records every request: a conditional PUT of the lock object (If-Match) is counted as the holder's renewal, a keep-alive (a grant over a free object and a release are one too, once each); " +
		"a GET of the lock object is polling, counted as other; a grant reads the token's mark (GET of the state object) first, and that counts the process as woken"
}

// s3ReadMark is a grant's first request: it reads the state object.
const s3ReadMark = "GET state object"

// s3Key names an S3 request by method, object (the lock object or its
// state object) and condition, and sorts it into a class.
func s3Key(r *http.Request) reqKey {
	object := "lock object"
	if strings.HasSuffix(r.URL.Path, "~state") {
		object = "state object"
	}
	name := r.Method + " " + object
	class := classOther
	switch {
	case r.Header.Get("If-Match") != "":
		name += " (If-Match)"
		if object == "lock object" && r.Method == http.MethodPut {
			class = classKeepalive
		}
	case r.Header.Get("If-None-Match") != "":
		name += " (If-None-Match)"
	}
	return reqKey{name: name, class: class}
}
