// Package pgwire is the PostgreSQL client of the postgres backend: the
// frontend/backend protocol version 3.0 as far as a lease needs it, over
// TCP or a unix socket, with TLS, and password, md5 and SCRAM-SHA-256
// authentication. The connection is configured as libpq configures psql's:
// a URL or keyword/value string, then the PG* variables, then defaults,
// and a missing password from the password file.
//
// It replaces a general-purpose driver whose type system and pool cost
// every leaderrun, whatever its store, 4.5 MB of binary and 1.7 MiB of
// resident memory (docs/performance.md). What it leaves out: GSSAPI and
// SSPI authentication, SCRAM channel binding (SCRAM-SHA-256-PLUS),
// SASLprep of non-ASCII passwords (they are used as given), encrypted
// client keys, the connection service file, and binary formats: every
// parameter and every result is text.
package pgwire

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Host is one server to try: a host name or address and a port, or a
// directory (starting with /) holding the server's unix socket.
type Host struct {
	Host string
	Port uint16
	// Addr, when set (libpq's hostaddr beside host), is the address
	// dialled; Host is then only the name the certificate is checked
	// against and the password file matched with.
	Addr string
}

// Network and address to dial.
func (h Host) dial() (network, address string) {
	if h.isSocket() {
		return "unix", filepath.Join(h.Host, ".s.PGSQL."+strconv.Itoa(int(h.Port)))
	}
	if h.Addr != "" {
		return "tcp", net.JoinHostPort(h.Addr, strconv.Itoa(int(h.Port)))
	}
	return "tcp", net.JoinHostPort(h.Host, strconv.Itoa(int(h.Port)))
}

func (h Host) isSocket() bool { return strings.HasPrefix(h.Host, "/") }

// String is host:port, or the socket's path: what messages name.
func (h Host) String() string {
	if h.isSocket() {
		_, addr := h.dial()
		return addr
	}
	return net.JoinHostPort(h.Host, strconv.Itoa(int(h.Port)))
}

// Config is a parsed connection string.
type Config struct {
	Hosts []Host // tried in order
	User  string
	// Password is the one given by the string or PGPASSWORD; when it is
	// empty, PassFile's line for each host is used as that host is tried.
	Password string
	PassFile string
	Database string
	// Params are sent in the startup message (application_name, options).
	Params map[string]string

	SSLMode     string // disable, allow, prefer, require, verify-ca, verify-full
	SSLRootCert string
	SSLCert     string
	SSLKey      string
	// TLSMin and TLSMax bound the TLS version (ssl_min_protocol_version,
	// ssl_max_protocol_version): crypto/tls's VersionTLS12 and so on, 0 for
	// no maximum.
	TLSMin, TLSMax uint16

	// ConnectTimeout bounds each host's attempt; zero: none but the
	// caller's context.
	ConnectTimeout time.Duration
	// TargetSessionAttrs is any or read-write (libpq's also know
	// read-only, primary, standby and prefer-standby).
	TargetSessionAttrs string

	// Extra holds keywords that are not libpq's, for the caller to take
	// (the postgres backend's pool_max_conns). Any it leaves is an error
	// of its own to report.
	Extra map[string]string
}

// keywords are libpq's that this package reads; ignored are libpq's that
// it accepts and has nothing to do with (they tune what it does not do).
var (
	keywords = map[string]bool{
		"host": true, "hostaddr": true, "port": true, "user": true, "password": true, "dbname": true,
		"sslmode": true, "sslrootcert": true, "sslcert": true, "sslkey": true, "connect_timeout": true,
		"application_name": true, "fallback_application_name": true, "options": true,
		"target_session_attrs": true, "passfile": true, "client_encoding": true,
		"ssl_min_protocol_version": true, "ssl_max_protocol_version": true,
	}
	ignored = map[string]bool{
		"keepalives": true, "keepalives_idle": true, "keepalives_interval": true, "keepalives_count": true,
		"tcp_user_timeout": true, "sslcompression": true, "sslsni": true,
		"krbsrvname": true, "gsslib": true, "gssdelegation": true, "load_balance_hosts": true,
	}
	// unsupported are libpq's keywords that ask for a check this client
	// does not make: refused rather than ignored, since ignoring them
	// would accept what the user meant to reject.
	unsupported = map[string]string{
		"sslcrl": "certificate revocation lists", "sslcrldir": "certificate revocation lists",
		"requirepeer": "checking the server's user on a unix socket", "require_auth": "restricting the authentication method",
		"sslpassword": "encrypted client keys", "sslcertmode": "sslcertmode",
	}
	// env is libpq's variable for each keyword.
	env = map[string]string{
		"host": "PGHOST", "hostaddr": "PGHOSTADDR", "port": "PGPORT", "user": "PGUSER", "password": "PGPASSWORD",
		"dbname": "PGDATABASE", "sslmode": "PGSSLMODE", "sslrootcert": "PGSSLROOTCERT", "sslcert": "PGSSLCERT",
		"sslkey": "PGSSLKEY", "connect_timeout": "PGCONNECT_TIMEOUT", "application_name": "PGAPPNAME",
		"options": "PGOPTIONS", "target_session_attrs": "PGTARGETSESSIONATTRS", "passfile": "PGPASSFILE",
		"client_encoding": "PGCLIENTENCODING", "gssencmode": "PGGSSENCMODE", "channel_binding": "PGCHANNELBINDING",
		"ssl_min_protocol_version": "PGSSLMINPROTOCOLVERSION", "ssl_max_protocol_version": "PGSSLMAXPROTOCOLVERSION",
	}
	// unsupportedEnv are the variables of unsupported keywords.
	unsupportedEnv = map[string]string{"PGSSLCRL": "sslcrl", "PGSSLCRLDIR": "sslcrldir", "PGREQUIREPEER": "requirepeer",
		"PGREQUIREAUTH": "require_auth", "PGSSLCERTMODE": "sslcertmode"}
)

// ParseError is a connection string that cannot be used. Its message never
// shows the password.
type ParseError struct{ msg string }

func (e *ParseError) Error() string { return e.msg }

func parseErrorf(format string, args ...any) error {
	return &ParseError{msg: fmt.Sprintf(format, args...)}
}

// ParseConfig parses s (a postgres:// or postgresql:// URL, or keyword=value
// pairs, or empty) as libpq does, completing it from getenv (os.Getenv
// when nil) and the password file.
func ParseConfig(s string, getenv func(string) string) (*Config, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	settings := map[string]string{}
	var err error
	if strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://") {
		err = parseURL(s, settings)
	} else {
		err = parseKeywords(s, settings)
	}
	if err != nil {
		return nil, err
	}
	extra := map[string]string{}
	for k, v := range settings {
		switch {
		case k == "service":
			return nil, parseErrorf("the connection service file (service=%s) is not supported: give the connection string or the PG* variables", v)
		case k == "gssencmode" || k == "channel_binding":
			if v == "require" {
				return nil, parseErrorf("%s=require is not supported (no GSSAPI, no SCRAM channel binding)", k)
			}
			delete(settings, k)
		case ignored[k]:
			delete(settings, k)
		case unsupported[k] != "":
			if v != "" {
				return nil, parseErrorf("%s is not supported (%s)", k, unsupported[k])
			}
			delete(settings, k)
		case !keywords[k]:
			extra[k] = v
			delete(settings, k)
		}
	}
	for k, name := range env {
		if _, ok := settings[k]; !ok && keywords[k] {
			if v := getenv(name); v != "" {
				settings[k] = v
			}
		}
	}
	for name, k := range unsupportedEnv {
		if getenv(name) != "" {
			return nil, parseErrorf("%s is set, and %s is not supported (%s)", name, k, unsupported[k])
		}
	}
	if v := getenv("PGSERVICE"); v != "" {
		return nil, parseErrorf("PGSERVICE=%s: the connection service file is not supported", v)
	}
	if v := getenv("PGGSSENCMODE"); v == "require" {
		return nil, parseErrorf("PGGSSENCMODE=require is not supported (no GSSAPI)")
	}
	if v := getenv("PGCHANNELBINDING"); v == "require" {
		return nil, parseErrorf("PGCHANNELBINDING=require is not supported (no SCRAM channel binding)")
	}

	c := &Config{Params: map[string]string{}, Extra: extra}
	c.User = settings["user"]
	if c.User == "" {
		if u, err := user.Current(); err == nil {
			c.User = u.Username
		}
	}
	c.Password = settings["password"]
	c.Database = settings["dbname"]
	if c.Database == "" {
		c.Database = c.User
	}
	if err := c.hosts(settings); err != nil {
		return nil, err
	}
	c.SSLRootCert, c.SSLCert, c.SSLKey = settings["sslrootcert"], settings["sslcert"], settings["sslkey"]
	c.SSLMode = settings["sslmode"]
	switch c.SSLMode {
	case "":
		c.SSLMode = "prefer"
		if c.SSLRootCert == "system" {
			c.SSLMode = "verify-full" // as libpq: the system's roots vouch for any name
		}
	case "disable", "allow", "prefer", "require", "verify-ca", "verify-full":
		if c.SSLRootCert == "system" && c.SSLMode != "verify-full" {
			return nil, parseErrorf("sslmode %s is too weak for sslrootcert=system: use verify-full", c.SSLMode)
		}
	default:
		return nil, parseErrorf("sslmode %q: want disable, allow, prefer, require, verify-ca or verify-full", c.SSLMode)
	}
	for _, v := range []struct {
		key string
		dst *uint16
		def uint16
	}{{"ssl_min_protocol_version", &c.TLSMin, tls.VersionTLS12}, {"ssl_max_protocol_version", &c.TLSMax, 0}} {
		switch settings[v.key] {
		case "":
			*v.dst = v.def
		case "TLSv1":
			*v.dst = tls.VersionTLS10
		case "TLSv1.1":
			*v.dst = tls.VersionTLS11
		case "TLSv1.2":
			*v.dst = tls.VersionTLS12
		case "TLSv1.3":
			*v.dst = tls.VersionTLS13
		default:
			return nil, parseErrorf("%s %q: want TLSv1, TLSv1.1, TLSv1.2 or TLSv1.3", v.key, settings[v.key])
		}
	}
	if v := settings["connect_timeout"]; v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return nil, parseErrorf("connect_timeout %q: want a number of seconds", v)
		}
		if n > 0 {
			c.ConnectTimeout = time.Duration(max(n, 2)) * time.Second // libpq's minimum
		}
	}
	c.TargetSessionAttrs = settings["target_session_attrs"]
	switch c.TargetSessionAttrs {
	case "":
		c.TargetSessionAttrs = "any"
	case "any", "read-write":
	default:
		return nil, parseErrorf("target_session_attrs %q: want any or read-write", c.TargetSessionAttrs)
	}
	for _, k := range []string{"application_name", "options", "client_encoding"} {
		if v := settings[k]; v != "" {
			c.Params[k] = v
		}
	}
	if v := settings["fallback_application_name"]; v != "" && c.Params["application_name"] == "" {
		c.Params["application_name"] = v
	}
	if enc, ok := c.Params["client_encoding"]; ok && !strings.EqualFold(strings.ReplaceAll(enc, "-", ""), "UTF8") {
		return nil, parseErrorf("client_encoding %q: only UTF8 is supported", enc)
	}
	c.Params["client_encoding"] = "UTF8"
	if c.Password == "" {
		c.PassFile = settings["passfile"]
		if c.PassFile == "" {
			if home, err := os.UserHomeDir(); err == nil {
				c.PassFile = filepath.Join(home, ".pgpass")
			}
		}
	}
	return c, nil
}

// PasswordFor is the password to give host h: the one given, else h's
// line in the password file, else "".
func (c *Config) PasswordFor(h Host) string {
	if c.Password != "" || c.PassFile == "" {
		return c.Password
	}
	return passwordFromFile(c.PassFile, h, c.Database, c.User)
}

// hosts fills c.Hosts from the comma-separated host (or hostaddr) and port
// lists: one port for all hosts, or one each.
func (c *Config) hosts(settings map[string]string) error {
	hosts, addrs := settings["host"], settings["hostaddr"]
	var addrList []string
	switch {
	case hosts == "" && addrs != "":
		hosts = addrs
	case addrs != "":
		addrList = strings.Split(addrs, ",")
	case hosts == "":
		hosts = defaultHost()
	}
	hostList := strings.Split(hosts, ",")
	if addrList != nil && len(addrList) != len(hostList) {
		return parseErrorf("%d addresses (hostaddr) for %d hosts: give one for each host", len(addrList), len(hostList))
	}
	var ports []uint16
	for i, p := range strings.Split(settings["port"], ",") {
		if p == "" {
			ports = append(ports, 5432)
			continue
		}
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			// Not quoted: a URL whose password holds an unescaped / or ?
			// is cut there, and the password may land here.
			return parseErrorf("port %d of the list is not a number from 1 to 65535", i+1)
		}
		ports = append(ports, uint16(n))
	}
	if len(ports) != 1 && len(ports) != len(hostList) {
		return parseErrorf("%d ports for %d hosts: give one port, or one for each host", len(ports), len(hostList))
	}
	for i, h := range hostList {
		if h == "" {
			h = defaultHost()
		}
		port := ports[0]
		if len(ports) > 1 {
			port = ports[i]
		}
		host := Host{Host: h, Port: port}
		if addrList != nil {
			host.Addr = addrList[i]
		}
		c.Hosts = append(c.Hosts, host)
	}
	return nil
}

// socketDirs are where libpq looks for the server's socket by default,
// as Debian's, macOS's and upstream's builds do.
var socketDirs = []string{"/var/run/postgresql", "/private/tmp", "/tmp"}

// defaultHost is libpq's: the unix socket directory where the server's
// packages put it, else localhost.
func defaultHost() string {
	for _, dir := range socketDirs {
		if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
			return dir
		}
	}
	return "localhost"
}

// parseURL reads postgres://user:password@host:port,host:port/dbname?k=v.
func parseURL(s string, settings map[string]string) error {
	// url.Parse refuses several hosts: take the authority apart by hand.
	rest := s[strings.Index(s, "://")+3:]
	authority, path := rest, ""
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		authority, path = rest[:i], rest[i:]
	}
	if i := strings.LastIndex(authority, "@"); i >= 0 {
		userinfo := authority[:i]
		authority = authority[i+1:]
		name, password, hasPassword := strings.Cut(userinfo, ":")
		var err error
		if settings["user"], err = url.PathUnescape(name); err != nil {
			return parseErrorf("connection URL: the user name is not well escaped")
		}
		if hasPassword {
			if settings["password"], err = url.PathUnescape(password); err != nil {
				return parseErrorf("connection URL: the password is not well escaped")
			}
		}
	}
	var hosts, ports []string
	for _, hp := range strings.Split(authority, ",") {
		if hp == "" {
			continue
		}
		host, port := hp, ""
		if strings.HasPrefix(hp, "[") { // [::1]:5432
			end := strings.Index(hp, "]")
			if end < 0 {
				return parseErrorf("connection URL: host %q: unclosed [", hp)
			}
			host, port = hp[1:end], strings.TrimPrefix(hp[end+1:], ":")
		} else if i := strings.LastIndex(hp, ":"); i >= 0 {
			host, port = hp[:i], hp[i+1:]
		}
		h, err := url.PathUnescape(host)
		if err != nil {
			return parseErrorf("connection URL: host %q is not well escaped", host)
		}
		hosts, ports = append(hosts, h), append(ports, port)
	}
	if len(hosts) > 0 {
		settings["host"] = strings.Join(hosts, ",")
		if strings.Join(ports, "") != "" {
			settings["port"] = strings.Join(ports, ",")
		}
	}
	p, query, _ := strings.Cut(path, "?")
	if db := strings.TrimPrefix(p, "/"); db != "" {
		d, err := url.PathUnescape(db)
		if err != nil {
			return parseErrorf("connection URL: the database name is not well escaped")
		}
		settings["dbname"] = d
	}
	// As libpq: key=value pairs split on & and =, %XX unescaped, + kept
	// (url.ParseQuery would make it a space). No value is quoted in an
	// error: it may be the password.
	for i, pair := range strings.Split(query, "&") {
		if pair == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		key, kerr := url.PathUnescape(k)
		val, verr := url.PathUnescape(v)
		switch {
		case !ok || kerr != nil:
			return parseErrorf("connection URL: parameter %d of the query is not key=value", i+1)
		case verr != nil:
			return parseErrorf("connection URL: the value of %s is not well escaped", key)
		}
		settings[key] = val
	}
	return nil
}

// parseKeywords reads `host=h port=5432 password='it”s'`: values may be
// single-quoted, with \' and \\ escapes inside quotes and out.
func parseKeywords(s string, settings map[string]string) error {
	// Errors name the byte, not the word: a word may be a password.
	whole := len(s)
	for {
		s = strings.TrimLeft(s, " \t\n\r\f\v")
		if s == "" {
			return nil
		}
		eq := strings.IndexByte(s, '=')
		if eq < 0 {
			return parseErrorf("connection string: a word with no =value at byte %d", whole-len(s)+1)
		}
		key := strings.TrimSpace(s[:eq])
		if key == "" || strings.ContainsAny(key, " \t") {
			return parseErrorf("connection string: not keyword=value at byte %d", whole-len(s)+1)
		}
		s = strings.TrimLeft(s[eq+1:], " \t")
		var val strings.Builder
		if strings.HasPrefix(s, "'") {
			s = s[1:]
			closed := false
			for len(s) > 0 {
				ch := s[0]
				s = s[1:]
				if ch == '\\' && len(s) > 0 {
					val.WriteByte(s[0])
					s = s[1:]
					continue
				}
				if ch == '\'' {
					closed = true
					break
				}
				val.WriteByte(ch)
			}
			if !closed {
				return parseErrorf("connection string: the value of %s has no closing quote", key)
			}
		} else {
			for len(s) > 0 && !strings.ContainsRune(" \t\n\r\f\v", rune(s[0])) {
				if s[0] == '\\' && len(s) > 1 {
					s = s[1:]
				}
				val.WriteByte(s[0])
				s = s[1:]
			}
		}
		settings[key] = val.String()
	}
}

// passwordFromFile is the password of the first line of the password file
// (host:port:database:user:password, * matching anything, \ escaping : and
// \) that matches, "" if none does or the file cannot be used. libpq
// ignores a file that its group or others may read: so does this.
func passwordFromFile(path string, h Host, database, user string) string {
	fi, err := os.Stat(path)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o077 != 0 {
		return ""
	}
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	host := h.Host
	if h.isSocket() && slices.Contains(socketDirs, h.Host) {
		host = "localhost" // as libpq, for its default socket directory
	}
	want := []string{host, strconv.Itoa(int(h.Port)), database, user}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := splitPassLine(line)
		if len(fields) != 5 {
			continue
		}
		match := true
		for i, w := range want {
			if fields[i] != "*" && fields[i] != w && !(i == 0 && h.isSocket() && fields[i] == h.Host) {
				match = false
				break
			}
		}
		if match {
			return fields[4]
		}
	}
	return ""
}

func splitPassLine(line string) []string {
	var fields []string
	var cur strings.Builder
	for i := 0; i < len(line); i++ {
		switch c := line[i]; {
		case c == '\\' && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
		case c == ':' && len(fields) < 4:
			fields = append(fields, cur.String())
			cur.Reset()
		default:
			cur.WriteByte(c)
		}
	}
	return append(fields, cur.String())
}

var errNoHosts = errors.New("pgwire: no host to connect to")
