package backends

import (
	"fmt"
	"regexp"
)

var lockNameRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

// ValidateLockName returns an error unless name is 1 to 128 characters from
// [A-Za-z0-9._-]. The same name must be safe as a file name, an etcd key and
// a Consul key, hence the narrow alphabet; "." and ".." are refused because
// they name directories.
func ValidateLockName(name string) error {
	if !lockNameRE.MatchString(name) || name == "." || name == ".." {
		return fmt.Errorf("invalid lock name %q: want 1-128 characters from [A-Za-z0-9._-]", name)
	}
	return nil
}
