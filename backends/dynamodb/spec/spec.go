// Package spec is what the command line knows of a DynamoDB lock without
// the AWS SDK, which the leaderrun binary leaves out: it checks DynamoDB
// flags before it hands the run over to leaderrun-aws, the binary that
// has the store (docs/backends/dynamodb.md says why).
package spec

import (
	"fmt"
	"log/slog"
	"strings"
)

// DefaultTable is Settings.Table's default.
const DefaultTable = "leaderrun_locks"

// maxPrefix keeps the item names within DynamoDB's 2048-byte keys.
const maxPrefix = 1024

// Settings describe one DynamoDB table; each field notes its zero value.
type Settings struct {
	// Table is the table's name. Empty: DefaultTable.
	Table string
	// Region is the AWS Region. Empty: as the SDK reads it (AWS_REGION,
	// the profile's).
	Region string
	// Endpoint overrides DynamoDB's endpoint URL (an emulator, a VPC
	// endpoint). Empty: as the SDK resolves it (AWS_ENDPOINT_URL_DYNAMODB,
	// AWS_ENDPOINT_URL, the profile's, else the Region's).
	Endpoint string
	// Prefix begins every lock item's name: <Prefix><lock>.
	Prefix string
	// Log receives the store's events (a table created). Nil: none.
	Log *slog.Logger
}

// ValidatePrefix returns an error unless p can start the name of a lock
// item: no '#' (which separates the items kept beside it) and at most 1024
// bytes.
func ValidatePrefix(p string) error {
	if strings.Contains(p, "#") || len(p) > maxPrefix {
		return fmt.Errorf("dynamodb: prefix %q: want at most %d bytes and no '#'", p, maxPrefix)
	}
	return nil
}

// ValidateTable returns an error unless name is a DynamoDB table name:
// 3-255 characters from [A-Za-z0-9_.-].
func ValidateTable(name string) error {
	ok := len(name) >= 3 && len(name) <= 255
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		ok = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-'
	}
	if !ok {
		return fmt.Errorf("dynamodb: table name %q: want 3-255 characters from [A-Za-z0-9_.-]", name)
	}
	return nil
}
