package backends

import "strings"

// Redact drops the user information (user:password@) from an address
// given as a URL or host:port list, so that messages that name a store's
// address never carry a password. Several comma-separated addresses are
// redacted one by one.
func Redact(addr string) string {
	parts := strings.Split(addr, ",")
	for i, a := range parts {
		parts[i] = redactOne(a)
	}
	return strings.Join(parts, ",")
}

func redactOne(addr string) string {
	scheme, rest, ok := strings.Cut(addr, "://")
	if !ok {
		scheme, rest = "", addr
	}
	host, path, hasPath := strings.Cut(rest, "/")
	if i := strings.LastIndexByte(host, '@'); i >= 0 {
		host = host[i+1:]
	}
	if hasPath {
		host += "/" + path
	}
	if scheme != "" {
		return scheme + "://" + host
	}
	return host
}
