package pg

// LockKeyFor is the migration lock's key, for tests that hold it.
var LockKeyFor = lockKeyFor

// SetPingAnswer has Watch's pings answered with f's error (nil: as the
// server answered) until the test ends.
func SetPingAnswer(t interface{ Cleanup(func()) }, f func() error) {
	pingAnswer = f
	t.Cleanup(func() { pingAnswer = nil })
}
