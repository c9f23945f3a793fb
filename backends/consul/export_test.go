package consul

// ParkedTTL is parkedTTL, for the tests of what waiters send.
const ParkedTTL = parkedTTL

// Session is the ID of the Consul session that holds the lock, for the
// tests that end it behind the holder's back.
func (t *candidate) Session() string { return t.session }
