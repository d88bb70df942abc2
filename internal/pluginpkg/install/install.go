package install

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
)

// StagingPrefix starts every folder an install stages in the plugins
// directory; discovery skips folders starting with ".".
const StagingPrefix = ".install-"

// trashPrefix starts a folder being removed.
const trashPrefix = ".remove-"

// ReplacedPrefix starts the installed version of a plugin moved aside
// while its new version takes its place (where the file system cannot
// exchange two names in one step). The plugin sandbox keeps serving the
// version it loaded while its folder is so.
const ReplacedPrefix = ".replaced-"

// lockName is the lock file serialising installs and removals.
const lockName = ".lock"

// Installer installs into and removes from one plugins directory.
type Installer struct {
	// PluginsDir is plugins.plugins_dir.
	PluginsDir string
	// Policy is plugins.security: checked before anything is placed.
	Policy manifest.Policy
	// Client reads registries; its Limits also bound local copies.
	Client Client
}

// Result describes an installed plugin.
type Result struct {
	Name, Version string
	// Dir is where it now lives.
	Dir      string
	Manifest *manifest.Manifest
	Verdict  manifest.Verdict
	// Replaced is true when an installed version was replaced.
	Replaced bool
}

// InstallPath installs a plugin from a local directory or from the path
// of its manifest.toml: the directory is checked (manifest, layout,
// skills, signature policy), copied into a staging folder inside the
// plugins directory, checked again there, and renamed into
// <plugins_dir>/<name>.
func (in *Installer) InstallPath(ctx context.Context, src string) (*Result, error) {
	fi, err := os.Stat(src)
	if err != nil {
		return nil, fmt.Errorf("install: %w", err)
	}
	if !fi.IsDir() {
		if filepath.Base(src) != manifest.FileName {
			return nil, fmt.Errorf("install: %s is neither a plugin directory nor its %s", src, manifest.FileName)
		}
		src = filepath.Dir(src)
	}
	if _, _, err := in.check(src); err != nil {
		return nil, err
	}
	return in.staged(func(stage string) (*Result, error) {
		dst := filepath.Join(stage, "plugin")
		if err := copyTree(ctx, src, dst, in.Client.Limits.withDefaults()); err != nil {
			return nil, err
		}
		return in.place(dst, nil)
	})
}

// staged runs fill under the installer's lock with a new staging folder
// inside the plugins directory, removed once fill returns.
func (in *Installer) staged(fill func(stage string) (*Result, error)) (*Result, error) {
	unlock, err := in.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	stage, err := in.stage()
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(stage)
	return fill(stage)
}

// InstallRegistry resolves NAME[@VERSION] in the index at indexURL,
// downloads and extracts its archive in a staging folder inside the
// plugins directory, and installs the extracted plugin like a local one.
func (in *Installer) InstallRegistry(ctx context.Context, indexURL, ref string) (*Result, error) {
	name, version, err := ParseRef(ref)
	if err != nil {
		return nil, err
	}
	idx, err := in.Client.FetchIndex(ctx, indexURL)
	if err != nil {
		return nil, err
	}
	entry, err := idx.Resolve(name, version)
	if err != nil {
		return nil, err
	}
	return in.staged(func(stage string) (*Result, error) {
		archive, err := os.OpenFile(filepath.Join(stage, "archive.zip"), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
		if err != nil {
			return nil, fmt.Errorf("install: %w", err)
		}
		defer archive.Close()
		if err := in.Client.Download(ctx, idx, entry, archive); err != nil {
			return nil, err
		}
		size, err := archive.Seek(0, io.SeekCurrent)
		if err != nil {
			return nil, fmt.Errorf("install: %w", err)
		}
		extracted := filepath.Join(stage, "extract")
		if err := os.Mkdir(extracted, 0o755); err != nil {
			return nil, fmt.Errorf("install: %w", err)
		}
		root, err := Extract(archive, size, extracted, in.Client.Limits)
		if err != nil {
			return nil, err
		}
		return in.place(root, &entry)
	})
}

// check loads a plugin directory and applies the signature policy, to
// the manifest and the module it names.
func (in *Installer) check(dir string) (*manifest.Bundle, manifest.Verdict, error) {
	b, err := manifest.LoadBundle(dir)
	if err != nil {
		return nil, manifest.Verdict{}, err
	}
	module, skills, err := b.Contents()
	if err != nil {
		return nil, manifest.Verdict{}, err
	}
	v, err := in.Policy.Check(b.Manifest, module, skills.Digest())
	if err != nil {
		return nil, v, err
	}
	return b, v, nil
}

// place checks the staged plugin at dir and moves it to its final folder,
// swapping out an installed version of the same plugin. When it comes
// from a registry, entry is the index entry it was downloaded for: the
// manifest must name the same plugin and version, since the folder it
// takes (and the config and secrets that go with it) is the manifest's
// name's. The caller holds the lock; dir is inside the plugins directory.
func (in *Installer) place(dir string, entry *Entry) (*Result, error) {
	b, verdict, err := in.check(dir)
	if err != nil {
		return nil, err
	}
	m := b.Manifest
	if entry != nil && (m.Name != entry.Name || m.Version != entry.Version) {
		return nil, fmt.Errorf("%w: the index entry %s %s holds a plugin whose manifest says %s %s; nothing installed",
			ErrRegistry, entry.Name, entry.Version, m.Name, m.Version)
	}
	res := &Result{Name: m.Name, Version: m.Version, Manifest: m, Verdict: verdict,
		Dir: filepath.Join(in.PluginsDir, m.Name)}
	if other, err := in.findByName(m.Name); err == nil && filepath.Base(other) != m.Name {
		return nil, fmt.Errorf("%w: plugin %s is already installed in %s; remove it first", ErrConflict, m.Name, other)
	}
	if cur, err := manifest.Load(res.Dir); err == nil && cur.Name != m.Name {
		return nil, fmt.Errorf("%w: %s holds plugin %s; remove it first", ErrConflict, res.Dir, cur.Name)
	}
	_, err = os.Lstat(res.Dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := os.Rename(dir, res.Dir); err != nil {
			return nil, fmt.Errorf("install: %w", err)
		}
		return res, nil
	case err != nil:
		return nil, fmt.Errorf("install: %w", err)
	}
	if err := exchange(dir, res.Dir); err != nil {
		return nil, fmt.Errorf("install: replace %s: %w", res.Dir, err)
	}
	res.Replaced = true
	return res, nil
}

// Remove uninstalls the plugin named name (its folder's name or its
// manifest's name): the folder is renamed out of sight first, so replicas
// see it vanish at once, then deleted.
func (in *Installer) Remove(name string) (string, error) {
	if !manifest.NamePattern.MatchString(name) {
		return "", fmt.Errorf("%w: %q is not a plugin name", ErrNotInstalled, name)
	}
	unlock, err := in.lock()
	if err != nil {
		return "", err
	}
	defer unlock()
	dir, err := in.findByName(name)
	if err != nil {
		return "", err
	}
	trash := filepath.Join(in.PluginsDir, trashPrefix+randomSuffix())
	if err := os.Rename(dir, trash); err != nil {
		return "", fmt.Errorf("install: remove: %w", err)
	}
	if err := os.RemoveAll(trash); err != nil {
		return dir, fmt.Errorf("install: remove %s: %w", trash, err)
	}
	return dir, nil
}

// findByName returns the folder holding plugin name: <dir>/<name> when
// its manifest names it, else the one folder whose manifest does.
func (in *Installer) findByName(name string) (string, error) {
	entries, err := os.ReadDir(in.PluginsDir)
	if err != nil {
		return "", fmt.Errorf("%w: %s: %w", ErrNotInstalled, name, err)
	}
	var found []string
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		dir := filepath.Join(in.PluginsDir, e.Name())
		m, err := manifest.Load(dir)
		if (err == nil && m.Name == name) || (err != nil && e.Name() == name) {
			found = append(found, dir)
		}
	}
	switch len(found) {
	case 0:
		return "", fmt.Errorf("%w: %s", ErrNotInstalled, name)
	case 1:
		return found[0], nil
	}
	return "", fmt.Errorf("%w: %d folders hold plugin %s: %s", ErrConflict, len(found), name, strings.Join(found, ", "))
}

// stage makes a fresh staging folder inside the plugins directory, so the
// final rename never crosses a filesystem.
func (in *Installer) stage() (string, error) {
	if err := os.MkdirAll(in.PluginsDir, 0o755); err != nil {
		return "", fmt.Errorf("install: plugins directory: %w", err)
	}
	dir := filepath.Join(in.PluginsDir, StagingPrefix+randomSuffix())
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", fmt.Errorf("install: staging: %w", err)
	}
	return dir, nil
}

// lock takes the plugins directory's install lock.
func (in *Installer) lock() (func(), error) {
	if err := os.MkdirAll(in.PluginsDir, 0o755); err != nil {
		return nil, fmt.Errorf("install: plugins directory: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(in.PluginsDir, lockName), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("install: lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("install: lock: %w", err)
	}
	unlock := func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}
	if err := in.clearLeftovers(); err != nil {
		unlock()
		return nil, err
	}
	return unlock, nil
}

// clearLeftovers mends what an install or a removal killed midway (a
// SIGKILL, the machine stopped) left in the plugins directory; it runs
// under the lock, so nothing there is another's work in progress. A
// staging folder (a download, a copy, or the old version after an
// exchange) and a folder being removed go. A version moved aside for its
// replacement is put back when the replacement never took its place,
// else it goes.
func (in *Installer) clearLeftovers() error {
	entries, err := os.ReadDir(in.PluginsDir)
	if err != nil {
		return fmt.Errorf("install: plugins directory: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(in.PluginsDir, name)
		switch {
		case strings.HasPrefix(name, StagingPrefix), strings.HasPrefix(name, trashPrefix):
		case strings.HasPrefix(name, ReplacedPrefix):
			if m, err := manifest.Load(dir); err == nil {
				if _, err := in.findByName(m.Name); errors.Is(err, ErrNotInstalled) {
					if err := os.Rename(dir, filepath.Join(in.PluginsDir, m.Name)); err == nil {
						continue
					}
				}
			}
		default:
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("install: remove what an interrupted install left: %w", err)
		}
	}
	return nil
}

func randomSuffix() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
