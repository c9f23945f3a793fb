package backends_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/backends"
)

// memStore is a record store in memory whose failures a test decides: an
// outage or a refusal cannot be had on demand from a real store inside a
// unit test (the e2e tests stop real servers). It has no clock (NoClock)
// and no follower, like DynamoDB: the driver polls it and times it.
type memStore struct {
	mu      sync.Mutex
	rec     backends.Record // the one lock's record
	version int
	token   uint64
	docs    map[string]backends.Doc
	// fail, if set, is asked before every request; its error is the
	// request's.
	fail     func(op string) error
	gets     int
	lostTake bool // the next Take writes, then answers with an outage
}

func (s *memStore) Name() string                { return "mem" }
func (s *memStore) Lock(string) backends.Lock   { return &memLock{s} }
func (s *memStore) Close() error                { return nil }
func (s *memStore) set(f func(op string) error) { s.mu.Lock(); s.fail = f; s.mu.Unlock() }
func (s *memStore) record() backends.Record     { s.mu.Lock(); defer s.mu.Unlock(); return s.rec }
func outage(string) error                       { return fmt.Errorf("mem: connection refused: %w", backends.ErrUnavailable) }
func refusal(string) error {
	return fmt.Errorf("mem: 403: %w: %w", backends.ErrUnavailable, backends.ErrRefused)
}
func (s *memStore) hold(holder string, ttl time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.token++
	s.version++
	s.rec = backends.Record{Holder: holder, Owner: "other", Token: s.token, TTL: ttl, Left: backends.NoClock,
		Version: fmt.Sprint(s.version), Renewed: time.Now()}
}

type memLock struct{ s *memStore }

func (l *memLock) Key() string { return "mem/lock" }

// do runs a request: the failure the test decides, or f under the lock.
func (l *memLock) do(op string, f func() error) error {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if l.s.fail != nil {
		if err := l.s.fail(op); err != nil {
			return err
		}
	}
	return f()
}

func (l *memLock) Get(context.Context) (backends.Record, error) {
	var rec backends.Record
	err := l.do("get", func() error { l.s.gets++; rec = l.s.rec; return nil })
	if rec.Version == "" {
		rec.Left = backends.NoClock
	}
	return rec, err
}

func (l *memLock) Take(_ context.Context, prev backends.Record, c backends.Claim) (backends.Record, error) {
	var rec backends.Record
	err := l.do("take", func() error {
		if l.s.rec.Version != prev.Version {
			return backends.ErrConflict
		}
		l.s.token++
		l.s.version++
		rec = backends.Record{Holder: c.Identity, Owner: c.Owner, Token: l.s.token, TTL: c.Timings.LeaseDuration,
			Left: backends.NoClock, Version: fmt.Sprint(l.s.version), Renewed: time.Now()}
		l.s.rec = rec
		if l.s.lostTake {
			l.s.lostTake = false
			return fmt.Errorf("mem: no answer: %w", backends.ErrUnavailable)
		}
		return nil
	})
	return rec, err
}

func (l *memLock) Keep(_ context.Context, held backends.Record) (backends.Record, error) {
	err := l.do("keep", func() error {
		if l.s.rec.Owner != held.Owner || l.s.rec.Token != held.Token {
			return backends.ErrLeaseLost
		}
		l.s.version++
		held.Version = fmt.Sprint(l.s.version)
		l.s.rec = held
		return nil
	})
	return held, err
}

func (l *memLock) Free(_ context.Context, held backends.Record) error {
	return l.do("free", func() error {
		if l.s.rec.Owner == held.Owner && l.s.rec.Token == held.Token {
			l.s.version++
			l.s.rec = backends.Record{Token: held.Token, Left: backends.NoClock, Version: fmt.Sprint(l.s.version)}
		}
		return nil
	})
}

func (l *memLock) ReadDoc(_ context.Context, name string) (backends.Doc, error) {
	var d backends.Doc
	err := l.do("read", func() error { d = l.s.docs[name]; d.Name = name; return nil })
	return d, err
}

func (l *memLock) WriteDoc(_ context.Context, d backends.Doc) error {
	return l.do("write", func() error {
		if l.s.docs[d.Name].Version != d.Version {
			return backends.ErrConflict
		}
		if l.s.docs == nil {
			l.s.docs = map[string]backends.Doc{}
		}
		d.Version = fmt.Sprint(time.Now().UnixNano())
		l.s.docs[d.Name] = d
		return nil
	})
}

func (l *memLock) WriteDocHeld(ctx context.Context, d backends.Doc, held backends.Record) error {
	if r := l.s.record(); r.Owner != held.Owner || r.Token != held.Token {
		return backends.ErrLeaseLost
	}
	return l.WriteDoc(ctx, d)
}

func (l *memLock) Follow(context.Context, backends.Claim, *backends.Record) (backends.Follower, error) {
	return nil, nil
}

// timings of the tests: a lease of 400 ms, polled every 20 ms.
var timings = backends.Timings{LeaseDuration: 400 * time.Millisecond, RenewDeadline: 200 * time.Millisecond,
	RetryPeriod: 20 * time.Millisecond, KillGrace: 100 * time.Millisecond}

func candidate(id string) backends.Candidate {
	return backends.Candidate{Identity: id, Timings: timings, Log: slog.New(slog.DiscardHandler)}
}

// TestOutages: what a campaign ends with when the store fails: a store
// that comes back during --wait is retried and the lock won; a store that
// never answered ends the wait with ErrUnavailable (exit 69); one that
// answered that the lock was held ends it with ErrLocked (exit 75), even
// if it failed afterwards; --try gives up at once; a refusal is final in
// every mode.
func TestOutages(t *testing.T) {
	for _, tc := range []struct {
		name    string
		try     bool
		wait    time.Duration
		held    bool                                 // another holds the lock, and renews it
		fail    func(s *memStore) func(string) error // the store's failures
		want    error                                // nil: the lock is won
		atLeast time.Duration                        // the campaign lasts at least this long
	}{
		{name: "outage that passes during the wait", wait: 5 * time.Second,
			fail: func(s *memStore) func(string) error { return failFirst(s, 5) }},
		{name: "outage past the wait", wait: 300 * time.Millisecond, want: backends.ErrUnavailable, atLeast: 300 * time.Millisecond,
			fail: func(*memStore) func(string) error { return outage }},
		{name: "held, then an outage, past the wait", wait: 300 * time.Millisecond, held: true, want: backends.ErrLocked,
			atLeast: 300 * time.Millisecond, fail: func(s *memStore) func(string) error { return failAfter(s, 2) }},
		{name: "try on an outage", try: true, want: backends.ErrUnavailable,
			fail: func(*memStore) func(string) error { return outage }},
		{name: "try on a held lock", try: true, held: true, want: backends.ErrLocked},
		{name: "refusal while waiting", want: backends.ErrRefused,
			fail: func(*memStore) func(string) error { return refusal }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &memStore{}
			if tc.held {
				s.hold("other", time.Hour)
			}
			if tc.fail != nil {
				s.set(tc.fail(s))
			}
			c := candidate("me")
			c.Try, c.Wait = tc.try, tc.wait
			start := time.Now()
			l, err := backends.Campaign(context.Background(), s, "lock", c)
			took := time.Since(start)
			switch {
			case tc.want == nil && err != nil:
				t.Fatalf("campaign: %v, want the lock", err)
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Fatalf("campaign: %v (%v), want %v", err, l, tc.want)
			case took < tc.atLeast:
				t.Errorf("gave up after %v, want at least %v", took, tc.atLeast)
			case tc.try && took > 100*time.Millisecond:
				t.Errorf("--try took %v, want at once", took)
			}
			t.Logf("after %v: %v", took.Round(time.Millisecond), err)
		})
	}
}

// failFirst fails the first n requests to s with an outage.
func failFirst(s *memStore, n int) func(string) error {
	seen := 0
	return func(string) error {
		if seen++; seen <= n {
			return outage("")
		}
		return nil
	}
}

// failAfter answers the first n requests to s, then fails every one.
func failAfter(s *memStore, n int) func(string) error {
	seen := 0
	return func(string) error {
		if seen++; seen > n {
			return outage("")
		}
		return nil
	}
}

// TestFailureLoggedOncePerChange: a store that keeps failing the same way
// is one warning, not one per attempt; another failure is another.
func TestFailureLoggedOncePerChange(t *testing.T) {
	var buf bytes.Buffer
	s := &memStore{}
	n := 0
	s.set(func(string) error {
		n++
		switch {
		case n <= 6:
			return fmt.Errorf("mem: connection refused: %w", backends.ErrUnavailable)
		case n <= 10:
			return fmt.Errorf("mem: timeout: %w", backends.ErrUnavailable)
		}
		return nil
	})
	c := candidate("me")
	c.Log = slog.New(slog.NewTextHandler(&buf, nil))
	l, err := backends.Campaign(context.Background(), s, "lock", c)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.Background(), nil)
	lines := strings.Count(buf.String(), "store failed; retrying")
	if lines != 2 || !strings.Contains(buf.String(), "connection refused") || !strings.Contains(buf.String(), "timeout") {
		t.Errorf("%d warnings for 10 failures of two kinds, want 2:\n%s", lines, buf.String())
	}
}

// TestObservedRecordTimed: a record of a store without a clock is taken
// over only once it has not changed for its lease duration on the
// candidate's own clock, counted from when it was seen to change; a
// holder that renews keeps it.
func TestObservedRecordTimed(t *testing.T) {
	s := &memStore{}
	s.hold("other", 300*time.Millisecond)
	done := make(chan *backends.Lease, 1)
	start := time.Now()
	go func() {
		l, err := backends.Campaign(context.Background(), s, "lock", candidate("me"))
		if err != nil {
			t.Error(err)
		}
		done <- l
	}()
	// The holder renews for 600 ms, twice its lease, and then dies.
	var lastRenewal time.Time
	for range 6 {
		select {
		case <-done:
			t.Fatal("taken over while the holder renewed")
		case <-time.After(100 * time.Millisecond):
		}
		s.mu.Lock()
		s.version++
		s.rec.Version = fmt.Sprint(s.version)
		s.mu.Unlock()
		lastRenewal = time.Now()
	}
	l := <-done
	if l == nil {
		return
	}
	defer l.Release(context.Background(), nil)
	if gap := time.Since(lastRenewal); gap < 300*time.Millisecond {
		t.Errorf("taken over %v after the holder's last renewal, less than its lease (300ms)", gap)
	}
	t.Logf("taken over %v after the campaign began", time.Since(start).Round(time.Millisecond))
}

// TestLostAnswerWithdrawn: a grant whose answer was lost, but which went
// through, is freed when the campaign is cancelled before it learnt so.
func TestLostAnswerWithdrawn(t *testing.T) {
	s := &memStore{lostTake: true}
	gets := 0
	ctx, cancel := context.WithCancel(context.Background())
	s.set(func(op string) error {
		if op == "get" {
			if gets++; gets == 2 {
				cancel() // cancelled before the candidate looks again
				return outage("")
			}
		}
		return nil
	})
	_, err := backends.Campaign(ctx, s, "lock", candidate("me"))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("campaign: %v, want cancelled", err)
	}
	if r := s.record(); r.Holder != "" {
		t.Errorf("after the cancelled campaign the lock is held by %q: the lost grant was not freed", r.Holder)
	}
}
