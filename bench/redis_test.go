package bench

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// redisStore is one redis-server as docs/backends/redis.md asks for one
// whose tokens must only grow: appendonly yes, appendfsync always (every
// write on disk before it is acknowledged), and a password.
type redisStore struct {
	r     *testenv.Redis
	admin *goredis.Client
}

const redisBenchPassword = "bench-redis-pa55"

func (s *redisStore) start(b *bench) {
	s.r = testenv.StartRedis(b.t, testenv.RedisOptions{Password: redisBenchPassword, AOF: true})
	s.admin = s.r.Client(b.t)
}

func (s *redisStore) addr(*tool) string { return s.r.URL() }
func (s *redisStore) prepare(string)    {}

// candidates: the holder (the lock's key) and the live waiters of the
// queue, from the server itself.
func (s *redisStore) candidates(_ *tool, lock, _ string, _ []*proc) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	key := "leaderrun/" + lock
	held, err := s.admin.Exists(ctx, key).Result()
	if err != nil {
		return 0, err
	}
	waiting, err := s.admin.ZCount(ctx, "leaderrun/:alive:"+lock, strconv.FormatInt(time.Now().UnixMilli(), 10), "+inf").Result()
	return int(held + waiting), err
}

// drop deletes the lock's key, as an operator would by hand.
func (s *redisStore) drop(_ *tool, lock, _ string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	at := mono()
	n, err := s.admin.Del(ctx, "leaderrun/"+lock).Result()
	if err == nil && n != 1 {
		err = fmt.Errorf("no key leaderrun/%s", lock)
	}
	return at, err
}

func (s *redisStore) dropText() string {
	return "the lock's key deleted (`DEL leaderrun/LOCK`)"
}

func (s *redisStore) meter(*bench, *tool) meter { return &redisMeter{target: s.r.Addr()} }

// redisMeter gives each process a TCP proxy of its own in front of the
// server, which reads the commands it sends (RESP arrays of strings) and
// the pub/sub messages the server pushes to it.
type redisMeter struct {
	target string
	proxySet[*tcpProxy]
}

func (m *redisMeter) addr(_ *tool, tag string) string {
	p, err := newTCPProxy(m.target, nextSourceIP(), newRedisInspector)
	if err != nil {
		benchT.Fatal(err)
	}
	m.add(tag, p)
	return "redis://:" + redisBenchPassword + "@" + p.addr()
}

func (m *redisMeter) mark() mark { return mark{at: mono(), wall: time.Now()} }

func (m *redisMeter) how() string {
	return "a TCP proxy in front of the server for each process, which reads the commands it sends and the pub/sub messages it is sent. " +
		"A script is named by what it is (acquire, renew, release, ...), told apart by its numbers of keys and arguments. " +
		"A waiter's acquire attempt (every retry period) counts as its keep-alive: it refreshes its place in the queue, and tries the lock once; " +
		"the leader's GET of its key (after each announcement of its change: every renewal is one) counts as other"
}

// redisScripts names leaderrun's scripts by their numbers of keys and
// arguments (backends/redis/scripts.go).
var redisScripts = map[[2]int]string{{5, 7}: "acquire", {1, 2}: "renew", {5, 5}: "release", {5, 2}: "withdraw",
	{2, 3}: "complete", {2, 0}: "status"}

// redisInspector reads one connection: the client's commands, and, once
// it subscribed, the messages the server pushes.
type redisInspector struct {
	up         []byte
	down       []byte
	subscribed bool
}

func newRedisInspector() inspector { return &redisInspector{} }

func (r *redisInspector) client(data []byte, at time.Duration, p *tcpProxy) {
	r.up = append(r.up, data...)
	for {
		args, rest, ok := readCommand(r.up)
		if !ok {
			break
		}
		r.up = rest
		if len(args) == 0 {
			continue
		}
		k := redisKey(args)
		if k.name == "SUBSCRIBE" {
			r.subscribed = true
		}
		p.record(request{start: at, end: at, key: k})
	}
	if len(r.up) > 1<<20 {
		r.up = nil // not RESP: stop reading
	}
}

// server counts the pub/sub messages pushed to a subscribed connection.
func (r *redisInspector) server(data []byte, at time.Duration, p *tcpProxy) {
	if !r.subscribed {
		return
	}
	const msg = "$7\r\nmessage\r\n"
	r.down = append(r.down, data...)
	for {
		i := bytes.Index(r.down, []byte(msg))
		if i < 0 {
			break
		}
		p.event(at)
		r.down = r.down[i+len(msg):]
	}
	if len(r.down) > len(msg) {
		r.down = r.down[len(r.down)-len(msg):]
	}
}

// redisKey names a command and classes it.
func redisKey(args []string) reqKey {
	name := strings.ToUpper(args[0])
	k := reqKey{name: name, class: classOther}
	switch name {
	case "EVALSHA", "EVAL":
		if len(args) >= 3 {
			nkeys, _ := strconv.Atoi(args[2])
			script, ok := redisScripts[[2]int{nkeys, len(args) - 3 - nkeys}]
			if !ok {
				script = "script"
			}
			k.name += " " + script
			switch script {
			case "acquire":
				// ARGV: nonce, identity, ttl, mode, alive, wake prefix, holders
				if mode := args[len(args)-4]; mode == "wait" {
					k.name += " (wait)"
					k.class = classKeepalive
				}
			case "renew":
				k.class = classKeepalive
			}
		}
	case "SUBSCRIBE":
		k.class = classBlocking
	case "PING", "WAIT":
		k.class = classKeepalive
	}
	return k
}

// readCommand reads one command, an array of bulk strings, from the
// start of b; ok is false until it is complete.
func readCommand(b []byte) (args []string, rest []byte, ok bool) {
	line := func() (string, bool) {
		i := bytes.Index(b, []byte("\r\n"))
		if i < 0 {
			return "", false
		}
		s := string(b[:i])
		b = b[i+2:]
		return s, true
	}
	h, ok := line()
	if !ok || !strings.HasPrefix(h, "*") {
		return nil, nil, false
	}
	n, err := strconv.Atoi(h[1:])
	if err != nil || n < 0 || n > 1<<16 {
		return nil, nil, false
	}
	for range n {
		h, ok := line()
		if !ok || !strings.HasPrefix(h, "$") {
			return nil, nil, false
		}
		l, err := strconv.Atoi(h[1:])
		if err != nil || l < 0 || len(b) < l+2 {
			return nil, nil, false
		}
		args = append(args, string(b[:l]))
		b = b[l+2:]
	}
	return args, b, true
}

// TestRedisInspector: the commands of a leader and a waiter, fed byte by
// byte, are named and classed; a message pushed to a subscribed
// connection is a wake-up, the subscription's confirmation is not.
func TestRedisInspector(t *testing.T) {
	cmd := func(args ...string) string {
		s := fmt.Sprintf("*%d\r\n", len(args))
		for _, a := range args {
			s += fmt.Sprintf("$%d\r\n%s\r\n", len(a), a)
		}
		return s
	}
	keys := []string{"leaderrun/x", "leaderrun/x:token", "leaderrun/:waiters:x", "leaderrun/:alive:x", "leaderrun/x:history"}
	acquire := func(mode string) string {
		return cmd(append(append([]string{"EVALSHA", "sha", "5"}, keys...), "nonce", "id", "5000", mode, "1500", "leaderrun/x:wake:", "1")...)
	}
	up := cmd("HELLO", "2", "AUTH", "default", "pw", "SETNAME", "leaderrun") + acquire("wait") + acquire("try") +
		cmd("EVALSHA", "sha", "1", "leaderrun/x", "value", "5000") + cmd("GET", "leaderrun/x") + cmd("SUBSCRIBE", "leaderrun/x:wake:nonce") +
		cmd("PING")
	down := "*3\r\n$9\r\nsubscribe\r\n$21\r\nleaderrun/x:wake:nonce\r\n:1\r\n" + "*3\r\n$7\r\nmessage\r\n$21\r\nleaderrun/x:wake:nonce\r\n$4\r\nfree\r\n"
	p := &tcpProxy{}
	ins := newRedisInspector()
	for i := range len(up) {
		ins.client([]byte(up[i:i+1]), time.Duration(i), p)
	}
	for i := range len(down) {
		ins.server([]byte(down[i:i+1]), time.Duration(i), p)
	}
	var got []reqKey
	for _, r := range p.reqs {
		got = append(got, r.key)
	}
	want := []reqKey{{"HELLO", classOther}, {"EVALSHA acquire (wait)", classKeepalive}, {"EVALSHA acquire", classOther},
		{"EVALSHA renew", classKeepalive}, {"GET", classOther}, {"SUBSCRIBE", classBlocking}, {"PING", classKeepalive}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("requests %+v, want %+v", got, want)
	}
	if len(p.events) != 1 {
		t.Errorf("%d wake-ups, want 1", len(p.events))
	}
}
