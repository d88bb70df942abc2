// Package atomicfile writes a file whole or not at all. Created first and
// written after, a write that failed (a full disk, a crash before the
// data reached the disk) left an empty or cut file: a secret key, a bus
// seed, a cluster id or a password that every later start refused, space
// back or not. Here the data goes to a temporary file beside the target,
// is synced, and is then linked (Create) or renamed (Replace) into place,
// the folder synced after; a reader sees the file whole or not at all.
package atomicfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// Create writes data to path with mode unless a file is already there,
// and reports whether it created it: a link never replaces, so a file
// that appeared meanwhile (another process won the race) is kept as it
// is and created is false.
func Create(path string, data []byte, mode os.FileMode) (created bool, err error) {
	err = write(path, data, mode, func(tmp string) error {
		err := os.Link(tmp, path)
		if errors.Is(err, fs.ErrExist) {
			return nil
		}
		created = err == nil
		return err
	})
	return created, err
}

// Replace writes data to path with mode, over what it held: a reader sees
// the old file or the new one, never part of one.
func Replace(path string, data []byte, mode os.FileMode) error {
	return write(path, data, mode, func(tmp string) error { return os.Rename(tmp, path) })
}

func write(path string, data []byte, mode os.FileMode, place func(tmp string) error) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // once placed, the link's other name or nothing
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(mode)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = place(f.Name())
	}
	if err != nil {
		return err
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
