package testenv

import (
	"os"
	"path/filepath"
	"testing"
)

// WriteFile writes body to rel (slash-separated) under dir, making the
// folders on its way (0755; the file 0644), and fails the test on error.
func WriteFile(t testing.TB, dir, rel, body string) {
	t.Helper()
	p := filepath.Join(dir, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}
