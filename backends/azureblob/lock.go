package azureblob

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blockblob"
	azlease "github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/lease"

	"github.com/leaderrun/leaderrun/backends"
)

// lock is one lock's two blobs.
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

// unavailable wraps an error met before leadership: it names the
// container and the blob, never a credential; a refusal is final.
func (l *lock) unavailable(op string, err error) error {
	if refused(err) {
		return fmt.Errorf("azureblob at %s: %s %s: %w: %w: %w", l.s.endpoint, op, l.blob, backends.ErrUnavailable, backends.ErrRefused, clean(err))
	}
	return fmt.Errorf("azureblob at %s: %s %s: %w: %w", l.s.endpoint, op, l.blob, backends.ErrUnavailable, clean(err))
}

// Get implements backends.RecordLock from one read of the lock blob's
// properties: held while its lease is leased or being broken, by the
// holder its metadata names. Waiters leave no trace, so Waiting is -1.
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
	return recordOf(p), nil
}

// recordOf is what the lock blob's properties say.
func recordOf(p blob.GetPropertiesResponse) backends.Record {
	g := grantOf(p.Metadata)
	rec := backends.Record{Holder: g.holder, Owner: g.owner, Token: g.token, Holders: g.holders, Waiting: -1,
		TTL: time.Duration(g.seconds) * time.Second, Version: "created", Left: 0}
	if p.ETag != nil {
		rec.Version = string(*p.ETag)
	}
	if s := leaseStateOf(p); s == leased || s == breaking {
		rec.Left = backends.LeftUnknown
	}
	return rec
}

// leaseHandle is the Handle of a grant: its lease client, and when the lease was
// last proved (see Check).
type leaseHandle struct {
	lc *azlease.BlobClient
	id string

	mu     sync.Mutex
	proved time.Time // send time of the latest request that proved the lease
	// renewing is the send time of a renewal awaiting its answer (zero:
	// none), which the checks wait for rather than read beside it.
	renewing time.Time
	// checked is when the last check was answered: the next is due
	// a gap after it, so that checks keep clear of the renewals, which
	// keep to the runner's schedule.
	checked time.Time
}

func (h *leaseHandle) prove(sent time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if sent.After(h.proved) {
		h.proved = sent
	}
}

// dueFrom is what the next check is due a gap after: the last proof of
// the lease, a renewal under way, or the answer to the last check.
func (h *leaseHandle) dueFrom() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	from := h.proved
	for _, t := range []time.Time{h.renewing, h.checked} {
		if t.After(from) {
			from = t
		}
	}
	return from
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
// (creating the blob, and the container, if they do not exist) and,
// holding it, draws the token (see the package doc). The service's lease
// is the condition: someone else's active lease is a conflict. An
// acquisition whose answer was lost is released at once: its lease id is
// this candidacy's alone.
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
	g, err := l.grant(ctx, h, grant{holder: c.Identity, owner: c.Owner, seconds: seconds, holders: c.Holders})
	if err != nil {
		// Give the lease back at once rather than hold it while the
		// driver backs off or gives up.
		l.release(ctx, h)
		return backends.Record{}, err
	}
	h.prove(time.Now())
	return backends.Record{Holder: g.holder, Owner: g.owner, Token: g.token, Holders: g.holders, Waiting: -1,
		TTL: time.Duration(seconds) * time.Second, Left: backends.LeftUnknown, Version: "granted", Handle: h}, nil
}

// acquire acquires the lease, creating the blob or the container if they
// are missing.
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
		case has(err, bloberror.BlobNotFound):
			err = l.createBlob(ctx)
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

// createBlob creates the lock blob, empty, unless it exists.
func (l *lock) createBlob(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	err := upload(rctx, l.lockBlob, blobData{}, nil, nil, nil)
	if has(err, bloberror.BlobAlreadyExists, bloberror.LeaseIDMissing) {
		return nil
	}
	return err
}

// createContainer creates the container, unless it exists. Credentials
// that may not create it (a SAS for the container alone, a role that only
// reads and writes blobs) get an error that says to create it.
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

// grant draws the token under the lease just acquired and records g with
// it in the lock blob's metadata (see the package doc).
func (l *lock) grant(ctx context.Context, h *leaseHandle, g grant) (grant, error) {
	var err error
	for range maxCAS {
		var lockProps blob.GetPropertiesResponse
		var st blobData
		if lockProps, st, err = l.readBoth(ctx); err != nil {
			return grant{}, l.unavailable("read", err)
		}
		mark, _ := strconv.ParseUint(meta(st.meta, metaToken), 10, 64)
		g.token = max(mark, grantOf(lockProps.Metadata).token) + 1
		if err = l.raiseMark(ctx, st, g.token); has(err, conflict...) {
			continue
		}
		if err != nil {
			return grant{}, l.unavailable("raise the token's mark in", err)
		}
		_, err = l.lockBlob.SetMetadata(ctx, g.metadata(), &blob.SetMetadataOptions{AccessConditions: h.cond()})
		switch {
		case has(err, blobOpLost...):
			return grant{}, fmt.Errorf("azureblob: %s: the lease was lost while the token was drawn: %w", l.Key(), backends.ErrConflict)
		case err != nil:
			return grant{}, l.unavailable("record the grant in", err)
		}
		return g, nil
	}
	return grant{}, l.unavailable("draw a token for", fmt.Errorf("%d conflicting writes in a row on the state blob: %w", maxCAS, clean(err)))
}

// readBoth reads the lock blob's properties and the state blob's at once.
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

// raiseMark writes token as the state blob's high-water mark, if the blob
// is as st found it.
func (l *lock) raiseMark(ctx context.Context, st blobData, token uint64) error {
	mark := strconv.FormatUint(token, 10)
	metadata := lowerKeys(st.meta)
	metadata[metaToken] = &mark
	if !st.exists {
		return upload(ctx, l.stateBlob, st, nil, metadata, nil)
	}
	_, err := l.stateBlob.SetMetadata(ctx, metadata, &blob.SetMetadataOptions{AccessConditions: &blob.AccessConditions{
		ModifiedAccessConditions: &blob.ModifiedAccessConditions{IfMatch: &st.etag}}})
	return err
}

// release gives up h's lease id, on a short context of its own.
func (l *lock) release(ctx context.Context, h *leaseHandle) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
	defer cancel()
	_, _ = h.lc.ReleaseLease(rctx, nil)
}

// lostErr says that the service refused op on the lease with err.
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
	h.mu.Lock()
	h.renewing = sent
	h.mu.Unlock()
	_, err := h.lc.RenewLease(ctx, nil)
	h.mu.Lock()
	h.renewing = time.Time{}
	h.mu.Unlock()
	switch {
	case err == nil:
		h.prove(sent)
		return rec, nil
	case refused(err):
		return rec, l.lostErr("a renewal", rec, err)
	}
	return rec, fmt.Errorf("azureblob at %s: renew the lease on %s (token %d): %w", l.s.endpoint, l.blob, rec.Token, clean(err))
}

// Free implements backends.RecordLock: it releases the lease id.
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
// itself: S3 gives a loss 1 s (docs/safety.md). A check is sent
// maxCheckGap after the answer to the one before, so a loss is seen within
// maxCheckGap and two round trips: 1 s while a round trip takes 150 ms.
const maxCheckGap = 700 * time.Millisecond

// Follow implements backends.RecordLock. Azure tells nobody of a change:
// waiters get no follower (the driver reads every retry period), and a
// holder's follower asks for a Check whenever nothing has proved its lease
// for half a retry period, at most maxCheckGap, so that it checks once
// between two renewals. A renewal under way counts as a proof until its
// answer: a check beside it would ask the same question.
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
// lease is active, and says the lease is lost if the answer is 412 or
// 404, or if the lease is being broken. A failed read decides nothing:
// whether the service can still be reached is for renewals and the
// runner's deadline to judge.
func (l *lock) Check(ctx context.Context, rec backends.Record) error {
	h := rec.Handle.(*leaseHandle)
	sent := time.Now()
	p, err := l.lockBlob.GetProperties(ctx, &blob.GetPropertiesOptions{AccessConditions: h.cond()})
	h.mu.Lock()
	h.checked = time.Now()
	h.mu.Unlock()
	switch {
	case has(err, blobOpLost...):
		return l.lostErr("a check", rec, err)
	case err != nil:
		return err
	case leaseStateOf(p) == breaking:
		return fmt.Errorf("azureblob: the lease on %s (token %d) is being broken: %w", l.Key(), rec.Token, backends.ErrLeaseLost)
	}
	h.prove(sent)
	return nil
}
