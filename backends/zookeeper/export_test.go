package zookeeper

import (
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/leaderrun/leaderrun/backends"
)

// SetCreateHook makes h see every create of a candidate's znode (nil: none).
// Tests run one at a time while it is set.
func SetCreateHook(h func(z *zk.Conn, prefix, path string, err error) (string, error)) {
	testHookCreate = h
}

// Ghost creates a second znode of g's candidacy, on its session: what a
// create whose lost answer was retried leaves once it lands.
func Ghost(g backends.Grant) (string, error) {
	cd := g.(*candidacy)
	return cd.s.conn.Create(cd.l.dir+"/"+protectedPrefix+cd.guid+latchName, cd.data, zk.FlagEphemeralSequential, cd.l.s.acl)
}

// LeaseTTL is what a grant reports as its TTL for a session timeout, a
// retry period and the ensemble's minimum session timeout.
func LeaseTTL(timeout, retry, minTimeout time.Duration) time.Duration {
	return leaseTTL(timeout, retry, minTimeout)
}

// Wakes counts how often a waiting candidate of s was woken by the watch
// on the candidate ahead of it.
func (s *Store) Wakes() uint64 { return s.wakes.Load() }

// SessionTimeout, SessionID and Server are the grant's negotiated session
// timeout, its session's id and the server it is (or was last) on.
func (cd *candidacy) SessionTimeout() time.Duration { return cd.s.Timeout() }
func (cd *candidacy) SessionID() int64              { return cd.s.ID() }
func (cd *candidacy) Server() string                { return cd.s.conn.Server() }
