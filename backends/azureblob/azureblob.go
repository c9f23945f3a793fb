// Package azureblob is the Azure Blob Storage store: a lock is a lease on
// the blob <prefix><lock> (a backends.RecordLock on the service's clock),
// whose metadata names the grant; the blob <prefix><lock>~state keeps the
// token's high-water mark. docs/backends/azureblob.md lists the blobs,
// argues why the token never goes backwards and how a loss is seen within
// S3's second, and gives the bounds on what is read from the network.
package azureblob

import (
	"crypto/sha256"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"

	"github.com/leaderrun/leaderrun/backends"
)

// The lease durations Azure accepts, other than infinite.
const (
	MinLeaseDuration = 15 * time.Second
	MaxLeaseDuration = 60 * time.Second
)

const (
	// requestTimeout bounds a request the store sends on its own behalf
	// (reads, checks, status, history).
	requestTimeout = 10 * time.Second
	stateSuffix    = "~state" // names the state blob: <prefix><lock>~state
	maxBlobName    = 1024     // Azure's limit on a blob's name
)

// Config describes one container. The zero value of each field is noted.
type Config struct {
	// AccountURL is the blob service endpoint (an emulator's:
	// http://127.0.0.1:10000/ACCOUNT). Zero: the public cloud's; it must
	// be zero with a connection string, which names the endpoint.
	AccountURL string
	// Container is the container's name; required. It is created if it
	// does not exist and the credentials allow it.
	Container   string
	Credentials Credentials
	// Prefix begins every lock blob's name: <Prefix><lock>.
	Prefix string
	// Log receives a line when the container is created. Nil: none.
	Log *slog.Logger
}

// Store is one container, reached by one client.
type Store struct {
	container *container.Client
	transport *transport
	endpoint  string // the container's URL, without a query
	name      string // the container's name
	prefix    string
	log       *slog.Logger
}

var (
	_ backends.Store          = (*Store)(nil)
	_ backends.TimingsChecker = (*Store)(nil)
)

// Open validates cfg and builds the client; it sends nothing.
func Open(cfg Config) (*Store, error) {
	if err := ValidateContainer(cfg.Container); err != nil {
		return nil, err
	}
	if err := ValidatePrefix(cfg.Prefix); err != nil {
		return nil, err
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	tr := newTransport()
	c, endpoint, err := newContainerClient(&cfg, tr)
	if err != nil {
		return nil, err
	}
	return &Store{container: c, transport: tr, endpoint: endpoint, name: cfg.Container, prefix: cfg.Prefix,
		log: cfg.Log.With("backend", "azureblob")}, nil
}

// Lock implements backends.Store: the lock blob <prefix><name> and its
// state blob.
func (s *Store) Lock(name string) backends.Lock {
	b := s.prefix + name
	return &lock{s: s, blob: b, lockBlob: s.container.NewBlockBlobClient(b), stateBlob: s.container.NewBlockBlobClient(b + stateSuffix)}
}

// ValidateContainer returns an error unless name is a container name.
func ValidateContainer(name string) error {
	ok := len(name) >= 3 && len(name) <= 63 && name[0] != '-' && name[len(name)-1] != '-' && !strings.Contains(name, "--")
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		ok = c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-'
	}
	if !ok {
		return fmt.Errorf("azureblob: container name %q: want 3-63 lowercase letters, digits and hyphens, "+
			"starting and ending with a letter or digit, no two hyphens in a row", name)
	}
	return nil
}

// ValidatePrefix returns an error unless prefix can start a blob's name:
// no control characters, no backslash (which the service turns into a
// slash), and room left for the name of any slot of a lock.
func ValidatePrefix(prefix string) error {
	if len(prefix)+backends.MaxSlotLockName+len(stateSuffix) > maxBlobName {
		return fmt.Errorf("azureblob: prefix %q is too long: blob names are at most %d characters", prefix, maxBlobName)
	}
	for _, r := range prefix {
		if r < ' ' || r == 0x7f || r == '\\' {
			return fmt.Errorf("azureblob: prefix %q: control characters and backslashes are not allowed in blob names", prefix)
		}
	}
	return nil
}

// Name implements backends.Store.
func (s *Store) Name() string { return "azureblob" }

// Close implements backends.Store: it closes idle connections.
func (s *Store) Close() error {
	s.transport.CloseIdleConnections()
	return nil
}

// CheckTimings implements backends.TimingsChecker: Azure leases last 15
// to 60 s, in whole seconds rounded up. Infinite leases are refused: a
// leader that died would keep the lock until someone broke its lease.
func (s *Store) CheckTimings(t backends.Timings) error {
	if n := time.Duration(leaseSeconds(t.LeaseDuration)) * time.Second; n < MinLeaseDuration || n > MaxLeaseDuration {
		return fmt.Errorf("--lease-duration %v: Azure blob leases last %v to %v", t.LeaseDuration, MinLeaseDuration, MaxLeaseDuration)
	}
	return nil
}

// leaseSeconds is d in whole seconds, rounded up.
func leaseSeconds(d time.Duration) int32 {
	s := (d + time.Second - 1) / time.Second
	return int32(min(max(s, -1), 1<<31-1))
}

// The lock blob's metadata keys, which name the grant. The service
// compares them without case, and the SDK hands them back capitalised:
// they are looked up without case (meta).
const (
	metaHolder  = "leaderrun_holder"
	metaToken   = "leaderrun_token"
	metaTTL     = "leaderrun_ttl"
	metaOwner   = "leaderrun_owner"
	metaHolders = "leaderrun_holders" // only in a pool of more than one holder
)

// metadata is the lock blob's metadata of the grant rec.
func metadata(rec backends.Record) map[string]*string {
	holder, token, ttl, owner := url.QueryEscape(rec.Holder), strconv.FormatUint(rec.Token, 10), strconv.Itoa(int(rec.TTL/time.Second)), rec.Owner
	m := map[string]*string{metaHolder: &holder, metaToken: &token, metaTTL: &ttl, metaOwner: &owner}
	if rec.Holders > 1 {
		holders := strconv.Itoa(rec.Holders)
		m[metaHolders] = &holders
	}
	return m
}

// recordOf reads a grant from the lock blob's metadata; what is missing
// or unreadable is zero.
func recordOf(m map[string]*string) backends.Record {
	rec := backends.Record{Owner: meta(m, metaOwner), Holders: backends.ParseHolders(meta(m, metaHolders)), Waiting: -1}
	rec.Holder, _ = url.QueryUnescape(meta(m, metaHolder))
	rec.Token, _ = strconv.ParseUint(meta(m, metaToken), 10, 64)
	s, _ := strconv.ParseInt(meta(m, metaTTL), 10, 32)
	rec.TTL = time.Duration(s) * time.Second
	return rec
}

// meta is the value of key in m, compared without case; "" if absent.
func meta(m map[string]*string, key string) string {
	if v := lowerKeys(m)[key]; v != nil {
		return *v
	}
	return ""
}

// leaseID is the lease id of the candidacy of owner: a UUID (version 4,
// as the service wants lease ids) drawn from owner, so that only that
// candidacy knows it, and releasing it releases nobody else's lease.
func leaseID(owner string) string {
	u := sha256.Sum256([]byte("leaderrun lease " + owner))
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}
