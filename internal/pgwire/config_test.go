package pgwire

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func vars(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// TestParseConfig: the URL and keyword/value forms read as libpq reads
// them, completed by the PG* variables, which a connection string
// overrides.
func TestParseConfig(t *testing.T) {
	t.Setenv("HOME", t.TempDir()) // no ~/.pgpass
	for _, tc := range []struct {
		name, s string
		env     map[string]string
		want    Config
	}{
		{"url", "postgres://al%40ice:p%3Ass@db1.internal:6432/ops?sslmode=verify-full&application_name=x&connect_timeout=1", nil,
			Config{Hosts: []Host{{"db1.internal", 6432, ""}}, User: "al@ice", Password: "p:ss", Database: "ops", SSLMode: "verify-full",
				ConnectTimeout: 2 * time.Second, Params: map[string]string{"application_name": "x"}}},
		{"url, several hosts and IPv6", "postgresql://u@a:1,[::1]:2,b/d", nil,
			Config{Hosts: []Host{{"a", 1, ""}, {"::1", 2, ""}, {"b", 5432, ""}}, User: "u", Database: "d", SSLMode: "prefer"}},
		{"keywords, quoted", `host=h port=7 user=u password='it\'s a \\ secret' dbname = x sslmode=disable`, nil,
			Config{Hosts: []Host{{"h", 7, ""}}, User: "u", Password: `it's a \ secret`, Database: "x", SSLMode: "disable"}},
		{"keywords, hosts and ports", "host=a,b port=1,2 user=u", nil,
			Config{Hosts: []Host{{"a", 1, ""}, {"b", 2, ""}}, User: "u", Database: "u", SSLMode: "prefer"}},
		{"variables", "", map[string]string{"PGHOST": "/run/pg", "PGPORT": "5433", "PGUSER": "v", "PGPASSWORD": "pw",
			"PGDATABASE": "db", "PGSSLMODE": "require", "PGAPPNAME": "app", "PGCONNECT_TIMEOUT": "9", "PGTARGETSESSIONATTRS": "read-write"},
			Config{Hosts: []Host{{"/run/pg", 5433, ""}}, User: "v", Password: "pw", Database: "db", SSLMode: "require",
				ConnectTimeout: 9 * time.Second, TargetSessionAttrs: "read-write", Params: map[string]string{"application_name": "app"}}},
		{"the string wins over the variables", "host=h user=u", map[string]string{"PGHOST": "other", "PGUSER": "v", "PGDATABASE": "db"},
			Config{Hosts: []Host{{"h", 5432, ""}}, User: "u", Database: "db", SSLMode: "prefer"}},
		{"url, + and an escaped & kept in the password", "postgres://u:a+b%26c@h/d", nil,
			Config{Hosts: []Host{{"h", 5432, ""}}, User: "u", Password: "a+b&c", Database: "d", SSLMode: "prefer"}},
		{"hostaddr beside host", "host=db1,db2 hostaddr=10.0.0.1,10.0.0.2 user=u", nil,
			Config{Hosts: []Host{{"db1", 5432, "10.0.0.1"}, {"db2", 5432, "10.0.0.2"}}, User: "u", Database: "u", SSLMode: "prefer"}},
		{"the system's roots: verify-full", "host=h user=u sslrootcert=system", nil,
			Config{Hosts: []Host{{"h", 5432, ""}}, User: "u", Database: "u", SSLMode: "verify-full", SSLRootCert: "system"}},
		{"keywords not libpq's are the caller's", "postgres://u@h/d?pool_max_conns=3", nil,
			Config{Hosts: []Host{{"h", 5432, ""}}, User: "u", Database: "d", SSLMode: "prefer", Extra: map[string]string{"pool_max_conns": "3"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseConfig(tc.s, vars(tc.env))
			if err != nil {
				t.Fatal(err)
			}
			want := tc.want
			if want.Params == nil {
				want.Params = map[string]string{}
			}
			want.Params["client_encoding"] = "UTF8"
			if want.Extra == nil {
				want.Extra = map[string]string{}
			}
			want.PassFile = got.PassFile
			if want.TLSMin == 0 {
				want.TLSMin = tls.VersionTLS12
			}
			if want.TargetSessionAttrs == "" {
				want.TargetSessionAttrs = "any"
			}
			if !reflect.DeepEqual(*got, want) {
				t.Errorf("ParseConfig(%q)\n got %+v\nwant %+v", tc.s, *got, want)
			}
		})
	}
}

// TestParseConfigErrors: what cannot be used is refused, naming the
// keyword and never showing the password.
func TestParseConfigErrors(t *testing.T) {
	const secret = "hunter2"
	for _, tc := range []struct{ s, want string }{
		{"postgres://u:" + secret + "@h:notaport/db", "port 1 of the list is not a number"},
		{"postgres://u:" + secret[:3] + "/" + secret[3:] + "@h/db", "port 1 of the list is not a number"}, // an unescaped / cuts the URL
		{"postgres://u@h/db?password=" + secret + "%zz", "the value of password is not well escaped"},
		{"host=h sslrootcert=system sslmode=require password=" + secret, "too weak for sslrootcert=system"},
		{"host=h sslcrl=/etc/crl.pem", "sslcrl is not supported"},
		{"host=h requirepeer=postgres", "requirepeer is not supported"},
		{"host=a,b hostaddr=10.0.0.1", "1 addresses (hostaddr) for 2 hosts"},
		{"host=h ssl_min_protocol_version=SSLv3", `ssl_min_protocol_version "SSLv3"`},
		{"host=h password=" + secret + " sslmode=sometimes", `sslmode "sometimes"`},
		{"host=h password='" + secret, "no closing quote"},
		{"host=a,b,c port=1,2", "2 ports for 3 hosts"},
		{"service=ops", "service file"},
		{"host=h channel_binding=require", "channel_binding=require"},
		{"host=h target_session_attrs=standby", `target_session_attrs "standby"`},
		{"host=h client_encoding=LATIN1", `client_encoding "LATIN1"`},
		{"host=h " + secret, "a word with no =value at byte 8"},
		{"host=h pass word=" + secret, "not keyword=value at byte 8"},
	} {
		_, err := ParseConfig(tc.s, vars(nil))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseConfig(%q) = %v, want an error saying %s", tc.s, err, tc.want)
		}
		if err != nil && (strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), secret[:3])) {
			t.Errorf("ParseConfig(%q): the error shows the password: %v", tc.s, err)
		}
	}
	if _, err := ParseConfig("", vars(map[string]string{"PGSERVICE": "ops"})); err == nil {
		t.Error("PGSERVICE accepted, want an error: the service file is not read")
	}
}

// TestPasswordFile: a missing password comes from the first matching
// line of the password file, with * and \ escapes; a file that others
// may read is ignored, as libpq ignores it.
func TestPasswordFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "pgpass")
	// Each host its own line: the password is looked up per host.
	content := "# comment\n" +
		"other:5432:*:u:wrong\n" +
		`db1:5432:ops:u:p\:w\\d` + "\n" +
		"*:*:*:u:fallback\n" +
		"localhost:5432:*:sock:via-socket\n"
	if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ s, want string }{
		{"host=db1 dbname=ops user=u", `p:w\d`},
		{"host=db2 dbname=ops user=u", "fallback"},
		{"host=db1 dbname=ops user=u password=given", "given"},
		{"host=/var/run/postgresql user=sock", "via-socket"}, // libpq's default socket directory is localhost
		{"host=/srv/pg user=sock", ""},
		{"host=db1 user=nobody", ""},
	} {
		c, err := ParseConfig(tc.s, vars(map[string]string{"PGPASSFILE": file}))
		if err != nil {
			t.Fatal(err)
		}
		if got := c.PasswordFor(c.Hosts[0]); got != tc.want {
			t.Errorf("%s: password %q, want %q", tc.s, got, tc.want)
		}
	}
	c, err := ParseConfig("host=db1,db2 dbname=ops user=u", vars(map[string]string{"PGPASSFILE": file}))
	if err != nil {
		t.Fatal(err)
	}
	if a, b := c.PasswordFor(c.Hosts[0]), c.PasswordFor(c.Hosts[1]); a != `p:w\d` || b != "fallback" {
		t.Errorf("two hosts: passwords %q and %q, want each host's own line", a, b)
	}
	if err := os.Chmod(file, 0o644); err != nil {
		t.Fatal(err)
	}
	c, err = ParseConfig("host=db1 dbname=ops user=u", vars(map[string]string{"PGPASSFILE": file}))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.PasswordFor(c.Hosts[0]); got != "" {
		t.Errorf("a password file readable by others was used: password %q", got)
	}
}

// TestTimestamptz: the ISO output of every offset PostgreSQL prints.
func TestTimestamptz(t *testing.T) {
	want := time.Date(2026, 12, 2, 0, 51, 2, 123456000, time.UTC)
	for _, s := range []string{"2026-12-02 00:51:02.123456+00", "2026-12-02 06:21:02.123456+05:30",
		"2026-12-01 19:51:02.123456-05", "2026-12-02 00:51:12.123456+00:00:10"} {
		got, err := parseTimestamptz(s)
		if err != nil || !got.Equal(want) {
			t.Errorf("parseTimestamptz(%q) = %v, %v, want %v", s, got, err, want)
		}
	}
	if _, err := parseTimestamptz("Wed Dec 02 00:51:02 2026 UTC"); err == nil {
		t.Error("a DateStyle other than ISO was accepted")
	}
}
