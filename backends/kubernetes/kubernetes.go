// Package kubernetes is the Kubernetes store: a lock is a
// coordination.k8s.io/v1 Lease named after it, holding client-go's
// leader-election record (holderIdentity, leaseDurationSeconds,
// acquireTime, renewTime, leaseTransitions), so that `kubectl get lease`
// shows the holder and client-go electors on the same Lease and leaderrun
// exclude each other (docs/backends/kubernetes.md).
//
// A lock is a backends.RecordLock without a clock: the apiserver expires
// nothing, so the driver times the record on the follower's own clock, as
// client-go's elector does. The record's Version is the resourceVersion,
// so any write to the Lease restarts a follower's clock, and every write
// is an update conditional on the resourceVersion read: of two candidates
// that saw the same state, one wins and the other gets 409 Conflict.
//
// client-go's electors compare records with their times cut to whole
// seconds, so they miss a renewal written in the second of the one before
// and may take over up to a second early. A holder whose retry period is
// 1s or more writes every renewal in a later second (renewStamp) and may
// count on all of leaseDurationSeconds; with a shorter period, on a second
// less (guaranteedTTL).
//
// A grant is this candidacy's only if the record names its identity and
// the leaderrun/token annotation names the same holder, count of
// transitions and owner: an identity is no proof of ownership.
//
// The fencing token of a grant is one more than the resourceVersion that
// its update was conditional on, or than the token recorded in
// leaderrun/token if that is larger. resourceVersions are etcd revisions
// of the Lease's key, which only grow, and each grant is conditional on
// the version of the last write before it, so tokens grow, across a
// deletion of the Lease too, since the deletion and the next creation are
// writes to the same key. That is why a candidate that finds no Lease
// creates a free one and takes it with an update conditional on the
// creation's version: a create has no version to be conditional on.
//
// A lock's history and completion markers are the annotations
// leaderrun/history and leaderrun/markers of its Lease, so they need no
// other permission than the Lease's own: get, create, update and watch.
//
// The client is client-go's: clientcmd reads kubeconfigs as kubectl does,
// and its REST client decodes Leases of k8s.io/api through a scheme that
// knows Leases only. Every answer and every watch event is bounded
// (maxAnswer), and redirects are refused, so that no credential follows
// one (bounded.go, config.go).
package kubernetes

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/leaderrun/leaderrun/backends"
)

// Config says which cluster and namespace the Leases live in.
type Config struct {
	// API says how to reach the apiserver (see LoadAPIConfig). Required.
	API *APIConfig

	// Namespace is where the Leases live. Empty: API.Namespace (the pod's
	// service account's, or the kubeconfig context's), else "default".
	Namespace string
}

// Store is the Leases of one namespace of one cluster, reached through
// one REST client. Its locks are safe for concurrent use.
type Store struct{ client *client }

// Open validates cfg and builds client-go's REST client, reading the CA
// and credential files it names, but sends nothing to the apiserver.
func Open(cfg Config) (*Store, error) {
	if cfg.API == nil {
		return nil, fmt.Errorf("kubernetes: no API configuration")
	}
	ns := cfg.Namespace
	if ns == "" {
		ns = cfg.API.Namespace
	}
	if ns == "" {
		ns = "default"
	}
	if err := ValidateNamespace(ns); err != nil {
		return nil, err
	}
	rc, host, err := restClient(cfg.API)
	if err != nil {
		return nil, err
	}
	return &Store{client: &client{rest: rc, host: host, namespace: ns}}, nil
}

// Name implements backends.Store.
func (s *Store) Name() string { return "kubernetes" }

// Lock implements backends.Store: the Lease named name. A slot's name
// (backends.SlotLock: lock.slotI) is a valid Lease name whenever lock is.
func (s *Store) Lock(name string) backends.Lock { return &lock{s: s, name: name} }

// Close implements backends.Store: it closes idle connections to the
// apiserver. Leases must be released first.
func (s *Store) Close() error {
	if hc := s.client.rest.Client; hc != nil {
		hc.CloseIdleConnections()
	}
	return nil
}

// ValidateLockName returns an error unless name can name both a leaderrun
// lock (backends.ValidateLockName) and a Lease: a lowercase RFC 1123
// subdomain, whose dot-separated parts start and end with a letter or a
// digit.
func ValidateLockName(name string) error {
	if backends.ValidateLockName(name) != nil || len(validation.IsDNS1123Subdomain(name)) > 0 {
		return fmt.Errorf("kubernetes: lock name %q is not a valid Lease name: want a lowercase RFC 1123 subdomain, "+
			"1-128 characters from [a-z0-9.-], each dot-separated part starting and ending with a letter or digit", name)
	}
	return nil
}

// ValidateNamespace returns an error unless ns can name a namespace: a
// lowercase RFC 1123 label.
func ValidateNamespace(ns string) error {
	if len(validation.IsDNS1123Label(ns)) > 0 {
		return fmt.Errorf("kubernetes: namespace %q is not a valid namespace name: want a lowercase RFC 1123 label, "+
			"1-63 characters from [a-z0-9-], starting and ending with a letter or digit", ns)
	}
	return nil
}

// leaseSeconds is d in whole seconds, rounded up: the Lease may only last
// longer than asked, never shorter.
func leaseSeconds(d time.Duration) int32 {
	s := (d + time.Second - 1) / time.Second
	return int32(min(max(s, 1), 1<<31-1))
}

// guaranteedTTL is how long after the send time of its last acknowledged
// renewal a holder that writes leaseDurationSeconds = seconds and renews
// every retry keeps every elector out, client-go's included: a second less
// when renewals may come less than a second apart (retry 0: unknown), as a
// client-go elector sees the record change only once per second. It is
// never zero, which would mean a lease that never expires.
func guaranteedTTL(seconds int32, retry time.Duration) time.Duration {
	ttl := time.Duration(seconds) * time.Second
	if retry < time.Second {
		ttl -= time.Second
	}
	return max(ttl, time.Nanosecond)
}

// CheckTimings refuses, before anything is taken, timings that the runner
// would refuse once the Lease is granted: with renewals under a second
// apart a client-go elector may take over a second early (guaranteedTTL),
// which must still leave more than --renew-deadline + --kill-grace.
func (s *Store) CheckTimings(t backends.Timings) error {
	if ttl := guaranteedTTL(leaseSeconds(t.LeaseDuration), t.RetryPeriod); ttl <= t.RenewDeadline+t.KillGrace {
		return fmt.Errorf("--lease-duration %v with --retry-period %v: renewals under a second apart may go unseen by a client-go elector "+
			"on the same Lease, which may then take over up to 1s early, leaving %v, not more than --renew-deadline (%v) + --kill-grace (%v): "+
			"raise --lease-duration or set --retry-period to 1s or more",
			t.LeaseDuration, t.RetryPeriod, ttl.Round(time.Millisecond), t.RenewDeadline, t.KillGrace)
	}
	return nil
}

var (
	_ backends.Store      = (*Store)(nil)
	_ backends.RecordLock = (*lock)(nil)
	_ backends.Follower   = (*watcher)(nil)
)
