package postgres

import (
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// cleanLibpqEnv unsets every variable that libpq or pgx reads, for the
// test, and gives it a HOME of its own (no ~/.pgpass, ~/.pg_service.conf
// or ~/.postgresql).
func cleanLibpqEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "PG") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
	t.Setenv("HOME", t.TempDir())
	t.Setenv("PGSYSCONFDIR", t.TempDir()) // no system service file either
}

// hostsOf is host:port (or the socket's path) of every host cfg tries, in
// order, without the repeats that TLS modes make.
func hostsOf(cfg *pgconn.Config) []string {
	return strings.Split(endpoints(cfg), ",")
}

// TestParseConnString: connection strings and variables read as libpq
// reads them, by pgx, with Debian's libpq's defaults where no host is
// named and for the system service file.
func TestParseConnString(t *testing.T) {
	svcDir := t.TempDir()
	userServices := filepath.Join(svcDir, "user.conf")
	write(t, userServices, "[ops]\nhost=db-ops\nport=6543\ndbname=ops\n\n[nohost]\ndbname=x\n")
	sysDir := t.TempDir()
	write(t, filepath.Join(sysDir, "pg_service.conf"), "[sys]\nhost=db-sys\nuser=sysuser\n\n[ops]\nhost=shadowed\n")
	const sock = defaultSocketDir + "/.s.PGSQL.5432"
	for _, tc := range []struct {
		name  string
		s     string
		env   map[string]string
		hosts []string
	}{
		{"url", "postgres://u:pw@db1:6432/ops?sslmode=disable", nil, []string{"db1:6432"}},
		{"several hosts and IPv6", "postgres://u@a:1,[::1]:2,b/d?sslmode=disable", nil, []string{"a:1", "[::1]:2", "b:5432"}},
		{"keywords, quoted", `host=h port=7 password='it\'s a \\ secret' sslmode=disable`, nil, []string{"h:7"}},
		{"nothing: Debian's socket directory", "", nil, []string{sock}},
		{"a URL without a host", "postgres://u@/db", nil, []string{sock}},
		{"a URL with only a port", "postgres://u@:6000/db", nil, []string{defaultSocketDir + "/.s.PGSQL.6000"}},
		{"an empty entry of a host list", "postgres://,db2:7/d?sslmode=disable", nil, []string{sock, "db2:7"}},
		{"an empty host keyword", "host='' port=5", nil, []string{defaultSocketDir + "/.s.PGSQL.5"}},
		{"keywords, an empty entry", "host=,db2 port=1,2 sslmode=disable", nil, []string{defaultSocketDir + "/.s.PGSQL.1", "db2:2"}},
		{"PGHOST", "", map[string]string{"PGHOST": "/srv/pg", "PGPORT": "5433"}, []string{"/srv/pg/.s.PGSQL.5433"}},
		{"/tmp when named", "host=/tmp", nil, []string{"/tmp/.s.PGSQL.5432"}},
		{"/tmp when named in PGHOST", "", map[string]string{"PGHOST": "/tmp"}, []string{"/tmp/.s.PGSQL.5432"}},
		{"the string wins over PGHOST", "host=h sslmode=disable", map[string]string{"PGHOST": "other"}, []string{"h:5432"}},
		{"the query's host wins", "postgres://x/db?host=/srv/a", nil, []string{"/srv/a/.s.PGSQL.5432"}},
		{"service in PGSERVICEFILE", "service=ops sslmode=disable", map[string]string{"PGSERVICEFILE": userServices}, []string{"db-ops:6543"}},
		{"PGSERVICE", "sslmode=disable", map[string]string{"PGSERVICEFILE": userServices, "PGSERVICE": "ops"}, []string{"db-ops:6543"}},
		{"the string wins over the service", "service=ops host=mine sslmode=disable", map[string]string{"PGSERVICEFILE": userServices}, []string{"mine:6543"}},
		{"the service wins over PGHOST", "service=ops sslmode=disable", map[string]string{"PGSERVICEFILE": userServices, "PGHOST": "env"}, []string{"db-ops:6543"}},
		{"a service without a host", "service=nohost", map[string]string{"PGSERVICEFILE": userServices}, []string{sock}},
		{"a service in PGSYSCONFDIR", "postgres:///d?service=sys&sslmode=disable", map[string]string{"PGSYSCONFDIR": sysDir}, []string{"db-sys:5432"}},
		{"the user's service first", "service=ops sslmode=disable", map[string]string{"PGSERVICEFILE": userServices, "PGSYSCONFDIR": sysDir}, []string{"db-ops:6543"}},
		{"servicefile in the string", "servicefile=" + userServices + " service=ops sslmode=disable", nil, []string{"db-ops:6543"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cleanLibpqEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			pc, err := parseConnString(tc.s)
			if err != nil {
				t.Fatal(err)
			}
			cfg, maxConns := &pc.ConnConfig.Config, int(pc.MaxConns)
			if got := hostsOf(cfg); !slices.Equal(got, tc.hosts) {
				t.Errorf("hosts %q, want %q", got, tc.hosts)
			}
			if maxConns != maxPoolConns || cfg.RuntimeParams["application_name"] != "leaderrun" ||
				cfg.RuntimeParams["client_encoding"] != "UTF8" {
				t.Errorf("pool of %d, run-time parameters %v; want %d, application_name leaderrun, client_encoding UTF8",
					maxConns, cfg.RuntimeParams, maxPoolConns)
			}
		})
	}
}

// TestParseConnStringSettings: what pgx reads beyond the hosts reaches
// its configuration: every target_session_attrs, channel_binding,
// require_auth, the TLS versions, and the backend's own pool_max_conns.
func TestParseConnStringSettings(t *testing.T) {
	cleanLibpqEnv(t)
	for _, attrs := range []string{"any", "read-write", "read-only", "primary", "standby", "prefer-standby"} {
		pc, err := parseConnString("host=h target_session_attrs=" + attrs)
		if err != nil {
			t.Fatalf("target_session_attrs=%s: %v", attrs, err)
		}
		if (pc.ConnConfig.ValidateConnect == nil) != (attrs == "any") {
			t.Errorf("target_session_attrs=%s: no check of the session", attrs)
		}
	}
	pc, err := parseConnString("postgres://u@h/d?channel_binding=require&require_auth=scram-sha-256" +
		"&pool_max_conns=3&fallback_application_name=ops&keepalives=1&ssl_min_protocol_version=TLSv1.3")
	if err != nil {
		t.Fatal(err)
	}
	cfg, maxConns := &pc.ConnConfig.Config, pc.MaxConns
	if cfg.ChannelBinding != "require" || cfg.RequireAuth != "scram-sha-256" || maxConns != 3 {
		t.Errorf("channel_binding %q, require_auth %q, pool %d", cfg.ChannelBinding, cfg.RequireAuth, maxConns)
	}
	if cfg.TLSConfig == nil || cfg.TLSConfig.MinVersion != tls.VersionTLS13 {
		t.Errorf("TLS %+v, want TLS 1.3 at least", cfg.TLSConfig)
	}
	want := map[string]string{"application_name": "ops", "client_encoding": "UTF8"}
	if fmt.Sprint(cfg.RuntimeParams) != fmt.Sprint(want) {
		t.Errorf("run-time parameters %v, want %v", cfg.RuntimeParams, want)
	}
	t.Setenv("PGSSLMAXPROTOCOLVERSION", "TLSv1.2")
	if pc, err = parseConnString("host=h sslmode=require"); err != nil {
		t.Fatal(err)
	}
	cfg = &pc.ConnConfig.Config
	if tc := cfg.TLSConfig; tc.MinVersion != tls.VersionTLS12 || tc.MaxVersion != tls.VersionTLS12 {
		t.Errorf("TLS versions %x to %x, want 1.2 (libpq's minimum) to 1.2 (PGSSLMAXPROTOCOLVERSION)", tc.MinVersion, tc.MaxVersion)
	}
}

// TestParseConnStringRefuses: what cannot be honoured is refused, naming
// the keyword, and no message shows the password.
func TestParseConnStringRefuses(t *testing.T) {
	const secret = "hunter2"
	for _, tc := range []struct {
		s    string
		env  map[string]string
		want string
	}{
		{"postgres://u:" + secret + "@h:notaport/db", nil, "invalid port"},
		{"postgres://u:" + secret[:3] + "/" + secret[3:] + "@h/db", nil, "invalid port"}, // an unescaped / cuts the URL
		{"host=h password='" + secret, nil, "unterminated quoted string"},
		{"host=h " + secret, nil, "keyword/value"},
		{"host=h hostaddr=10.0.0.1 password=" + secret, nil, "hostaddr is not supported"},
		{"host=h sslcrl=/etc/crl.pem", nil, "sslcrl is not supported"},
		{"host=h requirepeer=postgres", nil, "requirepeer is not supported"},
		{"host=h gssencmode=require", nil, "gssencmode=require"},
		{"host=h load_balance_hosts=random", nil, "load_balance_hosts=random"},
		{"host=h pool_min_conns=2", nil, "pool_min_conns"},
		{"host=h default_query_exec_mode=exec", nil, "default_query_exec_mode is not supported"},
		{"host=h client_encoding=LATIN1", nil, `client_encoding "LATIN1"`},
		{"host=h ssl_min_protocol_version=SSLv3", nil, `ssl_min_protocol_version "SSLv3"`},
		{"host=h target_session_attrs=sometimes", nil, "target_session_attrs"},
		{"host=h channel_binding=always", nil, "channel_binding"},
		{"host=h", map[string]string{"PGREQUIREPEER": "postgres"}, "PGREQUIREPEER is set"},
		{"host=h", map[string]string{"PGHOSTADDR": "10.0.0.1"}, "PGHOSTADDR is set"},
		{"service=nowhere password=" + secret, nil, `service "nowhere" is not defined`},
	} {
		t.Run(tc.want, func(t *testing.T) {
			cleanLibpqEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			_, err := parseConnString(tc.s)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("parseConnString(%q) = %v, want an error saying %s", tc.s, err, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), secret[:3]) {
				t.Errorf("the error shows the password: %v", err)
			}
		})
	}
}

// TestConnKeysAsPgx: connKeys finds the hosts that pgx finds, in every
// form of string: the two must agree, or a host list would be completed
// wrongly.
func TestConnKeysAsPgx(t *testing.T) {
	cleanLibpqEnv(t)
	for _, s := range []string{
		`host=a sslmode=disable`,
		`  host = 'a b' sslmode=disable`,
		`host='it\'s' sslmode=disable`,
		`host=a\ b sslmode=disable`,
		`host='x'port=5 sslmode=disable`,
		`sslmode=disable host=a,b,c port=1,2,3`,
		`host=a host=b sslmode=disable`,
		`sslmode=disable host=a\`,
		`postgres://u:p@a:1,b,[::1]:3/db?sslmode=disable`,
		`postgres://u:p%40x@h%2Dx/db?sslmode=disable`,
		`postgresql://a/db?host=b&sslmode=disable`,
		`postgres://a?sslmode=disable&host=c,d`,
		`postgres://[fe80::1%25eth0]:5/db?sslmode=disable`,
	} {
		keys, ok := connKeys(s)
		if !ok {
			t.Errorf("connKeys(%q) failed", s)
			continue
		}
		cfg, err := pgconn.ParseConfig(s)
		if err != nil {
			t.Errorf("pgx: %q: %v", s, err)
			continue
		}
		var pgx []string
		for _, f := range append([]*pgconn.FallbackConfig{{Host: cfg.Host}}, cfg.Fallbacks...) {
			pgx = append(pgx, f.Host)
		}
		if got := strings.Split(keys["host"], ","); !slices.Equal(got, pgx) {
			t.Errorf("%q: connKeys finds hosts %q, pgx %q", s, got, pgx)
		}
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
