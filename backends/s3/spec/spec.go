// Package spec is what the command line knows of an S3 lock without the
// AWS SDK, which leaderrun leaves to its companion, leaderrun-aws.
package spec

import (
	"fmt"
	"log/slog"
	"strings"
)

// Addressing styles (Settings.Addressing), as the AWS CLI names them; auto
// is path-style for an endpoint that is not AWS's, virtual-hosted on AWS.
const (
	AddressingAuto    = "auto"
	AddressingPath    = "path"
	AddressingVirtual = "virtual"
)

// StateSuffix ends the key of the state object beside each lock object; a
// lock name has no '~', and ValidatePrefix refuses one.
const StateSuffix = "~state"

// Settings describe one bucket; empty fields are read as the AWS CLI
// reads them (AWS_REGION, AWS_ENDPOINT_URL_S3, a profile's), Addressing
// is AddressingAuto, and a nil Log logs nothing.
type Settings struct {
	Bucket, Region, Endpoint, Addressing string
	// Prefix begins every object's key: <Prefix><lock>.
	Prefix string
	// Log receives the SDK's warnings.
	Log *slog.Logger
}

// ValidateBucket returns an error unless name follows AWS's rules for
// bucket names, which every S3-compatible server accepts: 3-63 characters
// from [a-z0-9.-], beginning and ending with a letter or digit.
func ValidateBucket(name string) error {
	alnum := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }
	ok := len(name) >= 3 && len(name) <= 63 && alnum(name[0]) && alnum(name[len(name)-1])
	for i := 0; ok && i < len(name); i++ {
		ok = alnum(name[i]) || name[i] == '.' || name[i] == '-'
	}
	if !ok {
		return fmt.Errorf("s3: bucket name %q: want 3-63 characters from [a-z0-9.-], beginning and ending with a letter or digit", name)
	}
	return nil
}

// ValidatePrefix returns an error unless p can begin a key: at most 512
// bytes (S3's keys have 1024), no '~', no leading '/' and no "//" (which
// some servers fold away).
func ValidatePrefix(p string) error {
	if len(p) > 512 || strings.Contains(p, "~") || strings.Contains(p, "//") || strings.HasPrefix(p, "/") {
		return fmt.Errorf("s3: prefix %q: want at most 512 bytes, no '~', no leading '/' and no \"//\"", p)
	}
	return nil
}

// ValidateAddressing returns an error unless style is an addressing style
// or "".
func ValidateAddressing(style string) error {
	if style != "" && style != AddressingAuto && style != AddressingPath && style != AddressingVirtual {
		return fmt.Errorf("s3: addressing style %q: want auto, path or virtual", style)
	}
	return nil
}
