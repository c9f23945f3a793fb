package main

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"runtime"
	"strconv"
	"strings"
)

// base serves one empty image, base:empty, as much of the registry API
// as pulling it takes: the version check, its manifest (by tag or
// digest) and its config.
type base struct {
	manifest, config             []byte
	manifestDigest, configDigest string
}

const (
	manifestType = "application/vnd.oci.image.manifest.v1+json"
	configType   = "application/vnd.oci.image.config.v1+json"
)

func newBase() *base {
	b := &base{config: []byte(`{"architecture":"` + runtime.GOARCH + `","os":"linux","config":{},"rootfs":{"type":"layers","diff_ids":[]}}`)}
	b.configDigest = digest(b.config)
	b.manifest = []byte(`{"schemaVersion":2,"mediaType":"` + manifestType + `","config":{"mediaType":"` + configType +
		`","size":` + strconv.Itoa(len(b.config)) + `,"digest":"` + b.configDigest + `"},"layers":[]}`)
	b.manifestDigest = digest(b.manifest)
	return b
}

func digest(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func (b *base) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body []byte
	var kind, dig string
	switch p := r.URL.Path; {
	case p == "/v2/" || p == "/v2":
		w.WriteHeader(http.StatusOK)
		return
	case p == "/v2/base/manifests/empty" || p == "/v2/base/manifests/"+b.manifestDigest:
		body, kind, dig = b.manifest, manifestType, b.manifestDigest
	case strings.HasPrefix(p, "/v2/base/blobs/") && strings.TrimPrefix(p, "/v2/base/blobs/") == b.configDigest:
		body, kind, dig = b.config, configType, b.configDigest
	default:
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", kind)
	w.Header().Set("Docker-Content-Digest", dig)
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	if r.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
}
