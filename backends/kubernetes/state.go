package kubernetes

import (
	"encoding/json"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"

	"github.com/leaderrun/leaderrun/backends"
)

// Annotations on the Lease that hold what client-go's record has no field
// for. client-go keeps the annotations of the Lease it updates, so they
// survive its electors' writes.
const (
	// annotationToken is the grant that the current fencing token belongs
	// to (see grant).
	annotationToken = "leaderrun/token"
	// annotationMarkers holds the completion markers (see Lease.Complete).
	annotationMarkers = "leaderrun/markers"
	// annotationHistory holds the terms of the lock, oldest first.
	annotationHistory = "leaderrun/history"
)

// Bounds of the annotations: the apiserver refuses a Lease whose
// annotations total more than 256 KiB, and every renewal sends and every
// watcher receives the whole object.
const (
	maxHistoryBytes = 128 << 10
	maxMarkerBytes  = 64 << 10
)

// grant is the annotationToken: the token and the grant it was issued to,
// with the size of the holder's pool (--holders) when it is more than 1.
// A token belongs to the current holder only if the holder and the count of
// transitions still match: an elector that does not know the annotation
// (client-go) changes the holder and counts a transition, and so disowns
// it, pool size and all.
type grant struct {
	Token       uint64 `json:"token,string"`
	Holder      string `json:"holder"`
	Transitions int32  `json:"transitions"`
	Holders     int    `json:"holders,omitempty"`
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

// holderToken is the fencing token of the current holder, 0 if there is no
// holder or it holds a grant that leaderrun did not make.
func holderToken(o *coordinationv1.Lease) uint64 { return holderGrant(o).Token }

// holderGrant is the grant of the current holder, zero if there is no
// holder or it holds a grant that leaderrun did not make. A pool size
// that is not one leaderrun writes reads as 0.
func holderGrant(o *coordinationv1.Lease) grant {
	g, ok := lastGrant(o)
	rec := recordOf(o)
	if !ok || !rec.held() || g.Holder != rec.HolderIdentity || g.Transitions != rec.LeaseTransitions {
		return grant{}
	}
	if g.Holders < 2 {
		g.Holders = 0
	}
	return g
}

// setGrant records g.
func setGrant(o *coordinationv1.Lease, g grant) {
	annotations(o)[annotationToken] = string(mustJSON(g))
}

// markers are the completion markers in o that have not expired at now.
func markers(o *coordinationv1.Lease, now time.Time) []backends.Marker {
	var all []backends.Marker
	if v, ok := o.Annotations[annotationMarkers]; ok {
		_ = json.Unmarshal([]byte(v), &all) // a mangled annotation reads as none
	}
	return slices.DeleteFunc(all, func(m backends.Marker) bool { return !m.Expires.After(now) })
}

// setMarker records m, replacing the marker of the same key, and drops the
// expired markers. If the annotation grows past maxMarkerBytes the oldest
// markers go first.
func setMarker(o *coordinationv1.Lease, m backends.Marker, now time.Time) {
	all := slices.DeleteFunc(markers(o, now), func(old backends.Marker) bool { return old.Key == m.Key })
	all = append(all, m)
	slices.SortStableFunc(all, func(a, b backends.Marker) int { return a.At.Compare(b.At) })
	data := mustJSON(all)
	for len(data) > maxMarkerBytes && len(all) > 1 {
		all = all[1:]
		data = mustJSON(all)
	}
	annotations(o)[annotationMarkers] = string(data)
}

// terms is the history in o, oldest first.
func terms(o *coordinationv1.Lease) []backends.Term {
	var all []backends.Term
	if v, ok := o.Annotations[annotationHistory]; ok {
		_ = json.Unmarshal([]byte(v), &all) // a mangled annotation reads as none
	}
	return all
}

// appendTerm adds term to the history, keeping the newest
// backends.HistoryLimit terms within maxHistoryBytes.
func appendTerm(o *coordinationv1.Lease, term backends.Term) {
	all := append(terms(o), term)
	if n := len(all) - backends.HistoryLimit; n > 0 {
		all = all[n:]
	}
	data := mustJSON(all)
	for len(data) > maxHistoryBytes && len(all) > 1 {
		all = all[1:]
		data = mustJSON(all)
	}
	annotations(o)[annotationHistory] = string(data)
}

func mustJSON(v any) []byte {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err) // only strings, numbers and times
	}
	return data
}
