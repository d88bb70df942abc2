package pgcluster

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
)

// A data directory owns its database. As an ordinary user the cluster
// lives inside the data directory and goes with it. Root's cluster cannot
// (root's data directory is 0700, which the server's account cannot
// enter), so it lives under RootClusters, named by an id kept in the data
// directory (IDFile): a data directory without one, new or recreated on a
// path used before, gets a fresh cluster, never another's. Each cluster
// folder records its data directory and id (ownerFile), so Collect can
// remove the clusters whose data directory is gone.

// RootClusters holds root's clusters: a persistent place (not a temporary
// folder a reboot may empty) that the unprivileged account can traverse.
const RootClusters = "/var/lib/clawmesh"

// IDFile names, in a data directory, the id of its root-run cluster.
const IDFile = "postgres.id"

// DataDirPasswordFile names, in a data directory, the password of its
// root-run cluster's role (the launcher's Options.PasswordFile).
const DataDirPasswordFile = "postgres.password"

// ownerFile, in a cluster folder, records "<data directory>\n<id>\n".
const ownerFile = "clawmesh-owner"

var idPattern = regexp.MustCompile(`^[0-9a-f]{24}$`)

// Dir is where the cluster of the data directory dataDir lives: inside it
// (dataDir/postgres) for an ordinary user; for root, under RootClusters
// by the data directory's id, or "" when it has none yet (Bind makes one).
func Dir(dataDir string) string {
	if os.Geteuid() != 0 {
		return filepath.Join(dataDir, "postgres")
	}
	id, err := readID(dataDir)
	if err != nil {
		return ""
	}
	return filepath.Join(RootClusters, "pg-"+id)
}

// Bind returns the cluster folder of dataDir. For root it reads the data
// directory's cluster id, or makes a new one, and records the owner in
// the cluster folder, which it creates.
func Bind(dataDir string) (string, error) {
	if os.Geteuid() != 0 {
		return Dir(dataDir), nil
	}
	id, err := readID(dataDir)
	if errors.Is(err, fs.ErrNotExist) {
		id, err = newID(dataDir)
	}
	if err != nil {
		return "", err
	}
	dir := filepath.Join(RootClusters, "pg-"+id)
	if err := adopt(dataDir, dir); err != nil {
		return "", err
	}
	if err := os.MkdirAll(RootClusters, 0o755); err != nil {
		return "", fmt.Errorf("cluster folder: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("cluster folder: %w", err)
	}
	owner := dataDir + "\n" + id + "\n"
	if err := writeOwnFile(filepath.Join(dir, ownerFile), []byte(owner), -1, -1); err != nil {
		return "", fmt.Errorf("cluster owner record: %w", err)
	}
	return dir, nil
}

// legacyDir is where a version before clusters were bound by id kept
// root's cluster of dataDir: a folder named after its path.
func legacyDir(dataDir string) string {
	sum := sha256.Sum256([]byte(dataDir))
	return filepath.Join(RootClusters, "pg-"+hex.EncodeToString(sum[:6]))
}

// EarlierCluster is the cluster a version before clusters were bound by
// id kept for dataDir, when it is still there and holds a database: ""
// otherwise, and unless this process is root. Bind adopts it; one left
// is a data directory bound to another cluster already, and holds data
// no start removes.
func EarlierCluster(dataDir string) string {
	if os.Geteuid() != 0 {
		return ""
	}
	dir := legacyDir(dataDir)
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
		return ""
	}
	if _, err := os.Stat(filepath.Join(dir, "data", "PG_VERSION")); err != nil {
		return ""
	}
	return dir
}

// adopt makes the cluster an earlier version kept for dataDir the one
// bound by id, in dir: such a data directory (upgraded from a version
// before clusters were bound by id) has no id, and its database, all its
// sessions and settings, is in that cluster. It was removed as stale and
// an empty cluster made in its place, said only in an info line. Adopted
// rather than refused: the folder is renamed under RootClusters, root's
// alone, whole and at once (a cluster's data names no path of its own),
// and Prepare then switches it from trusting its socket to the generated
// password, as a new cluster of root is made. A cut short adoption is
// taken up again: the id is kept before the rename, and the folder is
// still there under its earlier name until it is renamed. A data
// directory bound to a cluster already keeps it; the earlier one is left
// as it is, never removed (EarlierCluster names it).
func adopt(dataDir, dir string) error {
	legacy := EarlierCluster(dataDir)
	if legacy == "" {
		return nil
	}
	if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if running(legacy) {
		return fmt.Errorf("the postgres cluster %s of an earlier version still runs (pid %s): stop that server, then start again; its data is adopted then",
			legacy, lockFileLine(legacy, lockLinePID))
	}
	if err := os.Rename(legacy, dir); err != nil {
		return fmt.Errorf("adopt the postgres cluster %s of an earlier version: %w", legacy, err)
	}
	return nil
}

// writeOwnFile writes data to a new file at path, 0600, owned by uid and
// gid (-1: this process's), in place of whatever was there. The cluster
// folder belongs to the account PostgreSQL runs as, shared with other
// software: a link it left at the path was followed by os.WriteFile and
// os.Chown, as root, so that account could truncate and fill, or take,
// any file on the machine. The name is removed (a link itself, not its
// target) and made anew without following a link, exclusively: a link
// put back in between fails the write rather than being followed. The
// owner is set on the open file, never by name.
func writeOwnFile(path string, data []byte, uid, gid int) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil && uid >= 0 {
		err = f.Chown(uid, gid)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
	}
	return err
}

func readID(dataDir string) (string, error) {
	raw, err := os.ReadFile(filepath.Join(dataDir, IDFile))
	if err != nil {
		return "", err
	}
	if len(raw) == 0 {
		// Only a creation cut short left an empty file (before newID
		// renamed the id into place whole): no cluster was ever bound
		// by it.
		return "", fmt.Errorf("%s: empty: %w", filepath.Join(dataDir, IDFile), fs.ErrNotExist)
	}
	id := strings.TrimSpace(string(raw))
	if !idPattern.MatchString(id) {
		return "", fmt.Errorf("%s: not a cluster id", filepath.Join(dataDir, IDFile))
	}
	return id, nil
}

func newID(dataDir string) (string, error) {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("cluster id: %w", err)
	}
	id := hex.EncodeToString(b)
	if err := atomicfile.Replace(filepath.Join(dataDir, IDFile), []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("cluster id: %w", err)
	}
	return id, nil
}

// Stale is a root cluster no data directory owns any more.
type Stale struct {
	Dir, Why string
	// HoldsData: the folder holds a database (data/PG_VERSION). Its
	// owner may have been moved to another path, or be on a disk not
	// mounted now, rather than deleted: a start cannot tell them apart,
	// so such a cluster is listed, never removed by Collect.
	HoldsData bool
	// Earlier: its record names the data directory Stales was asked
	// about, which has been removed and made again since (it has no
	// cluster id, or a new one): this cluster holds that directory's
	// database from before. Fix says what to do about it.
	Earlier bool
	Fix     string
}

// earlierFix is what to do about the cluster in dir that dataDir had
// before it was removed and made again. A removed root data directory
// took with it the cluster's id, the password of its role and the key of
// the stored secrets. Kept beside the cluster (KeepCredentials), they
// bring it back with one command, given here; a cluster made by a
// version that did not keep them needs a backup. Re-attached by hand
// without them,
// the old cluster's role has a password this directory no longer holds
// (Prepare fails with ErrNoPassword), and its stored secrets do not open
// with a new key: only the removed files bring it back, so this gives
// the commands that put them back from a backup.
func earlierFix(dataDir, dir string) string {
	id := strings.TrimPrefix(filepath.Base(dir), "pg-")
	if kept(dir) {
		return "its password and secrets key are kept in " + keysDir(id) + "; to go back to it, stop the stack, run " +
			"'cp " + keysDir(id) + "/" + DataDirPasswordFile + " " + keysDir(id) + "/.secret_key " + dataDir + "/ && echo " + id + " > " + dataDir + "/" + IDFile + "' " +
			"and start it again (clawmesh up --config-dir " + dataDir + "); otherwise 'rm -rf " + dir + " " + keysDir(id) + "' once nothing in it is needed"
	}
	return "this stack uses a new cluster, and the old one's password and secrets key went with the removed directory (an earlier version kept them nowhere else); " +
		"to go back to the old database, stop the stack, put them back from a backup of the removed directory with " +
		"'cp BACKUP/" + DataDirPasswordFile + " BACKUP/.secret_key " + dataDir + "/ && echo " + id + " > " + dataDir + "/" + IDFile + "' " +
		"(BACKUP: where the backup is), and start it again (clawmesh up --config-dir " + dataDir + "); " +
		"without a backup it cannot be used again: 'rm -rf " + dir + "' once nothing in it is needed"
}

// Stales lists root's clusters that no data directory owns any more:
// those whose recorded data directory is gone or names another cluster,
// and the folder an earlier version kept for dataDir under a name made
// from its path when it holds no database (one that does is adopted by
// Bind, or left). A cluster whose server runs is never listed. It lists
// nothing unless this process is root.
func Stales(dataDir string) []Stale {
	if os.Geteuid() != 0 {
		return nil
	}
	entries, err := os.ReadDir(RootClusters)
	if err != nil {
		return nil
	}
	legacy := filepath.Base(legacyDir(dataDir))
	// The cluster dataDir's own id names is its, whatever path its
	// record holds: a data directory moved elsewhere is started from a
	// path its record does not name, and the old one is gone. Taken for
	// stale, it was removed and Bind made an empty one in its place.
	var own string
	if id, err := readID(dataDir); err == nil {
		own = "pg-" + id
	}
	var out []Stale
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), "pg-") || e.Name() == own {
			continue
		}
		dir := filepath.Join(RootClusters, e.Name())
		stale, why := orphaned(dir, e.Name() == legacy)
		if !stale || running(dir) {
			continue
		}
		st := Stale{Dir: dir, Why: why, HoldsData: holdsDatabase(dir)}
		if st.HoldsData && recordedDataDir(dir) == dataDir {
			st.Earlier = true
			st.Why = "the cluster of " + dataDir + " before that directory was removed and made again"
			st.Fix = earlierFix(dataDir, dir)
		}
		out = append(out, st)
	}
	return out
}

// Collect removes the clusters Stales lists that hold no database and
// returns the folders removed. One holding a database is left and said:
// its data directory's record names a path that is gone or bound to
// another cluster, which is also what a data directory moved elsewhere
// (and not started since), or on a disk not mounted now, leaves. Removed,
// that directory's next start made an empty cluster in its place: every
// session and setting of it lost, by another data directory's start.
func Collect(dataDir string, log *zap.Logger) []string {
	if log == nil {
		log = zap.NewNop()
	}
	var removed []string
	for _, st := range Stales(dataDir) {
		if st.Earlier {
			log.Warn("this data directory's database from before it was removed is left in its own cluster, unused",
				zap.String("dir", st.Dir), zap.String("why", st.Why), zap.String("fix", st.Fix))
			continue
		}
		if st.HoldsData {
			log.Warn("a postgres cluster no data directory owns is left in place: it holds a database; start its data directory (moved?) to keep it, or remove it once nothing in it is needed",
				zap.String("dir", st.Dir), zap.String("why", st.Why))
			continue
		}
		if err := os.RemoveAll(st.Dir); err != nil {
			log.Warn("stale postgres cluster not removed", zap.String("dir", st.Dir), zap.Error(err))
			continue
		}
		// Its kept credentials open nothing any more.
		if id := strings.TrimPrefix(filepath.Base(st.Dir), "pg-"); idPattern.MatchString(id) {
			if err := os.RemoveAll(keysDir(id)); err != nil {
				log.Warn("stale postgres cluster's kept credentials not removed", zap.String("dir", keysDir(id)), zap.Error(err))
			}
		}
		log.Info("stale postgres cluster removed", zap.String("dir", st.Dir), zap.String("why", st.Why))
		removed = append(removed, st.Dir)
	}
	return removed
}

// recordedDataDir is the data directory the owner record of the cluster
// in dir names, "" when it has none.
func recordedDataDir(dir string) string {
	raw, err := os.ReadFile(filepath.Join(dir, ownerFile))
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	if len(lines) != 2 {
		return ""
	}
	return lines[0]
}

// orphaned reports whether no data directory owns the cluster in dir.
func orphaned(dir string, legacyOfThisDataDir bool) (bool, string) {
	raw, err := os.ReadFile(filepath.Join(dir, ownerFile))
	if errors.Is(err, fs.ErrNotExist) {
		// No record: an earlier version's cluster, or one being created
		// right now. This data directory's old one holding a database
		// holds its data: Bind adopts it (adopt). Without one (an
		// earlier initdb cut short) there is nothing to keep.
		if legacyOfThisDataDir {
			if _, err := os.Stat(filepath.Join(dir, "data", "PG_VERSION")); errors.Is(err, fs.ErrNotExist) {
				return true, "the data directory's cluster before clusters were bound by id, holding no database"
			}
		}
		return false, ""
	}
	if err != nil {
		return false, ""
	}
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	if len(lines) != 2 {
		return false, ""
	}
	dataDir, id := lines[0], lines[1]
	got, err := readID(dataDir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if _, statErr := os.Stat(dataDir); errors.Is(statErr, fs.ErrNotExist) {
			return true, "its data directory " + dataDir + " is gone"
		}
		return true, "its data directory " + dataDir + " has no cluster id any more"
	case err != nil:
		return false, ""
	case got != id:
		return true, "its data directory " + dataDir + " is bound to another cluster"
	}
	return false, ""
}

// holdsDatabase reports whether the cluster folder dir holds a database
// (an initdb that finished), or may: only a folder known to hold none is
// said not to.
func holdsDatabase(dir string) bool {
	_, err := os.Stat(filepath.Join(dataDir(dir), "PG_VERSION"))
	return !errors.Is(err, fs.ErrNotExist)
}

// dataDir is the PostgreSQL data directory of the cluster in dir.
func dataDir(dir string) string { return filepath.Join(dir, "data") }

// Lines of the postmaster's lock file, postmaster.pid (PostgreSQL's
// pidfile.h): its pid first, its state (starting, stopping, ready)
// eighth.
const (
	lockLinePID    = 1
	lockLineStatus = 8
)

// lockFileLine is line n (from 1) of the lock file of the cluster in dir,
// trimmed: "" when there is no file or no such line yet.
func lockFileLine(dir string, n int) string {
	raw, err := os.ReadFile(filepath.Join(dataDir(dir), "postmaster.pid"))
	if err != nil {
		return ""
	}
	lines := strings.Split(string(raw), "\n")
	if len(lines) < n {
		return ""
	}
	return strings.TrimSpace(lines[n-1])
}

// running reports whether the postmaster of the cluster in dir is alive.
func running(dir string) bool {
	pid, err := strconv.Atoi(lockFileLine(dir, lockLinePID))
	if err != nil || pid <= 0 {
		return false
	}
	err = syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
