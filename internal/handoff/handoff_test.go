package handoff_test

import (
	"errors"
	"net"
	"path/filepath"
	"testing"

	"github.com/clawmesh/clawmesh/internal/handoff"
)

// Two servers in turn: what the first view did not take goes to the
// second, none twice; closing the first leaves the socket listening,
// closing the final one closes it.
func TestViewsTakeConnectionsInTurn(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "h.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	h := handoff.New(lis)
	first, final := h.View(false), h.View(true)
	defer final.Close()

	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	dial()
	c, err := first.Accept()
	if err != nil {
		t.Fatalf("the first view: %v", err)
	}
	c.Close()
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := first.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("a closed view accepted: %v", err)
	}
	// Dialled after the first view closed, and one dialled before the
	// final view asks: both reach the final view.
	dial()
	dial()
	for i := range 2 {
		c, err := final.Accept()
		if err != nil {
			t.Fatalf("the final view's accept %d: %v", i, err)
		}
		c.Close()
	}
	final.Close()
	if c, err := net.Dial("unix", sock); err == nil {
		c.Close()
		t.Fatal("the socket still listens after the final view closed")
	}
	if _, err := final.Accept(); err == nil {
		t.Fatal("the final view accepted after its close")
	}
}
