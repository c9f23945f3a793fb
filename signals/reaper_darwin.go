//go:build darwin

package signals

// BecomeSubreaper is a no-op where the OS has no subreapers.
func BecomeSubreaper() error { return nil }
