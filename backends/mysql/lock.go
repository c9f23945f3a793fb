package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/leaderrun/leaderrun/backends"
)

// lock is one lock's row, and the named locks of its queue: queue, held
// by the first waiter in line, and held, by the holder of the row.
type lock struct {
	s                *Store
	key, queue, held string
}

var _ backends.RecordLock = (*lock)(nil)

// Key implements backends.Lock.
func (l *lock) Key() string { return l.key }

// epochUS is a DATETIME(6) column in UTC as microseconds since 1970.
func epochUS(col string) string { return "TIMESTAMPDIFF(MICROSECOND, '1970-01-01', " + col + ")" }

// live is the condition that the row is held by owner and token, and its
// lease has not run out by the database's clock.
const live = "name = ? AND owner = ? AND token = ? AND holder <> '' AND expires > UTC_TIMESTAMP(6)"

// Get implements backends.RecordLock: the row, and what is left of its
// lease by the database's clock. A table that does not exist holds no
// lock. The waiters are not counted.
func (l *lock) Get(ctx context.Context) (backends.Record, error) {
	var holder, owner []byte
	var token uint64
	var holders int
	var ttl, acquired, renewed, left int64
	err := l.s.db.QueryRowContext(ctx, "SELECT holder, owner, token, holders, ttl_us, "+epochUS("acquired")+", "+epochUS("renewed")+
		", GREATEST(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires), 0) FROM "+l.s.locks+" WHERE name = ?", l.key).
		Scan(&holder, &owner, &token, &holders, &ttl, &acquired, &renewed, &left)
	rec := backends.Record{Waiting: -1, Node: l.s.addr}
	switch {
	case errors.Is(err, sql.ErrNoRows), isServerError(err, errNoTable):
		return rec, nil
	case err != nil:
		return rec, l.s.fail("read", l.key, err)
	}
	rec.Holder, rec.Owner, rec.Token, rec.Holders = string(holder), string(owner), token, holders
	rec.TTL, rec.Left = time.Duration(ttl)*time.Microsecond, time.Duration(left)*time.Microsecond
	rec.Acquired, rec.Renewed = wall(acquired), wall(renewed)
	rec.Version = version(rec)
	return rec, nil
}

// version names a state of the row: its token, which every grant draws
// anew, and whether it was released.
func version(rec backends.Record) string {
	v := strconv.FormatUint(rec.Token, 10)
	if rec.Holder == "" {
		v += "-free"
	}
	return v
}

func wall(us int64) time.Time {
	if us <= 0 {
		return time.Time{}
	}
	return time.UnixMicro(us)
}

// Take implements backends.RecordLock: one transaction on a connection of
// its own raises the counter and writes the row if it is free or expired
// by the database's clock (or inserts it, if prev is none), whatever
// version prev was: the database's clock decides, as it does for every
// waiter. The connection then takes the holder's named lock, and is kept
// as the grant's Handle until Free. Missing tables are created.
func (l *lock) Take(ctx context.Context, prev backends.Record, c backends.Claim) (backends.Record, error) {
	rec, err := l.take(ctx, prev, c)
	if isServerError(err, errNoTable) {
		if err = l.s.ensureTables(ctx); err == nil {
			rec, err = l.take(ctx, prev, c)
		}
	}
	switch {
	case errors.Is(err, backends.ErrConflict):
		return rec, err
	case isServerError(err, errDupKey), isServerError(err, errDeadlock):
		return rec, fmt.Errorf("mysql: %q: %w: %w", l.key, backends.ErrConflict, err)
	case err != nil:
		return rec, l.s.fail("take", l.key, err)
	}
	return rec, nil
}

func (l *lock) take(ctx context.Context, prev backends.Record, c backends.Claim) (rec backends.Record, err error) {
	conn, err := l.s.db.Conn(ctx)
	if err != nil {
		return rec, err
	}
	h := &hold{s: l.s, name: l.held, conn: conn}
	defer func() {
		if err != nil {
			h.release(ctx)
		}
	}()
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return rec, err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op once committed
	res, err := tx.ExecContext(ctx, "INSERT INTO "+l.s.tokens+" (name, token) VALUES (?, LAST_INSERT_ID(?)) "+
		"ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(GREATEST(token, ?) + 1)", l.key, prev.Token+1, prev.Token)
	if err != nil {
		return rec, err
	}
	drawn, err := res.LastInsertId()
	if err != nil {
		return rec, err
	}
	ttl := c.Timings.LeaseDuration.Microseconds()
	rec = backends.Record{Holder: c.Identity, Owner: c.Owner, Token: uint64(drawn), Holders: c.Holders,
		TTL: time.Duration(ttl) * time.Microsecond, Left: time.Duration(ttl) * time.Microsecond, Waiting: -1, Node: l.s.addr,
		Acquired: time.Now(), Handle: h}
	rec.Renewed, rec.Version = rec.Acquired, version(rec)
	const now, expiry = "UTC_TIMESTAMP(6)", "UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND"
	if prev.Exists() {
		res, err = tx.ExecContext(ctx, "UPDATE "+l.s.locks+" SET holder = ?, owner = ?, token = ?, holders = ?, ttl_us = ?, "+
			"acquired = "+now+", renewed = "+now+", expires = "+expiry+" WHERE name = ? AND (holder = '' OR expires <= "+now+")",
			c.Identity, c.Owner, drawn, c.Holders, ttl, ttl, l.key)
	} else {
		res, err = tx.ExecContext(ctx, "INSERT INTO "+l.s.locks+" (name, holder, owner, token, holders, ttl_us, acquired, renewed, expires) "+
			"VALUES (?, ?, ?, ?, ?, ?, "+now+", "+now+", "+expiry+")", l.key, c.Identity, c.Owner, drawn, c.Holders, ttl, ttl)
	}
	if err != nil {
		return rec, err
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return rec, fmt.Errorf("mysql: %q is held, or changed since it was read: %w", l.key, backends.ErrConflict)
	}
	// Named locks are not transactional: this one is the holder's from
	// here, and a grant that does not commit gives it back above.
	if err := tx.QueryRowContext(ctx, "SELECT COALESCE(GET_LOCK(?, 0), 0)", l.held).Scan(&h.has); err != nil {
		return rec, err
	}
	return rec, tx.Commit()
}

// Keep implements backends.RecordLock: one UPDATE that moves the expiry
// to a lease from now by the database's clock, while the row is still
// held's and has not run out.
func (l *lock) Keep(ctx context.Context, held backends.Record) (backends.Record, error) {
	res, err := l.s.db.ExecContext(ctx, "UPDATE "+l.s.locks+" SET renewed = UTC_TIMESTAMP(6), "+
		"expires = UTC_TIMESTAMP(6) + INTERVAL ttl_us MICROSECOND WHERE "+live, l.key, held.Owner, held.Token)
	if err == nil && affected(res) == 0 {
		return held, fmt.Errorf("mysql: %q no longer holds token %d (deleted, expired by the database's clock, or taken): %w",
			l.key, held.Token, backends.ErrLeaseLost)
	} else if err != nil {
		return held, l.s.fail("renew", l.key, err)
	}
	held.Renewed = time.Now()
	return held, nil
}

func affected(res sql.Result) int64 {
	n, _ := res.RowsAffected()
	return n
}

// Free implements backends.RecordLock: the row is freed if it is still
// held's, its token kept, and only then the holder's named lock is given
// up, which wakes the first waiter. If the server cannot be reached, the
// lease runs out by its clock.
func (l *lock) Free(ctx context.Context, held backends.Record) error {
	_, err := l.s.db.ExecContext(ctx, "UPDATE "+l.s.locks+" SET holder = '', owner = '', expires = UTC_TIMESTAMP(6) "+
		"WHERE name = ? AND owner = ? AND token = ?", l.key, held.Owner, held.Token)
	if h, ok := held.Handle.(*hold); ok {
		h.release(ctx)
	}
	if err != nil && !isServerError(err, errNoTable) {
		return l.s.fail("release", l.key, err)
	}
	return nil
}

// ReadDoc implements backends.Lock. It reads at most one byte more than
// backends.MaxDoc.
func (l *lock) ReadDoc(ctx context.Context, name string) (backends.Doc, error) {
	d := backends.Doc{Name: name}
	var v uint64
	err := l.s.db.QueryRowContext(ctx, "SELECT version, SUBSTRING(data, 1, ?) FROM "+l.s.docs+" WHERE name = ? AND doc = ?",
		backends.MaxDoc+1, l.key, name).Scan(&v, &d.Data)
	switch {
	case errors.Is(err, sql.ErrNoRows), isServerError(err, errNoTable):
		return backends.Doc{Name: name}, nil
	case err != nil:
		return d, l.s.fail("read the "+name+" of", l.key, err)
	case len(d.Data) > backends.MaxDoc:
		return backends.Doc{Name: name}, fmt.Errorf("mysql: the %s of %q hold more than the %d bytes a document may: %w: %w",
			name, l.key, backends.MaxDoc, backends.ErrUnavailable, backends.ErrRefused)
	}
	d.Version = v
	return d, nil
}

// WriteDoc implements backends.Lock.
func (l *lock) WriteDoc(ctx context.Context, d backends.Doc) error {
	err := l.writeDoc(ctx, d, nil)
	if isServerError(err, errNoTable) {
		if err = l.s.ensureTables(ctx); err == nil {
			err = l.writeDoc(ctx, d, nil)
		}
	}
	return l.docErr(d, err)
}

// WriteDocHeld implements backends.RecordLock: in one transaction, a
// locking read of the row that finds it still held's (a takeover waits
// for the commit), and the document's write.
func (l *lock) WriteDocHeld(ctx context.Context, d backends.Doc, held backends.Record) error {
	return l.docErr(d, l.writeDoc(ctx, d, &held))
}

func (l *lock) docErr(d backends.Doc, err error) error {
	switch {
	case err == nil, errors.Is(err, backends.ErrConflict), errors.Is(err, backends.ErrLeaseLost):
		return err
	case isServerError(err, errDupKey), isServerError(err, errDeadlock):
		return fmt.Errorf("mysql: the %s of %q: %w: %w", d.Name, l.key, backends.ErrConflict, err)
	}
	return l.s.fail("write the "+d.Name+" of", l.key, err)
}

// writeDoc replaces d if it is still at d.Version (inserts it if that is
// nil) with a new random version, and, with held, only while held holds
// the lock.
func (l *lock) writeDoc(ctx context.Context, d backends.Doc, held *backends.Record) error {
	if len(d.Data) > backends.MaxDoc {
		return fmt.Errorf("mysql: the %s of %q: %d bytes, more than %d", d.Name, l.key, len(d.Data), backends.MaxDoc)
	}
	tx, err := l.s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op once committed
	if held != nil {
		var one int
		err := tx.QueryRowContext(ctx, "SELECT 1 FROM "+l.s.locks+" WHERE "+live+" LOCK IN SHARE MODE", l.key, held.Owner, held.Token).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) || isServerError(err, errNoTable) {
			return fmt.Errorf("mysql: %q no longer holds token %d; the %s were not written: %w", l.key, held.Token, d.Name, backends.ErrLeaseLost)
		} else if err != nil {
			return err
		}
	}
	next, data := rand.Uint64N(1<<63)+1, d.Data
	if data == nil {
		data = []byte{}
	}
	var res sql.Result
	if old, ok := d.Version.(uint64); ok {
		res, err = tx.ExecContext(ctx, "UPDATE "+l.s.docs+" SET version = ?, data = ? WHERE name = ? AND doc = ? AND version = ?",
			next, data, l.key, d.Name, old)
	} else {
		res, err = tx.ExecContext(ctx, "INSERT INTO "+l.s.docs+" (name, doc, version, data) VALUES (?, ?, ?, ?)", l.key, d.Name, next, data)
	}
	if err != nil {
		return err
	}
	if affected(res) != 1 {
		return fmt.Errorf("mysql: the %s of %q: %w", d.Name, l.key, backends.ErrConflict)
	}
	return tx.Commit()
}
