package azureblob

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	azlease "github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/lease"

	"github.com/leaderrun/leaderrun/backends"
)

// Campaign implements backends.Backend. It tries to acquire the lock
// blob's lease (creating the blob, and the container, if they do not
// exist), and, holding it, draws the token (see the package doc). While
// the lease is held by someone else it reads the blob every retry period
// and tries again when the lease is free.
//
// With opts.Try it returns ErrLocked at once if the lease is held (or
// being broken). A service that cannot be reached or refuses a request
// before the first wait is an error wrapping backends.ErrUnavailable at
// once; a refusal (credentials, permissions) is final in every mode.
// While waiting, other errors are retried.
//
// Cancelling ctx returns ctx's error. A waiter has written nothing; an
// acquisition whose answer was lost, or that succeeded as ctx ended, is
// undone on a short context of its own (releasing a lease id that only
// this candidate knows can release nobody else's lease).
func (b *Backend) Campaign(ctx context.Context, opts backends.CampaignOptions) (backends.Lease, error) {
	if opts.Identity == "" {
		return nil, fmt.Errorf("azureblob: campaign for %s needs an identity", b.Key())
	}
	if err := b.CheckLeaseDuration(opts.LeaseDuration); err != nil {
		return nil, err
	}
	c := &candidate{b: b, identity: opts.Identity, holders: opts.RecordedHolders(), seconds: leaseSeconds(opts.LeaseDuration),
		leaseID: newLeaseID()}
	lc, err := azlease.NewBlobClient(b.lockBlob, &azlease.BlobClientOptions{LeaseID: &c.leaseID})
	if err != nil {
		return nil, fmt.Errorf("azureblob: lease client: %w", err)
	}
	c.lc = lc
	l, err := c.campaign(ctx, opts.Try)
	if err != nil {
		c.withdraw()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	return l, nil
}

// candidate is one campaign for the lock.
type candidate struct {
	b        *Backend
	identity string
	holders  int // recorded with the grant (see grant.holders)
	seconds  int32
	leaseID  string
	lc       *azlease.BlobClient
	// mayHold: an acquisition was sent whose outcome is not known (no
	// answer, or an answer after ctx ended): withdraw releases the lease
	// id, in case.
	mayHold bool
	// created: the container was found missing and created once.
	created bool
}

// campaign runs until the candidate holds the lease, or fails.
func (c *candidate) campaign(ctx context.Context, try bool) (*lease, error) {
	waited := false
	var retry backends.Backoff
	for {
		l, err := c.attempt(ctx)
		if err == nil {
			return l, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if errors.Is(err, errHeld) {
			if try {
				return nil, fmt.Errorf("azureblob: %s is held by %s: %w", c.b.Key(), c.b.holderOf(ctx), backends.ErrLocked)
			}
			err = c.waitFree(ctx, !waited)
			waited = true
			if err == nil {
				retry.Reset()
				continue
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
		}
		// A failure of the service, or of reaching it.
		switch {
		case errors.Is(err, backends.ErrUnavailable):
			return nil, err
		case !waited || refused(err):
			return nil, c.b.unavailable("acquire the lease of", err)
		}
		c.b.log.Debug("azureblob: campaign attempt failed; trying again", "error", clean(err))
		if retry.Sleep(ctx) != nil {
			return nil, ctx.Err()
		}
	}
}

// holderOf says who holds the lease, for a message: its identity and
// token, or "someone" if the blob cannot be read.
func (b *Backend) holderOf(ctx context.Context) string {
	st, err := b.Status(ctx)
	if err != nil || !st.Held || st.Identity == "" {
		return "someone"
	}
	return fmt.Sprintf("%q (token %d)", st.Identity, st.Token)
}

// attempt acquires the lease once and, if it did, draws the token. It
// returns errHeld if someone else holds the lease.
func (c *candidate) attempt(ctx context.Context) (*lease, error) {
	sent, err := c.acquire(ctx)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
	defer cancel()
	g, err := c.grant(rctx)
	if err == nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	if err != nil {
		// Give the lease back at once rather than hold it while the
		// caller backs off or gives up.
		c.mayHold = true
		c.release()
		if errors.Is(err, errGrantLost) {
			return nil, errHeld
		}
		return nil, err
	}
	return newLease(c, g, sent), nil
}

// acquire sends the acquisition, creating the blob or the container if
// they are missing, and returns its send time. Its answer is awaited even
// if ctx ends meanwhile, so that the candidate knows whether it holds the
// lease.
func (c *candidate) acquire(ctx context.Context) (time.Time, error) {
	for range 4 {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
		sent := time.Now()
		_, err := c.lc.AcquireLease(rctx, c.seconds, nil)
		cancel()
		switch {
		case err == nil:
			if ctx.Err() != nil {
				c.mayHold = true
				return time.Time{}, ctx.Err()
			}
			return sent, nil
		case has(err, held...):
			return time.Time{}, errHeld
		case has(err, bloberror.BlobNotFound):
			err = c.createBlob(ctx)
		case has(err, bloberror.ContainerNotFound) && !c.created:
			c.created = true
			err = c.createContainer(ctx)
		case status(err) == 0:
			// No answer: the lease may have been granted.
			c.mayHold = true
			return time.Time{}, err
		default:
			return time.Time{}, err
		}
		if err != nil {
			return time.Time{}, err
		}
	}
	return time.Time{}, fmt.Errorf("azureblob: %s keeps disappearing", c.b.blob)
}

// createBlob creates the lock blob, empty, unless it exists.
func (c *candidate) createBlob(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	err := upload(rctx, c.b.lockBlob, blobData{}, nil, nil, "")
	if has(err, bloberror.BlobAlreadyExists, bloberror.LeaseIDMissing) {
		return nil
	}
	return err
}

// createContainer creates the container, unless it exists. Credentials
// that may not create it (a SAS for the container alone, a role that only
// reads and writes blobs) get an error that says to create it.
func (c *candidate) createContainer(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	_, err := c.b.container.Create(rctx, nil)
	switch {
	case err == nil:
		c.b.log.Info("azureblob: created the container", "container", c.b.name)
		return nil
	case has(err, bloberror.ContainerAlreadyExists):
		return nil
	case refused(err):
		return fmt.Errorf("azureblob: container %q does not exist and could not be created (create it, e.g. az storage container create --name %s): %w: %w",
			c.b.name, c.b.name, backends.ErrUnavailable, clean(err))
	}
	return err
}

// errGrantLost: the lease was lost (broken) while the token was drawn.
var errGrantLost = errors.New("azureblob: lease lost while drawing the token")

// grant draws the token under the lease just acquired and records the
// grant in the lock blob's metadata (see the package doc).
func (c *candidate) grant(ctx context.Context) (grant, error) {
	var err error
	for range maxCAS {
		var lockProps blob.GetPropertiesResponse
		var st blobData
		if lockProps, st, err = c.readBoth(ctx); err != nil {
			return grant{}, err
		}
		mark, _ := strconv.ParseUint(meta(st.meta, metaToken), 10, 64)
		g := grant{holder: c.identity, token: max(mark, grantOf(lockProps.Metadata).token) + 1, seconds: c.seconds, holders: c.holders}
		if err = c.raiseMark(ctx, st, g.token); has(err, conflict...) {
			continue
		}
		if err != nil {
			return grant{}, err
		}
		_, err = c.b.lockBlob.SetMetadata(ctx, g.metadata(), &blob.SetMetadataOptions{AccessConditions: c.leaseCond()})
		switch {
		case has(err, blobOpLost...):
			return grant{}, errGrantLost
		case err != nil:
			return grant{}, err
		}
		return g, nil
	}
	return grant{}, fmt.Errorf("azureblob: %d conflicting writes in a row on %s: %w", maxCAS, c.b.blob+stateSuffix, err)
}

// readBoth reads the lock blob's properties and the state blob's at once.
func (c *candidate) readBoth(ctx context.Context) (blob.GetPropertiesResponse, blobData, error) {
	var (
		wg      sync.WaitGroup
		lp      blob.GetPropertiesResponse
		lerr    error
		st      blobData
		sp      blob.GetPropertiesResponse
		serr    error
		stateOK bool
	)
	wg.Go(func() { lp, lerr = c.b.lockBlob.GetProperties(ctx, nil) })
	sp, serr = c.b.stateBlob.GetProperties(ctx, nil)
	wg.Wait()
	switch {
	case lerr != nil:
		return lp, st, lerr
	case has(serr, bloberror.BlobNotFound):
	case serr != nil:
		return lp, st, serr
	default:
		stateOK = true
	}
	st = blobData{exists: stateOK, meta: sp.Metadata}
	if stateOK && sp.ETag != nil {
		st.etag = *sp.ETag
	}
	return lp, st, nil
}

// raiseMark writes token as the state blob's high-water mark, if the blob
// is as st found it.
func (c *candidate) raiseMark(ctx context.Context, st blobData, token uint64) error {
	mark := strconv.FormatUint(token, 10)
	metadata := lowerKeys(st.meta)
	metadata[metaToken] = &mark
	if !st.exists {
		return upload(ctx, c.b.stateBlob, st, nil, metadata, "")
	}
	_, err := c.b.stateBlob.SetMetadata(ctx, metadata, &blob.SetMetadataOptions{AccessConditions: &blob.AccessConditions{
		ModifiedAccessConditions: &blob.ModifiedAccessConditions{IfMatch: &st.etag}}})
	return err
}

// leaseCond is the access condition of a request under this lease.
func (c *candidate) leaseCond() *blob.AccessConditions {
	return &blob.AccessConditions{LeaseAccessConditions: &blob.LeaseAccessConditions{LeaseID: &c.leaseID}}
}

// waitFree returns once a read of the lock blob shows its lease free
// (or the blob gone), reading it every retry period; the first read comes
// at a random moment of the first period, so that waiters started
// together do not read together. Errors of a read are returned.
func (c *candidate) waitFree(ctx context.Context, first bool) error {
	period := c.b.retry
	next := period
	if first {
		next = rand.N(period) + 1
	}
	t := time.NewTimer(next)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, requestTimeout)
		p, err := c.b.lockBlob.GetProperties(rctx, nil)
		cancel()
		switch {
		case has(err, notFound...):
			return nil
		case err != nil:
			return err
		}
		if s := leaseStateOf(p); s != leased && s != breaking {
			return nil
		}
		t.Reset(period)
	}
}

// withdraw ends a campaign that did not win: if it may hold the lease
// (an acquisition without an answer, or a grant that failed), it
// releases its lease id.
func (c *candidate) withdraw() {
	if c.mayHold {
		c.release()
	}
}

// release gives up the candidate's lease id, on a short context of its
// own. It is known not to hold the lease afterwards if the service
// released it, or says it holds another lease id or none.
func (c *candidate) release() {
	ctx, cancel := context.WithTimeout(context.Background(), withdrawTimeout)
	defer cancel()
	_, err := c.lc.ReleaseLease(ctx, nil)
	if err == nil || has(err, leaseOpLost...) {
		c.mayHold = false
	}
}
