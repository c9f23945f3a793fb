package consulapi

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// KVPair is a key with its value and indexes.
type KVPair struct {
	Key         string
	CreateIndex uint64
	ModifyIndex uint64
	LockIndex   uint64
	Flags       uint64
	Value       []byte
	Session     string
}

// KVPairs is a list of keys.
type KVPairs []*KVPair

// KV is the key/value store.
type KV struct{ c *Client }

// KV returns the key/value store's endpoints.
func (c *Client) KV() *KV { return &KV{c} }

func kvPath(key string) string { return "/v1/kv/" + strings.TrimPrefix(key, "/") }

// Get reads key; nil if it does not exist.
func (k *KV) Get(key string, q *QueryOptions) (*KVPair, *QueryMeta, error) {
	var pairs []*KVPair
	meta, err := k.c.get(kvPath(key), nil, q, &pairs, true)
	if err != nil || len(pairs) == 0 {
		return nil, meta, err
	}
	return pairs[0], meta, nil
}

// List reads every key under prefix.
func (k *KV) List(prefix string, q *QueryOptions) (KVPairs, *QueryMeta, error) {
	var pairs KVPairs
	meta, err := k.c.get(kvPath(prefix), url.Values{"recurse": {""}}, q, &pairs, true)
	return pairs, meta, err
}

// Keys lists the keys under prefix, up to separator.
func (k *KV) Keys(prefix, separator string, q *QueryOptions) ([]string, *QueryMeta, error) {
	params := url.Values{"keys": {""}}
	if separator != "" {
		params.Set("separator", separator)
	}
	var keys []string
	meta, err := k.c.get(kvPath(prefix), params, q, &keys, true)
	return keys, meta, err
}

// Acquire takes p.Key for session p.Session, with p.Value, if no other
// session holds it and no lock-delay runs; it reports whether it did.
func (k *KV) Acquire(p *KVPair, w *WriteOptions) (bool, *WriteMeta, error) {
	return k.lockOp(p, "acquire", w)
}

// Release gives up p.Key if session p.Session holds it.
func (k *KV) Release(p *KVPair, w *WriteOptions) (bool, *WriteMeta, error) {
	return k.lockOp(p, "release", w)
}

func (k *KV) lockOp(p *KVPair, op string, w *WriteOptions) (bool, *WriteMeta, error) {
	if strings.HasPrefix(p.Key, "/") {
		return false, nil, fmt.Errorf("Invalid key. Key must not begin with a '/': %s", p.Key)
	}
	params := url.Values{op: {p.Session}}
	if p.Flags != 0 {
		params.Set("flags", strconv.FormatUint(p.Flags, 10))
	}
	value := p.Value
	if value == nil {
		value = []byte{}
	}
	out, err := k.c.put("PUT", "/v1/kv/"+p.Key, params, nil, value, w, nil)
	if err != nil {
		return false, nil, err
	}
	return strings.Contains(out, "true"), &WriteMeta{}, nil
}

// Delete deletes key, whatever its index.
func (k *KV) Delete(key string, w *WriteOptions) (*WriteMeta, error) {
	if _, err := k.c.put("DELETE", kvPath(key), nil, nil, nil, w, nil); err != nil {
		return nil, err
	}
	return &WriteMeta{}, nil
}

// DeleteCAS deletes p.Key if its ModifyIndex is still p.ModifyIndex.
func (k *KV) DeleteCAS(p *KVPair, w *WriteOptions) (bool, *WriteMeta, error) {
	params := url.Values{"cas": {strconv.FormatUint(p.ModifyIndex, 10)}}
	out, err := k.c.put("DELETE", kvPath(p.Key), params, nil, nil, w, nil)
	if err != nil {
		return false, nil, err
	}
	return strings.Contains(out, "true"), &WriteMeta{}, nil
}

// SessionBehaviorRelease: when the session is invalidated, the keys it
// holds are released, not deleted.
const SessionBehaviorRelease = "release"

// SessionEntry is a session.
type SessionEntry struct {
	CreateIndex uint64
	ID          string
	Name        string
	Node        string
	// LockDelay is in nanoseconds on the wire.
	LockDelay time.Duration
	Behavior  string
	TTL       string
}

// Session is the session endpoints.
type Session struct{ c *Client }

// Session returns the session endpoints.
func (c *Client) Session() *Session { return &Session{c} }

// Info reads session id; nil if it does not exist.
func (s *Session) Info(id string, q *QueryOptions) (*SessionEntry, *QueryMeta, error) {
	var entries []*SessionEntry
	meta, err := s.c.get("/v1/session/info/"+id, nil, q, &entries, false)
	if err != nil || len(entries) == 0 {
		return nil, meta, err
	}
	return entries[0], meta, nil
}

// List reads every session.
func (s *Session) List(q *QueryOptions) ([]*SessionEntry, *QueryMeta, error) {
	var entries []*SessionEntry
	meta, err := s.c.get("/v1/session/list", nil, q, &entries, false)
	return entries, meta, err
}

// Renew renews session id; nil without an error if Consul no longer has
// it (404).
func (s *Session) Renew(id string, w *WriteOptions) (*SessionEntry, *WriteMeta, error) {
	resp, err := s.c.do(s.c.newRequest("PUT", "/v1/session/renew/"+id).write(w))
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case 404:
		return nil, &WriteMeta{}, nil
	case 200:
	default:
		return nil, nil, fmt.Errorf("Unexpected response code: %d", resp.StatusCode)
	}
	var entries []*SessionEntry
	if err := decode(resp.Body, &entries); err != nil {
		return nil, nil, fmt.Errorf("Failed to read response: %v", err)
	}
	if len(entries) == 0 {
		return nil, &WriteMeta{}, nil
	}
	return entries[0], &WriteMeta{}, nil
}

// Destroy ends session id, releasing what it holds.
func (s *Session) Destroy(id string, w *WriteOptions) (*WriteMeta, error) {
	if _, err := s.c.put("PUT", "/v1/session/destroy/"+id, nil, nil, nil, w, nil); err != nil {
		return nil, err
	}
	return &WriteMeta{}, nil
}
