package consulapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// KVOp is a transaction's key/value verb.
type KVOp string

// The verbs leaderrun uses.
const (
	KVSet          KVOp = "set"
	KVDelete       KVOp = "delete"
	KVLock         KVOp = "lock"
	KVUnlock       KVOp = "unlock"
	KVCheckSession KVOp = "check-session"
)

// KVTxnOp is one key/value operation of a transaction.
type KVTxnOp struct {
	Verb    KVOp
	Key     string
	Value   []byte
	Flags   uint64
	Index   uint64
	Session string
}

// TxnOp is one operation of a transaction.
type TxnOp struct {
	KV *KVTxnOp
}

// TxnOps is a transaction.
type TxnOps []*TxnOp

// TxnError says why a transaction was rolled back.
type TxnError struct {
	OpIndex int
	What    string
}

// TxnResult is the result of one operation of a transaction: the key as
// the operation left it (values are base64 on the wire, as KVPair's).
type TxnResult struct {
	KV *KVPair
}

// TxnResponse is a transaction's answer.
type TxnResponse struct {
	Results []*TxnResult
	Errors  []*TxnError
}

// Txn is the transaction endpoint.
type Txn struct{ c *Client }

// Txn returns the transaction endpoint.
func (c *Client) Txn() *Txn { return &Txn{c} }

// Txn runs ops in one transaction. ok is false, with the reasons in the
// response, if Consul rolled it back (409).
func (t *Txn) Txn(ops TxnOps, q *QueryOptions) (bool, *TxnResponse, *QueryMeta, error) {
	r := t.c.newRequest("PUT", "/v1/txn").query(q)
	data, err := json.Marshal(ops)
	if err != nil {
		return false, nil, nil, err
	}
	r.body, r.contentType = bytes.NewReader(data), "application/json; charset=utf-8"
	resp, err := t.c.do(r)
	if err != nil {
		return false, nil, nil, err
	}
	defer resp.Body.Close()
	meta := queryMeta(resp)
	if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusConflict {
		var out TxnResponse
		if err := decode(resp.Body, &out); err != nil {
			return false, nil, nil, err
		}
		return resp.StatusCode == http.StatusOK, &out, meta, nil
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return false, nil, nil, fmt.Errorf("Failed request: %s", body)
}

func decode(r io.Reader, out any) error { return json.NewDecoder(r).Decode(out) }
