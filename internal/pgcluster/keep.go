package pgcluster

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
	"github.com/clawmesh/clawmesh/internal/datadir"
)

// RootKeys keeps, for each of root's clusters, a copy of what opens it
// that lives in its data directory: the password of its role and the key
// of the stored secrets. A root data directory removed and made again
// took both with it, and its cluster, whole, could not be used again
// (Stales said only which files a backup had to bring back). Kept here,
// the start of the directory made again names the one command that
// re-attaches it (earlierFix). Not done by the start itself: removing the
// data directory is how a user starts afresh, as an ordinary user's,
// whose cluster lives in it, does, and the old settings (API keys among
// them) must not come back unasked. Root's
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
// directory. It returns the folder they are kept in ("" for an ordinary
// user).
func KeepCredentials(dataDir string) (string, error) {
	if os.Geteuid() != 0 {
		return "", nil
	}
	id, err := readID(dataDir)
	if err != nil {
		return "", fmt.Errorf("keep cluster credentials: %w", err)
	}
	if err := os.MkdirAll(RootKeys, 0o700); err != nil {
		return "", fmt.Errorf("keep cluster credentials: %w", err)
	}
	// MkdirAll leaves an existing folder's mode: made by hand, or
	// loosened, it would show the keys to every account.
	if err := os.Chmod(RootKeys, 0o700); err != nil {
		return "", fmt.Errorf("keep cluster credentials: %w", err)
	}
	dir := keysDir(id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("keep cluster credentials: %w", err)
	}
	for _, name := range keptFiles {
		raw, err := os.ReadFile(filepath.Join(dataDir, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue // the secrets key is made by the config service's first start
		}
		if err != nil {
			return "", fmt.Errorf("keep cluster credentials: %w", err)
		}
		if kept, err := os.ReadFile(filepath.Join(dir, name)); err == nil && string(kept) == string(raw) {
			continue
		}
		if err := atomicfile.Replace(filepath.Join(dir, name), raw, 0o600); err != nil {
			return "", fmt.Errorf("keep cluster credentials: %w", err)
		}
	}
	return dir, nil
}

// kept reports whether the credentials of the cluster in dir were kept
// (its role's password at least: the secrets key is missing only when
// the config service never started).
func kept(dir string) bool {
	id := strings.TrimPrefix(filepath.Base(dir), "pg-")
	_, err := os.Stat(filepath.Join(keysDir(id), DataDirPasswordFile))
	return err == nil
}
