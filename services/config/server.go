// Package config is the config service: the typed config document (its
// schema is the schema package), its revisions, principals, paired tokens
// and authorization decisions.
//
// Reads are served from an immutable snapshot of the live config. Every
// write (config/set-many, config/set, config/delete, the launcher's --set,
// pairing and revoking tokens) holds one write lock from the moment the
// caller's authority is resolved until the new snapshot is live, so a
// revocation committed while a batch waited for the lock refuses it, and
// a failure anywhere before COMMIT leaves both the stored and the live
// config as they were.
package config

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/configschema"
	"github.com/clawmesh/clawmesh/internal/policylock"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// OperatorPrincipal is the principal of a local peer with the daemon's uid.
const OperatorPrincipal = configschema.OperatorPrincipal

// LauncherAuthor is the audit name of the launcher's startup commit.
const LauncherAuthor = "launcher"

// Options configure a Server.
type Options struct {
	DB *pgxpool.Pool
	// NATS receives a bus.ConfigChanged announcement after each commit;
	// nil publishes nothing (tests of storage alone).
	NATS *nats.Conn
	// DataDir holds the secret key file, created on first run.
	DataDir string
	Log     *zap.Logger
}

func (o *Options) withDefaults() error {
	if o.DB == nil {
		return errors.New("config: a database is required")
	}
	if o.DataDir == "" {
		return errors.New("config: a data directory is required (for the secret key)")
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	return nil
}

// Server implements configv1.ConfigServiceServer.
type Server struct {
	configv1.UnimplementedConfigServiceServer

	db     *pgxpool.Pool
	nc     *nats.Conn
	log    *zap.Logger
	sealer *sealer
	// keyFile is the sealer's key, named in errors.
	keyFile string
	// uid is the daemon's own uid: a local peer with it is the operator.
	uid int

	// writeLock is held (a value in the channel) by the one write in
	// progress; waiting counts writes queued for it.
	writeLock chan struct{}
	waiting   atomic.Int32
	snap      atomic.Pointer[snapshot]
	// releasePolicy releases the policy lock the write holds; it is set
	// and cleared under writeLock.
	releasePolicy func()
	// unsure is set when a write reached the database and its outcome was
	// not seen (a COMMIT whose answer was lost, the check after it failing
	// too): the database may hold a revision, or a token change, that the
	// live snapshot lacks. The next write, and Run meanwhile, reload the
	// snapshot before anything else: otherwise every later commit would
	// insert a revision number the database already holds, and a revoked
	// token could stay live until a restart.
	unsure atomic.Bool
	// seen is what the database held (storedFingerprint) when the live
	// snapshot was last loaded from it; only New and Run use it.
	seen fingerprint
	// wrote is set by every write of this process (unlock): the
	// database then holds what seen does not say, and follow reloads
	// even when the fingerprint reads as seen again. Without it, an
	// older dump restored after this process's own commits brought the
	// database back to the very fingerprint follow last read (before
	// those commits), and was never loaded.
	wrote atomic.Bool

	hooks hooks
}

// hooks let tests stop a write at its critical points.
type hooks struct {
	// locked runs right after a write took the lock.
	locked func()
	// beforeCommit runs after the candidate is staged, validated and
	// inserted, before COMMIT; an error aborts the write.
	beforeCommit func(ctx context.Context, tx pgx.Tx) error
}

// snapshot is one immutable state of the live config.
type snapshot struct {
	revision int64
	// history is the database's history id (its table history): a
	// replaced or reset database is a new history, whatever its
	// revision numbers. Empty when the database holds none.
	history string
	// digest is the SHA-256 of the revision's document as the database
	// holds it (docDigest): a history restored into the same database,
	// or a row rewritten, keeps the id and the numbers, not the digest.
	// Empty at revision 0.
	digest string
	// stored is what was set (plaintext, canonical); doc adds defaults;
	// masked is doc with secrets masked, what readers get.
	stored, doc, masked map[string]any
	// tokens maps the id (hash) of each paired, unrevoked token to its user.
	tokens map[string]string
}

func newSnapshot(revision int64, history, digest string, stored map[string]any, tokens map[string]string) *snapshot {
	doc := configschema.Effective(stored)
	return &snapshot{revision: revision, history: history, digest: digest, stored: stored, doc: doc, masked: configschema.Mask(doc), tokens: tokens}
}

// New opens the key file and loads the stored document and tokens
// (revision 0 and the defaults on a new database).
func New(ctx context.Context, opts Options) (*Server, error) {
	if err := opts.withDefaults(); err != nil {
		return nil, err
	}
	sl, err := loadKey(opts.DataDir)
	if err != nil {
		return nil, err
	}
	s := &Server{db: opts.DB, nc: opts.NATS, log: opts.Log, uid: os.Getuid(), sealer: sl, writeLock: make(chan struct{}, 1),
		keyFile: filepath.Join(opts.DataDir, KeyFileName)}
	// Read before the load: a change between the two is loaded, and
	// only read again by Run (follow).
	if s.seen, err = s.storedFingerprint(ctx); err != nil {
		return nil, fmt.Errorf("load config: %w", err)
	}
	snap, err := s.load(ctx)
	if err != nil {
		return nil, err
	}
	s.snap.Store(snap)
	s.log.Info("config loaded", zap.Int64("revision", snap.revision), zap.Int("tokens", len(snap.tokens)))
	return s, nil
}

// current is the live snapshot.
func (s *Server) current() *snapshot { return s.snap.Load() }

// ReconcileEvery is how often Run looks for a write of unknown outcome
// to reload after.
const ReconcileEvery = 250 * time.Millisecond

// FollowEvery is how often Run reads whether the database changed under
// the live snapshot (follow).
const FollowEvery = time.Second

// Run reloads the live snapshot after a write whose outcome was not seen,
// once the database answers again, so that reads follow what the
// database holds without waiting for the next write; and after another
// config process committed to the same database (follow). It returns
// when ctx is done.
//
// It first announces the live revision: a process started on a database
// replaced or reset serves another history than the one its consumers
// read, and nothing else told them before their next resync (30 s on).
// Consumers that hold it already read nothing.
func (s *Server) Run(ctx context.Context) {
	s.publish(s.current(), "", nil)
	t := time.NewTicker(ReconcileEvery)
	defer t.Stop()
	f := time.NewTicker(FollowEvery)
	defer f.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.C:
			fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := s.follow(fctx)
			cancel()
			if err != nil && ctx.Err() == nil {
				s.log.Debug("stored config not followed", zap.Error(err))
			}
			continue
		case <-t.C:
		}
		if !s.unsure.Load() {
			continue
		}
		// The in-process lock alone: reloading changes nothing in the
		// database, so the policy lock across processes is not needed.
		select {
		case s.writeLock <- struct{}{}:
		case <-ctx.Done():
			return
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := s.reconcile(rctx)
		cancel()
		<-s.writeLock
		if err != nil && ctx.Err() == nil {
			s.log.Debug("config not reloaded yet", zap.Error(err))
		}
	}
}

// reconcile reloads the snapshot when a write's outcome is unknown, and
// announces a revision the database held that the snapshot lacked. The
// caller holds writeLock.
func (s *Server) reconcile(ctx context.Context) error {
	if !s.unsure.Load() {
		return nil
	}
	snap, err := s.load(ctx)
	if err != nil {
		return fmt.Errorf("reload after a write of unknown outcome: %w", err)
	}
	cur := s.current()
	s.snap.Store(snap)
	s.unsure.Store(false)
	s.log.Warn("config reloaded after a write of unknown outcome",
		zap.Int64("was", cur.revision), zap.Int64("revision", snap.revision))
	if snap.revision != cur.revision || snap.history != cur.history || snap.digest != cur.digest {
		// Which props changed is not known here: consumers take nil as
		// anything may have.
		s.publish(snap, "", nil)
	}
	return nil
}

// fingerprint is what changes in the database with every commit and
// every token paired or revoked: the newest revision, and the token rows
// and revoked ones (rows are never deleted, so each count only grows);
// with the database replaced or reset: its history id; and with a
// history restored into it (an older dump put back) or its newest row
// rewritten: that row's digest, where number, counts and id may all
// come back as they were (the document was served until a restart).
type fingerprint struct {
	revision, tokens, revoked int64
	history, digest           string
}

func (s *Server) storedFingerprint(ctx context.Context) (fingerprint, error) {
	var f fingerprint
	err := s.db.QueryRow(ctx, "SELECT (SELECT coalesce(max(revision), 0) FROM revisions), count(*), count(revoked_at), "+
		"(SELECT coalesce(max(id), '') FROM history), "+
		"coalesce((SELECT "+docDigest+" FROM revisions ORDER BY revision DESC LIMIT 1), '') FROM tokens").
		Scan(&f.revision, &f.tokens, &f.revoked, &f.history, &f.digest)
	return f, err
}

// follow reloads the live snapshot when the database changed since it
// was loaded. A process served the snapshot of its start, changed only
// by its own writes: with two config processes on one database (two
// replicas, or an old one still running beside its replacement), a
// commit through one was never read, nor announced, by the other, whose
// readers (and consumers) kept the old values, and a token revoked
// through one still bound its user through the other. The reload is
// announced when it brings a newer revision, so that consumers that
// read this process before it caught up read it again, and when it
// brings a lower one or another history (the database replaced or
// reset). This process's
// own writes change the fingerprint too: each costs one reload that
// finds nothing new.
func (s *Server) follow(ctx context.Context) error {
	wrote := s.wrote.Swap(false)
	fp, err := s.storedFingerprint(ctx)
	if err != nil || (fp == s.seen && !wrote) {
		if err != nil && wrote {
			s.wrote.Store(true)
		}
		return err
	}
	// The in-process lock alone, as reconcile: no write of this process
	// is under way while the database is read, so none is undone.
	select {
	case s.writeLock <- struct{}{}:
	case <-ctx.Done():
		if wrote {
			s.wrote.Store(true)
		}
		return ctx.Err()
	}
	defer func() { <-s.writeLock }()
	snap, err := s.load(ctx)
	if err != nil {
		if wrote {
			s.wrote.Store(true)
		}
		return err
	}
	// fp was read before the load: a change between them is loaded
	// now, and read again at the next tick.
	s.seen = fp
	cur := s.current()
	if snap.revision == cur.revision && snap.history == cur.history && snap.digest == cur.digest && maps.Equal(snap.tokens, cur.tokens) {
		return nil
	}
	s.snap.Store(snap)
	s.log.Info("config reloaded: changed in the database by another config process",
		zap.Int64("was", cur.revision), zap.Int64("revision", snap.revision))
	if snap.revision != cur.revision || snap.history != cur.history || snap.digest != cur.digest {
		// A lower one too, or another history: the database was
		// replaced or reset, and its consumers take a lower revision
		// the service serves, or another history id, as a new history
		// (configclient), here without waiting for their resync. The
		// same number with another digest: restored or rewritten in
		// place, read again by the consumers that hold it.
		s.publish(snap, "", nil)
	}
	return nil
}

// failedWrite marks the snapshot unsure when a statement that changes
// data failed without an answer from the server, which may have run it
// all the same, and returns err.
func (s *Server) failedWrite(err error) error {
	var pe *pgconn.PgError
	if err != nil && !errors.As(err, &pe) {
		s.unsure.Store(true)
	}
	return err
}

// lock takes the write lock, or fails when ctx ends first. With it comes
// the policy lock across processes (internal/policylock), held until the
// new snapshot is live: a file store checked under the old policy
// finishes first, and none checks against a policy about to change. After
// a write of unknown outcome the snapshot is reloaded first (reconcile).
func (s *Server) lock(ctx context.Context) error {
	s.waiting.Add(1)
	defer s.waiting.Add(-1)
	select {
	case s.writeLock <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("waiting for the config write lock: %w", context.Cause(ctx))
	}
	release, err := policylock.Exclusive(ctx, s.db)
	if err != nil {
		<-s.writeLock
		return err
	}
	s.releasePolicy = release
	if err := s.reconcile(ctx); err != nil {
		s.unlock()
		return err
	}
	if s.hooks.locked != nil {
		s.hooks.locked()
	}
	return nil
}

func (s *Server) unlock() {
	release := s.releasePolicy
	s.releasePolicy = nil
	release()
	s.wrote.Store(true)
	<-s.writeLock
}
