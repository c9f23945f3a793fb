// Package kubernetes is the Kubernetes store: a lock is a
// coordination.k8s.io/v1 Lease named after it, holding client-go's
// leader-election record, so that `kubectl get lease` shows the holder and
// client-go electors on the same Lease and leaderrun exclude each other.
// A backends.RecordLock without a clock (the driver times the record, as
// client-go's elector does), written by updates conditional on the
// resourceVersion read. docs/backends/kubernetes.md says how, why the
// token (leaderrun/token) never goes backwards, and how every answer is
// bounded.
package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"github.com/leaderrun/leaderrun/backends"
)

// Store is the Leases of one namespace, reached through one REST client.
type Store struct {
	rest      *rest.RESTClient
	host      string // the server as messages name it, without credentials
	namespace string
	// allowed holds the verbs ("get", "create", "update", "watch") the
	// apiserver has authorized on each Lease, as "verb name" (a Role may
	// name its Leases): a 403 to one of them later is its authorizer not
	// yet synced after a restart, which passes.
	allowed sync.Map
}

// Name implements backends.Store.
func (s *Store) Name() string { return "kubernetes" }

// Lock implements backends.Store: the Lease named name (a slot's,
// lock.slotI, is a valid Lease name whenever lock is).
func (s *Store) Lock(name string) backends.Lock { return &lock{s: s, name: name} }

// Close implements backends.Store: it closes idle connections.
func (s *Store) Close() error {
	s.rest.Client.CloseIdleConnections()
	return nil
}

const (
	// requestTimeout bounds every request but a watch.
	requestTimeout = 10 * time.Second
	// watchTimeoutSeconds ends each watch after 5 minutes (not 30 to 60):
	// a watch that broke silently is replaced by then, which bounds how
	// long a follower may miss a release.
	watchTimeoutSeconds = "300"
)

// leases is a request of verb on the Leases of the namespace, which
// client-go does not retry: the driver and the runner decide.
func (s *Store) leases(verb string) *rest.Request {
	return s.rest.Verb(verb).Namespace(s.namespace).Resource("leases").MaxRetries(0)
}

func (s *Store) get(ctx context.Context, name string) (*coordinationv1.Lease, error) {
	return s.do(ctx, "get", name, s.leases(http.MethodGet).Name(name))
}

func (s *Store) create(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	return s.do(ctx, "create", l.Name, s.leases(http.MethodPost).Body(l))
}

// update replaces the Lease with l if it is still at l's resourceVersion.
func (s *Store) update(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	return s.do(ctx, "update", l.Name, s.leases(http.MethodPut).Name(l.Name).Body(l))
}

func (s *Store) do(ctx context.Context, verb, name string, req *rest.Request) (*coordinationv1.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	out := &coordinationv1.Lease{}
	err := req.Do(ctx).Into(out)
	s.authorized(verb, name, err)
	return out, err
}

// authorized notes that the apiserver authorized verb on the Lease name,
// if err is nil or an answer that authorization let through (404 and 409
// included).
func (s *Store) authorized(verb, name string, err error) {
	var st apierrors.APIStatus
	if err == nil || errors.As(err, &st) && !apierrors.IsForbidden(err) && !apierrors.IsUnauthorized(err) {
		s.allowed.Store(verb+" "+name, true)
	}
}

// syncing reports whether err, a 403 to verb on the Lease name, comes
// from an apiserver that authorized it before: one that has just
// restarted answers 403 until its authorizer's caches have synced, and a
// waiting candidate retries it as an outage. A 403 to a verb never
// authorized on that Lease stays a refusal, at once.
func (s *Store) syncing(verb, name string, err error) bool {
	_, ok := s.allowed.Load(verb + " " + name)
	return ok && apierrors.IsForbidden(err)
}

// watch watches the Lease name, selected by name (which RBAC authorizes
// as a watch of that name), from version rv ("": from its current state).
func (s *Store) watch(ctx context.Context, name, rv string) (watch.Interface, error) {
	req := s.leases(http.MethodGet).Param("watch", "true").Param("fieldSelector", "metadata.name="+name).
		Param("allowWatchBookmarks", "true").Param("timeoutSeconds", watchTimeoutSeconds)
	if rv != "" {
		req = req.Param("resourceVersion", rv)
	}
	w, err := req.Watch(ctx)
	s.authorized("watch", name, err)
	return w, err
}

// ValidateLockName returns an error unless name can name both a leaderrun
// lock (backends.ValidateLockName) and a Lease (an RFC 1123 subdomain).
func ValidateLockName(name string) error {
	if backends.ValidateLockName(name) != nil || len(validation.IsDNS1123Subdomain(name)) > 0 {
		return fmt.Errorf("kubernetes: lock name %q is not a valid Lease name: want a lowercase RFC 1123 subdomain, "+
			"1-128 characters from [a-z0-9.-], each dot-separated part starting and ending with a letter or digit", name)
	}
	return nil
}

// ValidateNamespace returns an error unless ns can name a namespace.
func ValidateNamespace(ns string) error {
	if len(validation.IsDNS1123Label(ns)) > 0 {
		return fmt.Errorf("kubernetes: namespace %q is not a valid namespace name: want a lowercase RFC 1123 label, "+
			"1-63 characters from [a-z0-9-], starting and ending with a letter or digit", ns)
	}
	return nil
}

// leaseSeconds is d in whole seconds, rounded up, never shorter.
func leaseSeconds(d time.Duration) int32 {
	s := (d + time.Second - 1) / time.Second
	return int32(min(max(s, 1), 1<<31-1))
}

// guaranteedTTL is how long after its last renewal's send time a holder
// that writes leaseDurationSeconds = seconds and renews every retry keeps
// every elector out: a second less if retry is under a second, as a
// client-go elector, which compares whole seconds, may miss a renewal
// (docs/backends/kubernetes.md). Never zero: a lease that never expires.
func guaranteedTTL(seconds int32, retry time.Duration) time.Duration {
	ttl := time.Duration(seconds) * time.Second
	if retry < time.Second {
		ttl -= time.Second
	}
	return max(ttl, time.Nanosecond)
}

// CheckTimings refuses, before anything is taken, timings that the runner
// would refuse once the Lease is granted.
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
)

// revision is the resourceVersion as a number: the token relies on the
// resource versions of one object being decimal integers that compare in
// the order of the writes (etcd revisions).
func revision(o *coordinationv1.Lease) (uint64, error) {
	rv, err := strconv.ParseUint(o.ResourceVersion, 10, 64)
	if err != nil || rv == 0 {
		return 0, fmt.Errorf("%w: lease %s has resourceVersion %q; fencing tokens need an apiserver "+
			"whose resource versions are decimal revisions, as etcd's are", errProtocol, o.Name, o.ResourceVersion)
	}
	return rv, nil
}

// errProtocol: what no apiserver sends, which asking again cannot mend.
var errProtocol = errors.New("kubernetes: an answer no apiserver gives")

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }
func isConflict(err error) bool { return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) }
func isExpired(err error) bool  { return apierrors.IsResourceExpired(err) || apierrors.IsGone(err) }

// transient reports whether a failed request may succeed if sent again:
// no answer at all, a server error, or throttling. Every other answer is
// a refusal (401 after client-go refreshed what it could, 403, a Lease the
// server will not take), and so is errProtocol.
func transient(err error) bool {
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return !errors.Is(err, errProtocol)
	}
	code := st.Status().Code
	return code >= 500 || code == http.StatusTooManyRequests
}

func connectionClosed(err error) bool {
	return errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}
