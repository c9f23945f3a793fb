package kubernetes

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/leaderrun/leaderrun/backends"
)

// annotationToken holds the grant that the current fencing token belongs
// to; annotationDoc + a document's name holds that document. client-go
// keeps the annotations of the Lease it updates, so they survive its
// electors' writes.
const (
	annotationToken = "leaderrun/token"
	annotationDoc   = "leaderrun/"
)

// grant is the annotationToken: the token and the grant it was issued to,
// with the size of the holder's pool (--holders) when it is more than 1
// and the candidacy's owner (backends.Claim.Owner). A token belongs to the
// current holder only if the holder and the count of transitions still
// match: an elector that does not know the annotation (client-go) changes
// the holder and counts a transition, and so disowns it.
type grant struct {
	Token       uint64 `json:"token,string"`
	Holder      string `json:"holder"`
	Transitions int32  `json:"transitions"`
	Holders     int    `json:"holders,omitempty"`
	Owner       string `json:"owner,omitempty"`
}

// lastGrant is the grant recorded in o, if any (it may be a past one).
func lastGrant(o *coordinationv1.Lease) (grant, bool) {
	var g grant
	v, ok := o.Annotations[annotationToken]
	if !ok || json.Unmarshal([]byte(v), &g) != nil {
		return grant{}, false
	}
	return g, true
}

// recordOf is the record of the Lease o (nil: none). The owner, token and
// pool size are the holder's only if leaderrun granted it: a client-go
// elector's grant reads as Owner "" and Token 0.
func recordOf(o *coordinationv1.Lease) backends.Record {
	rec := backends.Record{Left: -1, Waiting: -1}
	if o == nil {
		return rec
	}
	s := o.Spec
	rec.Holder, rec.Version, rec.Handle = deref(s.HolderIdentity), o.ResourceVersion, o
	rec.TTL = time.Duration(deref(s.LeaseDurationSeconds)) * time.Second
	rec.Acquired, rec.Renewed = deref(s.AcquireTime).Time, deref(s.RenewTime).Time
	if g, ok := lastGrant(o); ok && rec.Holder != "" && g.Holder == rec.Holder && g.Transitions == deref(s.LeaseTransitions) {
		rec.Owner, rec.Token, rec.Holders = g.Owner, g.Token, g.Holders
	}
	return rec
}

// setRecord writes a record into o's spec as client-go's LeaseLock does
// (holderIdentity "" for a free Lease), leaving the other spec fields.
func setRecord(o *coordinationv1.Lease, holder string, seconds int32, acquired, renewed time.Time, transitions int32) {
	s := &o.Spec
	s.HolderIdentity, s.LeaseDurationSeconds, s.LeaseTransitions = new(holder), new(seconds), new(transitions)
	s.AcquireTime, s.RenewTime = new(metav1.NewMicroTime(acquired)), new(metav1.NewMicroTime(renewed))
}

// release gives o up as client-go's ReleaseOnCancel does: no holder, a
// lease of one second (so that electors that predate the empty-holder rule
// wait only that long), both times now, the count of transitions kept.
func release(o *coordinationv1.Lease, now time.Time) {
	setRecord(o, "", 1, now, now, deref(o.Spec.LeaseTransitions))
}

// freeLease is a free Lease to create.
func freeLease(namespace, name string, now time.Time) *coordinationv1.Lease {
	o := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
	release(o, now)
	return o
}

func setAnnotation(o *coordinationv1.Lease, key, value string) {
	if o.Annotations == nil {
		o.Annotations = map[string]string{}
	}
	o.Annotations[key] = value
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// revision is the resourceVersion as a number: the fencing token relies
// on the API's rule that the resource versions of one resource are
// decimal integers that compare in the order of the writes.
func revision(o *coordinationv1.Lease) (uint64, error) {
	rv, err := strconv.ParseUint(o.ResourceVersion, 10, 64)
	if err != nil || rv == 0 {
		return 0, fmt.Errorf("%w: lease %s has resourceVersion %q; fencing tokens need an apiserver "+
			"whose resource versions are decimal revisions, as etcd's are", errProtocol, o.Name, o.ResourceVersion)
	}
	return rv, nil
}

// errProtocol: the apiserver, or something in its place, sent what no
// apiserver sends (too large, not decodable, a redirect, a version that
// is not a number). Asking again cannot mend it.
var errProtocol = errors.New("kubernetes: an answer no apiserver gives")

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
func isExpired(err error) bool  { return apierrors.IsResourceExpired(err) || apierrors.IsGone(err) }

// transient reports whether a failed request may succeed if sent again:
// no answer at all, a server error, or throttling. Every other answer is a
// refusal (401 after client-go refreshed what it could, 403 naming the
// verb RBAC denied, a Lease the server will not take, a namespace that
// does not exist), and so is errProtocol.
func transient(err error) bool {
	switch code := codeOf(err); {
	case code == 0:
		return !errors.Is(err, errProtocol)
	case code >= 500, code == http.StatusTooManyRequests:
		return true
	}
	return false
}

// connectionClosed reports whether err is a connection closed under a
// request, before any answer came.
func connectionClosed(err error) bool {
	return errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}
