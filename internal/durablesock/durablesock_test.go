package durablesock

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/collietest"
)

// The private socket's path is refused at start when it is not private,
// with a message naming the part that failed; Collie's own check agrees.
func TestSocketPrivacy(t *testing.T) {
	base := t.TempDir()
	mk := func(name string, mode os.FileMode) string {
		d := filepath.Join(base, name)
		if err := os.Mkdir(d, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, mode); err != nil {
			t.Fatal(err)
		}
		return d
	}
	good := mk("good", 0o700)
	if err := os.Symlink(good, filepath.Join(base, "link")); err != nil {
		t.Fatal(err)
	}
	open := mk("open", 0o777)
	sticky := mk("sticky", 0o777|os.ModeSticky)
	mk("sticky/inner", 0o700)
	group := mk("group", 0o770)
	mk("open/inner", 0o700)
	if err := os.WriteFile(filepath.Join(good, "file.sock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		path, part string
	}{
		{"relative/durable.sock", "absolute"},
		{"/" + strings.Repeat("x", 110) + "/d.sock", "at most 103"},
		{filepath.Join(base, "link", "durable.sock"), filepath.Join(base, "link") + " is a symbolic link"},
		{filepath.Join(group, "durable.sock"), "has mode 0770; it must be 0700"},
		{filepath.Join(open, "inner", "durable.sock"), open + " is writable by group or others"},
		{filepath.Join(good, "file.sock"), "not a socket"},
	}
	for _, c := range cases {
		ln, err := ListenSocket(c.path)
		if err == nil {
			ln.Close()
			t.Fatalf("%s was accepted", c.path)
		}
		if !errors.Is(err, ErrNotPrivate) || !strings.Contains(err.Error(), c.part) {
			t.Fatalf("%s: %v (want %q)", c.path, err, c.part)
		}
	}

	// A sticky world-writable folder above (as /tmp) is fine; a missing
	// socket folder is created 0700; a stale socket is replaced; the
	// socket is 0600.
	for _, path := range []string{filepath.Join(sticky, "inner", "d.sock"), filepath.Join(good, "new", "d.sock")} {
		ln, err := ListenSocket(path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		ln.(*net.UnixListener).SetUnlinkOnClose(false)
		ln.Close()
		ln, err = ListenSocket(path)
		if err != nil {
			t.Fatalf("%s with a stale socket: %v", path, err)
		}
		fi, _ := os.Stat(path)
		di, _ := os.Stat(filepath.Dir(path))
		if fi.Mode().Perm() != 0o600 || di.Mode().Perm() != 0o700 {
			t.Fatalf("modes %v %v", fi.Mode(), di.Mode())
		}
		if err := collietest.CheckSocketPath(path); err != nil {
			t.Fatalf("Collie refuses %s: %v", path, err)
		}
		ln.Close()
	}
	if err := collietest.CheckSocketPath(filepath.Join(base, "link", "d.sock")); !errors.Is(err, collietest.ErrNotPrivate) {
		t.Fatalf("Collie through a link: %v", err)
	}
}

// A socket file is stale when nobody listens on it. One a running durable
// agent listens on (another stack's, both reading COLLIE_DURABLE_SOCKET)
// was removed all the same and listened on again: the first agent went on
// running, unreachable, and lost the path for good when the second
// stopped and unlinked it. It is refused now, and left to its owner.
func TestLiveSocketIsNotTakenOver(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run", "d.sock")
	first, err := ListenSocket(path)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	second, err := ListenSocket(path)
	if err == nil {
		second.Close()
		t.Fatalf("a second listener took %s over", path)
	}
	if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), path) {
		t.Fatalf("second listener: %v, want %v naming the path", err, ErrInUse)
	}
	accepted := make(chan error, 1)
	go func() {
		c, err := first.Accept()
		if err == nil {
			c.Close()
		}
		accepted <- err
	}()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("the first listener is unreachable: %v", err)
	}
	c.Close()
	if err := <-accepted; err != nil {
		t.Fatalf("the first listener did not get the connection: %v", err)
	}
}
