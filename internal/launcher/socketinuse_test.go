package launcher

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"
)

// The data directory's lock does not cover a client socket moved out of
// it (ZEROCLAW_SOCKET): a second stack on another data directory with the
// same ZEROCLAW_SOCKET replaced the first's live socket, said it was up,
// and left the first running with no way in (its clients were sent to
// the second, and once that stopped, to nothing). It is refused now,
// before anything starts, and the first's socket is left serving.
func TestClientSocketInUseRefused(t *testing.T) {
	sock := filepath.Join(privateDir(t), "shared.sock")
	other, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	t.Setenv("ZEROCLAW_SOCKET", sock)
	err = Run(context.Background(), Config{DataDir: privateDir(t), BinDir: stubBinaries(t),
		DatabaseURL: "postgres:///none", NATSURL: "nats://127.0.0.1:1"})
	if !errors.Is(err, ErrSocketInUse) {
		t.Fatalf("Run on a socket another stack serves: %v", err)
	}
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatalf("the other stack's socket no longer answers: %v", err)
	}
	c.Close()
}
