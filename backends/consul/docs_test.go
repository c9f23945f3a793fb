package consul_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/backendtest"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

// TestConsulDocuments: a lock's history and markers are the keys
// <key>:history and <key>:markers; the keys an older release wrote
// (<key>:history/<token>, <key>:done/<once-key>) are not read; a write
// conditioned on a version that moved is ErrConflict; a document larger
// than backends.MaxDoc is refused, not read.
func TestConsulDocuments(t *testing.T) {
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	op := admin(t, agent.Addr())
	b := newBackend(t, agent.Addr(), "docs", 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, p := range []*api.KVPair{
		{Key: b.Key() + ":history/00000000000000000001", Value: []byte(`{"identity":"old","token":1,"end":"exited"}`)},
		{Key: b.Key() + ":done/k-old", Value: []byte(`{"key":"k-old","identity":"old","token":1,"expires":"2999-01-01T00:00:00Z"}`)},
	} {
		if _, err := op.KV().Put(p, nil); err != nil {
			t.Fatal(err)
		}
	}
	l := campaign(t, b, "a")
	now := time.Now()
	if err := l.Complete(ctx, backends.Marker{Key: "k1", Identity: "a", Token: l.Token(), At: now, Expires: now.Add(time.Hour)}); err != nil {
		t.Fatalf("complete: %v", err)
	}
	backendtest.ReleaseTerm(t, l, &backends.Term{Identity: "a", Token: l.Token(), Acquired: now, Ended: now, End: backends.EndExited})
	for name, want := range map[string]string{"history": `"token":` + strconv.FormatUint(l.Token(), 10), "markers": `"key":"k1"`} {
		pair, _, err := op.KV().Get(b.Key()+":"+name, nil)
		if err != nil || pair == nil || !strings.Contains(string(pair.Value), want) {
			t.Errorf("%s:%s = %+v, %v; want a document holding %s", b.Key(), name, pair, err, want)
		}
	}
	terms, err := backends.ReadHistory(ctx, b.s, b.name, 0)
	if err != nil || len(terms) != 1 || terms[0].Token != l.Token() {
		t.Errorf("history %+v, %v: want the one term of this release, not the older release's", terms, err)
	}
	if m, err := backends.ReadMarker(ctx, b.s, b.name, "k-old"); err != nil || m != nil {
		t.Errorf("the older release's marker reads as %+v, %v; want none", m, err)
	}

	lk := b.s.Lock(b.name)
	d, err := lk.ReadDoc(ctx, backends.DocMarkers)
	if err != nil || d.Version == nil {
		t.Fatalf("read markers: %+v, %v", d, err)
	}
	if _, err := op.KV().Put(&api.KVPair{Key: b.Key() + ":markers", Value: []byte("[]")}, nil); err != nil {
		t.Fatal(err)
	}
	if err := lk.WriteDoc(ctx, d); !errors.Is(err, backends.ErrConflict) {
		t.Errorf("a write on a version that moved: %v, want ErrConflict", err)
	}
	if err := lk.WriteDoc(ctx, backends.Doc{Name: "fresh", Data: []byte("x")}); err != nil {
		t.Errorf("a write of a document that does not exist yet: %v", err)
	}
	if err := lk.WriteDoc(ctx, backends.Doc{Name: "fresh", Data: []byte("y")}); !errors.Is(err, backends.ErrConflict) {
		t.Errorf("a write of a new document that exists meanwhile: %v, want ErrConflict", err)
	}

	if _, err := op.KV().Put(&api.KVPair{Key: b.Key() + ":history", Value: make([]byte, backends.MaxDoc+1)}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := lk.ReadDoc(ctx, backends.DocHistory); !errors.Is(err, backends.ErrRefused) {
		t.Errorf("a document of MaxDoc+1 bytes: %v, want ErrRefused", err)
	}
}

// TestConsulHostileAgent: an agent that answers without end, answers with
// a redirect, or fails, gets an error, never our memory or our token. An
// endless answer and a redirect are refusals (final in every mode), a
// server error is not; the listener redirected to hears nothing.
func TestConsulHostileAgent(t *testing.T) {
	const secret = "hostile-secret-token"
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { elsewhere.Add(1) }))
	t.Cleanup(other.Close)
	cases := []struct {
		name    string
		handler http.HandlerFunc
		refused bool
		want    string
	}{
		{name: "endless answer", refused: true, want: "longer than", handler: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Consul-Index", "1")
			chunk := []byte("[" + strings.Repeat(" ", 64<<10))
			for r.Context().Err() == nil {
				if _, err := w.Write(chunk); err != nil {
					return
				}
				chunk = chunk[1:]
			}
		}},
		{name: "redirect", refused: true, want: "redirect", handler: func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, other.URL+r.URL.Path, http.StatusTemporaryRedirect)
		}},
		{name: "server error", want: "500", handler: func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "no cluster leader", http.StatusInternalServerError)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.handler)
			t.Cleanup(srv.Close)
			b := &tlock{s: openStore(t, strings.TrimPrefix(srv.URL, "http://"), secret, 0), name: "x"}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, serr := b.Status(ctx)
			_, cerr := b.Campaign(ctx, campaignOptions{Identity: "a", Try: true, LeaseDuration: ttl})
			for _, err := range []error{serr, cerr} {
				t.Logf("%v", err)
				switch {
				case !errors.Is(err, backends.ErrUnavailable) || errors.Is(err, backends.ErrRefused) != tc.refused:
					t.Errorf("got %v, want ErrUnavailable, refused %v", err, tc.refused)
				case !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), secret):
					t.Errorf("%v: want it to say %q, and never the token", err, tc.want)
				}
			}
			if ctx.Err() != nil {
				t.Error("the requests took their whole deadline")
			}
		})
	}
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("the listener redirected to got %d requests", n)
	}
}
