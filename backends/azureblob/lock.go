package azureblob

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blockblob"
	azlease "github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/lease"

	"github.com/leaderrun/leaderrun/backends"
)

type lock struct {
	s         *Store
	blob      string // the lock blob's name
	lockBlob  *blockblob.Client
	stateBlob *blockblob.Client
}

var (
	_ backends.RecordLock  = (*lock)(nil)
	_ backends.HeldChecker = (*lock)(nil)
)

// Key implements backends.Lock: container/blob.
func (l *lock) Key() string { return l.s.name + "/" + l.blob }

// unavailable wraps an error met before leadership, naming no
// credential; a refusal is final.
func (l *lock) unavailable(op string, err error) error {
	if refused(err) {
		return fmt.Errorf("azureblob at %s: %s %s: %w: %w: %w", l.s.endpoint, op, l.blob, backends.ErrUnavailable, backends.ErrRefused, clean(err))
	}
	return fmt.Errorf("azureblob at %s: %s %s: %w: %w", l.s.endpoint, op, l.blob, backends.ErrUnavailable, clean(err))
}

// Get implements backends.RecordLock: held while the lock blob's lease is
// leased or being broken, by the holder its metadata names.
func (l *lock) Get(ctx context.Context) (backends.Record, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	p, err := l.lockBlob.GetProperties(ctx, nil)
	switch {
	case has(err, notFound...):
		return backends.Record{Waiting: -1}, nil
	case err != nil:
		return backends.Record{}, l.unavailable("read", err)
	}
	rec := recordOf(p.Metadata)
	rec.Version = "created"
	if p.ETag != nil {
		rec.Version = string(*p.ETag)
	}
	if leaseIn(p, azlease.StateTypeLeased, azlease.StateTypeBreaking) {
		rec.Left = backends.LeftUnknown
	}
	return rec, nil
}

func leaseIn(p blob.GetPropertiesResponse, states ...azlease.StateType) bool {
	return p.LeaseState != nil && slices.Contains(states, *p.LeaseState)
}

// leaseHandle is the Handle of a grant: its lease client, and when its
// next check is due (Follow).
type leaseHandle struct {
	lc *azlease.BlobClient
	id string

	mu       sync.Mutex
	proved   time.Time // send time of the latest request that proved the lease
	renewing time.Time // send time of a renewal awaiting its answer; zero: none
	checked  time.Time // when the last check was answered
}

func (h *leaseHandle) prove(sent time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.proved = later(h.proved, sent)
}

func (h *leaseHandle) set(t *time.Time, v time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	*t = v
}

// dueFrom is what the next check is due a gap after: the last proof of
// the lease, a renewal under way (which a check beside it would only
// repeat), or the answer to the last check (so that checks keep clear of
// the renewals, which keep to the runner's schedule).
func (h *leaseHandle) dueFrom() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return later(later(h.proved, h.renewing), h.checked)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func (h *leaseHandle) cond() *blob.AccessConditions {
	return &blob.AccessConditions{LeaseAccessConditions: &blob.LeaseAccessConditions{LeaseID: &h.id}}
}

func (l *lock) leaseClient(owner string) (*leaseHandle, error) {
	id := leaseID(owner)
	lc, err := azlease.NewBlobClient(l.lockBlob, &azlease.BlobClientOptions{LeaseID: &id})
	if err != nil {
		return nil, fmt.Errorf("azureblob: lease client: %w", err)
	}
	return &leaseHandle{lc: lc, id: id}, nil
}

// Take implements backends.RecordLock: it acquires the lock blob's lease
// and, holding it, draws the token (docs/backends/azureblob.md). Someone
// else's active lease is a conflict. A lease acquired but not granted
// (an answer lost, a failure drawing the token) is released at once: its
// lease id is this candidacy's alone.
func (l *lock) Take(ctx context.Context, _ backends.Record, c backends.Claim) (backends.Record, error) {
	h, err := l.leaseClient(c.Owner)
	if err != nil {
		return backends.Record{}, err
	}
	seconds := leaseSeconds(c.Timings.LeaseDuration)
	if err := l.acquire(ctx, h, seconds); err != nil {
		if !errors.Is(err, backends.ErrConflict) {
			l.release(ctx, h)
		}
		return backends.Record{}, err
	}
	rec, err := l.grant(ctx, h, backends.Record{Holder: c.Identity, Owner: c.Owner, Holders: c.Holders, Waiting: -1,
		TTL: time.Duration(seconds) * time.Second, Left: backends.LeftUnknown, Version: "granted", Handle: h})
	if err != nil {
		l.release(ctx, h)
		return backends.Record{}, err
	}
	h.prove(time.Now())
	return rec, nil
}

// acquire acquires the lease, creating the blob or the container if
// missing.
func (l *lock) acquire(ctx context.Context, h *leaseHandle, seconds int32) error {
	created := false
	for range 4 {
		rctx, cancel := context.WithTimeout(ctx, requestTimeout)
		_, err := h.lc.AcquireLease(rctx, seconds, nil)
		cancel()
		switch {
		case err == nil:
			return nil
		case has(err, held...):
			return fmt.Errorf("azureblob: %s: %w", l.Key(), backends.ErrConflict)
		case has(err, bloberror.BlobNotFound): // create it, empty, unless it exists
			rctx, cancel := context.WithTimeout(ctx, requestTimeout)
			if err = upload(rctx, l.lockBlob, blobData{}, nil, nil, nil); has(err, bloberror.BlobAlreadyExists, bloberror.LeaseIDMissing) {
				err = nil
			}
			cancel()
		case has(err, bloberror.ContainerNotFound) && !created:
			created = true
			err = l.createContainer(ctx)
		}
		if err != nil {
			return l.unavailable("acquire the lease of", err)
		}
	}
	return l.unavailable("acquire the lease of", errors.New("the blob keeps disappearing"))
}

// createContainer creates the container, unless it exists.
func (l *lock) createContainer(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	_, err := l.s.container.Create(rctx, nil)
	switch {
	case err == nil:
		l.s.log.Info("azureblob: created the container", "container", l.s.name)
		return nil
	case has(err, bloberror.ContainerAlreadyExists):
		return nil
	case refused(err):
		return fmt.Errorf("container %q does not exist and could not be created (create it, e.g. az storage container create --name %s): %w",
			l.s.name, l.s.name, err)
	}
	return err
}

// grant draws the token under the lease just acquired and records rec
// with it in the lock blob's metadata: one more than the larger of the
// lock blob's token and the state blob's mark, written first to the state
// blob by a write conditional on its ETag (a conflict draws again), then
// to the lock blob under the lease.
func (l *lock) grant(ctx context.Context, h *leaseHandle, rec backends.Record) (backends.Record, error) {
	var err error
	for range maxCAS {
		var lockProps blob.GetPropertiesResponse
		var st blobData
		if lockProps, st, err = l.readBoth(ctx); err != nil {
			return rec, l.unavailable("read", err)
		}
		mark, _ := strconv.ParseUint(meta(st.meta, metaToken), 10, 64)
		rec.Token = max(mark, recordOf(lockProps.Metadata).Token) + 1
		// The state blob's mark, if the blob is still as st found it.
		marked := lowerKeys(st.meta)
		marked[metaToken] = new(strconv.FormatUint(rec.Token, 10))
		if st.exists {
			_, err = l.stateBlob.SetMetadata(ctx, marked, &blob.SetMetadataOptions{AccessConditions: &blob.AccessConditions{
				ModifiedAccessConditions: &blob.ModifiedAccessConditions{IfMatch: &st.etag}}})
		} else {
			err = upload(ctx, l.stateBlob, st, nil, marked, nil)
		}
		if has(err, conflict...) {
			continue
		}
		if err != nil {
			return rec, l.unavailable("raise the token's mark in", err)
		}
		_, err = l.lockBlob.SetMetadata(ctx, metadata(rec), &blob.SetMetadataOptions{AccessConditions: h.cond()})
		switch {
		case has(err, blobOpLost...):
			return rec, fmt.Errorf("azureblob: %s: the lease was lost while the token was drawn: %w", l.Key(), backends.ErrConflict)
		case err != nil:
			return rec, l.unavailable("record the grant in", err)
		}
		return rec, nil
	}
	return rec, l.unavailable("draw a token for", fmt.Errorf("%d conflicting writes in a row on the state blob: %w", maxCAS, clean(err)))
}

func (l *lock) readBoth(ctx context.Context) (blob.GetPropertiesResponse, blobData, error) {
	var (
		wg   sync.WaitGroup
		lp   blob.GetPropertiesResponse
		lerr error
	)
	wg.Go(func() { lp, lerr = l.lockBlob.GetProperties(ctx, nil) })
	sp, serr := l.stateBlob.GetProperties(ctx, nil)
	wg.Wait()
	switch {
	case lerr != nil:
		return lp, blobData{}, lerr
	case has(serr, bloberror.BlobNotFound):
		return lp, blobData{}, nil
	case serr != nil:
		return lp, blobData{}, serr
	}
	st := blobData{exists: true, meta: sp.Metadata}
	if sp.ETag != nil {
		st.etag = *sp.ETag
	}
	return lp, st, nil
}

func (l *lock) release(ctx context.Context, h *leaseHandle) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
	defer cancel()
	_, _ = h.lc.ReleaseLease(rctx, nil)
}

func (l *lock) lostErr(op string, rec backends.Record, err error) error {
	return fmt.Errorf("azureblob: the service refused %s of the lease on %s (token %d): %w: %w",
		op, l.Key(), rec.Token, backends.ErrLeaseLost, clean(err))
}

// Keep implements backends.RecordLock with one renewal of the lease. Any
// refusal of it (the lease broken, released, taken, the blob deleted,
// and also credentials no longer accepted, which would let the lease
// expire) is a loss; no answer is not.
func (l *lock) Keep(ctx context.Context, rec backends.Record) (backends.Record, error) {
	h := rec.Handle.(*leaseHandle)
	sent := time.Now()
	h.set(&h.renewing, sent)
	_, err := h.lc.RenewLease(ctx, nil)
	h.set(&h.renewing, time.Time{})
	switch {
	case err == nil:
		h.prove(sent)
		return rec, nil
	case refused(err):
		return rec, l.lostErr("a renewal", rec, err)
	}
	return rec, fmt.Errorf("azureblob at %s: renew the lease on %s (token %d): %w", l.s.endpoint, l.blob, rec.Token, clean(err))
}

func (l *lock) Free(ctx context.Context, rec backends.Record) error {
	h, ok := rec.Handle.(*leaseHandle)
	if !ok {
		var err error
		if h, err = l.leaseClient(rec.Owner); err != nil {
			return err
		}
	}
	_, err := h.lc.ReleaseLease(ctx, nil)
	if err != nil && !has(err, leaseOpLost...) {
		return fmt.Errorf("azureblob at %s: release the lease on %s (token %d): %w", l.s.endpoint, l.blob, rec.Token, clean(err))
	}
	return nil
}

// maxCheckGap bounds how long a lease goes without proof before it checks
// itself: a check is sent maxCheckGap after the answer to the one before,
// so a loss is seen within maxCheckGap and two round trips, inside S3's
// second (docs/safety.md) while a round trip takes 150 ms.
const maxCheckGap = 700 * time.Millisecond

// Follow implements backends.RecordLock. Azure tells nobody of a change:
// waiters get no follower, and a holder's follower asks for a Check
// whenever nothing has proved its lease for half a retry period, at most
// maxCheckGap, so that it checks once between two renewals.
func (l *lock) Follow(_ context.Context, c backends.Claim, rec *backends.Record) (backends.Follower, error) {
	if rec == nil {
		return nil, nil
	}
	h := rec.Handle.(*leaseHandle)
	every := min(c.Timings.RetryPeriod/2, maxCheckGap)
	return backends.Poll(every, func() time.Time { return h.dueFrom().Add(every) }), nil
}

// Check implements backends.HeldChecker: it reads the lock blob's
// properties with the lease id, which the service answers only while that
// lease is active; a lease being broken is lost too. A failed read
// decides nothing: renewals and the runner's deadline judge whether the
// service can still be reached.
func (l *lock) Check(ctx context.Context, rec backends.Record) error {
	h := rec.Handle.(*leaseHandle)
	sent := time.Now()
	p, err := l.lockBlob.GetProperties(ctx, &blob.GetPropertiesOptions{AccessConditions: h.cond()})
	h.set(&h.checked, time.Now())
	switch {
	case has(err, blobOpLost...):
		return l.lostErr("a check", rec, err)
	case err != nil:
		return err
	case leaseIn(p, azlease.StateTypeBreaking):
		return fmt.Errorf("azureblob: the lease on %s (token %d) is being broken: %w", l.Key(), rec.Token, backends.ErrLeaseLost)
	}
	h.prove(sent)
	return nil
}
