// Package e2e_test runs the whole stack from its real binaries, as a user
// would with `clawmesh up`, and talks to it over the socket.
package e2e_test

import (
	"os"
	"strconv"
	"testing"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/guestbuild"
)

func TestMain(m *testing.M) {
	// The benchmark's echo baseline runs in its own process, like the
	// gateway, so both pay the same cross-process round trip.
	if path := os.Getenv(echoEnv); path != "" {
		n, _ := strconv.Atoi(os.Getenv(echoReplyEnv))
		serveEcho(path, n)
		return
	}
	if file := os.Getenv(natsEnv); file != "" {
		serveNATS(file)
		return
	}
	if path := os.Getenv(discardEnv); path != "" {
		serveDiscard(path)
		return
	}
	code := m.Run()
	e2e.Cleanup()
	guestbuild.Cleanup()
	os.Exit(code)
}
