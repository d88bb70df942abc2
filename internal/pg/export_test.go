package pg

// LockKeyFor is the migration lock's key, for tests that hold it.
var LockKeyFor = lockKeyFor
