package etcd

import (
	"bytes"
	"testing"

	etcdpb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/proto"
)

// TestEncodeMatchesEtcd: what the backend sends decodes, with etcd's own
// generated types, to the requests it means; in particular a compare of
// create revision 0 ("the key does not exist") must still be a compare of
// the create revision.
func TestEncodeMatchesEtcd(t *testing.T) {
	t.Run("range", func(t *testing.T) {
		r := lastCreatedBefore("lr/a/", 42)
		var got etcdpb.RangeRequest
		if err := proto.Unmarshal(r.encode(), &got); err != nil {
			t.Fatal(err)
		}
		if string(got.Key) != "lr/a/" || string(got.RangeEnd) != "lr/a0" || got.Limit != 1 ||
			got.SortOrder != etcdpb.RangeRequest_DESCEND || got.SortTarget != etcdpb.RangeRequest_CREATE || got.MaxCreateRevision != 41 {
			t.Errorf("decoded %v", &got)
		}
	})
	t.Run("txn", func(t *testing.T) {
		txn := txnRequest{
			Compare: []compare{createdIs("lr/a/1f", 0)},
			Success: []requestOp{{Put: &putRequest{Key: []byte("lr/a/1f"), Value: []byte("host:1"), Lease: 0x1f}}, {Range: countUnder("lr/a/")}},
			Failure: []requestOp{{Delete: &deleteRequest{Key: []byte("lr/a/1f")}}},
		}
		var got etcdpb.TxnRequest
		if err := proto.Unmarshal(txn.encode(), &got); err != nil {
			t.Fatal(err)
		}
		c := got.Compare[0]
		if c.Result != etcdpb.Compare_EQUAL || c.Target != etcdpb.Compare_CREATE || string(c.Key) != "lr/a/1f" {
			t.Errorf("compare %v", c)
		}
		if _, ok := c.TargetUnion.(*etcdpb.Compare_CreateRevision); !ok || c.GetCreateRevision() != 0 {
			t.Errorf("compare target %T, want a create revision of 0", c.TargetUnion)
		}
		put := got.Success[0].GetRequestPut()
		if put == nil || string(put.Key) != "lr/a/1f" || string(put.Value) != "host:1" || put.Lease != 0x1f {
			t.Errorf("put %v", got.Success[0])
		}
		if r := got.Success[1].GetRequestRange(); r == nil || !r.CountOnly || string(r.RangeEnd) != "lr/a0" {
			t.Errorf("range %v", got.Success[1])
		}
		if d := got.Failure[0].GetRequestDeleteRange(); d == nil || string(d.Key) != "lr/a/1f" {
			t.Errorf("failure %v", got.Failure)
		}
	})
}

// TestDecodeMatchesEtcd: the answers etcd sends, encoded by its own
// generated types, decode to what they say, negative TTLs included.
func TestDecodeMatchesEtcd(t *testing.T) {
	hdr := &etcdpb.ResponseHeader{ClusterId: 7, MemberId: 8, Revision: 99, RaftTerm: 3}
	kv := &mvccpb.KeyValue{Key: []byte("lr/a/1f"), CreateRevision: 12, ModRevision: 13, Version: 2, Value: []byte("host:1"), Lease: 0x1f}
	t.Run("txn", func(t *testing.T) {
		data, err := proto.Marshal(&etcdpb.TxnResponse{Header: hdr, Succeeded: true, Responses: []*etcdpb.ResponseOp{
			{Response: &etcdpb.ResponseOp_ResponsePut{ResponsePut: &etcdpb.PutResponse{Header: hdr}}},
			{Response: &etcdpb.ResponseOp_ResponseRange{ResponseRange: &etcdpb.RangeResponse{Header: hdr, Kvs: []*mvccpb.KeyValue{kv, kv}, Count: 5}}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeTxn(data)
		if err != nil {
			t.Fatal(err)
		}
		r := got.rangeAt(1)
		if !got.Succeeded || got.Header.Revision != 99 || got.rangeAt(0).Count != 0 || r.Count != 5 || len(r.Kvs) != 2 {
			t.Fatalf("decoded %+v, range %+v", got, r)
		}
		k := r.Kvs[1]
		if !bytes.Equal(k.Key, kv.Key) || !bytes.Equal(k.Value, kv.Value) || k.CreateRevision != 12 || k.ModRevision != 13 || k.Lease != 0x1f {
			t.Errorf("key %+v", k)
		}
	})
	t.Run("watch", func(t *testing.T) {
		data, err := proto.Marshal(&etcdpb.WatchResponse{Header: hdr, WatchId: 1, Events: []*mvccpb.Event{
			{Type: mvccpb.PUT, Kv: kv}, {Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: kv.Key, ModRevision: 14}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeWatch(data)
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Events) != 2 || got.Events[0].Type != 0 || got.Events[1].Type != eventDelete || got.Events[1].Kv.ModRevision != 14 || got.Header.Revision != 99 {
			t.Errorf("decoded %+v", got)
		}
		data, _ = proto.Marshal(&etcdpb.WatchResponse{Header: hdr, Canceled: true, CompactRevision: 50, CancelReason: "compacted"})
		if got, err = decodeWatch(data); err != nil || !got.Canceled || got.CompactRevision != 50 || got.CancelReason != "compacted" {
			t.Errorf("cancelled watch decoded %+v, %v", got, err)
		}
	})
	t.Run("lease time to live", func(t *testing.T) {
		data, _ := proto.Marshal(&etcdpb.LeaseTimeToLiveResponse{Header: hdr, ID: 0x1f, TTL: -1, GrantedTTL: 5})
		ints, _, err := decodeInts(data)
		if err != nil || ints[3] != -1 || ints[4] != 5 || ints[2] != 0x1f {
			t.Errorf("decoded %v, %v", ints, err)
		}
	})
	t.Run("malformed", func(t *testing.T) {
		if _, err := decodeTxn([]byte{0x0a, 0x05, 0x01}); err == nil {
			t.Error("a truncated message decoded without error")
		}
	})
}

// TestPrefixEnd: a range from the prefix to its end covers exactly the
// keys that start with it.
func TestPrefixEnd(t *testing.T) {
	for _, tt := range []struct{ name, prefix, want string }{
		{"plain", "lr/a/", "lr/a0"},
		{"last byte 0xff", "a\xff", "b"},
		{"all 0xff", "\xff\xff", "\x00"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(prefixEnd(tt.prefix)); got != tt.want {
				t.Errorf("prefixEnd(%q) = %q, want %q", tt.prefix, got, tt.want)
			}
		})
	}
}
