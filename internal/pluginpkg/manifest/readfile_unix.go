//go:build unix

package manifest

import "syscall"

const (
	oNonBlock = syscall.O_NONBLOCK
	oNoFollow = syscall.O_NOFOLLOW
)
