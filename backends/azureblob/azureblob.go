// Package azureblob is the Azure Blob Storage backend: the lock is a
// blob lease, the leader-election pattern that Azure documents, on a blob
// in a container the operator names.
//
// # Blobs
//
// Each lock has two block blobs in the container:
//
//   - the lock blob, <prefix><lock>: its lease is the lock. Its metadata
//     names the holder and its grant (leaderrun_holder, the identity
//     URL-escaped; leaderrun_token; leaderrun_ttl, the lease duration in
//     seconds; leaderrun_owner, the candidacy's Owner; leaderrun_holders,
//     the pool's size N, only in a pool of N > 1 holders), written under
//     the lease at each grant; its content is the completion markers,
//     {"markers": [...]}, written under the lease: that is their fence.
//   - the state blob, <prefix><lock>~state: never leased. Its metadata
//     holds the token's high-water mark (leaderrun_token); its content is
//     the history, {"history": [...]}, written with If-Match on the ETag
//     read.
//
// A lock name cannot contain "~", so no lock's blob is another's state
// blob. The container must exist, or the credentials must allow creating
// it.
//
// # Lease
//
// A backends.RecordLock whose clock is the service's: a grant is a lease
// of --lease-duration on the lock blob (Azure accepts 15 to 60 s, in whole
// seconds; CheckTimings refuses the rest, and infinite leases, which
// a dead leader would hold for ever), acquired with a lease id derived from
// the candidacy's Owner. The service's lease is the truth: the runner's
// renewals renew it (nothing else does), and a renewal the service refuses
// is a loss (S3). The service does not say when a lease ends, so a read
// reports a held lease's time left as backends.LeftUnknown.
//
// Azure tells nobody when a lease ends, so a holder checks itself (Check,
// driven by its Follower): when no request has proved the lease (a
// renewal, or a check) for half a retry period, at most 700 ms, it reads
// the blob's properties with its lease id, which the service answers only
// while that lease is active, and sees its loss if the answer is 412 or
// 404, or if the lease is being broken. So a lease broken or a blob
// deleted is seen within 700 ms and two round trips, within S3's 1 s
// (docs/safety.md) while a round trip takes under 150 ms. A waiter reads
// the lock blob's properties every retry period (the driver's polling) and
// tries to acquire the lease only when the read shows it free (available,
// expired or broken): reads cost a tenth of writes.
//
// # Fencing token
//
// Once it holds the lease, a candidate reads the token in the lock blob's
// metadata and the high-water mark in the state blob's, takes one more
// than the larger, writes it to the state blob with a write conditional
// on the ETag it read (If-Match, or If-None-Match: * if it found none),
// and then to the lock blob's metadata under its lease. Only then is the
// grant handed out; a conflict on the state blob starts the three steps
// again; a refusal of the lock blob's write is a lost lease.
//
// Why it never goes backwards. Both blobs' tokens only grow while they
// exist. The lock blob's metadata is written only under an active lease,
// by the holder, with a token larger than the one it read there. The
// state blob's is written only by conditional writes, each with a value
// larger than the one it replaces: a writer that read the blob and was
// delayed (a stale candidate whose lease was broken, or expired, behind
// its back) fails with 412 if anything was written since, and rereads.
// Now take grants A then B. A's lease ended before B's began (the service
// grants one lease at a time, and a blob cannot be deleted while
// leased), and A wrote its token to the state blob and then to the lock
// blob while holding its lease, so before B's reads. So B reads at least
// A's token from the lock blob unless it was deleted (which takes
// breaking the lease, then deleting), and at least A's token from the
// state blob unless that was deleted, and B's token is larger. Deleting
// either blob by hand does not make the token go back; deleting both, or
// restoring an older copy, does (like dropping PostgreSQL's sequence).
// A stale holder can do no harm: its lock-blob writes carry a lease id
// the service no longer accepts, and its state-blob writes only ever
// raise the mark.
//
// # Credentials, and what is read from the network
//
// As the Azure CLI reads them: AZURE_STORAGE_CONNECTION_STRING, or
// AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN
// (Credentials). The SDK's HTTP transport is replaced by one that follows
// no redirect, times out dials and TLS handshakes, caps headers at 64 KiB
// and every answer's body at 1 MiB, and the SDK's retries are bounded to
// two, 100 ms and 300 ms apart, each try cut at 4 s; blobs read are
// capped again at what the backend ever writes. Messages name the
// container's URL without its query, never a key or a SAS.
package azureblob

import (
	"crypto/sha256"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"

	"github.com/leaderrun/leaderrun/backends"
)

// The lease durations Azure accepts, other than infinite.
const (
	MinLeaseDuration = 15 * time.Second
	MaxLeaseDuration = 60 * time.Second
)

const (
	// requestTimeout bounds the requests the store sends on its own
	// behalf (reads, checks, status, history), so that a stalled
	// connection cannot hang them.
	requestTimeout = 10 * time.Second
	// stateSuffix names the state blob: <prefix><lock>~state.
	stateSuffix = "~state"
	// maxBlobName is Azure's limit on a blob's name.
	maxBlobName = 1024
)

// Config describes one container. The zero value of each field is noted.
type Config struct {
	// AccountURL is the blob service endpoint: for the public cloud
	// https://ACCOUNT.blob.core.windows.net, which is the zero value's
	// meaning (from Credentials.Account); a sovereign cloud's or a
	// private endpoint's otherwise, or an emulator's
	// (http://127.0.0.1:10000/ACCOUNT). With a connection string, it
	// must be empty: the string names the endpoint.
	AccountURL string

	// Container is the container's name; required. It is created if it
	// does not exist and the credentials allow it.
	Container string

	// Credentials say how to authenticate; see Credentials.
	Credentials Credentials

	// Prefix begins every lock blob's name: <Prefix><lock>.
	Prefix string

	// Log receives a line when the container is created. Nil: nothing
	// is logged.
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

// Open validates cfg and builds the client, but sends nothing to the
// service until a lock is first used.
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

// ValidateContainer returns an error unless name is a valid container
// name: 3 to 63 lowercase letters, digits and hyphens, starting with a
// letter or digit, without two hyphens in a row.
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

// Endpoint is the container's URL, without a query.
func (s *Store) Endpoint() string { return s.endpoint }

// Close implements backends.Store: it closes idle connections.
func (s *Store) Close() error {
	s.transport.closeIdle()
	return nil
}

// CheckTimings implements backends.TimingsChecker: Azure leases last 15
// to 60 s in whole seconds (a fraction is rounded up: the lease may only
// last longer than asked). Infinite leases are refused: a leader that died
// would keep the lock until someone broke its lease.
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

// grant is what the lock blob's metadata says of its holder.
type grant struct {
	holder  string
	owner   string
	token   uint64
	seconds int32
	holders int // the size of the holder's pool; 0 for one holder
}

// Metadata keys. The service keeps their case but compares them without
// it, and the SDK hands them back capitalised: they are looked up
// without case (meta).
const (
	metaHolder  = "leaderrun_holder"
	metaToken   = "leaderrun_token"
	metaTTL     = "leaderrun_ttl"
	metaOwner   = "leaderrun_owner"
	metaHolders = "leaderrun_holders" // only in a pool of more than one holder
)

// metadata is g as the lock blob's metadata.
func (g grant) metadata() map[string]*string {
	holder, token, ttl, owner := url.QueryEscape(g.holder), strconv.FormatUint(g.token, 10), strconv.Itoa(int(g.seconds)), g.owner
	m := map[string]*string{metaHolder: &holder, metaToken: &token, metaTTL: &ttl, metaOwner: &owner}
	if g.holders > 1 {
		holders := strconv.Itoa(g.holders)
		m[metaHolders] = &holders
	}
	return m
}

// grantOf reads a grant from metadata; what is missing or unreadable is
// zero.
func grantOf(m map[string]*string) grant {
	var g grant
	g.holder, _ = url.QueryUnescape(meta(m, metaHolder))
	g.owner = meta(m, metaOwner)
	g.token, _ = strconv.ParseUint(meta(m, metaToken), 10, 64)
	s, _ := strconv.ParseInt(meta(m, metaTTL), 10, 32)
	g.seconds = int32(s)
	g.holders = backends.ParseHolders(meta(m, metaHolders))
	return g
}

// meta is the value of key in m, compared without case; "" if absent.
func meta(m map[string]*string, key string) string {
	for k, v := range m {
		if v != nil && strings.EqualFold(k, key) {
			return *v
		}
	}
	return ""
}

// Lease states, as the service names them.
const (
	available = "available"
	leased    = "leased"
	expired   = "expired"
	breaking  = "breaking"
	broken    = "broken"
)

func leaseStateOf(p blob.GetPropertiesResponse) string {
	if p.LeaseState == nil {
		return available
	}
	return string(*p.LeaseState)
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
