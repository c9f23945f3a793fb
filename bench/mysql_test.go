package bench

import (
	"context"
	"database/sql"
	"encoding/binary"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// mysqlTimings are the fault suite's (faults/mysql_test.go), as
// PostgreSQL's: the database grants the lease asked, on its own clock.
var mysqlTimings = timings{lease: 5 * time.Second, deadline: 3 * time.Second, retry: 500 * time.Millisecond, grace: time.Second}

// mysqlTable is the store's default lease table (backends/mysql).
const mysqlTable = "leaderrun_locks"

// lrMySQL is leaderrun on MariaDB as root, the password in MYSQL_PWD (set
// when the server starts: it is random), not in the DSN.
var lrMySQL = leaderrunOn("lrm", "leaderrun (MySQL)", "mysql", func(addr string) []string { return []string{"--mysql-dsn", addr} }, mysqlTimings)

// mysqlColumn is MySQL, on Debian's MariaDB. Waiters queue on a named
// lock (GET_LOCK); the first in line waits on the holder's, and is woken
// when the holder gives it up, then keeps the queue's as the holder; the
// holder reads its row every retry period (at most 500 ms), since the
// database tells it of no change.
var mysqlColumn = &storeColumn{name: "mysql", title: "MySQL (MariaDB)", lr: lrMySQL, tm: mysqlTimings, latency: true,
	crashGoal: mysqlTimings.lease + mysqlTimings.retry + 500*time.Millisecond, crashGoalText: "lease + retry period + 0.5 s",
	crashBound: mysqlTimings.lease + 10*time.Second, crashTrials: 5, herdWoken: 1, herdHandover: 50 * time.Millisecond,
	newStore: func() store { return &mysqlStore{} }}

// mysqlStore is one MariaDB server (testenv.StartMariaDB: InnoDB, binary
// log off), with room for every connection of the herd: a waiter keeps a
// connection of its own, beside its pool's.
type mysqlStore struct {
	db    *testenv.MariaDB
	admin *sql.DB
}

const mysqlMaxConnections = 1000

func (s *mysqlStore) start(b *bench) {
	s.db = testenv.StartMariaDB(b.t, testenv.MariaDBOptions{MaxConnections: mysqlMaxConnections})
	// The meter's proxies connect from 127.1.x.y (nextSourceIP): root
	// may log in from all of 127/8.
	s.db.Exec(b.t, "CREATE USER root@'127.%' IDENTIFIED BY '"+s.db.RootPassword+"'", "GRANT ALL ON *.* TO root@'127.%'")
	s.admin = s.db.DB(b.t)
	lrMySQL.env = []string{"MYSQL_PWD=" + s.db.RootPassword}
}

func (s *mysqlStore) addr(*tool) string { return mysqlDSN(s.db.Addr()) }
func (s *mysqlStore) prepare(string)    {}

func mysqlDSN(addr string) string { return "root@tcp(" + addr + ")/leaderrun" }

// candidates: the holder (a live row) and the sessions waiting in
// GET_LOCK on the lock's named locks (the queue's, or the holder's for
// the first in line), from the server itself.
func (s *mysqlStore) candidates(_ *tool, lock, _ string, _ []*proc) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	key := "leaderrun/" + lock
	queue, held := testenv.MySQLNamedLocks("leaderrun", mysqlTable, key)
	var holder, waiting int
	err := s.admin.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+mysqlTable+" WHERE name = ? AND holder <> '' AND expires > UTC_TIMESTAMP(6)", key).Scan(&holder)
	if err != nil && !strings.Contains(err.Error(), "doesn't exist") {
		return 0, err
	}
	err = s.admin.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE (INFO LIKE ? OR INFO LIKE ?) AND INFO LIKE '%GET_LOCK(%' AND ID <> CONNECTION_ID()",
		"%"+queue+"%", "%"+held+"%").Scan(&waiting)
	return holder + waiting, err
}

// drop deletes the lock's row, as an operator would by hand.
func (s *mysqlStore) drop(_ *tool, lock, _ string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	at := mono()
	res, err := s.admin.ExecContext(ctx, "DELETE FROM "+mysqlTable+" WHERE name = ?", "leaderrun/"+lock)
	if err == nil {
		if n, _ := res.RowsAffected(); n != 1 {
			err = fmt.Errorf("no row for %s", lock)
		}
	}
	return at, err
}

func (s *mysqlStore) dropText() string {
	return "the lock's row deleted (`DELETE FROM leaderrun_locks WHERE name = 'leaderrun/LOCK'`)"
}

func (s *mysqlStore) meter(*bench, *tool) meter { return &mysqlMeter{target: s.db.Addr()} }

// mysqlMeter gives each process a TCP proxy of its own in front of the
// server, which reads the MySQL protocol: the statements the client
// sends (the store interpolates its parameters: every statement is a
// COM_QUERY, in plain text), and when the server answers a GET_LOCK that
// waits.
type mysqlMeter struct {
	target string
	proxySet[*tcpProxy]
}

func (m *mysqlMeter) addr(_ *tool, tag string) string {
	p, err := newTCPProxy(m.target, nextSourceIP(), newMySQLInspector)
	if err != nil {
		benchT.Fatal(err)
	}
	m.add(tag, p)
	return mysqlDSN(p.addr())
}

func (m *mysqlMeter) mark() mark { return mark{at: mono(), wall: time.Now()} }

func (m *mysqlMeter) how() string {
	return "a TCP proxy in front of the server for each process, which reads the statements it sends (COM_QUERY: the store interpolates its parameters) and when the server answers them. " +
		"The renewal (and the holder's keeping of its named lock) is a keep-alive; a waiter's GET_LOCK that waits, on the queue's named lock or the holder's, is a blocking query, " +
		"and one answered well before its timeout woke the waiter; reads of the row, grants and the rest are other"
}

// mysqlGetLock finds the timeouts of a statement's GET_LOCK calls (the
// store interpolates them: GET_LOCK('name', 5)).
var mysqlGetLock = regexp.MustCompile(`GET_LOCK\('(?:[^'\\]|\\.)*', (\d+)\)`)

// mysqlStatement names a statement of backends/mysql and sorts it into a
// class; wait is how long its GET_LOCK may wait (0: it does not).
func mysqlStatement(q string) (k reqKey, wait time.Duration) {
	q = strings.TrimSpace(q)
	for _, m := range mysqlGetLock.FindAllStringSubmatch(q, -1) {
		if n, err := strconv.Atoi(m[1]); err == nil {
			wait = max(wait, time.Duration(n)*time.Second)
		}
	}
	up := strings.ToUpper(q)
	has := func(s string) bool { return strings.Contains(up, s) }
	switch {
	case strings.HasPrefix(up, "SELECT IS_USED_LOCK(") && wait > 0:
		return reqKey{"wait on the holder's named lock (GET_LOCK)", classBlocking}, wait
	case strings.HasPrefix(up, "SELECT GET_LOCK(") && wait > 0:
		return reqKey{"wait in line (GET_LOCK)", classBlocking}, wait
	case strings.HasPrefix(up, "SELECT CONNECTION_ID(), GET_LOCK("):
		return reqKey{"join the queue (GET_LOCK, no wait)", classBlocking}, 0
	case strings.HasPrefix(up, "UPDATE") && has("SET RENEWED"):
		return reqKey{"renew", classKeepalive}, 0
	case strings.HasPrefix(up, "DO IF(IS_USED_LOCK("):
		return reqKey{"keep the holder's named lock", classKeepalive}, 0
	case strings.HasPrefix(up, "SELECT VERSION, SUBSTRING(DATA"):
		return reqKey{"read a document (history)", classOther}, 0
	case strings.HasPrefix(up, "SELECT 1 FROM") && has("LOCK IN SHARE MODE"),
		strings.HasPrefix(up, "UPDATE") && has("SET VERSION ="), strings.HasPrefix(up, "INSERT INTO") && has("(NAME, DOC, VERSION"):
		return reqKey{"write a document (history)", classOther}, 0
	case strings.HasPrefix(up, "START TRANSACTION"), up == "COMMIT", up == "ROLLBACK":
		return reqKey{"transaction: " + strings.ToLower(strings.Fields(up)[0]), classOther}, 0
	case strings.HasPrefix(up, "SET SESSION WAIT_TIMEOUT") && has("GET_LOCK("):
		return reqKey{"grant: take the holder's named lock", classOther}, 0
	case strings.HasPrefix(up, "SET SESSION WAIT_TIMEOUT"):
		return reqKey{"join the queue: idle timeout (SET)", classOther}, 0
	case strings.HasPrefix(up, "SET "):
		return reqKey{"SET (connection set-up)", classOther}, 0
	case strings.HasPrefix(up, "SELECT HOLDER, OWNER, TOKEN"):
		return reqKey{"read the row", classOther}, 0
	case strings.HasPrefix(up, "INSERT INTO") && has("LAST_INSERT_ID"):
		return reqKey{"grant: draw a token", classOther}, 0
	case strings.HasPrefix(up, "UPDATE") && has("SET HOLDER = ''"):
		return reqKey{"release", classOther}, 0
	case strings.HasPrefix(up, "UPDATE") && has("SET HOLDER"), strings.HasPrefix(up, "INSERT INTO") && has("(NAME, HOLDER"):
		return reqKey{"grant: write the row", classOther}, 0
	case strings.HasPrefix(up, "DO GET_LOCK("), strings.HasPrefix(up, "DO RELEASE_LOCK("):
		return reqKey{"grant: the winner's queue session takes the holder's named lock", classOther}, 0
	case strings.HasPrefix(up, "DO RELEASE_ALL_LOCKS("):
		return reqKey{"release: give up the named locks", classOther}, 0
	}
	word, _, _ := strings.Cut(up, " ")
	return reqKey{word, classOther}, 0
}

// mysqlInspector reads one connection: the packets (a 3-byte length and
// a sequence number) each way. A command is a client packet of sequence 0
// (the handshake's are not); its answer starts with the server's packet
// of sequence 1.
type mysqlInspector struct {
	up, down []byte
	// waiting: the command in flight is a GET_LOCK that may wait until
	// by (mono).
	waiting bool
	by      time.Duration
}

func newMySQLInspector() inspector { return &mysqlInspector{} }

// mysqlPackets takes the complete packets off buf: (sequence, payload).
func mysqlPackets(buf *[]byte, each func(seq byte, payload []byte)) {
	for len(*buf) >= 4 {
		n := int(binary.LittleEndian.Uint32(append((*buf)[:3:3], 0)))
		if len(*buf) < 4+n {
			break
		}
		each((*buf)[3], (*buf)[4:4+n])
		*buf = (*buf)[4+n:]
	}
	if len(*buf) == 0 {
		*buf = nil
	} else if len(*buf) > 1<<24+4 {
		*buf = nil // not the MySQL protocol: stop reading
	}
}

func (mi *mysqlInspector) client(data []byte, at time.Duration, p *tcpProxy) {
	mi.up = append(mi.up, data...)
	mysqlPackets(&mi.up, func(seq byte, payload []byte) {
		if seq != 0 || len(payload) == 0 {
			return
		}
		var k reqKey
		var wait time.Duration
		switch payload[0] {
		case 0x03: // COM_QUERY
			k, wait = mysqlStatement(string(payload[1:]))
		case 0x0e:
			k = reqKey{"ping", classKeepalive}
		case 0x01:
			k = reqKey{"quit", classOther}
		default:
			k = reqKey{fmt.Sprintf("command 0x%02x", payload[0]), classOther}
		}
		mi.waiting, mi.by = wait > 0, at+wait
		p.record(request{start: at, end: at, key: k})
	})
}

// server: a waiting GET_LOCK answered more than a quarter second before
// its timeout woke its waiter (the lock was given up, or the session
// killed).
func (mi *mysqlInspector) server(data []byte, at time.Duration, p *tcpProxy) {
	mi.down = append(mi.down, data...)
	mysqlPackets(&mi.down, func(seq byte, _ []byte) {
		if seq == 1 && mi.waiting {
			mi.waiting = false
			if at < mi.by-250*time.Millisecond {
				p.event(at)
			}
		}
	})
}

// TestMySQLInspector: statements are read from COM_QUERY packets of
// sequence 0 (not the handshake's), named and classed; a waiting
// GET_LOCK answered well before its timeout is a wake-up, one answered
// at its timeout is not.
func TestMySQLInspector(t *testing.T) {
	packet := func(seq byte, payload string) []byte {
		n := len(payload)
		return append([]byte{byte(n), byte(n >> 8), byte(n >> 16), seq}, payload...)
	}
	p := &tcpProxy{}
	mi := newMySQLInspector()
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	hello := packet(1, "\x85\xa6root\x00")
	mi.client(hello, 0, p)
	q := packet(0, "\x03SELECT GET_LOCK('leaderrun:ab:q', 10)")
	mi.client(q[:5], sec(0.1), p) // split across reads
	mi.client(q[5:], sec(0.1), p)
	mi.server(packet(1, "\x01"), sec(1), p) // woken after 0.9 s of 10
	mi.client(packet(0, "\x03SELECT IS_USED_LOCK('h') IS NOT NULL, GET_LOCK('h', 5), RELEASE_LOCK('h')"), sec(2), p)
	mi.server(packet(1, "\x03"), sec(7), p) // its timeout
	mi.client(packet(0, "\x03UPDATE `leaderrun_locks` SET renewed = UTC_TIMESTAMP(6), expires = UTC_TIMESTAMP(6) + INTERVAL ttl_us MICROSECOND WHERE name = 'x'"), sec(8), p)
	mi.client(packet(0, "\x03SELECT holder, owner, token, holders FROM t WHERE name = 'x'"), sec(9), p)
	var got []reqKey
	for _, r := range p.started(0, sec(10)) {
		got = append(got, r.key)
	}
	want := []reqKey{{"wait in line (GET_LOCK)", classBlocking}, {"wait on the holder's named lock (GET_LOCK)", classBlocking},
		{"renew", classKeepalive}, {"read the row", classOther}}
	if !slices.Equal(got, want) {
		t.Errorf("requests %v, want %v", got, want)
	}
	if n := p.woken(0, sec(10)); n != 1 {
		t.Errorf("%d wake-ups, want 1", n)
	}
}

// TestMySQLStatements: the statements of backends/mysql that set a
// session up or move a named lock are told apart.
func TestMySQLStatements(t *testing.T) {
	for q, want := range map[string]string{
		"SET SESSION wait_timeout = 5, @held = GET_LOCK('leaderrun:ab:h', 0)": "grant: take the holder's named lock",
		"SET SESSION wait_timeout = 5":                                        "join the queue: idle timeout (SET)",
		"SET NAMES utf8mb4":                                                   "SET (connection set-up)",
		"DO GET_LOCK('leaderrun:ab:h', 0)":                                    "grant: the winner's queue session takes the holder's named lock",
		"DO RELEASE_ALL_LOCKS()":                                              "release: give up the named locks",
		"SELECT GET_LOCK('leaderrun:ab:q', 10)":                               "wait in line (GET_LOCK)",
	} {
		if k, _ := mysqlStatement(q); k.name != want {
			t.Errorf("%q: %q, want %q", q, k.name, want)
		}
	}
}
