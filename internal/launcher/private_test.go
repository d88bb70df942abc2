package launcher

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A data directory another user made first (a --config-dir in a shared
// /tmp) was made 0700 and used: it stayed theirs, and the launcher wrote
// the secret key, the bus seeds, the database password and the logs into
// it, a log through a link that user planted (on a running stack as root:
// logs/gateway.log linked to a root-only file by nobody). The launcher
// refuses such a folder now, before it writes anything in it.
func TestDataDirMustBePrivate(t *testing.T) {
	// External servers that do not answer: a launcher that goes past the
	// check fails fast, having written what it writes first.
	run := func(dir string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		return Run(ctx, Config{DataDir: dir, BinDir: t.TempDir(), DatabaseURL: "postgres:///none?host=/nonexistent",
			NATSURL: "nats://127.0.0.1:1", ReadyTimeout: time.Second})
	}
	refused := func(t *testing.T, dir string) {
		t.Helper()
		if err := run(dir); !errors.Is(err, ErrDataDirNotPrivate) {
			t.Fatalf("Run on %s: %v, want %v", dir, err, ErrDataDirNotPrivate)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Fatalf("written into the refused folder: %v", entries)
		}
	}
	const nobody = 65534

	t.Run("a folder above writable by others", func(t *testing.T) {
		shared := filepath.Join(t.TempDir(), "shared")
		if err := os.Mkdir(shared, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(shared, 0o777); err != nil {
			t.Fatal(err)
		}
		refused(t, filepath.Join(shared, "data"))
	})
	t.Run("the folder another user's", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("giving a folder to another user needs root")
		}
		dir := filepath.Join(t.TempDir(), "data")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(dir, nobody, nobody); err != nil {
			t.Fatal(err)
		}
		refused(t, dir)
	})
	t.Run("a link another user's", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("giving a link to another user needs root")
		}
		base := t.TempDir()
		target := filepath.Join(base, "target")
		if err := os.Mkdir(target, 0o700); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(base, "data")
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(link, nobody, nobody); err != nil {
			t.Fatal(err)
		}
		refused(t, link)
	})
	t.Run("this user's own", func(t *testing.T) {
		base := t.TempDir()
		dir := filepath.Join(base, "data")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := checkPrivate(dir); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(base, "link")
		if err := os.Symlink(dir, link); err != nil {
			t.Fatal(err)
		}
		if err := checkPrivate(link); err != nil {
			t.Fatalf("a link of this user's own: %v", err)
		}
	})
}
