package etcd

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// zapLogger is a logger for the etcd client that passes its warnings and
// errors to log, one line each, with the client's fields as attributes.
// Without it, the client would write to stderr in zap's format. gRPC's
// own logger is left as it is (docs/backends/etcd.md).
func zapLogger(log *slog.Logger) *zap.Logger {
	return zap.New(&slogCore{h: log.Handler().WithAttrs([]slog.Attr{slog.String("component", "etcd-client")})})
}

// slogCore is a zapcore.Core that writes to a slog.Handler.
type slogCore struct{ h slog.Handler }

func (c *slogCore) Enabled(l zapcore.Level) bool {
	return l >= zapcore.WarnLevel && c.h.Enabled(context.Background(), slogLevel(l))
}

func (c *slogCore) With(fields []zapcore.Field) zapcore.Core {
	return &slogCore{h: c.h.WithAttrs(attrs(fields))}
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	if ownDeadline(fields) {
		return nil
	}
	r := slog.NewRecord(e.Time, slogLevel(e.Level), e.Message, 0)
	r.AddAttrs(attrs(fields)...)
	return c.h.Handle(context.Background(), r)
}

func (c *slogCore) Sync() error { return nil }

// ownDeadline reports whether the entry is about a request that ended
// because its context did (the client warns of every such attempt):
// leaderrun reports that failure once, where it handles it.
func ownDeadline(fields []zapcore.Field) bool {
	for _, f := range fields {
		if err, ok := f.Interface.(error); ok && f.Type == zapcore.ErrorType {
			if c := status.Code(err); c == codes.DeadlineExceeded || c == codes.Canceled ||
				errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
				return true
			}
		}
	}
	return false
}

func slogLevel(l zapcore.Level) slog.Level {
	if l >= zapcore.ErrorLevel {
		return slog.LevelError
	}
	return slog.LevelWarn
}

// attrs turns zap's fields into slog attributes, sorted by key.
func attrs(fields []zapcore.Field) []slog.Attr {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fields {
		f.AddTo(enc)
	}
	keys := slices.Sorted(maps.Keys(enc.Fields))
	as := make([]slog.Attr, len(keys))
	for i, k := range keys {
		as[i] = slog.Any(k, enc.Fields[k])
	}
	return as
}
