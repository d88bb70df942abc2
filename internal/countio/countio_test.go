package countio_test

import (
	"net"
	"testing"

	"github.com/clawmesh/clawmesh/internal/countio"
	"github.com/clawmesh/clawmesh/internal/testwait"
)

// waitFor is d.WaitFor(n, stop), failing t if it hangs.
func waitFor(t *testing.T, d *countio.Drain, n int64, stop <-chan struct{}) (ok bool) {
	t.Helper()
	testwait.Returns(t, func() { ok = d.WaitFor(n, stop) })
	return ok
}

// The waits the benchmarks lean on: a count reached, a count the reading
// ended short of, a count the writer's side gave up on; none may hang.
func TestDrainCountsAndWaits(t *testing.T) {
	w, r := net.Pipe()
	d := countio.Start(r)
	var written int64
	for _, frame := range []string{"abcd", "efgh", "ijkl"} {
		if _, err := w.Write([]byte(frame)); err != nil {
			t.Fatal(err)
		}
		written += int64(len(frame))
		if !waitFor(t, d, written, nil) || d.N() != written {
			t.Fatalf("after %q: %d bytes counted, want %d", frame, d.N(), written)
		}
	}
	gaveUp := make(chan struct{})
	close(gaveUp)
	if waitFor(t, d, 13, gaveUp) {
		t.Fatal("WaitFor(13) true with 12 bytes read and stop closed")
	}
	w.Close()
	if waitFor(t, d, 13, nil) {
		t.Fatal("WaitFor(13) true with 12 bytes read and the reading ended")
	}
	var n int64
	testwait.Returns(t, func() { n = d.Wait() })
	if n != 12 {
		t.Fatalf("Wait: %d bytes, want 12", n)
	}
}
