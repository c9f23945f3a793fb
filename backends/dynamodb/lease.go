package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/leaderrun/leaderrun/backends"
)

// Bounds of what a lease remembers of its own writes.
const (
	// maxOurs rvns are kept to tell our writes from others' when the
	// item is read. Only a lost answer adds one beyond the latest.
	maxOurs = 64
	// condOurs of them, the newest, make the condition of our writes:
	// the latest acknowledged, and those sent since whose answers were
	// lost. Beyond that many lost answers in a row the runner's deadline
	// has long passed.
	condOurs = 16
	// maxWriteAttempts bounds the retries of a write that met a
	// concurrent write of the markers or history item.
	maxWriteAttempts = 5
	// maxLossPoll bounds the interval at which a lease reads its item:
	// a loss is then seen within half a second and a read, inside the
	// second that S3 (docs/safety.md) allows, whatever the retry period.
	// Two strongly consistent reads a second per leader is the price.
	maxLossPoll = 500 * time.Millisecond
)

// lease is a grant of the lock. A goroutine started by newLease reads the
// lock item every poll interval and closes Lost when it is gone or not
// ours; Release stops it and waits for it.
type lease struct {
	b        *Backend
	identity string
	token    uint64
	ttl      time.Duration
	leaseMS  int64
	acquired time.Time

	*backends.Loss // Lost and Err
	stopPoll       context.CancelFunc
	pollDone       chan struct{}

	// polls counts the reads of the poll that got an answer, for tests.
	polls atomic.Int64

	mu   sync.Mutex
	ours []string // the rvns this lease wrote or is writing, oldest first
}

// newLease starts following the lock item, which the grant sent at
// acquired wrote with rvn.
func newLease(b *Backend, identity string, token uint64, ttl time.Duration, leaseMS int64, acquired time.Time, rvn string) *lease {
	ctx, cancel := context.WithCancel(context.Background())
	l := &lease{
		b: b, identity: identity, token: token, ttl: ttl, leaseMS: leaseMS, acquired: acquired,
		Loss: backends.NewLoss(), stopPoll: cancel, pollDone: make(chan struct{}), ours: []string{rvn},
	}
	go l.poll(ctx)
	return l
}

func (l *lease) Token() uint64       { return l.token }
func (l *lease) TTL() time.Duration  { return l.ttl }
func (l *lease) Acquired() time.Time { return l.acquired }

// remember adds rvn, about to be written, to ours, and returns the rvns
// that a write may find in the item and still be ours (rvn included, so
// that the SDK's retry of a write that went through passes its
// condition).
func (l *lease) remember(rvn string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ours = append(l.ours, rvn)
	if len(l.ours) > maxOurs {
		l.ours = l.ours[len(l.ours)-maxOurs:]
	}
	return append([]string(nil), l.ours[max(len(l.ours)-condOurs, 0):]...)
}

// condition is the rvns of the newest writes, for a write that changes no
// rvn of the lock item (a condition check).
func (l *lease) condition() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.ours[max(len(l.ours)-condOurs, 0):]...)
}

// isOurs reports whether rec is a state this lease wrote.
func (l *lease) isOurs(rec *record) bool {
	if rec == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.ours {
		if r == rec.rvn {
			return true
		}
	}
	return false
}

// lostTo says how rec (nil: no item) shows that the lock is no longer
// this lease's.
func (l *lease) lostTo(rec *record) error {
	key := l.b.Key()
	switch {
	case rec == nil:
		return fmt.Errorf("dynamodb: lock item %s was deleted: %w", key, backends.ErrLeaseLost)
	case !rec.held():
		return fmt.Errorf("dynamodb: lock item %s was released by someone else: %w", key, backends.ErrLeaseLost)
	case rec.holder != l.identity:
		return fmt.Errorf("dynamodb: lock item %s was taken by %q (token %d): %w", key, rec.holder, rec.token, backends.ErrLeaseLost)
	}
	return fmt.Errorf("dynamodb: lock item %s was granted again to %q, not by this lease (token %d, ours %d): %w",
		key, rec.holder, rec.token, l.token, backends.ErrLeaseLost)
}

// poll reads the lock item every poll interval (at most maxLossPoll)
// until the lease is lost or released. A read that fails says nothing: the runner's renewals and
// their deadline deal with an unreachable table.
func (l *lease) poll(ctx context.Context) {
	defer close(l.pollDone)
	t := time.NewTicker(min(l.b.poll, maxLossPoll))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, requestTimeout)
		rec, err := l.b.getRecord(rctx)
		cancel()
		if err != nil {
			continue
		}
		if !l.isOurs(rec) {
			l.Set(l.lostTo(rec))
			return
		}
		l.polls.Add(1)
	}
}

// failed is the error of a write of the lease that was not refused by a
// condition.
func (l *lease) failed(op string, err error) error {
	return fmt.Errorf("dynamodb table %s in %s: %s item %s: %w", l.b.table, l.b.where, op, l.b.key, err)
}

// refusedBy turns the refusal of a write conditional on our rvn into a
// loss: it closes Lost with what the item shows (old, as the refusal
// returned it, else read afresh) and returns the loss. It returns nil if
// the item is ours after all: the refusal was about another part of a
// transaction.
func (l *lease) refusedBy(ctx context.Context, old map[string]types.AttributeValue, returned bool) error {
	var rec *record
	known := false
	if returned && len(old) > 0 {
		rec, _ = parseRecord(old)
		known = true
	} else if r, err := l.b.getRecord(ctx); err == nil {
		rec, known = r, true
	}
	switch {
	case known && l.isOurs(rec):
		return nil
	case known:
		l.Set(l.lostTo(rec))
	default:
		l.Set(fmt.Errorf("dynamodb: lock item %s is no longer this lease's: a write conditional on its rvn was refused: %w",
			l.b.Key(), backends.ErrLeaseLost))
	}
	return l.Err()
}

// Renew implements backends.Lease with one UpdateItem that writes a new
// rvn, conditional on the item's rvn being ours. A refusal is a loss.
func (l *lease) Renew(ctx context.Context) error {
	if err := l.Err(); err != nil {
		return err
	}
	rvn := newRVN()
	vals := map[string]types.AttributeValue{":r": str(rvn), ":now": str(formatTime(time.Now())), ":l": num(l.leaseMS)}
	_, err := l.b.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(l.b.table),
		Key:                                 key(l.b.key),
		UpdateExpression:                    aws.String("SET #r = :r, #rn = :now, #l = :l"),
		ConditionExpression:                 aws.String(rvnIn(l.remember(rvn), vals)),
		ExpressionAttributeNames:            map[string]string{"#r": attrRVN, "#rn": attrRenewed, "#l": attrLease},
		ExpressionAttributeValues:           vals,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	var ccf *types.ConditionalCheckFailedException
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ccf):
		if lost := l.refusedBy(ctx, ccf.Item, true); lost != nil {
			return lost
		}
	}
	return l.failed("renew", err)
}

// Completed implements backends.Backend from a fresh read of the markers
// item. A table that does not exist holds no marker.
func (b *Backend) Completed(ctx context.Context, key string) (*backends.Marker, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	item, err := b.getItem(ctx, b.key+suffixMarkers)
	switch {
	case isNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("dynamodb table %s in %s: read completion markers of %s: %w", b.table, b.where, b.key, err)
	}
	now := time.Now()
	for _, m := range parseMarkers(item) {
		if m.Key == key && m.Expires.After(now) {
			return &m, nil
		}
	}
	return nil, nil
}

// Complete implements backends.Lease: the markers item is rewritten in a
// transaction with a check that the lock item's rvn is ours.
func (l *lease) Complete(ctx context.Context, m backends.Marker) error {
	if err := l.Err(); err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		item, err := l.b.getItem(ctx, l.b.key+suffixMarkers)
		if err != nil {
			return l.failed("read completion markers of", err)
		}
		vals := map[string]types.AttributeValue{}
		check := types.TransactWriteItem{ConditionCheck: &types.ConditionCheck{
			TableName:                 aws.String(l.b.table),
			Key:                       key(l.b.key),
			ConditionExpression:       aws.String(rvnIn(l.condition(), vals)),
			ExpressionAttributeNames:  map[string]string{"#r": attrRVN},
			ExpressionAttributeValues: vals,
		}}
		write := l.rewrite(suffixMarkers, item, attrMarkers, withMarker(parseMarkers(item), m, time.Now()))
		_, err = l.b.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{check, write}})
		if err = l.settle(ctx, err, attempt); !errors.Is(err, errAgain) {
			if err != nil && !errors.Is(err, backends.ErrLeaseLost) {
				return l.failed("record completion marker "+m.Key+" beside", err)
			}
			return err
		}
	}
}

// errAgain says that a transaction met a concurrent write of the item
// beside the lock item and should be made again from a fresh read.
var errAgain = errors.New("dynamodb: write again")

// settle sorts out the result of a transaction whose first part is about
// the lock item (a check or the release) and whose second rewrites an item
// beside it: nil, a loss (the lock part was refused), errAgain, or the
// error.
func (l *lease) settle(ctx context.Context, err error, attempt int) error {
	codes, cancelled := cancelReasons(err)
	switch {
	case err == nil:
		return nil
	case !cancelled:
		return err
	case unexpectedReasons(codes) != nil:
		return unexpectedReasons(codes)
	case len(codes) > 0 && codes[0] == "ConditionalCheckFailed":
		if lost := l.refusedBy(ctx, nil, false); lost != nil {
			return lost
		}
	}
	if attempt >= maxWriteAttempts {
		return err
	}
	return errAgain
}

// rewrite is the transaction part that sets attr of the item beside the
// lock item (suffix) to value, with a new rvn, conditional on its rvn
// being the one of old, as read.
func (l *lease) rewrite(suffix string, old map[string]types.AttributeValue, attr, value string) types.TransactWriteItem {
	vals := map[string]types.AttributeValue{":v": str(value), ":new": str(newRVN())}
	cond := rvnIs(stringAttr(old, attrRVN), vals)
	return types.TransactWriteItem{Update: &types.Update{
		TableName:                 aws.String(l.b.table),
		Key:                       key(l.b.key + suffix),
		UpdateExpression:          aws.String("SET #v = :v, #r = :new"),
		ConditionExpression:       aws.String(cond),
		ExpressionAttributeNames:  map[string]string{"#v": attr, "#r": attrRVN},
		ExpressionAttributeValues: vals,
	}}
}

// Release implements backends.Lease. It stops the poll first, then, if
// the lock item is still ours, frees it (no holder, a new rvn; the token
// stays) and appends term to the history in the same transaction. If the
// lease was lost, it appends term to the history alone.
func (l *lease) Release(ctx context.Context, term *backends.Term) error {
	if !l.BeginRelease() {
		return nil
	}
	l.stopPoll()
	<-l.pollDone
	if l.Err() == nil {
		err := l.free(ctx, term)
		if !errors.Is(err, backends.ErrLeaseLost) {
			return err
		}
	}
	if term == nil {
		return nil
	}
	return l.record(ctx, *term)
}

// freeing is the transaction part that frees the lock item, conditional
// on its rvn being ours.
func (l *lease) freeing() types.TransactWriteItem {
	rvn := newRVN()
	vals := map[string]types.AttributeValue{":h": str(""), ":r": str(rvn), ":now": str(formatTime(time.Now())), ":l": num(0)}
	cond := rvnIn(l.remember(rvn), vals)
	return types.TransactWriteItem{Update: &types.Update{
		TableName:                 aws.String(l.b.table),
		Key:                       key(l.b.key),
		UpdateExpression:          aws.String("SET #h = :h, #r = :r, #rn = :now, #l = :l"),
		ConditionExpression:       aws.String(cond),
		ExpressionAttributeNames:  map[string]string{"#h": attrHolder, "#r": attrRVN, "#rn": attrRenewed, "#l": attrLease},
		ExpressionAttributeValues: vals,
	}}
}

// free gives the lock up, with term in its history if there is one.
func (l *lease) free(ctx context.Context, term *backends.Term) error {
	if term == nil {
		_, err := l.b.db.UpdateItem(ctx, updateInput(l.freeing().Update))
		if isConditionFailed(err) {
			if lost := l.refusedBy(ctx, nil, false); lost != nil {
				return lost
			}
		}
		if err != nil {
			return l.failed("release", err)
		}
		return nil
	}
	for attempt := 1; ; attempt++ {
		item, err := l.b.getItem(ctx, l.b.key+suffixHistory)
		if err != nil {
			return l.failed("read the history beside", err)
		}
		write := l.rewrite(suffixHistory, item, attrTerms, withTerm(parseTerms(item), *term))
		_, err = l.b.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{l.freeing(), write}})
		if err = l.settle(ctx, err, attempt); !errors.Is(err, errAgain) {
			if err != nil && !errors.Is(err, backends.ErrLeaseLost) {
				return l.failed("release", err)
			}
			return err
		}
	}
}

// record appends term to the history of a lock that is not ours any more,
// leaving the lock item alone.
func (l *lease) record(ctx context.Context, term backends.Term) error {
	var err error
	for attempt := 0; attempt < maxWriteAttempts; attempt++ {
		var item map[string]types.AttributeValue
		if item, err = l.b.getItem(ctx, l.b.key+suffixHistory); err != nil {
			break
		}
		u := l.rewrite(suffixHistory, item, attrTerms, withTerm(parseTerms(item), term)).Update
		_, err = l.b.db.UpdateItem(ctx, updateInput(u))
		if !isConditionFailed(err) {
			break
		}
	}
	if err != nil {
		return l.failed(fmt.Sprintf("record term %d in the history beside", term.Token), err)
	}
	return nil
}

// updateInput is the single-item form of a transaction's update.
func updateInput(u *types.Update) *dynamodb.UpdateItemInput {
	return &dynamodb.UpdateItemInput{
		TableName: u.TableName, Key: u.Key, UpdateExpression: u.UpdateExpression, ConditionExpression: u.ConditionExpression,
		ExpressionAttributeNames: u.ExpressionAttributeNames, ExpressionAttributeValues: u.ExpressionAttributeValues,
	}
}
