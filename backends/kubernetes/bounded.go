package kubernetes

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
)

// maxAnswer bounds one answer, and one event of a watch: a Lease is at
// most a few hundred KiB (the apiserver caps its annotations at 256 KiB),
// and decoding holds a few copies, far below 64 MiB.
const maxAnswer = 4 << 20

var errTooLarge = fmt.Errorf("%w: an answer or watch event larger than %d MiB", errProtocol, maxAnswer>>20)

// bound is the rest.Config transport wrapper that bounds every answer's
// body to maxAnswer bytes. A watch's body is one answer of many events:
// its frame reader (boundedFramer) restarts the count at every event.
func bound(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		if err == nil && resp.Body != nil {
			resp.Body = &boundedBody{rc: resp.Body}
		}
		return resp, err
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// boundedBody fails a read past maxAnswer bytes since it was opened or
// since the last event ended, whitespace between events included.
type boundedBody struct {
	rc   io.ReadCloser
	read atomic.Int64 // since the start, or the end of the last event
}

func (b *boundedBody) Read(p []byte) (int, error) {
	left := maxAnswer + 1 - b.read.Load()
	if left <= 0 {
		return 0, errTooLarge
	}
	if int64(len(p)) > left {
		p = p[:left]
	}
	n, err := b.rc.Read(p)
	if b.read.Add(int64(n)) > maxAnswer {
		return n, errTooLarge
	}
	return n, err
}

func (b *boundedBody) Close() error { return b.rc.Close() }

// eventDone restarts the count: what was read belongs to events handed
// on (what encoding/json read ahead of the next is at most its buffer).
func (b *boundedBody) eventDone() { b.read.Store(0) }

// boundedFramer is the JSON framer of watch streams, counting each event.
type boundedFramer struct{ runtime.Framer }

func (f boundedFramer) NewFrameReader(r io.ReadCloser) io.ReadCloser {
	body, ok := r.(*boundedBody)
	if !ok {
		body = &boundedBody{rc: r}
	}
	return &frameReader{ReadCloser: f.Framer.NewFrameReader(body), body: body}
}

// frameReader hands on one event per Read, as client-go's JSON frame
// reader does, and tells the body when an event ended.
type frameReader struct {
	io.ReadCloser
	body *boundedBody
}

func (r *frameReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	if err == nil {
		// A whole event, or the last part of one (io.ErrShortBuffer
		// means that more of it follows).
		r.body.eventDone()
	}
	return n, err
}

// leaseSerializer is the serializer of the REST client: JSON only, with
// boundedFramer for watches. Its scheme knows Leases and meta/v1 only:
// client-go's kubernetes/scheme registers every API group at start-up,
// which every run of leaderrun would pay, whatever its store.
func leaseSerializer() runtime.NegotiatedSerializer {
	scheme := runtime.NewScheme()
	if err := coordinationv1.AddToScheme(scheme); err != nil {
		panic(err) // registers two types: cannot fail
	}
	codecs := serializer.NewCodecFactory(scheme)
	info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
	if !ok || info.StreamSerializer == nil {
		panic(errors.New("kubernetes: no JSON serializer"))
	}
	stream := *info.StreamSerializer
	stream.Framer = boundedFramer{stream.Framer}
	info.StreamSerializer = &stream
	return jsonOnly{NegotiatedSerializer: codecs.WithoutConversion(), info: info}
}

type jsonOnly struct {
	runtime.NegotiatedSerializer
	info runtime.SerializerInfo
}

func (j jsonOnly) SupportedMediaTypes() []runtime.SerializerInfo {
	return []runtime.SerializerInfo{j.info}
}
