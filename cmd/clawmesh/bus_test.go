package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/testdisk"
)

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

// bus init prepares what the compose init service and a Kubernetes
// operator need: every role's seed (0600), the server's configuration, a
// PostgreSQL password with its .pgpass; a second run keeps every secret
// and renders the configuration again.
func TestBusInitPreparesAndKeeps(t *testing.T) {
	base := t.TempDir()
	data := filepath.Join(base, "data")
	conf := filepath.Join(base, "nats", "nats.conf")
	pw := filepath.Join(base, "secrets", "postgres_password")
	run := filepath.Join(base, "run")
	args := []string{"init", "--config-dir", data, "--nats-config", conf, "--postgres-password", pw, "--own", run}
	var out bytes.Buffer
	if err := busCmd(args, &out); err != nil {
		t.Fatal(err)
	}
	for _, r := range bus.Roles {
		if m := mode(t, bus.SeedFile(data, r)); m != 0o600 {
			t.Errorf("seed of %s: mode %v", r, m)
		}
	}
	for path, want := range map[string]os.FileMode{
		data: 0o700, bus.CredentialDir(data): 0o700, run: 0o700, conf: 0o644,
		pw: 0o600, filepath.Join(base, "secrets", ".pgpass"): 0o600,
	} {
		if m := mode(t, path); m != want {
			t.Errorf("%s: mode %v, want %v", path, m, want)
		}
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("nats-server refuses the written configuration: %v", err)
	}
	if len(opts.Nkeys) != len(bus.Roles) || opts.HTTPHost != "127.0.0.1" || opts.HTTPPort != 8222 || opts.Port != 4222 {
		t.Fatalf("configuration: %d users, monitor %s:%d, port %d", len(opts.Nkeys), opts.HTTPHost, opts.HTTPPort, opts.Port)
	}
	password, _ := os.ReadFile(pw)
	pgpass, _ := os.ReadFile(filepath.Join(base, "secrets", ".pgpass"))
	if len(password) != 64 || string(pgpass) != "*:*:*:*:"+string(password)+"\n" {
		t.Fatalf("password %q, .pgpass %q", password, pgpass)
	}
	seed, _ := os.ReadFile(bus.SeedFile(data, bus.RoleSession))

	// users prints the keys the configuration admits.
	out.Reset()
	if err := busCmd([]string{"users", "--config-dir", data}, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != len(bus.Roles) {
		t.Fatalf("users printed %q", out.String())
	}
	admitted := map[string]bool{}
	for _, u := range opts.Nkeys {
		admitted[u.Nkey] = true
	}
	for _, l := range lines {
		role, key, _ := strings.Cut(l, "\t")
		if !admitted[key] {
			t.Errorf("role %s: key %s not in the configuration", role, key)
		}
	}

	// Again: the secrets stay, the configuration is rendered anew.
	if err := os.WriteFile(conf, []byte("stale"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := busCmd(args, &out); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(bus.SeedFile(data, bus.RoleSession)); !bytes.Equal(again, seed) {
		t.Error("a second init replaced a seed")
	}
	if again, _ := os.ReadFile(pw); !bytes.Equal(again, password) {
		t.Error("a second init replaced the postgres password")
	}
	if _, err := server.ProcessConfigFile(conf); err != nil {
		t.Errorf("configuration not rendered again: %v", err)
	}
	if out.String() == "" || !strings.Contains(out.String(), "(kept)") {
		t.Errorf("second run said %q", out.String())
	}
}

func TestBusRefusals(t *testing.T) {
	base := t.TempDir()
	var out bytes.Buffer
	for name, args := range map[string][]string{
		"users before init":  {"users", "--config-dir", filepath.Join(base, "empty")},
		"config before init": {"config", "--config-dir", filepath.Join(base, "empty")},
		"bad owner":          {"init", "--config-dir", filepath.Join(base, "a"), "--owner", "me"},
		"bad listen":         {"init", "--config-dir", filepath.Join(base, "b"), "--nats-config", filepath.Join(base, "n.conf"), "--listen", "nowhere"},
		"unknown command":    {"frobnicate"},
		"stray argument":     {"users", "extra"},
	} {
		if err := busCmd(args, &out); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// A refused init wrote nothing.
	for _, dir := range []string{"a", "b", "empty"} {
		if _, err := os.Stat(filepath.Join(base, dir)); err == nil {
			t.Errorf("a refused command created %s", dir)
		}
	}
}

// As an init container (root), init gives every folder and file it
// writes to the processes' uid:gid, and a folder that existed already
// (a bind mount dockerd created root-owned) too.
func TestBusInitOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown to another uid needs root")
	}
	base := t.TempDir()
	data := filepath.Join(base, "data")
	run := filepath.Join(base, "run")
	if err := os.Mkdir(run, 0o755); err != nil {
		t.Fatal(err)
	}
	pw := filepath.Join(base, "secrets", "postgres_password")
	var out bytes.Buffer
	err := busCmd([]string{"init", "--config-dir", data, "--owner", "4321:4322", "--own", run,
		"--postgres-password", pw, "--nats-config", filepath.Join(base, "nats.conf")}, &out)
	if err != nil {
		t.Fatal(err)
	}
	paths := []string{data, bus.CredentialDir(data), run, pw, filepath.Join(base, "secrets", ".pgpass")}
	for _, r := range bus.Roles {
		paths = append(paths, bus.SeedFile(data, r))
	}
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != 4321 || st.Gid != 4322 {
			t.Errorf("%s: owner %d:%d, want 4321:4322", p, st.Uid, st.Gid)
		}
	}
	if m := mode(t, run); m != 0o700 {
		t.Errorf("%s: mode %v, want 0700", run, m)
	}
}

// The database password of bus init was created first and written after:
// on a full disk the write failed and left an empty password file, and
// every later bus init refused it ("want one line") once space was back.
// It is linked into place whole now, and an empty one, which only such a
// creation left, is made anew.
func TestBusInitPasswordWrittenWhole(t *testing.T) {
	disk := testdisk.New(t, 1<<20)
	pw := filepath.Join(disk.Dir, "secrets", "postgres.password")
	if err := os.MkdirAll(filepath.Dir(pw), 0o700); err != nil {
		t.Fatal(err)
	}
	disk.Fill()
	if _, err := postgresPassword(pw, ownerIDs{-1, -1}); err == nil {
		t.Fatal("a password written on a full disk")
	}
	disk.Free()
	created, err := postgresPassword(pw, ownerIDs{-1, -1})
	if err != nil || !created {
		t.Fatalf("space back: created %v, %v", created, err)
	}
	raw, err := os.ReadFile(pw)
	if err != nil || len(strings.TrimSpace(string(raw))) != 64 {
		t.Fatalf("the password file: %q %v", raw, err)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(pw), ".postgres.password.*")); len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
}

// --export-seeds gives each process role a folder holding its own seed
// alone, for a container that mounts only that folder: in compose every
// container mounted the data volume, where every role's seed is, and
// could connect to the bus as any role. The launcher's role, which no
// container runs, is not exported.
func TestBusInitExportsEachSeed(t *testing.T) {
	base := t.TempDir()
	data := filepath.Join(base, "setup")
	seeds := filepath.Join(base, "seeds")
	var out bytes.Buffer
	if err := busCmd([]string{"init", "--config-dir", data, "--export-seeds", seeds}, &out); err != nil {
		t.Fatal(err)
	}
	for _, r := range bus.Roles {
		dir := filepath.Join(seeds, string(r))
		if r == bus.RoleLauncher {
			if _, err := os.Stat(dir); err == nil {
				t.Errorf("the launcher's seed was exported to %s", dir)
			}
			continue
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 1 || entries[0].Name() != string(r)+".nk" {
			t.Errorf("%s holds %v, want %s.nk alone", dir, entries, r)
			continue
		}
		want, _ := os.ReadFile(bus.SeedFile(data, r))
		got, _ := os.ReadFile(filepath.Join(dir, string(r)+".nk"))
		if len(want) == 0 || !bytes.Equal(got, want) {
			t.Errorf("%s: exported seed differs from %s", r, bus.SeedFile(data, r))
		}
		if m := mode(t, dir); m != 0o700 {
			t.Errorf("%s: mode %v, want 0700", dir, m)
		}
		if m := mode(t, filepath.Join(dir, string(r)+".nk")); m != 0o600 {
			t.Errorf("%s seed: mode %v, want 0600", r, m)
		}
	}
}

// With --export-seeds and --owner the data directory's bus folder, which
// holds every role's seed, stays init's own (root's under compose): the
// containers mount the data directory and run as the owner, so a bus
// folder given to it let each read every role's seed. A folder an
// earlier run gave to the owner is taken back.
func TestBusInitExportKeepsTheBusFolderItsOwn(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown to another uid needs root")
	}
	base := t.TempDir()
	data := filepath.Join(base, "data")
	seeds := filepath.Join(base, "seeds")
	var out bytes.Buffer
	// An earlier run, before --export-seeds, gave the folder away.
	if err := busCmd([]string{"init", "--config-dir", data, "--owner", "4321:4322"}, &out); err != nil {
		t.Fatal(err)
	}
	if err := busCmd([]string{"init", "--config-dir", data, "--owner", "4321:4322", "--export-seeds", seeds}, &out); err != nil {
		t.Fatal(err)
	}
	owner := func(p string) (uint32, uint32) {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		return st.Uid, st.Gid
	}
	if u, g := owner(data); u != 4321 || g != 4322 {
		t.Errorf("%s: owner %d:%d, want 4321:4322", data, u, g)
	}
	paths := []string{bus.CredentialDir(data)}
	for _, r := range bus.Roles {
		paths = append(paths, bus.SeedFile(data, r))
	}
	for _, p := range paths {
		if u, g := owner(p); u != 0 || g != 0 {
			t.Errorf("%s: owner %d:%d, want init's own 0:0", p, u, g)
		}
	}
	for _, r := range bus.Roles {
		if r == bus.RoleLauncher {
			continue
		}
		for _, p := range []string{filepath.Join(seeds, string(r)), filepath.Join(seeds, string(r), string(r)+".nk")} {
			if u, g := owner(p); u != 4321 || g != 4322 {
				t.Errorf("%s: owner %d:%d, want 4321:4322", p, u, g)
			}
		}
	}
}

// bus users before bus init names the missing seed and the fix, once
// prefixed: it read "bus: bus: no credential for role launcher ...".
func TestBusUsersBeforeInitSaid(t *testing.T) {
	var out bytes.Buffer
	err := busCmd([]string{"users", "--config-dir", filepath.Join(t.TempDir(), "empty")}, &out)
	if err == nil || !strings.HasPrefix(err.Error(), "bus: no credential for role ") || !strings.Contains(err.Error(), "run clawmesh bus init first") {
		t.Fatalf("bus users before init: %v", err)
	}
}

// --config-key-dir moves the config service's key out of the data
// directory every container shares into the config service's own, kept
// byte for byte (the stored secrets were sealed with it) and 0600; a
// second run finds it there and changes nothing; a different key already
// there stops init with both kept, for the operator to choose.
func TestBusInitMovesTheConfigKey(t *testing.T) {
	base := t.TempDir()
	data := filepath.Join(base, "data")
	own := filepath.Join(base, "config")
	key := bytes.Repeat([]byte{7}, 32)
	if err := os.MkdirAll(data, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, ".secret_key"), key, 0o600); err != nil {
		t.Fatal(err)
	}
	for run := 1; run <= 2; run++ {
		var out bytes.Buffer
		if err := busCmd([]string{"init", "--config-dir", data, "--config-key-dir", own}, &out); err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		if _, err := os.Stat(filepath.Join(data, ".secret_key")); !os.IsNotExist(err) {
			t.Errorf("run %d: the key is still in the shared data directory (%v)", run, err)
		}
		got, err := os.ReadFile(filepath.Join(own, ".secret_key"))
		if err != nil || !bytes.Equal(got, key) {
			t.Errorf("run %d: the config service's key is %x (%v), want the one that was in the data directory", run, got, err)
		}
		if m := mode(t, filepath.Join(own, ".secret_key")); m != 0o600 {
			t.Errorf("run %d: key mode %v, want 0600", run, m)
		}
		if m := mode(t, own); m != 0o700 {
			t.Errorf("run %d: %s mode %v, want 0700", run, own, m)
		}
	}

	other := bytes.Repeat([]byte{9}, 32)
	if err := os.WriteFile(filepath.Join(data, ".secret_key"), other, 0o600); err != nil {
		t.Fatal(err)
	}
	err := busCmd([]string{"init", "--config-dir", data, "--config-key-dir", own}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "differ") {
		t.Fatalf("two different keys: err %v, want one saying they differ", err)
	}
	a, _ := os.ReadFile(filepath.Join(data, ".secret_key"))
	b, _ := os.ReadFile(filepath.Join(own, ".secret_key"))
	if !bytes.Equal(a, other) || !bytes.Equal(b, key) {
		t.Errorf("after the refusal: data %x, config %x; want both kept", a, b)
	}
}
