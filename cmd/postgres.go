package cmd

import (
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/postgres"
)

// postgresFlags are the flags of the PostgreSQL backend. The connection is
// configured as psql's, parsed by pgx: what the URL leaves out comes from a
// service file (service=, PGSERVICE), libpq's variables (PGHOST, PGPORT,
// PGUSER, PGPASSWORD, PGDATABASE, PGSSLMODE, PGPASSFILE, ...) and a missing
// password from ~/.pgpass (see the postgres package doc). DATABASE_URL is
// read when neither the flag nor LEADERRUN_POSTGRES_URL is set, but it is
// not one of the flag's variables: a variable that many programs set must
// never select this store by itself.
func postgresFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "postgres-url", Category: categoryStore, EnvVars: []string{"LEADERRUN_POSTGRES_URL"},
			Usage: "PostgreSQL connection `URL` or key=value string, as psql takes it (default: $DATABASE_URL); what it leaves out comes from a service file (service=NAME), libpq's PG* variables and ~/.pgpass; with no host anywhere, the socket in /var/run/postgresql. " +
				"Put no password here: arguments are visible to every user of the host (warned at start); use the variable, PGPASSWORD or ~/.pgpass"},
		&cli.StringFlag{Name: "postgres-table", Category: categoryStore, EnvVars: []string{"LEADERRUN_POSTGRES_TABLE"}, Value: postgres.DefaultTable,
			Usage: "lease `TABLE` ([schema.]name), created with its sequence, markers and history tables if missing"},
	}
}

var postgresStore = store{
	name:     "postgres",
	flags:    postgresFlags,
	selected: func(c *cli.Context) bool { return c.String("postgres-url") != "" },
	open:     openPostgres,
	address:  "--postgres-url (LEADERRUN_POSTGRES_URL), or --backend postgres with DATABASE_URL or libpq's PG* variables",
	// Only leaderrun's own variable: DATABASE_URL and PG* are as often
	// the job's own connection to its data.
	credentials: []string{"LEADERRUN_POSTGRES_URL"},
	risks:       postgresRisks,
}

// openPostgres validates the PostgreSQL flags and opens the store. No
// message shows the URL, which may carry a password: postgres.Open drops
// the string from pgx's parse errors.
func openPostgres(c *cli.Context, cfg storeConfig) (backends.Store, error) {
	url, source := c.String("postgres-url"), "--postgres-url"
	if url == "" {
		url, source = os.Getenv("DATABASE_URL"), "DATABASE_URL"
	}
	if url == "" {
		source = "libpq's PG* variables"
	}
	table := c.String("postgres-table")
	if strings.TrimSpace(table) == "" {
		return nil, usageErrorf("--postgres-table must not be empty")
	}
	if err := postgres.ValidateTable(table); err != nil {
		return nil, usageErrorf("--postgres-table: %v", err)
	}
	log, err := newLogger(c, os.Stderr)
	if err != nil {
		return nil, err
	}
	s, err := postgres.Open(postgres.Config{URL: url, Prefix: cfg.Prefix, Table: table, Log: log})
	if err != nil {
		return nil, usageErrorf("%s: %v", source, err)
	}
	return s, nil
}
