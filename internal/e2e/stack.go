package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/graceful"
	"github.com/clawmesh/clawmesh/internal/pg"
	"github.com/clawmesh/clawmesh/internal/pgcluster"
	"github.com/clawmesh/clawmesh/internal/procstat"
	"github.com/clawmesh/clawmesh/internal/rpcclient"
	"github.com/clawmesh/clawmesh/internal/testenv"
	configmigrations "github.com/clawmesh/clawmesh/services/config/migrations"
	durablemigrations "github.com/clawmesh/clawmesh/services/durablebridge/migrations"
	sessionmigrations "github.com/clawmesh/clawmesh/services/session/migrations"
)

// Stack is a running `clawmesh up`.
type Stack struct {
	DataDir string
	Socket  string
	BinDir  string

	cmd    *exec.Cmd
	stderr *LockedBuffer
	exited chan struct{}
	t      testing.TB
	// stdout is every line the launcher printed; stdoutDone is closed
	// once its output ended.
	stdout     *LockedBuffer
	stdoutDone chan struct{}
}

// Options for Start.
type Options struct {
	// Args are extra `clawmesh up` flags (--set, --scale, --ephemeral).
	Args []string
	// DataDir, when empty, is a new temporary folder.
	DataDir string
	// Env adds environment variables (e.g. NATS_URL) to the launcher's.
	Env []string
	// PrivateCluster runs the stack's own PostgreSQL cluster, made with
	// initdb on its first start, as `clawmesh up` does for a user. Without
	// it the stack is given DATABASE_URL: a database of its own (the same
	// one for every start on the same data directory) on a cluster the
	// test process shares (testenv.Postgres). That saves each stack the
	// cluster's initdb, start and stop, about 2 s of the 2.5 a short test
	// took and four fifths of its CPU. Tests of the cluster itself (its
	// supervision, files, password, doctor) and the benchmarks set it. It
	// holds even when the tests run against an external DATABASE_URL (the
	// launcher is given an empty one); without the server binaries such a
	// test is skipped. An Env that names DATABASE_URL wins either way.
	PrivateCluster bool
}

// Start runs `clawmesh up` and returns once it printed the socket path.
// The stack is stopped (and checked for leftovers) when the test ends.
func Start(t testing.TB, opts Options) *Stack {
	t.Helper()
	bin, err := BinDir()
	if err != nil {
		t.Fatalf("build binaries: %v", err)
	}
	dir := opts.DataDir
	if dir == "" {
		dir = TempDataDir(t)
	}
	env := opts.Env
	switch {
	case setsDatabase(env):
	case opts.PrivateCluster:
		if _, err := pgcluster.Binaries(); err != nil {
			t.Skipf("a stack with its own cluster: %v", err)
		}
		env = append([]string{"DATABASE_URL="}, env...)
	default:
		env = append([]string{"DATABASE_URL=" + databaseOf(t, dir)}, env...)
	}
	s, err := LaunchEnv(t, bin, dir, env, opts.Args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			logTails(t, s)
		}
		// Root's cluster lives outside the data directory: remove it
		// too, and the credentials kept beside it.
		if pg := pgcluster.Dir(dir); pg != "" && !strings.HasPrefix(pg, dir+"/") {
			os.RemoveAll(pg)
			os.RemoveAll(filepath.Join(pgcluster.RootKeys, filepath.Base(pg)))
		}
	})
	return s
}

// databases maps a data directory to the shared cluster's database its
// stacks use, so a stack started again on the same directory finds its
// data. The database is dropped when the test that made it ends, after
// that test's stacks have stopped (cleanups run last-registered first).
var databases struct {
	mu    sync.Mutex
	byDir map[string]string
}

func databaseOf(t testing.TB, dir string) string {
	t.Helper()
	databases.mu.Lock()
	defer databases.mu.Unlock()
	if u, ok := databases.byDir[dir]; ok {
		return u
	}
	u := testenv.PostgresPrepared(t, "stack", migrateStack)
	if databases.byDir == nil {
		databases.byDir = map[string]string{}
	}
	databases.byDir[dir] = u
	t.Cleanup(func() {
		databases.mu.Lock()
		delete(databases.byDir, dir)
		databases.mu.Unlock()
	})
	return u
}

// migrateStack applies to the database at url the migrations of every
// schema the stack's services keep there, as their first start does: a
// stack's database is a copy of one migrated so once a process
// (testenv.PostgresPrepared), and each service finds its migrations
// applied, as on any start after its first. A test of a first start's
// migrations gives the stack a database of its own (Env's DATABASE_URL).
func migrateStack(ctx context.Context, url string) error {
	for _, schema := range []struct {
		name string
		fs   fs.FS
	}{
		{"config", configmigrations.FS},
		{"session", sessionmigrations.FS},
		{"durable", durablemigrations.FS},
	} {
		pool, err := pg.Open(ctx, url, schema.name, schema.fs, zap.NewNop())
		if err != nil {
			return fmt.Errorf("schema %s: %w", schema.name, err)
		}
		pool.Close()
	}
	return nil
}

func setsDatabase(env []string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, "DATABASE_URL=") {
			return true
		}
	}
	return false
}

// TempDataDir is the path of a data directory not made yet, in a
// temporary folder removed when the test ends. The path is short: Unix
// socket paths are limited to 107 bytes.
func TempDataDir(t testing.TB) string {
	t.Helper()
	base, err := os.MkdirTemp("", "cm-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	return filepath.Join(base, "data")
}

// launchBound bounds the wait for a stack's socket line: past the
// launcher's own cap on a start (ten times its readiness bound).
const launchBound = 11 * time.Minute

// Launch starts `clawmesh up` and waits for the socket line; it fails if
// the launcher exits first, with its stderr in the error.
func Launch(t testing.TB, bin, dir string, args ...string) (*Stack, error) {
	return LaunchEnv(t, bin, dir, nil, args...)
}

// LaunchEnv is Launch with extra environment variables.
func LaunchEnv(t testing.TB, bin, dir string, env []string, args ...string) (*Stack, error) {
	cmd := exec.Command(filepath.Join(bin, "clawmesh"), append([]string{"up", "--config-dir", dir}, args...)...)
	cmd.Env = append(append(os.Environ(), "ZEROCLAW_SOCKET="), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	s := &Stack{DataDir: dir, BinDir: bin, cmd: cmd, stderr: &LockedBuffer{}, exited: make(chan struct{}), t: t,
		stdout: &LockedBuffer{}, stdoutDone: make(chan struct{})}
	cmd.Stderr = s.stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = cmd.Wait(); close(s.exited) }()
	lines := make(chan string, 16)
	found := make(chan struct{}) // the socket line was read: no more sends
	go func() {
		defer close(s.stdoutDone)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			_, _ = s.stdout.Write([]byte(sc.Text() + "\n"))
			select {
			case lines <- sc.Text():
			case <-found:
			}
		}
		close(lines)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	// The launcher fails a start that stops progressing by itself
	// (--ready-timeout, 60 s without a new step) and one that progresses
	// for more than ten times that: this bound is for a launcher that
	// hangs. A fixed 120 s here would fail a start the launcher still
	// rightly waits for on a busy machine (sandbox replicas compiling).
	deadline := time.After(launchBound)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				<-s.exited
				return nil, fmt.Errorf("clawmesh up exited (%v) before the stack was up:\n%s", cmd.ProcessState, s.stderr.tail(4000))
			}
			if sock, ok := strings.CutPrefix(line, "socket: "); ok {
				s.Socket = sock
				close(found)
				return s, nil
			}
		case <-deadline:
			_ = cmd.Process.Kill()
			return nil, fmt.Errorf("clawmesh up not ready after %v:\n%s", launchBound, s.stderr.tail(4000))
		}
	}
}

// Stop sends SIGTERM to the launcher and waits for it; safe twice.
func (s *Stack) Stop() {
	select {
	case <-s.exited:
		return
	default:
	}
	if graceful.Stop(s.cmd.Process, s.exited, syscall.SIGTERM, 60*time.Second) {
		s.t.Errorf("launcher did not stop within 60 s:\n%s", s.stderr.tail(4000))
	}
}

// Exited is closed when the launcher has exited.
func (s *Stack) Exited() <-chan struct{} { return s.exited }

// ExitCode is the launcher's exit code once it exited.
func (s *Stack) ExitCode() int { return s.cmd.ProcessState.ExitCode() }

// Stdout is every line the launcher printed on its standard output;
// called after Stop, it is the whole of it.
func (s *Stack) Stdout() string {
	select {
	case <-s.exited:
		<-s.stdoutDone
	default:
	}
	return s.stdout.String()
}

// logTails logs the last lines of a failed test's stack: the launcher's
// log and each service's (<data>/logs). CI keeps only the test's output,
// and a fault that timed out there (a message lost, a replica that did
// not come back) is read from the services' own words.
func logTails(t testing.TB, s *Stack) {
	logTail(t, "the launcher", s.Stderr())
	logs, _ := filepath.Glob(filepath.Join(s.DataDir, "logs", "*.log"))
	for _, path := range logs {
		if raw, err := os.ReadFile(path); err == nil {
			logTail(t, filepath.Base(path), string(raw))
		}
	}
}

func logTail(t testing.TB, name, log string) {
	const keep, wide = 80, 600
	lines := strings.Split(strings.TrimRight(log, "\n"), "\n")
	if len(lines) > keep {
		lines = lines[len(lines)-keep:]
	}
	for i, l := range lines {
		if len(l) > wide {
			lines[i] = l[:wide] + "…"
		}
	}
	t.Logf("%s, its last %d lines:\n%s", name, len(lines), strings.Join(lines, "\n"))
}

// Stderr returns the launcher's log so far.
func (s *Stack) Stderr() string { return s.stderr.String() }

// LauncherPID is the pid of `clawmesh up`.
func (s *Stack) LauncherPID() int { return s.cmd.Process.Pid }

// PIDs lists the live processes started from this stack's binaries for its
// data directory (services, gateway), and its PostgreSQL, by /proc scan.
func (s *Stack) PIDs() map[int]string {
	out := map[int]string{}
	pgDir := pgcluster.Dir(s.DataDir)
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(raw) == 0 {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil && bytes.Contains(stat, []byte(") Z ")) {
			continue // a zombie is already dead
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		cmdline := strings.Join(args, " ")
		if pid == s.cmd.Process.Pid || !(strings.Contains(cmdline, s.DataDir) || (pgDir != "" && strings.Contains(cmdline, pgDir))) {
			continue
		}
		out[pid] = filepath.Base(args[0])
	}
	return out
}

// PIDOf is the pid of the named process the launcher started (e.g.
// "session", or "postgres" for the postmaster): one of the launcher's own
// children. PIDs may also list a process such a child forked, which has
// its parent's command line until it sets its own: a PostgreSQL backend
// just after the postmaster forked it (seen in 9 of 1,557 scans of a
// stack taking new connections), which a test killing "postgres" would
// have killed instead of the postmaster.
func (s *Stack) PIDOf(name string) int {
	for pid, n := range s.PIDs() {
		if n != name {
			continue
		}
		if st, err := procstat.Read(pid); err == nil && st.PPID == s.cmd.Process.Pid {
			return pid
		}
	}
	return 0
}

// Dial connects a client to the stack's socket.
func (s *Stack) Dial(t testing.TB) *Client {
	t.Helper()
	c, err := Dial(s.Socket)
	if err != nil {
		t.Fatalf("dial %s: %v", s.Socket, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// DialReading is Dial with a client that reads its socket as fast as the
// gateway writes, whatever the test does with the frames meanwhile
// (readAhead): a healthy client under a short write-stall limit.
func (s *Stack) DialReading(t testing.TB) *Client {
	t.Helper()
	conn, err := net.Dial("unix", s.Socket)
	if err != nil {
		t.Fatalf("dial %s: %v", s.Socket, err)
	}
	c := rpcclient.New(newReadAhead(conn))
	t.Cleanup(func() { c.Close() })
	return c
}

// Context is a test context with a deadline.
func Context(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// LockedBuffer collects a child process's output while tests read it.
type LockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *LockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *LockedBuffer) tail(n int) string {
	s := b.String()
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
