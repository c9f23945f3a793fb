// Package dynamodb is the DynamoDB backend: a lock is an item in a table,
// taken and renewed by conditional writes, with the semantics of AWS's
// DynamoDB Lock Client. DynamoDB has no clock a client can use and no
// watches, so the holder proves it is alive by changing a random record
// version number, and the others time it on their own clocks.
//
// # Table and items
//
// One table (spec.Settings.Table, "leaderrun_locks" by default) with the string
// partition key "name" and nothing else, created on first use if it is
// missing (on-demand capacity) and the credentials may create it. Each
// lock has up to four items, <prefix><lock> and three beside it:
//
//	<prefix><lock>           the lock: holder, rvn, token, lease_ms, acquired, renewed, pool
//	<prefix><lock>#token     the token counter: token (never deleted by leaderrun)
//	<prefix><lock>#markers   the completion markers: rvn, markers (JSON)
//	<prefix><lock>#history   the last terms: rvn, terms (JSON)
//
// rvn, the record version number, is 128 random bits, new at every write
// of the item. holder is the holder's identity, "" when the lock is free.
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
//     rvn being one this lease wrote. Finding another rvn, or no item, is a
//     loss (S3): the error wraps backends.ErrLeaseLost.
//   - Waiting: a candidate reads the lock item (a strongly consistent
//     GetItem) every Config.PollInterval. It restarts its clock each time
//     it sees a new rvn, on its own monotonic clock, from the moment the
//     answer arrived; it takes the lock once it has seen the same rvn for
//     a whole lease_ms, by a grant conditional on that rvn. A free item
//     (released: no holder) or no item is taken at once.
//   - Loss: DynamoDB cannot tell a holder that its item changed, so the
//     lease reads its item every Config.PollInterval, but at least every
//     500 ms, and closes Lost when the item is gone or its rvn is not one
//     it wrote; each renewal checks too. A loss is therefore seen within
//     half a second and a read (S3 allows a second), not within
//     milliseconds as with a store that has watches; and a release
//     reaches waiters at their next poll, within a poll interval.
//   - Release: an UpdateItem (or, with a term to record, a transaction
//     with the history item) that frees the item (no holder, a new rvn),
//     conditional on its rvn being ours. The token stays in the item.
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
// refused action is final: Campaign returns an error wrapping
// backends.ErrUnavailable with DynamoDB's message, which names the action.
package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/dynamodb/spec"
)

// Defaults of Config beside spec's.
const (
	DefaultPollInterval = 2 * time.Second
	// DefaultLeaseDuration is used when a campaign asks for none.
	DefaultLeaseDuration = 15 * time.Second
)

const (
	// requestTimeout bounds the calls the backend makes on its own behalf
	// (campaign reads and grants, status, history): retries included.
	requestTimeout = 10 * time.Second
	// withdrawTimeout bounds the clean-up of a candidacy whose grant may
	// have gone through unseen.
	withdrawTimeout = 2 * time.Second
	// tableWait bounds the wait for a table that is being created
	// (DynamoDB takes seconds, rarely a minute).
	tableWait = 2 * time.Minute
)

// Config describes one lock in one DynamoDB table: the settings the
// command line reads (spec.Settings, whose zero values are noted there)
// and the credentials.
type Config struct {
	spec.Settings
	// Credentials replace the SDK's default credential chain. Nil: the
	// chain (environment, shared files and profiles, SSO, web identity,
	// container and instance metadata).
	Credentials aws.CredentialsProvider
}

// Backend campaigns for one lock. Its methods are safe for concurrent use,
// but Campaign is meant for one campaign at a time.
type Backend struct {
	db     *dynamodb.Client
	table  string
	where  string // the Region, and the endpoint if one was set
	prefix string // Config.Prefix
	lock   string
	key    string // the lock item's name
	poll   time.Duration
	log    *slog.Logger
	// root is the backend this one is a slot of (see Slot), nil for one
	// that New made: the client is root's.
	root *Backend
}

// New returns a backend for cfg.Lock. It validates cfg and reads the AWS
// configuration (environment, shared files), but sends nothing until the
// first Campaign, Status or History.
func New(cfg Config) (*Backend, error) {
	if err := backends.ValidateLockName(cfg.Lock); err != nil {
		return nil, err
	}
	if err := spec.ValidatePrefix(cfg.Prefix); err != nil {
		return nil, err
	}
	if cfg.Table == "" {
		cfg.Table = spec.DefaultTable
	}
	if err := spec.ValidateTable(cfg.Table); err != nil {
		return nil, err
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = spec.DefaultRequestTimeout
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	httpc := newHTTPClient(cfg.RequestTimeout)
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	awsCfg, err := loadAWSConfig(ctx, cfg.Region, httpc, cfg.Log)
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
	return &Backend{
		db: newDynamoDB(awsCfg, cfg.Endpoint), table: cfg.Table, where: where, prefix: cfg.Prefix, lock: cfg.Lock,
		key: cfg.Prefix + cfg.Lock, poll: cfg.PollInterval, log: cfg.Log,
	}, nil
}

// Slot implements backends.Backend: slot i is the lock
// backends.SlotLock(lock, i), whose items sit beside the lock's in the
// same table, reached through b's client.
func (b *Backend) Slot(i int) backends.Backend {
	r := b
	if b.root != nil {
		r = b.root
	}
	if i == 0 {
		return r
	}
	s := *r
	s.lock = backends.SlotLock(r.lock, i)
	s.key, s.root = r.prefix+s.lock, r
	return &s
}

// Name implements backends.Backend.
func (b *Backend) Name() string { return "dynamodb" }

// Key is where the lock lives: table/<prefix><lock>.
func (b *Backend) Key() string { return b.table + "/" + b.key }

// Close implements backends.Backend. Leases must be released first. The
// SDK's client keeps idle connections for 30 s; it has nothing to close.
func (b *Backend) Close() error { return nil }

// unavailable wraps an error met before leadership: it names the table,
// the Region and the item, never a credential.
func (b *Backend) unavailable(op string, err error) error {
	return fmt.Errorf("dynamodb table %s in %s: %s item %s: %w: %w", b.table, b.where, op, b.key, backends.ErrUnavailable, err)
}

// getItem reads the item name, strongly consistent; nil if there is none.
func (b *Backend) getItem(ctx context.Context, name string) (map[string]types.AttributeValue, error) {
	out, err := b.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(b.table),
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

// getRecord reads the lock item; nil if there is none.
func (b *Backend) getRecord(ctx context.Context) (*record, error) {
	item, err := b.getItem(ctx, b.key)
	if err != nil {
		return nil, err
	}
	return parseRecord(item)
}

// Status implements backends.Backend. Status reads the item once: it
// cannot watch the rvn for a whole lease as a waiter does. So it compares
// the holder's last renewal (renewed, the holder's wall clock) with its
// own clock: a lock whose holder has not renewed for lease_ms by that
// measure (killed with SIGKILL, say) is not held; Remaining is computed
// the same way. It is only as good as the two hosts' clocks agree: a
// holder whose clock is behind this host's by more than lease_ms less its
// retry period looks expired while it leads; one ahead looks alive after
// it died. Waiters never use the timestamps. Waiting is -1: waiters only
// read, DynamoDB does not count them. A table that does not exist holds
// no lock.
func (b *Backend) Status(ctx context.Context) (backends.Status, error) {
	st := backends.Status{Lock: b.lock, Backend: b.Name(), Key: b.Key(), Remaining: -1, Waiting: -1}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	rec, err := b.getRecord(ctx)
	switch {
	case isNotFound(err):
		return st, nil
	case err != nil:
		return st, b.unavailable("get", err)
	case rec == nil || !rec.held():
		return st, nil
	}
	if renewed := parseTime(rec.renewed); !renewed.IsZero() {
		st.Remaining = time.Until(renewed.Add(rec.lease()))
		if st.Remaining <= 0 {
			st.Remaining = -1
			return st, nil // ran out by this host's clock: nobody renews it
		}
	}
	st.Held = true
	st.Identity = rec.holder
	st.Token = rec.token
	st.Holders = rec.holders
	st.TTL = rec.lease()
	return st, nil
}

// History implements backends.Backend from the history item. A table
// that does not exist has no history.
func (b *Backend) History(ctx context.Context, limit int) ([]backends.Term, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	item, err := b.getItem(ctx, b.key+suffixHistory)
	switch {
	case isNotFound(err):
		return nil, nil
	case err != nil:
		return nil, b.unavailable("get", err)
	}
	return backends.NewestFirst(parseTerms(item), limit), nil
}

// ensureTable creates the table, on-demand, with the partition key name,
// and waits until it can be read. A table that someone else is creating
// meanwhile is waited for too. Credentials that may not create it get an
// error that names the action.
func (b *Backend) ensureTable(ctx context.Context) error {
	_, err := b.db.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(b.table),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String(attrName), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String(attrName), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	var inUse *types.ResourceInUseException
	switch {
	case apiCode(err) == "AccessDeniedException":
		return fmt.Errorf("table %s does not exist and these credentials may not create it: "+
			"allow dynamodb:CreateTable, or create the table (partition key %q, a string) beforehand: %w", b.table, attrName, err)
	case err != nil && !errors.As(err, &inUse):
		return fmt.Errorf("table %s does not exist, and creating it failed: %w", b.table, err)
	case err == nil:
		b.log.Info("dynamodb: created the lock table", "table", b.table, "where", b.where)
	}
	ctx, cancel := context.WithTimeout(ctx, tableWait)
	defer cancel()
	var wait backends.Backoff
	wait.Min, wait.Max = 200*time.Millisecond, 2*time.Second
	for {
		_, err := b.getItem(ctx, b.key)
		if !isNotFound(err) {
			return err
		}
		if wait.Sleep(ctx) != nil {
			return fmt.Errorf("table %s was created but is not active after %v: %w", b.table, tableWait, err)
		}
	}
}

var (
	_ backends.Backend = (*Backend)(nil)
	_ backends.Lease   = (*lease)(nil)
)
