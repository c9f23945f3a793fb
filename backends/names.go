package backends

import "fmt"

// ValidateLockName returns an error unless name is 1 to 128 characters from
// [A-Za-z0-9._-]. The same name must be safe as a file name, an etcd key and
// a Consul key, hence the narrow alphabet; "." and ".." are refused because
// they name directories.
func ValidateLockName(name string) error {
	ok := len(name) >= 1 && len(name) <= 128 && name != "." && name != ".."
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		ok = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
	}
	if !ok {
		return fmt.Errorf("invalid lock name %q: want 1-128 characters from [A-Za-z0-9._-]", name)
	}
	return nil
}
