package install_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/pluginpkg/install"
	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
)

// TestLocalInstallJudgesWhatItOpens: the owner of a source folder may
// swap an entry after it was listed and before it is copied. A link is
// refused, not followed (the installer's secret stays out of the plugin),
// and a FIFO is refused without the open blocking.
func TestLocalInstallJudgesWhatItOpens(t *testing.T) {
	secretDir := t.TempDir()
	secret := filepath.Join(secretDir, "secret_key")
	if err := os.WriteFile(secret, []byte("INSTALLER-SECRET"), 0o600); err != nil {
		t.Fatal(err)
	}
	swaps := []struct {
		name, victim string
		swap         func(t *testing.T, p string)
	}{
		{"file swapped for a link", "skills/s/references/notes.txt", func(t *testing.T, p string) {
			if err := os.Symlink(secret, p+".new"); err != nil {
				t.Fatal(err)
			}
		}},
		{"folder swapped for a link", "skills/s/references", func(t *testing.T, p string) {
			if err := os.Symlink(secretDir, p+".new"); err != nil {
				t.Fatal(err)
			}
		}},
		{"file swapped for a FIFO", "skills/s/references/notes.txt", func(t *testing.T, p string) {
			if err := syscall.Mkfifo(p+".new", 0o644); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, c := range swaps {
		t.Run(c.name, func(t *testing.T) {
			src := writeDir(t, map[string]string{
				"manifest.toml":                 "name = \"kit\"\nversion = \"1.0.0\"\ncapabilities = [\"skill\"]\n",
				"skills/s/SKILL.md":             "---\nname: s\ndescription: d\n---\n",
				"skills/s/references/notes.txt": "harmless",
			})
			victim := filepath.Join(src, filepath.FromSlash(c.victim))
			undo := install.SetBeforeOpen(func(p string) {
				if p != victim {
					return
				}
				if err := os.RemoveAll(victim); err != nil {
					t.Error(err)
				}
				c.swap(t, victim)
				if err := os.Rename(victim+".new", victim); err != nil {
					t.Error(err)
				}
			})
			defer undo()
			in := newInstaller(t, install.Limits{})
			done := make(chan error, 1)
			go func() {
				_, err := in.InstallPath(context.Background(), src)
				done <- err
			}()
			var err error
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				// Unblock an open stuck on the FIFO so the goroutine ends.
				if w, oerr := os.OpenFile(victim, os.O_WRONLY|syscall.O_NONBLOCK, 0); oerr == nil {
					w.Close()
				}
				t.Fatalf("the install is still blocked after 30s on the swapped %s", c.victim)
			}
			if !errors.Is(err, manifest.ErrLayout) {
				t.Fatalf("err = %v, want ErrLayout", err)
			}
			if dirs := pluginDirs(t, in); len(dirs) != 0 {
				t.Fatalf("something was installed: %v", dirs)
			}
		})
	}
}
