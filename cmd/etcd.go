package cmd

import (
	"crypto/tls"
	"net"
	"net/url"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/etcd"
)

// etcdFlags are the flags of the etcd backend. TLS and authentication read
// the variables etcdctl reads, so that an environment set up for etcdctl
// works as it is.
func etcdFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "etcd-endpoints", Category: categoryStore, EnvVars: []string{"LEADERRUN_ETCD_ENDPOINTS", "ETCDCTL_ENDPOINTS"},
			Usage: "comma-separated etcd `URLS` (http://host:port, https://host:port, host:port, unix://path, unixs://path), all with TLS or all without; list every member so that the client can fail over"},
		&cli.StringFlag{Name: "etcd-cacert", Category: categoryStore, EnvVars: []string{"ETCDCTL_CACERT"},
			Usage: "verify etcd's TLS certificate with the CA bundle in `FILE`"},
		&cli.StringFlag{Name: "etcd-cert", Category: categoryStore, EnvVars: []string{"ETCDCTL_CERT"},
			Usage: "TLS client certificate `FILE` (with --etcd-key)"},
		&cli.StringFlag{Name: "etcd-key", Category: categoryStore, EnvVars: []string{"ETCDCTL_KEY"},
			Usage: "TLS client key `FILE` (with --etcd-cert)"},
		&cli.StringFlag{Name: "etcd-user", Category: categoryStore, EnvVars: []string{"ETCDCTL_USER"},
			Usage: "authenticate as `USER:PASSWORD`; prefer ETCDCTL_USER and ETCDCTL_PASSWORD: arguments are visible to every user of the host (warned at start)"},
		&cli.DurationFlag{Name: "etcd-dial-timeout", Category: categoryStore, EnvVars: []string{"LEADERRUN_ETCD_DIAL_TIMEOUT", "ETCDCTL_DIAL_TIMEOUT"}, Value: etcd.DefaultDialTimeout,
			Usage: "give up after `D` when no etcd member can be reached before leadership (exit 69)"},
	}
}

var etcdStore = store{
	name:     "etcd",
	flags:    etcdFlags,
	selected: func(c *cli.Context) bool { return c.String("etcd-endpoints") != "" },
	open:     newEtcdBackend,
	address:  "--etcd-endpoints (ETCDCTL_ENDPOINTS)",
	// The user and password, and the client certificate: what would let
	// a job write to the lock's keys (the CA only checks the server).
	credentials: []string{"ETCDCTL_USER", "ETCDCTL_PASSWORD", "ETCDCTL_CERT", "ETCDCTL_KEY"},
	risks:       etcdRisks,
}

func newEtcdBackend(c *cli.Context, cfg storeConfig) (backends.Store, error) {
	endpoints, err := etcdEndpoints(c.String("etcd-endpoints"))
	if err != nil {
		return nil, err
	}
	// Without TLS flags, plain TCP unless an https:// endpoint asks for
	// TLS with the system's roots.
	var tlsCfg *tls.Config
	if ca, cert, key := c.String("etcd-cacert"), c.String("etcd-cert"), c.String("etcd-key"); ca+cert+key != "" {
		if tlsCfg, err = etcd.LoadTLS(ca, cert, key); err != nil {
			return nil, usageErrorf("--etcd-cacert %q, --etcd-cert %q, --etcd-key %q: %v", ca, cert, key, err)
		}
	}
	if err := etcd.CheckEndpoints(endpoints, tlsCfg != nil); err != nil {
		return nil, usageErrorf("--etcd-endpoints: %v", err)
	}
	var user, password string
	if u := c.String("etcd-user"); u != "" {
		var ok bool
		user, password, ok = strings.Cut(u, ":")
		if !ok {
			// As etcdctl: the password may come from ETCDCTL_PASSWORD.
			password = os.Getenv("ETCDCTL_PASSWORD")
		}
		// etcd's client does not authenticate at all without a
		// password: refuse what would silently run as nobody.
		if user == "" || password == "" {
			// Never echo the value: it may be a password.
			return nil, usageErrorf("--etcd-user: want USER:PASSWORD, or USER with ETCDCTL_PASSWORD set")
		}
	}
	dial := c.Duration("etcd-dial-timeout")
	if dial <= 0 {
		return nil, usageErrorf("--etcd-dial-timeout %v: must be greater than 0", dial)
	}
	log, err := newLogger(c, os.Stderr)
	if err != nil {
		return nil, err
	}
	return etcd.Open(etcd.Config{
		Endpoints:   endpoints,
		TLS:         tlsCfg,
		Username:    user,
		Password:    password,
		DialTimeout: dial,
		Prefix:      cfg.Prefix,
		Log:         log,
	})
}

// etcdEndpoints splits and checks --etcd-endpoints.
func etcdEndpoints(s string) ([]string, error) {
	// User information in an endpoint is never sent (gRPC ignores it; the
	// user and password go in --etcd-user): it is dropped before the list
	// is split, so that a password holding "," or "/" cannot become an
	// endpoint of its own, to be quoted in a message.
	s = backends.Redact(s)
	var eps []string
	for _, ep := range strings.Split(s, ",") {
		ep = strings.TrimSpace(ep)
		if ep == "" {
			continue
		}
		if !validEndpoint(ep) {
			return nil, usageErrorf("--etcd-endpoints %q: %q is not an endpoint like http://HOST:PORT, https://HOST:PORT or HOST:PORT", s, ep)
		}
		eps = append(eps, ep)
	}
	if len(eps) == 0 {
		return nil, usageErrorf("--etcd-endpoints %q: no endpoint given", s)
	}
	return eps, nil
}

func validEndpoint(ep string) bool {
	if !strings.Contains(ep, "://") {
		_, port, err := net.SplitHostPort(ep)
		return err == nil && port != ""
	}
	u, err := url.Parse(ep)
	if err != nil {
		return false
	}
	switch u.Scheme {
	case "http", "https":
		return u.Host != ""
	case "unix", "unixs":
		return u.Host != "" || u.Path != ""
	}
	return false
}
