package bus_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/testdisk"
)

// A seed file was created first and written after: on a full disk the
// write failed and left an empty seed file, and every later start failed
// on it ("invalid seed") once space was back, until someone removed the
// file by hand. A seed is linked into place whole now, and an empty seed
// file, which only such a creation left, is made anew.
func TestSeedsCreatedWhole(t *testing.T) {
	t.Run("empty file left", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.MkdirAll(bus.CredentialDir(dir), 0o700); err != nil {
			t.Fatal(err)
		}
		path := bus.SeedFile(dir, bus.RoleSession)
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := bus.EnsureCredentials(dir); err != nil {
			t.Fatalf("an empty seed file: %v", err)
		}
		fi, err := os.Stat(path)
		if err != nil || fi.Size() == 0 || fi.Mode().Perm() != 0o600 {
			t.Fatalf("the seed file: %v %v", fi, err)
		}
	})

	t.Run("full disk", func(t *testing.T) {
		disk := testdisk.New(t, 1<<20)
		disk.Fill()
		if _, err := bus.EnsureCredentials(disk.Dir); err == nil {
			t.Fatal("seeds created on a full disk")
		}
		disk.Free()
		keys, err := bus.EnsureCredentials(disk.Dir)
		if err != nil {
			t.Fatalf("space back: %v", err)
		}
		if len(keys) != len(bus.Roles) {
			t.Fatalf("%d keys for %d roles", len(keys), len(bus.Roles))
		}
		for _, r := range bus.Roles {
			if _, err := bus.LoadSeed(disk.Dir, r); err != nil {
				t.Fatal(err)
			}
		}
		left, _ := filepath.Glob(filepath.Join(bus.CredentialDir(disk.Dir), ".*"))
		if len(left) != 0 {
			t.Fatalf("temporary files left: %v", left)
		}
	})
}
