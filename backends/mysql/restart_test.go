package mysql_test

import (
	"context"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/backendtest"
	"github.com/leaderrun/leaderrun/backends/mysql"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

// TestMySQLRestart: tokens go on growing across a restart of the server
// and a kill -9 of it (InnoDB recovers what was committed), a waiter
// waits through a two-second outage and then wins, and InnoDB's
// AUTO_INCREMENT counter, which the store does not use, is checked to
// survive a restart as docs/backends/mysql.md says.
func TestMySQLRestart(t *testing.T) {
	m := testenv.StartMariaDB(t, testenv.MariaDBOptions{})
	e := &env{m: m, db: m.DB(t)}
	s := newStore(t, e, mysql.Config{})
	lock := lockName()
	var last uint64
	grant := func(step string) {
		t.Helper()
		l := campaign(t, s, lock, step, defaultTimings)
		if l.Token() <= last {
			t.Fatalf("%s: token %d, not above %d", step, l.Token(), last)
		}
		last = l.Token()
		backendtest.Release(t, l)
	}
	grant("before")
	e.exec(t, "CREATE TABLE autoinc (id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY)")
	e.exec(t, "INSERT INTO autoinc () VALUES (), (), ()")
	e.exec(t, "DELETE FROM autoinc")
	began := time.Now()
	m.Restart(t)
	restarted := time.Since(began)
	grant("after a restart")
	began = time.Now()
	m.Kill(t)
	m.Start(t)
	t.Logf("SIGTERM and start took %v, kill -9 and start %v", restarted.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
	grant("after a kill -9")
	res, err := e.db.Exec("INSERT INTO autoinc () VALUES ()")
	if err != nil {
		t.Fatal(err)
	}
	if id, _ := res.LastInsertId(); id != 4 {
		t.Errorf("AUTO_INCREMENT after the rows were deleted and the server restarted: %d, want 4 (persisted since MariaDB 10.2.4)", id)
	}

	// An outage while a candidate waits: it waits on, and wins.
	tm := timings(2*time.Second, 200*time.Millisecond)
	holder := campaign(t, s, lock, "holder", tm)
	waiter := newStore(t, e, mysql.Config{})
	won := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		l, err := backends.Campaign(ctx, waiter, lock, backends.Candidate{Identity: "waiter", Timings: tm, Wait: 25 * time.Second})
		if err == nil {
			if l.Token() <= holder.Token() {
				t.Errorf("after the outage: token %d, not above %d", l.Token(), holder.Token())
			}
			backendtest.Release(t, l)
		}
		won <- err
	}()
	_, held := mysql.NamedLocks(s, lock)
	waitFor(t, "the waiter in line", func() bool { return m.SessionsOf(t, e.db, held) == 1 })
	m.Stop(t)
	time.Sleep(2 * time.Second) // the outage itself
	m.Start(t)
	if err := <-won; err != nil {
		t.Errorf("a waiter through a 2s outage: %v", err)
	}
}
