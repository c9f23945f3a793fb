package azureblob

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"

	"github.com/leaderrun/leaderrun/backends"
)

// Bounds of what the backend sends and accepts.
const (
	// maxAnswer caps the body of any answer, read by the SDK or by us:
	// the largest thing the backend stores is a blob of maxBlob bytes,
	// and an error answer is an XML document of a few hundred bytes.
	maxAnswer = 1 << 20
	// maxHeaders caps an answer's headers: a blob's metadata is at most
	// 8 KiB by the service's rules.
	maxHeaders = 64 << 10
	// tryTimeout bounds one try of a request inside the SDK's retry
	// policy, so that a stalled connection is given up and the request
	// sent again on another; a caller's context may end it sooner.
	tryTimeout = 4 * time.Second
	// maxRetries is how often the SDK sends a request again after a
	// network error or a 408, 429, 500, 502, 503 or 504, 100 ms then
	// 300 ms later (with jitter): a renewal's retries fit in the runner's
	// attempt timeout, and an answer that was lost on a reset connection
	// is asked again at once.
	maxRetries  = 2
	dialTimeout = 5 * time.Second
)

// Credentials are how the backend authenticates, as the Azure CLI and
// SDKs read them from the environment. The first that is set is used:
// ConnectionString, then Key, then SAS.
type Credentials struct {
	// ConnectionString is a storage account's connection string
	// (AZURE_STORAGE_CONNECTION_STRING): AccountName and AccountKey, or
	// a SharedAccessSignature, and optionally BlobEndpoint or
	// EndpointSuffix and DefaultEndpointsProtocol.
	ConnectionString string
	// Account is the storage account's name (AZURE_STORAGE_ACCOUNT),
	// for Key, and for the default account URL.
	Account string
	// Key is the account's access key (AZURE_STORAGE_KEY), base64.
	Key string
	// SAS is a shared access signature (AZURE_STORAGE_SAS_TOKEN): the
	// query string of a signed URL, with or without its leading "?". It
	// must allow read and write (sp=rw) on the container's blobs.
	SAS string
}

// newContainerClient builds the SDK's client of the container: the
// credentials the configuration names, over an HTTP client whose every
// answer is bounded and that follows no redirect.
func newContainerClient(cfg *Config, tr *transport) (*container.Client, string, error) {
	opts := &container.ClientOptions{ClientOptions: clientOptions(tr)}
	cred := cfg.Credentials
	if cred.ConnectionString != "" {
		if cfg.AccountURL != "" {
			return nil, "", errors.New("azureblob: both an account URL and a connection string are given: the connection string names the endpoint (BlobEndpoint=...)")
		}
		c, err := container.NewClientFromConnectionString(cred.ConnectionString, cfg.Container, opts)
		if err != nil {
			// The SDK's messages name the part missing, never a value.
			return nil, "", fmt.Errorf("azureblob: the connection string (AZURE_STORAGE_CONNECTION_STRING): %w", err)
		}
		return c, endpointOf(c.URL()), nil
	}
	if cred.Key == "" && cred.SAS == "" {
		return nil, "", errors.New("azureblob: no credentials: set AZURE_STORAGE_CONNECTION_STRING, " +
			"or AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN")
	}
	base, err := accountURL(cfg.AccountURL, cred.Account)
	if err != nil {
		return nil, "", err
	}
	u := base.JoinPath(cfg.Container)
	switch {
	case cred.Key != "":
		account := cred.Account
		if account == "" {
			account = accountOf(base)
		}
		key, err := container.NewSharedKeyCredential(account, cred.Key)
		if err != nil {
			// Its message says the key is not base64; it does not show it.
			return nil, "", fmt.Errorf("azureblob: the account key (AZURE_STORAGE_KEY) of %q: %w", account, err)
		}
		c, err := container.NewClientWithSharedKeyCredential(u.String(), key, opts)
		return c, endpointOf(u.String()), err
	default:
		sas := strings.TrimPrefix(cred.SAS, "?")
		if _, err := url.ParseQuery(sas); err != nil {
			return nil, "", errors.New("azureblob: the shared access signature (AZURE_STORAGE_SAS_TOKEN) is not a URL query string")
		}
		u.RawQuery = sas
		c, err := container.NewClientWithNoCredential(u.String(), opts)
		return c, endpointOf(u.String()), err
	}
}

// ValidateAccountURL returns an error unless u can be Config.AccountURL:
// an http or https URL without user information, query or fragment.
func ValidateAccountURL(u string) error {
	_, err := accountURL(u, "")
	return err
}

// accountURL is the blob endpoint: given (an emulator, a sovereign cloud,
// a private endpoint), or the public cloud's for account.
func accountURL(given, account string) (*url.URL, error) {
	if given == "" {
		if account == "" {
			return nil, errors.New("azureblob: no storage account: set AZURE_STORAGE_ACCOUNT, the account URL, or AZURE_STORAGE_CONNECTION_STRING")
		}
		if !validAccount(account) {
			return nil, fmt.Errorf("azureblob: storage account %q (AZURE_STORAGE_ACCOUNT): want 3-24 lowercase letters and digits", account)
		}
		given = "https://" + account + ".blob.core.windows.net"
	}
	u, err := url.Parse(given)
	// User information is found by backends.Redact's rule: url.Parse
	// takes a password holding "/" for a host and a path.
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || backends.Redact(given) != given || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("azureblob: account URL %q: want https://ACCOUNT.blob.core.windows.net or http(s)://HOST[:PORT]/ACCOUNT, "+
			"without user information or query (a SAS goes in AZURE_STORAGE_SAS_TOKEN)", redactURL(given))
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	return u, nil
}

// validAccount is Azure's rule for storage account names.
func validAccount(s string) bool {
	if len(s) < 3 || len(s) > 24 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// accountOf is the account an endpoint serves: the first label of its
// host (ACCOUNT.blob.core.windows.net), or the first segment of its path
// for an emulator or a proxy addressed by IP or as localhost
// (http://127.0.0.1:10000/ACCOUNT).
func accountOf(u *url.URL) string {
	host := u.Hostname()
	if net.ParseIP(host) != nil || host == "localhost" {
		first, _, _ := strings.Cut(strings.TrimPrefix(u.Path, "/"), "/")
		return first
	}
	first, _, _ := strings.Cut(host, ".")
	return first
}

// endpointOf is a container URL for messages: scheme, host and path,
// never a query (which may be a SAS).
func endpointOf(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
}

// redactURL is raw without user information, query or fragment.
func redactURL(raw string) string {
	u, err := url.Parse(backends.Redact(raw))
	if err != nil {
		return "(unparsable URL)"
	}
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	return u.String()
}

// clientOptions are the SDK options of every client: a bounded transport,
// bounded retries, and a User-Agent that names leaderrun.
func clientOptions(tr *transport) azcore.ClientOptions {
	return azcore.ClientOptions{
		Transport: tr,
		Retry: policy.RetryOptions{
			MaxRetries:    maxRetries,
			TryTimeout:    tryTimeout,
			RetryDelay:    100 * time.Millisecond,
			MaxRetryDelay: 500 * time.Millisecond,
		},
		Telemetry: policy.TelemetryOptions{ApplicationID: "leaderrun"},
	}
}

// transport is the SDK's HTTP transport: a client of its own that follows
// no redirect (the service never sends one, and following it would send
// the request, signed, elsewhere), with timeouts, and a cap on every
// answer's headers and body.
type transport struct{ c *http.Client }

func newTransport() *transport {
	t := &http.Transport{
		Proxy:                  http.ProxyFromEnvironment,
		DialContext:            (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:    dialTimeout,
		MaxResponseHeaderBytes: maxHeaders,
		MaxIdleConnsPerHost:    4,
		IdleConnTimeout:        90 * time.Second,
	}
	return &transport{c: &http.Client{
		Transport:     t,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// Do implements policy.Transporter.
func (t *transport) Do(req *http.Request) (*http.Response, error) {
	resp, err := t.c.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.ContentLength > maxAnswer {
		resp.Body.Close()
		return nil, fmt.Errorf("azureblob: %s answered %d bytes, more than the %d accepted: %w", req.URL.Host, resp.ContentLength, maxAnswer, errOversize)
	}
	resp.Body = &capped{r: resp.Body, left: maxAnswer, host: req.URL.Host}
	return resp, nil
}

func (t *transport) closeIdle() { t.c.CloseIdleConnections() }

// errOversize marks an answer larger than any the service sends: final.
var errOversize = errors.New("answer too large")

// capped fails a read past its limit: a server that sends more than it
// declared, or declares nothing and streams on, gets an error.
type capped struct {
	r    io.ReadCloser
	left int64
	host string
}

func (c *capped) Read(p []byte) (int, error) {
	if c.left <= 0 {
		var one [1]byte
		n, err := c.r.Read(one[:])
		if n > 0 {
			return 0, fmt.Errorf("azureblob: %s answered more than the %d bytes accepted: %w", c.host, maxAnswer, errOversize)
		}
		return 0, err
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	return n, err
}

func (c *capped) Close() error { return c.r.Close() }
