package backends

import (
	"net/url"
	"strings"
)

// Redact drops the user information (user:password@) from an address
// given as a URL, a host:port, or a comma-separated list of them, so that
// messages never carry a password. It is found before the list is split,
// by SplitUserinfo's rule: a password may hold ",", "/", "?" or "@",
// encoded or not, and none of it shows. In doubt, it hides more, never
// less.
func Redact(addr string) string {
	var out strings.Builder
	rest := addr
	for {
		i := strings.Index(rest, "://")
		if i < 0 {
			out.WriteString(afterLastAt(rest))
			return out.String()
		}
		// The scheme begins after the last comma before "://"; before
		// it are addresses without a scheme.
		start := strings.LastIndexByte(rest[:i], ',') + 1
		out.WriteString(afterLastAt(rest[:start]))
		scheme, body := rest[start:i], rest[i+len("://"):]
		// This URL ends before the scheme of the next one, if a comma
		// comes before that; else at the end (a URL in its query, say).
		end := len(body)
		if j := strings.Index(body, "://"); j >= 0 {
			if k := strings.LastIndexByte(body[:j], ','); k >= 0 {
				end = k + 1
			}
		}
		_, after, _ := cutUserinfo(scheme, body[:end])
		out.WriteString(scheme + "://" + after)
		rest = body[end:]
	}
}

// SplitUserinfo splits the user information off one URL
// (scheme://user:password@host...) before anything parses it, and returns
// the URL without it, and the user and the password, percent-decoded
// where they are validly encoded. ok reports whether the URL had user
// information; hasPassword whether it had a ":".
//
// Parsers end the user information at the first "/" after "://", so a
// password with an unencoded "/" (base64) would leave its tail in the
// host or path, to be quoted in their error messages. Here it ends at the
// last "@" of the URL, since a host holds none; for unix:// and unixs://
// URLs, whose socket path may hold one, at the first "@/". A URL whose
// authority is empty (scheme:///path) has none.
func SplitUserinfo(raw string) (stripped, user, password string, hasPassword, ok bool) {
	scheme, body, found := strings.Cut(raw, "://")
	if !found {
		return raw, "", "", false, false
	}
	info, after, ok := cutUserinfo(scheme, body)
	if !ok {
		return raw, "", "", false, false
	}
	user, password, hasPassword = strings.Cut(info, ":")
	return scheme + "://" + after, unescape(user), unescape(password), hasPassword, true
}

// cutUserinfo splits what follows "scheme://" by SplitUserinfo's rule.
func cutUserinfo(scheme, body string) (info, after string, ok bool) {
	if body == "" || body[0] == '/' {
		return "", body, false
	}
	at := strings.LastIndexByte(body, '@')
	if scheme == "unix" || scheme == "unixs" {
		at = strings.Index(body, "@/")
	}
	if at < 0 {
		return "", body, false
	}
	return body[:at], body[at+1:], true
}

// afterLastAt drops all up to the last "@" of addresses without a scheme.
func afterLastAt(s string) string {
	if i := strings.LastIndexByte(s, '@'); i >= 0 {
		return s[i+1:]
	}
	return s
}

func unescape(s string) string {
	if u, err := url.PathUnescape(s); err == nil {
		return u
	}
	return s
}
