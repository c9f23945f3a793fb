package etcd

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The protobuf wire format of the few etcd messages the backend sends and
// reads (etcd's api/etcdserverpb/rpc.proto and api/mvccpb/kv.proto): field
// numbers and types as there. Encoders leave out zero values, as proto3
// does; decoders skip fields they do not know.

// pb appends protobuf fields to a message.
type pb []byte

func (b pb) tag(field, wire int) pb { return binary.AppendUvarint(b, uint64(field)<<3|uint64(wire)) }

// varint appends a varint field (int64, uint64, bool, enum) unless v is 0.
func (b pb) varint(field int, v int64) pb {
	if v == 0 {
		return b
	}
	return binary.AppendUvarint(b.tag(field, 0), uint64(v))
}

func (b pb) boolean(field int, v bool) pb {
	if !v {
		return b
	}
	return b.varint(field, 1)
}

// bytes appends a length-delimited field (bytes, string) unless v is empty.
func (b pb) bytes(field int, v []byte) pb {
	if len(v) == 0 {
		return b
	}
	return b.message(field, v)
}

// message appends a length-delimited field even when it is empty: an
// empty message still sets a oneof.
func (b pb) message(field int, v []byte) pb {
	b = binary.AppendUvarint(b.tag(field, 2), uint64(len(v)))
	return append(b, v...)
}

var errMalformed = errors.New("malformed protobuf message")

// fields calls f with each field of msg: its number, and its value, as a
// varint (wire type 0) or as bytes (wire type 2). Fixed-width fields,
// which these messages do not use, are skipped.
func fields(msg []byte, f func(field int, v uint64, data []byte) error) error {
	for len(msg) > 0 {
		key, n := binary.Uvarint(msg)
		if n <= 0 {
			return errMalformed
		}
		msg = msg[n:]
		field, wire := int(key>>3), int(key&7)
		switch wire {
		case 0:
			v, n := binary.Uvarint(msg)
			if n <= 0 {
				return errMalformed
			}
			msg = msg[n:]
			if err := f(field, v, nil); err != nil {
				return err
			}
		case 2:
			l, n := binary.Uvarint(msg)
			if n <= 0 || uint64(len(msg)-n) < l {
				return errMalformed
			}
			data := msg[n : n+int(l)]
			msg = msg[n+int(l):]
			if err := f(field, 0, data); err != nil {
				return err
			}
		case 1:
			if len(msg) < 8 {
				return errMalformed
			}
			msg = msg[8:]
		case 5:
			if len(msg) < 4 {
				return errMalformed
			}
			msg = msg[4:]
		default:
			return fmt.Errorf("%w: wire type %d", errMalformed, wire)
		}
	}
	return nil
}

// Enum values of rpc.proto.
const (
	sortAscend   = 1 // RangeRequest.SortOrder
	sortDescend  = 2
	sortByKey    = 0 // RangeRequest.SortTarget
	sortByCreate = 2

	compareEqual        = 0 // Compare.CompareResult
	compareTargetCreate = 1 // Compare.CompareTarget

	eventDelete = 1 // mvccpb.Event.EventType
)

func (r *rangeRequest) encode() []byte {
	return pb(nil).bytes(1, r.Key).bytes(2, r.RangeEnd).varint(3, r.Limit).
		varint(5, r.SortOrder).varint(6, r.SortTarget).boolean(8, r.KeysOnly).boolean(9, r.CountOnly).
		varint(13, r.MaxCreateRevision)
}

func (p *putRequest) encode() []byte {
	return pb(nil).bytes(1, p.Key).bytes(2, p.Value).varint(3, p.Lease)
}

func (d *deleteRequest) encode() []byte {
	return pb(nil).bytes(1, d.Key).bytes(2, d.RangeEnd)
}

func (c compare) encode() []byte {
	// create_revision is a oneof member: sent even when 0 ("the key does
	// not exist"), or etcd would compare the version instead.
	b := pb(nil).varint(1, c.Result).varint(2, c.Target).bytes(3, c.Key)
	return binary.AppendUvarint(b.tag(5, 0), uint64(c.CreateRevision))
}

func (o requestOp) encode() []byte {
	switch {
	case o.Range != nil:
		return pb(nil).message(1, o.Range.encode())
	case o.Put != nil:
		return pb(nil).message(2, o.Put.encode())
	case o.Delete != nil:
		return pb(nil).message(3, o.Delete.encode())
	}
	return nil
}

func (t txnRequest) encode() []byte {
	var b pb
	for _, c := range t.Compare {
		b = b.message(1, c.encode())
	}
	for _, o := range t.Success {
		b = b.message(2, o.encode())
	}
	for _, o := range t.Failure {
		b = b.message(3, o.encode())
	}
	return b
}

func decodeHeader(data []byte, h *header) error {
	return fields(data, func(f int, v uint64, _ []byte) error {
		if f == 3 {
			h.Revision = int64(v)
		}
		return nil
	})
}

func decodeKeyValue(data []byte) (keyValue, error) {
	var kv keyValue
	err := fields(data, func(f int, v uint64, d []byte) error {
		switch f {
		case 1:
			kv.Key = d
		case 2:
			kv.CreateRevision = int64(v)
		case 3:
			kv.ModRevision = int64(v)
		case 5:
			kv.Value = d
		case 6:
			kv.Lease = int64(v)
		}
		return nil
	})
	return kv, err
}

func decodeRange(data []byte) (*rangeResponse, error) {
	r := &rangeResponse{}
	err := fields(data, func(f int, v uint64, d []byte) error {
		switch f {
		case 1:
			return decodeHeader(d, &r.Header)
		case 2:
			kv, err := decodeKeyValue(d)
			r.Kvs = append(r.Kvs, kv)
			return err
		case 4:
			r.Count = int64(v)
		}
		return nil
	})
	return r, err
}

func decodeTxn(data []byte) (*txnResponse, error) {
	t := &txnResponse{}
	err := fields(data, func(f int, v uint64, d []byte) error {
		switch f {
		case 1:
			return decodeHeader(d, &t.Header)
		case 2:
			t.Succeeded = v != 0
		case 3:
			var op *rangeResponse
			err := fields(d, func(f int, _ uint64, d []byte) (err error) {
				if f == 1 {
					op, err = decodeRange(d)
				}
				return err
			})
			t.Responses = append(t.Responses, op)
			return err
		}
		return nil
	})
	return t, err
}

func decodeWatch(data []byte) (*watchResponse, error) {
	w := &watchResponse{}
	err := fields(data, func(f int, v uint64, d []byte) error {
		switch f {
		case 1:
			return decodeHeader(d, &w.Header)
		case 3:
			w.Created = v != 0
		case 4:
			w.Canceled = v != 0
		case 5:
			w.CompactRevision = int64(v)
		case 6:
			w.CancelReason = string(d)
		case 11:
			var ev watchEvent
			err := fields(d, func(f int, v uint64, d []byte) (err error) {
				switch f {
				case 1:
					ev.Type = int64(v)
				case 2:
					ev.Kv, err = decodeKeyValue(d)
				}
				return err
			})
			w.Events = append(w.Events, ev)
			return err
		}
		return nil
	})
	return w, err
}

// decodeInts reads the varint fields of a flat message (the lease
// responses) by number.
func decodeInts(data []byte) (map[int]int64, map[int][]byte, error) {
	ints, strs := map[int]int64{}, map[int][]byte{}
	err := fields(data, func(f int, v uint64, d []byte) error {
		if d != nil {
			strs[f] = d
		} else {
			ints[f] = int64(v)
		}
		return nil
	})
	return ints, strs, err
}
