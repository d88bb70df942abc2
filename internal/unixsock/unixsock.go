// Package unixsock listens on Unix sockets the careful way: the folder is
// created 0700, a leftover path is removed only if it really is a socket
// and no process listens on it, and the socket file is 0600.
package unixsock

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// ErrNotSocket is returned when the socket path exists and is something
// other than a socket, which is never removed.
var ErrNotSocket = errors.New("path exists and is not a socket")

// ErrInUse is returned when a process accepts connections on the socket
// path: it is not stale, and removing it would leave that process running
// and unreachable (a second stack, gateway or bridge named the same path).
var ErrInUse = errors.New("another process listens on the socket")

// Serving reports whether a process accepts connections on the Unix
// socket at path (a full backlog included). A missing path does not, nor
// a socket file a process that died left (its connect is refused).
func Serving(path string) bool {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return true
	}
	return errors.Is(err, syscall.EAGAIN)
}

// Listen creates the socket at path. The parent folder is created with mode
// 0700 when missing; an existing parent is left as it is.
func Listen(path string) (*net.UnixListener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("socket folder: %w", err)
	}
	if err := removeStale(path); err != nil {
		return nil, err
	}
	// The umask makes the file 0600 from its creation, so no other user can
	// connect in the window before the chmod below.
	old := syscall.Umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("chmod socket: %w", err)
	}
	ln.SetUnlinkOnClose(true)
	return ln, nil
}

func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stat socket path: %w", err)
	}
	if fi.Mode()&fs.ModeSocket == 0 {
		return fmt.Errorf("%s: %w", path, ErrNotSocket)
	}
	if Serving(path) {
		return fmt.Errorf("%s: %w", path, ErrInUse)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	return nil
}
