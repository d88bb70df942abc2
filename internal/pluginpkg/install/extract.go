package install

import (
	"archive/zip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
)

// Extract unpacks the zip archive r (of size bytes) into dest, which must
// exist and be empty, and returns the plugin's root inside dest: dest
// itself when the archive has manifest.toml at its root, or the one
// top-level folder holding manifest.toml.
//
// Before anything is written, every entry name is checked: no absolute
// path, no Windows drive letter or backslash, no ".." segment, no link or
// other special file, no duplicate, no file that is also a folder of
// another entry, no name past maxEntryName bytes or
// maxEntryDepth folders deep, at most lim.Entries files and folders (the
// folders an entry's path makes counted too) and exactly one
// manifest.toml, at the root or one level down. While writing,
// the bytes actually decompressed are counted against lim.ExpandedBytes,
// whatever the headers claim, so a zip bomb stops at the cap.
func Extract(r io.ReaderAt, size int64, dest string, lim Limits) (string, error) {
	lim = lim.withDefaults()
	zr, err := zip.NewReader(r, size)
	if err != nil {
		return "", fmt.Errorf("%w: not a zip archive: %w", ErrArchive, err)
	}
	if len(zr.File) > lim.Entries {
		return "", fmt.Errorf("%w: %d entries; the limit is %d", ErrArchive, len(zr.File), lim.Entries)
	}
	type entry struct {
		f    *zip.File
		name string
		dir  bool
	}
	entries := make([]entry, 0, len(zr.File))
	seen := map[string]bool{}
	var manifests []string
	for _, f := range zr.File {
		name, dir, err := entryName(f)
		if err != nil {
			return "", err
		}
		if name == "" {
			continue // "./" or the root folder itself
		}
		if seen[name] {
			return "", fmt.Errorf("%w: %q appears twice", ErrArchive, name)
		}
		seen[name] = true
		if !dir && path.Base(name) == manifest.FileName {
			manifests = append(manifests, name)
		}
		entries = append(entries, entry{f: f, name: name, dir: dir})
	}
	// A folder costs no byte of ExpandedBytes: a 1.5 MB archive of 201
	// entries 1,900 folders deep made 380,201 of them (1.45 GiB of disk)
	// within an ExpandedBytes of 64.
	folders := map[string]bool{}
	files := map[string]bool{}
	for _, e := range entries {
		if !e.dir {
			files[e.name] = true
		}
	}
	for _, e := range entries {
		for d := path.Dir(e.name); d != "." && !folders[d]; d = path.Dir(d) {
			// A file that is also an entry's folder failed halfway
			// through the writing, naming a staging path.
			if files[d] {
				return "", fmt.Errorf("%w: %q is both a file and a folder (of %q)", ErrArchive, d, e.name)
			}
			folders[d] = true
		}
	}
	for d := range folders {
		if seen[d] {
			delete(folders, d) // listed: counted among the entries
		}
	}
	if n := len(entries) + len(folders); n > lim.Entries {
		return "", fmt.Errorf("%w: %d files and folders; the limit is %d", ErrArchive, n, lim.Entries)
	}
	root, err := pluginRoot(manifests, seen)
	if err != nil {
		return "", err
	}
	var written int64
	for _, e := range entries {
		target := filepath.Join(dest, filepath.FromSlash(e.name))
		if e.dir {
			if err := os.MkdirAll(target, 0o755); err != nil {
				return "", fmt.Errorf("install: extract: %w", err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return "", fmt.Errorf("install: extract: %w", err)
		}
		n, err := extractFile(e.f, target, lim.ExpandedBytes-written)
		written += n
		if err != nil {
			return "", err
		}
	}
	return filepath.Join(dest, filepath.FromSlash(root)), nil
}

// Bounds on an entry's name: a plugin's files are a few folders deep.
const (
	maxEntryName  = 1024
	maxEntryDepth = 32
)

// entryName validates one entry and returns its cleaned slash path.
func entryName(f *zip.File) (name string, dir bool, err error) {
	raw := f.Name
	refuse := func(why string) (string, bool, error) {
		return "", false, fmt.Errorf("%w: entry %q: %s", ErrArchive, raw, why)
	}
	mode := f.Mode()
	switch {
	case mode&fs.ModeSymlink != 0:
		return refuse("symbolic links are not allowed")
	case mode&(fs.ModeDevice|fs.ModeNamedPipe|fs.ModeSocket|fs.ModeCharDevice|fs.ModeIrregular) != 0:
		return refuse("special files are not allowed")
	case raw == "" || strings.ContainsRune(raw, 0):
		return refuse("empty or NUL name")
	case strings.Contains(raw, "\\"):
		return refuse("backslashes are not allowed")
	case strings.HasPrefix(raw, "/"):
		return refuse("absolute paths are not allowed")
	case len(raw) >= 2 && raw[1] == ':' && ((raw[0]|0x20) >= 'a' && (raw[0]|0x20) <= 'z'):
		return refuse("drive-letter paths are not allowed")
	}
	dir = strings.HasSuffix(raw, "/") || mode.IsDir()
	if len(raw) > maxEntryName {
		return refuse(fmt.Sprintf("names are at most %d bytes", maxEntryName))
	}
	segs := strings.Split(strings.TrimSuffix(raw, "/"), "/")
	if len(segs) > maxEntryDepth {
		return refuse(fmt.Sprintf("paths are at most %d folders deep", maxEntryDepth))
	}
	for _, seg := range segs {
		if seg == ".." {
			return refuse("parent-directory segments are not allowed")
		}
		if strings.Contains(seg, ":") {
			return refuse("colons are not allowed")
		}
	}
	clean := path.Clean(raw)
	if clean == "." {
		return "", true, nil
	}
	if !filepath.IsLocal(filepath.FromSlash(clean)) {
		return refuse("not a local path")
	}
	return clean, dir, nil
}

// pluginRoot finds the plugin's folder from the manifests found: exactly
// one, at the root or in the archive's single top-level folder.
func pluginRoot(manifests []string, names map[string]bool) (string, error) {
	switch len(manifests) {
	case 0:
		return "", fmt.Errorf("%w: no %s", ErrArchive, manifest.FileName)
	case 1:
	default:
		return "", fmt.Errorf("%w: %d manifests (%s); an archive holds one plugin", ErrArchive, len(manifests), strings.Join(manifests, ", "))
	}
	m := manifests[0]
	if m == manifest.FileName {
		return ".", nil
	}
	dir, file := path.Split(m)
	dir = strings.TrimSuffix(dir, "/")
	if file != manifest.FileName || strings.Contains(dir, "/") {
		return "", fmt.Errorf("%w: %s must be at the root or in one top-level folder, not at %s", ErrArchive, manifest.FileName, m)
	}
	for n := range names {
		if n != dir && !strings.HasPrefix(n, dir+"/") {
			return "", fmt.Errorf("%w: %q lies outside the plugin folder %q", ErrArchive, n, dir)
		}
	}
	return dir, nil
}

// extractFile decompresses f into target, writing at most budget bytes.
func extractFile(f *zip.File, target string, budget int64) (int64, error) {
	rc, err := f.Open()
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %w", ErrArchive, f.Name, err)
	}
	defer rc.Close()
	out, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return 0, fmt.Errorf("install: extract: %w", err)
	}
	n, err := io.Copy(out, io.LimitReader(rc, budget+1))
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	switch {
	case n > budget:
		return n, fmt.Errorf("%w: the archive expands past the extraction limit", ErrTooLarge)
	case errors.Is(err, zip.ErrChecksum), errors.Is(err, zip.ErrFormat), errors.Is(err, zip.ErrAlgorithm):
		return n, fmt.Errorf("%w: %s: %w", ErrArchive, f.Name, err)
	case err != nil:
		return n, fmt.Errorf("install: extract %s: %w", f.Name, err)
	}
	return n, nil
}
