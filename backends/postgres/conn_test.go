package postgres

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// TestRowsBounded: a statement that returns more rows than it can gets
// errTooManyRows at the second, however many the server sends.
func TestRowsBounded(t *testing.T) {
	fake := testenv.StartHostilePostgres(t, testenv.EndlessRows)
	pc, err := parseConnString(fake.URL())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.ConnectConfig(ctx, pc.ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var v [10]string // the columns the server describes
	start := time.Now()
	err = queryRow(ctx, c, "SELECT 1", nil, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9])
	if !errors.Is(err, errTooManyRows) || !refused(err) {
		t.Errorf("queryRow against endless rows = %v, want errTooManyRows, a refusal", err)
	}
	t.Logf("%v after %v", err, time.Since(start))
}
