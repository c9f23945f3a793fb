package consul

import (
	"encoding/json"
	"time"

	"github.com/hashicorp/consul/api"
)

// recordFlags, in the flags of the lock key, marks its value as a record
// (see record). A value without them was written by an older leaderrun or
// another tool: the holder's identity as plain text.
//
// Format 2 holders do not write the key at renewals. Format 1 holders did,
// and format 1 followers timed them by it: a new holder's record must not
// look like one to them, or they would destroy its session a lease after
// its grant. A format 1 record is still read (for its lock-delay).
const (
	recordFlags   uint64 = 0x6c72756e_00000002 // "lrun", format 2
	recordFlagsV1 uint64 = 0x6c72756e_00000001
)

// record is the value of the lock key while leaderrun holds it, in JSON so
// that `consul kv get` shows it.
type record struct {
	Identity string `json:"identity"`
	// Token is the holder's fencing token. It is 0 in the record the
	// acquisition writes, which cannot know it: the key's ModifyIndex,
	// which nothing moves while the key is held, is the token then. The
	// release writes it.
	Token uint64 `json:"token,omitempty"`
	// TTL and LockDelay are those of the holder's session: the lock-delay
	// tells the first in line how long an invalidated key stays refused.
	TTL       string `json:"ttl"`
	LockDelay string `json:"lock_delay"`
	// Holders is the size of the holder's pool (--holders), absent for a
	// lock of one holder.
	Holders int `json:"holders,omitempty"`
}

func (r record) encode() []byte {
	data, _ := json.Marshal(r)
	return data
}

// holder is what a reader of the held key knows about its holder.
type holder struct {
	session  string
	identity string
	token    uint64
	// ttl is the holder's session TTL, 0 if not known.
	ttl time.Duration
	// lockDelay is the holder's lock-delay, -1 if not known.
	lockDelay time.Duration
	// holders is the size of the holder's pool, 0 if none is recorded.
	holders int
}

// parseHolder reads a held key's value: a record, or a plain identity.
func parseHolder(pair *api.KVPair) holder {
	h := holder{session: pair.Session, identity: string(pair.Value), token: pair.ModifyIndex, lockDelay: -1}
	var r record
	if (pair.Flags != recordFlags && pair.Flags != recordFlagsV1) || json.Unmarshal(pair.Value, &r) != nil {
		return h
	}
	h.identity = r.Identity
	if r.Token != 0 {
		h.token = r.Token
	}
	if d, err := time.ParseDuration(r.LockDelay); err == nil {
		h.lockDelay = d
	}
	if d, err := time.ParseDuration(r.TTL); err == nil && d > 0 {
		h.ttl = d
	}
	if r.Holders > 1 {
		h.holders = r.Holders
	}
	return h
}
