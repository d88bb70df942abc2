//go:build unix

package manifest

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// A FIFO swapped in for a file after its Lstat is refused at once: opened
// without waiting and checked on what was opened. A plain open would wait
// for a writer that never comes, holding every later scan.
func TestReadRegularRefusesAFIFOWithoutWaiting(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "manifest.toml")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := readRegular(fifo, MaxBytes, openNoFollow)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ErrLayout) {
			t.Fatalf("reading a FIFO: %v", err)
		}
	case <-time.After(10 * time.Second):
		// Let the reader go before failing.
		if w, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
			w.Close()
		}
		t.Fatal("reading a FIFO waited for a writer")
	}

	// A link in the last element is not followed; a file longer than the
	// bound is refused by the bytes read.
	target := filepath.Join(dir, "real")
	if err := os.WriteFile(target, make([]byte, 100), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if _, err := readRegular(link, MaxBytes, openNoFollow); err == nil {
		t.Fatal("read through a link")
	}
	if _, err := readRegular(target, 99, openNoFollow); !errors.Is(err, ErrLayout) {
		t.Fatalf("a file over its bound: %v", err)
	}
	if data, err := readRegular(target, 100, openNoFollow); err != nil || len(data) != 100 {
		t.Fatalf("a file at its bound: %d bytes, %v", len(data), err)
	}
}
