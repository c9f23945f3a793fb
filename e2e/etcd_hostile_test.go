//go:build linux

package e2e

import (
	"bytes"
	"errors"
	"net"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// rawCodec passes messages through as bytes, so that the fake server can
// answer with messages no etcd would build (and that would take gigabytes
// to build as Go values).
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// hostileEtcd is a gRPC server on etcd's methods that grants leases as
// etcd does and answers every read (Range, and the reads in a Txn) with
// rangeResp, which it builds as it likes. Every other method is
// unimplemented. It returns the endpoint.
func hostileEtcd(t *testing.T, rangeResp []byte) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	header := mustMarshal(t, &pb.ResponseHeader{ClusterId: 1, MemberId: 1, Revision: 2, RaftTerm: 1})
	answers := map[string][]byte{
		"/etcdserverpb.Lease/LeaseGrant":     mustMarshal(t, &pb.LeaseGrantResponse{Header: &pb.ResponseHeader{Revision: 1}, ID: 7, TTL: 15}),
		"/etcdserverpb.Lease/LeaseRevoke":    mustMarshal(t, &pb.LeaseRevokeResponse{Header: &pb.ResponseHeader{Revision: 3}}),
		"/etcdserverpb.Lease/LeaseKeepAlive": mustMarshal(t, &pb.LeaseKeepAliveResponse{ID: 7, TTL: 15}),
		"/etcdserverpb.KV/Range":             rangeResp,
		// TxnResponse{header, succeeded, responses: [put, range]}: the
		// campaign's transaction, whose second result is a read.
		"/etcdserverpb.KV/Txn": bytes.Join([][]byte{
			protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), header),
			protowire.AppendVarint(protowire.AppendTag(nil, 2, protowire.VarintType), 1),
			protowire.AppendBytes(protowire.AppendTag(nil, 3, protowire.BytesType),
				protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), nil)),
			protowire.AppendBytes(protowire.AppendTag(nil, 3, protowire.BytesType),
				protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), rangeResp)),
		}, nil),
	}
	srv := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}), grpc.UnknownServiceHandler(func(_ any, stream grpc.ServerStream) error {
		method, _ := grpc.MethodFromServerStream(stream)
		answer, ok := answers[method]
		if !ok {
			return status.Errorf(codes.Unimplemented, "%s: not here", method)
		}
		for {
			var req []byte
			if err := stream.RecvMsg(&req); err != nil {
				return nil
			}
			if err := stream.SendMsg(&answer); err != nil {
				return nil
			}
			if !strings.HasSuffix(method, "KeepAlive") {
				return nil
			}
		}
	}))
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return "http://" + lis.Addr().String()
}

func mustMarshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// emptyKeyValues is a RangeResponse of n bytes made of empty key-values
// (2 bytes each on the wire).
func emptyKeyValues(n int) []byte {
	b := make([]byte, 0, n)
	for len(b)+2 <= n {
		b = protowire.AppendBytes(protowire.AppendTag(b, 2, protowire.BytesType), nil)
	}
	return b
}

// TestEtcdHostileStore: a server that answers reads with 16 MiB of empty
// key-values (which would decode into more than a gigabyte), or with one
// value of 16 MiB, gets an error: leaderrun exits 69 within 15 s, in every
// mode that reads, and its peak RSS stays under 64 MiB. An answer of
// empty key-values just under the receive limit, which is decoded, keeps
// it under 64 MiB too.
func TestEtcdHostileStore(t *testing.T) {
	t.Parallel()
	const (
		maxRSS  = 64 << 10 // KiB
		maxTime = 15 * time.Second
	)
	hugeValue := protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType),
		protowire.AppendBytes(protowire.AppendTag(protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), []byte("k")),
			5, protowire.BytesType), bytes.Repeat([]byte("v"), 16<<20)))
	for _, tc := range []struct {
		name   string
		answer []byte
		code   int // 0: any exit of leaderrun's own (not a crash)
	}{
		{"EmptyKeyValues16MiB", emptyKeyValues(16 << 20), 69},
		{"OneValue16MiB", hugeValue, 69},
		// Just under the receive limit (128 KiB, backends/etcd): decoded.
		{"EmptyKeyValuesUnderTheLimit", emptyKeyValues(127 << 10), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ep := hostileEtcd(t, tc.answer)
			for _, mode := range []struct {
				name string
				args []string
			}{
				{"run", []string{"--lock", "hostile", "--etcd-endpoints", ep, "--", "/bin/true"}},
				{"try", []string{"--try", "--lock", "hostile", "--etcd-endpoints", ep, "--", "/bin/true"}},
				{"status", []string{"status", "--lock", "hostile", "--etcd-endpoints", ep}},
				{"history", []string{"history", "--lock", "hostile", "--etcd-endpoints", ep}},
			} {
				code, took, rss, out := runMeasured(t, mode.args...)
				t.Logf("%s: exit %d after %v, peak RSS %.1f MiB: %s", mode.name, code, took.Round(time.Millisecond),
					float64(rss)/1024, finalLine(out))
				if tc.code != 0 && code != tc.code {
					t.Errorf("exit %d, want %d", code, tc.code)
				}
				if tc.code == 0 && strings.Contains(out, "larger than max") {
					t.Errorf("the answer under the limit was refused: %s", finalLine(out))
				}
				if code == 2 || code >= 128 || code < 0 {
					t.Errorf("exit %d: leaderrun crashed:\n%s", code, out)
				}
				if took > maxTime {
					t.Errorf("took %v, want within %v", took, maxTime)
				}
				if rss >= maxRSS {
					t.Errorf("peak RSS %d KiB, want under %d KiB", rss, maxRSS)
				}
			}
		})
	}
}

// runMeasured runs leaderrun to the end (at most a minute) and returns its
// exit code, how long it ran, its peak RSS in KiB and its output.
//
// The peak is VmHWM read when leaderrun is about to exit (it runs traced,
// and stops there): the rusage that wait4 returns would not do, since the
// kernel records in it, at exec, the high-water mark of the memory the
// process had before: the test binary's, which Go's vfork shares.
func runMeasured(t *testing.T, args ...string) (code int, took time.Duration, hwm int, out string) {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Every ptrace request must come from the thread that started the
	// traced process.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	began := time.Now()
	p, err := os.StartProcess(testenv.Leaderrun(t), append([]string{"leaderrun"}, args...), &os.ProcAttr{
		Files: []*os.File{nil, f, f},
		Sys:   &syscall.SysProcAttr{Ptrace: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	pid := p.Pid
	timer := time.AfterFunc(time.Minute, func() { syscall.Kill(pid, syscall.SIGKILL) })
	defer timer.Stop()
	var ws syscall.WaitStatus
	for first := true; ; first = false {
		if _, err := syscall.Wait4(pid, &ws, 0, nil); err != nil {
			t.Fatalf("wait for leaderrun: %v", err)
		}
		if ws.Exited() || ws.Signaled() {
			break
		}
		sig := 0
		switch {
		case first:
			// Stopped at its exec: stop it again at its exit.
			if err := syscall.PtraceSetOptions(pid, syscall.PTRACE_O_TRACEEXIT); err != nil {
				t.Fatalf("ptrace: %v", err)
			}
		case ws.TrapCause() == syscall.PTRACE_EVENT_EXIT:
			if hwm, _, err = testenv.Memory(pid); err != nil {
				t.Fatalf("read leaderrun's memory at its exit: %v", err)
			}
		default:
			// A signal for leaderrun (the Go runtime's own, among
			// others): deliver it.
			sig = int(ws.StopSignal())
		}
		// ESRCH: it is gone (killed) before it could be continued;
		// the next Wait4 reaps it and says how it ended.
		if err := syscall.PtraceCont(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			t.Fatalf("ptrace: %v", err)
		}
	}
	took = time.Since(began)
	code = ws.ExitStatus()
	if ws.Signaled() {
		code = 128 + int(ws.Signal())
	}
	data, _ := os.ReadFile(f.Name())
	return code, took, hwm, string(data)
}

// finalLine is the last line of s: leaderrun's error, if it failed.
func finalLine(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndexByte(s, '\n')+1:]
}
