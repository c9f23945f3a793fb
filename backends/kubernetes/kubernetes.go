// Package kubernetes is the Kubernetes backend: the lock is a
// coordination.k8s.io/v1 Lease named after it, with the record that
// client-go's leaderelection keeps in it (holderIdentity,
// leaseDurationSeconds, acquireTime, renewTime, leaseTransitions), so that
// `kubectl get lease` shows the holder and a client-go LeaderElector on the
// same Lease and leaderrun exclude each other.
//
// # Record and timing
//
// Every write is an update conditional on the resourceVersion that was
// read: of two candidates that saw the same state, one wins and the other
// gets 409 Conflict. A Lease that names no holder is free; one that names a
// holder is taken over only once its record has not changed for
// leaseDurationSeconds, timed on the follower's own monotonic clock from
// when it saw the record change, exactly as client-go's elector times it.
// The timestamps in the record are never trusted as a clock (hosts' clocks
// may differ), only compared, so clock offsets between hosts do not matter.
// Followers watch the Lease, so a release (holderIdentity cleared, as
// client-go's ReleaseOnCancel does) hands over at once, and the holder sees
// at once that its Lease was deleted or given to someone else (S3).
//
// leaseDurationSeconds is whole seconds: the lease duration asked is
// rounded up.
//
// # What a client-go follower sees, and Lease.TTL
//
// client-go's electors compare records with their times cut to whole
// seconds (the record's JSON form), so a renewal written in the same
// second as the one before is no change to them: their clock keeps
// running from the first renewal of that second. A client-go follower may
// then take over up to a second before "send time of our last renewal +
// leaseDurationSeconds", which is what the runner's deadline relies on.
// Renewals at least a second apart are all seen: the runner sends each one
// at least --retry-period after the one before, each writes the time it
// was sent, and a renewal that would still fall in the second of the one
// before (the microseconds between the runner's send time and the write,
// with a period of exactly 1s) waits for the next second before it is
// written. So Lease.TTL reports what the store lets the runner count on:
// leaseDurationSeconds when Config.RetryPeriod is 1s or more (the default
// 2s is), one second less when it is under 1s (or not given), so that the
// runner's check TTL > --renew-deadline + --kill-grace refuses timings
// that could let a client-go elector in while the child still runs.
// leaderrun's own followers compare the times to the microsecond; only
// client-go electors on the same Lease need the second.
//
// An identity is no proof of ownership here: a record that names this
// candidate's identity but was not written by this Lease is treated like
// anyone else's (client-go would renew it at once). Identities must still
// be distinct: a client-go elector that shares leaderrun's identity takes
// leaderrun's Lease for its own.
//
// # Fencing token
//
// The token of a grant is one more than the resourceVersion of the Lease
// that the acquiring update was conditional on, or one more than the token
// recorded on the Lease if that is larger. It is recorded in the
// leaderrun/token annotation with the grant it belongs to, and with the
// size of the holder's pool when it is more than one (--holders; the
// slots of a pool are Leases of their own, <lock>.slot<i>).
//
// Why it cannot go backwards: kube-apiserver stores every object in etcd
// under a key of its own, and an object's resourceVersion is the etcd
// revision of the last write to that key. etcd's revision counts the
// writes to the whole store, so it only grows, and since Kubernetes 1.35
// the API itself defines the resource versions of one resource as decimal
// integers that compare in the order of the writes. Let grant k be the
// update W(k), conditional on version r(k) and committed at revision
// w(k) > r(k), so that its token t(k) = r(k)+1 <= w(k). The next grant's
// update W(k+1) succeeds only if r(k+1) is the revision of the last write
// to the key before it, and W(k) is one of those writes: r(k+1) >= w(k),
// so t(k+1) > w(k) >= t(k). Deleting the Lease does not break this: nothing
// of the object survives, but the deletion and the creation of the next
// Lease are writes to the same key with larger revisions still. That is
// why a candidate that finds no Lease creates a free one and then takes it
// with an update conditional on the creation's version, like every other
// grant: a create has no version to be conditional on. The maximum with
// the recorded token adds safety only should the revisions ever restart
// while the object survives (the objects copied into a new etcd).
// Restoring etcd from an old backup does make tokens go backwards: the
// revisions and the object both go back in time.
//
// leaseTransitions is not the token: it restarts at 0 when the Lease is
// created again, and client-go's electors write it too.
//
// # Permissions
//
// get, create, update and watch on leases in the namespace; no list (the
// watch selects the Lease by name, which RBAC authorizes as a watch of that
// name). A Role may restrict get, update and watch to the Lease's name;
// create cannot be, so either grant it or create the Lease in advance. A
// refused verb is final: Campaign returns an error wrapping
// backends.ErrUnavailable with the apiserver's message, which names the
// verb, resource and user.
//
// # Client
//
// The backend is built on client-go: clientcmd reads kubeconfigs as
// kubectl does (or rest.InClusterConfig a pod's service account), and
// client-go's REST client sends the requests and decodes Leases of
// k8s.io/api. Its scheme knows Leases only: client-go's kubernetes/scheme,
// which registers every API group at start-up, is not linked. Every
// answer and every watch event is bounded (maxAnswer), and redirects are
// refused, so that no credential follows one (see bounded.go, config.go).
//
// # History and completion markers
//
// They live in annotations of the Lease (leaderrun/history, about the last
// backends.HistoryLimit terms within 128 KiB; leaderrun/markers, 64 KiB),
// so they need no other permission and vanish with the Lease. Markers are
// written by an update conditional on a version of the Lease that this
// grant holds, so a leader that lost the Lease cannot write one.
package kubernetes

import (
	"context"
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"

	"github.com/leaderrun/leaderrun/backends"
)

// Config describes one lock in one Kubernetes cluster.
type Config struct {
	// API says how to reach the apiserver (see LoadAPIConfig). Required.
	API *APIConfig

	// Namespace is where the Lease lives. Empty: API.Namespace (the pod's
	// service account's, or the kubeconfig context's), else "default".
	Namespace string

	// Lock is the Lease's name; see ValidateLockName.
	Lock string

	// RetryPeriod is how often the holder renews (the runner's
	// --retry-period). Under 1s, or zero (not known), a client-go elector
	// may miss renewals, and Lease.TTL reports one second less than the
	// leaseDurationSeconds written (see the package doc).
	RetryPeriod time.Duration
}

// Backend campaigns for one Lease. Its methods are safe for concurrent
// use, but Campaign is meant for one campaign at a time.
type Backend struct {
	client    *client
	namespace string
	lock      string
	retry     time.Duration
	// root is the backend this one is a slot of (see Slot), nil for one
	// that New made: the REST client is root's.
	root *Backend
}

// New returns a backend for cfg.Lock. It validates cfg and builds
// client-go's REST client, reading the CA and credential files it names,
// but sends nothing to the apiserver until the first Campaign, Status or
// History.
func New(cfg Config) (*Backend, error) {
	if err := ValidateLockName(cfg.Lock); err != nil {
		return nil, err
	}
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
	c := &client{rest: rc, host: host, namespace: ns, name: cfg.Lock}
	return &Backend{client: c, namespace: ns, lock: cfg.Lock, retry: cfg.RetryPeriod}, nil
}

// ValidateLockName returns an error unless name can name both a leaderrun
// lock (backends.ValidateLockName) and a Lease: a lowercase RFC 1123
// subdomain, whose dot-separated parts start and end with a letter or a
// digit.
func ValidateLockName(name string) error {
	if err := backends.ValidateLockName(name); err != nil || !isDNSSubdomain(name) {
		return fmt.Errorf("kubernetes: lock name %q is not a valid Lease name: want a lowercase RFC 1123 subdomain, "+
			"1-128 characters from [a-z0-9.-], each dot-separated part starting and ending with a letter or digit", name)
	}
	return nil
}

// ValidateNamespace returns an error unless ns can name a namespace: a
// lowercase RFC 1123 label.
func ValidateNamespace(ns string) error {
	if !isDNSLabel(ns) {
		return fmt.Errorf("kubernetes: namespace %q is not a valid namespace name: want a lowercase RFC 1123 label, "+
			"1-63 characters from [a-z0-9-], starting and ending with a letter or digit", ns)
	}
	return nil
}

// isDNSSubdomain is the apiserver's rule for most object names: at most
// 253 characters, dot-separated parts of [a-z0-9-] that start and end with
// a letter or digit (parts may be longer than a DNS label's 63).
func isDNSSubdomain(s string) bool {
	if len(s) == 0 || len(s) > 253 {
		return false
	}
	for _, part := range strings.Split(s, ".") {
		if !isAlnumDashes(part) {
			return false
		}
	}
	return true
}

// isDNSLabel is the rule for namespace names: one part of at most 63.
func isDNSLabel(s string) bool { return len(s) <= 63 && isAlnumDashes(s) }

func isAlnumDashes(s string) bool {
	if len(s) == 0 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// Name implements backends.Backend.
func (b *Backend) Name() string { return "kubernetes" }

// Namespace is the namespace of the Lease.
func (b *Backend) Namespace() string { return b.namespace }

// Key is where the lock lives: namespace/leases/name.
func (b *Backend) Key() string { return b.namespace + "/leases/" + b.lock }

// Slot implements backends.Backend: slot i is the Lease named
// backends.SlotLock(lock, i) (lock.slotI, a valid Lease name whenever lock
// is one) in the same namespace, reached through b's REST client.
func (b *Backend) Slot(i int) backends.Backend {
	r := b
	if b.root != nil {
		r = b.root
	}
	if i == 0 {
		return r
	}
	lock := backends.SlotLock(r.lock, i)
	c := *r.client
	c.name = lock
	return &Backend{client: &c, namespace: r.namespace, lock: lock, retry: r.retry, root: r}
}

// Close implements backends.Backend: it closes idle connections to the
// apiserver, unless b is a slot backend, which has nothing of its own to
// close. Leases must be released first.
func (b *Backend) Close() error {
	if hc := b.client.rest.Client; hc != nil && b.root == nil {
		hc.CloseIdleConnections()
	}
	return nil
}

// unavailable wraps an error met before leadership: it names the server
// and the Lease, never a credential.
func (b *Backend) unavailable(op string, err error) error {
	return fmt.Errorf("kubernetes at %s: %s lease %s/%s: %w: %w", b.client.host, op, b.namespace, b.lock, backends.ErrUnavailable, err)
}

// get reads the Lease; nil without error if there is none.
func (b *Backend) get(ctx context.Context) (*coordinationv1.Lease, error) {
	obj, err := b.client.getLease(ctx)
	switch {
	case isNotFound(err):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return obj, nil
}

// Status implements backends.Backend. The token is the holder's if
// leaderrun granted it (a client-go elector's grant has none: 0).
//
// A Lease is held while its record names a holder whose last renewal is
// less than leaseDurationSeconds old. Status reads the Lease once (it
// cannot watch it for a whole lease within --timeout, as a follower
// does), so it judges the renewal by its timestamp, renewTime, which the
// holder's clock wrote, against this host's clock: a holder whose lease
// ran out by that measure (it died without releasing) is reported as not
// holding the Lease. The figure is only as good as the two hosts' clocks
// agree: a holder's clock behind this host's by more than
// leaseDurationSeconds less its renewal period makes a live holder look
// expired, one ahead makes a dead holder look alive for longer. Followers
// never use the timestamps; they time the record on their own clock.
// Waiting is -1: followers only watch, the apiserver does not count them.
func (b *Backend) Status(ctx context.Context) (backends.Status, error) {
	st := backends.Status{Lock: b.lock, Backend: b.Name(), Key: b.Key(), Remaining: -1, Waiting: -1}
	obj, err := b.get(ctx)
	if err != nil {
		return st, b.unavailable("get", err)
	}
	if obj == nil {
		return st, nil
	}
	rec := recordOf(obj)
	ttl := time.Duration(rec.LeaseDurationSeconds) * time.Second
	remaining := time.Duration(-1)
	if rec.RenewTime != 0 {
		remaining = time.Until(time.UnixMicro(rec.RenewTime).Add(ttl))
		if remaining <= 0 {
			return st, nil // ran out by this host's clock: nobody renews it
		}
	}
	if !rec.held() {
		return st, nil
	}
	st.Held = true
	st.Identity = rec.HolderIdentity
	st.Token = holderToken(obj)
	st.Holders = holderGrant(obj).Holders
	st.TTL = ttl
	st.Remaining = remaining
	return st, nil
}

// History implements backends.Backend from the Lease's leaderrun/history
// annotation.
func (b *Backend) History(ctx context.Context, limit int) ([]backends.Term, error) {
	obj, err := b.get(ctx)
	if err != nil {
		return nil, b.unavailable("get", err)
	}
	if obj == nil {
		return nil, nil
	}
	return backends.NewestFirst(terms(obj), limit), nil
}

// leaseSeconds is d in whole seconds, rounded up: the Lease may only last
// longer than asked, never shorter.
func leaseSeconds(d time.Duration) int32 {
	s := (d + time.Second - 1) / time.Second
	return int32(min(max(s, 1), 1<<31-1))
}

// missedRenewal is how much sooner than leaseDurationSeconds after the
// last renewal's send time a client-go elector may take over when
// renewals come less than a second apart: it sees the record change only
// once per second (see the package doc).
const missedRenewal = time.Second

// guaranteedTTL is how long after the send time of its last acknowledged
// renewal a holder that writes leaseDurationSeconds = seconds and renews
// every retry keeps every elector out, client-go's included. It is never
// zero, which would mean a lease that never expires: a lease of one second
// renewed faster than once a second guarantees nearly nothing
// (CheckLeaseDuration refuses it).
func guaranteedTTL(seconds int32, retry time.Duration) time.Duration {
	ttl := time.Duration(seconds) * time.Second
	if retry < time.Second {
		ttl -= missedRenewal
	}
	return max(ttl, time.Nanosecond)
}

// GuaranteedTTL is what Lease.TTL will report for a campaign with lease
// duration d by a holder that renews every retry: the seconds written,
// less the second a client-go elector may miss when retry is under 1s. A
// caller can check its timings with it before campaigning.
func GuaranteedTTL(d, retry time.Duration) time.Duration {
	return guaranteedTTL(leaseSeconds(d), retry)
}

// CheckLeaseDuration implements backends.LeaseDurationChecker:
// leaseDurationSeconds is an int32 of seconds, and with renewals under a
// second apart a client-go elector may count it a second short, so it must
// be more than a second then.
func (b *Backend) CheckLeaseDuration(d time.Duration) error {
	if d <= 0 || d > (1<<31-1)*time.Second {
		return fmt.Errorf("kubernetes: lease duration %v out of range: want 1s to %v", d, (1<<31-1)*time.Second)
	}
	if b.retry < time.Second && leaseSeconds(d) <= 1 {
		return fmt.Errorf("kubernetes: lease duration %v is written as %ds, and with renewals less than 1s apart "+
			"a client-go elector may see the lease expire a second early: want more than 1s, or --retry-period 1s or more", d, leaseSeconds(d))
	}
	return nil
}

var (
	_ backends.Backend              = (*Backend)(nil)
	_ backends.LeaseDurationChecker = (*Backend)(nil)
	_ backends.Lease                = (*lease)(nil)
)
