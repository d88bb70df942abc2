package pgcluster

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/clawmesh/clawmesh/internal/testdisk"
)

// Root's data directory names its cluster by the id in postgres.id. The
// id was written in place: on a full disk the write failed and left an
// empty file, and every later start failed on "not a cluster id" once
// space was back, until someone removed the file by hand. The id is
// renamed into place whole now, and an empty id file, which only such a
// write left (no cluster was bound by it), counts as none.
func TestClusterIDWrittenWhole(t *testing.T) {
	t.Run("empty file left", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, IDFile), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := readID(dir); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("an empty id file reads as %v, want none", err)
		}
		id, err := newID(dir)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := readID(dir); err != nil || got != id {
			t.Fatalf("read %q, %v; wrote %q", got, err, id)
		}
	})

	t.Run("full disk", func(t *testing.T) {
		disk := testdisk.New(t, 1<<20)
		disk.Fill()
		if _, err := newID(disk.Dir); err == nil {
			t.Fatal("an id written on a full disk")
		}
		if _, err := readID(disk.Dir); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("after a failed write the id reads as %v, want none", err)
		}
		disk.Free()
		id, err := newID(disk.Dir)
		if err != nil {
			t.Fatalf("space back: %v", err)
		}
		if got, err := readID(disk.Dir); err != nil || got != id {
			t.Fatalf("read %q, %v; wrote %q", got, err, id)
		}
		if left, _ := filepath.Glob(filepath.Join(disk.Dir, "."+IDFile+".*")); len(left) != 0 {
			t.Fatalf("temporary files left: %v", left)
		}
	})
}
