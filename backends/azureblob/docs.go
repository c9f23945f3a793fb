package azureblob

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/streaming"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blockblob"

	"github.com/leaderrun/leaderrun/backends"
)

const (
	// maxBlob caps a blob read: what the store writes, with room for a
	// writer of a later version that keeps a little more.
	maxBlob = 256 << 10
	maxCAS  = 10 // rounds of drawing a token: each met another write, which is rare
)

var notFound = []bloberror.Code{bloberror.BlobNotFound, bloberror.ContainerNotFound}

// blobOf is the blob that holds document name, and the field of its
// content: the history in the state blob, {"history": DOC}, written with
// If-Match on its ETag; the markers in the lock blob, {"markers": DOC},
// written under the lease. Earlier releases wrote the same.
func (l *lock) blobOf(name string) (*blockblob.Client, string) {
	if name == backends.DocMarkers {
		return l.lockBlob, "markers"
	}
	return l.stateBlob, "history"
}

func (l *lock) ReadDoc(ctx context.Context, name string) (backends.Doc, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	c, field := l.blobOf(name)
	d, err := read(ctx, c)
	if err != nil {
		return backends.Doc{Name: name}, l.unavailable("read the "+name+" in", err)
	}
	doc := backends.Doc{Name: name}
	var wrapped map[string]json.RawMessage
	if json.Unmarshal(d.body, &wrapped) == nil && len(wrapped[field]) > 0 {
		doc.Data = wrapped[field]
	}
	if d.exists {
		doc.Version = d // what a write is conditioned on
	}
	return doc, nil
}

// WriteDoc implements backends.Lock: by a write conditional on the ETag
// read, keeping the blob's metadata.
func (l *lock) WriteDoc(ctx context.Context, doc backends.Doc) error {
	return l.writeDoc(ctx, doc, nil)
}

// WriteDocHeld implements backends.RecordLock: WriteDoc with the lease id,
// which the service accepts only while that lease is active.
func (l *lock) WriteDocHeld(ctx context.Context, doc backends.Doc, rec backends.Record) error {
	err := l.writeDoc(ctx, doc, rec.Handle.(*leaseHandle))
	if has(err, blobOpLost...) {
		return l.lostErr("the "+doc.Name, rec, err)
	}
	return err
}

func (l *lock) writeDoc(ctx context.Context, doc backends.Doc, h *leaseHandle) error {
	c, field := l.blobOf(doc.Name)
	read, _ := doc.Version.(blobData)
	body, err := json.Marshal(map[string]json.RawMessage{field: doc.Data})
	if err != nil {
		return err
	}
	metadata := lowerKeys(read.meta)
	if !read.exists && field == "history" {
		// A state blob created anew holds the lock blob's token as its
		// mark, as a grant would have written it.
		p, err := l.lockBlob.GetProperties(ctx, nil)
		if err != nil && !has(err, notFound...) {
			return l.unavailable("read", err)
		}
		mark := fmt.Sprint(recordOf(p.Metadata).Token)
		metadata = map[string]*string{metaToken: &mark}
	}
	err = upload(ctx, c, read, body, metadata, h)
	switch {
	case has(err, conflict...):
		return fmt.Errorf("azureblob: %s: %w", l.Key(), backends.ErrConflict)
	case err != nil && !has(err, blobOpLost...):
		return l.unavailable("write the "+doc.Name+" in", err)
	}
	return err
}

type blobData struct {
	exists bool
	body   []byte
	etag   azcore.ETag
	meta   map[string]*string
}

// read downloads c, at most maxBlob bytes of it.
func read(ctx context.Context, c *blockblob.Client) (blobData, error) {
	resp, err := c.DownloadStream(ctx, nil)
	switch {
	case has(err, notFound...):
		return blobData{}, nil
	case err != nil:
		return blobData{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBlob+1))
	if err != nil {
		return blobData{}, err
	}
	if len(body) > maxBlob {
		return blobData{}, fmt.Errorf("azureblob: %s is larger than the %d bytes accepted: %w", endpointOf(c.URL()), maxBlob, errOversize)
	}
	d := blobData{exists: true, body: body, meta: resp.Metadata}
	if resp.ETag != nil {
		d.etag = *resp.ETag
	}
	return d, nil
}

// upload writes body and metadata to c, with h's lease id if h is not
// nil, if the blob is still as d found it.
func upload(ctx context.Context, c *blockblob.Client, d blobData, body []byte, metadata map[string]*string, h *leaseHandle) error {
	cond := &blob.AccessConditions{ModifiedAccessConditions: &blob.ModifiedAccessConditions{IfMatch: &d.etag}}
	if !d.exists {
		cond.ModifiedAccessConditions = &blob.ModifiedAccessConditions{IfNoneMatch: new(azcore.ETagAny)}
	}
	if h != nil {
		cond.LeaseAccessConditions = h.cond().LeaseAccessConditions
	}
	ctype := "application/json"
	_, err := c.Upload(ctx, streaming.NopCloser(bytes.NewReader(body)), &blockblob.UploadOptions{
		Metadata: metadata, HTTPHeaders: &blob.HTTPHeaders{BlobContentType: &ctype}, AccessConditions: cond})
	return err
}

// lowerKeys is m with its keys in lower case, as written first: the SDK
// hands them back capitalised. (Metadata names are ASCII: HTTP headers.)
func lowerKeys(m map[string]*string) map[string]*string {
	out := make(map[string]*string, len(m))
	for k, v := range m {
		out[strings.ToLower(k)] = v
	}
	return out
}
