// Package pg opens a service's PostgreSQL pool on its own schema and
// applies the service's embedded migrations.
//
// Each service owns one schema; its pool's search_path is that schema, so
// its SQL names its tables unqualified and can never read another's.
package pg

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"time"

	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
)

// ErrBadMigration reports a migration file whose name is not NNNN_name.sql.
var ErrBadMigration = errors.New("migration file name must be NNNN_name.sql")

// ErrNewerSchema reports a schema that a newer version of the program has
// migrated past the migrations this one knows: its code does not keep
// what the newer tables expect (a counter a newer version maintains, a
// column it fills), so running would leave the data wrong for the newer
// version when it comes back. A restart does not mend it.
var ErrNewerSchema = errors.New("the database was migrated by a newer version")

var schemaName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)

// Open connects to url with search_path set to schema, creates the schema
// if missing, and applies the *.sql files of migrations in version order,
// each in its own transaction, under an advisory lock so replicas starting
// together apply each migration once. It waits for the server up to the
// deadline of ctx.
func Open(ctx context.Context, url, schema string, migrations fs.FS, log *zap.Logger) (*pgxpool.Pool, error) {
	if !schemaName.MatchString(schema) {
		return nil, fmt.Errorf("schema name %q is not a plain identifier", schema)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.ConnConfig.RuntimeParams["application_name"] = "clawmesh-" + schema
	cfg.ConnConfig.Tracer = &writeTracer{w: new(Writes), g: &gate{kick: make(chan struct{}, 1)}}
	explainCuts(&cfg.ConnConfig.Config)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open pool: %w", err)
	}
	if err := waitReady(ctx, pool, log); err != nil {
		pool.Close()
		return nil, err
	}
	if err := Migrate(ctx, pool, schema, migrations, log); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// waitLogEvery is how often a process waiting for its database says so.
const waitLogEvery = 5 * time.Second

func waitReady(ctx context.Context, pool *pgxpool.Pool, log *zap.Logger) error {
	start := time.Now()
	lastLog := start
	for {
		err := pool.Ping(ctx)
		if err == nil {
			return nil
		}
		if time.Since(lastLog) >= waitLogEvery {
			lastLog = time.Now()
			log.Info("waiting for the database", zap.Duration("waited", time.Since(start).Round(time.Second)), zap.Error(err))
		}
		select {
		case <-ctx.Done():
			if errors.Is(err, ctx.Err()) {
				// The ping ran out with ctx: saying it twice told nothing more.
				return fmt.Errorf("database not reachable: %w", err)
			}
			return fmt.Errorf("database not reachable: %w", errors.Join(ctx.Err(), err))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Watch pings the database every WatchInterval until ctx is done and
// tells report the outcome of each ping: nil when the database answers,
// ErrUnavailable when it does not (report deduplicates). Reporting every
// ping, not only changes, lets another observer (a request that failed)
// mark the database down in between and Watch clear it once it answers.
// The pool itself reconnects; Watch only makes the gap visible to health.
//
// On a pool made by Open, Watch also closes the pool to new work while
// its last ping failed, or since a call found the database gone
// (MarkUnavailable, which makes it ping at once): an acquisition fails
// at once with ErrUnavailable instead of waiting its caller's whole
// deadline on a server that does not answer (10 s a call, 5 s a
// publish's sequence reservation, while health already said the
// database was gone). Its own pings still go through, and the first
// that is answered opens the pool again. A failed ping also ends the
// acquisitions and statements already in flight, with ErrUnavailable
// (see gate.strike).
func Watch(ctx context.Context, pool *pgxpool.Pool, report func(error)) {
	g := gateOf(pool)
	var kick <-chan struct{}
	if g != nil {
		g.watchers.Add(1)
		defer func() {
			// Nobody would open it again.
			if g.watchers.Add(-1) == 0 {
				g.down.Store(false)
				g.clear()
			}
		}()
		kick = g.kick
	}
	own := &pingConn{cfg: pool.Config().ConnConfig.Copy()}
	defer own.close()
	t := time.NewTimer(WatchInterval)
	defer t.Stop()
	pingCtx := context.WithValue(ctx, watchPing{}, true)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-kick:
		}
		if g != nil && g.down.Load() {
			// Calls are refused until a ping is answered: ask often, so
			// they are refused no longer than the database is away.
			t.Reset(WatchRetry)
		} else {
			t.Reset(WatchInterval)
		}
		pctx, cancel := context.WithTimeout(pingCtx, WatchInterval)
		err := own.ping(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil && IsBusy(err) {
			// The server answered: a statement cancel (pg_cancel_backend
			// on every active backend, say) that reached the ping's
			// backend is not an outage. Taken for one, it turned health
			// NOT_SERVING until the next ping.
			err = nil
		}
		if err != nil {
			err = ErrUnavailable
		}
		if g != nil {
			g.down.Store(err != nil)
			if err != nil {
				g.strike()
				t.Reset(WatchRetry)
			} else {
				g.clear()
			}
		}
		report(err)
	}
}

// pingConn is Watch's own connection to the database, outside the pool.
// Pinged through the pool, a ping waited for a free connection: a pool
// whose every connection ran a long statement timed the ping out and was
// taken for a database gone (health NOT_SERVING, and the gate refusing
// every new call) while the database answered. One backend more a
// process is the price of telling a busy pool from a silent server.
type pingConn struct {
	cfg  *pgx.ConnConfig
	conn *pgx.Conn
}

// ping dials the connection if it has none and pings the server on it;
// a connection that failed is dropped and dialled again next time (a
// killed backend, a restarted server).
func (p *pingConn) ping(ctx context.Context) error {
	if p.conn == nil {
		conn, err := pgx.ConnectConfig(ctx, p.cfg)
		if err != nil {
			return err
		}
		p.conn = conn
	}
	err := p.conn.Ping(ctx)
	if err == nil && pingAnswer != nil {
		err = pingAnswer()
	}
	if err != nil && !IsBusy(err) {
		p.close()
	}
	return err
}

// pingAnswer, set by tests, is the error the server answers a ping it
// took with: a statement cancel cannot be aimed at a one-statement ping.
var pingAnswer func() error

func (p *pingConn) close() {
	if p.conn == nil {
		return
	}
	// Bounded: the server may be the one not answering.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_ = p.conn.Close(ctx)
	p.conn = nil
}

// MarkUnavailable tells the pool's Watch that a call found the database
// gone (a lost connection, a refused one): the pool takes no new work
// until Watch's next ping is answered, and Watch pings at once, so a
// database that answers (one backend was killed, say) is open again
// within a round trip. It does nothing on a pool no Watch watches
// (nothing would open it again), or made otherwise than by Open.
func MarkUnavailable(pool *pgxpool.Pool) {
	g := gateOf(pool)
	if g == nil || g.watchers.Load() == 0 {
		return
	}
	if !g.down.Swap(true) {
		// Once per outage: the calls refused meanwhile fail as
		// unavailable too, and would otherwise keep Watch pinging.
		select {
		case g.kick <- struct{}{}:
		default:
		}
	}
}

// gate is a pool's state as Watch last saw it (see Watch).
type gate struct {
	down     atomic.Bool
	watchers atomic.Int32
	kick     chan struct{} // MarkUnavailable asks Watch to ping now

	mu   sync.Mutex
	gone bool // Watch's last ping failed: statements fail at once (enter)
	// calls are the acquisitions in flight (inflight.go): as many as
	// the callers in flight, each one until it ends.
	calls map[*inFlight]struct{}
	// stmts are the connections with a statement in flight, nStmts the
	// statements they run (read without mu: none, none to leave).
	stmts  map[*pgx.Conn]statement
	nStmts atomic.Int32
}

// watchPing marks the context of Watch's pings: they go through a
// closed gate, to see when the database answers again.
type watchPing struct{}

func gateOf(pool *pgxpool.Pool) *gate {
	if t, ok := pool.Config().ConnConfig.Tracer.(*writeTracer); ok {
		return t.g
	}
	return nil
}

// errNotAsked is what an acquisition on a closed gate fails with.
var errNotAsked = fmt.Errorf("%w (not asked: it did not answer the last check)", ErrUnavailable)

// notAskedContext is done from the start, errNotAsked its error: given
// to the pool's acquisition (TraceAcquireStart), it fails at once with
// that error, before waiting for a connection or dialling one.
type notAskedContext struct{ context.Context }

var closedDone = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

func (notAskedContext) Deadline() (time.Time, bool) { return time.Time{}, false }
func (notAskedContext) Done() <-chan struct{}       { return closedDone }
func (notAskedContext) Err() error                  { return errNotAsked }

// WatchInterval is how often Watch pings, and WatchRetry how soon it
// pings again while the pool refuses calls (see Watch).
const (
	WatchInterval = time.Second
	WatchRetry    = 100 * time.Millisecond
)

// ErrUnavailable reports a database that does not answer.
var ErrUnavailable = errors.New("database unavailable")

// ErrBusy reports a statement the database answered but would not finish
// for now (see IsBusy); the database itself is up.
var ErrBusy = errors.New("database busy")

type migration struct {
	version int
	name    string
	sql     string
}

func load(migrations fs.FS) ([]migration, error) {
	if migrations == nil {
		return nil, nil
	}
	names, err := fs.Glob(migrations, "*.sql")
	if err != nil {
		return nil, fmt.Errorf("list migrations: %w", err)
	}
	pattern := regexp.MustCompile(`^(\d+)_[a-z0-9_]+\.sql$`)
	var out []migration
	seen := map[int]string{}
	for _, name := range names {
		m := pattern.FindStringSubmatch(name)
		if m == nil {
			return nil, fmt.Errorf("%s: %w", name, ErrBadMigration)
		}
		v, _ := strconv.Atoi(m[1])
		if prev, dup := seen[v]; dup {
			return nil, fmt.Errorf("migrations %s and %s share version %d", prev, name, v)
		}
		seen[v] = name
		body, err := fs.ReadFile(migrations, name)
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", name, err)
		}
		out = append(out, migration{version: v, name: name, sql: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}

// Migrate applies the pending migrations of schema. It is what Open runs;
// tests call it directly to prove migrations are idempotent.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string, migrations fs.FS, log *zap.Logger) error {
	ms, err := load(migrations)
	if err != nil {
		return err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire connection: %w", err)
	}
	defer conn.Release()
	ident := pgx.Identifier{schema}.Sanitize()
	// Every start after the first finds all its migrations applied: one
	// read says so, without the lock and the DDL below (five statements
	// and their catalog locks, 9 to 15 ms of a service's start). It sees
	// only committed migrations, each committed with its row, so one a
	// replica is applying meanwhile is waited for under the lock.
	if applied, err := appliedVersions(ctx, conn, ident); err == nil {
		if err := checkKnown(schema, ms, applied); err != nil {
			return err
		}
		if allApplied(ms, applied) {
			return nil
		}
	}
	lockKey := lockKeyFor(schema)
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", lockKey); err != nil {
		return fmt.Errorf("migration lock: %w", err)
	}
	defer func() {
		// A fresh context: the unlock must happen even when ctx is done,
		// or the session would keep the lock until the pool closes it.
		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = conn.Exec(uctx, "SELECT pg_advisory_unlock($1)", lockKey)
	}()
	if _, err := conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+ident); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+ident+`.schema_migrations (
		version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("create migrations table: %w", err)
	}
	applied, err := appliedVersions(ctx, conn, ident)
	if err != nil {
		return fmt.Errorf("read applied migrations: %w", err)
	}
	// Again under the lock: a newer replica may have migrated meanwhile.
	if err := checkKnown(schema, ms, applied); err != nil {
		return err
	}
	// The newest migration applied before this start, "" in a new
	// schema: what Upgraded names as from.
	from, to := "", ""
	for _, m := range ms {
		if applied[m.version] {
			from = m.name
		}
	}
	for _, m := range ms {
		if applied[m.version] {
			continue
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL search_path TO "+ident); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO "+ident+".schema_migrations (version, name) VALUES ($1, $2)", m.version, m.name)
			return err
		})
		if err != nil {
			return fmt.Errorf("apply migration %s: %w", m.name, err)
		}
		log.Info("migration applied", zap.String("schema", schema), zap.String("migration", m.name))
		// The newest applied now, whichever this start applied (ms
		// is in version order): a gap filled below the newest is no
		// step past it.
		to = ms[len(ms)-1].name
	}
	if from != "" && to != "" && from != to {
		log.Info(Upgraded, zap.String("schema", schema), zap.String("from", from), zap.String("to", to))
	}
	return nil
}

// Upgraded is the message of the log line Migrate writes once it has
// applied migrations to a schema that had some already (fields schema,
// from and to: the newest migration before and after): the database was
// upgraded, and a version that knows only up to from refuses it from now
// on (ErrNewerSchema). The launcher reads it in the service's output and
// tells the user (launcher/upgraded.go). A new schema, all of whose
// migrations are applied at once, is no upgrade and writes none.
const Upgraded = "schema upgraded"

// appliedVersions reads the versions recorded in the schema's
// migrations table (an error when it does not exist yet).
func appliedVersions(ctx context.Context, conn *pgxpool.Conn, ident string) (map[int]bool, error) {
	rows, err := conn.Query(ctx, "SELECT version FROM "+ident+".schema_migrations")
	if err != nil {
		return nil, err
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, err
	}
	applied := make(map[int]bool, len(versions))
	for _, v := range versions {
		applied[v] = true
	}
	return applied, nil
}

// checkKnown refuses a schema where a migration this program does not
// have is applied: a newer version's. Without it an older binary started
// on a newer data directory found its own migrations applied and ran,
// writing rows the way it knew (a stored file the newer session service
// counts per user went uncounted), which the newer version then read
// wrong.
func checkKnown(schema string, ms []migration, applied map[int]bool) error {
	if len(ms) == 0 {
		return nil
	}
	known := make(map[int]bool, len(ms))
	for _, m := range ms {
		known[m.version] = true
	}
	var unknown []int
	for v := range applied {
		if !known[v] {
			unknown = append(unknown, v)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	sort.Ints(unknown)
	return fmt.Errorf("%w: schema %s has migration %04d applied, this version knows up to %s; run the newer version (or restore a backup taken before it ran)",
		ErrNewerSchema, schema, unknown[len(unknown)-1], ms[len(ms)-1].name)
}

// allApplied reports whether every migration of ms is applied.
func allApplied(ms []migration, applied map[int]bool) bool {
	for _, m := range ms {
		if !applied[m.version] {
			return false
		}
	}
	return true
}

func lockKeyFor(schema string) int64 {
	h := fnv.New64a()
	h.Write([]byte("clawmesh-migrate:" + schema))
	return int64(h.Sum64())
}

// IsUnavailable reports whether err means the database could not be
// reached, or went away during the statement: a refused or failed
// connection, a connection lost mid-query, or a server shutting down or
// still starting.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	// ErrConnClosed: the connection was lost earlier in the same
	// operation (a COMMIT whose answer never came reads it), or was
	// already closed when the operation began.
	if errors.Is(err, ErrUnavailable) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.Is(err, pgconn.ErrConnClosed) {
		return true
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return true
	}
	// A syscall.Errno is a net.Error too (it has Timeout and Temporary):
	// a file's error (a folder removed, a disk read-only) took the
	// database for gone, answered "database unavailable" and turned the
	// service's health NOT_SERVING. The network's errors come as
	// *net.OpError, before the errno they wrap.
	var ne net.Error
	if errors.As(err, &ne) {
		if _, errno := ne.(syscall.Errno); !errno {
			return true
		}
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		// Class 08: connection exception; 57P01-57P03: admin or crash
		// shutdown, cannot connect now.
		return strings.HasPrefix(pe.Code, "08") || pe.Code == "57P01" || pe.Code == "57P02" || pe.Code == "57P03"
	}
	return pgconn.SafeToRetry(err)
}

// IsBusy reports whether err is a statement the database gave up on
// though it is up: cancelled (statement_timeout, pg_cancel_backend), rolled
// back as a deadlock victim or for a serialization failure, or refused a
// lock under lock_timeout. The same call may succeed when tried again;
// without a name of its own it was an internal error, "failed", with no
// reason a client could act on.
func IsBusy(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	switch pe.Code {
	case "57014", // query_canceled
		"40001", // serialization_failure
		"40P01", // deadlock_detected
		"55P03": // lock_not_available
		return true
	}
	return false
}

// IsDiskFull reports whether err is the database refusing a write for want
// of disk space (SQLSTATE 53100, disk_full: PostgreSQL's ENOSPC). The
// database is reachable and reads go on; only what it would write fails,
// until space is back.
func IsDiskFull(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == sqlStateDiskFull
}

// sqlStateDiskFull is disk_full (PostgreSQL's errcodes.txt, class 53).
const sqlStateDiskFull = "53100"
