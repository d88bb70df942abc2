package unixsock_test

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/clawmesh/clawmesh/internal/unixsock"
)

func TestListenModesAndStaleSocket(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	path := filepath.Join(dir, "x.sock")
	ln, err := unixsock.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{dir: 0o700, path: 0o600} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode().Perm(), want)
		}
	}
	// A crashed owner leaves its socket file behind: the next Listen takes
	// the path over.
	ln.SetUnlinkOnClose(false)
	ln.Close()
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("stale socket not left for the test: %v", err)
	}
	ln2, err := unixsock.Listen(path)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	ln2.Close()
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket file left after Close: %v", err)
	}
}

func TestNeverRemovesAFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "precious")
	if err := os.WriteFile(path, []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := unixsock.Listen(path); !errors.Is(err, unixsock.ErrNotSocket) {
		t.Fatalf("Listen over a regular file: %v, want ErrNotSocket", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "data" {
		t.Fatal("the regular file was touched")
	}
}

// A socket a process listens on is not stale: removing it left that
// process running and unreachable (a second gateway, bridge or service
// started on the path of a running one took it over). Each of them
// listens through here, so each is refused the same way.
func TestLiveSocketNotTakenOver(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.sock")
	ln, err := unixsock.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if !unixsock.Serving(path) {
		t.Fatal("Serving is false for a socket that is listened on")
	}
	if _, err := unixsock.Listen(path); !errors.Is(err, unixsock.ErrInUse) {
		t.Fatalf("second Listen: %v, want ErrInUse", err)
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("the first listener lost its socket: %v", err)
	}
	c.Close()
	if unixsock.Serving(filepath.Join(t.TempDir(), "none.sock")) {
		t.Fatal("Serving is true for a missing path")
	}
}
