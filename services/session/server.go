// Package session is the session service: sessions, turns, the agent loop
// and its providers, the transcript, approvals and session workspaces.
//
// A turn runs in one goroutine of this process (see turn.go): it gives the
// session's retained context to the agent's provider, publishes every
// streamed chunk, tool call, tool result and approval request on NATS as
// it happens (see updates.go for the subject and payload), and ends with
// exactly one turn_complete, published before Prompt answers.
//
// A session has two durable records in PostgreSQL (retained.go,
// store_durable.go): the visible transcript, which only grows, and the
// retained provider context, a snapshot plus the checkpoint events after
// it, trimmed to the agent's budget. A running turn checkpoints what it
// streams in batches (checkpoint.go), so a crash loses at most one batch;
// the next process recovers every unfinished turn once (server.go,
// recover). What lives only in memory is the running turn itself and its
// pending approvals (live.go), so the service runs as one replica.
//
// Files by concern: the gRPC surface is rpc_sessions.go (new, resume,
// close, kill, delete, attach), rpc_prompt.go (prompt, cancel, connection
// closed), rpc_approvals.go (approve) and rpc_read.go (state, messages,
// list, status), with shared checks in rpc.go; turn.go is the agent loop,
// tools.go and approvals.go what a turn calls and asks, store.go and
// store_durable.go every SQL statement, updates.go publishing. The providers (the interface, the
// scripted one and the OpenAI-compatible one) are package provider.
package session

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/bulkcodec"
	"github.com/clawmesh/clawmesh/internal/coalesce"
	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/filepass"
	"github.com/clawmesh/clawmesh/internal/grpcclient"
	"github.com/clawmesh/clawmesh/internal/pg"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// Config is what the service is built from.
type Config struct {
	DB   *pgxpool.Pool
	NATS *nats.Conn
	Log  *zap.Logger
	// DataDir holds the session workspaces, <DataDir>/workspaces/<id>/,
	// and the spool of turn ends not written, <DataDir>/unended/.
	DataDir string
	// Agents resolves agent aliases; nil means only the built-in default
	// agent.
	Agents AgentSource
	// Authz checks agent:use for principals other than the operator; nil
	// lets every principal use every agent.
	Authz Authorizer
	// Plugins is the plugin sandbox; nil means no plugin tools.
	// PluginReplicas is how many replicas its client spreads calls over
	// (0: one), which bounds how often a read is made again
	// (grpcclient.ReadAgain).
	Plugins        pluginv1.PluginServiceClient
	PluginReplicas int
	// Providers adds providers to (or replaces) scripted and openai.
	Providers map[string]ProviderFactory

	// UnwindTimeout bounds how long a cancelled turn may take to end, and
	// the records written while it unwinds (default 5 s).
	UnwindTimeout time.Duration
	// MaxSteps bounds the provider steps of one turn (default 32).
	MaxSteps int
	// ToolTimeout bounds one tool call (default 2 min).
	ToolTimeout time.Duration
	// PluginListTimeout bounds listing the plugin tools at a turn's start,
	// which waits for a sandbox restarting (default
	// grpcclient.RestartGrace, 3 s: the time a sandbox's client counts
	// its replicas as restarting before it fails calls at once; with 2 s
	// a turn started at a fourth crash in a row, whose restart took
	// longer, had no plugin tools).
	PluginListTimeout time.Duration
	// CheckpointInterval and CheckpointBytes batch the checkpoints of
	// running turns (defaults 100 ms and 4 KiB; see checkpoint.go).
	CheckpointInterval time.Duration
	CheckpointBytes    int
	// LiveIdleTimeout is how long the in-memory half of an idle session is
	// kept after its last use (default 10 min; see live.go).
	LiveIdleTimeout time.Duration
	// Uploads gives uploads.* in force now: the quota of a user's stored
	// files. nil: DefaultMaxUserStoredBytes and DefaultMaxUserStoredFiles.
	Uploads func() configclient.Uploads
	// Files is the server's codec when it reads StoreFile's bytes into
	// kept buffers (cmd/session): StoreFile gives them back when done.
	// nil when the bytes are grpc's.
	Files *bulkcodec.Codec
	// FileReceiver, when set, holds the files upload-staging hands over
	// on the file socket (internal/filepass), which StoreFile names by
	// their token instead of carrying the bytes.
	FileReceiver *filepass.Receiver

	// removeAll removes a discarded workspace: os.RemoveAll, a failing
	// one in tests.
	removeAll func(path string) error
}

func (c Config) withDefaults() (Config, error) {
	if c.DB == nil || c.NATS == nil {
		return c, errors.New("session: a database pool and a NATS connection are required")
	}
	if c.DataDir == "" {
		return c, errors.New("session: a data directory is required")
	}
	if c.Log == nil {
		c.Log = zap.NewNop()
	}
	if c.Agents == nil {
		c.Agents = NewStaticAgents()
	}
	if c.UnwindTimeout <= 0 {
		c.UnwindTimeout = 5 * time.Second
	}
	if c.MaxSteps <= 0 {
		c.MaxSteps = 32
	}
	if c.ToolTimeout <= 0 {
		c.ToolTimeout = 2 * time.Minute
	}
	if c.PluginListTimeout <= 0 {
		c.PluginListTimeout = grpcclient.RestartGrace
	}
	if c.CheckpointInterval <= 0 {
		c.CheckpointInterval = DefaultCheckpointInterval
	}
	if c.CheckpointBytes <= 0 {
		c.CheckpointBytes = DefaultCheckpointBytes
	}
	if c.LiveIdleTimeout <= 0 {
		c.LiveIdleTimeout = DefaultLiveIdleTimeout
	}
	if c.removeAll == nil {
		c.removeAll = os.RemoveAll
	}
	return c, nil
}

// Server implements sessionv1.SessionServiceServer.
type Server struct {
	sessionv1.UnimplementedSessionServiceServer

	cfg       Config
	log       *zap.Logger
	store     *store
	nc        *nats.Conn
	providers map[string]ProviderFactory
	cp        *checkpointer

	// stopSweep ends the eviction of idle live sessions; swept is closed
	// when it ended.
	stopSweep chan struct{}
	swept     chan struct{}
	// emptied is closed once the discarded workspaces are removed (or
	// the removal stopped with stopSweep); see orphans.go.
	emptied chan struct{}
	// tidied is closed once every session's uploads folder was cleared
	// of what a dead process left (or the clearing stopped with
	// stopSweep); see clearAllLeftovers.
	tidied chan struct{}

	// started is when this process made the service; cleared holds the
	// sessions whose uploads folder it cleared of temporary files a dead
	// process left (clearLeftovers).
	started   time.Time
	clearedMu sync.Mutex
	cleared   map[string]struct{}

	// base is the parent of every turn's context; Shutdown cancels it
	// with ErrShutdown.
	base       context.Context
	cancelBase context.CancelCauseFunc

	// openReads shares the open-sessions query among concurrent Status
	// calls (status is polled by every client).
	openReads coalesce.Group[struct{}, []openSession]

	// unendedBytes is what the live sessions keep of turn ends not
	// written (turnEnd.size), within maxUnendedBytes; spool keeps them
	// on the disk for the next start (endspool.go).
	unendedBytes atomic.Int64
	spool        *endSpool

	// mu guards lives (and each entry's refs and lastUsed) and closed; wg
	// counts every turn goroutine, added under mu so none starts after
	// Shutdown began waiting.
	mu       sync.Mutex
	lives    map[string]*liveSession
	closed   bool
	wg       sync.WaitGroup
	stopOnce sync.Once
}

// New builds the service on its schema and recovers from a previous
// process that died with turns running (see recover).
func New(ctx context.Context, cfg Config) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg: cfg, log: cfg.Log, store: &store{db: cfg.DB, kept: kept{writes: pg.WritesOf(cfg.DB)}}, nc: cfg.NATS,
		providers: defaultProviders(), lives: map[string]*liveSession{},
		openReads: coalesce.Group[struct{}, []openSession]{Timeout: 10 * time.Second},
		stopSweep: make(chan struct{}), swept: make(chan struct{}), emptied: make(chan struct{}), tidied: make(chan struct{}), cleared: map[string]struct{}{},
		started: time.Now(),
	}
	for name, f := range cfg.Providers {
		s.providers[name] = f
	}
	s.base, s.cancelBase = context.WithCancelCause(context.Background())
	spool, spooled, err := openEndSpool(filepath.Join(cfg.DataDir, "unended"), s.log)
	if err != nil {
		return nil, err
	}
	s.spool = spool
	// Before recovery, which would end these turns otherwise than their
	// clients were told, and tell them a second time.
	if err := s.writeSpooled(ctx, spooled); err != nil {
		return nil, err
	}
	if err := s.recover(ctx); err != nil {
		return nil, err
	}
	s.clearOrphans(ctx)
	s.cp = newCheckpointer(s.store, s.log, cfg.CheckpointInterval, cfg.CheckpointBytes, cfg.UnwindTimeout)
	go func() {
		defer close(s.swept)
		s.sweep(s.stopSweep)
	}()
	go func() {
		defer close(s.emptied)
		s.emptyDiscarded(s.stopSweep)
	}()
	go func() {
		defer close(s.tidied)
		s.clearAllLeftovers(s.stopSweep)
	}()
	return s, nil
}

// interruptedMarker is the transcript row recovery appends to a turn its
// process did not finish. It is for people: the provider never sees it.
const interruptedMarker = "[Turn interrupted: the session service stopped before it ended]"

// toolInterruptedOutput is the result recovery records for a tool call
// that was running when the process died.
const toolInterruptedOutput = "Cancelled: the session service stopped while the tool ran"

// stopInterrupted is the stop reason of a recovered turn.
const stopInterrupted = "interrupted"

// restoredSurfaces are the interaction surfaces whose unfinished turns
// recovery restores: the native RPC's. A turn of another surface (a
// channel's chat, say) is marked interrupted and its checkpoint left as
// it was, for that surface's own recovery to inspect; its events stay out
// of the provider context.
var restoredSurfaces = map[string]bool{SurfaceRPC: true}

// recover ends every turn a previous process left running, each exactly
// once (store.recoverTurn): for a restored surface, the checkpoint's
// visible progress (the text streamed so far, a result for a call that
// never got one) goes into the transcript, then one interruption marker;
// the turn's checkpoint events stay in the retained context, so the next
// prompt gives the provider the snapshot plus those events, never the
// marker. Each turn gets its turn_complete (cancelled), and its session is
// idle again.
func (s *Server) recover(ctx context.Context) error {
	turns, err := s.store.interruptedTurns(ctx)
	if err != nil {
		return err
	}
	for _, it := range turns {
		row, err := s.store.session(ctx, it.SessionID)
		if err != nil {
			return fmt.Errorf("recover turn %s: %w", it.TurnID, err)
		}
		// The number the turn_complete takes is stored with the turn's
		// end, as a turn that ends in a live process stores it: a
		// gateway that asks later (its bus link back) is answered it,
		// not the bound this process reserves to publish it. Stored
		// nowhere, a crash of this process before another turn ended
		// left the bound to answer, and the followers that had received
		// the turn_complete were closed, nothing lost.
		ls, release := s.hold(ctx, row)
		rec, err := s.store.recoverTurn(ctx, it, restoredSurfaces[it.Surface], interruptedMarker, ls.nextSeq())
		if err != nil || !rec.Done {
			release()
			if err != nil {
				return err
			}
			continue
		}
		f := fields{"turn_id": it.TurnID, "outcome": OutcomeCancelled, "content": rec.Content, "stop_reason": stopInterrupted}
		if it.Generation != nil {
			f["client_turn_generation"] = *it.Generation
		}
		s.publish(ls, UpdateTurnComplete, f)
		release()
		s.log.Info("interrupted turn recovered", zap.String("session_id", it.SessionID), zap.String("turn_id", it.TurnID),
			zap.String("interaction_surface", it.Surface), zap.Bool("restored", rec.Restored))
	}
	if err := s.store.recoverRunning(ctx); err != nil {
		return err
	}
	if len(turns) > 0 {
		s.flush()
	}
	return nil
}

// Shutdown cancels every running turn (cause ErrShutdown), waits for them
// to publish their turn_complete, writes the checkpoints still pending,
// and stores each session's last update sequence so the next process
// continues it without a gap. Safe to call
// more than once and from several goroutines; every call returns once the
// first one finished.
func (s *Server) Shutdown() {
	s.stopOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.cancelBase(ErrShutdown)
		s.wg.Wait()
		close(s.stopSweep)
		<-s.swept
		<-s.emptied
		<-s.tidied
		s.cp.shutdown()

		s.mu.Lock()
		lives := make([]*liveSession, 0, len(s.lives))
		for _, ls := range s.lives {
			lives = append(lives, ls)
		}
		s.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.UnwindTimeout)
		defer cancel()
		for _, ls := range lives {
			// Not written now, they stay in the spool for the next
			// start.
			ls.mu.Lock()
			if err := s.endUnended(ctx, ls); err != nil {
				s.log.Warn("write turn ends at shutdown", zap.String("session_id", ls.id), zap.Error(err))
			}
			ls.mu.Unlock()
			ls.pubMu.Lock()
			seq, reserved := ls.seqToRelease(), ls.seqReserved
			ls.pubMu.Unlock()
			if seq == reserved {
				continue
			}
			if err := s.store.releaseSeq(ctx, ls.id, seq, reserved); err != nil {
				s.log.Warn("store update sequence", zap.String("session_id", ls.id), zap.Error(err))
			}
		}
	})
}
