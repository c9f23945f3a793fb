package postgres

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/jackc/pgservicefile"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Where Debian's libpq looks when the settings name no host or no system
// service file: directories that only root and the postgres user may
// write. pgx would fall back to /tmp, where any user of the host can bind
// a socket and be sent a password.
const (
	defaultSocketDir  = "/var/run/postgresql"
	defaultSysconfDir = "/etc/postgresql-common"
)

// parseConnString parses a connection string with pgx's parser, which
// completes it from the PG* variables, a service file and the password
// file as libpq does. Where pgx differs from Debian's libpq, it does what
// libpq does (docs/backends/postgres.md, "The connection"): no host is
// defaultSocketDir, never /tmp; a service may be in the system's service
// file; the TLS versions are bounded; what pgx does not implement is
// refused, not sent to the server. Its errors never show the string.
func parseConnString(s string) (*pgxpool.Config, error) {
	extra, err := libpqDefaults(s)
	if err != nil {
		return nil, err
	}
	s = withSettings(s, extra)
	// pgconn's parser first: pgx's and its pool's take their own options,
	// which leaderrun refuses, without a word.
	cfg, err := pgconn.ParseConfig(s)
	if err != nil {
		return nil, parseError(err)
	}
	maxSet, err := takeRuntimeParams(cfg)
	if err == nil {
		err = tlsVersions(cfg)
	}
	if err != nil {
		return nil, err
	}
	pc, err := pgxpool.ParseConfig(s)
	if err != nil {
		return nil, parseError(err)
	}
	pc.ConnConfig.Config = *cfg
	if !maxSet {
		pc.MaxConns = maxPoolConns
	}
	connConfig(pc)
	return pc, nil
}

// parseError is pgx's parse error without the connection string it
// quotes (with passwords masked on a best-effort basis).
func parseError(err error) error {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return err
	}
	bare := *pe
	bare.ConnString = ""
	return errors.New(strings.TrimPrefix(bare.Error(), "cannot parse ``: "))
}

// libpqDefaults are the settings to add to s so that pgx connects where
// libpq would: the host list with its empty entries filled, and the
// system service file; nothing where pgx would do the same on its own.
func libpqDefaults(s string) (map[string]string, error) {
	keys, ok := connKeys(s)
	if !ok {
		// Malformed: pgx's message says how.
		if _, err := pgconn.ParseConfig(s); err != nil {
			return nil, parseError(err)
		}
		return nil, errors.New("the connection string cannot be read")
	}
	extra := map[string]string{}
	service, ok := keys["service"]
	if !ok {
		service = os.Getenv("PGSERVICE")
	}
	svc, system, err := findService(service, keys["servicefile"])
	if err != nil {
		return nil, err
	}
	if system != "" {
		extra["servicefile"] = system
	}
	hosts, named := keys["host"]
	if !named {
		hosts, named = svc["host"]
	}
	if !named {
		hosts = os.Getenv("PGHOST") // pgx ignores it when empty
	}
	if list := strings.Split(hosts, ","); slices.Contains(list, "") {
		for i := range list {
			list[i] = cmp.Or(list[i], defaultSocketDir)
		}
		extra["host"] = strings.Join(list, ",")
	}
	return extra, nil
}

// findService returns the settings of service (none if "") from the
// user's service file (as pgx finds it), else from the system's, whose
// path it then returns too, for pgx to read.
func findService(service, servicefile string) (settings map[string]string, system string, err error) {
	if service == "" {
		return nil, "", nil
	}
	user := cmp.Or(servicefile, os.Getenv("PGSERVICEFILE"))
	if home, herr := os.UserHomeDir(); user == "" && herr == nil {
		user = filepath.Join(home, ".pg_service.conf")
	}
	system = filepath.Join(cmp.Or(os.Getenv("PGSYSCONFDIR"), defaultSysconfDir), "pg_service.conf")
	for _, file := range []string{user, system} {
		if file == "" {
			continue
		}
		sf, err := pgservicefile.ReadServicefile(file)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, "", fmt.Errorf("service file %s: %w", file, err)
		}
		if s, err := sf.GetService(service); err == nil {
			if file == user {
				return s.Settings, "", nil
			}
			return s.Settings, system, nil
		}
	}
	return nil, "", fmt.Errorf("service %q is not defined in %s nor in %s", service, user, system)
}

// withSettings is s with extra appended, which override what s says.
func withSettings(s string, extra map[string]string) string {
	for _, k := range slices.Sorted(maps.Keys(extra)) {
		v := extra[k]
		if !isURL(s) {
			s += " " + k + "='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
			continue
		}
		switch {
		case !strings.Contains(s, "?"):
			s += "?"
		case !strings.HasSuffix(s, "?") && !strings.HasSuffix(s, "&"):
			s += "&"
		}
		s += k + "=" + uriEscape(v)
	}
	return s
}

func isURL(s string) bool {
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://")
}

// uriEscape percent-encodes every byte of v but the unreserved ones (a +
// too: pgx decodes a query as libpq does, where it stays a +).
func uriEscape(v string) string {
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		c := v[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-._~/,", c) >= 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// connKeys returns the settings of s, read as pgx reads them (pgx has no
// exported parser); false if s is malformed (pgx then says how).
func connKeys(s string) (map[string]string, bool) {
	if isURL(s) {
		return urlKeys(s)
	}
	return keywordKeys(s)
}

const spaces = " \t\n\r\v\f"

// keywordKeys reads `host=h port=5432 password='it\'s'`: values may be
// single-quoted; a backslash takes the next byte as it is, in quotes and
// out, and ends an unquoted value when it is the last byte.
func keywordKeys(s string) (map[string]string, bool) {
	keys := map[string]string{}
	for s = strings.TrimLeft(s, spaces); s != ""; s = strings.TrimLeft(s, spaces) {
		key, rest, found := strings.Cut(s, "=")
		key = strings.Trim(key, spaces)
		if !found || key == "" || strings.ContainsAny(key, spaces) {
			return nil, false
		}
		s = strings.TrimLeft(rest, spaces)
		quoted := strings.HasPrefix(s, "'")
		if quoted {
			s = s[1:]
		}
		var val strings.Builder
		for len(s) > 0 && !(quoted && s[0] == '\'') && !(!quoted && strings.IndexByte(spaces, s[0]) >= 0) {
			if s[0] == '\\' {
				if s = s[1:]; s == "" {
					break
				}
			}
			val.WriteByte(s[0])
			s = s[1:]
		}
		if quoted {
			if s == "" {
				return nil, false // unterminated
			}
			s = s[1:]
		}
		keys[key] = val.String()
	}
	return keys, true
}

// urlKeys reads postgres://user:password@host:port,[::1]:port/db?k=v: the
// hosts of the authority, then the query's parameters, which win.
func urlKeys(s string) (map[string]string, bool) {
	keys := map[string]string{}
	p := s[strings.Index(s, "://")+3:]
	if i := strings.IndexAny(p, "@/"); i >= 0 && p[i] == '@' {
		p = p[i+1:]
	}
	var hosts []string
	for {
		host := ""
		if strings.HasPrefix(p, "[") {
			end := strings.IndexByte(p, ']')
			if end < 0 {
				return nil, false
			}
			host, p = p[1:end], p[end+1:]
		} else {
			end := strings.IndexAny(p, ":/?,")
			if end < 0 {
				end = len(p)
			}
			host, p = p[:end], p[end:]
		}
		hosts = append(hosts, host)
		if strings.HasPrefix(p, ":") { // the port
			end := strings.IndexAny(p, "/?,")
			if end < 0 {
				end = len(p)
			}
			p = p[end:]
		}
		if !strings.HasPrefix(p, ",") {
			break
		}
		p = p[1:]
	}
	if h := strings.Join(hosts, ","); h != "" {
		var err error
		if keys["host"], err = url.PathUnescape(h); err != nil {
			return nil, false
		}
	}
	_, query, _ := strings.Cut(p, "?")
	for _, pair := range strings.Split(query, "&") {
		k, v, found := strings.Cut(pair, "=")
		key, kerr := url.PathUnescape(k)
		val, verr := url.PathUnescape(v)
		if pair != "" && (!found || kerr != nil || verr != nil) {
			return nil, false
		}
		keys[key] = val
	}
	return keys, true
}

// libpqOnly are libpq's keywords that pgx does not implement (it would
// send them to the server, which refuses them): "" for those ignored, as
// they tune what pgx does its own way, else why they are refused.
var libpqOnly = map[string]string{
	"keepalives": "", "keepalives_idle": "", "keepalives_interval": "", "keepalives_count": "",
	"tcp_user_timeout": "", "sslcompression": "", "gsslib": "", "gssdelegation": "",
	"hostaddr":    "give the address as host",
	"sslcrl":      "certificate revocation lists are not checked",
	"sslcrldir":   "certificate revocation lists are not checked",
	"requirepeer": "the user of the server's socket is not checked",
	"replication": "not a replication client", "sslkeylogfile": "TLS keys are not logged",
	"scram_client_key": "SCRAM keys cannot be given", "scram_server_key": "SCRAM keys cannot be given",
	"oauth_issuer": "OAuth is not supported", "oauth_client_id": "OAuth is not supported",
	"oauth_client_secret": "OAuth is not supported", "oauth_scope": "OAuth is not supported",
	"default_query_exec_mode": "a pgx option that leaderrun does not use", "statement_cache_capacity": "a pgx option that leaderrun does not use",
	"description_cache_capacity": "a pgx option that leaderrun does not use",
}

// libpqOnlyEnv are libpq's variables that pgx does not read: refused, as
// the keywords they stand for.
var libpqOnlyEnv = map[string]string{"PGHOSTADDR": "hostaddr", "PGSSLCRL": "sslcrl", "PGSSLCRLDIR": "sslcrldir",
	"PGREQUIREPEER": "requirepeer"}

// takeRuntimeParams takes out of cfg.RuntimeParams (where pgx puts every
// keyword it does not know, to be sent at start-up) what is not a server
// setting: pool_max_conns, which it reports, and libpqOnly. It defaults
// application_name and client_encoding.
func takeRuntimeParams(cfg *pgconn.Config) (maxSet bool, err error) {
	rp := cfg.RuntimeParams
	_, maxSet = rp["pool_max_conns"]
	delete(rp, "pool_max_conns")
	for k, v := range rp {
		why, known := libpqOnly[k]
		switch {
		case k == "gssencmode" || k == "load_balance_hosts":
			if v == "require" || v == "random" {
				return false, fmt.Errorf("%s=%s is not supported", k, v)
			}
			delete(rp, k)
		case strings.HasPrefix(k, "pool_"):
			return false, fmt.Errorf("%s: a pgx pool option that leaderrun does not use (it has pool_max_conns)", k)
		case known && why != "":
			return false, fmt.Errorf("%s is not supported: %s", k, why)
		case known:
			delete(rp, k)
		}
	}
	for name, k := range libpqOnlyEnv {
		if os.Getenv(name) != "" {
			return false, fmt.Errorf("%s is set, and %s is not supported: %s", name, k, libpqOnly[k])
		}
	}
	fallback, hasFallback := rp["fallback_application_name"]
	delete(rp, "fallback_application_name")
	if _, ok := rp["application_name"]; !ok {
		rp["application_name"] = "leaderrun"
		if hasFallback {
			rp["application_name"] = fallback
		}
	}
	if enc, ok := rp["client_encoding"]; ok && !strings.EqualFold(strings.ReplaceAll(enc, "-", ""), "UTF8") {
		return false, fmt.Errorf("client_encoding %q: only UTF8 is supported", enc)
	}
	rp["client_encoding"] = "UTF8"
	return maxSet, nil
}

// tlsVersions applies ssl_min_protocol_version (TLSv1.2 by default, as
// libpq) and ssl_max_protocol_version, or their variables, to every TLS
// configuration of cfg.
func tlsVersions(cfg *pgconn.Config) error {
	versions := map[string]uint16{"TLSv1": tls.VersionTLS10, "TLSv1.1": tls.VersionTLS11,
		"TLSv1.2": tls.VersionTLS12, "TLSv1.3": tls.VersionTLS13}
	bounds := [2]uint16{tls.VersionTLS12, 0}
	for i, kv := range [][2]string{{"ssl_min_protocol_version", "PGSSLMINPROTOCOLVERSION"},
		{"ssl_max_protocol_version", "PGSSLMAXPROTOCOLVERSION"}} {
		k := kv[0]
		v, ok := cfg.RuntimeParams[k]
		delete(cfg.RuntimeParams, k)
		if !ok {
			v = os.Getenv(kv[1])
		}
		if v == "" {
			continue
		}
		if bounds[i] = versions[v]; bounds[i] == 0 {
			return fmt.Errorf("%s %q: want TLSv1, TLSv1.1, TLSv1.2 or TLSv1.3", k, v)
		}
	}
	for _, f := range append([]*pgconn.FallbackConfig{{TLSConfig: cfg.TLSConfig}}, cfg.Fallbacks...) {
		if f.TLSConfig != nil {
			f.TLSConfig.MinVersion, f.TLSConfig.MaxVersion = bounds[0], bounds[1]
		}
	}
	return nil
}
