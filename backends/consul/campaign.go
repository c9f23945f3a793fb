package consul

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/leaderrun/leaderrun/backends"
)

// Campaign implements backends.Backend. It creates a session and tries to
// acquire the key. If another session holds it, the candidate joins the
// lock's queue and waits its turn: while others are ahead of it, parked
// (see park) in a blocking query on the entry just ahead; once first in
// line, ready again, in a blocking query on the lock key, timing its
// holder (see the package documentation). A goroutine of its own renews
// the sessions and passes the check meanwhile (every TTL/2 once first in
// line, every parkedTTL/2 before), so that no blocking query has to end
// early for a renewal. If a session is invalidated while waiting, the
// candidate leaves the queue and campaigns again with new ones, at the end
// of the queue.
//
// A store that cannot be reached, or refuses the token, before the first
// wait is an error wrapping backends.ErrUnavailable at once. While waiting,
// transient errors are retried for as long as the session may live (its
// TTL since the last acknowledged renewal); a refusal is final.
//
// Cancelling ctx leaves the queue, releases the key if an acquisition may
// have gone through and destroys the session, on a context of its own,
// before Campaign returns ctx's error.
func (b *Backend) Campaign(ctx context.Context, opts backends.CampaignOptions) (backends.Lease, error) {
	if err := b.CheckLeaseDuration(opts.LeaseDuration); err != nil {
		return nil, fmt.Errorf("consul: --lease-duration %v: %w", opts.LeaseDuration, err)
	}
	for {
		c, err := b.newCandidate(ctx, opts)
		switch {
		case errors.Is(err, errSessionGone) && ctx.Err() == nil:
			continue
		case err != nil && ctx.Err() != nil:
			return nil, ctx.Err()
		case err != nil:
			return nil, err
		}
		l, err := c.campaign(ctx, opts.Try)
		if err == nil {
			return l, nil
		}
		// Leave the queue: a dead entry would only make the waiter behind
		// it look twice.
		c.withdraw()
		switch {
		case errors.Is(err, errSessionGone) && ctx.Err() == nil:
			continue
		case ctx.Err() != nil:
			return nil, ctx.Err()
		}
		return nil, err
	}
}

// candidate is one campaign for the key, with one TTL check on the agent
// and the sessions bound to it. While it may acquire the key (first in
// line, or before it queues) it is ready: it holds a lock session, and
// its check's TTL is the lease duration. Further back in the queue it is
// parked: no lock session, and a check of parkedTTL (see park).
type candidate struct {
	b        *Backend
	identity string
	holders  int           // recorded in the lock key's record (see record.Holders)
	check    string        // the ID of its TTL check on the agent
	lease    time.Duration // the lease duration: its check's TTL while ready
	kick     chan struct{} // parked or readied: for the keep-alive

	// live is held by each renewal and by park and ready, so that no
	// renewal meets a lock session that park has just destroyed.
	live sync.Mutex

	// mu guards what the keep-alive reads; the campaign's own goroutine,
	// the only writer, reads without it.
	mu      sync.Mutex
	session string        // the lock session; "" while parked
	ttl     time.Duration // the lock session's TTL, as granted
	// queueSession holds the candidate's queue entry, named by it; "" until
	// it queues.
	queueSession string
	lastAck      time.Time // send time of the last acknowledged renewal or check registration

	// maybeHeld is set while an acquisition may have succeeded without us
	// knowing: a withdrawal must then release the key before destroying
	// the session, or Consul would impose the lock-delay on everyone.
	maybeHeld bool
	// first is set once no live entry is ahead of ours: from then on the
	// candidate watches the lock key. Entries only ever join at the end,
	// so it stays first until it wins or leaves.
	first bool

	// What the last read of the lock key showed (first in line only).
	viewed bool
	index  uint64 // X-Consul-Index, for the next blocking query
	holder holder // holder.session is "" if the key is free
	free   freeSpell
}

// campaign tries to acquire the key and, if it is held, waits in the queue
// until it does. It returns errSessionGone if the session was invalidated
// meanwhile.
//
// An error before the first wait ends the campaign: a store that cannot be
// reached or refuses us is reported at once. Once waiting, a transient
// error (see tolerate) is retried, so that a Raft election or a short
// outage of the agent does not end the campaign.
func (c *candidate) campaign(ctx context.Context, try bool) (*lease, error) {
	l, err := c.attempt(ctx)
	switch {
	case err != nil || l != nil:
		return l, err
	case try:
		return nil, fmt.Errorf("consul: %s is held by another session, or in its lock-delay: %w", c.b.key, backends.ErrLocked)
	}
	// The keep-alive cancels wctx with the reason if the session is lost.
	wctx, lose := context.WithCancelCause(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.keepAlive(wctx, lose)
	}()
	defer func() {
		lose(nil)
		wg.Wait()
	}()
	why := func(err error) error {
		if ctx.Err() == nil && context.Cause(wctx) != nil && !errors.Is(context.Cause(wctx), context.Canceled) {
			return context.Cause(wctx)
		}
		return err
	}
	if err := c.enqueue(wctx); err != nil {
		return nil, why(err)
	}
	var retry backends.Backoff
	for {
		if err := c.waitTurn(wctx); err != nil {
			return nil, why(err)
		}
		l, err := c.attempt(wctx)
		switch {
		case err == nil && l != nil:
			return l, nil
		case err == nil && c.holder.session == "":
			retry.Reset()
			c.free.failures++
			c.free.lastFailure = time.Now()
		case err == nil:
			// The key looked like ours and was not: read it again.
			retry.Reset()
			c.viewed = false
		default:
			if err := c.tolerate(wctx, err, &retry); err != nil {
				return nil, why(err)
			}
		}
	}
}

// attempt acquires the key, and leaves the queue in the same transaction,
// so that the waiter behind learns of it only once the key is ours. A nil
// lease with a nil error means Consul refused: another session holds the
// key, or its lock-delay is running. The transaction's answer carries the
// key's new ModifyIndex: the token.
func (c *candidate) attempt(ctx context.Context) (*lease, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	// The lease's deadline counts from the send time of the last renewal
	// of both the session and the check that was acknowledged before the
	// acquisition was sent: neither can expire sooner than a TTL after it.
	acked := c.acked()
	rec := record{Identity: c.identity, TTL: c.ttl.String(), LockDelay: c.b.lockDelay.String(), Holders: c.holders}
	ops := api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVLock, Key: c.b.key, Value: rec.encode(), Flags: recordFlags, Session: c.session}}}
	if c.queueSession != "" {
		ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVDelete, Key: c.b.queueKey(c.queueSession)}})
	}
	c.maybeHeld = true
	ok, resp, _, err := c.b.client.Txn().Txn(ops, (&api.QueryOptions{}).WithContext(ctx))
	why := txnError(resp)
	switch {
	case err != nil:
		return nil, c.b.unavailable("acquire", err)
	case !ok && strings.Contains(why, "invalid session"):
		c.maybeHeld = false
		return nil, errSessionGone
	case !ok && isPermissionDenied(why):
		c.maybeHeld = false
		return nil, c.b.unavailable("acquire", fmt.Errorf("%w: %s", errPermissionDenied, why))
	case !ok:
		c.maybeHeld = false
		return nil, nil
	case len(resp.Results) == 0 || resp.Results[0].KV == nil:
		return nil, c.b.unavailable("acquire", errors.New("transaction answer without the key"))
	}
	c.maybeHeld = false // the lease owns the key from now on
	token := resp.Results[0].KV.ModifyIndex
	return newLease(c.b, c.session, c.check, c.queueSession, rec, token, c.ttl, acked), nil
}

// txnError is the first error a rolled-back transaction reports, "" if none.
func txnError(resp *api.TxnResponse) string {
	if resp == nil || len(resp.Errors) == 0 {
		return ""
	}
	return resp.Errors[0].What
}

// errPermissionDenied is a transaction refused by the ACLs: Consul reports
// that as an error of the transaction, not as a 403.
var errPermissionDenied = errors.New("permission denied (403)")

func isPermissionDenied(what string) bool {
	return strings.Contains(strings.ToLower(what), "permission denied")
}

// tolerate decides about a failed request while waiting: it returns nil
// after a pause if the error is transient and the session should still be
// alive (within its TTL of the last acknowledged renewal), and the error
// (or ctx's) otherwise.
func (c *candidate) tolerate(ctx context.Context, err error, retry *backends.Backoff) error {
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, errRequeued):
		return retry.Sleep(ctx)
	case errors.Is(err, errSessionGone) || !transient(err) || time.Since(c.acked()) >= c.liveFor():
		return err
	}
	return retry.Sleep(ctx)
}

// transient reports whether a failed request may succeed if sent again:
// a network error, a server error (no leader, leadership lost while
// committing) or rate limiting; not a refusal such as 403, nor an answer
// leaderrun refuses (a redirect, one past maxAnswer).
func transient(err error) bool {
	var se api.StatusError
	if errors.As(err, &se) {
		return se.Code >= 500 || se.Code == http.StatusTooManyRequests
	}
	return !errors.Is(err, errPermissionDenied) && !errors.Is(err, errRedirect) && !errors.Is(err, errTooLarge)
}

// withdraw gives up the candidacy on a context of its own: the caller's
// may be cancelled already. It leaves the queue first, so that the waiter
// behind moves up at once: destroying the queue session deletes the entry
// (Behavior delete). Releasing the key matters only if we may hold it:
// destroying a session that holds it would impose its lock-delay on every
// other candidate. The check goes last: deregistering it would invalidate
// the sessions. Errors are ignored: the check turns critical a TTL later,
// which ends the sessions and the entry, and the next candidate on this
// agent deregisters it.
func (c *candidate) withdraw() {
	ctx, cancel := context.WithTimeout(context.Background(), withdrawTimeout)
	defer cancel()
	if c.queueSession != "" {
		c.destroy(ctx, c.queueSession)
	}
	if c.maybeHeld {
		p := &api.KVPair{Key: c.b.key, Session: c.session}
		_, _, _ = c.b.client.KV().Release(p, (&api.WriteOptions{}).WithContext(ctx))
	}
	if c.session != "" {
		c.destroy(ctx, c.session)
	}
	_ = c.b.client.Agent().CheckDeregisterOpts(c.check, (&api.QueryOptions{}).WithContext(ctx))
}
