package s3

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leaderrun/leaderrun/backends"
)

// A lock's documents live in its objects: the markers in the lock object,
// so that a grant's marker is one write conditional on the grant's own
// object; the history in the state object, beside the mark. A document's
// Version is its object as read (version), which its write rewrites whole
// with the new document, conditional on the ETag read.

// version is the object a document was read from, and its ETag.
type version struct {
	etag  string
	lease lease
	state state
}

// ReadDoc implements backends.Lock.
func (l *lock) ReadDoc(ctx context.Context, name string) (backends.Doc, error) {
	d, v := backends.Doc{Name: name}, &version{}
	var err error
	if name == backends.DocMarkers {
		v.etag, err = l.s.read(ctx, l.key, &v.lease)
		d.Data = v.lease.Markers
	} else {
		v.etag, err = l.s.read(ctx, l.state, &v.state)
		d.Data = v.state.History
	}
	if err == nil && v.etag != "" {
		d.Version = v
	}
	return d, err
}

// WriteDoc implements backends.Lock. A state object created anew holds
// the lock object's token as its mark, as a grant would have written it.
func (l *lock) WriteDoc(ctx context.Context, d backends.Doc) error {
	v, _ := d.Version.(*version)
	if v == nil {
		v = &version{}
	}
	if d.Name == backends.DocMarkers {
		obj := v.lease
		obj.Markers, obj.RVN = d.Data, newRVN()
		_, err := l.s.write(ctx, l.key, obj, v.etag)
		return l.docFailed(d.Name, err)
	}
	st := v.state
	if v.etag == "" {
		var obj lease
		if _, err := l.s.read(ctx, l.key, &obj); err != nil {
			return err
		}
		st.Mark = obj.Token
	}
	st.History, st.RVN = d.Data, newRVN()
	_, err := l.s.write(ctx, l.state, st, v.etag)
	return l.docFailed(d.Name, err)
}

// WriteDocHeld implements backends.RecordLock for the markers: written
// into the lock object only if the object read is held's grant, by a
// write conditional on its ETag.
func (l *lock) WriteDocHeld(ctx context.Context, d backends.Doc, held backends.Record) error {
	v, _ := d.Version.(*version)
	switch {
	case d.Name != backends.DocMarkers:
		return errors.New("s3: only the markers are written under a grant")
	case v == nil || !ours(v.lease, held):
		return fmt.Errorf("s3: lock object %s is no longer this grant's: the markers were not written: %w", l.Key(), backends.ErrLeaseLost)
	}
	obj := v.lease
	obj.Markers, obj.RVN = d.Data, newRVN()
	sent := time.Now()
	etag, err := l.s.write(ctx, l.key, obj, v.etag)
	if err == nil {
		handleOf(held).set(obj, etag, sent)
	}
	return l.docFailed(d.Name, err)
}

// docFailed wraps the error of a document's write: a conflict if the
// object changed since it was read.
func (l *lock) docFailed(name string, err error) error {
	if err == nil {
		return nil
	}
	key := l.state
	if name == backends.DocMarkers {
		key = l.key
	}
	return l.writeFailed("write the "+name+" in", key, err)
}
