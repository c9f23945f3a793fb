package cmd

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
)

// TestLogLinesOneLine: an error whose text holds line breaks (pgx lists
// each address it tried as "\n\t...") is logged on one line, without a
// literal \n\t, in text and in JSON.
func TestLogLinesOneLine(t *testing.T) {
	err := errors.New("failed to connect to `user=x`:\n\t127.0.0.1:1: dial error\n\t[::1]:1: dial error")
	for _, json := range []bool{false, true} {
		var buf bytes.Buffer
		var h slog.Handler = slog.NewTextHandler(&buf, logOptions(slog.LevelInfo))
		if json {
			h = slog.NewJSONHandler(&buf, logOptions(slog.LevelInfo))
		}
		slog.New(h).Error("leaderrun failed", "error", err, "lock", "x")
		out := buf.String()
		if strings.Count(out, "\n") != 1 || strings.Contains(out, `\n`) || strings.Contains(out, `\t`) ||
			!strings.Contains(out, "1: dial error; [::1]:1") {
			t.Errorf("json=%v: %q", json, out)
		}
	}
}
