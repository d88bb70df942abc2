package pgcluster

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// Root writes into a cluster folder that belongs to the account PostgreSQL
// runs as, shared with other software. os.WriteFile and os.Chown followed
// a link that account left there: the owner record at every start
// truncated and filled any file, and initdb's password file gave it to
// the account (the audit made a root-only file the account's). A link at
// the path is replaced, never followed, and a file is given away by its
// descriptor.
func TestRootWritesFollowNoLink(t *testing.T) {
	dir := tempDir(t)
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("root's own"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{ownerFile, ".initdb-password"} {
		path := filepath.Join(dir, name)
		if err := os.Symlink(victim, path); err != nil {
			t.Fatal(err)
		}
		uid := -1
		if os.Geteuid() == 0 {
			uid = 12345 // given away by descriptor: the file made, not the victim
		}
		if err := writeOwnFile(path, []byte("written\n"), uid, uid); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got, _ := os.ReadFile(victim); string(got) != "root's own" {
			t.Fatalf("%s: the link's target now reads %q", name, got)
		}
		var st, vst syscall.Stat_t
		if err := syscall.Lstat(path, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG || st.Mode&0o777 != 0o600 {
			t.Fatalf("%s: not a regular 0600 file: %o %v", name, st.Mode, err)
		}
		if err := syscall.Stat(victim, &vst); err != nil || int(vst.Uid) != os.Geteuid() {
			t.Fatalf("%s: the link's target changed owner: %d %v", name, vst.Uid, err)
		}
		if uid >= 0 && int(st.Uid) != uid {
			t.Fatalf("%s: owned by %d, want %d", name, st.Uid, uid)
		}
	}
	// The new password's file is written through the same.
	pw := filepath.Join(dir, "postgres.password")
	if err := os.Symlink(victim, pw+".tmp"); err != nil {
		t.Fatal(err)
	}
	if _, err := newPassword(pw); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(victim); string(got) != "root's own" {
		t.Fatalf("newPassword wrote through a link: %q", got)
	}
}

// The server got the launcher's whole environment, its bus seed with it;
// run as root it is the one child under another account, which reads its
// environment in /proc. It keeps only what a server may need.
func TestServerEnvironmentIsMinimal(t *testing.T) {
	t.Setenv("CLAWMESH_NATS_SEED", "SUAFAKESEED")
	t.Setenv("DATABASE_URL", "postgres://u:secret@h/db")
	t.Setenv("LC_ALL", "C")
	env := (&Prepared{dir: "/x", bin: "/usr/local/bin"}).Command().Env
	joined := strings.Join(env, "\n")
	if strings.Contains(joined, "SUAFAKESEED") || strings.Contains(joined, "secret") {
		t.Fatalf("the server's environment carries a secret:\n%s", joined)
	}
	if !strings.Contains(joined, "PATH=") || !strings.Contains(joined, "LC_ALL=C") {
		t.Fatalf("the server's environment lacks its path or locale:\n%s", joined)
	}
}

// Bind writes the owner record at every start: a link the account put in
// its place is replaced, its target untouched.
func TestBindFollowsNoLink(t *testing.T) {
	base, data := rootDataDir(t)
	dir := bindFor(t, data)
	victim := filepath.Join(base, "victim")
	if err := os.WriteFile(victim, []byte("root's own"), 0o600); err != nil {
		t.Fatal(err)
	}
	record := filepath.Join(dir, ownerFile)
	if err := os.Remove(record); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, record); err != nil {
		t.Fatal(err)
	}
	if _, err := Bind(data); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(victim); string(got) != "root's own" {
		t.Fatalf("the owner record was written through a link: %q", got)
	}
	if fi, err := os.Lstat(record); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("the owner record: %v %v", fi, err)
	}
}

// rootDataDir skips the test unless it runs as root, whose clusters live
// outside the data directory, and makes a data directory in a folder of
// the test's.
func rootDataDir(t *testing.T) (base, data string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("only root's clusters live outside the data directory")
	}
	base = tempDir(t)
	data = filepath.Join(base, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	return base, data
}

// bindFor binds data to its cluster folder, removed when the test ends.
func bindFor(t *testing.T, data string) string {
	t.Helper()
	dir, err := Bind(data)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
