package kubernetes

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// microTime is how the API spells a MicroTime (acquireTime, renewTime).
const microTime = "2006-01-02T15:04:05.000000Z07:00"

// record is the election state in a Lease's spec, as client-go's
// LeaderElectionRecord reads it. Two records are the same state when all
// their fields are equal: a follower restarts its clock whenever the
// record changes, exactly as client-go's elector does.
type record struct {
	HolderIdentity       string
	LeaseDurationSeconds int32
	AcquireTime          string // as served: compared, never trusted as a clock
	RenewTime            string
	LeaseTransitions     int32
	Strategy             string
	PreferredHolder      string
}

// held reports whether the record names a holder. client-go writes an empty
// holderIdentity when a leader steps down; such a Lease is free at once.
func (r record) held() bool { return r.HolderIdentity != "" }

// leaseObject is a coordination.k8s.io/v1 Lease as the apiserver served it.
// Everything this package does not write is kept verbatim (labels, owner
// references, managed fields, spec fields of newer API versions), so that
// an update never drops what another client wrote.
type leaseObject struct {
	raw  map[string]json.RawMessage // the object's top-level fields
	meta map[string]json.RawMessage // its metadata's fields
	spec map[string]json.RawMessage // its spec's fields

	name            string
	resourceVersion string
	annotations     map[string]string
	record          record
}

// newLeaseObject is a Lease to create: name and namespace, nothing else.
func newLeaseObject(namespace, name string) *leaseObject {
	return &leaseObject{
		raw: map[string]json.RawMessage{
			"apiVersion": json.RawMessage(`"coordination.k8s.io/v1"`),
			"kind":       json.RawMessage(`"Lease"`),
		},
		meta: map[string]json.RawMessage{
			"name":      mustJSON(name),
			"namespace": mustJSON(namespace),
		},
		spec:        map[string]json.RawMessage{},
		name:        name,
		annotations: map[string]string{},
	}
}

// parseLease decodes a Lease.
func parseLease(data []byte) (*leaseObject, error) {
	o := &leaseObject{}
	if err := json.Unmarshal(data, &o.raw); err != nil {
		return nil, fmt.Errorf("decode lease: %w", err)
	}
	if err := unmarshalField(o.raw, "metadata", &o.meta); err != nil {
		return nil, err
	}
	if err := unmarshalField(o.raw, "spec", &o.spec); err != nil {
		return nil, err
	}
	if o.meta == nil {
		o.meta = map[string]json.RawMessage{}
	}
	if o.spec == nil {
		o.spec = map[string]json.RawMessage{}
	}
	var spec struct {
		HolderIdentity       *string `json:"holderIdentity"`
		LeaseDurationSeconds *int32  `json:"leaseDurationSeconds"`
		AcquireTime          *string `json:"acquireTime"`
		RenewTime            *string `json:"renewTime"`
		LeaseTransitions     *int32  `json:"leaseTransitions"`
		Strategy             *string `json:"strategy"`
		PreferredHolder      *string `json:"preferredHolder"`
	}
	if err := unmarshalField(o.raw, "spec", &spec); err != nil {
		return nil, err
	}
	o.record = record{
		HolderIdentity:       deref(spec.HolderIdentity),
		LeaseDurationSeconds: deref(spec.LeaseDurationSeconds),
		AcquireTime:          deref(spec.AcquireTime),
		RenewTime:            deref(spec.RenewTime),
		LeaseTransitions:     deref(spec.LeaseTransitions),
		Strategy:             deref(spec.Strategy),
		PreferredHolder:      deref(spec.PreferredHolder),
	}
	for field, dst := range map[string]any{"name": &o.name, "resourceVersion": &o.resourceVersion, "annotations": &o.annotations} {
		if err := unmarshalField(o.meta, field, dst); err != nil {
			return nil, err
		}
	}
	if o.annotations == nil {
		o.annotations = map[string]string{}
	}
	return o, nil
}

func unmarshalField(m map[string]json.RawMessage, field string, dst any) error {
	v, ok := m[field]
	if !ok || bytes.Equal(v, []byte("null")) {
		return nil
	}
	if err := json.Unmarshal(v, dst); err != nil {
		return fmt.Errorf("decode lease %s: %w", field, err)
	}
	return nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func mustJSON(v any) json.RawMessage {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err) // only strings, numbers and maps of them
	}
	return data
}

// clone is a deep copy, to be changed and sent without touching o.
func (o *leaseObject) clone() *leaseObject {
	c := *o
	c.raw = cloneMap(o.raw)
	c.meta = cloneMap(o.meta)
	c.spec = cloneMap(o.spec)
	c.annotations = cloneMap(o.annotations)
	return &c
}

func cloneMap[V any](m map[string]V) map[string]V {
	c := make(map[string]V, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// setRecord writes r into the spec the way client-go's LeaseLock does:
// every field of the record is set (holderIdentity "" for a free Lease),
// strategy and preferredHolder only if not empty.
func (o *leaseObject) setRecord(r record) {
	o.record = r
	o.spec["holderIdentity"] = mustJSON(r.HolderIdentity)
	o.spec["leaseDurationSeconds"] = mustJSON(r.LeaseDurationSeconds)
	o.spec["acquireTime"] = mustJSON(r.AcquireTime)
	o.spec["renewTime"] = mustJSON(r.RenewTime)
	o.spec["leaseTransitions"] = mustJSON(r.LeaseTransitions)
	for field, v := range map[string]string{"strategy": r.Strategy, "preferredHolder": r.PreferredHolder} {
		if v == "" {
			delete(o.spec, field)
		} else {
			o.spec[field] = mustJSON(v)
		}
	}
}

// marshal encodes the object for a create or an update. The
// resourceVersion it carries makes an update conditional: the apiserver
// refuses it with 409 Conflict unless the stored Lease is still that
// version.
func (o *leaseObject) marshal() ([]byte, error) {
	raw, meta := cloneMap(o.raw), cloneMap(o.meta)
	if len(o.annotations) > 0 {
		meta["annotations"] = mustJSON(o.annotations)
	} else {
		delete(meta, "annotations")
	}
	if o.resourceVersion != "" {
		meta["resourceVersion"] = mustJSON(o.resourceVersion)
	}
	raw["metadata"] = mustJSON(meta)
	raw["spec"] = mustJSON(o.spec)
	return json.Marshal(raw)
}

// revision is the resourceVersion as a number. The apiserver's storage
// gives every write the revision of the etcd cluster behind it, and the API
// defines the resource versions of one resource as decimal integers that
// compare in the order of the writes (see the package doc: the fencing
// token relies on it).
func (o *leaseObject) revision() (uint64, error) {
	rv, err := strconv.ParseUint(o.resourceVersion, 10, 64)
	if err != nil || rv == 0 {
		return 0, fmt.Errorf("%w: lease %s has resourceVersion %q; fencing tokens need an apiserver "+
			"whose resource versions are decimal revisions, as etcd's are", errNotNumeric, o.name, o.resourceVersion)
	}
	return rv, nil
}

// newer reports whether o is a later state of the Lease than old (nil: no
// state yet). States whose versions cannot be compared count as newer.
func (o *leaseObject) newer(old *leaseObject) bool {
	if old == nil {
		return true
	}
	a, errA := o.revision()
	b, errB := old.revision()
	return errA != nil || errB != nil || a > b
}

// formatTime is t as the API writes a MicroTime.
func formatTime(t time.Time) string { return t.UTC().Format(microTime) }

// parseTime reads a MicroTime or Time; the zero time if it is neither.
func parseTime(s string) time.Time {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t
	}
	return time.Time{}
}
