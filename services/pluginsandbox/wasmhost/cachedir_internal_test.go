package wasmhost

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// trimCache removes a dead process's temporary files and the least
// recently used entries past the bound, never one used since keepSince,
// in any folder under the cache's.
func TestTrimCacheKeepsTheBound(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	keepSince := now.Add(-30 * time.Minute)
	file := func(rel string, size int, written, read time.Time) string {
		t.Helper()
		path := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, make([]byte, size), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, read, written); err != nil {
			t.Fatal(err)
		}
		return path
	}
	hoursAgo := func(h int) time.Time { return now.Add(-time.Duration(h) * time.Hour) }
	oldVersion := file("wazero-1.11-amd64-linux/aa", 40, hoursAgo(48), hoursAgo(48)) // never read since
	readLately := file("wazero-1.12-amd64-linux/bb", 40, hoursAgo(72), hoursAgo(1))  // written first, read an hour ago
	writtenLately := file("wazero-1.12-amd64-linux/cc", 40, hoursAgo(3), hoursAgo(3))
	inUse := file("wazero-1.12-amd64-linux/dd", 40, now.Add(-time.Minute), now.Add(-time.Minute))
	deadTemp := file("wazero-1.12-amd64-linux/ee.123.tmp", 1000, now.Add(-staleCacheTemp-time.Second), now)
	liveTemp := file("wazero-1.12-amd64-linux/ff.456.tmp", 1000, now.Add(-time.Second), now)
	if err := os.Symlink(inUse, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}

	removed, kept, err := trimCache(dir, 100, keepSince, now)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	want := []string{oldVersion, writtenLately, deadTemp}
	slices.Sort(want)
	if !slices.Equal(removed, want) || kept != 80 {
		t.Fatalf("removed %v, kept %d bytes; want %v and 80", removed, kept, want)
	}
	for _, path := range []string{readLately, inUse, liveTemp, filepath.Join(dir, "link")} {
		if _, err := os.Lstat(path); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}

	// Past the bound with every entry in use: all stay.
	removed, kept, err = trimCache(dir, 10, now.Add(-2*time.Hour), now)
	if err != nil || len(removed) != 0 || kept != 80 {
		t.Fatalf("in use: removed %v, kept %d, %v", removed, kept, err)
	}
	// A folder not there yet is an empty cache.
	if removed, kept, err := trimCache(filepath.Join(dir, "none"), 10, now, now); err != nil || len(removed) != 0 || kept != 0 {
		t.Fatalf("missing folder: %v %d %v", removed, kept, err)
	}
}
