package watchdog

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// The watchdog's log follows leaderrun's: the format of log/slog's text or
// JSON handler, and its level. It is written by hand (log/slog may not be
// imported: see doc.go); log_test.go holds it to slog's output.

// The levels the watchdog logs at, as log/slog numbers them.
const (
	levelInfo  = 0
	levelWarn  = 4
	levelError = 8
)

// logger writes log lines to stderr, each with one write.
type logger struct {
	json  bool
	level int
	attrs []byte // the attributes every line carries, formatted
	now   func() time.Time
}

// newLogger is the watchdog's log, in slog's JSON format or its text
// format, at level (an slog.Level): until the start tells it leaderrun's,
// text at ERROR.
func newLogger(json bool, level int) *logger {
	return &logger{json: json, level: level, now: time.Now}
}

// with returns a logger whose lines carry kv (key, value, ...) too.
func (l *logger) with(kv ...any) *logger {
	c := *l
	c.attrs = l.appendAttrs(append([]byte(nil), l.attrs...), kv)
	return &c
}

func (l *logger) Info(msg string, kv ...any)  { l.log(levelInfo, msg, kv) }
func (l *logger) Warn(msg string, kv ...any)  { l.log(levelWarn, msg, kv) }
func (l *logger) Error(msg string, kv ...any) { l.log(levelError, msg, kv) }

func (l *logger) log(level int, msg string, kv []any) {
	if level < l.level {
		return
	}
	t := l.now()
	var b []byte
	if l.json {
		b = append(b, `{"time":"`...)
		b = t.AppendFormat(b, time.RFC3339Nano)
		b = append(b, `","level":"`...)
		b = append(b, levelName(level)...)
		b = append(b, `","msg":`...)
		b = l.appendString(b, msg)
	} else {
		b = append(b, "time="...)
		b = appendRFC3339Millis(b, t)
		b = append(b, " level="...)
		b = append(b, levelName(level)...)
		b = append(b, " msg="...)
		b = l.appendString(b, msg)
	}
	b = append(b, l.attrs...)
	b = l.appendAttrs(b, kv)
	if l.json {
		b = append(b, '}')
	}
	_, _ = os.Stderr.Write(append(b, '\n'))
}

// appendAttrs appends kv as slog's handler would: for text ` key=value`,
// for JSON `,"key":value`.
func (l *logger) appendAttrs(b []byte, kv []any) []byte {
	for i := 0; i+1 < len(kv); i += 2 {
		key, _ := kv[i].(string)
		if l.json {
			b = append(b, ',')
			b = l.appendString(b, key)
			b = append(b, ':')
		} else {
			b = append(b, ' ')
			b = l.appendString(b, key)
			b = append(b, '=')
		}
		b = l.appendValue(b, kv[i+1])
	}
	return b
}

// appendValue appends v as slog's handler would: strings and errors as
// strings, durations as slog writes them, the rest as JSON (ints, []int)
// or as fmt's %+v.
func (l *logger) appendValue(b []byte, v any) []byte {
	switch v := v.(type) {
	case string:
		return l.appendString(b, v)
	case time.Duration:
		if l.json {
			return strconv.AppendInt(b, int64(v), 10)
		}
		return append(b, v.String()...)
	case error:
		if l.json {
			return l.appendString(b, v.Error())
		}
	}
	if l.json {
		j, _ := json.Marshal(v)
		return append(b, j...)
	}
	return l.appendString(b, fmt.Sprintf("%+v", v))
}

// appendString appends s: for JSON quoted and escaped, for text quoted
// (strconv.Quote) only where it needs to be.
func (l *logger) appendString(b []byte, s string) []byte {
	if l.json {
		return appendJSONString(b, s)
	}
	if needsQuoting(s) {
		return strconv.AppendQuote(b, s)
	}
	return append(b, s...)
}

// safe reports whether b, an ASCII byte, stands in a JSON string as it is.
func safe(b byte) bool { return b >= 0x20 && b != '"' && b != '\\' }

// needsQuoting is slog's text handler's rule: empty, a space, '=', a byte
// a JSON string would escape (but a backslash), or a rune that is a space,
// not printable, or not valid UTF-8.
func needsQuoting(s string) bool {
	if s == "" {
		return true
	}
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c != '\\' && (c == ' ' || c == '=' || !safe(c)) {
				return true
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError || unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return true
		}
		i += size
	}
	return false
}

// appendJSONString appends s as slog's JSON handler quotes a string.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			i++
			switch {
			case safe(c):
				b = append(b, c)
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c == '\n':
				b = append(b, `\n`...)
			case c == '\r':
				b = append(b, `\r`...)
			case c == '\t':
				b = append(b, `\t`...)
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, `\u202`...)
			b = append(b, hex[r&0xf])
		default:
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}

// appendRFC3339Millis appends t as slog's text handler does: RFC 3339
// with exactly three digits of milliseconds.
func appendRFC3339Millis(b []byte, t time.Time) []byte {
	const prefixLen = len("2006-01-02T15:04:05.000")
	n := len(b)
	t = t.Truncate(time.Millisecond).Add(time.Millisecond / 10)
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b[:n+prefixLen], b[n+prefixLen+1:]...) // drop the 4th digit
}

// levelName is slog's name of a level the watchdog logs at.
func levelName(level int) string {
	return map[int]string{levelInfo: "INFO", levelWarn: "WARN", levelError: "ERROR"}[level]
}

// logAttrs are the log attributes that leaderrun's own lines carry,
// taken from the command's environment (see runner.childEnv).
func logAttrs(env []string) []any {
	var attrs []any
	for _, kv := range env {
		name, value, _ := strings.Cut(kv, "=")
		switch name {
		case "LEADERRUN_LOCK":
			attrs = append(attrs, "lock", value)
		case "LEADERRUN_IDENTITY":
			attrs = append(attrs, "identity", value)
		case "LEADERRUN_BACKEND":
			attrs = append(attrs, "backend", value)
		case "FENCE_TOKEN":
			if t, err := strconv.ParseUint(value, 10, 64); err == nil {
				attrs = append(attrs, "token", t)
			}
		}
	}
	return attrs
}
