package pluginsandbox_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// Example plugins are built once per test binary into buildDir; every
// server shares one compilation cache, so each module compiles once.
var (
	buildDir string
	cacheDir string
	builds   sync.Map // name -> *exampleBuild
)

type exampleBuild struct {
	once sync.Once
	err  error
	out  []byte
}

func TestMain(m *testing.M) {
	var err error
	if buildDir, err = os.MkdirTemp("", "pluginsandbox-guests-"); err != nil {
		panic(err)
	}
	if cacheDir, err = os.MkdirTemp("", "pluginsandbox-cache-"); err != nil {
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(buildDir)
	os.RemoveAll(cacheDir)
	os.Exit(code)
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// installExample builds plugins/examples/<name> (once) and installs it as
// dir/<name>/plugin.wasm next to a copy of its manifest, as an installed
// plugin looks.
func installExample(t *testing.T, dir, name string) {
	t.Helper()
	v, _ := builds.LoadOrStore(name, &exampleBuild{})
	b := v.(*exampleBuild)
	wasm := filepath.Join(buildDir, name+".wasm")
	b.once.Do(func() {
		cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", wasm, "./plugins/examples/"+name)
		cmd.Dir = repoRoot()
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
		b.out, b.err = cmd.CombinedOutput()
	})
	if b.err != nil {
		t.Fatalf("build %s: %v\n%s", name, b.err, b.out)
	}
	dst := filepath.Join(dir, name)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	for src, to := range map[string]string{
		wasm: filepath.Join(dst, "plugin.wasm"),
		filepath.Join(repoRoot(), "plugins", "examples", name, "manifest.toml"): filepath.Join(dst, "manifest.toml"),
	} {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
