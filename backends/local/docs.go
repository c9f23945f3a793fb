package local

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/leaderrun/leaderrun/backends"
)

// docName is the file of a document: <lock>.history, <lock>.markers. Each
// is rewritten whole (writeFile) under the state directory's flock, and
// versioned by the digest of its content.
func (l *lock) docName(name string) string { return l.name + "." + name }

func (l *lock) ReadDoc(_ context.Context, name string) (backends.Doc, error) {
	d, err := l.s.dir()
	if err != nil {
		return backends.Doc{Name: name}, err
	}
	return l.readDoc(d, name)
}

func (l *lock) readDoc(d *dir, name string) (backends.Doc, error) {
	doc := backends.Doc{Name: name}
	data, err := d.readFile(l.docName(name), backends.MaxDoc)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return doc, nil
	case err != nil:
		return doc, unavailable(l.s.path, "read "+l.docName(name), err)
	}
	doc.Data, doc.Version = data, sha256.Sum256(data)
	return doc, nil
}

func (l *lock) WriteDoc(_ context.Context, doc backends.Doc) error {
	return l.writeDoc(doc, nil)
}

// WriteDocHeld writes only if the lock file h holds is still the one at
// the lock's path.
func (l *lock) WriteDocHeld(_ context.Context, doc backends.Doc, h backends.Record) error {
	return l.writeDoc(doc, func(d *dir) error { return l.check(d, h) })
}

func (l *lock) writeDoc(doc backends.Doc, fence func(*dir) error) error {
	d, err := l.s.dir()
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	unlock, err := d.lockState()
	if err != nil {
		return unavailable(l.s.path, "lock the state directory", err)
	}
	defer unlock()
	if fence != nil {
		if err := fence(d); err != nil {
			return err
		}
	}
	cur, err := l.readDoc(d, doc.Name)
	if err != nil {
		return err
	}
	if cur.Version != doc.Version {
		return fmt.Errorf("local: %s: %w", filepath.Join(l.s.path, l.docName(doc.Name)), backends.ErrConflict)
	}
	if err := d.writeFile(l.docName(doc.Name), doc.Data); err != nil {
		return unavailable(l.s.path, "write "+l.docName(doc.Name), err)
	}
	return nil
}

// lastTerm is the newest token in the lock's history, 0 if none.
func (l *lock) lastTerm(d *dir) uint64 {
	doc, err := l.readDoc(d, backends.DocHistory)
	if err != nil {
		return 0
	}
	var last uint64
	for _, t := range backends.DecodeTerms(doc.Data) {
		last = max(last, t.Token)
	}
	return last
}
