package s3

import (
	"context"
	"errors"
	"fmt"

	"github.com/leaderrun/leaderrun/backends"
)

// A lock's markers live in its lock object, so that a grant's marker is
// one write conditional on the grant's own object; its history lives in
// the state object, beside the mark. A document's Version is the object it
// was read from (*version), which its write rewrites whole, conditional on
// the ETag read.
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

// versionOf is the object d was read from; none if there was none.
func versionOf(d backends.Doc) *version {
	if v, ok := d.Version.(*version); ok {
		return v
	}
	return &version{}
}

// WriteDoc implements backends.Lock. A state object created anew holds
// the lock object's token as its mark, as a grant would have written it.
func (l *lock) WriteDoc(ctx context.Context, d backends.Doc) error {
	v := versionOf(d)
	if d.Name == backends.DocMarkers {
		v.lease.Markers, v.lease.RVN = d.Data, newRVN()
		_, err := l.s.write(ctx, l.key, v.lease, v.etag)
		return l.docFailed(d.Name, err)
	}
	if v.etag == "" {
		var obj lease
		if _, err := l.s.read(ctx, l.key, &obj); err != nil {
			return err
		}
		v.state.Mark = obj.Token
	}
	v.state.History, v.state.RVN = d.Data, newRVN()
	_, err := l.s.write(ctx, l.state, v.state, v.etag)
	return l.docFailed(d.Name, err)
}

// WriteDocHeld implements backends.RecordLock for the markers: written
// only if the lock object read is held's grant, conditional on its ETag.
func (l *lock) WriteDocHeld(ctx context.Context, d backends.Doc, held backends.Record) error {
	v := versionOf(d)
	if d.Name != backends.DocMarkers {
		return errors.New("s3: only the markers are written under a grant")
	} else if err := l.lost(v.lease, v.etag, held); err != nil {
		return fmt.Errorf("the markers were not written: %w", err)
	}
	v.lease.Markers, v.lease.RVN = d.Data, newRVN()
	etag, err := l.s.write(ctx, l.key, v.lease, v.etag)
	if err == nil {
		handleOf(held).set(v.lease, etag)
	}
	return l.docFailed(d.Name, err)
}

// docFailed wraps the error of a write of document name, if any.
func (l *lock) docFailed(name string, err error) error {
	if err == nil {
		return nil
	} else if name == backends.DocMarkers {
		return l.s.failed("write the markers in", l.key, err)
	}
	return l.s.failed("write the history in", l.state, err)
}
