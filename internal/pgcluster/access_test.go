package pgcluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap/zaptest"
)

func tempDir(t *testing.T) string {
	t.Helper()
	// Not t.TempDir: the cluster's account must be able to reach it, and
	// root's cluster folder changes owner.
	dir, err := os.MkdirTemp("", "cm-pgc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// Prepare hands out the postmaster's command again and again: a server
// killed outright (SIGKILL, as the fault tests do) starts again on the
// same data, and what was committed is there.
func TestRestartOnTheSameData(t *testing.T) {
	if os.Getenv("DATABASE_URL") != "" {
		t.Skip("DATABASE_URL selects an external server")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	// Not Fast: without synchronous commits a killed server loses what it
	// acknowledged last.
	p, err := Prepare(ctx, Options{Dir: tempDir(t), Log: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	run := func() (*exec.Cmd, chan struct{}) {
		t.Helper()
		for {
			cmd := p.Command()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			for {
				_, err := p.Probe(ctx)
				if err == nil {
					return cmd, done
				}
				select {
				case <-done:
					// The old server's backends may still hold its shared
					// memory for a moment: start again, as the launcher does.
				case <-ctx.Done():
					t.Fatalf("server not ready: %v", err)
				case <-time.After(50 * time.Millisecond):
					continue
				}
				break
			}
		}
	}
	cmd, done := run()
	if err := p.EnsureDatabase(ctx); err != nil {
		t.Fatal(err)
	}
	execSQL(t, ctx, p.URL(), "CREATE TABLE kept (v int); INSERT INTO kept VALUES (7)")
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-done
	if answered, _ := p.Probe(ctx); answered {
		t.Fatal("a killed server still answers")
	}
	cmd, done = run()
	defer func() {
		_ = cmd.Process.Signal(ShutdownSignal)
		<-done
	}()
	conn, err := pgx.Connect(ctx, p.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var v int
	if err := conn.QueryRow(ctx, "SELECT v FROM kept").Scan(&v); err != nil || v != 7 {
		t.Fatalf("after the restart: %d %v", v, err)
	}
}

// As root the cluster runs as a shared account: only a client with the
// generated password gets in. Another account cannot reach the socket;
// the server's own account (shared with whatever else runs as it) can,
// but without the password it is refused; root without it too. The
// password file is root's alone.
func TestOnlyTheStackConnects(t *testing.T) {
	if os.Getenv("DATABASE_URL") != "" {
		t.Skip("DATABASE_URL selects an external server")
	}
	if os.Geteuid() != 0 {
		t.Skip("the shared-account case happens only as root; as any other user the socket folder is the user's own (0700)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	dir := tempDir(t)
	pwFile := filepath.Join(tempDir(t), "postgres.password")
	c, err := Start(ctx, Options{Dir: dir, Fast: true, Log: zaptest.NewLogger(t), PasswordFile: pwFile})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	fi, err := os.Stat(pwFile)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Fatalf("password file mode %v uid %d", fi.Mode(), fi.Sys().(*syscall.Stat_t).Uid)
	}
	if !strings.Contains(c.URL(), ":"+c.password+"@") {
		t.Fatal("the URL does not carry the password")
	}
	password := c.password

	// Root itself, without the password.
	noPW := strings.Replace(c.AdminURL(), ":"+password+"@", "@", 1)
	if conn, err := pgx.Connect(ctx, noPW); err == nil {
		conn.Close(ctx)
		t.Fatal("connected without the password")
	}

	server := accountOf(t, c.cred.Uid)
	other := otherAccount(t, c.cred.Uid)
	psqlBin := filepath.Join(c.bin, "psql")
	if _, err := os.Stat(psqlBin); err != nil {
		if psqlBin, err = exec.LookPath("psql"); err != nil {
			t.Skip("no psql to connect as another account")
		}
	}
	psql := func(as *user.User, pw string) (string, error) {
		cmd := exec.CommandContext(ctx, psqlBin, "-w", "-X", "-A", "-t", "-c", "SELECT 42",
			fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable", dir, port, dbUser, dbName))
		cmd.Env = []string{"HOME=/", "PATH=/usr/bin:/bin", "PGPASSWORD=" + pw}
		uid, _ := strconv.Atoi(as.Uid)
		gid, _ := strconv.Atoi(as.Gid)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	// Control: the server's account with the password gets in, so the
	// refusals below are the password's and the folder's doing.
	if out, err := psql(server, password); err != nil || out != "42" {
		t.Fatalf("%s with the password: %v %s", server.Username, err, out)
	}
	if out, err := psql(server, ""); err == nil || !strings.Contains(out, "password") {
		t.Fatalf("%s without the password: %v %s", server.Username, err, out)
	}
	if out, err := psql(server, "wrong"); err == nil || !strings.Contains(out, "password authentication failed") {
		t.Fatalf("%s with a wrong password: %v %s", server.Username, err, out)
	}
	if out, err := psql(other, password); err == nil || !strings.Contains(out, "Permission denied") {
		t.Fatalf("%s (another account, even holding the password): %v %s", other.Username, err, out)
	}
}

func accountOf(t *testing.T, uid uint32) *user.User {
	t.Helper()
	u, err := user.LookupId(strconv.Itoa(int(uid)))
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// otherAccount is an account that is neither root nor the server's.
func otherAccount(t *testing.T, serverUID uint32) *user.User {
	t.Helper()
	for _, name := range []string{"nobody", "daemon", "bin"} {
		u, err := user.Lookup(name)
		if err == nil && u.Uid != "0" && u.Uid != strconv.Itoa(int(serverUID)) {
			return u
		}
	}
	t.Skip("no unprivileged account other than the server's to try")
	return nil
}

// A data directory owns its cluster by id, not by path: deleted and made
// again on the same path it gets a fresh cluster, and the old one is
// removed at the next collection, as is the folder an earlier version
// named after the path when it holds no database. A cluster of a live
// data directory, and one without any owner record, stay; so does the
// earlier version's cluster holding a database of a data directory bound
// to another cluster already (TestEarlierVersionsClusterIsAdopted: one
// that is not is adopted): it holds data no start may remove.
func TestBindAndCollect(t *testing.T) {
	base, data := rootDataDir(t)
	if Dir(data) != "" {
		t.Fatalf("a data directory without an id has a cluster: %s", Dir(data))
	}
	first := bindFor(t, data)
	if again, err := Bind(data); err != nil || again != first || Dir(data) != first {
		t.Fatalf("bind twice: %s %s %v", first, again, err)
	}
	live := filepath.Join(base, "live")
	if err := os.Mkdir(live, 0o700); err != nil {
		t.Fatal(err)
	}
	liveCluster := bindFor(t, live)
	// An earlier version's cluster of this path, and a foreign folder
	// without a record (another version's, or one being created).
	sum := legacyName(data)
	legacy := filepath.Join(RootClusters, sum)
	foreign := filepath.Join(RootClusters, "pg-"+strings.Repeat("0", 11)+strconv.Itoa(os.Getpid()%10))
	for _, d := range []string{legacy, foreign} {
		if err := os.MkdirAll(filepath.Join(d, "data"), 0o700); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
	}

	if err := os.RemoveAll(data); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	second := bindFor(t, data)
	if second == first {
		t.Fatal("a recreated data directory got the old cluster")
	}
	removed := Collect(data, zaptest.NewLogger(t))
	for _, want := range []string{first, legacy} {
		if !contains(removed, want) {
			t.Errorf("%s not collected (removed %v)", want, removed)
		}
		if _, err := os.Stat(want); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still there: %v", want, err)
		}
	}
	for _, keep := range []string{second, liveCluster, foreign} {
		if _, err := os.Stat(keep); err != nil {
			t.Errorf("%s removed: %v", keep, err)
		}
	}

	liveLegacy := filepath.Join(RootClusters, legacyName(live))
	t.Cleanup(func() { os.RemoveAll(liveLegacy) })
	if err := os.MkdirAll(filepath.Join(liveLegacy, "data"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(liveLegacy, "data", "PG_VERSION"), []byte("15\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if removed := Collect(live, zaptest.NewLogger(t)); contains(removed, liveLegacy) {
		t.Errorf("the earlier version's cluster holding a database was collected")
	}
	if again, err := Bind(live); err != nil || again != liveCluster {
		t.Errorf("a bound data directory rebinds to %s (%v), want %s", again, err, liveCluster)
	}
	if got := EarlierCluster(live); got != liveLegacy {
		t.Errorf("the earlier cluster left is %q, want %s", got, liveLegacy)
	}
}

func legacyName(dataDir string) string {
	// What an earlier version named root's cluster: a hash of the path.
	sum := sha256Sum(dataDir)
	return "pg-" + sum[:12]
}

func sha256Sum(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func execSQL(t *testing.T, ctx context.Context, url, sql string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatal(err)
	}
}

// movedHoldingData binds a data directory under base to its cluster,
// gives the cluster a database's first file (kept), and moves the data
// directory from data to moved, below base, not started there yet.
func movedHoldingData(t *testing.T) (base, data, moved, cluster, kept string) {
	t.Helper()
	base, data = rootDataDir(t)
	cluster = bindFor(t, data)
	kept = filepath.Join(cluster, "data", "PG_VERSION")
	if err := os.MkdirAll(filepath.Dir(kept), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kept, []byte("15\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	moved = filepath.Join(base, "moved")
	if err := os.Rename(data, moved); err != nil {
		t.Fatal(err)
	}
	return base, data, moved, cluster, kept
}

// A data directory moved to another path keeps its cluster: the start
// from the new path does not collect the cluster its own id names (the
// owner record still names the old path, which is gone), and binding
// records the new path. It removed the cluster, then made an empty one
// in its place: every session and config value of the moved directory
// was gone.
func TestMovedDataDirectoryKeepsItsCluster(t *testing.T) {
	base, _, moved, cluster, kept := movedHoldingData(t)
	if removed := Collect(moved, zaptest.NewLogger(t)); contains(removed, cluster) {
		t.Fatalf("the start of the moved data directory removed its own cluster %s", cluster)
	}
	if _, err := os.Stat(kept); err != nil {
		t.Fatalf("the moved data directory's cluster lost its data: %v", err)
	}
	if again, err := Bind(moved); err != nil || again != cluster {
		t.Fatalf("the moved data directory binds %s (%v), want %s", again, err, cluster)
	}
	// Bound again, the record names the new path: another data
	// directory's start leaves it too.
	other := filepath.Join(base, "other")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}
	if removed := Collect(other, zaptest.NewLogger(t)); contains(removed, cluster) {
		t.Fatalf("another start removed the moved data directory's cluster %s", cluster)
	}
}

// A data directory moved to another path and not yet started from it
// keeps its cluster when another data directory starts first: the record
// names the old path, which is gone, but the folder holds a database
// (the moved directory's sessions and settings), and a start cannot tell
// a data directory moved, or on a disk not mounted, from one deleted.
// Another start removed it, and the moved directory's next start made an
// empty cluster in its place. It is listed, never removed by a start.
func TestMovedDataDirectoryKeepsItsClusterWhenAnotherStartsFirst(t *testing.T) {
	base, data, moved, cluster, kept := movedHoldingData(t)
	other := filepath.Join(base, "other")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}
	var listed bool
	for _, st := range Stales(other) {
		if st.Dir == cluster {
			listed = true
			if !st.HoldsData {
				t.Errorf("the moved data directory's cluster is listed as holding no data")
			}
		}
	}
	if !listed {
		t.Errorf("the cluster whose data directory is gone is not listed")
	}
	if removed := Collect(other, zaptest.NewLogger(t)); contains(removed, cluster) {
		t.Fatalf("another data directory's start removed the moved one's cluster %s", cluster)
	}
	if _, err := os.Stat(kept); err != nil {
		t.Fatalf("the moved data directory's cluster lost its data: %v", err)
	}
	// A new data directory made on the old path (the moved one kept
	// aside, a fresh one started in its place): the record names a path
	// bound to another cluster now, and the moved one's is kept still.
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	if fresh := bindFor(t, data); fresh == cluster {
		t.Fatal("a new data directory on the old path got the moved one's cluster")
	}
	if removed := Collect(data, zaptest.NewLogger(t)); contains(removed, cluster) {
		t.Fatalf("the start of a new data directory on the old path removed the moved one's cluster %s", cluster)
	}
	if again, err := Bind(moved); err != nil || again != cluster {
		t.Fatalf("the moved data directory binds %s (%v), want %s", again, err, cluster)
	}
}
