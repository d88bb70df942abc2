package install

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
)

// beforeOpen, when set, is called with each source entry's path just
// before it is opened; tests swap the entry there.
var beforeOpen func(path string)

// copier copies one local plugin directory within the archive limits.
type copier struct {
	ctx     context.Context
	lim     Limits
	written int64
	entries int
}

// copyTree copies the regular files and folders of src into dst (which
// must not exist), refusing symbolic links and special files and staying
// within lim.ExpandedBytes, lim.Entries and maxEntryDepth folders, as an
// archive must. Every entry is opened relative to its opened parent with
// O_NOFOLLOW and O_NONBLOCK and judged by what was opened (fstat), never
// by the listing: whoever owns src may swap a listed file for a link to
// the installer's secrets, or for a FIFO that blocks the open for good,
// between the two.
func copyTree(ctx context.Context, src, dst string, lim Limits) error {
	// src itself is the operator's own word and may be reached through a
	// link; nothing below it may.
	fd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("install: copy: %s: %w", src, err)
	}
	c := &copier{ctx: ctx, lim: lim}
	return c.dir(os.NewFile(uintptr(fd), src), "", dst, 0)
}

// dir copies the open folder d (src-relative path rel) into the new
// folder target, and closes d.
func (c *copier) dir(d *os.File, rel, target string, depth int) error {
	defer d.Close()
	if err := c.count(rel); err != nil {
		return err
	}
	if depth > maxEntryDepth {
		return fmt.Errorf("%w: %s is more than %d folders deep", ErrTooLarge, rel, maxEntryDepth)
	}
	if err := os.Mkdir(target, 0o755); err != nil {
		return fmt.Errorf("install: copy: %w", err)
	}
	for {
		names, err := d.Readdirnames(256)
		for _, name := range names {
			if err := c.entry(d, name, filepath.Join(rel, name), filepath.Join(target, name), depth); err != nil {
				return err
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("install: copy: %s: %w", d.Name(), err)
		}
	}
}

// entry opens the entry name of the open folder parent and copies it.
func (c *copier) entry(parent *os.File, name, rel, target string, depth int) error {
	if err := c.ctx.Err(); err != nil {
		return err
	}
	path := filepath.Join(parent.Name(), name)
	if beforeOpen != nil {
		beforeOpen(path)
	}
	fd, err := unix.Openat(int(parent.Fd()), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("%w: %s is a symbolic link", manifest.ErrLayout, rel)
	case errors.Is(err, unix.ENXIO):
		// A socket, or a FIFO opened for writing with no reader.
		return fmt.Errorf("%w: %s is not a regular file", manifest.ErrLayout, rel)
	case err != nil:
		return fmt.Errorf("install: copy: %s: %w", rel, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return fmt.Errorf("install: copy: %s: %w", rel, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return c.dir(os.NewFile(uintptr(fd), path), rel, target, depth+1)
	case unix.S_IFREG:
		// O_NONBLOCK served the open only: clear it before reading.
		if err := unix.SetNonblock(fd, false); err != nil {
			unix.Close(fd)
			return fmt.Errorf("install: copy: %s: %w", rel, err)
		}
		f := os.NewFile(uintptr(fd), path)
		defer f.Close()
		return c.file(f, rel, target)
	}
	unix.Close(fd)
	return fmt.Errorf("%w: %s is not a regular file", manifest.ErrLayout, rel)
}

// count counts one file or folder against lim.Entries.
func (c *copier) count(rel string) error {
	c.entries++
	if c.entries > c.lim.Entries {
		return fmt.Errorf("%w: more than %d files and folders (at %s)", ErrTooLarge, c.lim.Entries, rel)
	}
	return nil
}

// file copies the open regular file in to the new file target, counting
// what it reads (not what the file claimed) against lim.ExpandedBytes.
func (c *copier) file(in *os.File, rel, target string) error {
	if err := c.count(rel); err != nil {
		return err
	}
	budget := c.lim.ExpandedBytes - c.written
	out, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("install: copy: %w", err)
	}
	n, err := io.Copy(out, io.LimitReader(in, budget+1))
	c.written += n
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if n > budget {
		return fmt.Errorf("%w: the plugin directory is larger than the copy limit", ErrTooLarge)
	}
	if err != nil {
		return fmt.Errorf("install: copy: %s: %w", rel, err)
	}
	return nil
}
