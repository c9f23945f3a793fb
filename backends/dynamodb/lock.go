package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/leaderrun/leaderrun/backends"
)

// maxLossPoll bounds the interval at which a holder reads its item, so
// that a loss is seen within half a second and a read, inside S3's second
// (docs/safety.md), whatever the retry period.
const maxLossPoll = 500 * time.Millisecond

type lock struct {
	s   *Store
	key string // the lock item's name
}

var _ backends.RecordLock = (*lock)(nil)

// Key implements backends.Lock: table/<prefix><lock>.
func (l *lock) Key() string { return l.s.table + "/" + l.key }

// failed wraps an error of op: it names the table, the Region and the
// item, never a credential; a refusal is final.
func (l *lock) failed(op string, err error) error {
	if isRefusal(err) || errors.Is(err, errTxRefused) || errors.Is(err, errAnswerTooLarge) {
		return fmt.Errorf("dynamodb table %s in %s: %s item %s: %w: %w: %w", l.s.table, l.s.where, op, l.key,
			backends.ErrUnavailable, backends.ErrRefused, err)
	}
	return fmt.Errorf("dynamodb table %s in %s: %s item %s: %w: %w", l.s.table, l.s.where, op, l.key, backends.ErrUnavailable, err)
}

// Get implements backends.RecordLock. A missing table holds no lock.
func (l *lock) Get(ctx context.Context) (backends.Record, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	item, err := l.s.getItem(ctx, l.key)
	switch {
	case isNotFound(err):
		return backends.Record{Left: backends.NoClock, Waiting: -1}, nil
	case err != nil:
		return backends.Record{}, l.failed("get", err)
	}
	rec, err := recordOf(item)
	if err != nil {
		return backends.Record{}, l.failed("get", fmt.Errorf("%w: %w", backends.ErrCorruptState, err))
	}
	return rec, nil
}

// Take implements backends.RecordLock with one TransactWriteItems: the
// lock item, conditional on the rvn read, and the counter, conditional on
// the value read, both given the new token. A missing table is created.
func (l *lock) Take(ctx context.Context, prev backends.Record, c backends.Claim) (backends.Record, error) {
	l.s.learn(c.Timings)
	counterItem, err := l.s.getItem(ctx, l.key+suffixCounter)
	if isNotFound(err) {
		if err = l.s.ensureTable(ctx, l.key); err == nil {
			counterItem, err = l.s.getItem(ctx, l.key+suffixCounter)
		}
	}
	if err != nil {
		return backends.Record{}, l.failed("get", err)
	}
	counter, err := numberAttr(counterItem, attrToken)
	if err != nil {
		return backends.Record{}, fmt.Errorf("dynamodb: counter item %s: %w: %w", l.key+suffixCounter, backends.ErrCorruptState, err)
	}
	_, hasCounter := counterItem[attrToken]
	leaseMS := int64((c.Timings.LeaseDuration + time.Millisecond - 1) / time.Millisecond)
	now := time.Now()
	rec := backends.Record{Holder: c.Identity, Owner: c.Owner, Token: max(counter, prev.Token) + 1, Holders: c.Holders,
		TTL: time.Duration(leaseMS) * time.Millisecond, Acquired: now, Renewed: now, Left: backends.NoClock, Waiting: -1,
		Version: newRVN()}
	_, err = l.s.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
		{Update: l.granting(prev.Version, rec, leaseMS)},
		{Update: l.s.counterUpdate(l.key+suffixCounter, rec.Token, hasCounter, counter)},
	}})
	if err != nil {
		return backends.Record{}, l.txFailed("grant", err)
	}
	return rec, nil
}

// granting is the update of the lock item that grants it as rec, if its
// rvn is still old ("": it has none).
func (l *lock) granting(old string, rec backends.Record, leaseMS int64) *types.Update {
	now := str(formatTime(rec.Acquired))
	names := map[string]string{"#h": attrHolder, "#o": attrOwner, "#r": attrRVN, "#t": attrToken,
		"#l": attrLease, "#a": attrAcquired, "#rn": attrRenewed, "#p": attrPool}
	vals := map[string]types.AttributeValue{":h": str(rec.Holder), ":o": str(rec.Owner),
		":r": str(rec.Version), ":t": unum(rec.Token), ":l": num(leaseMS), ":now": now}
	set := "SET #h = :h, #o = :o, #r = :r, #t = :t, #l = :l, #a = :now, #rn = :now"
	if rec.Holders > 1 {
		set += ", #p = :p"
		vals[":p"] = poolAttr(rec.Holders, rec.Token)
	} else {
		set += " REMOVE #p"
	}
	return l.s.update(l.key, set, unchanged("#r", str(old), old != "", vals), names, vals)
}

// counterUpdate sets the counter item name to token, if it still holds
// counter (nothing, if !has).
func (s *Store) counterUpdate(name string, token uint64, has bool, counter uint64) *types.Update {
	vals := map[string]types.AttributeValue{":t": unum(token)}
	return s.update(name, "SET #t = :t", unchanged("#t", unum(counter), has, vals), map[string]string{"#t": attrToken}, vals)
}

// unchanged is the condition that #name still holds old (!has: none).
func unchanged(name string, old types.AttributeValue, has bool, vals map[string]types.AttributeValue) string {
	if !has {
		return "attribute_not_exists(" + name + ")"
	}
	vals[":old"] = old
	return name + " = :old"
}

// txFailed sorts out a failed transaction: cancelled for a failed
// condition or a conflicting write, it is a conflict (read again); for
// anything else, final; not cancelled, it may have gone through.
func (l *lock) txFailed(op string, err error) error {
	codes, cancelled := cancelCodes(err)
	if !cancelled {
		return l.failed(op, err)
	}
	for _, code := range codes {
		if !slices.Contains([]string{"", "None", "ConditionalCheckFailed", "TransactionConflict"}, code) {
			return l.failed(op, fmt.Errorf("%w: cancellation reasons %v", errTxRefused, codes))
		}
	}
	return fmt.Errorf("dynamodb: %s %s: cancellation reasons %v: %w", op, l.Key(), codes, backends.ErrConflict)
}

// cancelCodes are the codes of a cancelled transaction's parts, in order.
func cancelCodes(err error) (codes []string, cancelled bool) {
	var tce *types.TransactionCanceledException
	if !errors.As(err, &tce) {
		return nil, false
	}
	for _, r := range tce.CancellationReasons {
		codes = append(codes, aws.ToString(r.Code))
	}
	return codes, true
}

// errTxRefused: a transaction cancelled for a reason that trying again
// would not change.
var errTxRefused = errors.New("dynamodb: transaction refused")

// ours is the condition that the lock item is still held's grant: any
// other grant, of any release, writes another token.
// The holder is checked too: an operator who writes another holder into
// the item has taken the lock, though owner and token stay.
func ours(held backends.Record, vals map[string]types.AttributeValue) string {
	vals[":ho"], vals[":ht"], vals[":hh"] = str(held.Owner), unum(held.Token), str(held.Holder)
	return "#o = :ho AND #t = :ht AND #h = :hh"
}

// lostErr says what the lock item, as a refused write returned it,
// shows of the loss.
func (l *lock) lostErr(old map[string]types.AttributeValue) error {
	rec, _ := recordOf(old)
	switch {
	case !rec.Exists():
		return fmt.Errorf("dynamodb: lock item %s is gone or is no longer this grant's: %w", l.key, backends.ErrLeaseLost)
	case rec.Holder == "":
		return fmt.Errorf("dynamodb: lock item %s was released by someone else: %w", l.key, backends.ErrLeaseLost)
	}
	return fmt.Errorf("dynamodb: lock item %s was taken by %q (token %d): %w", l.key, rec.Holder, rec.Token, backends.ErrLeaseLost)
}

// Keep implements backends.RecordLock: a new rvn, conditional on the
// grant's owner and token. A refusal is a loss.
func (l *lock) Keep(ctx context.Context, held backends.Record) (backends.Record, error) {
	held.Version, held.Renewed = newRVN(), time.Now()
	vals := map[string]types.AttributeValue{":r": str(held.Version), ":now": str(formatTime(held.Renewed))}
	u := l.s.update(l.key, "SET #r = :r, #rn = :now", ours(held, vals),
		map[string]string{"#h": attrHolder, "#r": attrRVN, "#rn": attrRenewed, "#o": attrOwner, "#t": attrToken}, vals)
	u.ReturnValuesOnConditionCheckFailure = types.ReturnValuesOnConditionCheckFailureAllOld
	var ccf *types.ConditionalCheckFailedException
	switch err := l.s.updateItem(ctx, u); {
	case errors.As(err, &ccf):
		return held, l.lostErr(ccf.Item)
	case err != nil:
		return held, fmt.Errorf("dynamodb table %s in %s: renew item %s: %w", l.s.table, l.s.where, l.key, err)
	}
	return held, nil
}

// Free implements backends.RecordLock: no holder, a new rvn; the token
// stays.
func (l *lock) Free(ctx context.Context, held backends.Record) error {
	vals := map[string]types.AttributeValue{":h": str(""), ":r": str(newRVN()), ":now": str(formatTime(time.Now())), ":l": num(0)}
	err := l.s.updateItem(ctx, l.s.update(l.key, "SET #h = :h, #r = :r, #rn = :now, #l = :l", ours(held, vals),
		map[string]string{"#h": attrHolder, "#r": attrRVN, "#rn": attrRenewed, "#l": attrLease, "#o": attrOwner, "#t": attrToken}, vals))
	if err != nil && !isConditionFailed(err) {
		return fmt.Errorf("dynamodb table %s in %s: release item %s: %w", l.s.table, l.s.where, l.key, err)
	}
	return nil
}

// Follow implements backends.RecordLock. DynamoDB tells nobody of a
// change: waiters get no follower, and a holder polls.
func (l *lock) Follow(_ context.Context, c backends.Claim, held *backends.Record) (backends.Follower, error) {
	if held == nil {
		return nil, nil
	}
	return backends.Poll(min(c.Timings.RetryPeriod, maxLossPoll), nil), nil
}
