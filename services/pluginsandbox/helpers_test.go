package pluginsandbox_test

import (
	"os"
	"testing"

	"github.com/clawmesh/clawmesh/internal/guestbuild"
)

// Example plugins are built once per test binary (internal/guestbuild);
// every server shares the suite's compilation cache
// (guestbuild.CompileCacheDir), so each module compiles once.
var cacheDir string

func TestMain(m *testing.M) {
	var err error
	if cacheDir, err = guestbuild.CompileCacheDir(); err != nil {
		panic(err)
	}
	code := m.Run()
	guestbuild.Cleanup()
	os.Exit(code)
}

// installExample installs plugins/examples/<name> as dir/<name>/.
func installExample(t testing.TB, dir, name string) {
	t.Helper()
	if err := guestbuild.Install(dir, name); err != nil {
		t.Fatal(err)
	}
}
