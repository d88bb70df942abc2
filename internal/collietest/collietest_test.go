package collietest

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
)

// Collie lstats each part of the socket's path; the parts it checked were
// those of the cleaned path, the kernel follows the path as written. With
// a `..` after a symbolic link, the link was never looked at and the
// folder the socket really is in (here one anyone may write to) was never
// checked: the path passed. A path that is not clean is refused, as the
// bridge refuses it.
func TestCheckSocketPathRefusesAPathThatIsNotClean(t *testing.T) {
	base := t.TempDir()
	open := filepath.Join(base, "other", "real")
	if err := os.MkdirAll(open, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(base, "real"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(base, "other", "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(base, "other", "sub"), filepath.Join(base, "link")); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(open, "d.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := os.Chmod(filepath.Join(open, "d.sock"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(base, "link") + "/../real/d.sock"
	if len(path) > 103 {
		t.Skipf("the temporary folder's path is too long (%d bytes)", len(path))
	}
	if err := CheckSocketPath(path); !errors.Is(err, ErrNotPrivate) {
		t.Fatalf("CheckSocketPath(%s) = %v, want %v", path, err, ErrNotPrivate)
	}
	// The same socket named plainly fails on its folder's mode.
	if err := CheckSocketPath(filepath.Join(open, "d.sock")); !errors.Is(err, ErrNotPrivate) {
		t.Fatalf("the socket in a folder of mode 0777: %v", err)
	}
}
