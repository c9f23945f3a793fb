package dynamodb

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/leaderrun/leaderrun/backends"
)

// docItem is the item that holds document name, and its attribute: the
// items and JSON of earlier releases, so that an upgrade keeps them.
func (l *lock) docItem(name string) (string, string) {
	if name == backends.DocMarkers {
		return l.key + suffixMarkers, attrMarkers
	}
	return l.key + suffixHistory, attrTerms
}

// ReadDoc implements backends.Lock. A missing table holds no document.
func (l *lock) ReadDoc(ctx context.Context, name string) (backends.Doc, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	item, attr := l.docItem(name)
	d := backends.Doc{Name: name}
	got, err := l.s.getItem(ctx, item)
	switch {
	case isNotFound(err):
		return d, nil
	case err != nil:
		return d, l.failed("get", err)
	case got == nil:
		return d, nil
	}
	if v := stringAttr(got, attr); len(v) <= backends.MaxDoc {
		d.Data = []byte(v)
	}
	d.Version = stringAttr(got, attrRVN)
	return d, nil
}

// rewrite is the update of d's item with a new rvn, conditional on the
// rvn d was read with (none: the item has none).
func (l *lock) rewrite(d backends.Doc) *types.Update {
	item, attr := l.docItem(d.Name)
	vals := map[string]types.AttributeValue{":v": str(string(d.Data)), ":new": str(newRVN())}
	old, _ := d.Version.(string)
	return l.s.update(item, "SET #v = :v, #r = :new", unchanged("#r", str(old), old != "", vals), map[string]string{"#v": attr, "#r": attrRVN}, vals)
}

func (l *lock) WriteDoc(ctx context.Context, d backends.Doc) error {
	switch err := l.s.updateItem(ctx, l.rewrite(d)); {
	case isConditionFailed(err):
		return fmt.Errorf("dynamodb: %s: %w", l.Key(), backends.ErrConflict)
	case err != nil:
		return l.failed("write the "+d.Name+" beside", err)
	}
	return nil
}

// WriteDocHeld implements backends.RecordLock: the rewrite in one
// transaction with a check that the lock item is held's grant.
func (l *lock) WriteDocHeld(ctx context.Context, d backends.Doc, held backends.Record) error {
	vals := map[string]types.AttributeValue{}
	check := &types.ConditionCheck{
		TableName: aws.String(l.s.table), Key: key(l.key),
		ConditionExpression:       aws.String(ours(held, vals)),
		ExpressionAttributeNames:  map[string]string{"#h": attrHolder, "#o": attrOwner, "#t": attrToken},
		ExpressionAttributeValues: vals,
	}
	_, err := l.s.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
		{ConditionCheck: check}, {Update: l.rewrite(d)},
	}})
	if err == nil {
		return nil
	}
	if codes, _ := cancelCodes(err); len(codes) > 0 && codes[0] == "ConditionalCheckFailed" {
		return fmt.Errorf("dynamodb: lock item %s is no longer this grant's: the %s were not written: %w", l.key, d.Name, backends.ErrLeaseLost)
	}
	return l.txFailed("write the "+d.Name+" beside", err)
}
