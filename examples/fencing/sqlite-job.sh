#!/bin/sh
# sqlite-job.sh: a job that fences its write with $FENCE_TOKEN, run under
# leaderrun on every host that could run it:
#
#   leaderrun --lock report -- ./sqlite-job.sh /srv/report.db "report of $(date +%F)"
#
# It stores VALUE in row 1 only if no write with a greater token has landed
# there: a leader that was paused, lost its lease and resumed later cannot
# overwrite what its successor wrote.
# Exit 0: write accepted. Exit 3: rejected as stale. Other: sqlite3 failed.
set -eu

db=${1:?usage: sqlite-job.sh DB [VALUE]}
token=${FENCE_TOKEN:?FENCE_TOKEN is not set: run me under leaderrun}
value=${2:-"written by ${LEADERRUN_IDENTITY:-unknown} with token $token"}

# The token goes into SQL unquoted, so it must be a number; VALUE is quoted
# by doubling its single quotes.
case $token in '' | *[!0-9]*)
	echo "sqlite-job: FENCE_TOKEN '$token' is not a number" >&2
	exit 64
	;;
esac
value=$(printf '%s' "$value" | sed "s/'/''/g")

# One sqlite3 run: the guarded UPDATE and changes(), which counts the rows
# that UPDATE changed (0 when the row holds a greater token). -bail stops at
# the first error; .timeout waits for a concurrent writer's lock.
result=$(sqlite3 -bail -batch "$db" <<SQL
.timeout 5000
CREATE TABLE IF NOT EXISTS job_state (
	id          INTEGER PRIMARY KEY,
	value       TEXT    NOT NULL,
	fence_token INTEGER NOT NULL
);
INSERT OR IGNORE INTO job_state (id, value, fence_token) VALUES (1, '', 0);
UPDATE job_state SET value = '$value', fence_token = $token
	WHERE id = 1 AND fence_token <= $token;
SELECT changes() || ' ' || fence_token FROM job_state WHERE id = 1;
SQL
)

changed=${result%% *}
current=${result#* }
if [ "$changed" = 1 ]; then
	echo "sqlite-job: wrote with token $token"
	exit 0
fi
echo "sqlite-job: write with token $token rejected: the row holds token $current" >&2
exit 3
