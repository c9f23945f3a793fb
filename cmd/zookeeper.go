package cmd

import (
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/zookeeper"
)

// zkFlags are the flags of the ZooKeeper backend. ZooKeeper's own tools
// read no environment variable for the ensemble's address, so only
// leaderrun's own select it.
func zkFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "zk-servers", Category: categoryStore, EnvVars: []string{"LEADERRUN_ZK_SERVERS"},
			Usage: "comma-separated `HOSTS` (host:port, port 2181 if left out) of the ZooKeeper ensemble; list every server so that the client can fail over. " +
				"ZooKeeper needs --lease-duration above --renew-deadline + --kill-grace + --retry-period + tickTime/2 (with the other defaults and tickTime 2s: above 16s, e.g. 20s)"},
		&cli.StringFlag{Name: "zk-auth-file", Category: categoryStore, EnvVars: []string{"LEADERRUN_ZK_AUTH_FILE"},
			Usage: "`FILE` holding USER:PASSWORD for ZooKeeper's digest authentication; it must not be readable by group or others (chmod 600)"},
		&cli.DurationFlag{Name: "zk-connect-timeout", Category: categoryStore, EnvVars: []string{"LEADERRUN_ZK_CONNECT_TIMEOUT"}, Value: zookeeper.DefaultConnectTimeout,
			Usage: "bound each attempt to reach ZooKeeper before leadership by `D`: with --try exit 69 after it; while --wait runs, try again"},
	}
}

var zkStore = store{
	name:     "zookeeper",
	flags:    zkFlags,
	selected: func(c *cli.Context) bool { return c.String("zk-servers") != "" },
	open:     openZooKeeper,
	address:  "--zk-servers (LEADERRUN_ZK_SERVERS)",
	// The file's name: the job has no business with the lock's password.
	credentials: []string{"LEADERRUN_ZK_AUTH_FILE"},
}

// openZooKeeper opens the ensemble of --zk-servers. The lease duration,
// which is each candidacy's session timeout, and the retry period, which
// bounds the TTL a lease reports, come with every campaign's claim.
func openZooKeeper(c *cli.Context, cfg storeConfig) (backends.Store, error) {
	servers, err := zkServers(c.String("zk-servers"))
	if err != nil {
		return nil, err
	}
	connect := c.Duration("zk-connect-timeout")
	if connect <= 0 {
		return nil, usageErrorf("--zk-connect-timeout %v: must be greater than 0", connect)
	}
	var digest zookeeper.Digest
	if f := c.String("zk-auth-file"); f != "" {
		if digest, err = readZKAuthFile(f); err != nil {
			return nil, err
		}
	}
	log, err := newLogger(c, os.Stderr)
	if err != nil {
		return nil, err
	}
	s, err := zookeeper.Open(zookeeper.Config{
		Servers:        servers,
		Digest:         digest,
		Prefix:         cfg.Prefix,
		ConnectTimeout: connect,
		Log:            log,
	})
	if err != nil {
		// Open checks the servers and the prefix.
		return nil, usageErrorf("--zk-servers %q, --prefix %q: %v", backends.Redact(c.String("zk-servers")), cfg.Prefix, err)
	}
	return s, nil
}

// zkServers splits and checks --zk-servers. A ZooKeeper connection string
// may end in a chroot (host:port,host:port/path); leaderrun's --prefix does
// that job, and Open says so.
func zkServers(s string) ([]string, error) {
	// User information is refused before the list is split: a password
	// holding "," or "/" would otherwise become a "server" of its own,
	// and be quoted as one.
	if backends.Redact(s) != s {
		return nil, usageErrorf("--zk-servers %q: want host:port, without user information (use --zk-auth-file)", backends.Redact(s))
	}
	var servers []string
	for _, srv := range strings.Split(s, ",") {
		if srv = strings.TrimSpace(srv); srv != "" {
			servers = append(servers, srv)
		}
	}
	if len(servers) == 0 {
		return nil, usageErrorf("--zk-servers %q: no server given", backends.Redact(s))
	}
	return servers, nil
}

// maxZKAuthFile bounds what is read of an auth file: a line.
const maxZKAuthFile = 4096

// readZKAuthFile reads USER:PASSWORD from path. Like ssh with a private
// key, it refuses a file that group or others may read or write: the
// password would not be a secret. Errors name the file, never what it
// holds.
func readZKAuthFile(path string) (zookeeper.Digest, error) {
	f, err := os.Open(path)
	if err != nil {
		return zookeeper.Digest{}, usageErrorf("--zk-auth-file: %v", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return zookeeper.Digest{}, usageErrorf("--zk-auth-file: %v", err)
	}
	if !fi.Mode().IsRegular() {
		return zookeeper.Digest{}, usageErrorf("--zk-auth-file %s: not a regular file", path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return zookeeper.Digest{}, usageErrorf("--zk-auth-file %s: permissions %04o are too open: the password must not be readable by group or others (chmod 600 %s)",
			path, perm, path)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxZKAuthFile+1))
	if err != nil {
		return zookeeper.Digest{}, usageErrorf("--zk-auth-file %s: %v", path, err)
	}
	if len(data) > maxZKAuthFile {
		return zookeeper.Digest{}, usageErrorf("--zk-auth-file %s: longer than %d bytes; want one line USER:PASSWORD", path, maxZKAuthFile)
	}
	d, ok := parseZKDigest(string(data))
	if !ok {
		// Nothing of the file in the message.
		return zookeeper.Digest{}, usageErrorf("--zk-auth-file %s: zookeeper: digest credentials must be one line user:password", path)
	}
	return d, nil
}

// parseZKDigest reads "user:password", as an auth file holds it: the first
// colon separates them; a final newline is ignored, any other line break
// refused.
func parseZKDigest(s string) (zookeeper.Digest, bool) {
	s = strings.TrimRight(s, "\r\n")
	user, password, ok := strings.Cut(s, ":")
	if !ok || user == "" || strings.ContainsAny(s, "\r\n") {
		return zookeeper.Digest{}, false
	}
	return zookeeper.Digest{User: user, Password: password}, true
}
