package cmd

import (
	"crypto/tls"
	"os"
	"strings"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/urfave/cli/v2"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/mysql"
)

// mysqlFlags are the flags of the MySQL and MariaDB backend: the DSN as
// go-sql-driver reads it (TLS in its tls= parameter), the password from
// the DSN, else from --mysql-password-file, else from MYSQL_PWD, as the
// mysql client reads it; the TLS files named as the mysql client's
// --ssl-ca, --ssl-cert and --ssl-key. MYSQL_PWD never selects the store.
func mysqlFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "mysql-dsn", Category: categoryStore, EnvVars: []string{"LEADERRUN_MYSQL_DSN"},
			Usage: "MySQL or MariaDB `DSN`, as go-sql-driver reads it: [user[:password]@]tcp(host:port)/dbname or user@unix(/path/mysqld.sock)/dbname, " +
				"with ?tls=true for TLS checked against the system's CAs (or --mysql-ssl-ca's); without a password in it, the password comes from " +
				"--mysql-password-file, else MYSQL_PWD. Put no password here: arguments are visible to every user of the host; use the variable, " +
				"or the password alone in the file or MYSQL_PWD. leaderrun warns at start of a password here, of one sent in clear text to another host, " +
				"and of tls=skip-verify or tls=preferred. A failover to an asynchronous replica can lose a grant: see docs/backends/mysql.md"},
		&cli.StringFlag{Name: "mysql-password-file", Category: categoryStore, EnvVars: []string{"LEADERRUN_MYSQL_PASSWORD_FILE"},
			Usage: "read the password from the first line of `FILE`, when the DSN has none"},
		&cli.StringFlag{Name: "mysql-table", Category: categoryStore, EnvVars: []string{"LEADERRUN_MYSQL_TABLE"}, Value: mysql.DefaultTable,
			Usage: "lease `TABLE` ([database.]name), created with TABLE_tokens and TABLE_docs beside it if missing"},
		&cli.StringFlag{Name: "mysql-ssl-ca", Category: categoryStore, EnvVars: []string{"LEADERRUN_MYSQL_SSL_CA"},
			Usage: "use TLS, and verify the server's certificate with the CA bundle in `FILE` (as mysql --ssl-ca)"},
		&cli.StringFlag{Name: "mysql-ssl-cert", Category: categoryStore, EnvVars: []string{"LEADERRUN_MYSQL_SSL_CERT"},
			Usage: "use TLS with the client certificate in `FILE` (with --mysql-ssl-key)"},
		&cli.StringFlag{Name: "mysql-ssl-key", Category: categoryStore, EnvVars: []string{"LEADERRUN_MYSQL_SSL_KEY"},
			Usage: "TLS client key `FILE` (with --mysql-ssl-cert)"},
	}
}

var mysqlStore = store{
	name:     "mysql",
	flags:    mysqlFlags,
	selected: func(c *cli.Context) bool { return c.String("mysql-dsn") != "" },
	open:     newMySQLStore,
	address:  "--mysql-dsn (LEADERRUN_MYSQL_DSN)",
	// What lets a job write to the lock's tables: the DSN (it may carry
	// a password), the password file and the client certificate.
	// MYSQL_PWD stays: it is as often the job's own, for its mysql client.
	credentials: []string{"LEADERRUN_MYSQL_DSN", "LEADERRUN_MYSQL_PASSWORD_FILE", "LEADERRUN_MYSQL_SSL_CERT", "LEADERRUN_MYSQL_SSL_KEY"},
	risks:       mysqlRisks,
}

// newMySQLStore validates the MySQL flags and opens the store. No
// message shows a password: the DSN is printed without its user
// information, and the store's messages are redacted again here.
func newMySQLStore(c *cli.Context, cfg storeConfig) (backends.Store, error) {
	dsn, table := c.String("mysql-dsn"), c.String("mysql-table")
	password, file := os.Getenv("MYSQL_PWD"), c.String("mysql-password-file")
	secret := mysqlDSNPassword(dsn)
	redact := func(msg string) string {
		for _, p := range []string{secret, password} {
			if p != "" {
				msg = strings.ReplaceAll(msg, p, "xxxxx")
			}
		}
		return msg
	}
	switch {
	case dsn == "":
		return nil, usageErrorf("--backend mysql: set --mysql-dsn (LEADERRUN_MYSQL_DSN)")
	case strings.TrimSpace(table) == "":
		return nil, usageErrorf("--mysql-table must not be empty")
	case file != "" && secret != "":
		return nil, usageErrorf("--mysql-dsn holds a password and --mysql-password-file names another: keep one")
	case file != "":
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, usageErrorf("--mysql-password-file: %v", err)
		}
		line, _, _ := strings.Cut(string(data), "\n")
		if password = strings.TrimSuffix(line, "\r"); password == "" {
			return nil, usageErrorf("--mysql-password-file %q: its first line is empty", file)
		}
	}
	tlsCfg, err := mysqlTLS(c, dsn)
	if err != nil {
		return nil, err
	}
	s, err := mysql.Open(mysql.Config{DSN: dsn, Password: password, TLS: tlsCfg, Table: table, Prefix: cfg.Prefix})
	if err != nil {
		return nil, usageErrorf("--mysql-dsn %q, --mysql-table %q: %s", backends.Redact(dsn), table, redact(err.Error()))
	}
	return s, nil
}

// mysqlTLS reads --mysql-ssl-ca, --mysql-ssl-cert and --mysql-ssl-key as
// the mysql client reads its --ssl-* files; nil if none is set. They
// replace what the DSN's tls= says, so one that turns the check off, or
// TLS itself, is refused beside them.
func mysqlTLS(c *cli.Context, dsn string) (*tls.Config, error) {
	ca, cert, key := c.String("mysql-ssl-ca"), c.String("mysql-ssl-cert"), c.String("mysql-ssl-key")
	if ca+cert+key == "" {
		return nil, nil
	}
	if mc, err := gomysql.ParseDSN(dsn); err == nil && (mc.TLSConfig == "false" || mc.TLSConfig == "skip-verify" || mc.TLSConfig == "preferred") {
		return nil, usageErrorf("--mysql-ssl-ca, --mysql-ssl-cert or --mysql-ssl-key with tls=%s in --mysql-dsn: drop tls=%s, or the files", mc.TLSConfig, mc.TLSConfig)
	}
	cfg, err := redisTLS(ca, cert, key)
	if err != nil {
		return nil, usageErrorf("--mysql-ssl-ca %q, --mysql-ssl-cert %q, --mysql-ssl-key %q: %v", ca, cert, key, err)
	}
	return cfg, nil
}

// mysqlDSNPassword is what a DSN holds between the first ":" and the
// last "@" before its last "/", as go-sql-driver reads it: the password,
// kept out of every message, even of a DSN that does not parse.
func mysqlDSNPassword(dsn string) string {
	head := dsn[:max(strings.LastIndexByte(dsn, '/'), 0)]
	at := strings.LastIndexByte(head, '@')
	if at < 0 {
		return ""
	}
	_, pw, _ := strings.Cut(head[:at], ":")
	return pw
}

// mysqlRisks: a password in --mysql-dsn's argument; tls=skip-verify or
// tls=preferred (no check of the server's certificate, and for preferred
// plain text if the server offers no TLS); a session with a password to a
// host across the network without TLS.
func mysqlRisks(c *cli.Context, given map[string]bool) []string {
	mc, err := gomysql.ParseDSN(c.String("mysql-dsn"))
	if err != nil {
		return nil // a usage error follows
	}
	var risks []string
	if given["mysql-dsn"] && mc.Passwd != "" {
		risks = append(risks, inArguments("mysql-dsn", "LEADERRUN_MYSQL_DSN, or the password alone in --mysql-password-file or MYSQL_PWD"))
	}
	files := c.String("mysql-ssl-ca")+c.String("mysql-ssl-cert")+c.String("mysql-ssl-key") != ""
	switch {
	case files:
	case mc.TLSConfig == "skip-verify", mc.TLSConfig == "preferred":
		risks = append(risks, "tls="+mc.TLSConfig+" in --mysql-dsn: the server's certificate is not checked, so anyone on the path can pose as the server and take the session: "+
			"use tls=true, with the server's CA in --mysql-ssl-ca")
	case mc.TLSConfig == "" || mc.TLSConfig == "false":
		secret := mc.Passwd != "" || c.String("mysql-password-file") != "" || os.Getenv("MYSQL_PWD") != ""
		if secret && mc.Net == "tcp" && remote(mc.Addr) {
			risks = append(risks, inClear("the MySQL login and every statement", mc.Addr, "tls=true in --mysql-dsn, with --mysql-ssl-ca"))
		}
	}
	return risks
}
