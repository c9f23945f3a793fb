package azureblob

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	azlease "github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/lease"

	"github.com/leaderrun/leaderrun/backends"
)

// lease is a grant of the lock blob's lease. A goroutine started by
// newLease checks the lease whenever nothing has proved it for checkGap,
// and closes Lost when the service says it is gone; Release
// stops it and waits for it.
type lease struct {
	b        *Backend
	g        grant
	leaseID  string
	lc       *azlease.BlobClient
	acquired time.Time

	*backends.Loss                 // Lost and Err
	ctx            context.Context // ends when Release stops the checks
	stop           context.CancelFunc
	done           chan struct{}

	mu     sync.Mutex
	proved time.Time // send time of the latest request that proved the lease
	// renewing is the send time of a renewal awaiting its answer (zero:
	// none), which the checks wait for rather than read beside it.
	renewing time.Time
}

var _ backends.Lease = (*lease)(nil)

func newLease(c *candidate, g grant, acquired time.Time) *lease {
	ctx, stop := context.WithCancel(context.Background())
	l := &lease{
		b: c.b, g: g, leaseID: c.leaseID, lc: c.lc, acquired: acquired,
		Loss: backends.NewLoss(), ctx: ctx, stop: stop, done: make(chan struct{}),
		proved: acquired,
	}
	go l.watch()
	return l
}

func (l *lease) Token() uint64 { return l.g.token }

// TTL is the lease duration the service granted: Azure takes whole
// seconds, and the one asked was rounded up.
func (l *lease) TTL() time.Duration { return time.Duration(l.g.seconds) * time.Second }

func (l *lease) Acquired() time.Time { return l.acquired }

// Key is where the lock lives: container/blob.
func (l *lease) Key() string { return l.b.Key() }

func (l *lease) leaseCond() *blob.AccessConditions {
	return &blob.AccessConditions{LeaseAccessConditions: &blob.LeaseAccessConditions{LeaseID: &l.leaseID}}
}

// prove records that a request sent at sent found the lease ours.
func (l *lease) prove(sent time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if sent.After(l.proved) {
		l.proved = sent
	}
}

// provedAt is when the lease was last proved, or is being proved by a
// renewal under way.
func (l *lease) provedAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.renewing.After(l.proved) {
		return l.renewing
	}
	return l.proved
}

// renewal records a renewal sent at sent (zero: its answer came).
func (l *lease) renewal(sent time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.renewing = sent
}

// maxCheckGap bounds how long a lease goes without proof before it checks
// itself: S3 gives a loss 1 s (docs/safety.md). A check is sent
// maxCheckGap after the answer to the one before, so a loss is seen within
// maxCheckGap and two round trips: 1 s while a round trip takes 150 ms.
const maxCheckGap = 700 * time.Millisecond

// checkGap is how long a lease goes without proof before it checks
// itself: half a retry period, so that it checks once between two
// renewals, and at most maxCheckGap.
func checkGap(retry time.Duration) time.Duration { return min(retry/2, maxCheckGap) }

// watch checks the lease when nothing has proved it for checkGap, until
// it is lost or released. A renewal under way counts as a proof until its
// answer: a check beside it would ask the same question. If the renewal
// fails, the check comes checkGap after it was sent.
func (l *lease) watch() {
	defer close(l.done)
	every := checkGap(l.b.retry)
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-l.ctx.Done():
			return
		case <-t.C:
		}
		if wait := time.Until(l.provedAt().Add(every)); wait > 0 {
			t.Reset(wait)
			continue
		}
		if err := l.check(); err != nil {
			l.Set(err)
			return
		}
		// From the check's answer: a check then never falls on the
		// very moment a renewal is sent (renewals keep to the runner's
		// schedule; checks drift by a round trip each).
		t.Reset(every)
	}
}

// check reads the lock blob's properties with the lease id, which the
// service answers only while that lease is active, and returns why the
// answer shows the lease lost, or nil. A failed read returns nil: whether
// the service can still be reached is for renewals and the runner's
// deadline to judge.
func (l *lease) check() error {
	ctx, cancel := context.WithTimeout(l.ctx, requestTimeout)
	defer cancel()
	sent := time.Now()
	p, err := l.b.lockBlob.GetProperties(ctx, &blob.GetPropertiesOptions{AccessConditions: l.leaseCond()})
	switch {
	case has(err, blobOpLost...):
		return l.lostErr("a check", err)
	case err != nil:
		if l.ctx.Err() == nil {
			l.b.log.Debug("azureblob: could not check the lease", "token", l.g.token, "error", clean(err))
		}
		return nil
	case leaseStateOf(p) == breaking:
		return fmt.Errorf("azureblob: the lease on %s (token %d) is being broken: %w", l.b.Key(), l.g.token, backends.ErrLeaseLost)
	}
	l.prove(sent)
	return nil
}

// lostErr says that the service refused op on the lease with err.
func (l *lease) lostErr(op string, err error) error {
	return fmt.Errorf("azureblob: the service refused %s of the lease on %s (token %d): %w: %w",
		op, l.b.Key(), l.g.token, backends.ErrLeaseLost, clean(err))
}

// Renew implements backends.Lease with one renewal of the lease. Any
// refusal of it (the lease broken, released, taken, the blob deleted,
// and also credentials no longer accepted, which would let the lease
// expire) is a loss; no answer is not. A lease already known to be lost
// is not renewed.
func (l *lease) Renew(ctx context.Context) error {
	if err := l.Err(); err != nil {
		return err
	}
	sent := time.Now()
	l.renewal(sent)
	_, err := l.lc.RenewLease(ctx, nil)
	l.renewal(time.Time{})
	switch {
	case err == nil:
		l.prove(sent)
		return nil
	case refused(err):
		l.Set(l.lostErr("a renewal", err))
		return l.Err()
	}
	return fmt.Errorf("azureblob at %s: renew the lease on %s (token %d): %w", l.b.endpoint, l.b.blob, l.g.token, clean(err))
}

// Completed implements backends.Backend from a read of the lock blob.
func (b *Backend) Completed(ctx context.Context, key string) (*backends.Marker, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	d, err := read(ctx, b.lockBlob)
	if err != nil {
		return nil, fmt.Errorf("azureblob at %s: read the completion markers in %s: %w", b.endpoint, b.blob, clean(err))
	}
	now := time.Now()
	for _, m := range parseMarkers(d.body) {
		if m.Key == key && m.Expires.After(now) {
			return &m, nil
		}
	}
	return nil, nil
}

// Complete implements backends.Lease: the markers are written back into
// the lock blob's content with the lease id, which the service accepts
// only while this lease is active; the grant's metadata is written with
// them (a blob's write replaces its metadata).
func (l *lease) Complete(ctx context.Context, m backends.Marker) error {
	if err := l.Err(); err != nil {
		return err
	}
	d, err := read(ctx, l.b.lockBlob)
	if err == nil {
		body, _ := json.Marshal(markers{Markers: withMarker(parseMarkers(d.body), m, time.Now())})
		err = upload(ctx, l.b.lockBlob, d, body, l.g.metadata(), l.leaseID)
	}
	switch {
	case has(err, blobOpLost...):
		l.Set(l.lostErr("the completion marker "+m.Key, err))
		return l.Err()
	case err != nil:
		return fmt.Errorf("azureblob at %s: write the completion marker %q in %s: %w", l.b.endpoint, m.Key, l.b.blob, clean(err))
	}
	return nil
}

// Release implements backends.Lease: it stops the checks, appends term
// to the history in the state blob, and then releases the lease if it
// was not lost. A history that cannot be written does not keep the lock;
// a lease that cannot be released expires on its own.
func (l *lease) Release(ctx context.Context, term *backends.Term) error {
	if !l.BeginRelease() {
		return nil
	}
	l.stop()
	<-l.done

	var histErr error
	if term != nil {
		if err := l.b.appendTerm(ctx, *term); err != nil {
			histErr = fmt.Errorf("azureblob at %s: record term %d in the history in %s: %w",
				l.b.endpoint, term.Token, l.b.blob+stateSuffix, clean(err))
		}
	}
	var relErr error
	if l.Err() == nil {
		_, err := l.lc.ReleaseLease(ctx, nil)
		if err != nil && !has(err, leaseOpLost...) {
			relErr = fmt.Errorf("azureblob at %s: release the lease on %s (token %d): %w", l.b.endpoint, l.b.blob, l.g.token, clean(err))
		}
	}
	return errors.Join(relErr, histErr)
}
