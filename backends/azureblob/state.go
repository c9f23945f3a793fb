package azureblob

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blockblob"

	"github.com/leaderrun/leaderrun/backends"
)

// Sizes of what the backend stores, and so of what it reads back.
const (
	maxMarkers = 64 << 10  // the lock blob's content
	maxHistory = 128 << 10 // the state blob's content
	// maxBlob caps a blob read: what the backend writes, with room for a
	// writer of a later version that keeps a little more.
	maxBlob = 256 << 10
	// maxCAS bounds the rounds of a read-modify-write that meets
	// conflicts: each is another writer's write in between, which is
	// rare (a release recording its term, a stale candidate).
	maxCAS = 10
)

var notFound = []bloberror.Code{bloberror.BlobNotFound, bloberror.ContainerNotFound}

// blobData is one read of a blob: its content, ETag and metadata. A
// blob that does not exist reads as exists false.
type blobData struct {
	exists bool
	body   []byte
	etag   azcore.ETag
	meta   map[string]*string
}

// read downloads c, at most maxBlob bytes of it.
func read(ctx context.Context, c *blockblob.Client) (blobData, error) {
	resp, err := c.DownloadStream(ctx, nil)
	if has(err, notFound...) {
		return blobData{}, nil
	}
	if err != nil {
		return blobData{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBlob+1))
	if err != nil {
		return blobData{}, err
	}
	if len(body) > maxBlob {
		return blobData{}, fmt.Errorf("azureblob: %s is larger than the %d bytes accepted", endpointOf(c.URL()), maxBlob)
	}
	d := blobData{exists: true, body: body, meta: resp.Metadata}
	if resp.ETag != nil {
		d.etag = *resp.ETag
	}
	return d, nil
}

// upload writes body and metadata to c, if the blob's ETag is still
// d.etag (or, if d says it did not exist, if it still does not), and
// with the lease id leaseID if it is not "".
func upload(ctx context.Context, c *blockblob.Client, d blobData, body []byte, metadata map[string]*string, leaseID string) error {
	cond := &blob.AccessConditions{}
	switch {
	case leaseID != "":
		cond.LeaseAccessConditions = &blob.LeaseAccessConditions{LeaseID: &leaseID}
	case d.exists:
		cond.ModifiedAccessConditions = &blob.ModifiedAccessConditions{IfMatch: &d.etag}
	default:
		none := azcore.ETagAny
		cond.ModifiedAccessConditions = &blob.ModifiedAccessConditions{IfNoneMatch: &none}
	}
	ctype := "application/json"
	_, err := c.Upload(ctx, readSeekCloser{bytes.NewReader(body)}, &blockblob.UploadOptions{
		Metadata:         metadata,
		HTTPHeaders:      &blob.HTTPHeaders{BlobContentType: &ctype},
		AccessConditions: cond,
	})
	return err
}

type readSeekCloser struct{ *bytes.Reader }

func (readSeekCloser) Close() error { return nil }

// state is the state blob's content.
type state struct {
	History []backends.Term `json:"history"`
}

// readState reads the history; a blob that does not exist, or holds no
// JSON, has none.
func (b *Backend) readState(ctx context.Context) (state, error) {
	d, err := read(ctx, b.stateBlob)
	if err != nil || !d.exists {
		return state{}, err
	}
	var s state
	if len(d.body) > 0 {
		if err := json.Unmarshal(d.body, &s); err != nil {
			return state{}, fmt.Errorf("azureblob: %s holds no history: %w", b.blob+stateSuffix, err)
		}
	}
	return s, nil
}

// appendTerm adds t to the history, by a write conditional on the ETag
// read, and keeps the newest backends.HistoryLimit terms within
// maxHistory bytes. The state blob's metadata (the token's high-water
// mark) is written back as read; if the blob does not exist, it is
// created with mark as its mark (the larger of the term's token and the
// lock blob's).
func (b *Backend) appendTerm(ctx context.Context, t backends.Term) error {
	var err error
	for range maxCAS {
		var d blobData
		if d, err = read(ctx, b.stateBlob); err != nil {
			return err
		}
		var s state
		if len(d.body) > 0 {
			// A history that cannot be read is started again rather
			// than blocking every release after it.
			_ = json.Unmarshal(d.body, &s)
		}
		metadata := d.meta
		if !d.exists {
			if metadata, err = b.freshStateMeta(ctx, t.Token); err != nil {
				return err
			}
		}
		s.History = trimHistory(append(s.History, t))
		body, _ := json.Marshal(s)
		if err = upload(ctx, b.stateBlob, d, body, lowerKeys(metadata), ""); !has(err, conflict...) {
			return err
		}
	}
	return fmt.Errorf("azureblob: %d conflicting writes in a row: %w", maxCAS, err)
}

// freshStateMeta is the metadata of a state blob created anew to hold a
// term of token: a mark no lower than the lock blob's token.
func (b *Backend) freshStateMeta(ctx context.Context, token uint64) (map[string]*string, error) {
	p, err := b.lockBlob.GetProperties(ctx, nil)
	if err != nil && !has(err, notFound...) {
		return nil, err
	}
	mark := strconv.FormatUint(max(token, grantOf(p.Metadata).token), 10)
	return map[string]*string{metaToken: &mark}, nil
}

// lowerKeys is m with its keys in lower case, as written first: the SDK
// hands them back capitalised.
func lowerKeys(m map[string]*string) map[string]*string {
	out := make(map[string]*string, len(m))
	for k, v := range m {
		out[lower(k)] = v
	}
	return out
}

func lower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// trimHistory keeps the newest backends.HistoryLimit terms, oldest
// first, and drops the oldest while they take more than maxHistory bytes.
func trimHistory(terms []backends.Term) []backends.Term {
	slices.SortStableFunc(terms, func(a, b backends.Term) int { return cmp.Compare(a.Token, b.Token) })
	if len(terms) > backends.HistoryLimit {
		terms = terms[len(terms)-backends.HistoryLimit:]
	}
	for len(terms) > 1 {
		if data, _ := json.Marshal(state{History: terms}); len(data) <= maxHistory {
			break
		}
		terms = terms[1:]
	}
	return terms
}

// markers is the lock blob's content.
type markers struct {
	Markers []backends.Marker `json:"markers"`
}

// parseMarkers reads the lock blob's content; anything but markers
// (an empty blob, a blob someone else wrote) holds none.
func parseMarkers(body []byte) []backends.Marker {
	var m markers
	if len(body) > 0 {
		_ = json.Unmarshal(body, &m)
	}
	return m.Markers
}

// withMarker is ms with m in place of any marker of its key, without
// those expired at now, and without the oldest others while they take
// more than maxMarkers bytes.
func withMarker(ms []backends.Marker, m backends.Marker, now time.Time) []backends.Marker {
	var others []backends.Marker
	for _, o := range ms {
		if o.Key != m.Key && o.Expires.After(now) {
			others = append(others, o)
		}
	}
	slices.SortStableFunc(others, func(a, b backends.Marker) int { return a.At.Compare(b.At) })
	for len(others) > 0 {
		if data, _ := json.Marshal(markers{Markers: append(others, m)}); len(data) <= maxMarkers {
			break
		}
		others = others[1:]
	}
	return append(others, m)
}
