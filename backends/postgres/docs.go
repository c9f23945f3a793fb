package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/leaderrun/leaderrun/backends"
)

// A lock's documents are rows of the markers table, keyed docPrefix + the
// document's name: the document in identity, its version in token. '#' is
// not in a once-key's alphabet, so no marker row of an older release is
// ever a document (docs/backends/postgres.md, "Layout in the database").
const docPrefix = "#"

// writeDocSQL: $1 name, $2 key, $3 the document, $4 and $5 the holder and
// token that fence the write (” and 0: none), $6 the version it replaces
// (0: none); %[1]s the lease table, %[2]s the markers. It returns whether
// the fence held and whether the document was written. The fence's share
// lock makes a takeover wait until the write is committed.
const writeDocSQL = `WITH fence AS (
	SELECT FROM %[1]s WHERE name = $1 AND holder = $4 AND token = $5 AND expires > now() FOR SHARE
), ok AS (
	SELECT WHERE $4 = '' OR EXISTS (SELECT FROM fence)
), ins AS (
	INSERT INTO %[2]s (name, key, identity, token, at, expires)
	SELECT $1, $2, $3, 1, now(), 'infinity' FROM ok WHERE $6 = 0
	ON CONFLICT (name, key) DO NOTHING
	RETURNING 1
), up AS (
	UPDATE %[2]s SET identity = $3, token = token + 1, at = now()
	WHERE name = $1 AND key = $2 AND token = $6 AND EXISTS (SELECT FROM ok)
	RETURNING 1
)
SELECT EXISTS (SELECT FROM ok), EXISTS (SELECT FROM ins) OR EXISTS (SELECT FROM up)`

// ReadDoc implements backends.Lock. It reads at most backends.MaxDoc + 1
// characters: one longer than MaxDoc reads as one that cannot be decoded.
func (l *lock) ReadDoc(ctx context.Context, name string) (backends.Doc, error) {
	d := backends.Doc{Name: name}
	var (
		data    string
		version int64
	)
	err := l.s.do(ctx, true, func(ctx context.Context, c *pgx.Conn) error {
		return queryRow(ctx, c, l.s.sql.readDoc, []any{l.key, docPrefix + name, int64(backends.MaxDoc + 1)}, &data, &version)
	})
	switch {
	case errors.Is(err, errNoRows), pgCode(err) == "42P01": // undefined_table
		return d, nil
	case err != nil:
		return d, l.s.fail("read the "+name+" of", l.key, err)
	}
	d.Data, d.Version = []byte(data), version
	return d, nil
}

func (l *lock) WriteDoc(ctx context.Context, d backends.Doc) error { return l.writeDoc(ctx, d, nil) }

// WriteDocHeld implements backends.RecordLock. It is not retried on a
// broken connection: a first attempt committed without an answer, then a
// loss, would make the retry report a loss for a document written.
func (l *lock) WriteDocHeld(ctx context.Context, d backends.Doc, held backends.Record) error {
	return l.writeDoc(ctx, d, &held)
}

func (l *lock) writeDoc(ctx context.Context, d backends.Doc, held *backends.Record) error {
	if err := l.s.ensure(ctx, l.key); err != nil {
		return err
	}
	version, _ := d.Version.(int64)
	args := []any{l.key, docPrefix + d.Name, string(d.Data), "", int64(0), version}
	if held != nil {
		args[3], args[4] = held.Holder, int64(held.Token)
	}
	var fenced, written bool
	err := l.s.do(ctx, held == nil, func(ctx context.Context, c *pgx.Conn) error {
		return queryRow(ctx, c, l.s.sql.writeDoc, args, &fenced, &written)
	})
	switch {
	case err != nil:
		return l.s.fail("write the "+d.Name+" of", l.key, err)
	case !fenced:
		return fmt.Errorf("postgres: %q in table %s no longer holds token %d; its %s was not written: %w",
			l.key, l.s.sql.ids.tableName, held.Token, d.Name, backends.ErrLeaseLost)
	case !written:
		return fmt.Errorf("postgres: the %s of %q changed since it was read: %w", d.Name, l.key, backends.ErrConflict)
	}
	return nil
}
