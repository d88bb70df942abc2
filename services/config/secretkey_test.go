package config

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// The key file was created first and written after: a write that failed
// (a full disk, a crash between the two) left an empty key file, and every
// later start failed on "want 32 bytes, have 0". The key is linked into
// place whole now, and an empty key file, which only such a creation left
// (nothing was sealed with it), is made anew. Processes racing to create
// it all end with the one key.
func TestSecretKeyCreatedWhole(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, KeyFileName)
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadKey(dir); err != nil {
		t.Fatalf("an empty key file: %v", err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Size() != 32 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the key file: %v %v", fi, err)
	}

	fresh := t.TempDir()
	sealers := make([]*sealer, 8)
	var wg sync.WaitGroup
	for i := range sealers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := loadKey(fresh)
			if err != nil {
				t.Error(err)
			}
			sealers[i] = s
		}()
	}
	wg.Wait()
	doc := map[string]any{"agents": map[string]any{"default": map[string]any{"api_key": "sk-one"}}}
	sealed, err := sealers[0].seal(doc)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range sealers {
		if _, err := s.open(sealed); err != nil {
			t.Fatalf("sealer %d has another key: %v", i, err)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(fresh, KeyFileName+".*")); len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
}
