package azureblob

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
)

// answer is the service's refusal of one request in one line, its HTTP
// status and error code, rather than the SDK's dozen lines, which carry
// the body and the request's query (a SAS).
type answer struct{ *azcore.ResponseError }

func (a answer) Error() string {
	return fmt.Sprintf("%d %s", a.StatusCode, cmp.Or(a.ErrorCode, http.StatusText(a.StatusCode)))
}

func (a answer) Unwrap() error { return a.ResponseError }

// clean turns an error of the SDK into one fit for a log line: a refusal
// becomes an answer; a transport error loses the URL's query, a SAS.
func clean(err error) error {
	if err == nil {
		return nil
	}
	var re *azcore.ResponseError
	if errors.As(err, &re) {
		return answer{re}
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("%s %s: %w", ue.Op, redactURL(ue.URL), ue.Err)
	}
	return err
}

func has(err error, codes ...bloberror.Code) bool { return bloberror.HasCode(err, codes...) }

// refused reports whether err is the service refusing us for good
// (credentials, permissions, a request it cannot serve, or one that the
// caller did not expect), or an answer no service sends (a redirect, too
// large), rather than a failure that may pass: no answer, a timeout, the
// service throttling (429) or failing (5xx, 408).
func refused(err error) bool {
	if errors.Is(err, errOversize) {
		return true
	}
	var re *azcore.ResponseError
	if !errors.As(err, &re) {
		return false
	}
	switch s := re.StatusCode; {
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
