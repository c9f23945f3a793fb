package azureblob

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
)

// answer is the service's refusal of one request, as one line: its HTTP
// status and the service's error code. The SDK's own message spans a
// dozen lines and carries the whole answer's body; this one carries
// neither the body nor the request's query, which may be a SAS. The
// SDK's error stays reachable with errors.As.
type answer struct {
	status int
	code   string
	err    *azcore.ResponseError
}

func (a *answer) Error() string {
	if a.code == "" {
		return fmt.Sprintf("%d %s", a.status, http.StatusText(a.status))
	}
	return fmt.Sprintf("%d %s", a.status, a.code)
}

func (a *answer) Unwrap() error { return a.err }

// clean turns an error of the SDK into one fit for a log line: a refusal
// becomes an answer; a transport error loses the URL's query (a SAS is a
// query, and net/url's error prints it whole), keeping its cause for
// errors.Is. Other errors pass unchanged.
func clean(err error) error {
	if err == nil {
		return nil
	}
	var re *azcore.ResponseError
	if errors.As(err, &re) {
		return &answer{status: re.StatusCode, code: re.ErrorCode, err: re}
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("%s %s: %w", ue.Op, redactURL(ue.URL), ue.Err)
	}
	return err
}

// status is the HTTP status of the service's answer in err, 0 if err is
// no answer (a network error, a timeout).
func status(err error) int {
	var re *azcore.ResponseError
	if errors.As(err, &re) {
		return re.StatusCode
	}
	return 0
}

// has reports whether err is an answer with one of codes.
func has(err error, codes ...bloberror.Code) bool { return bloberror.HasCode(err, codes...) }

// refused reports whether err is the service refusing us for good:
// credentials or permissions (401, 403), a request it cannot serve (400,
// 405, 411, 413, 416, and a 404 or 409 the caller did not expect), or an
// answer no service sends (a redirect, too large),
// as opposed to a failure that may pass: the network, a timeout, the
// service throttling (429) or failing (5xx, 408).
func refused(err error) bool {
	if errors.Is(err, errOversize) {
		return true
	}
	switch s := status(err); {
	case s == 0, s == http.StatusRequestTimeout, s == http.StatusTooManyRequests, s >= 500:
		return false
	}
	return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// Error codes that say a lease is not ours (any more) or not active.
var (
	// On lease operations (Renew, Release): 409.
	leaseOpLost = []bloberror.Code{
		bloberror.LeaseIDMismatchWithLeaseOperation, bloberror.LeaseIsBrokenAndCannotBeRenewed,
		bloberror.LeaseIsBreakingAndCannotBeAcquired, bloberror.LeaseIsBreakingAndCannotBeChanged,
		bloberror.LeaseNotPresentWithLeaseOperation, bloberror.LeaseAlreadyPresent,
		bloberror.BlobNotFound, bloberror.ContainerNotFound,
	}
	// On reads and writes that carry the lease id: 412.
	blobOpLost = []bloberror.Code{
		bloberror.LeaseIDMismatchWithBlobOperation, bloberror.LeaseLost, bloberror.LeaseNotPresentWithBlobOperation,
		bloberror.LeaseIDMissing, bloberror.BlobNotFound, bloberror.ContainerNotFound,
	}
	// On an acquisition: held by someone else, or being broken.
	held = []bloberror.Code{bloberror.LeaseAlreadyPresent, bloberror.LeaseIsBreakingAndCannotBeAcquired}
	// On a write conditional on an ETag (If-Match, If-None-Match: *):
	// someone wrote, created or deleted the blob since it was read.
	conflict = []bloberror.Code{bloberror.ConditionNotMet, bloberror.BlobAlreadyExists, bloberror.BlobNotFound}
)
