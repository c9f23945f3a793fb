package kubernetes

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// record is the election state in a Lease's spec, as client-go's
// LeaderElectionRecord reads it. Two records are the same state when all
// their fields are equal: a follower restarts its clock whenever the
// record changes, exactly as client-go's elector does.
type record struct {
	HolderIdentity       string
	LeaseDurationSeconds int32
	AcquireTime          int64 // microseconds since the epoch, 0 if unset: compared, never trusted as a clock
	RenewTime            int64
	LeaseTransitions     int32
	Strategy             string
	PreferredHolder      string
}

// held reports whether the record names a holder. client-go writes an empty
// holderIdentity when a leader steps down; such a Lease is free at once.
func (r record) held() bool { return r.HolderIdentity != "" }

// recordOf reads the record of a Lease.
func recordOf(l *coordinationv1.Lease) record {
	s := l.Spec
	r := record{
		HolderIdentity:       deref(s.HolderIdentity),
		LeaseDurationSeconds: deref(s.LeaseDurationSeconds),
		LeaseTransitions:     deref(s.LeaseTransitions),
		PreferredHolder:      deref(s.PreferredHolder),
	}
	if s.Strategy != nil {
		r.Strategy = string(*s.Strategy)
	}
	if s.AcquireTime != nil {
		r.AcquireTime = s.AcquireTime.UnixMicro()
	}
	if s.RenewTime != nil {
		r.RenewTime = s.RenewTime.UnixMicro()
	}
	return r
}

// setRecord writes r into the spec the way client-go's LeaseLock does:
// every field of the record is set (holderIdentity "" for a free Lease),
// strategy and preferredHolder only if not empty. Other spec fields are
// left as they are.
func setRecord(l *coordinationv1.Lease, r record) {
	s := &l.Spec
	s.HolderIdentity = &r.HolderIdentity
	s.LeaseDurationSeconds = &r.LeaseDurationSeconds
	s.AcquireTime = microTime(r.AcquireTime)
	s.RenewTime = microTime(r.RenewTime)
	s.LeaseTransitions = &r.LeaseTransitions
	s.Strategy, s.PreferredHolder = nil, nil
	if r.Strategy != "" {
		strategy := coordinationv1.CoordinatedLeaseStrategy(r.Strategy)
		s.Strategy = &strategy
	}
	if r.PreferredHolder != "" {
		s.PreferredHolder = &r.PreferredHolder
	}
}

func microTime(us int64) *metav1.MicroTime {
	if us == 0 {
		return nil
	}
	t := metav1.NewMicroTime(time.UnixMicro(us).UTC())
	return &t
}

// stamp is t as a record's time: microseconds, what a MicroTime keeps.
func stamp(t time.Time) int64 { return t.UnixMicro() }

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// newLeaseObject is a Lease to create: name and namespace, nothing else.
func newLeaseObject(namespace, name string) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Annotations: map[string]string{}}}
}

// annotations is the Lease's annotations, made if there are none.
func annotations(l *coordinationv1.Lease) map[string]string {
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	return l.Annotations
}

// revision is the resourceVersion as a number. The apiserver's storage
// gives every write the revision of the etcd cluster behind it, and the API
// defines the resource versions of one resource as decimal integers that
// compare in the order of the writes (see the package doc: the fencing
// token relies on it).
func revision(l *coordinationv1.Lease) (uint64, error) {
	rv, err := strconv.ParseUint(l.ResourceVersion, 10, 64)
	if err != nil || rv == 0 {
		return 0, fmt.Errorf("%w: lease %s has resourceVersion %q; fencing tokens need an apiserver "+
			"whose resource versions are decimal revisions, as etcd's are", errNotNumeric, l.Name, l.ResourceVersion)
	}
	return rv, nil
}

// newer reports whether l is a later state of the Lease than old (nil: no
// state yet). States whose versions cannot be compared count as newer.
func newer(l, old *coordinationv1.Lease) bool {
	if old == nil {
		return true
	}
	a, errA := revision(l)
	b, errB := revision(old)
	return errA != nil || errB != nil || a > b
}

// errNotNumeric is a Lease whose resourceVersion this backend cannot use.
var errNotNumeric = errors.New("kubernetes: resourceVersion is not a number")

// codeOf is the HTTP status of an error that the apiserver answered, 0
// for any other error.
func codeOf(err error) int {
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		return int(st.Status().Code)
	}
	return 0
}

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }
func isConflict(err error) bool { return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) }

// isRefusal reports whether the apiserver refused who we are or what we
// asked: final in every mode, as a retry would be refused again.
// Unauthorized (401) comes after client-go refreshed what it could (an
// exec plugin's credential), Forbidden (403) names the verb RBAC denied,
// Invalid (422) and BadRequest (400) a Lease the server will not take.
func isRefusal(err error) bool {
	switch codeOf(err) {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusBadRequest,
		http.StatusUnprocessableEntity, http.StatusRequestEntityTooLarge, http.StatusMethodNotAllowed:
		return true
	}
	return false
}

// errProtocol: the apiserver, or something in its place, sent what no
// apiserver sends: an answer or watch event too large or not decodable.
var errProtocol = errors.New("kubernetes: the server's answer is not one of an apiserver")

// transient reports whether a failed request may succeed if sent again: no
// answer at all, a server error, or throttling. A Conflict or NotFound is
// an answer about the Lease and handled where it is met; an answer too
// large, a redirect or a stream that cannot be decoded is no apiserver's.
func transient(err error) bool {
	switch code := codeOf(err); {
	case code == 0:
		return !errors.Is(err, errNotNumeric) && !errors.Is(err, errTooLarge) && !errors.Is(err, errRedirect) &&
			!errors.Is(err, errProtocol)
	case code >= 500, code == http.StatusTooManyRequests:
		return true
	}
	return false
}
