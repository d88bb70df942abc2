package install_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/clawmesh/clawmesh/internal/pluginpkg/install"
)

// TestRegistryEntryMustMatchItsManifest: an index entry whose archive's
// manifest names another plugin, or another version, is refused before
// anything is placed: the installed plugin of that name (and the config
// and secrets keyed by it) is left as it was.
func TestRegistryEntryMustMatchItsManifest(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name, entryName, entryVersion string
	}{
		{"another plugin's name", "alpha", "6.6.6"},
		{"another version", "victim", "2.0.0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := newInstaller(t, install.Limits{})
			src := writeDir(t, map[string]string{"manifest.toml": toolManifest("victim", "1.0.0"), "plugin.wasm": "the installed module"})
			if _, err := in.InstallPath(ctx, src); err != nil {
				t.Fatal(err)
			}
			r := newRegistry(t)
			r.add(t, c.entryName, c.entryVersion, "p.zip", pluginZip(t, "", "victim", "6.6.6"), "auto")
			res, err := in.InstallRegistry(ctx, r.fileURL(t), c.entryName)
			if !errors.Is(err, install.ErrRegistry) {
				t.Fatalf("InstallRegistry(%s) = %+v, %v; want ErrRegistry", c.entryName, res, err)
			}
			got, err := os.ReadFile(filepath.Join(in.PluginsDir, "victim", "plugin.wasm"))
			if err != nil || string(got) != "the installed module" {
				t.Fatalf("the installed plugin victim was touched: module %q, %v", got, err)
			}
			if dirs := pluginDirs(t, in); !slices.Equal(dirs, []string{"victim"}) {
				t.Fatalf("plugins directory holds %v, want only victim", dirs)
			}
		})
	}
}
