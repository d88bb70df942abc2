// Package pgcluster runs a private PostgreSQL cluster from the machine's
// server binaries: created with initdb on first use, listening on a Unix
// socket only.
//
// Prepare readies the folder and the credentials and hands out the
// postmaster's command, so a supervisor can start the server again on the
// same data after a crash; Start is Prepare plus one supervised-by-nobody
// run, for tests and tools.
//
// PostgreSQL refuses to run as root. When this process is root, the
// cluster runs as the unprivileged account "postgres" (or "nobody" where
// that does not exist), a shared account other software may run as too:
// such a cluster requires a generated password (scram-sha-256) that only
// root can read. A cluster of an ordinary user trusts the socket, whose
// folder only that user can enter.
package pgcluster

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/graceful"
)

// Errors a caller may want to tell apart.
var (
	// ErrNoBinaries means no initdb/postgres was found on PATH or under
	// /usr/lib/postgresql/*/bin.
	ErrNoBinaries = errors.New("PostgreSQL server binaries (initdb, postgres) not found on PATH or under /usr/lib/postgresql/*/bin; install them or set DATABASE_URL")
	// ErrExited means the server process ended before it was ready.
	ErrExited = errors.New("postgres exited before it was ready")
	// ErrNoPassword means a cluster that needs a password has lost it.
	ErrNoPassword = errors.New("postgres password missing")
)

const (
	dbUser = "clawmesh"
	dbName = "clawmesh"
	// maintenanceDB is what EnsureDatabase connects to: every cluster has
	// template1. The "postgres" database initdb makes becomes the clawmesh
	// database of a new cluster (EnsureDatabase).
	maintenanceDB = "template1"
	port          = 5432
	// PasswordFileName is the default name of a cluster's password file,
	// inside its folder (owned by root, 0600: the server's account cannot
	// read it, nor anyone else).
	PasswordFileName = "clawmesh.password"
)

// ShutdownSignal asks the postmaster for a fast shutdown: sessions are
// ended, the data is checkpointed.
const ShutdownSignal = syscall.SIGINT

// Options configure a cluster.
type Options struct {
	// Dir holds the cluster: data/ and the socket. Created if missing.
	Dir string
	// Fast trades durability for speed (fsync off): for tests only.
	Fast bool
	// Log receives the cluster's own events and, when Output is nil, the
	// server's output line by line.
	Log *zap.Logger
	// Output, when set, receives the server's raw output instead.
	Output io.Writer
	// StartTimeout bounds initdb plus start; default 60 s.
	StartTimeout time.Duration
	// PasswordFile keeps the generated password of a cluster that runs as
	// another account (this process is root); default
	// Dir/PasswordFileName. The launcher keeps it in the data directory.
	PasswordFile string
	// MaxConnections is the server's connection limit; 0 sizes it for
	// one stack (StackConnections). A server that many tests share needs
	// more.
	MaxConnections int
}

// StackPools is how many of a stack's processes keep a pool on its
// database: config, session and the durable bridge (the services whose
// service.Spec names a Schema; internal/stack's tests count them).
const StackPools = 3

// StackConnections is the connection limit of a stack's server: room
// for the stack's pools (pgxpool's default of max(4, cores) connections
// each), the launcher's probe and an operator's psql, and never under
// 100. The server sets up shared memory for every connection it may
// take, at every start: the 300 it had took 24 ms more of each start
// than 40 on two cores (exec to ready, medians 122 and 98 ms; 102 with
// 100).
func StackConnections() int { return max(100, StackPools*max(4, runtime.NumCPU())+10) }

// Prepared is a cluster ready to run: its folder initialised, its
// binaries found, its account and credentials known.
type Prepared struct {
	dir, bin string
	cred     *syscall.Credential
	fast     bool
	maxConns int
	password string // "" when the socket is trusted
	// created is true when this Prepare ran initdb: the cluster's
	// "postgres" database is initdb's, empty, and nothing has used it.
	created bool
	// seen is set once a probe connected to the clawmesh database.
	seen atomic.Bool
}

// Prepare creates the cluster if needed (initdb) and returns what is
// needed to run its server, any number of times, on the same data.
func Prepare(ctx context.Context, opts Options) (*Prepared, error) {
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	bin, err := findBinaries()
	if err != nil {
		return nil, err
	}
	cred, err := runAs()
	if err != nil {
		return nil, err
	}
	if err := prepareDir(opts.Dir, cred); err != nil {
		return nil, err
	}
	p := &Prepared{dir: opts.Dir, bin: bin, cred: cred, fast: opts.Fast, maxConns: opts.MaxConnections}
	if p.maxConns <= 0 {
		p.maxConns = StackConnections()
	}
	pwFile := opts.PasswordFile
	if pwFile == "" {
		pwFile = filepath.Join(opts.Dir, PasswordFileName)
	}
	pgdata := dataDir(opts.Dir)
	_, err = os.Stat(filepath.Join(pgdata, "PG_VERSION"))
	fresh := errors.Is(err, fs.ErrNotExist)
	if cred != nil {
		switch trusted, err := trusts(pgdata); {
		case fresh:
			if p.password, err = newPassword(pwFile); err != nil {
				return nil, err
			}
		case err != nil:
			return nil, err
		case trusted:
			if err := p.untrust(ctx, pgdata, pwFile, opts.Log); err != nil {
				return nil, err
			}
		default:
			if p.password, err = readPassword(pwFile); err != nil {
				return nil, fmt.Errorf("%w: the cluster %s runs as a shared account and needs the password kept in %s: %w",
					ErrNoPassword, opts.Dir, pwFile, err)
			}
		}
	}
	if fresh {
		if err := p.initdb(ctx, pgdata, opts.Log); err != nil {
			return nil, err
		}
		p.created = true
	}
	return p, nil
}

// Dir is the cluster's folder.
func (p *Prepared) Dir() string { return p.dir }

// Command is a new command that runs the postmaster on the cluster, as
// the cluster's account, in its own process group (a terminal's Ctrl-C
// reaches only the caller), and shut down at once if the caller dies. Its
// output is the caller's to set.
func (p *Prepared) Command() *exec.Cmd {
	args := []string{
		"-D", dataDir(p.dir),
		"-k", p.dir,
		"-p", strconv.Itoa(port),
		"-c", "listen_addresses=",
		"-c", "max_connections=" + strconv.Itoa(p.maxConns),
		"-c", "unix_socket_permissions=0700",
	}
	if p.fast {
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	cmd := exec.Command(filepath.Join(p.bin, "postgres"), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred, Setpgid: true, Pdeathsig: syscall.SIGQUIT}
	cmd.Env = serverEnv(os.Environ())
	return cmd
}

// serverEnv keeps of env what the server may need: the search path, the
// locale and time zone, a temporary folder and a library path. It got the
// launcher's whole environment, its bus seed and any secret with it, and
// run as root the server is the one child under another account (shared
// with other software), which reads its environment in /proc.
func serverEnv(env []string) []string {
	var out []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case name == "PATH", name == "LANG", name == "TZ", name == "TMPDIR", name == "LD_LIBRARY_PATH",
			strings.HasPrefix(name, "LC_"):
			out = append(out, kv)
		}
	}
	return out
}

// URL is the connection string of the clawmesh database. It holds the
// password when the cluster has one: pass it by environment, never argv.
func (p *Prepared) URL() string { return p.urlFor(dbName) }

// AdminURL is the connection string of the maintenance database,
// template1. A CREATE DATABASE copies template1 and waits for the other
// connections to it to end: create databases from URL's connection.
func (p *Prepared) AdminURL() string { return p.urlFor(maintenanceDB) }

func (p *Prepared) urlFor(db string) string {
	u := url.URL{Scheme: "postgres", Host: "", Path: "/" + db,
		RawQuery: url.Values{"host": {p.dir}, "port": {strconv.Itoa(port)}, "sslmode": {"disable"}}.Encode()}
	if p.password != "" {
		u.User = url.UserPassword(dbUser, p.password)
	} else {
		u.User = url.User(dbUser)
	}
	return u.String()
}

// Probe asks the server for a connection to the clawmesh database.
// answered is true when the postmaster replied at all, even with a
// refusal (still starting, too many connections): it is alive. err is nil
// once it accepts connections, which a refusal for want of the database
// also says (EnsureDatabase makes it).
//
// While the postmaster's lock file says it is starting, Probe does not
// connect (pg_ctl's -w reads the same line): each connection then only
// forked a backend to refuse it, a FATAL line in the server's log per
// probe, on the start's critical path. Such a server has not answered
// (a stale "starting" is a crashed one). Any other state, a stale
// "ready" included, is left to the connection: a server shutting down
// still answers with its refusal, so liveness does not kill one that
// waits for its clients to leave.
func (p *Prepared) Probe(ctx context.Context) (answered bool, err error) {
	if st := p.serverStatus(); st == pmStarting {
		return false, fmt.Errorf("%w: %s", ErrNotReady, st)
	}
	conn, err := pgconn.Connect(ctx, p.URL())
	if err == nil {
		_ = conn.Close(ctx)
		// EnsureDatabase need not connect again to find what this
		// connection found: a start saves a backend's fork and login.
		p.seen.Store(true)
		return true, nil
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == sqlstateNoDatabase {
		return true, nil
	}
	return pe != nil, err
}

// ErrNotReady: the server's lock file says it is still starting.
var ErrNotReady = errors.New("postgres is not accepting connections")

// pmStarting is the postmaster's state in its lock file while it starts.
const pmStarting = "starting"

// serverStatus is the state the postmaster last wrote in its lock file:
// "" when there is no file or no such line yet.
func (p *Prepared) serverStatus() string {
	return lockFileLine(p.dir, lockLineStatus)
}

// sqlstateNoDatabase is invalid_catalog_name: the database does not exist.
const sqlstateNoDatabase = "3D000"

// EnsureDatabase makes the clawmesh database when it does not exist. On
// the cluster this Prepare created it renames initdb's empty "postgres"
// database, a catalog update of about 2 ms, where CREATE DATABASE copies
// template1 in 100 to 200 ms on a first run's critical path; elsewhere
// (a cluster whose clawmesh database was dropped) it creates one.
func (p *Prepared) EnsureDatabase(ctx context.Context) error {
	if p.seen.Load() {
		return nil
	}
	conn, err := pgx.Connect(ctx, p.AdminURL())
	if err != nil {
		return fmt.Errorf("connect postgres: %w", err)
	}
	defer conn.Close(ctx)
	var exists, initial bool
	if err := conn.QueryRow(ctx, `SELECT coalesce(bool_or(datname = $1), false), coalesce(bool_or(datname = 'postgres'), false)
		FROM pg_database`, dbName).Scan(&exists, &initial); err != nil {
		return fmt.Errorf("check database: %w", err)
	}
	if exists {
		return nil
	}
	stmt := "CREATE DATABASE " + dbName
	if p.created && initial {
		stmt = "ALTER DATABASE postgres RENAME TO " + dbName
	}
	if _, err := conn.Exec(ctx, stmt); err != nil {
		return fmt.Errorf("create database: %w", err)
	}
	return nil
}

// Cluster is a running server started by Start.
type Cluster struct {
	*Prepared
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start prepares the cluster and starts its server, returning once it
// accepts connections and the clawmesh database exists. Nothing restarts
// it: the launcher supervises Prepare's command instead.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 60 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()
	p, err := Prepare(ctx, opts)
	if err != nil {
		return nil, err
	}
	cmd := p.Command()
	var out io.WriteCloser = nopCloser{opts.Output}
	if opts.Output == nil {
		out = logWriter(opts.Log)
	}
	cmd.Stdout = out
	cmd.Stderr = out
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	c := &Cluster{Prepared: p, cmd: cmd, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		out.Close()
		close(c.done)
	}()
	if err := c.waitReady(ctx); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// Done is closed when the server process has exited.
func (c *Cluster) Done() <-chan struct{} { return c.done }

// Stop asks for a fast shutdown and waits; after 15 s it kills. Safe to
// call more than once.
func (c *Cluster) Stop() {
	select {
	case <-c.done:
		return
	default:
	}
	graceful.Stop(c.cmd.Process, c.done, ShutdownSignal, 15*time.Second)
}

func (c *Cluster) waitReady(ctx context.Context) error {
	for {
		select {
		case <-c.done:
			return fmt.Errorf("%w: %v (see the postgres log lines above)", ErrExited, c.err)
		default:
		}
		_, err := c.Probe(ctx)
		if err == nil {
			return c.EnsureDatabase(ctx)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("postgres not ready: %w", errors.Join(ctx.Err(), err))
		case <-c.done:
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (p *Prepared) initdb(ctx context.Context, pgdata string, log *zap.Logger) error {
	// initdb fills a folder of its own, renamed into place once whole.
	// It writes PG_VERSION first and global/pg_control last: one cut
	// short (the launcher killed with its children, the machine stopped)
	// left a data folder every later start took for a cluster, on which
	// the server refused to run, at each start, for want of pg_control.
	// What a cut-short run left here is cleared first (its files are the
	// server account's: RemoveAll follows no link they put there).
	tmp := pgdata + ".initdb"
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("initdb: clear an earlier attempt: %w", err)
	}
	args := []string{"-D", tmp, "-U", dbUser, "-E", "UTF8", "--locale=C", "--no-sync"}
	if p.password == "" {
		args = append(args, "--auth=trust")
	} else {
		// initdb reads the password from a file the account can read; it
		// lives only for the command.
		pwTmp := filepath.Join(p.dir, ".initdb-password")
		uid, gid := -1, -1
		if p.cred != nil {
			uid, gid = int(p.cred.Uid), int(p.cred.Gid)
		}
		if err := writeOwnFile(pwTmp, []byte(p.password+"\n"), uid, gid); err != nil {
			return fmt.Errorf("initdb password: %w", err)
		}
		defer os.Remove(pwTmp)
		args = append(args, "--auth=scram-sha-256", "--pwfile="+pwTmp)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(p.bin, "initdb"), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("initdb: %w: %s", err, strings.TrimSpace(string(out)))
	}
	if err := os.Rename(tmp, pgdata); err != nil {
		return fmt.Errorf("initdb: %w", err)
	}
	log.Info("postgres cluster created", zap.String("pgdata", pgdata), zap.Bool("password", p.password != ""))
	return nil
}

// hbaFile names the server's client authentication file in its data
// folder.
const hbaFile = "pg_hba.conf"

// scramHBA is the client authentication of a cluster that runs as a
// shared account: what initdb --auth=scram-sha-256 writes, comments
// aside. Its lines hold no tab nor backslash: COPY writes them as they
// are (untrust).
var scramHBA = []string{
	"local all all scram-sha-256",
	"host all all 127.0.0.1/32 scram-sha-256",
	"host all all ::1/128 scram-sha-256",
	"local replication all scram-sha-256",
	"host replication all 127.0.0.1/32 scram-sha-256",
	"host replication all ::1/128 scram-sha-256",
}

// trusts reports whether the server of the data folder pgdata lets a
// client in by some line of its pg_hba.conf without a password: the
// cluster an earlier version made for root did, or a switch cut short.
func trusts(pgdata string) (bool, error) {
	raw, err := readServerFile(filepath.Join(pgdata, hbaFile))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil // a new cluster's, or the server says what is wrong
	}
	if err != nil {
		return false, fmt.Errorf("postgres client authentication: %w", err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		line, _, _ = strings.Cut(line, "#")
		for _, f := range strings.Fields(line) {
			if f == "trust" {
				return true, nil
			}
		}
	}
	return false, nil
}

// readServerFile reads, as root, a file of the server's account (shared
// with other software): a link it left there is not followed, and a
// fifo or a device, which would hold the start or fill its memory, is
// refused, as is more than 1 MiB.
func readServerFile(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return nil, err
	} else if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	const limit = 1 << 20
	raw, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err == nil && len(raw) > limit {
		err = fmt.Errorf("%s: over 1 MiB", path)
	}
	return raw, err
}

// untrust switches a cluster that runs as a shared account but trusts
// its socket (made by a version before root's clusters needed a
// password, and adopted by Bind) to the generated password, as initdb
// sets up a new one: the clawmesh role gets the password kept in pwFile
// (made when missing) and pg_hba.conf becomes scramHBA. Both are done by
// the server in single-user mode, which opens no socket: the shared
// account never finds the server trusting, and the file is written by
// the server's account in its own folder, where root following a link
// the account left would write anywhere. The password goes by standard
// input, on no command line. Cut short, the next start does it again
// (the file still trusts), with the same password.
func (p *Prepared) untrust(ctx context.Context, pgdata, pwFile string, log *zap.Logger) error {
	pw, err := readPassword(pwFile)
	if err != nil {
		if pw, err = newPassword(pwFile); err != nil {
			return err
		}
	}
	lines := make([]string, len(scramHBA))
	for i, l := range scramHBA {
		lines[i] = "'" + l + "'"
	}
	hba, err := filepath.Abs(filepath.Join(pgdata, hbaFile)) // COPY takes no relative path
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	// One statement a line: single-user mode ends a statement at a
	// newline.
	script := "ALTER ROLE " + dbUser + " PASSWORD '" + pw + "'\n" +
		"COPY (SELECT unnest(ARRAY[" + strings.Join(lines, ",") + "])) TO '" + strings.ReplaceAll(hba, "'", "''") + "'\n"
	cmd := exec.CommandContext(ctx, filepath.Join(p.bin, "postgres"), "--single", "-D", pgdata,
		"-c", "password_encryption=scram-sha-256", maintenanceDB)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	cmd.Env = serverEnv(os.Environ())
	cmd.Stdin = strings.NewReader(script)
	out, err := cmd.CombinedOutput()
	// Single-user mode goes on after a failed statement and exits 0.
	text := strings.ReplaceAll(strings.TrimSpace(string(out)), pw, "***")
	if err == nil && (strings.Contains(text, "ERROR:") || strings.Contains(text, "FATAL:")) {
		err = errors.New("a statement failed")
	}
	if err == nil {
		var still bool
		if still, err = trusts(pgdata); err == nil && still {
			err = errors.New(hbaFile + " still trusts")
		}
	}
	if err != nil {
		return fmt.Errorf("postgres: switch the cluster %s from trusting its socket to a password: %w: %s", p.dir, err, text)
	}
	p.password = pw
	log.Warn("postgres cluster of an earlier version now requires the generated password (it trusted its socket)",
		zap.String("pgdata", pgdata), zap.String("password_file", pwFile))
	return nil
}

// newPassword generates a password and keeps it in path, 0600, replacing
// the one of a cluster that no longer exists.
func newPassword(path string) (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("postgres password: %w", err)
	}
	pw := hex.EncodeToString(b)
	tmp := path + ".tmp"
	if err := writeOwnFile(tmp, []byte(pw+"\n"), -1, -1); err != nil {
		return "", fmt.Errorf("postgres password: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("postgres password: %w", err)
	}
	return pw, nil
}

func readPassword(path string) (string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	pw := strings.TrimSpace(string(raw))
	if pw == "" {
		return "", errors.New("the file is empty")
	}
	return pw, nil
}

// Binaries returns the folder holding initdb and postgres, or
// ErrNoBinaries.
func Binaries() (string, error) { return findBinaries() }

// findBinaries returns the folder holding initdb and postgres.
func findBinaries() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	// Newest major version first.
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, dir := range dirs {
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	return "", ErrNoBinaries
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// runAs returns the credential the server runs with: nil (this process's
// own) unless this process is root.
func runAs() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, errors.New("running as root and neither a 'postgres' nor a 'nobody' account exists to run PostgreSQL; set DATABASE_URL")
}

func prepareDir(dir string, cred *syscall.Credential) error {
	if cred != nil {
		// The account must be able to traverse the parent.
		if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
			return fmt.Errorf("cluster folder: %w", err)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("cluster folder: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("cluster folder: %w", err)
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return fmt.Errorf("cluster folder owner: %w", err)
		}
	}
	return nil
}

// logWriter turns the server's output into log lines until closed.
func logWriter(log *zap.Logger) io.WriteCloser {
	pr, pw := io.Pipe()
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 0, 4096), 1<<20)
		for sc.Scan() {
			log.Info("postgres", zap.String("line", sc.Text()))
		}
		// Drain whatever a too-long line left, so the writer never blocks.
		_, _ = io.Copy(io.Discard, pr)
	}()
	return pw
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }
