package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/datadir"
)

const busUsage = `usage: clawmesh bus <init|users|config> [flags]

Credentials of the bus for a stack whose NATS runs outside the launcher
(containers, Kubernetes). clawmesh up needs none of this: it creates the
seeds and gives its embedded server the public keys itself.

commands:
  init     create the nkey seed of every role that has none (<data>/bus/<role>.nk,
           0600, kept when present) and, with --nats-config, write the
           nats-server configuration that admits exactly those roles with their
           permissions (rendered again each time, from the role table)
  users    print each role and its public key
  config   print that nats-server configuration for the existing seeds

A process finds its seed as <data>/bus/<role>.nk, or in the file
CLAWMESH_NATS_SEED_FILE names, or in CLAWMESH_NATS_SEED itself.

--export-seeds DIR also writes each process role's seed alone to
DIR/<role>/<role>.nk, so that a container mounts only its own (compose
mounts one volume per role there); the data directory's bus folder then
stays init's own, not --owner's.

init also prepares what an init container prepares for the processes:
--owner gives the data directory, the bus folder and every file init
writes to the processes' uid:gid (init then runs as root), --own creates
more folders for them (the client socket's), and --postgres-password
creates a random PostgreSQL password file (kept when present; the
official postgres image reads it with POSTGRES_PASSWORD_FILE) with, next
to it, a .pgpass file the processes read through PGPASSFILE, so the
password is never on a command line nor in DATABASE_URL.

--config-key-dir DIR is the config service's own data directory, where
it keeps its key for secrets at rest (.secret_key), when the other
processes share --config-dir (compose): DIR is created (0700, --owner's)
and a key an earlier deployment left in --config-dir moves there, so
that the config service keeps the key its stored secrets were sealed
with and no other container holds it. Two different keys stop init.
`

// busCmd runs `clawmesh bus`.
func busCmd(args []string, out io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, busUsage)
		return usageErrorf("bus: no command")
	}
	cmd := args[0]
	if isHelp(cmd) {
		fmt.Fprint(out, busUsage)
		return nil
	}
	if cmd != "init" && cmd != "users" && cmd != "config" {
		fmt.Fprint(os.Stderr, busUsage)
		return usageErrorf("bus: unknown command %q", cmd)
	}
	fsf := flag.NewFlagSet("bus "+cmd, flag.ContinueOnError)
	var (
		o   busInit
		dir string
	)
	fsf.StringVar(&dir, "config-dir", "", "data directory (env ZEROCLAW_CONFIG_DIR, ZEROCLAW_DATA_DIR; default ~/.zeroclaw/data)")
	fsf.StringVar(&o.addrs.Listen, "listen", "0.0.0.0:4222", "init, config: the server's client address")
	fsf.StringVar(&o.addrs.Monitor, "monitor", "127.0.0.1:8222", "init, config: the server's HTTP monitoring address (/healthz), empty for none")
	if cmd == "init" {
		fsf.StringVar(&o.natsConfig, "nats-config", "", "write the nats-server configuration to this file")
		fsf.StringVar(&o.owner, "owner", "", "uid:gid to give the data directory and every file init writes")
		fsf.Var(&o.own, "own", "another folder to create (0700) for the processes (repeatable)")
		fsf.StringVar(&o.pgPassword, "postgres-password", "", "create this PostgreSQL password file, and .pgpass beside it, when missing")
		fsf.StringVar(&o.exportSeeds, "export-seeds", "", "also write each process role's seed alone to DIR/<role>/<role>.nk (folder 0700), for a container that mounts only its role's folder")
		fsf.StringVar(&o.configKeyDir, "config-key-dir", "", "the config service's own data directory: create it (0700) and move a secret key left in the data directory there")
	}
	rest, err := parseArgs(fsf, args[1:])
	if errors.Is(err, flag.ErrHelp) {
		usageOf(out, busUsage, fsf)
		return nil
	}
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return usageErrorf("bus %s: unexpected argument %q", cmd, rest[0])
	}
	if o.dataDir, err = datadir.Resolve(dir); err != nil {
		return err
	}
	switch cmd {
	case "init":
		return o.run(out)
	case "users":
		keys, err := existingKeys(o.dataDir)
		if err != nil {
			return err
		}
		for _, r := range bus.Roles {
			if _, err := fmt.Fprintf(out, "%s\t%s\n", r, keys[r]); err != nil {
				return err
			}
		}
		return nil
	default: // config
		keys, err := existingKeys(o.dataDir)
		if err != nil {
			return err
		}
		conf, err := bus.ServerConfig(keys, o.addrs)
		if err != nil {
			return err
		}
		_, err = out.Write(conf)
		return err
	}
}

// existingKeys reads every role's public key from seeds that must exist
// already: users and config never create a credential.
func existingKeys(dataDir string) (map[bus.Role]string, error) {
	for _, r := range bus.Roles {
		if _, err := os.Stat(bus.SeedFile(dataDir, r)); err != nil {
			return nil, fmt.Errorf("%w for role %s (%v); run clawmesh bus init first", bus.ErrNoCredential, r, err)
		}
	}
	return bus.EnsureCredentials(dataDir)
}

// busInit is `clawmesh bus init`.
type busInit struct {
	dataDir      string
	addrs        bus.ServerAddrs
	natsConfig   string
	owner        string
	own          multiFlag
	pgPassword   string
	exportSeeds  string
	configKeyDir string
}

// owner is a parsed --owner; uid -1 when none.
type ownerIDs struct{ uid, gid int }

func parseOwner(s string) (ownerIDs, error) {
	if s == "" {
		return ownerIDs{-1, -1}, nil
	}
	u, g, ok := strings.Cut(s, ":")
	uid, err1 := strconv.Atoi(u)
	gid, err2 := strconv.Atoi(g)
	if !ok || err1 != nil || err2 != nil || uid < 0 || gid < 0 {
		return ownerIDs{}, fmt.Errorf("bus init: --owner %q: want numeric uid:gid", s)
	}
	return ownerIDs{uid, gid}, nil
}

// give hands path to the owner, when there is one.
func (o ownerIDs) give(path string) error {
	if o.uid < 0 {
		return nil
	}
	if err := os.Lchown(path, o.uid, o.gid); err != nil {
		return fmt.Errorf("bus init: %w", err)
	}
	return nil
}

func (b *busInit) run(out io.Writer) error {
	owner, err := parseOwner(b.owner)
	if err != nil {
		return err
	}
	// Check the server configuration's addresses before anything is
	// written, so a typo leaves no half-prepared folder.
	if b.natsConfig != "" {
		if err := b.addrs.Check(); err != nil {
			return err
		}
	}
	dirs := append([]string{b.dataDir}, b.own...)
	if b.configKeyDir != "" {
		dirs = append(dirs, b.configKeyDir)
	}
	for _, dir := range dirs {
		if err := ownedDir(dir, owner); err != nil {
			return err
		}
	}
	if b.configKeyDir != "" {
		moved, err := moveConfigKey(b.dataDir, b.configKeyDir, owner)
		if err != nil {
			return err
		}
		if moved {
			fmt.Fprintf(out, "config key: moved to %s\n", datadir.SecretKey(b.configKeyDir))
		}
	}
	keys, err := bus.EnsureCredentials(b.dataDir)
	if err != nil {
		return err
	}
	// With the seeds exported, the processes read theirs from there and
	// the bus folder, every role's seed, stays init's own (taken back
	// from an earlier run that gave it away): the containers mount the
	// data directory as the owner, and could each read every seed.
	seedOwner := owner
	if b.exportSeeds != "" && owner.uid >= 0 {
		seedOwner = ownerIDs{os.Getuid(), os.Getgid()}
	}
	if err := seedOwner.give(bus.CredentialDir(b.dataDir)); err != nil {
		return err
	}
	for _, r := range bus.Roles {
		if err := seedOwner.give(bus.SeedFile(b.dataDir, r)); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "bus seeds: %s (one 0600 file per role)\n", bus.CredentialDir(b.dataDir))
	if b.exportSeeds != "" {
		if err := exportSeeds(b.dataDir, b.exportSeeds, owner); err != nil {
			return err
		}
		fmt.Fprintf(out, "bus seeds exported: %s/<role>/<role>.nk\n", b.exportSeeds)
	}
	if b.natsConfig != "" {
		conf, err := bus.ServerConfig(keys, b.addrs)
		if err != nil {
			return err
		}
		// The file holds public keys only; the server may run as another
		// user than the processes.
		if err := writeReplace(b.natsConfig, conf, 0o644); err != nil {
			return err
		}
		fmt.Fprintf(out, "nats-server configuration: %s (%d roles)\n", b.natsConfig, len(keys))
	}
	if b.pgPassword != "" {
		created, err := postgresPassword(b.pgPassword, owner)
		if err != nil {
			return err
		}
		verb := "kept"
		if created {
			verb = "created"
		}
		fmt.Fprintf(out, "postgres password: %s (%s), .pgpass: %s\n", b.pgPassword, verb, pgpassPath(b.pgPassword))
	}
	return nil
}

// moveConfigKey moves the config service's key for secrets at rest out
// of dataDir, which every container mounts, into dir, the config
// service's own: in compose the key sat in the shared data volume, where
// every container could read it. The key is written whole into dir
// before it leaves dataDir, so a failure between the two leaves a copy
// and the next run finishes the move. A different key already in dir
// stops init: one of the two sealed the stored secrets, and which one is
// the operator's to say.
func moveConfigKey(dataDir, dir string, owner ownerIDs) (moved bool, err error) {
	src, dst := datadir.SecretKey(dataDir), datadir.SecretKey(dir)
	if filepath.Clean(src) == filepath.Clean(dst) {
		return false, nil
	}
	key, err := os.ReadFile(src)
	switch {
	case errors.Is(err, fs.ErrNotExist): // nothing left to move
	case err != nil:
		return false, fmt.Errorf("bus init: config key: %w", err)
	default:
		have, err := os.ReadFile(dst)
		if errors.Is(err, fs.ErrNotExist) {
			// Linked into place whole, never over a key that appeared
			// meanwhile: what is there is compared below.
			if _, err := atomicfile.Create(dst, key, 0o600); err != nil {
				return false, fmt.Errorf("bus init: config key: %w", err)
			}
			have, err = os.ReadFile(dst)
		}
		switch {
		case err != nil:
			return false, fmt.Errorf("bus init: config key: %w", err)
		case !bytes.Equal(have, key):
			return false, fmt.Errorf("bus init: config key: %s and %s differ; keep the one the stored secrets were sealed with in %s and remove the other", src, dst, dir)
		}
		if err := os.Remove(src); err != nil {
			return false, fmt.Errorf("bus init: config key: %w", err)
		}
		moved = true
	}
	// The key, moved here or made by the config service, is the
	// processes' (after a change of --owner too, as the folders are).
	if _, err := os.Lstat(dst); err == nil {
		if err := owner.give(dst); err != nil {
			return false, err
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("bus init: config key: %w", err)
	}
	return moved, nil
}

// exportSeeds writes each process role's seed, alone, into its own folder
// under dir: a container mounts its role's folder and reads no other
// role's seed, where one data folder holding them all let any container
// connect to the bus as any role (and so publish what only that role
// may). The launcher's role is clawmesh up's own; no container runs it.
// Written again at each run, so a folder always holds the seed that
// nats-server's configuration admits.
func exportSeeds(dataDir, dir string, owner ownerIDs) error {
	for _, r := range bus.Roles {
		if r == bus.RoleLauncher {
			continue
		}
		seed, err := os.ReadFile(bus.SeedFile(dataDir, r))
		if err != nil {
			return fmt.Errorf("bus init: %w", err)
		}
		folder := filepath.Join(dir, string(r))
		if err := ownedDir(folder, owner); err != nil {
			return err
		}
		// ownedDir leaves an existing folder's mode alone without an
		// owner; the seed's folder is the role's own either way.
		if err := os.Chmod(folder, 0o700); err != nil {
			return fmt.Errorf("bus init: %w", err)
		}
		path := filepath.Join(folder, string(r)+".nk")
		if err := writeReplace(path, seed, 0o600); err != nil {
			return err
		}
		if err := owner.give(path); err != nil {
			return err
		}
	}
	return nil
}

// ownedDir creates dir 0700 when missing and gives it to the owner; an
// existing folder with an owner given is made 0700 too, since the
// processes keep sockets and secrets in it.
func ownedDir(dir string, owner ownerIDs) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("bus init: %w", err)
	}
	if owner.uid < 0 {
		return nil
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("bus init: %w", err)
	}
	return owner.give(dir)
}

// pgpassPath is the .pgpass file beside the password file.
func pgpassPath(passwordFile string) string {
	return filepath.Join(filepath.Dir(passwordFile), ".pgpass")
}

// postgresPassword creates the password file when missing (32 random
// bytes, hexadecimal: nothing to escape anywhere) and writes the .pgpass
// line that matches every host, port, database and user with it.
func postgresPassword(path string, owner ownerIDs) (created bool, err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return false, fmt.Errorf("bus init: %w", err)
	}
	raw, err := os.ReadFile(path)
	if err == nil && len(raw) == 0 {
		// Only a creation cut short left an empty file (before the
		// password was linked into place whole): no server was ever
		// given it, so it is made anew.
		if err = os.Remove(path); err == nil || errors.Is(err, fs.ErrNotExist) {
			err = fs.ErrNotExist
		}
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		secret := make([]byte, 32)
		if _, err := rand.Read(secret); err != nil {
			return false, fmt.Errorf("bus init: %w", err)
		}
		raw = []byte(hex.EncodeToString(secret))
		// Written whole (atomicfile): created first and written after,
		// a write that failed (a full disk) left an empty password file,
		// and every later bus init refused it, space back or not.
		if created, err = atomicfile.Create(path, raw, 0o600); err != nil {
			return false, fmt.Errorf("bus init: %w", err)
		}
		if !created {
			// Another bus init made it meanwhile: its password is the one.
			if raw, err = os.ReadFile(path); err != nil {
				return false, fmt.Errorf("bus init: %w", err)
			}
		}
	case err != nil:
		return false, fmt.Errorf("bus init: %w", err)
	}
	password := strings.TrimSpace(string(raw))
	if password == "" || strings.ContainsAny(password, ":\\\n") {
		return false, fmt.Errorf("bus init: %s: want one line without ':' or '\\'", path)
	}
	if err := owner.give(path); err != nil {
		return false, err
	}
	pgpass := pgpassPath(path)
	if err := writeReplace(pgpass, []byte("*:*:*:*:"+password+"\n"), 0o600); err != nil {
		return false, err
	}
	return created, owner.give(pgpass)
}

// writeReplace writes data to path whole (atomicfile.Replace), making
// its folder first.
func writeReplace(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("bus init: %w", err)
	}
	if err := atomicfile.Replace(path, data, mode); err != nil {
		return fmt.Errorf("bus init: %w", err)
	}
	return nil
}
