package backends

import (
	"cmp"
	"slices"
)

// NewestFirst sorts terms by token, newest first, drops duplicates of one
// token (a retried write) and keeps at most limit of them (limit <= 0:
// HistoryLimit). Backends that keep terms as separate records use it to
// answer History.
func NewestFirst(terms []Term, limit int) []Term {
	if limit <= 0 || limit > HistoryLimit {
		limit = HistoryLimit
	}
	slices.SortStableFunc(terms, func(a, b Term) int { return cmp.Compare(b.Token, a.Token) })
	terms = slices.CompactFunc(terms, func(a, b Term) bool { return a.Token == b.Token })
	if len(terms) > limit {
		terms = terms[:limit]
	}
	return terms
}
