package cmd

import (
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/leaderrun/leaderrun/backends"
)

// Where a store's settings put its credentials at risk, leaderrun says so
// in one warning line at start (warnRisks), and runs all the same: a
// secret in the arguments, which every user of the host reads in ps; a
// secret sent over a network in clear text; a certificate left unchecked.
// Each store's risks function names the flags or variables at fault and
// what to use instead; none quotes a secret.

// warnRisks logs the chosen store's risks, if any, as one warning line.
func warnRisks(c *cli.Context, s store) {
	if s.risks == nil {
		return
	}
	risks := s.risks(c, commandLineFlags(c))
	if len(risks) == 0 {
		return
	}
	log, err := newLogger(c, os.Stderr)
	if err != nil {
		return
	}
	log.Warn("credentials at risk", "backend", s.name, "lock", c.String("lock"), "risks", strings.Join(risks, "; "))
}

// inArguments says that flag holds a secret in the arguments.
func inArguments(flag, instead string) string {
	return "--" + flag + " holds a secret in the arguments, which every user of the host can read (ps): use " + instead
}

// inClear says that a secret crosses the network to host unencrypted.
func inClear(what, host, instead string) string {
	return what + " cross the network to " + host + " in clear text: use " + instead
}

// remote reports whether host (a name or address, with or without a port)
// is reached over a network: anything but localhost and the loopback
// addresses.
func remote(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if host == "" || strings.EqualFold(host, "localhost") {
		return false
	}
	ip := net.ParseIP(host)
	return ip == nil || !ip.IsLoopback()
}

// redisRisks: the URL's password or the Sentinels' password in the
// arguments; a password over redis:// to a host across the network;
// skip_verify=true, which turns rediss://'s certificate check off.
func redisRisks(c *cli.Context, given map[string]bool) []string {
	var risks []string
	raw := c.String("redis-url")
	stripped, _, password, _, _ := backends.SplitUserinfo(raw)
	if given["redis-url"] && password != "" {
		risks = append(risks, inArguments("redis-url", "LEADERRUN_REDIS_URL, or the password alone in REDISCLI_AUTH"))
	}
	if given["redis-sentinel-password"] {
		risks = append(risks, inArguments("redis-sentinel-password", "LEADERRUN_REDIS_SENTINEL_PASSWORD"))
	}
	if stripped == "" {
		stripped = "redis://" // Sentinels without a URL: plain TCP
	}
	u, err := url.Parse(stripped)
	if err != nil {
		return risks
	}
	if v := u.Query().Get("skip_verify"); u.Scheme == "rediss" && v != "" {
		if skip, _ := strconv.ParseBool(v); skip {
			risks = append(risks, "skip_verify=true in --redis-url: the server's certificate is not checked, so anyone on the path can pose as the server and take the password: "+
				"drop it, and give the server's CA with --redis-cacert")
		}
	}
	if u.Scheme != "redis" {
		return risks
	}
	hosts := []string{u.Host}
	if list := c.String("redis-sentinels"); list != "" {
		hosts = strings.Split(list, ",")
	}
	secret := password != "" || os.Getenv("REDISCLI_AUTH") != "" || c.String("redis-sentinel-password") != ""
	for _, h := range hosts {
		if h = strings.TrimSpace(h); secret && remote(h) {
			risks = append(risks, inClear("the Redis password and every command", h, "rediss://"))
			break
		}
	}
	return risks
}

// consulRisks: --consul-token in the arguments; a token over plain HTTP to
// an agent across the network; CONSUL_HTTP_SSL_VERIFY=false.
func consulRisks(c *cli.Context, given map[string]bool) []string {
	var risks []string
	if given["consul-token"] {
		risks = append(risks, inArguments("consul-token", "--consul-token-file, CONSUL_HTTP_TOKEN_FILE or CONSUL_HTTP_TOKEN"))
	}
	if v := os.Getenv("CONSUL_HTTP_SSL_VERIFY"); v != "" {
		if verify, err := strconv.ParseBool(v); err == nil && !verify {
			risks = append(risks, "CONSUL_HTTP_SSL_VERIFY=false: the agent's certificate is not checked, so anyone on the path can pose as the agent and take the token: "+
				"drop it, and give the agent's CA with CONSUL_CACERT")
		}
	}
	token := c.String("consul-token") != "" || c.String("consul-token-file") != "" || os.Getenv("CONSUL_HTTP_AUTH") != ""
	addr := c.String("consul-addr")
	scheme, host, ok := strings.Cut(addr, "://")
	if !ok {
		scheme, host = "http", addr
		if tls, _ := strconv.ParseBool(os.Getenv("CONSUL_HTTP_SSL")); tls {
			scheme = "https"
		}
	}
	host, _, _ = strings.Cut(host, "/")
	if token && scheme == "http" && remote(host) {
		risks = append(risks, inClear("the Consul ACL token and every request", host, "https:// (or CONSUL_HTTP_SSL=true)"))
	}
	return risks
}

// etcdRisks: a password in --etcd-user; a password over plain gRPC to a
// member across the network.
func etcdRisks(c *cli.Context, given map[string]bool) []string {
	var risks []string
	user := c.String("etcd-user")
	if given["etcd-user"] && strings.Contains(user, ":") {
		risks = append(risks, inArguments("etcd-user", "ETCDCTL_USER and ETCDCTL_PASSWORD"))
	}
	if user == "" {
		return risks
	}
	tlsFiles := c.String("etcd-cacert")+c.String("etcd-cert")+c.String("etcd-key") != ""
	for _, ep := range strings.Split(backends.Redact(c.String("etcd-endpoints")), ",") {
		ep = strings.TrimSpace(ep)
		scheme, host, ok := strings.Cut(ep, "://")
		if !ok {
			scheme, host = "", ep
		}
		if (scheme == "http" || scheme == "" && !tlsFiles) && remote(host) {
			risks = append(risks, inClear("the etcd password and every request", host, "https:// endpoints"))
			break
		}
	}
	return risks
}

// postgresRisks: a password in --postgres-url.
func postgresRisks(c *cli.Context, given map[string]bool) []string {
	if !given["postgres-url"] {
		return nil
	}
	raw := c.String("postgres-url")
	_, _, password, _, _ := backends.SplitUserinfo(raw)
	if password == "" && !strings.Contains(raw, "password=") {
		return nil
	}
	return []string{inArguments("postgres-url", "LEADERRUN_POSTGRES_URL, PGPASSWORD or ~/.pgpass")}
}

// azureRisks: a key, a SAS or a connection string, to a blob endpoint
// across the network over plain HTTP: a SAS is a bearer token, and a
// request signed with the key can be replayed.
func azureRisks(c *cli.Context, _ map[string]bool) []string {
	conn := os.Getenv(envAzureConnectionString)
	if conn == "" && os.Getenv(envAzureKey) == "" && os.Getenv(envAzureSAS) == "" {
		return nil
	}
	settings := map[string]string{}
	for _, kv := range strings.Split(conn, ";") {
		k, v, _ := strings.Cut(kv, "=")
		settings[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
	}
	host, plain := plainHTTP(c.String("azure-account-url"))
	if e, ok := settings["blobendpoint"]; ok {
		host, plain = plainHTTP(e)
	} else if strings.EqualFold(settings["defaultendpointsprotocol"], "http") {
		host, plain = "the account's blob endpoint", true
	}
	if !plain || !remote(host) {
		return nil
	}
	return []string{inClear("the SAS token, or requests signed with the account key,", host, "https://")}
}

// dynamodbRisks: requests signed with the AWS credentials, to an endpoint
// across the network over plain HTTP, where they can be read and
// replayed for minutes.
func dynamodbRisks(c *cli.Context, _ map[string]bool) []string {
	endpoint := c.String("dynamodb-endpoint")
	for _, v := range []string{"AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL"} {
		if endpoint == "" {
			endpoint = os.Getenv(v)
		}
	}
	if host, plain := plainHTTP(endpoint); plain && remote(host) {
		return []string{inClear("requests signed with the AWS credentials", host, "https://")}
	}
	return nil
}

// plainHTTP returns the host of an http:// URL, and whether it is one.
func plainHTTP(endpoint string) (string, bool) {
	rest, ok := strings.CutPrefix(endpoint, "http://")
	host, _, _ := strings.Cut(rest, "/")
	return host, ok
}
