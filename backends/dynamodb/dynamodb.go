// Package dynamodb is the DynamoDB store: a lock is an item in a table,
// taken and renewed by conditional writes, with the semantics of AWS's
// DynamoDB Lock Client. DynamoDB has no clock a client can use and no
// watches, so the holder proves it is alive by changing a random record
// version number, and the others time it on their own clocks: a
// backends.RecordLock without a clock, whose timing is the campaign
// driver's (backends/record.go).
//
// # Table and items
//
// One table (spec.Settings.Table, "leaderrun_locks" by default) with the string
// partition key "name" and nothing else, created on first use if it is
// missing (on-demand capacity) and the credentials may create it. Each
// lock has up to four items, <prefix><lock> and three beside it:
//
//	<prefix><lock>           the lock: holder, owner, rvn, token, lease_ms, acquired, renewed, pool
//	<prefix><lock>#token     the token counter: token (never deleted by leaderrun)
//	<prefix><lock>#markers   the completion markers: rvn, markers (JSON)
//	<prefix><lock>#history   the last terms: rvn, terms (JSON)
//
// rvn, the record version number, is 128 random bits, new at every write
// of the item. holder is the holder's identity, "" when the lock is free;
// owner is its candidacy's random Claim.Owner, which with the token says
// that a grant is still this candidacy's.
// lease_ms is the holder's lease duration; acquired and renewed are the
// holder's wall clock, read by status and --try only, never by a waiter
// to decide that a lease expired. pool, only in a pool of N > 1 holders (--holders), is
// a map of N and the token of the grant that wrote it: an older
// leaderrun's grant leaves the attribute as it finds it, and the token
// tells it is not that grant's. The slots of a pool are locks of their
// own, items <prefix><lock>.slot<i> beside the lock's. The items are small and few: a lock costs no storage
// that grows.
//
// # Holding and waiting
//
//   - Grant: one TransactWriteItems that updates the lock item (holder,
//     a new rvn, the new token, lease_ms) conditional on the rvn the
//     candidate read (or on there being no item), and updates the counter
//     to the new token conditional on the value the candidate read (or on
//     there being none). Of two candidates that read the same state, one
//     wins, and the other's transaction is cancelled.
//   - Renewal: one UpdateItem that writes a new rvn, conditional on the
//     item's owner and token being the grant's. Finding others, or no
//     item, is a loss (S3): the error wraps backends.ErrLeaseLost.
//   - Waiting: the driver reads the lock item (a strongly consistent
//     GetItem) every retry period, restarts its clock each time it sees a
//     new rvn, and takes the lock once it has seen the same rvn for a
//     whole lease_ms, by a grant conditional on that rvn. A free item or
//     no item is taken at once.
//   - Loss: DynamoDB cannot tell a holder that its item changed, so the
//     holder's Follower asks the driver to read the item every retry
//     period, but at least every 500 ms: a loss is seen within half a
//     second and a read (S3 allows a second).
//   - Release: an UpdateItem that frees the item (no holder, a new rvn),
//     conditional on the grant's owner and token. The token stays.
//
// Why a waiter cannot take over while the holder's child may run: the
// holder's last acknowledged renewal was sent at s and wrote rvn v; the
// runner stops the child by s + --renew-deadline + --kill-grace, less than
// s + lease (runner's validation). A waiter that takes the lock by a grant
// conditional on v saw v in an answer that arrived at o, after v was
// written, so after s; it waits lease_ms from o on its own clock, so its
// grant commits after s + lease. If the holder wrote anything after v, the
// grant's condition fails. Clocks that run at different rates by a few
// parts per million do not matter at these durations; a waiter whose host
// was suspended counts less, never more.
//
// # Fencing token
//
// The token of a grant is max(counter, token in the lock item) + 1, and the
// grant's transaction writes it to both, conditional on the counter still
// holding the value read. Why it strictly increases across grants, even if
// the lock item is deleted by hand:
//
//   - Every grant writes the counter, and only if the counter still holds
//     the value c that the grant read; it writes t > c. DynamoDB
//     serialises transactions on an item, so the counter's values through
//     the grants form a strictly increasing sequence in commit order, and
//     each grant's token is its value there.
//   - A grant whose read is old (its candidate stalled between the read
//     and the write) finds the counter changed and is cancelled: it cannot
//     write a token below one granted since.
//   - A holder whose lease expired (its host paused, its link stalled)
//     never writes the counter again: its renewals, markers and release
//     are conditional on its own rvn, which the next grant replaced; they
//     fail and write nothing. If it campaigns again, it is a new grant
//     like any other.
//   - Deleting the lock item by hand leaves the counter: the next grant
//     reads it and goes on from there. Deleting the counter leaves the
//     token in the lock item, which the next grant reads too (every grant
//     writes both; a release keeps the token). Only deleting both (or the
//     table, or restoring an older backup) lets tokens repeat.
//
// # What DynamoDB must provide
//
// Strongly consistent reads and conditional writes on one item in one
// Region. A global table replicates between Regions asynchronously and
// resolves conflicting writes by the last writer: two Regions could grant
// the same lock at once. Point every candidate at one Region's table (not
// a global table's replicas in several Regions).
//
// # Permissions
//
// dynamodb:GetItem, dynamodb:UpdateItem and dynamodb:ConditionCheckItem on
// the table (TransactWriteItems has no action of its own: each of its
// parts is authorized as the single-item action); dynamodb:CreateTable too
// for the first user if the table is to be created on first use. A
// refused action is final: an error wrapping backends.ErrUnavailable and
// ErrRefused with DynamoDB's message, which names the action.
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

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/dynamodb/spec"
)

const (
	// requestTimeout bounds the calls the store makes on its own behalf
	// (reads, grants, status, history): retries included.
	requestTimeout = 10 * time.Second
	// connTimeout bounds connecting, the TLS handshake and the wait for
	// an answer's headers, for every request.
	connTimeout = 5 * time.Second
	// tableWait bounds the wait for a table that is being created
	// (DynamoDB takes seconds, rarely a minute).
	tableWait = 2 * time.Minute
)

// Config describes one DynamoDB table: the settings the command line
// reads (spec.Settings, whose zero values are noted there) and the
// credentials.
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
	// try bounds each HTTP attempt of a request to half the runner's
	// attempt timeout (backends.Timings.AttemptTimeout), once a campaign
	// told it: a request stuck on a dead connection is sent again on a
	// fresh one within one renewal. Zero: connTimeout alone.
	try atomic.Int64
}

var _ backends.Store = (*Store)(nil)

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
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	awsCfg, err := loadAWSConfig(ctx, cfg.Region, newHTTPClient(connTimeout), cfg.Log)
	if err != nil {
		return nil, err
	}
	if cfg.Credentials != nil {
		awsCfg.Credentials = cfg.Credentials
	}
	where := "region " + awsCfg.Region
	if cfg.Endpoint != "" {
		where += " at " + backends.Redact(cfg.Endpoint)
	}
	s := &Store{table: cfg.Table, where: where, prefix: cfg.Prefix, log: cfg.Log}
	s.db = newDynamoDB(awsCfg, cfg.Endpoint, func() time.Duration { return time.Duration(s.try.Load()) })
	return s, nil
}

// Name implements backends.Store.
func (s *Store) Name() string { return "dynamodb" }

// Lock implements backends.Store: the item <prefix><name> and those
// beside it.
func (s *Store) Lock(name string) backends.Lock { return &lock{s: s, key: s.prefix + name} }

// Close implements backends.Store. The SDK's client keeps idle
// connections for 30 s; it has nothing to close.
func (s *Store) Close() error { return nil }

// learn bounds each HTTP attempt by the timings of a campaign.
func (s *Store) learn(t backends.Timings) {
	s.try.CompareAndSwap(0, int64(t.AttemptTimeout()/2))
}

// getItem reads the item name, strongly consistent; nil if there is none.
func (s *Store) getItem(ctx context.Context, name string) (map[string]types.AttributeValue, error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(s.table),
		Key:            key(name),
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return nil, err
	}
	if len(out.Item) == 0 {
		return nil, nil
	}
	return out.Item, nil
}

// ensureTable creates the table, on-demand, with the partition key name,
// and waits until it can be read. A table that someone else is creating
// meanwhile is waited for too. Credentials that may not create it get an
// error that names the action.
func (s *Store) ensureTable(ctx context.Context, name string) error {
	_, err := s.db.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(s.table),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String(attrName), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String(attrName), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	var inUse *types.ResourceInUseException
	switch {
	case apiCode(err) == "AccessDeniedException":
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
