package bus

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nkeys"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
)

// Credentials: each role connects with its own nkey. The launcher
// generates the seeds on first start, one 0600 file per role in the
// data directory's bus folder (0700); the server it embeds knows only the
// public keys. A process finds its seed file by role, or where
// EnvSeedFile says; with an external NATS_URL the operator gives the
// server the public keys (`clawmesh bus users` prints them) and each
// process its seed (EnvSeedFile, or EnvSeed holding the seed itself, for
// container secrets).
const (
	EnvSeedFile = "CLAWMESH_NATS_SEED_FILE"
	EnvSeed     = "CLAWMESH_NATS_SEED"
)

// ErrNoCredential: a role's seed is missing.
var ErrNoCredential = errors.New("bus: no credential")

// CredentialDir is the folder of the seeds in a data directory.
func CredentialDir(dataDir string) string { return filepath.Join(dataDir, "bus") }

// SeedFile is the path of a role's seed in a data directory.
func SeedFile(dataDir string, r Role) string {
	return filepath.Join(CredentialDir(dataDir), string(r)+".nk")
}

// EnsureCredentials creates the seed of every role that has none, and
// returns every role's public key.
func EnsureCredentials(dataDir string) (map[Role]string, error) {
	dir := CredentialDir(dataDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("bus credentials: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("bus credentials: %w", err)
	}
	keys := make(map[Role]string, len(Roles))
	for _, r := range Roles {
		path := SeedFile(dataDir, r)
		seed, err := os.ReadFile(path)
		if err == nil && len(seed) == 0 {
			// Only a creation cut short left an empty file (before
			// newSeed linked seeds into place whole): no process ever
			// connected with it, so it is made anew.
			if err = os.Remove(path); err == nil || errors.Is(err, fs.ErrNotExist) {
				err = fs.ErrNotExist
			}
		}
		if errors.Is(err, fs.ErrNotExist) {
			if seed, err = newSeed(path); err != nil {
				return nil, err
			}
		} else if err != nil {
			return nil, fmt.Errorf("bus credential %s: %w", r, err)
		}
		kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(seed))))
		if err != nil {
			return nil, fmt.Errorf("bus credential %s (%s): %w", r, path, err)
		}
		if keys[r], err = kp.PublicKey(); err != nil {
			return nil, fmt.Errorf("bus credential %s: %w", r, err)
		}
	}
	return keys, nil
}

// newSeed writes a new seed to path unless one appears there first, and
// returns the seed at path. The seed is written whole to a temporary file,
// synced and linked into place, so the seed file is never seen
// part-written: created first and written after, a write that failed (a
// full disk, a crash before the data reached it) left an empty or cut
// seed file, and every later start failed on it, space back or not.
func newSeed(path string) ([]byte, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, fmt.Errorf("bus credential: %w", err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, fmt.Errorf("bus credential: %w", err)
	}
	// Two launchers never race on one data directory (it is locked), but
	// a file that appeared meanwhile is never overwritten, and it is the
	// seed.
	created, err := atomicfile.Create(path, append(seed, '\n'), 0o600)
	if err != nil {
		return nil, fmt.Errorf("bus credential: %w", err)
	}
	if !created {
		return os.ReadFile(path)
	}
	return seed, nil
}

// LoadSeed returns the seed a process of role r connects with: EnvSeed,
// else the file EnvSeedFile names, else the role's file in dataDir.
func LoadSeed(dataDir string, r Role) ([]byte, error) {
	if s := os.Getenv(EnvSeed); s != "" {
		return []byte(strings.TrimSpace(s)), nil
	}
	path := os.Getenv(EnvSeedFile)
	if path == "" {
		path = SeedFile(dataDir, r)
	}
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w for role %s: %s does not exist (clawmesh up creates it; with an external NATS set %s or %s)",
			ErrNoCredential, r, path, EnvSeedFile, EnvSeed)
	}
	if err != nil {
		return nil, fmt.Errorf("bus credential %s: %w", r, err)
	}
	return []byte(strings.TrimSpace(string(raw))), nil
}
