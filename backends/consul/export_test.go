package consul

// ParkedTTL is parkedTTL, for the tests of what waiters send.
const ParkedTTL = parkedTTL
