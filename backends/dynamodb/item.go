package dynamodb

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/leaderrun/leaderrun/backends"
)

// Attributes of the items (see the package doc). Every expression names
// them through placeholders: "name" and others are reserved words.
const (
	attrName     = "name"     // the partition key
	attrHolder   = "holder"   // the holder's identity; "" when free
	attrRVN      = "rvn"      // record version number: random, new at every write
	attrToken    = "token"    // lock item: the holder's token; counter: the last token granted
	attrLease    = "lease_ms" // the holder's lease duration, in milliseconds
	attrAcquired = "acquired" // wall clock of the holder at the grant, for status only
	attrRenewed  = "renewed"  // wall clock of the holder at its last renewal, for status and --try only
	attrPool     = "pool"     // lock item, in a pool of more than one holder: the pool's size and the grant's token
	attrMarkers  = "markers"  // markers item: the completion markers, JSON
	attrTerms    = "terms"    // history item: the terms, JSON, oldest first
)

// Suffixes of the items kept beside the lock item <prefix><lock>. A lock
// name has no '#' (backends.ValidateLockName) and the prefix may not have
// one either (spec.ValidatePrefix), so they never name another lock's item.
const (
	suffixCounter = "#token"
	suffixMarkers = "#markers"
	suffixHistory = "#history"
)

// Bounds of the JSON that the markers and history items hold: every
// completion and every release rewrites the whole item, and DynamoDB bills
// writes by the KiB.
const (
	maxMarkerBytes  = 32 << 10
	maxHistoryBytes = 64 << 10
)

// record is the lock item's state.
type record struct {
	holder   string
	rvn      string
	token    uint64
	leaseMS  int64
	acquired string
	renewed  string
	holders  int // the size of the holder's pool; 0 if its grant recorded none
}

// held reports whether the record names a holder.
func (r *record) held() bool { return r.holder != "" }

// lease is the holder's lease duration as the record states it.
func (r *record) lease() time.Duration { return time.Duration(r.leaseMS) * time.Millisecond }

// parseRecord reads a lock item; nil for no item.
func parseRecord(item map[string]types.AttributeValue) (*record, error) {
	if item == nil {
		return nil, nil
	}
	r := &record{
		holder:   stringAttr(item, attrHolder),
		rvn:      stringAttr(item, attrRVN),
		acquired: stringAttr(item, attrAcquired),
		renewed:  stringAttr(item, attrRenewed),
	}
	var err error
	if r.token, err = numberAttr(item, attrToken); err != nil {
		return nil, err
	}
	lease, err := numberAttr(item, attrLease)
	if err != nil {
		return nil, err
	}
	r.leaseMS = int64(min(lease, 1<<53))
	r.holders = poolOf(item, r.token)
	return r, nil
}

// Keys of the pool attribute's map.
const (
	poolHolders = "holders"
	poolToken   = "token"
)

// poolAttr is the pool attribute of a grant of token in a pool of holders:
// the pool's size, with the token of the grant that recorded it.
func poolAttr(holders int, token uint64) types.AttributeValue {
	return &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{
		poolHolders: num(int64(holders)),
		poolToken:   unum(token),
	}}
}

// poolOf is the pool size that item records for the grant of token; 0 if
// it records none, or one of another grant (an older leaderrun's grant
// leaves the attribute as it finds it), or one that does not read.
func poolOf(item map[string]types.AttributeValue, token uint64) int {
	m, ok := item[attrPool].(*types.AttributeValueMemberM)
	if !ok {
		return 0
	}
	t, err := numberAttr(m.Value, poolToken)
	if err != nil || t != token {
		return 0
	}
	n, ok := m.Value[poolHolders].(*types.AttributeValueMemberN)
	if !ok {
		return 0
	}
	return backends.ParseHolders(n.Value)
}

// stringAttr is the string attribute attr of item, "" if it has none.
func stringAttr(item map[string]types.AttributeValue, attr string) string {
	if v, ok := item[attr].(*types.AttributeValueMemberS); ok {
		return v.Value
	}
	return ""
}

// numberAttr is the number attribute attr of item, 0 if it has none; an
// error if it is not a whole number that fits a uint64.
func numberAttr(item map[string]types.AttributeValue, attr string) (uint64, error) {
	v, ok := item[attr]
	if !ok {
		return 0, nil
	}
	n, ok := v.(*types.AttributeValueMemberN)
	if !ok {
		return 0, fmt.Errorf("dynamodb: attribute %s is not a number", attr)
	}
	u, err := strconv.ParseUint(n.Value, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("dynamodb: attribute %s is %q, not a token: %w", attr, n.Value, err)
	}
	return u, nil
}

func str(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }

func num(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}

func unum(n uint64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatUint(n, 10)}
}

// key is the primary key of the item named name.
func key(name string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{attrName: str(name)}
}

// newRVN is a record version number: 128 random bits, so that no two
// writes, by any host, ever write the same one.
func newRVN() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// formatTime is how the items spell a wall-clock time.
func formatTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// parseTime reads formatTime's form; the zero time if it is not that.
func parseTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}
	}
	return t
}

// parseMarkers reads the markers item's JSON; a mangled attribute reads as
// none, so that a leader can always write it afresh.
func parseMarkers(item map[string]types.AttributeValue) []backends.Marker {
	var all []backends.Marker
	if v := stringAttr(item, attrMarkers); v != "" {
		_ = json.Unmarshal([]byte(v), &all)
	}
	return all
}

// withMarker is all with m in place of the marker of the same key, the
// markers expired at now dropped, oldest first, trimmed to maxMarkerBytes
// from the oldest.
func withMarker(all []backends.Marker, m backends.Marker, now time.Time) string {
	all = slices.DeleteFunc(slices.Clone(all), func(old backends.Marker) bool {
		return old.Key == m.Key || !old.Expires.After(now)
	})
	all = append(all, m)
	slices.SortStableFunc(all, func(a, b backends.Marker) int { return a.At.Compare(b.At) })
	data := mustJSON(all)
	for len(data) > maxMarkerBytes && len(all) > 1 {
		all = all[1:]
		data = mustJSON(all)
	}
	return string(data)
}

// parseTerms reads the history item's JSON, oldest first; a mangled
// attribute reads as none.
func parseTerms(item map[string]types.AttributeValue) []backends.Term {
	var all []backends.Term
	if v := stringAttr(item, attrTerms); v != "" {
		_ = json.Unmarshal([]byte(v), &all)
	}
	return all
}

// withTerm is the history all with term appended (unless a term of the
// same token is there: a retried write), keeping the newest
// backends.HistoryLimit terms within maxHistoryBytes.
func withTerm(all []backends.Term, term backends.Term) string {
	if !slices.ContainsFunc(all, func(t backends.Term) bool { return t.Token == term.Token }) {
		all = append(slices.Clone(all), term)
	}
	if n := len(all) - backends.HistoryLimit; n > 0 {
		all = all[n:]
	}
	data := mustJSON(all)
	for len(data) > maxHistoryBytes && len(all) > 1 {
		all = all[1:]
		data = mustJSON(all)
	}
	return string(data)
}

func mustJSON(v any) []byte {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err) // only markers and terms: strings, numbers and times
	}
	return data
}
