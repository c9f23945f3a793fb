package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leaderrun/leaderrun/backends"
)

const (
	// probeTimeout is how long the listener waits for its own pg_notify
	// before it concludes that notifications do not reach it (a pooler in
	// transaction mode delivers them to nobody, or to another client).
	probeTimeout = 2 * time.Second
	// listenPing is how often an idle listening connection is pinged, so
	// that one that died silently (a stalled link) is replaced; until
	// then, waiters still wake at the holder's expiry and leases rely on
	// renewals.
	listenPing = 30 * time.Second
	// pingTimeout bounds that ping.
	pingTimeout = 5 * time.Second
)

// errNoDelivery: LISTEN was accepted but our own notification never came.
var errNoDelivery = errors.New("a notification sent with pg_notify did not arrive on the listening connection " +
	"(a pooler in transaction mode?)")

// listener is a Backend's dedicated connection, shared with its slot
// backends, that LISTENs on the table's channel and calls the subscribers
// when a notification names their row, when the table is truncated, and
// whenever it starts or stops listening (so that a lease checks its row,
// and a waiter recomputes its sleep). It reconnects with backoff, except
// after errNoDelivery: the connection path cannot deliver, and the
// backend polls from then on.
type listener struct {
	b      *Backend // the root backend (see shared)
	cancel context.CancelFunc
	done   chan struct{}

	mu        sync.Mutex
	subs      map[int]subscriber
	next      int
	listening bool
	mode      string // as last logged: "notify" or "poll"
	probe     chan struct{}
	probeID   string
}

// subscriber is a poke for the row named key.
type subscriber struct {
	key  string
	poke func()
}

// subscribe calls poke whenever b's row may have changed, until the
// returned function is called. It starts the listener on first use, if the
// triggers are installed.
func (b *Backend) subscribe(poke func()) (unsubscribe func()) {
	l := b.startListener()
	if l == nil {
		return func() {}
	}
	l.mu.Lock()
	id := l.next
	l.next++
	l.subs[id] = subscriber{key: b.key, poke: poke}
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		delete(l.subs, id)
		l.mu.Unlock()
	}
}

// notifying reports whether notifications currently arrive.
func (b *Backend) notifying() bool {
	b.mu.Lock()
	l := b.listener
	b.mu.Unlock()
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.listening
}

// startListener starts the listener on first use and returns it; nil when
// the triggers are not installed (the backend polls, which it logs once).
func (b *shared) startListener() *listener {
	b.schemaMu.Lock()
	notify := b.notify
	b.schemaMu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.listener != nil || b.closed {
		return b.listener
	}
	if !notify {
		if !b.pollLogged {
			b.pollLogged = true
			b.logBase.Info("postgres: polling: the notification triggers are not installed on the table",
				"mode", "poll", "table", b.sql.ids.tableName, "poll_interval", b.poll)
		}
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &listener{b: b.root, cancel: cancel, done: make(chan struct{}), subs: map[int]subscriber{}}
	b.listener = l
	go l.run(ctx)
	return l
}

func (l *listener) close() {
	l.cancel()
	<-l.done
}

// pokeAll calls every subscriber.
func (l *listener) pokeAll() { l.pokeKey("") }

// pokeKey calls the subscribers of the row named key, or every
// subscriber if key is "".
func (l *listener) pokeKey(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.subs {
		if key == "" || s.key == key {
			s.poke()
		}
	}
}

func (l *listener) setListening(on bool) {
	l.mu.Lock()
	changed := l.listening != on
	l.listening = on
	l.mu.Unlock()
	if changed {
		l.pokeAll()
	}
}

// logMode logs which mode the backend is in when that changes: at the
// first attempt to listen, when an outage of the listening connection
// begins, and when it ends. Failures to reconnect during an outage are
// logged at debug level.
func (l *listener) logMode(notify bool, err error) {
	mode := "poll"
	if notify {
		mode = "notify"
	}
	l.mu.Lock()
	changed := l.mode != mode
	l.mode = mode
	l.mu.Unlock()
	b := l.b
	switch {
	case !changed:
		b.log.Debug("postgres: the listening connection failed again; reconnecting", "err", b.redact(err))
	case notify:
		b.log.Info("postgres: listening for notifications: a loss or a release is seen at once",
			"mode", mode, "channel", b.sql.ids.channel)
	case errors.Is(err, errNoDelivery):
		b.log.Info("postgres: polling: notifications do not arrive; a loss is seen at the next renewal",
			"mode", mode, "poll_interval", b.poll, "err", err)
	default:
		b.log.Info("postgres: polling until the listening connection is back; a loss is seen at the next renewal",
			"mode", mode, "poll_interval", b.poll, "err", b.redact(err))
	}
}

func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	var retry backends.Backoff
	for {
		err := l.listen(ctx, &retry)
		l.setListening(false)
		if ctx.Err() != nil {
			return
		}
		l.logMode(false, err)
		if errors.Is(err, errNoDelivery) {
			return
		}
		if retry.Sleep(ctx) != nil {
			return
		}
	}
}

// listen connects, LISTENs, makes sure that notifications arrive, and then
// waits for them until the connection fails or ctx ends.
func (l *listener) listen(ctx context.Context, retry *backends.Backoff) error {
	b := l.b
	cctx, cancel := context.WithTimeout(ctx, requestTimeout)
	lc, err := connect(cctx, b.connCfg, l.handle)
	cancel()
	if err != nil {
		return err
	}
	defer lc.close()
	channel := quoteIdent(b.sql.ids.channel)
	cctx, cancel = context.WithTimeout(ctx, requestTimeout)
	_, err = lc.exec(cctx, "LISTEN "+channel, 0)
	cancel()
	if err != nil {
		return err
	}
	if err := l.probeDelivery(ctx, lc); err != nil {
		if errors.Is(err, errNoDelivery) {
			// Through a pooler, that LISTEN may linger on some server
			// connection; take it back where we can.
			cctx, cancel := context.WithTimeout(ctx, withdrawTimeout)
			_, _ = lc.exec(cctx, "UNLISTEN "+channel, 0)
			cancel()
		}
		return err
	}
	retry.Reset()
	l.logMode(true, nil)
	// Anything that happened before LISTEN took effect was missed:
	// setListening pokes every subscriber, to look again.
	l.setListening(true)
	for {
		wctx, cancel := context.WithTimeout(ctx, listenPing)
		err := lc.waitForNotification(wctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, context.DeadlineExceeded) && !lc.pg.IsClosed():
			pctx, cancel := context.WithTimeout(ctx, pingTimeout)
			err = lc.ping(pctx)
			cancel()
			if err != nil {
				return err
			}
		case err != nil:
			return err
		}
	}
}

// probeDelivery sends a notification from a pooled connection and waits
// for it to arrive on lc.
func (l *listener) probeDelivery(ctx context.Context, lc *conn) error {
	id := randomID()
	arrived := make(chan struct{})
	l.mu.Lock()
	l.probe, l.probeID = arrived, id
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.probe, l.probeID = nil, ""
		l.mu.Unlock()
	}()
	payload, _ := json.Marshal(note{Op: "probe", ID: id})
	pctx, cancel := context.WithTimeout(ctx, requestTimeout)
	err := l.b.do(pctx, func(c *conn) error {
		return c.query(pctx, "SELECT pg_notify($1, $2)", []any{l.b.sql.ids.channel, string(payload)}, 1, func([][]byte) error { return nil })
	})
	cancel()
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	for {
		select {
		case <-arrived:
			return nil
		default:
		}
		err := lc.waitForNotification(wctx)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case wctx.Err() != nil:
			select {
			case <-arrived:
				return nil
			default:
				return errNoDelivery
			}
		case err != nil:
			return err
		}
	}
}

// note is a notification's payload, as the trigger function writes it.
type note struct {
	Op   string `json:"op"` // update, delete, truncate; probe from the listener itself
	Name string `json:"name,omitempty"`
	ID   string `json:"id,omitempty"` // of a probe
}

// handle is called by pgconn, on the listening connection's goroutine, for
// each notification.
func (l *listener) handle(n *pgconn.Notification) {
	var p note
	if json.Unmarshal([]byte(n.Payload), &p) != nil {
		return
	}
	switch {
	case p.Op == "probe":
		l.mu.Lock()
		if l.probe != nil && p.ID == l.probeID {
			close(l.probe)
			l.probe = nil
		}
		l.mu.Unlock()
	case p.Op == "truncate":
		l.pokeAll()
	case p.Name != "":
		l.pokeKey(p.Name)
	}
}
