package s3

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/s3/spec"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

// listen listens on a free loopback port until the test ends.
func listen(t *testing.T) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// hostile opens a store on a server that answers every request with h.
func hostile(t *testing.T, h http.HandlerFunc) *Store {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	s, err := Open(Config{Settings: spec.Settings{Bucket: "locks", Region: testenv.S3Region, Endpoint: srv.URL},
		Credentials: credentials.NewStaticCredentialsProvider("a", "b", "")})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestHostileServer: answers no S3 server gives are errors that end the
// campaign (a refusal), never our memory or an endless wait.
func TestHostileServer(t *testing.T) {
	big := strings.Repeat("x", 4<<20)
	for _, tc := range []struct {
		name string
		h    http.HandlerFunc
		want error
	}{
		{"4 MiB object with Content-Length", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("ETag", `"e"`)
			_, _ = io.WriteString(w, big)
		}, errTooLarge},
		{"4 MiB object chunked", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("ETag", `"e"`)
			w.(http.Flusher).Flush()
			_, _ = io.WriteString(w, big)
		}, errTooLarge},
		{"object just over what the store writes", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("ETag", `"e"`)
			_, _ = io.WriteString(w, `{"holder":"`+strings.Repeat("x", maxObject)+`"}`)
		}, errTooLarge},
		{"4 MiB error document", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusForbidden)
			_, _ = io.WriteString(w, "<Error><Code>"+big+"</Code></Error>")
		}, errTooLarge},
		{"object without an ETag", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, `{"holder":""}`)
		}, errNoETag},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := hostile(t, tc.h)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, err := backends.Campaign(ctx, s, "big", backends.Candidate{Identity: "a", Timings: timings(10*time.Second, testPoll)})
			if !errors.Is(err, tc.want) || !errors.Is(err, backends.ErrRefused) {
				t.Fatalf("campaign: %v; want a refusal wrapping %v", err, tc.want)
			}
		})
	}
}

// TestServerErrorsBounded: a server that answers 503 for ever is asked
// three times per request, and a --wait campaign goes on past them (they
// may pass); one that never answers is cut at the request's bound.
func TestServerErrorsBounded(t *testing.T) {
	var n atomic.Int32
	s := hostile(t, func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err := backends.ReadStatus(ctx, s, "x")
	if !errors.Is(err, backends.ErrUnavailable) || errors.Is(err, backends.ErrRefused) || n.Load() != 3 {
		t.Errorf("status on a server answering 503: %v after %d requests; want ErrUnavailable, not refused, after 3", err, n.Load())
	}
	t.Logf("503 for ever: %d requests, %v", n.Load(), time.Since(start))

	hung := make(chan struct{})
	s = hostile(t, func(w http.ResponseWriter, r *http.Request) { <-hung })
	t.Cleanup(func() { close(hung) }) // before the server's Close, which waits for its handlers
	start = time.Now()
	_, err = backends.ReadStatus(context.Background(), s, "x")
	if took := time.Since(start); !errors.Is(err, backends.ErrUnavailable) || took > requestTimeout+2*time.Second {
		t.Errorf("status on a server that never answers: %v after %v; want ErrUnavailable within %v", err, took, requestTimeout)
	}
}

// TestValidate: settings the store refuses before it sends anything.
func TestValidate(t *testing.T) {
	t.Setenv("AWS_REGION", "")
	t.Setenv("AWS_CONFIG_FILE", "/dev/null")
	t.Setenv("AWS_PROFILE", "")
	for _, tc := range []struct {
		name string
		cfg  spec.Settings
		want string
	}{
		{"no bucket", spec.Settings{Region: "eu-west-1"}, "bucket name"},
		{"upper-case bucket", spec.Settings{Bucket: "Locks", Region: "eu-west-1"}, "bucket name"},
		{"bucket ending in a dash", spec.Settings{Bucket: "locks-", Region: "eu-west-1"}, "bucket name"},
		{"prefix with ~", spec.Settings{Bucket: "locks", Region: "eu-west-1", Prefix: "a~b/"}, "prefix"},
		{"prefix with //", spec.Settings{Bucket: "locks", Region: "eu-west-1", Prefix: "a//"}, "prefix"},
		{"addressing", spec.Settings{Bucket: "locks", Region: "eu-west-1", Addressing: "dns"}, "addressing style"},
		{"no region", spec.Settings{Bucket: "locks"}, "--s3-region"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Open(Config{Settings: tc.cfg}); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Open(%+v): %v; want an error about %s", tc.cfg, err, tc.want)
			}
		})
	}
}

// TestAddressing: path-style for endpoints that are not AWS's, unless
// asked otherwise.
func TestAddressing(t *testing.T) {
	for _, tc := range []struct {
		style, endpoint string
		path            bool
	}{
		{"", "", false},
		{"auto", "http://127.0.0.1:9000", true},
		{"auto", "https://ACCOUNT.r2.cloudflarestorage.com", true},
		{"auto", "https://s3.eu-west-1.amazonaws.com", false},
		{"auto", "https://bucket.vpce-0a1b2c3d.s3.us-east-1.vpce.AMAZONAWS.com", false},
		{"path", "https://s3.eu-west-1.amazonaws.com", true},
		{"path", "", true},
		{"virtual", "http://minio.internal:9000", false},
	} {
		if got := pathStyle(tc.style, tc.endpoint); got != tc.path {
			t.Errorf("pathStyle(%q, %q) = %v, want %v", tc.style, tc.endpoint, got, tc.path)
		}
	}
	// The endpoint as the SDK resolves it from the environment decides
	// too.
	t.Setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9000")
	for style, want := range map[string]bool{"": true, "virtual": false} {
		s, err := Open(Config{Settings: spec.Settings{Bucket: "locks", Region: "eu-west-1", Addressing: style}})
		if err != nil {
			t.Fatal(err)
		}
		if got := s.api.Options().UsePathStyle; got != want || !strings.Contains(s.where, "http://127.0.0.1:9000") {
			t.Errorf("AWS_ENDPOINT_URL_S3, style %q: path-style %v at %s, want %v", style, got, s.where, want)
		}
	}
}
