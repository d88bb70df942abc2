//go:build !linux

package pluginsandbox

import "syscall"

// reusePort does nothing here: one replica binds the address, the others
// report the binding failed.
func reusePort(_, _ string, _ syscall.RawConn) error { return nil }
