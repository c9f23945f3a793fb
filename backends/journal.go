package backends

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
)

// The documents a lock keeps beside its lease, for every store: its
// history (DocHistory), a JSON array of Terms, oldest first, and its
// completion markers (DocMarkers), a JSON array of Markers. Both are read
// and replaced whole by writes conditional on the version read (a marker
// also on the lease, see Lease.Complete), and both are bounded, so that a
// store's object, item or annotation never grows past what it takes.
const (
	// MaxHistoryDoc bounds the history document, the larger of the two:
	// the oldest terms go first.
	MaxHistoryDoc = 64 << 10
	// maxMarkers and maxMarkerBytes bound the markers document: the
	// expired go first, then the oldest.
	maxMarkers     = 64
	maxMarkerBytes = 16 << 10
	// docAttempts bounds the read-modify-write of a document that keeps
	// meeting other writers.
	docAttempts = 8
)

// updateDoc reads document name of lk, applies change to its content and
// writes it back with write, again while another writer came first.
func updateDoc(ctx context.Context, lk Lock, name string, change func([]byte) ([]byte, error),
	write func(context.Context, Doc) error) error {
	var err error
	for range docAttempts {
		var d Doc
		if d, err = lk.ReadDoc(ctx, name); err != nil {
			return err
		}
		if d.Data, err = change(d.Data); err != nil {
			return err
		}
		if err = write(ctx, d); !errors.Is(err, ErrConflict) {
			return err
		}
	}
	return fmt.Errorf("%s of %s: %w", name, lk.Key(), err)
}

// decode reads a document. One that cannot be read (written by hand, or
// cut short) holds nothing: it starts over rather than stops every
// release.
func decode[T any](data []byte) []T {
	var ts []T
	if len(data) > MaxDoc || json.Unmarshal(data, &ts) != nil {
		return nil
	}
	return ts
}

// DecodeTerms reads a history document.
func DecodeTerms(data []byte) []Term { return decode[Term](data) }

// encodeNewest encodes the last keep of items in at most limit bytes, the
// first going first (the newest always stays).
func encodeNewest[T any](items []T, keep, limit int) ([]byte, error) {
	items = items[max(len(items)-keep, 0):]
	for {
		out, err := json.Marshal(items)
		if err != nil || len(out) <= limit || len(items) == 1 {
			return out, err
		}
		items = items[1:]
	}
}

// appendTerm adds t to lk's history.
func appendTerm(ctx context.Context, lk Lock, t Term) error {
	return updateDoc(ctx, lk, DocHistory, func(data []byte) ([]byte, error) {
		terms := append(DecodeTerms(data), t)
		slices.SortStableFunc(terms, func(a, b Term) int { return cmp.Compare(a.Token, b.Token) })
		return encodeNewest(terms, HistoryLimit, MaxHistoryDoc)
	}, lk.WriteDoc)
}

// NewestFirst sorts terms by token, newest first, drops duplicates of one
// token (a retried write) and keeps at most limit of them (limit <= 0:
// HistoryLimit).
func NewestFirst(terms []Term, limit int) []Term {
	if limit <= 0 || limit > HistoryLimit {
		limit = HistoryLimit
	}
	slices.SortStableFunc(terms, func(a, b Term) int { return cmp.Compare(b.Token, a.Token) })
	terms = slices.CompactFunc(terms, func(a, b Term) bool { return a.Token == b.Token })
	return terms[:min(len(terms), limit)]
}

// withMarker is the markers document data with m added (in place of a
// marker of the same key), and the markers expired at now dropped.
func withMarker(data []byte, m Marker, now time.Time) ([]byte, error) {
	ms := slices.DeleteFunc(decode[Marker](data), func(o Marker) bool { return o.Key == m.Key || !o.Expires.After(now) })
	ms = append(ms, m)
	slices.SortStableFunc(ms, func(a, b Marker) int { return a.At.Compare(b.At) })
	return encodeNewest(ms, maxMarkers, maxMarkerBytes)
}

// completedIn returns the marker of key in lk, nil if there is none or it
// expired.
func completedIn(ctx context.Context, lk Lock, key string, now time.Time) (*Marker, error) {
	d, err := lk.ReadDoc(ctx, DocMarkers)
	if err != nil {
		return nil, err
	}
	for _, m := range decode[Marker](d.Data) {
		if m.Key == key && m.Expires.After(now) {
			return &m, nil
		}
	}
	return nil, nil
}
