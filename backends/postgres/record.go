package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leaderrun/leaderrun/backends"
)

// recordCols are the columns of a lease row that a Record is read from
// (row): times as microseconds (a number's text does not depend on the
// DateStyle), and the time the lease has left by the database's clock.
const recordCols = `holder, owner, token, (extract(epoch FROM ttl) * 1000000)::bigint,
	coalesce((extract(epoch FROM acquired) * 1000000)::bigint, 0),
	coalesce((extract(epoch FROM renewed) * 1000000)::bigint, 0),
	greatest((extract(epoch FROM expires - now()) * 1000000)::bigint, 0)`

// takeSQL: $1 name, $2 holder, $3 owner, $4 ttl in µs; %[1]s the lease
// table, %[2]s the sequence, %[3]s recordCols. It grants a row that is
// free or expired, or this candidacy's already (a retry whose answer was
// lost), with a token drawn on the row it grants (docs/backends/postgres.md:
// why it never goes backwards).
const takeSQL = `UPDATE %[1]s SET holder = $2, owner = $3, token = nextval(%[2]s::regclass),
	ttl = $4::bigint * interval '1 microsecond', acquired = now(), renewed = now(),
	expires = now() + $4::bigint * interval '1 microsecond'
WHERE name = $1 AND (holder = '' OR expires <= now() OR owner = $3)
RETURNING %[3]s`

// keepSQL: $1 name, $2 holder, $3 token; %[1]s the lease table, %[2]s
// recordCols. It renews the row while it is still ours, and returns
// whether it did and the row as it is now; no row if there is none.
const keepSQL = `WITH k AS (
	UPDATE %[1]s SET renewed = now(), expires = now() + ttl
	WHERE name = $1 AND holder = $2 AND token = $3 AND expires > now()
	RETURNING %[2]s
)
SELECT true, * FROM k
UNION ALL
SELECT false, %[2]s FROM %[1]s WHERE name = $1 AND NOT EXISTS (SELECT FROM k)`

// ownerHolders separates, in the owner column, the candidacy's Owner from
// its pool's size (docs/backends/postgres.md, "Holders and slots", says
// why there).
const ownerHolders = ";holders="

type row struct {
	holder, owner                       string
	token, ttl, acquired, renewed, left int64
}

func (r *row) dest() []any {
	return []any{&r.holder, &r.owner, &r.token, &r.ttl, &r.acquired, &r.renewed, &r.left}
}

func (r *row) record() backends.Record {
	owner, holders, _ := strings.Cut(r.owner, ownerHolders)
	rec := backends.Record{Holder: r.holder, Owner: owner, Token: uint64(r.token), Holders: backends.ParseHolders(holders),
		TTL: time.Duration(r.ttl) * time.Microsecond, Left: time.Duration(r.left) * time.Microsecond, Waiting: -1,
		Version: strconv.FormatInt(r.token, 10) + "/" + r.holder}
	if r.acquired != 0 {
		rec.Acquired, rec.Renewed = time.UnixMicro(r.acquired), time.UnixMicro(r.renewed)
	}
	return rec
}

// Get implements backends.RecordLock. A row or a table that does not
// exist yet is a free lock. Waiting is -1: waiters that poll leave no
// trace.
func (l *lock) Get(ctx context.Context) (backends.Record, error) {
	var r row
	err := l.s.do(ctx, true, func(ctx context.Context, c *pgx.Conn) error {
		return queryRow(ctx, c, l.s.sql.get, []any{l.key}, r.dest()...)
	})
	switch {
	case errors.Is(err, errNoRows), pgCode(err) == "42P01": // undefined_table
		return backends.Record{Waiting: -1}, nil
	case err != nil:
		return backends.Record{}, l.s.fail("read", l.key, err)
	}
	return r.record(), nil
}

// Take implements backends.RecordLock with one conditional UPDATE, which
// the database's clock decides; a missing row is first created free,
// without a token (docs/backends/postgres.md says why).
func (l *lock) Take(ctx context.Context, prev backends.Record, claim backends.Claim) (backends.Record, error) {
	if err := l.s.ensure(ctx, l.key); err != nil {
		return backends.Record{}, err
	}
	owner := claim.Owner
	if claim.Holders > 1 {
		owner += ownerHolders + strconv.Itoa(claim.Holders)
	}
	ttl := max(claim.Timings.LeaseDuration.Microseconds(), 1)
	var r row
	err := l.s.do(ctx, true, func(ctx context.Context, c *pgx.Conn) error {
		if !prev.Exists() {
			if err := exec(ctx, c, l.s.sql.ensureRow, l.key); err != nil {
				return err
			}
		}
		return queryRow(ctx, c, l.s.sql.take, []any{l.key, claim.Identity, owner, ttl}, r.dest()...)
	})
	switch {
	case errors.Is(err, errNoRows):
		return backends.Record{}, fmt.Errorf("postgres: %q in table %s: %w", l.key, l.s.sql.ids.tableName, backends.ErrConflict)
	case pgCode(err) == "42P01":
		l.s.schemaGone()
	}
	if err != nil {
		return backends.Record{}, l.s.fail("take", l.key, err)
	}
	return r.record(), nil
}

// Keep implements backends.RecordLock with one conditional UPDATE; one
// that matches no row is a loss, whose reason the statement reads.
func (l *lock) Keep(ctx context.Context, held backends.Record) (backends.Record, error) {
	var (
		kept bool
		r    row
	)
	err := l.s.do(ctx, true, func(ctx context.Context, c *pgx.Conn) error {
		return queryRow(ctx, c, l.s.sql.keep, []any{l.key, held.Holder, int64(held.Token)}, append([]any{&kept}, r.dest()...)...)
	})
	where := fmt.Sprintf("%q in table %s", l.key, l.s.sql.ids.tableName)
	switch {
	case err == nil && kept:
		return r.record(), nil
	case errors.Is(err, errNoRows):
		return held, fmt.Errorf("postgres: the row %s was deleted: %w", where, backends.ErrLeaseLost)
	case pgCode(err) == "42P01":
		l.s.schemaGone()
		return held, fmt.Errorf("postgres: the table %s was dropped: %w", l.s.sql.ids.tableName, backends.ErrLeaseLost)
	case err != nil:
		return held, l.s.fail(fmt.Sprintf("renew (token %d)", held.Token), l.key, err)
	case r.holder == "":
		return held, fmt.Errorf("postgres: %s was freed by someone else (token %d, ours %d): %w", where, r.token, held.Token, backends.ErrLeaseLost)
	case r.holder != held.Holder || uint64(r.token) != held.Token:
		return held, fmt.Errorf("postgres: %s is held by %q with token %d, not by us (%q, token %d): %w",
			where, r.holder, r.token, held.Holder, held.Token, backends.ErrLeaseLost)
	}
	return held, fmt.Errorf("postgres: the lease on %s (token %d) expired by the database's clock: %w", where, held.Token, backends.ErrLeaseLost)
}

// Free implements backends.RecordLock: the row stays, free, as proof of
// the last token granted.
func (l *lock) Free(ctx context.Context, held backends.Record) error {
	err := l.s.do(ctx, true, func(ctx context.Context, c *pgx.Conn) error {
		return exec(ctx, c, l.s.sql.free, l.key, held.Holder, int64(held.Token))
	})
	if err != nil && pgCode(err) != "42P01" {
		return l.s.fail(fmt.Sprintf("free (token %d)", held.Token), l.key, err)
	}
	return nil
}
