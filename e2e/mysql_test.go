//go:build linux

package e2e

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// mysqlTestTimings: the database expires a lease 3 s after its last
// renewal by its own clock; the child gets the kill signal 2 s after the
// send time of the last acknowledged renewal and SIGKILL 500 ms later, so
// it is dead at least 500 ms before anyone can take the lock.
var mysqlTestTimings = timings{lease: 3 * time.Second, deadline: 2 * time.Second, retry: 500 * time.Millisecond, grace: 500 * time.Millisecond}

const (
	mysqlLease = 3 * time.Second
	mysqlRetry = 500 * time.Millisecond
	// mysqlTable is the store's default lease table, in database
	// leaderrun (testenv.StartMariaDB makes it).
	mysqlTable = "leaderrun_locks"
)

// mysqlStore is MySQL in the scenarios' matrix, on MariaDB: one server,
// root's DSN (without its password) in LEADERRUN_MYSQL_DSN and the
// password in the file LEADERRUN_MYSQL_PASSWORD_FILE names, as the flags'
// help recommends (nothing secret on the command line). The first waiter
// in line waits in GET_LOCK for the holder's named lock, which a release,
// or the holder's death, gives up at once; the holder reads its row every
// 500 ms (the database tells it of no change).
func mysqlStore() *store {
	return &store{
		name: "mysql", start: startMySQLStore, timings: mysqlTestTimings,
		// The database's clock expires the lease; the first in line,
		// woken by the holder's death, reads the row every retry period.
		takeover: mysqlLease + mysqlRetry + 500*time.Millisecond, handover: 300 * time.Millisecond,
		notice: 500*time.Millisecond + 100*time.Millisecond, statusBound: mysqlLease + 5*time.Second,
		expires: true, ttl: true, remaining: true, durable: true, lostTerm: true,
		// A lease of 2 s, for a takeover inside the fleet's --wait 4s
		// after a kill -9; renewals and reads every 300 ms.
		onceTimings:   timings{lease: 2 * time.Second, deadline: 1200 * time.Millisecond, retry: 300 * time.Millisecond, grace: 500 * time.Millisecond},
		escapeTimings: timings{lease: 3 * time.Second, deadline: 2 * time.Second, retry: 500 * time.Millisecond, grace: escapeGrace},
		credentials:   []string{"LEADERRUN_MYSQL_DSN", "LEADERRUN_MYSQL_PASSWORD_FILE"},
		// The job's own client's password and server (cmd/mysql.go: MYSQL_PWD
		// is as often the job's own).
		kept: []string{"MYSQL_PWD=job-secret", "MYSQL_HOST=db.internal"},
	}
}

func startMySQLStore(t *testing.T) *target {
	// The scenarios share the server: each waiter keeps a connection, a
	// holder two.
	m := testenv.StartMariaDB(t, testenv.MariaDBOptions{MaxConnections: 1000})
	db := m.DB(t)
	pwfile := filepath.Join(t.TempDir(), "mysql-password")
	if err := os.WriteFile(pwfile, []byte(m.RootPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	vars := func(addr string) []string {
		return []string{"LEADERRUN_MYSQL_DSN=root@tcp(" + addr + ")/leaderrun", "LEADERRUN_MYSQL_PASSWORD_FILE=" + pwfile}
	}
	exec1 := func(t *testing.T, q string, args ...any) int64 {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		res, err := db.ExecContext(ctx, q, args...)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		n, _ := res.RowsAffected()
		return n
	}
	row := func(q string) func(t *testing.T, e *env, lock string) time.Time {
		return func(t *testing.T, _ *env, lock string) time.Time {
			sent := time.Now()
			if n := exec1(t, q, "leaderrun/"+lock); n != 1 {
				t.Fatalf("%s changed %d rows, want 1", q, n)
			}
			return sent
		}
	}
	client := mysqlClient(t)
	return &target{
		env: vars(m.Addr()), key: keyUnder("leaderrun/%s"),
		waiting: mysqlWaiting(m, db), link: m.Addr(),
		via: func(addr string) ([]string, []string) { return nil, vars(addr) },
		// The holder reads its row every 500 ms.
		losses: []loss{
			{name: "Deleted", says: []string{"was deleted"}, do: row("DELETE FROM " + mysqlTable + " WHERE name = ?")},
			{name: "Taken", says: []string{`was taken by \"operator\"`},
				do: row("UPDATE " + mysqlTable + " SET holder = 'operator', owner = 'operator' WHERE name = ?")},
		},
		// The token's counter is a row of its own: deleting the lock's row
		// does not take it back.
		wipe: func(t *testing.T, lock string) {
			exec1(t, "DELETE FROM "+mysqlTable+" WHERE name = ?", "leaderrun/"+lock)
		},
		// The job lives on for two seconds: long enough for its leader to
		// read its row (every 500 ms), see the loss and stop it, so that
		// the history says "lost".
		loseCommand: func(t *testing.T, lock string) string {
			return fmt.Sprintf(`MYSQL_PWD=%s %s --protocol=tcp -h 127.0.0.1 -P %d -u root leaderrun -e "DELETE FROM %s WHERE name = 'leaderrun/%s'" && sleep 2`,
				m.RootPassword, client, m.Port(), mysqlTable, lock)
		},
		record: func(t *testing.T, lock string) string { return mysqlRecord(t, db, lock) },
		marker: func(t *testing.T, lock, key string) string {
			var data []byte
			err := db.QueryRow("SELECT data FROM "+mysqlTable+"_docs WHERE name = ? AND doc = 'markers'", "leaderrun/"+lock).Scan(&data)
			if err != nil && !errors.Is(err, sql.ErrNoRows) && !isNoTable(err) {
				t.Fatalf("read the markers: %v", err)
			}
			var all []struct{ Key, Identity string }
			_ = json.Unmarshal(data, &all)
			for _, mk := range all {
				if mk.Key == key {
					return mk.Identity
				}
			}
			return ""
		},
		stopServer: m.Stop, startServer: m.Start,
	}
}

// mysqlClient is the mariadb (or mysql) command-line client.
func mysqlClient(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"mariadb", "mysql"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	testenv.Missing(t, "neither mariadb nor mysql (the client) is installed")
	return ""
}

// mysqlWaiting is target.waiting for MySQL: status does not count the
// waiters, but each waits in GET_LOCK, which the server's process list
// shows: one more session waits for the queue's named lock, or, first in
// line, for the holder's, than before p started.
func mysqlWaiting(m *testenv.MariaDB, db *sql.DB) func(t *testing.T, lock string) func(p *proc) bool {
	return func(t *testing.T, lock string) func(p *proc) bool {
		queue, held := testenv.MySQLNamedLocks("leaderrun", mysqlTable, "leaderrun/"+lock)
		waiters := func() int {
			return m.SessionsOf(t, db, "SELECT GET_LOCK('"+queue+"'") + m.SessionsOf(t, db, "SELECT IS_USED_LOCK('"+held+"')")
		}
		before := waiters()
		waits := every(20*time.Millisecond, func() bool { return waiters() > before })
		return func(*proc) bool { return waits() }
	}
}

// mysqlRecord is the lock's row and its token's counter, as an operator
// reads them.
func mysqlRecord(t *testing.T, db *sql.DB, lock string) string {
	t.Helper()
	var rec string
	err := db.QueryRow(`SELECT CONCAT(COALESCE((SELECT CONCAT(holder, ' ', owner, ' ', token, ' ', acquired) FROM `+mysqlTable+` WHERE name = ?), 'none'),
		', counter ', COALESCE((SELECT token FROM `+mysqlTable+`_tokens WHERE name = ?), 0))`, "leaderrun/"+lock, "leaderrun/"+lock).Scan(&rec)
	if err != nil && !isNoTable(err) {
		t.Fatalf("read the lock's row: %v", err)
	}
	return rec
}

// isNoTable: the tables do not exist yet (error 1146), as before the
// first grant.
func isNoTable(err error) bool {
	var me *gomysql.MySQLError
	return errors.As(err, &me) && me.Number == 1146
}
