package padecho_test

import (
	"bufio"
	"net"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/padecho"
	"github.com/clawmesh/clawmesh/internal/testwait"
)

// A short line comes back padded to the reply's size, a long one as it
// was; two lines sent at once come back in order; the loop ends with
// its peer.
func TestLinesComeBackPaddedAndInOrder(t *testing.T) {
	a, b := net.Pipe()
	done := make(chan struct{})
	go func() { defer close(done); padecho.Serve(a, 8) }()
	long := strings.Repeat("x", 20) + "\n"
	go func() { _, _ = b.Write([]byte("ab\n" + long)) }()
	r := bufio.NewReader(b)
	for _, want := range []string{"ab     \n", long} {
		got, err := r.ReadString('\n')
		if err != nil || got != want {
			t.Fatalf("read %q (%v), want %q", got, err, want)
		}
	}
	b.Close()
	testwait.Recv(t, done)
}
