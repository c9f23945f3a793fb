package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/leaderrun/leaderrun/backends"
)

// errRaced says that a grant's transaction was cancelled because another
// candidate (or an operator) changed the lock item or the counter first;
// the candidate has read the item again and goes on from what it is now.
var errRaced = errors.New("dynamodb: the lock item changed under the grant")

// errTxRefused says that DynamoDB cancelled a transaction for a reason
// that trying again would not change (see unexpectedReasons).
var errTxRefused = errors.New("dynamodb: transaction refused")

// Campaign implements backends.Backend. It reads the lock item (creating
// the table if it is missing) and takes the lock with a grant (see the
// package doc) if it is free, missing, or its rvn has not changed for its
// lease_ms on this candidate's clock. Otherwise it reads the item every
// Config.PollInterval, and at the moment the lease it observes would
// expire, and tries again.
//
// With opts.Try it returns ErrLocked at once if the record looks alive: by
// the holder's renewed timestamp, the one use made of it, to decide how
// long to try. A holder whose record looks expired may be dead, or its
// clock may be behind; the candidate then watches the record for one lease
// on its own clock and takes the lock if nothing changed, or returns
// ErrLocked as soon as the holder renews. So --try on a lock whose holder
// died without releasing it takes up to one lease.
//
// An error before the first wait (the table unreachable, a refused
// action) wraps backends.ErrUnavailable at once; a refusal is final in
// every mode. While waiting, other errors are retried.
//
// Cancelling ctx returns ctx's error. A waiting candidate has written
// nothing; a grant whose answer was lost is undone on a short context of
// its own if it went through.
func (b *Backend) Campaign(ctx context.Context, opts backends.CampaignOptions) (backends.Lease, error) {
	if opts.Identity == "" {
		// An empty holder is how a free lock reads.
		return nil, fmt.Errorf("dynamodb: campaign for %s needs an identity", b.Key())
	}
	ttl := opts.LeaseDuration
	if ttl <= 0 {
		ttl = DefaultLeaseDuration
	}
	c := &candidate{b: b, identity: opts.Identity, holders: opts.RecordedHolders(), ttl: ttl,
		leaseMS: int64((ttl + time.Millisecond - 1) / time.Millisecond)}
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
	holders  int // recorded with the grant (see attrPool)
	ttl      time.Duration
	leaseMS  int64 // ttl in whole milliseconds, rounded up

	// What the candidate knows of the lock item: its latest state (nil:
	// none), the rvn last seen and when it was first seen, on the
	// monotonic clock; changed once a second rvn has been seen.
	cur         *record
	observedRVN string
	observedAt  time.Time
	seen        bool
	changed     bool

	// A grant whose outcome is not known (its answer was lost): its rvn,
	// token and send time. It holds the lock if the item shows its rvn.
	uncertain      string
	uncertainToken uint64
	uncertainSent  time.Time
}

// campaign runs until the candidate holds the lock, or fails.
func (c *candidate) campaign(ctx context.Context, try bool) (*lease, error) {
	if err := c.first(ctx); err != nil {
		return nil, c.b.unavailable("get", err)
	}
	waited := false
	var retry backends.Backoff
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if l := c.won(); l != nil {
			return l, nil
		}
		var err error
		op := "get"
		switch {
		case c.takeable():
			var l *lease
			op = "grant"
			if l, err = c.acquire(ctx); err == nil {
				return l, nil
			}
		case try && c.busy():
			return nil, fmt.Errorf("dynamodb: lock %s is held by %q: %w", c.b.Key(), c.cur.holder, backends.ErrLocked)
		default:
			if !waited {
				c.b.log.Debug("dynamodb: lock held; polling it", "lock", c.b.lock, "holder", c.cur.holder,
					"token", c.cur.token, "lease", c.cur.lease(), "poll", c.b.poll)
			}
			waited = true
			err = c.wait(ctx)
		}
		switch {
		case err == nil || errors.Is(err, errRaced):
			retry.Reset()
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case isRefusal(err) || errors.Is(err, errTxRefused) || errors.Is(err, backends.ErrCorruptState) || !waited:
			return nil, c.b.unavailable(op, err)
		default:
			if retry.Sleep(ctx) != nil {
				return nil, ctx.Err()
			}
		}
	}
}

// first reads the lock item for the first time, creating the table if it
// does not exist.
func (c *candidate) first(ctx context.Context) error {
	err := c.read(ctx)
	if isNotFound(err) {
		if err = c.b.ensureTable(ctx); err == nil {
			err = c.read(ctx)
		}
	}
	return err
}

// read reads the lock item and observes it.
func (c *candidate) read(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	rec, err := c.b.getRecord(ctx)
	if err != nil {
		return err
	}
	c.observe(rec, time.Now())
	return nil
}

// observe records a state of the lock item (nil: none), read at now: the
// moment the answer arrived, after the write it shows. The clock restarts
// only when the rvn changes.
func (c *candidate) observe(rec *record, now time.Time) {
	c.cur = rec
	if rec == nil {
		return
	}
	if !c.seen || rec.rvn != c.observedRVN {
		c.changed = c.seen
		c.observedRVN, c.observedAt, c.seen = rec.rvn, now, true
	}
}

// expiry is when the observed lease may be taken over: lease_ms after its
// rvn was first seen.
func (c *candidate) expiry() time.Time { return c.observedAt.Add(c.cur.lease()) }

// takeable reports whether the lock is free or missing, or its holder's
// rvn has not changed for its lease.
func (c *candidate) takeable() bool {
	return c.cur == nil || !c.cur.held() || !time.Now().Before(c.expiry())
}

// busy reports whether a --try should give up: the holder renewed while
// we watched, or its own timestamp says it renewed within its lease.
func (c *candidate) busy() bool {
	if c.changed {
		return true
	}
	renewed := parseTime(c.cur.renewed)
	return renewed.IsZero() || time.Now().Before(renewed.Add(c.cur.lease()))
}

// wait sleeps until the next poll, or until the observed lease would
// expire if that is sooner, and reads the lock item.
func (c *candidate) wait(ctx context.Context) error {
	d := c.b.poll
	if c.cur != nil && c.cur.held() {
		// takeable's test is "not before expiry": wake just at it.
		d = max(min(d, time.Until(c.expiry())), 0)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	return c.read(ctx)
}

// won returns the lease of an uncertain grant that the item shows went
// through, nil if there is none.
func (c *candidate) won() *lease {
	if c.uncertain == "" || c.cur == nil || c.cur.rvn != c.uncertain {
		return nil
	}
	l := newLease(c.b, c.identity, c.uncertainToken, c.ttl, c.leaseMS, c.uncertainSent, c.uncertain)
	c.uncertain = ""
	return l
}

// acquire takes the lock with one grant transaction, conditional on the
// state the candidate read. The transaction is sent, and its answer
// awaited, even if ctx ends meanwhile, so that the candidate knows whether
// it holds the lock.
func (c *candidate) acquire(ctx context.Context) (*lease, error) {
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	counterItem, err := c.b.getItem(rctx, c.b.key+suffixCounter)
	cancel()
	if err != nil {
		return nil, err
	}
	counter, err := numberAttr(counterItem, attrToken)
	if err != nil {
		return nil, fmt.Errorf("counter item %s: %w: %w", c.b.key+suffixCounter, backends.ErrCorruptState, err)
	}
	_, hasCounter := counterItem[attrToken]
	token := counter
	if c.cur != nil {
		token = max(token, c.cur.token)
	}
	token++
	rvn := newRVN()
	in := c.grant(rvn, token, hasCounter, counter)
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
	defer cancel()
	c.uncertain, c.uncertainToken, c.uncertainSent = rvn, token, time.Now()
	_, err = c.b.db.TransactWriteItems(wctx, in)
	if err != nil {
		codes, cancelled := cancelReasons(err)
		if !cancelled {
			return nil, err // uncertain: it may have gone through
		}
		if bad := unexpectedReasons(codes); bad != nil {
			return nil, bad
		}
		// Someone moved first, or an earlier attempt of this very
		// transaction (a retry by the SDK) went through: the item says.
		if err := c.read(wctx); err != nil {
			return nil, err
		}
		if l := c.won(); l != nil {
			return c.keep(ctx, wctx, l)
		}
		c.uncertain = ""
		return nil, errRaced
	}
	l := newLease(c.b, c.identity, token, c.ttl, c.leaseMS, c.uncertainSent, rvn)
	c.uncertain = ""
	return c.keep(ctx, wctx, l)
}

// keep hands l over, unless the campaign was cancelled meanwhile: then it
// gives the lock back at once.
func (c *candidate) keep(ctx, wctx context.Context, l *lease) (*lease, error) {
	if err := ctx.Err(); err != nil {
		_ = l.Release(wctx, nil)
		return nil, err
	}
	return l, nil
}

// grant is the transaction of a grant: the lock item and the counter,
// each conditional on the state read.
func (c *candidate) grant(rvn string, token uint64, hasCounter bool, counter uint64) *dynamodb.TransactWriteItemsInput {
	now := str(formatTime(time.Now()))
	lock := &types.Update{
		TableName: aws.String(c.b.table),
		Key:       key(c.b.key),
		ExpressionAttributeNames: map[string]string{"#h": attrHolder, "#r": attrRVN, "#t": attrToken, "#l": attrLease,
			"#a": attrAcquired, "#rn": attrRenewed, "#p": attrPool},
		ExpressionAttributeValues: map[string]types.AttributeValue{":h": str(c.identity), ":r": str(rvn), ":t": unum(token),
			":l": num(c.leaseMS), ":now": now},
	}
	set := "SET #h = :h, #r = :r, #t = :t, #l = :l, #a = :now, #rn = :now"
	if c.holders > 0 {
		lock.UpdateExpression = aws.String(set + ", #p = :p")
		lock.ExpressionAttributeValues[":p"] = poolAttr(c.holders, token)
	} else {
		lock.UpdateExpression = aws.String(set + " REMOVE #p")
	}
	old := ""
	if c.cur != nil {
		old = c.cur.rvn
	}
	lock.ConditionExpression = aws.String(rvnIs(old, lock.ExpressionAttributeValues))
	counterCond := "attribute_not_exists(#t)"
	counterVals := map[string]types.AttributeValue{":t": unum(token)}
	if hasCounter {
		counterCond = "#t = :c"
		counterVals[":c"] = unum(counter)
	}
	return &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
		{Update: lock},
		{Update: &types.Update{
			TableName:                 aws.String(c.b.table),
			Key:                       key(c.b.key + suffixCounter),
			UpdateExpression:          aws.String("SET #t = :t"),
			ConditionExpression:       aws.String(counterCond),
			ExpressionAttributeNames:  map[string]string{"#t": attrToken},
			ExpressionAttributeValues: counterVals,
		}},
	}}
}

// rvnIs is the condition that an item's rvn (named #r) is old, or that it
// has none if old is empty (no item, or one written by hand); it adds the
// value it uses to vals.
func rvnIs(old string, vals map[string]types.AttributeValue) string {
	if old == "" {
		return "attribute_not_exists(#r)"
	}
	vals[":old"] = str(old)
	return "#r = :old"
}

// rvnIn is the condition that an item's rvn (named #r) is one of rvns; it
// adds the values it uses to vals.
func rvnIn(rvns []string, vals map[string]types.AttributeValue) string {
	names := make([]string, len(rvns))
	for i, r := range rvns {
		names[i] = fmt.Sprintf(":o%d", i)
		vals[names[i]] = str(r)
	}
	return "#r IN (" + strings.Join(names, ", ") + ")"
}

// cancelReasons are the codes of a cancelled transaction's parts, in
// order; ok is false if err is not a cancellation.
func cancelReasons(err error) (codes []string, ok bool) {
	var tce *types.TransactionCanceledException
	if !errors.As(err, &tce) {
		return nil, false
	}
	for _, r := range tce.CancellationReasons {
		codes = append(codes, aws.ToString(r.Code))
	}
	return codes, true
}

// unexpectedReasons is an error if a cancelled transaction was cancelled
// for something other than a failed condition or a conflict with another
// write (a validation error, an item too large): trying again would fail
// again.
func unexpectedReasons(codes []string) error {
	for _, code := range codes {
		if !slices.Contains([]string{"", "None", "ConditionalCheckFailed", "TransactionConflict"}, code) {
			return fmt.Errorf("%w: cancellation reasons %v", errTxRefused, codes)
		}
	}
	return nil
}

// withdraw ends a campaign that did not win: if a grant may have gone
// through unseen, it frees the lock if that grant holds it.
func (c *candidate) withdraw() {
	if c.uncertain == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), withdrawTimeout)
	defer cancel()
	if c.read(ctx) != nil {
		return
	}
	if l := c.won(); l != nil {
		_ = l.Release(ctx, nil)
	}
}
