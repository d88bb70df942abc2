// Package durablesock is the durable bridge's private socket (seed 004):
// where it lives and the rules its path must pass. The bridge listens
// there itself, or is handed the socket by the launcher, which holds it
// while the bridge is dormant (not started until a client connects).
package durablesock

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"

	"github.com/clawmesh/clawmesh/internal/unixsock"
)

// EnvSocket names the private socket, for the bridge and for Collie.
const EnvSocket = "COLLIE_DURABLE_SOCKET"

// DefaultSocket is the socket's path in a data directory.
func DefaultSocket(dataDir string) string { return filepath.Join(dataDir, "durable.sock") }

// maxSocketPath is seed 004's bound on the socket path, in bytes.
const maxSocketPath = 103

// ErrNotPrivate is a socket path that fails the privacy rules.
var ErrNotPrivate = errors.New("durable socket is not private")

// ErrInUse is a socket path another process listens on (unixsock's:
// every socket the stack listens on is refused so).
var ErrInUse = unixsock.ErrInUse

// CheckSocketPath applies seed 004's rules to the private socket's path:
// absolute, at most 103 bytes, no part of it a symbolic link, its folder
// the bridge's own with mode 0700 (created so when missing), and no
// folder above it writable by group or others unless sticky (as /tmp).
// An existing file at the path must be a socket (it is stale and is
// removed when listening).
func CheckSocketPath(path string) error {
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrNotPrivate, path, fmt.Sprintf(format, args...))
	}
	if !filepath.IsAbs(path) {
		return refuse("the path must be absolute")
	}
	if len(path) > maxSocketPath {
		return refuse("the path is %d bytes; at most %d are allowed", len(path), maxSocketPath)
	}
	if filepath.Clean(path) != path {
		return refuse("the path must be clean (no //, . or .. parts)")
	}
	dir := filepath.Dir(path)
	uid := os.Getuid()
	// Every folder from the root down to the socket's folder.
	var parts []string
	for d := dir; ; d = filepath.Dir(d) {
		parts = append(parts, d)
		if d == "/" {
			break
		}
	}
	for i := len(parts) - 1; i >= 0; i-- {
		d := parts[i]
		fi, err := os.Lstat(d)
		if errors.Is(err, fs.ErrNotExist) && i == 0 {
			if err := os.Mkdir(d, 0o700); err != nil {
				return refuse("create the socket folder %s: %v", d, err)
			}
			fi, err = os.Lstat(d)
		}
		if err != nil {
			return refuse("%s: %v", d, err)
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return refuse("%s is a symbolic link", d)
		}
		if !fi.IsDir() {
			return refuse("%s is not a folder", d)
		}
		if i > 0 && fi.Mode().Perm()&0o022 != 0 && fi.Mode()&fs.ModeSticky == 0 {
			return refuse("%s is writable by group or others (mode %04o) and not sticky", d, fi.Mode().Perm())
		}
		if i == 0 {
			st, ok := fi.Sys().(*syscall.Stat_t)
			if !ok || int(st.Uid) != uid {
				return refuse("the socket folder %s belongs to another user", d)
			}
			if fi.Mode().Perm() != 0o700 {
				return refuse("the socket folder %s has mode %04o; it must be 0700", d, fi.Mode().Perm())
			}
		}
	}
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return refuse("%v", err)
	case fi.Mode()&fs.ModeSymlink != 0:
		return refuse("the socket path is a symbolic link")
	case fi.Mode()&fs.ModeSocket == 0:
		return refuse("a file that is not a socket is in the way")
	}
	return nil
}

// ListenSocket checks the path and listens there: the socket is 0600, a
// stale socket file is removed first. A socket another process listens on
// is not stale (ErrInUse): both sides read COLLIE_DURABLE_SOCKET, so a
// second stack may name the path of a running one, which removing it
// would leave running unreachable.
func ListenSocket(path string) (net.Listener, error) {
	if err := CheckSocketPath(path); err != nil {
		return nil, err
	}
	ln, err := unixsock.Listen(path)
	if err != nil {
		return nil, fmt.Errorf("durable socket: %w", err)
	}
	return ln, nil
}
