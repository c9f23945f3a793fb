package azureblob

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"

	"github.com/leaderrun/leaderrun/backends"
)

// Bounds of what the store sends and accepts.
const (
	// maxAnswer caps any answer's body: the largest blob the store
	// writes is maxBlob bytes, an error answer a few hundred.
	maxAnswer = 1 << 20
	// maxHeaders caps an answer's headers: a blob's metadata is at most
	// 8 KiB by the service's rules.
	maxHeaders = 64 << 10
	// tryTimeout bounds one try inside the SDK's retry policy, so that a
	// request stalled on a connection is sent again on another.
	tryTimeout = 4 * time.Second
	// maxRetries: a network error or a 408, 429 or 5xx is sent again
	// 100 ms then 300 ms later, so that a renewal's retries fit in the
	// runner's attempt timeout.
	maxRetries  = 2
	dialTimeout = 5 * time.Second
)

// Credentials are how the store authenticates, as the Azure CLI reads
// them from the environment (docs/backends/azureblob.md). The first that
// is set is used: ConnectionString, then Key, then SAS.
type Credentials struct {
	ConnectionString string // AZURE_STORAGE_CONNECTION_STRING
	Account          string // AZURE_STORAGE_ACCOUNT: for Key, and the default account URL
	Key              string // AZURE_STORAGE_KEY, base64
	SAS              string // AZURE_STORAGE_SAS_TOKEN, with or without its "?"; sp=rw on the blobs
}

func newContainerClient(cfg *Config, tr *transport) (*container.Client, string, error) {
	opts := &container.ClientOptions{ClientOptions: azcore.ClientOptions{Transport: tr,
		Retry:     policy.RetryOptions{MaxRetries: maxRetries, TryTimeout: tryTimeout, RetryDelay: 100 * time.Millisecond, MaxRetryDelay: 500 * time.Millisecond},
		Telemetry: policy.TelemetryOptions{ApplicationID: "leaderrun"}}}
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
		account := cmp.Or(cred.Account, accountOf(base))
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

// accountURL is the blob endpoint given, or the public cloud's.
func accountURL(given, account string) (*url.URL, error) {
	if given == "" {
		if account == "" {
			return nil, errors.New("azureblob: no storage account: set AZURE_STORAGE_ACCOUNT, the account URL, or AZURE_STORAGE_CONNECTION_STRING")
		}
		if !regexp.MustCompile(`^[a-z0-9]{3,24}$`).MatchString(account) {
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

// accountOf is the account an endpoint serves: the first label of its
// host, or the first segment of its path for an emulator or a proxy
// addressed by IP or as localhost (http://127.0.0.1:10000/ACCOUNT).
func accountOf(u *url.URL) string {
	host := u.Hostname()
	if net.ParseIP(host) != nil || host == "localhost" {
		first, _, _ := strings.Cut(strings.TrimPrefix(u.Path, "/"), "/")
		return first
	}
	first, _, _ := strings.Cut(host, ".")
	return first
}

// endpointOf is a URL for messages: never a query (a SAS).
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

// transport is the SDK's HTTP transport: it follows no redirect (the
// service sends none, and following it would send the signed request
// elsewhere), and caps every answer's headers and body.
type transport struct{ http.Client }

func newTransport() *transport {
	return &transport{http.Client{
		Transport: &http.Transport{Proxy: http.ProxyFromEnvironment,
			DialContext:         (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext,
			TLSHandshakeTimeout: dialTimeout, MaxResponseHeaderBytes: maxHeaders, MaxIdleConnsPerHost: 4, IdleConnTimeout: 90 * time.Second},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

func (t *transport) Do(req *http.Request) (*http.Response, error) {
	resp, err := t.Client.Do(req)
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

// errOversize marks an answer larger than any the service sends: final.
var errOversize = errors.New("answer too large")

// capped fails a read past its limit, declared or not.
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
