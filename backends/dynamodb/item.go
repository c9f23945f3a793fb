package dynamodb

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/leaderrun/leaderrun/backends"
)

// Attributes of the items (docs/backends/dynamodb.md). Expressions name
// them through placeholders: "name" and others are reserved words.
const (
	attrName     = "name"     // the partition key
	attrHolder   = "holder"   // the holder's identity; "" when free
	attrOwner    = "owner"    // the holder's candidacy (backends.Claim.Owner)
	attrRVN      = "rvn"      // record version number: random, new at every write
	attrToken    = "token"    // lock item: the holder's token; counter: the last token granted
	attrLease    = "lease_ms" // the holder's lease duration, in milliseconds
	attrAcquired = "acquired" // wall clock of the holder at the grant, for status only
	attrRenewed  = "renewed"  // wall clock of the holder at its last renewal, for status and --try only
	attrPool     = "pool"     // lock item, in a pool of more than one holder: the pool's size and the grant's token
	attrMarkers  = "markers"  // markers item: the completion markers, JSON
	attrTerms    = "terms"    // history item: the terms, JSON, oldest first
)

// Suffixes of the items beside the lock item: neither a lock name nor a
// prefix has a '#', so they never name another lock's item.
const (
	suffixCounter = "#token"
	suffixMarkers = "#markers"
	suffixHistory = "#history"
)

// recordOf reads a lock item (nil: none). One without an rvn (written by
// hand) reads as no record, taken only by a grant conditional on none.
func recordOf(item map[string]types.AttributeValue) (backends.Record, error) {
	rec := backends.Record{Left: backends.NoClock, Waiting: -1}
	if item == nil {
		return rec, nil
	}
	rec.Holder, rec.Owner, rec.Version = stringAttr(item, attrHolder), stringAttr(item, attrOwner), stringAttr(item, attrRVN)
	rec.Acquired, rec.Renewed = parseTime(stringAttr(item, attrAcquired)), parseTime(stringAttr(item, attrRenewed))
	var err error
	if rec.Token, err = numberAttr(item, attrToken); err != nil {
		return rec, err
	}
	leaseMS, err := numberAttr(item, attrLease)
	if err != nil {
		return rec, err
	}
	rec.TTL = time.Duration(min(leaseMS, 1<<53)) * time.Millisecond
	rec.Holders = poolOf(item, rec.Token)
	return rec, nil
}

// Keys of the pool attribute's map: the pool's size, and the token of the
// grant that recorded it.
const (
	poolHolders = "holders"
	poolToken   = "token"
)

func poolAttr(holders int, token uint64) types.AttributeValue {
	return &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{poolHolders: num(int64(holders)), poolToken: unum(token)}}
}

// poolOf is the pool size item records for the grant of token; 0 if none,
// or one of another grant (an older leaderrun's leaves the attribute).
func poolOf(item map[string]types.AttributeValue, token uint64) int {
	m, ok := item[attrPool].(*types.AttributeValueMemberM)
	if !ok {
		return 0
	}
	t, err := numberAttr(m.Value, poolToken)
	if err != nil || t != token {
		return 0
	}
	if n, ok := m.Value[poolHolders].(*types.AttributeValueMemberN); ok {
		return backends.ParseHolders(n.Value)
	}
	return 0
}

func stringAttr(item map[string]types.AttributeValue, attr string) string {
	if v, ok := item[attr].(*types.AttributeValueMemberS); ok {
		return v.Value
	}
	return ""
}

// numberAttr is the number attribute attr of item, 0 if it has none.
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

func key(name string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{attrName: str(name)}
}

// newRVN is 128 random bits: no two writes, by any host, write the same.
func newRVN() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func formatTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// parseTime reads formatTime's form; the zero time if it is not that.
func parseTime(s string) time.Time {
	t, _ := time.Parse(time.RFC3339Nano, s)
	return t
}
