package faults

import (
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// s3Store is one versitygw gateway (its posix backend: an object is a
// file, its ETag an extended attribute), one bucket, served to leaderrun
// by the companion leaderrun-aws. Each candidate reaches it through a
// proxy of its own (--s3-endpoint), so that stalling or resetting its
// proxy cuts its renewals, its polls and its grants alike, and no one
// else's. The credentials and Region are in each candidate's environment
// (env), where the AWS SDK reads them, and not the suite's: the DynamoDB
// rows set other AWS credentials process-wide.
//
// AWS S3 is a regional service: what a stalled link or a dead leader
// does is the same; what this gateway cannot show is S3's own
// replication, which it keeps out of sight and consistent.
type s3Store struct {
	gw     *testenv.VersityGW
	bucket string
}

func newS3Store(t testing.TB) *s3Store {
	gw := testenv.StartVersityGW(t)
	s := &s3Store{gw: gw, bucket: "faults"}
	gw.CreateBucket(t, s.bucket)
	return s
}

func (s *s3Store) name() string { return "s3" }

// The same timings as DynamoDB's: S3 has no clock a client can read, so a
// waiter takes over a whole lease after it last saw the ETag change, on
// its own clock; the holder renews, and waiters poll, every 500 ms.
func (s *s3Store) timings() timing {
	return timing{lease: 5 * time.Second, deadline: 3 * time.Second, retry: 500 * time.Millisecond, grace: time.Second}
}

func (s *s3Store) candidate(t testing.TB) ([]string, []*testenv.Proxy) {
	p := testenv.NewProxy(t, s.gw.Addr())
	return []string{"--s3-bucket", s.bucket, "--s3-endpoint", "http://" + p.Addr()}, []*testenv.Proxy{p}
}

// env is the gateway's credentials and Region (its endpoint, the
// gateway's own, is overridden by --s3-endpoint).
func (s *s3Store) env() []string { return s.gw.Env() }

// restartNode restarts the gateway (SIGTERM, as a service manager would)
// on its directory: the lock object and its ETag are as they were, and
// the leader renews on. A restart that took longer than the deadline less
// a retry period proves nothing either way: the trial says so instead of
// counting it.
func (s *s3Store) restartNode(t testing.TB) {
	tm := s.timings()
	began := time.Now()
	s.gw.Restart()
	took := time.Since(began)
	t.Logf("versitygw restart took %v (renew deadline %v)", took.Round(time.Millisecond), tm.deadline)
	if took >= tm.deadline-tm.retry {
		t.Errorf("the restart took %v, too long for the %v renew deadline: this trial cannot tell a false failover from a due one",
			took.Round(time.Millisecond), tm.deadline)
	}
}

// killRaftLeader: a single gateway elects nothing.
func (s *s3Store) killRaftLeader(t testing.TB) bool { return false }
