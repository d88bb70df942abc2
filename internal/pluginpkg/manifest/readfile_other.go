//go:build !unix

package manifest

// Elsewhere there are no FIFOs to wait on; Lstat has refused links.
const (
	oNonBlock = 0
	oNoFollow = 0
)
