package pgcluster

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
	"github.com/clawmesh/clawmesh/internal/datadir"
)

// RootKeys keeps, for each of root's clusters, a copy of what opens it
// that lives in its data directory: the password of its role and the key
// of the stored secrets. A root data directory removed and made again
// took both with it, and its cluster, whole, could not be used again
// (Stales said only which files a backup had to bring back). Kept here,
// a start of the directory made again re-attaches it (Reattach). Root's
// alone (0700): the cluster folder belongs to the account PostgreSQL
// runs as, which must not read the secrets key beside the database.
var RootKeys = filepath.Join(RootClusters, "keys")

// keptFiles are the data directory's files kept for its cluster.
var keptFiles = []string{DataDirPasswordFile, filepath.Base(datadir.SecretKey(""))}

func keysDir(id string) string { return filepath.Join(RootKeys, "pg-"+id) }

// KeepCredentials copies, for root, the data directory's password of its
// cluster's role and its secrets key, as far as they exist yet, next to
// the cluster (RootKeys), so that the cluster can be re-attached once
// the data directory is removed and made again. It does nothing for an
// ordinary user, whose cluster lives in, and goes with, the data
// directory.
func KeepCredentials(dataDir string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	id, err := readID(dataDir)
	if err != nil {
		return fmt.Errorf("keep cluster credentials: %w", err)
	}
	if err := os.MkdirAll(RootKeys, 0o700); err != nil {
		return fmt.Errorf("keep cluster credentials: %w", err)
	}
	// MkdirAll leaves an existing folder's mode: made by hand, or
	// loosened, it would show the keys to every account.
	if err := os.Chmod(RootKeys, 0o700); err != nil {
		return fmt.Errorf("keep cluster credentials: %w", err)
	}
	dir := keysDir(id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("keep cluster credentials: %w", err)
	}
	for _, name := range keptFiles {
		raw, err := os.ReadFile(filepath.Join(dataDir, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue // the secrets key is made by the config service's first start
		}
		if err != nil {
			return fmt.Errorf("keep cluster credentials: %w", err)
		}
		if kept, err := os.ReadFile(filepath.Join(dir, name)); err == nil && string(kept) == string(raw) {
			continue
		}
		if err := atomicfile.Replace(filepath.Join(dir, name), raw, 0o600); err != nil {
			return fmt.Errorf("keep cluster credentials: %w", err)
		}
	}
	return nil
}

// kept reports whether the credentials of the cluster in dir were kept
// (its role's password at least: the secrets key is missing only when
// the config service never started).
func kept(dir string) bool {
	id := strings.TrimPrefix(filepath.Base(dir), "pg-")
	_, err := os.Stat(filepath.Join(keysDir(id), DataDirPasswordFile))
	return err == nil
}

// Reattach binds a root data directory that has no cluster id (removed
// and made again) back to its cluster from before, when that cluster
// still holds its database, no server runs on it and its credentials
// were kept (KeepCredentials): the kept password and secrets key are put
// back into the data directory, then the id, last, so a cut short
// re-attachment is taken up again by the next start. A data directory
// holding a secrets key of its own already is left alone: its stored
// secrets would not open with the old one. It returns the cluster folder
// re-attached, "" when there is none.
func Reattach(dataDir string, log *zap.Logger) (string, error) {
	if os.Geteuid() != 0 {
		return "", nil
	}
	if _, err := readID(dataDir); !errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if log == nil {
		log = zap.NewNop()
	}
	dir := earlierKept(dataDir)
	if dir == "" {
		return "", nil
	}
	id := strings.TrimPrefix(filepath.Base(dir), "pg-")
	for _, name := range keptFiles {
		raw, err := os.ReadFile(filepath.Join(keysDir(id), name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("re-attach the cluster %s: %w", dir, err)
		}
		dst := filepath.Join(dataDir, name)
		if cur, err := os.ReadFile(dst); err == nil {
			if string(cur) == string(raw) {
				continue
			}
			log.Warn("the data directory's database from before it was removed is not re-attached: the directory holds a "+name+" of its own",
				zap.String("cluster", dir), zap.String("file", dst))
			return "", nil
		}
		if err := atomicfile.Replace(dst, raw, 0o600); err != nil {
			return "", fmt.Errorf("re-attach the cluster %s: %w", dir, err)
		}
	}
	if err := atomicfile.Replace(filepath.Join(dataDir, IDFile), []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("re-attach the cluster %s: %w", dir, err)
	}
	return dir, nil
}

// earlierKept is the cluster dataDir had before it was removed and made
// again whose credentials were kept: the one last bound, when there are
// several; "" when there is none.
func earlierKept(dataDir string) string {
	entries, err := os.ReadDir(RootClusters)
	if err != nil {
		return ""
	}
	var best string
	var bestTime int64
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), "pg-") {
			continue
		}
		dir := filepath.Join(RootClusters, e.Name())
		if !idPattern.MatchString(strings.TrimPrefix(e.Name(), "pg-")) || recordedDataDir(dir) != dataDir ||
			!holdsDatabase(dir) || running(dir) || !kept(dir) {
			continue
		}
		fi, err := os.Stat(filepath.Join(dir, ownerFile))
		if err != nil {
			continue
		}
		if t := fi.ModTime().UnixNano(); best == "" || t > bestTime {
			best, bestTime = dir, t
		}
	}
	return best
}
