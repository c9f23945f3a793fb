// Package dynamodb is the DynamoDB store: a lock is an item in a table,
// taken and renewed by conditional writes, with the semantics of AWS's
// DynamoDB Lock Client. DynamoDB has no clock a client can use and no
// watches, so the holder proves it is alive by writing a new random record
// version number (rvn) at every renewal, and the others time it on their
// own clocks: a backends.RecordLock without a clock, whose timing is the
// campaign driver's (backends/record.go). The token comes from a counter
// item beside the lock's, written in each grant's transaction.
// docs/backends/dynamodb.md lists the items, argues why no two candidates
// hold at once and why the token never goes backwards, and gives the IAM
// policy and what DynamoDB must provide (one Region, no global table).
package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/dynamodb/spec"
)

// Config describes one DynamoDB table: spec.Settings, whose zero values
// are noted there, and the credentials.
type Config struct {
	spec.Settings
	// Credentials replace the SDK's default credential chain. Nil: the
	// chain (environment, shared files and profiles, SSO, web identity,
	// container and instance metadata).
	Credentials aws.CredentialsProvider
}

// Store is one table, reached by one client.
type Store struct {
	db     *dynamodb.Client
	table  string
	where  string // the Region, and the endpoint if one was set
	prefix string
	log    *slog.Logger
	// try bounds each HTTP attempt to half the runner's attempt timeout,
	// once a campaign told it (learn), so that a request stuck on a dead
	// connection is sent again within one renewal. Zero: connTimeout alone.
	try atomic.Int64
}

var _ backends.Store = (*Store)(nil)

// requestTimeout bounds a call the store makes on its own behalf, retries
// included; connTimeout, each request's dial, TLS handshake and wait for
// headers; tableWait, the wait for a table being created (DynamoDB takes
// seconds, rarely a minute).
const (
	requestTimeout = 10 * time.Second
	connTimeout    = 5 * time.Second
	tableWait      = 2 * time.Minute
)

// Open validates cfg and reads the AWS configuration (environment,
// shared files), but sends nothing until a lock is first used.
func Open(cfg Config) (*Store, error) {
	if err := spec.ValidatePrefix(cfg.Prefix); err != nil {
		return nil, err
	}
	if cfg.Table == "" {
		cfg.Table = spec.DefaultTable
	}
	if err := spec.ValidateTable(cfg.Table); err != nil {
		return nil, err
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Store{table: cfg.Table, prefix: cfg.Prefix, log: cfg.Log}
	db, region, err := newClient(cfg, func() time.Duration { return time.Duration(s.try.Load()) })
	if err != nil {
		return nil, err
	}
	s.db, s.where = db, "region "+region
	if cfg.Endpoint != "" {
		s.where += " at " + backends.Redact(cfg.Endpoint)
	}
	return s, nil
}

// Name implements backends.Store.
func (s *Store) Name() string { return "dynamodb" }

// Lock implements backends.Store: the item <prefix><name> and those
// beside it.
func (s *Store) Lock(name string) backends.Lock { return &lock{s: s, key: s.prefix + name} }

// Close implements backends.Store: the SDK's client has nothing to close.
func (s *Store) Close() error { return nil }

func (s *Store) learn(t backends.Timings) {
	s.try.CompareAndSwap(0, int64(t.AttemptTimeout()/2))
}

// getItem reads the item name, strongly consistent; nil if there is none.
func (s *Store) getItem(ctx context.Context, name string) (map[string]types.AttributeValue, error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(s.table), Key: key(name), ConsistentRead: aws.Bool(true)})
	if err != nil || len(out.Item) == 0 {
		return nil, err
	}
	return out.Item, nil
}

// update is the update of the item name: set, if cond holds.
func (s *Store) update(name, set, cond string, names map[string]string, vals map[string]types.AttributeValue) *types.Update {
	return &types.Update{TableName: aws.String(s.table), Key: key(name), UpdateExpression: aws.String(set),
		ConditionExpression: aws.String(cond), ExpressionAttributeNames: names, ExpressionAttributeValues: vals}
}

// updateItem sends u on its own.
func (s *Store) updateItem(ctx context.Context, u *types.Update) error {
	_, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: u.TableName, Key: u.Key,
		UpdateExpression: u.UpdateExpression, ConditionExpression: u.ConditionExpression,
		ExpressionAttributeNames: u.ExpressionAttributeNames, ExpressionAttributeValues: u.ExpressionAttributeValues,
		ReturnValuesOnConditionCheckFailure: u.ReturnValuesOnConditionCheckFailure})
	return err
}

// ensureTable creates the table, on-demand, unless someone else is, and
// waits until the item name can be read.
func (s *Store) ensureTable(ctx context.Context, name string) error {
	_, err := s.db.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(s.table),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String(attrName), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String(attrName), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	var inUse *types.ResourceInUseException
	var ae smithy.APIError
	switch {
	case errors.As(err, &ae) && ae.ErrorCode() == "AccessDeniedException":
		return fmt.Errorf("table %s does not exist and these credentials may not create it: "+
			"allow dynamodb:CreateTable, or create the table (partition key %q, a string) beforehand: %w", s.table, attrName, err)
	case err != nil && !errors.As(err, &inUse):
		return fmt.Errorf("table %s does not exist, and creating it failed: %w", s.table, err)
	case err == nil:
		s.log.Info("dynamodb: created the lock table", "table", s.table, "where", s.where)
	}
	ctx, cancel := context.WithTimeout(ctx, tableWait)
	defer cancel()
	wait := time.NewTicker(500 * time.Millisecond)
	defer wait.Stop()
	for {
		_, err := s.getItem(ctx, name)
		if !isNotFound(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("table %s was created but is not active after %v: %w", s.table, tableWait, err)
		case <-wait.C:
		}
	}
}
