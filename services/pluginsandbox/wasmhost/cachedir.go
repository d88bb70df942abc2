package wasmhost

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// The compilation cache on disk (Config.CacheDir) keeps one file a
// compiled module, 13 to 16 MB for a Go guest, named by a hash of the
// module's bytes: a plugin rebuilt is a new file, and wazero removes none.
// A plugin's author rebuilding it a hundred times, or a sandbox upgraded
// to another wazero version (a folder of its own), would grow the folder
// for good. The host keeps it under CacheMaxBytes, trimmed when it starts
// and after each compile.

// DefaultCacheMaxBytes bounds the compilation cache's folder: about
// thirty compiled Go plugins.
const DefaultCacheMaxBytes = 512 << 20

// staleCacheTemp is how long a file wazero writes an entry through
// ("<hash>.<random>.tmp", renamed into place once synced) goes unwritten
// before it is taken for a dead process's: a compile writes it within
// seconds, and replicas share the folder.
const staleCacheTemp = 10 * time.Minute

// fileClockSlack is how far before its start a host takes entries for
// its own: a file's times come from the kernel's coarse clock, a tick (up
// to 4 ms) behind the one time.Now reads, so an entry compiled just after
// the start may look written before it.
const fileClockSlack = time.Second

// cacheEntry is one file of the cache.
type cacheEntry struct {
	path     string
	size     int64
	lastUsed time.Time
}

// trimCache removes the temporary files a dead process left in dir, then
// the least recently used entries until the rest fit in max bytes. An
// entry written since keepSince (by this host, or a replica sharing the
// folder) stays even past the bound: it is in use. "Used" is the later
// of the file's write and its last read; Linux's default relatime
// records a read once after each write and then at most daily, so entries
// read within a day may go in the order of their writes (a cache: one
// removed early is compiled again).
func trimCache(dir string, max int64, keepSince, now time.Time) (removed []string, kept int64, err error) {
	var entries []cacheEntry
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if strings.HasSuffix(d.Name(), ".tmp") {
			if now.Sub(info.ModTime()) >= staleCacheTemp {
				if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
					return err
				}
				removed = append(removed, path)
			}
			return nil
		}
		used := info.ModTime()
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			if at := time.Unix(st.Atim.Unix()); at.After(used) {
				used = at
			}
		}
		entries = append(entries, cacheEntry{path: path, size: info.Size(), lastUsed: used})
		kept += info.Size()
		return nil
	})
	if err != nil {
		return removed, kept, fmt.Errorf("read compilation cache: %w", err)
	}
	slices.SortFunc(entries, func(a, b cacheEntry) int { return a.lastUsed.Compare(b.lastUsed) })
	for _, e := range entries {
		if kept <= max {
			break
		}
		if !e.lastUsed.Before(keepSince) {
			break // this and every later one are in use
		}
		if err := os.Remove(e.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return removed, kept, fmt.Errorf("trim compilation cache: %w", err)
		}
		removed = append(removed, e.path)
		kept -= e.size
	}
	return removed, kept, nil
}

// trimCache keeps the host's cache folder in its bound; a failure is
// logged (the cache works the same, only larger).
func (h *Host) trimCache() {
	if h.cfg.CacheDir == "" {
		return
	}
	h.trimMu.Lock()
	defer h.trimMu.Unlock()
	removed, kept, err := trimCache(h.cfg.CacheDir, h.cfg.CacheMaxBytes, h.started, time.Now())
	if len(removed) > 0 {
		h.logger.Info("compilation cache trimmed", zap.Int("files_removed", len(removed)), zap.Int64("bytes_kept", kept),
			zap.Int64("max_bytes", h.cfg.CacheMaxBytes))
	}
	if err != nil {
		h.logger.Warn("compilation cache not trimmed", zap.Error(err))
	}
}
