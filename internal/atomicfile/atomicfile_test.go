package atomicfile_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
	"github.com/clawmesh/clawmesh/internal/testdisk"
)

// On a full disk nothing is left at the path, nor beside it; once space
// is back the file is written whole. Create keeps a file already there;
// Replace puts the new one in its place.
func TestWrittenWholeOrNotAtAll(t *testing.T) {
	disk := testdisk.New(t, 1<<20)
	path := filepath.Join(disk.Dir, "key")
	data := make([]byte, 64<<10)
	disk.Fill()
	if _, err := atomicfile.Create(path, data, 0o600); err == nil {
		t.Fatal("created on a full disk")
	}
	if err := atomicfile.Replace(path, data, 0o600); err == nil {
		t.Fatal("replaced on a full disk")
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Fatalf("something left at the path: %v", err)
	}
	disk.Free()
	if created, err := atomicfile.Create(path, data, 0o600); err != nil || !created {
		t.Fatalf("space back: created %v, %v", created, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() != int64(len(data)) || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the file: %v %v", fi, err)
	}
	if created, err := atomicfile.Create(path, []byte("other"), 0o600); err != nil || created {
		t.Fatalf("a second Create: created %v, %v", created, err)
	}
	if err := atomicfile.Replace(path, []byte("other"), 0o644); err != nil {
		t.Fatal(err)
	}
	if raw, _ := os.ReadFile(path); string(raw) != "other" {
		t.Fatalf("after Replace: %q", raw)
	}
	if left, _ := filepath.Glob(filepath.Join(disk.Dir, ".key.*")); len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
}
