package zookeeper

import (
	"context"
	"time"
)

// probeTimeout is the session timeout the probe asks for to learn the
// ensemble's minimum session timeout: a server raises a timeout below its
// minimum to the minimum. A minimum below probeTimeout goes unseen, and
// the probe then reports probeTimeout, which overstates the tick's bound
// (see leaseTTL): safe, and a few milliseconds at most. Not smaller, so
// that the client library's deadlines before the answer (ten times two
// thirds of the timeout) stay sane.
const probeTimeout = 100 * time.Millisecond

// leaseTTL is how long after the send time of an acknowledged renewal the
// runner may count on the leader's znode to live, for a session of
// negotiated timeout T on an ensemble whose minimum session timeout is
// minTimeout, renewed every retry (zero: unknown):
//
//	TTL = T − min(retry, T/3) − minTimeout/4
//
// Why: in an ensemble, only the ensemble leader expires sessions, and it
// times each one from the last contact that a server reported to it.
// A follower reports the contacts it saw in its answer to the leader's
// ping, which comes every half tick. If the follower's link to the leader
// fails right after a renewal reached the follower, that renewal is never
// reported; the last one that was is the contact before it, at most
// min(retry, T/3) earlier (the runner renews every retry, the client
// library pings every T/3 whatever else it sends), and it was reported up
// to half a tick before the link failed. So the session can expire as
// early as send + T − min(retry, T/3) − tick/2. The tick is not something
// a client can ask for; ZooKeeper's default minimum session timeout is two
// ticks, so tick/2 = minTimeout/4 under the default configuration (and
// less than that if the operator raised the minimum). An operator who set
// minSessionTimeout below 2 × tickTime must add the difference to
// --lease-duration (docs/backends/zookeeper.md).
//
// A standalone server, or the ensemble leader when the client is
// connected to it, times the session from its own contacts, later than
// send + T: the margin is then not needed, and costs only failover time.
//
// The result is at least 1 ns: a zero TTL means a lease that never
// expires.
func leaseTTL(timeout, retry, minTimeout time.Duration) time.Duration {
	contact := timeout / 3
	if retry > 0 && retry < contact {
		contact = retry
	}
	return max(timeout-contact-minTimeout/4, time.Nanosecond)
}

// minSessionTimeout is the ensemble's minimum session timeout, learned once
// per backend (and its slots) from a session that asks for probeTimeout and is closed at
// once. A failure wraps backends.ErrUnavailable (or is ctx's error).
func (b *Backend) minSessionTimeout(ctx context.Context) (time.Duration, error) {
	known := &b.top().minTimeout // one ensemble for a backend and its slots
	if d := time.Duration(known.Load()); d > 0 {
		return d, nil
	}
	s, err := b.connectShare(ctx, probeTimeout, b.connectTimeout)
	if err != nil {
		return 0, err
	}
	d := s.Timeout()
	b.closeLater(s)
	known.Store(int64(d))
	return d, nil
}
