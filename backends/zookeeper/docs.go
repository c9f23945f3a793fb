package zookeeper

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-zookeeper/zk"

	"github.com/leaderrun/leaderrun/backends"
)

// A lock's documents (backends.DocHistory, DocMarkers) are the data of the
// persistent znodes history and markers in the lock's znode, whose data
// version is the document's version: a write sets the data at the version
// read, or creates the znode if none was, so that of two writers the
// second fails (backends.ErrConflict) and reads again.

// ReadDoc implements backends.Lock. The library bounds an answer to a
// packet; a document longer than backends.MaxDoc is refused.
func (l *lock) ReadDoc(ctx context.Context, name string) (backends.Doc, error) {
	path := l.dir + "/" + name
	z, err := read(ctx, l.s, "read "+path, func(z *zk.Conn) (znode, error) {
		data, stat, err := z.Get(path)
		return znode{data, stat}, err
	})
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return backends.Doc{Name: name}, nil
	case err == nil && len(z.data) > backends.MaxDoc:
		err = l.s.unavailable("read "+path, fmt.Errorf("%w: %d bytes, more than a document's %d", backends.ErrRefused, len(z.data), backends.MaxDoc))
	case err == nil:
		return backends.Doc{Name: name, Data: z.data, Version: z.stat.Version}, nil
	}
	return backends.Doc{Name: name}, err
}

// WriteDoc implements backends.Lock, creating the lock's znode if need be.
func (l *lock) WriteDoc(ctx context.Context, d backends.Doc) error {
	path, op, err := l.docOp(d)
	if err != nil {
		return err
	}
	_, err = read(ctx, l.s, "write "+path, func(z *zk.Conn) ([]zk.MultiResponse, error) {
		res, err := z.Multi(op)
		if errors.Is(err, zk.ErrNoNode) && d.Version == nil {
			if err = ensure(z, l.dir, l.s.acl); err == nil {
				res, err = z.Multi(op)
			}
		}
		return res, err
	})
	return docError(l.s, path, err)
}

// docOp is the write of d: a set at the version read, or a create.
func (l *lock) docOp(d backends.Doc) (string, any, error) {
	path := l.dir + "/" + d.Name
	if len(d.Data) > backends.MaxDoc {
		return path, nil, fmt.Errorf("zookeeper: %s: %d bytes, more than a document's %d", path, len(d.Data), backends.MaxDoc)
	}
	switch v := d.Version.(type) {
	case nil:
		return path, &zk.CreateRequest{Path: path, Data: d.Data, Acl: l.s.acl, Flags: zk.FlagPersistent}, nil
	case int32:
		return path, &zk.SetDataRequest{Path: path, Data: d.Data, Version: v}, nil
	}
	return path, nil, fmt.Errorf("zookeeper: %s: version %v was not read from ZooKeeper", path, d.Version)
}

// docError is the error of a document's write: one created, changed or
// deleted since it was read is backends.ErrConflict.
func docError(s *Store, path string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, zk.ErrBadVersion), errors.Is(err, zk.ErrNodeExists), errors.Is(err, zk.ErrNoNode):
		return fmt.Errorf("zookeeper: %s: %w", path, backends.ErrConflict)
	}
	return s.unavailable("write "+path, err)
}
