// Package spec is what the command line knows of an S3 lock without the
// AWS SDK: the settings the store is opened with and the rules for bucket
// names, prefixes and addressing styles. It imports nothing of the SDK, so
// that the leaderrun binary, which leaves the SDK out, checks the S3 flags
// before it hands the run over to leaderrun-aws (docs/backends/s3.md).
package spec

import (
	"fmt"
	"log/slog"
	"strings"
)

// Addressing styles (Settings.Addressing), as the AWS CLI's
// addressing_style names them.
const (
	// AddressingAuto: path-style for an endpoint that is not AWS's (MinIO,
	// Ceph, R2, versitygw), virtual-hosted on AWS.
	AddressingAuto = "auto"
	// AddressingPath: https://ENDPOINT/BUCKET/KEY.
	AddressingPath = "path"
	// AddressingVirtual: https://BUCKET.ENDPOINT/KEY.
	AddressingVirtual = "virtual"
)

// StateSuffix ends the name of the state object kept beside each lock
// object; a lock name has no '~', and ValidatePrefix refuses one.
const StateSuffix = "~state"

// maxPrefix keeps the objects' keys within S3's 1024 bytes.
const maxPrefix = 512

// Settings describe one bucket. The zero value of each field is noted.
type Settings struct {
	// Bucket holds the locks' objects. Required.
	Bucket string
	// Region is the bucket's Region. Empty: as the SDK reads it
	// (AWS_REGION, the profile's).
	Region string
	// Endpoint overrides S3's endpoint URL. Empty: as the SDK resolves it
	// (AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's, else the
	// Region's).
	Endpoint string
	// Addressing is AddressingAuto, AddressingPath or AddressingVirtual.
	// Empty: AddressingAuto.
	Addressing string
	// Prefix begins every object's key: <Prefix><lock>.
	Prefix string
	// Log receives the SDK's warnings. Nil: none.
	Log *slog.Logger
}

// ValidateBucket returns an error unless name is an S3 bucket name: 3-63
// characters from [a-z0-9.-], beginning and ending with a letter or digit.
// Servers that allow more (upper case, underscores) are asked to follow
// AWS's rules here, which every server accepts.
func ValidateBucket(name string) error {
	ok := len(name) >= 3 && len(name) <= 63 && alnum(name[0]) && alnum(name[len(name)-1])
	for i := 0; ok && i < len(name); i++ {
		ok = alnum(name[i]) || name[i] == '.' || name[i] == '-'
	}
	if !ok {
		return fmt.Errorf("s3: bucket name %q: want 3-63 characters from [a-z0-9.-], beginning and ending with a letter or digit", name)
	}
	return nil
}

func alnum(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }

// ValidatePrefix returns an error unless p can begin an object's key: at
// most 512 bytes, no '~' (which names the state object beside a lock's),
// no "//" and no leading '/' (which some servers fold away).
func ValidatePrefix(p string) error {
	if len(p) > maxPrefix || strings.Contains(p, "~") || strings.Contains(p, "//") || strings.HasPrefix(p, "/") {
		return fmt.Errorf("s3: prefix %q: want at most %d bytes, no '~', no leading '/' and no \"//\"", p, maxPrefix)
	}
	return nil
}

// ValidateAddressing returns an error unless style is an addressing
// style ("" is AddressingAuto).
func ValidateAddressing(style string) error {
	switch style {
	case "", AddressingAuto, AddressingPath, AddressingVirtual:
		return nil
	}
	return fmt.Errorf("s3: addressing style %q: want auto, path or virtual", style)
}
