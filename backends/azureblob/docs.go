package azureblob

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blockblob"

	"github.com/leaderrun/leaderrun/backends"
)

// A lock's documents live in its blobs' content: the history in the state
// blob, {"history": DOC}, written with If-Match on its ETag, keeping its
// metadata (the token's mark); the markers in the lock blob,
// {"markers": DOC}, written under the lease, keeping the grant's
// metadata. The wrapping is what earlier releases wrote, so that they and
// this one read each other's documents.

const (
	// maxBlob caps a blob read: what the store writes, with room for a
	// writer of a later version that keeps a little more.
	maxBlob = 256 << 10
	// maxCAS bounds the rounds of drawing a token that meets conflicts:
	// each is another writer's write in between, which is rare (a
	// release recording its term, a stale candidate).
	maxCAS = 10
)

var notFound = []bloberror.Code{bloberror.BlobNotFound, bloberror.ContainerNotFound}

// blobOf is the blob that holds document name, and the field it is in.
func (l *lock) blobOf(name string) (*blockblob.Client, string) {
	if name == backends.DocMarkers {
		return l.lockBlob, "markers"
	}
	return l.stateBlob, "history"
}

// version is what a document's write is conditioned on: the blob as read.
type version struct{ d blobData }

// ReadDoc implements backends.Lock.
func (l *lock) ReadDoc(ctx context.Context, name string) (backends.Doc, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	c, field := l.blobOf(name)
	d, err := read(ctx, c)
	if err != nil {
		return backends.Doc{Name: name}, l.unavailable("read the "+name+" in", err)
	}
	doc := backends.Doc{Name: name, Version: version{d}}
	var wrapped map[string]json.RawMessage
	if json.Unmarshal(d.body, &wrapped) == nil && len(wrapped[field]) > 0 {
		doc.Data = wrapped[field]
	}
	if !d.exists {
		doc.Version = nil
	}
	return doc, nil
}

// WriteDoc implements backends.Lock: the history, by a write conditional
// on the ETag read. The markers are written only under a lease
// (WriteDocHeld).
func (l *lock) WriteDoc(ctx context.Context, doc backends.Doc) error {
	return l.writeDoc(ctx, doc, nil)
}

// WriteDocHeld implements backends.RecordLock: with the lease id, which
// the service accepts only while that lease is active.
func (l *lock) WriteDocHeld(ctx context.Context, doc backends.Doc, rec backends.Record) error {
	err := l.writeDoc(ctx, doc, rec.Handle.(*leaseHandle))
	if has(err, blobOpLost...) {
		return l.lostErr("the "+doc.Name, rec, err)
	}
	return err
}

func (l *lock) writeDoc(ctx context.Context, doc backends.Doc, h *leaseHandle) error {
	c, field := l.blobOf(doc.Name)
	v, _ := doc.Version.(version)
	body, err := json.Marshal(map[string]json.RawMessage{field: doc.Data})
	if err != nil {
		return err
	}
	metadata := lowerKeys(v.d.meta)
	if !v.d.exists && field == "history" {
		// A state blob created anew holds the lock blob's token as its
		// mark, as a grant would have written it.
		if metadata, err = l.freshMark(ctx); err != nil {
			return l.unavailable("read", err)
		}
	}
	err = upload(ctx, c, v.d, body, metadata, h)
	switch {
	case has(err, conflict...):
		return fmt.Errorf("azureblob: %s: %w", l.Key(), backends.ErrConflict)
	case err != nil && !has(err, blobOpLost...):
		return l.unavailable("write the "+doc.Name+" in", err)
	}
	return err
}

// freshMark is the metadata of a state blob created anew: a mark no lower
// than the lock blob's token.
func (l *lock) freshMark(ctx context.Context) (map[string]*string, error) {
	p, err := l.lockBlob.GetProperties(ctx, nil)
	if err != nil && !has(err, notFound...) {
		return nil, err
	}
	mark := fmt.Sprint(grantOf(p.Metadata).token)
	return map[string]*string{metaToken: &mark}, nil
}

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
		return blobData{}, fmt.Errorf("azureblob: %s is larger than the %d bytes accepted: %w", endpointOf(c.URL()), maxBlob, errOversize)
	}
	d := blobData{exists: true, body: body, meta: resp.Metadata}
	if resp.ETag != nil {
		d.etag = *resp.ETag
	}
	return d, nil
}

// upload writes body and metadata to c, with h's lease id if h is not
// nil, and if the blob's ETag is still d.etag (or, if d says it did not
// exist, if it still does not).
func upload(ctx context.Context, c *blockblob.Client, d blobData, body []byte, metadata map[string]*string, h *leaseHandle) error {
	cond := &blob.AccessConditions{}
	if h != nil {
		cond.LeaseAccessConditions = &blob.LeaseAccessConditions{LeaseID: &h.id}
	}
	if d.exists {
		cond.ModifiedAccessConditions = &blob.ModifiedAccessConditions{IfMatch: &d.etag}
	} else {
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

// lowerKeys is m with its keys in lower case, as written first: the SDK
// hands them back capitalised.
func lowerKeys(m map[string]*string) map[string]*string {
	out := make(map[string]*string, len(m))
	for k, v := range m {
		b := []byte(k)
		for i, c := range b {
			if c >= 'A' && c <= 'Z' {
				b[i] = c + 'a' - 'A'
			}
		}
		out[string(b)] = v
	}
	return out
}
