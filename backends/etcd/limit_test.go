package etcd

import (
	"bytes"
	"log/slog"
	"runtime"
	"strings"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/leaderrun/leaderrun/backends"
)

// decodedBudget is what one answer may cost once decoded: with the Go
// runtime and the rest of leaderrun (about 16 MiB resident), and the
// collector's slack (the heap may grow to twice what is live), the process
// stays under 64 MiB (e2e TestEtcdHostileStore measures it).
const decodedBudget = 16 << 20

// TestReceiveLimitBoundsMemory: an answer of recvLimit bytes made of the
// smallest elements of each message leaderrun reads (empty key-values,
// empty transaction results, events of an empty key-value) decodes into
// at most decodedBudget.
func TestReceiveLimitBoundsMemory(t *testing.T) {
	// An element repeated until the message is recvLimit bytes long.
	fill := func(field protowire.Number, elem []byte) []byte {
		var b []byte
		for len(b)+2+len(elem) <= recvLimit {
			b = protowire.AppendTag(b, field, protowire.BytesType)
			b = protowire.AppendBytes(b, elem)
		}
		return b
	}
	emptyKV := protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), nil) // Event{kv: {}}
	for _, tc := range []struct {
		name string
		msg  []byte
		into proto.Message
	}{
		{"range of empty key-values", fill(2, nil), &pb.RangeResponse{}},
		{"transaction of empty results", fill(3, nil), &pb.TxnResponse{}},
		{"watch events of empty key-values", fill(11, emptyKV), &pb.WatchResponse{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			if err := proto.Unmarshal(tc.msg, tc.into); err != nil {
				t.Fatal(err)
			}
			runtime.ReadMemStats(&after)
			used := after.TotalAlloc - before.TotalAlloc
			t.Logf("%d bytes on the wire decode into %d bytes (x%.0f)", len(tc.msg), used, float64(used)/float64(len(tc.msg)))
			if used > decodedBudget {
				t.Errorf("an answer of %d bytes decodes into %d bytes, over the %d budget: lower recvLimit",
					len(tc.msg), used, decodedBudget)
			}
			runtime.KeepAlive(tc.into)
		})
	}
}

// TestDocumentFits: the largest document leaderrun writes (the history,
// backends.MaxHistoryDoc) fits in one answer, under the longest key.
func TestDocumentFits(t *testing.T) {
	page := &pb.RangeResponse{Header: &pb.ResponseHeader{ClusterId: 1<<64 - 1, MemberId: 1<<64 - 1, Revision: 1<<63 - 1, RaftTerm: 1<<64 - 1},
		Count: 1, Kvs: []*mvccpb.KeyValue{{
			Key:            []byte(strings.Repeat("p", 512)), // a long --prefix, the longest lock
			Value:          bytes.Repeat([]byte{'x'}, backends.MaxHistoryDoc),
			CreateRevision: 1<<63 - 1, ModRevision: 1<<63 - 1, Version: 1<<63 - 1, Lease: 1<<63 - 1,
		}}}
	t.Logf("the largest document: %d bytes in an answer, limit %d", proto.Size(page), recvLimit)
	if n := proto.Size(page); n > recvLimit {
		t.Errorf("the largest document is %d bytes in an answer, over recvLimit (%d)", n, recvLimit)
	}
}

// TestClientLogRouted: the etcd client's warnings and errors become lines
// of leaderrun's log; its debug and info lines are dropped, and so are its
// warnings about requests that leaderrun's own deadline ended.
func TestClientLogRouted(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	zl := zapLogger(log.With("lock", "x")).With(zap.String("target", "etcd-endpoints://0x1/127.0.0.1:2379"))
	zl.Debug("backoff", zap.Uint("attempt", 1))
	zl.Info("set etcd endpoints by autoSync")
	zl.Warn("retrying of unary invoker failed", zap.String("method", "/etcdserverpb.KV/Range"), zap.Error(errBadAnswer))
	// An attempt that ended with leaderrun's own deadline: the caller
	// reports it, once.
	zl.Warn("retrying of unary invoker failed", zap.Error(status.Error(codes.DeadlineExceeded, "context deadline exceeded")))
	zl.Error("streamer failed to create ClientStream")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("logged %d lines, want the warning and the error:\n%s", len(lines), buf.String())
	}
	for _, want := range []string{"level=WARN", `msg="retrying of unary invoker failed"`, "lock=x", "component=etcd-client",
		"target=etcd-endpoints://0x1/127.0.0.1:2379", "method=/etcdserverpb.KV/Range", `error="etcd: malformed answer"`} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("warning line %q lacks %s", lines[0], want)
		}
	}
	if !strings.Contains(lines[1], "level=ERROR") {
		t.Errorf("error line %q is not at level ERROR", lines[1])
	}
}

func TestCheckEndpoints(t *testing.T) {
	for _, tc := range []struct {
		name  string
		eps   []string
		tlsOn bool
		ok    bool
	}{
		{"plain", []string{"http://a:1", "http://b:1", "unix:///run/etcd.sock", "c:1"}, false, true},
		{"tls", []string{"https://a:1", "unixs:///run/etcd.sock", "c:1", "unix:///run/x"}, true, true},
		{"https without files", []string{"https://a:1", "unixs://etcd.sock"}, false, true},
		{"unixs after http", []string{"http://a:1", "unixs:///run/etcd.sock"}, false, false},
		{"unixs after unix", []string{"unix:///run/a", "unixs:///run/etcd.sock"}, false, false},
		{"http after https", []string{"https://a:1", "http://b:1"}, true, false},
		{"bare after https without files", []string{"https://a:1", "b:1"}, false, false},
		{"http with tls files", []string{"http://a:1", "b:1"}, true, false},
		{"unixs: without slashes", []string{"unixs:etcd.sock", "https://a:1"}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckEndpoints(tc.eps, tc.tlsOn)
			if (err == nil) != tc.ok {
				t.Errorf("CheckEndpoints(%q, tls %v) = %v, want ok %v", tc.eps, tc.tlsOn, err, tc.ok)
			}
		})
	}
}
