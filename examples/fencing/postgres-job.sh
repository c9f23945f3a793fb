#!/bin/sh
# postgres-job.sh: sqlite-job.sh against PostgreSQL. The connection comes
# from the usual libpq variables (PGHOST, PGPORT, PGDATABASE, PGUSER,
# PGPASSWORD or ~/.pgpass, PGSSLMODE, ...), which leaderrun's postgres
# backend reads too, so one environment holds the lease and the data in the
# same database:
#
#   PGHOST=db1 PGDATABASE=ops leaderrun --backend postgres --lock report -- ./postgres-job.sh "report of $(date +%F)"
#
# It stores VALUE in row 1 of job_state only if no write with a greater
# token has landed there: a leader that was paused, lost its lease and
# resumed later cannot overwrite what its successor wrote.
# Exit 0: write accepted. Exit 3: rejected as stale. Exit 64: FENCE_TOKEN is
# not a number. Other: psql failed.
set -eu

token=${FENCE_TOKEN:?FENCE_TOKEN is not set: run me under leaderrun}
value=${1:-"written by ${LEADERRUN_IDENTITY:-unknown} with token $token"}

case $token in '' | *[!0-9]*)
	echo "postgres-job: FENCE_TOKEN '$token' is not a number" >&2
	exit 64
	;;
esac

# psql quotes :'value' itself; :token is checked to be a number above.
# :ROW_COUNT is the number of rows the UPDATE changed (0 when the row holds
# a greater token). The UPDATE takes the row lock, so of two leaders writing
# at once the later one re-checks the guard against the row the earlier one
# committed. -q drops command tags and -At prints bare values: the output is
# one line, "ROWS TOKEN".
result=$(psql -X -q -At -v ON_ERROR_STOP=1 -v token="$token" -v value="$value" <<'SQL'
SET client_min_messages = warning;
CREATE TABLE IF NOT EXISTS job_state (
	id          integer PRIMARY KEY,
	value       text    NOT NULL,
	fence_token bigint  NOT NULL
);
INSERT INTO job_state (id, value, fence_token) VALUES (1, '', 0)
	ON CONFLICT (id) DO NOTHING;
UPDATE job_state SET value = :'value', fence_token = :token
	WHERE id = 1 AND fence_token <= :token;
SELECT :ROW_COUNT || ' ' || fence_token FROM job_state WHERE id = 1;
SQL
)

changed=${result%% *}
current=${result#* }
if [ "$changed" = 1 ]; then
	echo "postgres-job: wrote with token $token"
	exit 0
fi
echo "postgres-job: write with token $token rejected: the row holds token $current" >&2
exit 3
