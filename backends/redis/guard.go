package redis

import (
	"errors"
	"fmt"
	"net"
	"syscall"
)

// Bounds on what the store accepts from a server. go-redis allocates
// what a reply's header announces before it reads the body (a bulk
// string's length, an array's element count), so a hostile or broken
// server could make it allocate gigabytes with a few bytes. The guard
// refuses such a reply before go-redis sees it. The largest legitimate
// reply is a document (128 KiB) or an INFO section: far below these.
const (
	maxBulk  = 1 << 20  // one bulk string
	maxReply = 8 << 20  // one reply: its strings at their announced length, elements at elemCost
	maxLine  = 64 << 10 // a header, or a simple string or error line
	maxDepth = 8        // how deep aggregates nest
	elemCost = 16       // what go-redis allocates for an array element (an interface) before reading it
)

// errHostileReply is the guard's error: the connection is then closed.
var errHostileReply = errors.New("redis: the server sent a reply beyond what leaderrun accepts")

// guardedConn passes a connection's bytes through unchanged while it
// follows the framing of what the server sends (RESP2, and RESP3, which
// go-redis speaks to Sentinels), and fails the read that would carry a
// reply over the bounds above, or anything that is not RESP.
type guardedConn struct {
	net.Conn
	scan respScanner
}

// guardedSysConn is a guardedConn over a plain socket: go-redis checks
// an idle pooled connection's health through its file descriptor (a
// peek, which the guard never sees), so that a connection the server
// closed while idle is not used.
type guardedSysConn struct {
	*guardedConn
	sys syscall.Conn
}

func (c *guardedSysConn) SyscallConn() (syscall.RawConn, error) { return c.sys.SyscallConn() }

func guard(conn net.Conn) net.Conn {
	g := &guardedConn{Conn: conn}
	if sc, ok := conn.(syscall.Conn); ok {
		return &guardedSysConn{guardedConn: g, sys: sc}
	}
	return g
}

func (c *guardedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		if serr := c.scan.feed(p[:n]); serr != nil {
			// The connection is useless from here on: whatever go-redis
			// does next with it must fail too.
			c.Conn.Close()
			return 0, serr
		}
	}
	return n, err
}

// respScanner follows the framing of a stream of RESP replies: it reads
// each header line, skips the bodies of length-prefixed strings, and
// counts the elements left in each enclosing aggregate. Streamed strings
// and aggregates (RESP3's "?" lengths), which Redis never sends, are
// refused.
type respScanner struct {
	line  []byte      // the header line read so far, without its type byte
	typ   byte        // type byte of the line being read; 0 between lines
	bulk  int64       // bytes of a string's body (and CRLF) still to skip
	stack []aggregate // the enclosing aggregates, innermost last
	cost  int64       // what the current top-level reply has announced so far
	bad   error       // sticky
}

// aggregate is an enclosing array, map, set, push or attribute.
type aggregate struct {
	left int  // elements still to come
	attr bool // an attribute: metadata before a value, not a value
}

func (s *respScanner) feed(p []byte) error {
	if s.bad != nil {
		return s.bad
	}
	for len(p) > 0 {
		if s.bulk > 0 {
			n := min(int64(len(p)), s.bulk)
			s.bulk -= n
			p = p[n:]
			if s.bulk == 0 {
				s.valueDone()
			}
			continue
		}
		c := p[0]
		p = p[1:]
		if s.typ == 0 {
			s.typ = c
			s.line = s.line[:0]
			continue
		}
		if c != '\n' {
			if len(s.line) >= maxLine {
				return s.fail("a line longer than %d bytes", maxLine)
			}
			s.line = append(s.line, c)
			continue
		}
		if n := len(s.line); n == 0 || s.line[n-1] != '\r' {
			return s.fail("a line not ended by CRLF")
		}
		if err := s.header(s.line[:len(s.line)-1]); err != nil {
			return err
		}
	}
	return nil
}

func (s *respScanner) header(body []byte) error {
	typ := s.typ
	s.typ = 0
	per := int64(1) // elements per announced entry
	switch typ {
	case '+', '-', ':', '_', ',', '#', '(':
		// Simple string, error, integer; RESP3's null, double, boolean,
		// big number: one line.
		s.valueDone()
		return nil
	case '$', '!', '=':
		// Bulk string; RESP3's blob error and verbatim string.
	case '*', '~', '>':
		// Array; RESP3's set and push.
	case '%', '|':
		// RESP3's map and attribute: a key and a value per entry.
		per = 2
	default:
		return s.fail("a reply of type %q, not RESP", typ)
	}
	n, ok := parseLen(body)
	switch {
	case !ok:
		return s.fail("a length %q", body)
	case n == -1:
		s.valueDone()
		return nil
	case typ == '$' || typ == '!' || typ == '=':
		if n > maxBulk {
			return s.fail("a string of %d bytes (at most %d)", n, maxBulk)
		}
		if err := s.charge(n, 1); err != nil {
			return err
		}
		s.bulk = n + 2
		return nil
	}
	if err := s.charge(n, per*elemCost); err != nil {
		return err
	}
	n *= per
	if n == 0 {
		if typ != '|' {
			s.valueDone()
		}
		return nil
	}
	if len(s.stack) >= maxDepth {
		return s.fail("aggregates nested deeper than %d", maxDepth)
	}
	s.stack = append(s.stack, aggregate{left: int(n), attr: typ == '|'})
	return nil
}

// charge adds n items of size bytes each to what the current reply
// announced. n comes from the wire (up to 18 digits), so it is checked
// before it is multiplied: the product of a huge count would wrap around
// to a negative cost, which no bound ever trips.
func (s *respScanner) charge(n, size int64) error {
	if n > (maxReply-s.cost)/size {
		return s.fail("a reply of more than %d bytes", maxReply)
	}
	s.cost += n * size
	return nil
}

// valueDone counts one complete value against the enclosing aggregates;
// a complete top-level value ends the reply. A complete attribute is no
// value: the value it describes follows.
func (s *respScanner) valueDone() {
	for len(s.stack) > 0 {
		top := len(s.stack) - 1
		s.stack[top].left--
		if s.stack[top].left > 0 {
			return
		}
		attr := s.stack[top].attr
		s.stack = s.stack[:top]
		if attr {
			return
		}
	}
	s.cost = 0
}

func (s *respScanner) fail(format string, args ...any) error {
	s.bad = fmt.Errorf("%w: %s", errHostileReply, fmt.Sprintf(format, args...))
	return s.bad
}

// parseLen reads a RESP length: -1, or a decimal of at most 18 digits
// (no sign, no leading zeros beyond a lone 0).
func parseLen(b []byte) (int64, bool) {
	if len(b) == 2 && b[0] == '-' && b[1] == '1' {
		return -1, true
	}
	if len(b) == 0 || len(b) > 18 || len(b) > 1 && b[0] == '0' {
		return 0, false
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}
