// Package pgcluster runs a private PostgreSQL cluster from the machine's
// server binaries: created with initdb on first use, listening on a Unix
// socket only, supervised as a child process.
//
// PostgreSQL refuses to run as root. When this process is root, the cluster
// runs as the unprivileged account "postgres" (or "nobody" where that does
// not exist), and its folder must be one that account can reach: see Dir.
package pgcluster

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
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
)

const (
	dbUser = "clawmesh"
	dbName = "clawmesh"
	port   = 5432
)

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
}

// Cluster is a running server.
type Cluster struct {
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// RootClusters holds root's clusters: a persistent place (not a temporary
// folder a reboot may empty) that the unprivileged account can traverse.
const RootClusters = "/var/lib/clawmesh"

// Dir is where the cluster of the data directory dataDir lives: inside it
// (dataDir/postgres) for an ordinary user; for root, under RootClusters,
// named after dataDir so one data directory always finds its own cluster
// again (root's data directory is 0700, which the account cannot enter).
func Dir(dataDir string) string {
	if os.Geteuid() != 0 {
		return filepath.Join(dataDir, "postgres")
	}
	sum := sha256.Sum256([]byte(dataDir))
	return filepath.Join(RootClusters, "pg-"+hex.EncodeToString(sum[:6]))
}

// Start creates the cluster if needed and starts it, returning once it
// accepts connections and the clawmesh database exists.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 60 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()

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
	pgdata := filepath.Join(opts.Dir, "data")
	if _, err := os.Stat(filepath.Join(pgdata, "PG_VERSION")); errors.Is(err, os.ErrNotExist) {
		if err := initdb(ctx, bin, pgdata, cred, opts.Log); err != nil {
			return nil, err
		}
	}
	args := []string{
		"-D", pgdata,
		"-k", opts.Dir,
		"-p", strconv.Itoa(port),
		"-c", "listen_addresses=",
		"-c", "max_connections=300",
		"-c", "unix_socket_permissions=0700",
	}
	if opts.Fast {
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	cmd := exec.Command(filepath.Join(bin, "postgres"), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: syscall.SIGQUIT}
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
	c := &Cluster{dir: opts.Dir, cmd: cmd, done: make(chan struct{})}
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

// URL is the connection string of the clawmesh database.
func (c *Cluster) URL() string { return urlFor(c.dir, dbName) }

// AdminURL is the connection string of the maintenance database.
func (c *Cluster) AdminURL() string { return urlFor(c.dir, "postgres") }

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
	// SIGINT is PostgreSQL's fast shutdown.
	graceful.Stop(c.cmd.Process, c.done, syscall.SIGINT, 15*time.Second)
}

func urlFor(dir, db string) string {
	q := url.Values{"host": {dir}, "port": {strconv.Itoa(port)}, "sslmode": {"disable"}}
	return "postgres://" + dbUser + "@/" + db + "?" + q.Encode()
}

func (c *Cluster) waitReady(ctx context.Context) error {
	for {
		select {
		case <-c.done:
			return fmt.Errorf("%w: %v (see the postgres log lines above)", ErrExited, c.err)
		default:
		}
		conn, err := pgx.Connect(ctx, c.AdminURL())
		if err == nil {
			defer conn.Close(ctx)
			var exists bool
			if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", dbName).Scan(&exists); err != nil {
				return fmt.Errorf("check database: %w", err)
			}
			if !exists {
				if _, err := conn.Exec(ctx, "CREATE DATABASE "+dbName); err != nil {
					return fmt.Errorf("create database: %w", err)
				}
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("postgres not ready: %w", errors.Join(ctx.Err(), err))
		case <-c.done:
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func initdb(ctx context.Context, bin, pgdata string, cred *syscall.Credential, log *zap.Logger) error {
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "initdb"),
		"-D", pgdata, "-U", dbUser, "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("initdb: %w: %s", err, strings.TrimSpace(string(out)))
	}
	log.Info("postgres cluster created", zap.String("pgdata", pgdata))
	return nil
}

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
