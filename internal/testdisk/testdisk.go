// Package testdisk gives a test a small file system of its own that it
// can fill and free again: a tmpfs mounted on a temporary folder. A full
// disk is the one fault a test cannot make on the machine's own disk
// without harming everything else on it.
//
// Mounting needs root (CAP_SYS_ADMIN); elsewhere the test is skipped.
package testdisk

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// Disk is a mounted tmpfs.
type Disk struct {
	// Dir is the mount point.
	Dir string
	t   testing.TB
}

// fillerName is the file Fill writes, at the top of the disk.
const fillerName = ".testdisk-filler"

// New mounts a tmpfs of size bytes on a new temporary folder, unmounted
// when the test ends, or skips the test where it cannot mount.
func New(t testing.TB, size int64) *Disk {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small file system needs root")
	}
	// Not t.TempDir, whose folders are 0700: a server of another
	// account (PostgreSQL's) may have to reach a folder on the disk.
	dir, err := os.MkdirTemp("", "testdisk-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		os.Remove(dir)
		t.Fatal(err)
	}
	opts := "size=" + strconv.FormatInt(size, 10) + ",mode=0711"
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		os.Remove(dir)
		t.Skipf("mount a tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			// Something still holds it (a process the test left);
			// detached, it goes once that lets go.
			_ = unix.Unmount(dir, unix.MNT_DETACH)
		}
		os.Remove(dir)
	})
	return &Disk{Dir: dir, t: t}
}

// Fill writes a file until the disk has no room left, so that the next
// write of any size fails with ENOSPC. Free undoes it.
func (d *Disk) Fill() {
	d.t.Helper()
	f, err := os.OpenFile(filepath.Join(d.Dir, fillerName), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		d.t.Fatalf("fill the disk: %v", err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for len(buf) > 0 {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				d.t.Fatalf("fill the disk: %v", err)
			}
			buf = buf[:len(buf)/2] // the last pages, a smaller write each
		}
	}
	if err := d.check(); err != nil {
		d.t.Fatal(err)
	}
}

// check makes sure the disk is full: a byte more does not fit.
func (d *Disk) check() error {
	f, err := os.CreateTemp(d.Dir, ".testdisk-probe-*")
	if err != nil {
		return nil // no inode either: full enough
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if _, err := f.Write([]byte{0}); !errors.Is(err, unix.ENOSPC) {
		return fmt.Errorf("disk not full after Fill: a write got %v", err)
	}
	return nil
}

// Free removes what Fill wrote: the space is back.
func (d *Disk) Free() {
	d.t.Helper()
	if err := os.Remove(filepath.Join(d.Dir, fillerName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		d.t.Fatalf("free the disk: %v", err)
	}
}
