// Package e2e_test runs the whole stack from its real binaries, as a user
// would with `clawmesh up`, and talks to it over the socket.
package e2e_test

import (
	"os"
	"testing"

	"github.com/clawmesh/clawmesh/internal/e2e"
)

func TestMain(m *testing.M) {
	code := m.Run()
	e2e.Cleanup()
	os.Exit(code)
}
