// Package configclient is how every process reads the live config: the
// whole document from the config service at start (the Live RPC), then
// each committed revision, which it also reads from the config service
// when a change is announced on the bus. The announcement is only a hint:
// a document is never taken from the bus, so a forged announcement can at
// most cause one extra read, never install anything.
//
// Read settings through the typed accessors (RPCLimits, PluginLimits,
// Agent, Uploads, Durable): they take every default from internal/
// configschema, the one place defaults are written.
//
//	cc, err := configclient.New(ctx, configv1.NewConfigServiceClient(conn), nc, log)
//	limits := cc.RPCLimits()
//	cc.OnChange(func(s configclient.Snapshot, props []string) { ... })
//
// Documents are masked: a secret reads "***MASKED***". A service that
// needs a secret's value asks the Reveal RPC.
package configclient

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/configschema"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// Snapshot is one revision of the live config.
type Snapshot struct {
	Revision int64
	Document map[string]any
	// History identifies the config database's history the revision
	// belongs to; empty when unknown (a config service that predates it).
	History string
	// Digest is the digest of the revision's stored document: a history
	// restored into the same database, or a revision rewritten there,
	// keeps its id and numbers, not its digests. Empty when unknown.
	Digest string
}

// otherHistory reports whether a and b are known to be of two histories
// (a database replaced or reset): revision numbers compare only within
// one. An unknown history is taken as the same one, as before ids.
func otherHistory(a, b string) bool { return a != "" && b != "" && a != b }

// rewritten reports whether a and b are the same revision of one history
// with other documents: the history was restored into its database (an
// older dump put back and committed on up to the number read) or the
// revision's row rewritten. An unknown digest is taken as the same.
func rewritten(a, b Snapshot) bool {
	return a.Revision == b.Revision && !otherHistory(a.History, b.History) &&
		a.Digest != "" && b.Digest != "" && a.Digest != b.Digest
}

// Value returns the value at a dotted path.
func (s Snapshot) Value(path string) (any, bool) { return configschema.Get(s.Document, path) }

// Client follows the live config.
type Client struct {
	rpc configv1.ConfigServiceClient
	log *zap.Logger
	sub *nats.Subscription

	// wake tells the follower goroutine a newer revision was announced,
	// resync that the bus connection came back (see New); ctx ends it,
	// done closes when it has returned.
	wake   chan struct{}
	resync chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	cur      Snapshot
	pending  int64 // newest revision announced and not read yet
	back     bool  // a revision below the one read was announced
	other    bool  // a revision of another history, or the one read rewritten, was announced
	watchers []func(Snapshot, []string)
	props    map[int64]announced // announced revisions not read yet
	// read is closed, and replaced, each time the follower has read the
	// live document: AtLeast and Latest wait on it.
	read chan struct{}
	// fresh asks the follower for a read even when nothing newer was
	// announced (Latest); begun numbers the follower's reads as they
	// begin, ended that of the last one ended, and readOK that of the
	// last one that read the document.
	fresh                bool
	begun, ended, readOK uint64
}

// announced is what an announcement said of a revision not read yet.
type announced struct {
	props []string
	// parent is the digest of the revision it was staged on ("" when
	// the config service did not say).
	parent string
}

// New subscribes to change announcements, then reads the live document
// (waiting for the config service up to ctx's deadline), so no commit
// falls between the two.
func New(ctx context.Context, rpc configv1.ConfigServiceClient, nc *nats.Conn, log *zap.Logger) (*Client, error) {
	if log == nil {
		log = zap.NewNop()
	}
	c := &Client{rpc: rpc, log: log, wake: make(chan struct{}, 1), resync: make(chan struct{}, 1), done: make(chan struct{}), props: map[int64]announced{}, read: make(chan struct{})}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	sub, err := bus.SubscribeConfigChanged(nc, c.hint, func(err error) { log.Warn("config change announcement dropped", zap.Error(err)) })
	if err != nil {
		return nil, err
	}
	if err := nc.Flush(); err != nil {
		sub.Unsubscribe() //nolint:errcheck
		return nil, fmt.Errorf("subscribe config changes: %w", err)
	}
	c.sub = sub
	snap, err := c.fetch(ctx)
	if err != nil {
		sub.Unsubscribe() //nolint:errcheck
		c.cancel()
		return nil, err
	}
	c.mu.Lock()
	c.cur = snap
	c.mu.Unlock()
	// A change committed while this connection was away from the bus was
	// announced to no one here: the document is read again as soon as
	// the connection is back, not up to Resync later (a config/set
	// acknowledged during an outage took effect 30 s after it). The
	// handler is added to nc's own; after Close it does nothing.
	prev := nc.ReconnectHandler()
	nc.SetReconnectHandler(func(nc *nats.Conn) {
		if prev != nil {
			prev(nc)
		}
		select {
		case c.resync <- struct{}{}:
		default:
		}
	})
	go c.follow()
	return c, nil
}

// Close stops following changes and waits for the follower.
func (c *Client) Close() {
	if c.sub != nil {
		c.sub.Unsubscribe() //nolint:errcheck // the connection may be closed already
	}
	c.cancel()
	<-c.done
}

// Current is the newest revision read.
func (c *Client) Current() Snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur
}

// ErrRevisionNotRead wraps AtLeast's failure: the revision asked for was
// not read in time, or the config service does not serve it.
var ErrRevisionNotRead = errors.New("config revision not read")

// AtLeast returns once revision rev, or a later one, has been read (see
// Current), asking the follower to read the live document now rather
// than when the change's announcement arrives. A client's write is
// acknowledged when committed, and its next request may reach a service
// before the announcement does: with the revision the write returned,
// the service reads its own write. The reads are the follower's, one at
// a time, shared by every waiter; a waiter takes at most two (the one in
// flight when it asked and the next), and waits CallTimeout at most,
// so a revision the config service does not serve (another history's)
// costs a bounded wait, not reads without end. The error wraps
// ErrRevisionNotRead, and ErrConfigNoAnswer when the time ran out.
func (c *Client) AtLeast(ctx context.Context, rev int64) error {
	ctx, cancel := Bounded(ctx)
	defer cancel()
	for reads := 0; ; reads++ {
		c.mu.Lock()
		cur := c.cur.Revision
		if cur >= rev {
			c.mu.Unlock()
			return nil
		}
		if reads == 2 {
			c.mu.Unlock()
			return fmt.Errorf("%w: the config service serves revision %d, below %d", ErrRevisionNotRead, cur, rev)
		}
		c.pending = max(c.pending, rev)
		read := c.read
		c.mu.Unlock()
		select {
		case c.wake <- struct{}{}:
		default:
		}
		select {
		case <-read:
		case <-c.ctx.Done():
			return fmt.Errorf("%w: %d: the follower is closed", ErrRevisionNotRead, rev)
		case <-ctx.Done():
			return fmt.Errorf("%w: %d (revision %d read): %w", ErrRevisionNotRead, rev, cur, context.Cause(ctx))
		}
	}
}

// Latest returns once a read of the live document begun after the call
// has been installed: the revision the config service served when the
// caller's request arrived, or a later one. It is AtLeast for a caller
// that knows no revision (a durable pane's text, a channel's message,
// whose writer's revision is another client's): followed over the bus
// alone, a turn right after a write ran with the config as it was
// until the announcement came. Reads are the follower's, one at a time,
// shared by every waiter (one read serves all that asked before it
// began), bounded as AtLeast is; the error wraps ErrRevisionNotRead,
// and ErrConfigNoAnswer when the time ran out.
func (c *Client) Latest(ctx context.Context) error {
	ctx, cancel := Bounded(ctx)
	defer cancel()
	c.mu.Lock()
	want := c.begun + 1
	c.fresh = true
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	for {
		c.mu.Lock()
		if c.readOK >= want {
			c.mu.Unlock()
			return nil
		}
		if c.ended >= want {
			// The read asked for ended without the document (the
			// config service failed): ask for another.
			want, c.fresh = c.begun+1, true
			select {
			case c.wake <- struct{}{}:
			default:
			}
		}
		read := c.read
		cur := c.cur.Revision
		c.mu.Unlock()
		select {
		case <-read:
		case <-c.ctx.Done():
			return fmt.Errorf("%w: the latest: the follower is closed", ErrRevisionNotRead)
		case <-ctx.Done():
			return fmt.Errorf("%w: the latest (revision %d read): %w", ErrRevisionNotRead, cur, context.Cause(ctx))
		}
	}
}

// readDone wakes AtLeast's and Latest's waiters after one of the
// follower's reads, the n-th begun; ok says the document was read.
func (c *Client) readDone(n uint64, ok bool) {
	c.mu.Lock()
	c.ended = n
	if ok {
		c.readOK = n
	}
	close(c.read)
	c.read = make(chan struct{})
	c.mu.Unlock()
}

// OnChange registers fn, called with each newer revision and the props it
// changed, in revision order, from one goroutine; fn must not block long.
// A revision reached after a gap (several commits read at once) reports
// props nil.
func (c *Client) OnChange(fn func(Snapshot, []string)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.watchers = append(c.watchers, fn)
}

// maxPendingProps bounds the props remembered for announced revisions.
const maxPendingProps = 64

// hint records an announced revision for the follower.
func (c *Client) hint(ch *busv1.ConfigChanged) {
	rev := ch.GetRevision()
	c.mu.Lock()
	switch {
	case otherHistory(ch.GetHistory(), c.cur.History):
		// Whatever its number: read what the service serves (follow).
		c.other = true
	case rev == c.cur.Revision && rewritten(Snapshot{Revision: rev, History: ch.GetHistory(), Digest: ch.GetDigest()}, c.cur):
		// The revision read, with another document (follow).
		c.other = true
	case rev == c.cur.Revision:
		c.mu.Unlock()
		return
	case rev < c.cur.Revision:
		// The config service may have started a new history (its
		// database replaced or reset): read what it serves (follow).
		c.back = true
	default:
		if len(c.props) < maxPendingProps {
			c.props[rev] = announced{props: ch.GetProps(), parent: ch.GetParentDigest()}
		}
		c.pending = max(c.pending, rev)
	}
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// Resync is how often the live document is read without an
// announcement, so a lost one delays a change at most this long (one lost
// while the bus was away from this process is read once it is back).
const Resync = 30 * time.Second

// confirmBack is how long after the config service first served a
// revision below the one read it is asked again: the lower revision is
// taken as a new history only when it is still what it serves then (a
// database replaced or reset), not a read that lagged (an old config
// process beside its replacement reads the database's commits within
// its follow's second).
const confirmBack = 2 * time.Second

// follow reads the live document each time a newer revision is announced,
// when the bus connection is back, and every Resync.
func (c *Client) follow() {
	defer close(c.done)
	t := time.NewTicker(Resync)
	defer t.Stop()
	// confirm fires at confirmAt, the second read of a lower revision.
	var confirm <-chan time.Time
	var confirmAt time.Time
	for {
		resync := false
		select {
		case <-c.ctx.Done():
			return
		case <-c.wake:
		case <-t.C:
			resync = true
		case <-c.resync:
			resync = true
		case <-confirm:
			resync = true
		}
		c.mu.Lock()
		rev, back, other, fresh := c.pending, c.back, c.other, c.fresh
		c.pending, c.back, c.other, c.fresh = 0, false, false, false
		cur := c.cur.Revision
		if rev <= cur && !resync && !back && !other && !fresh {
			c.mu.Unlock()
			continue
		}
		c.begun++
		n := c.begun
		c.mu.Unlock()
		ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
		snap, err := c.fetch(ctx)
		cancel()
		// Whatever became of the read, AtLeast's waiters look again
		// once its outcome is installed.
		func() {
			if err != nil {
				if c.ctx.Err() == nil {
					c.log.Warn("config revision not read", zap.Int64("announced", rev), zap.Error(err))
				}
				return
			}
			if !resync && snap.Revision < rev {
				// The config service has no such revision: a forged or stale
				// announcement. Nothing is pinned to it.
				c.log.Warn("announced config revision unknown to the config service",
					zap.Int64("announced", rev), zap.Int64("live", snap.Revision))
			}
			if otherHistory(snap.History, c.Current().History) {
				// The config service serves another history (its database
				// replaced or reset): numbers compared alone kept the old
				// document for ever when the new history stood at, or
				// passed, the number read. Its id is the database's own,
				// so no read that lags is taken for it: installed at once.
				confirm, confirmAt = nil, time.Time{}
				c.log.Warn("config history replaced: following the config service's new one",
					zap.Int64("was", c.Current().Revision), zap.Int64("revision", snap.Revision))
				c.replace(snap)
				return
			}
			if cur := c.Current(); rewritten(snap, cur) {
				// The same number of the same history, another document: the
				// history was restored into its database, or the row
				// rewritten. Numbers and ids compared alone kept the document
				// read for that number for ever. The digest is the
				// database's own, so no read that lags is taken for it.
				confirm, confirmAt = nil, time.Time{}
				c.log.Warn("config revision rewritten in the config database: following its stored document",
					zap.Int64("revision", snap.Revision), zap.String("was", cur.Digest), zap.String("digest", snap.Digest))
				c.replace(snap)
				return
			}
			if snap.Revision < c.Current().Revision {
				// Read from the config service itself, never the bus: its
				// history went back. Every revision below the one read was
				// ignored, so a process whose config database was replaced
				// or reset kept the old document until the new history
				// passed the old revision number. Taken once a second read
				// agrees.
				switch {
				case confirmAt.IsZero():
					c.log.Warn("the config service serves an older revision than the one read; asking again",
						zap.Int64("read", c.Current().Revision), zap.Int64("live", snap.Revision))
					confirmAt = time.Now().Add(confirmBack)
					confirm = time.After(confirmBack)
					return
				case time.Now().Before(confirmAt):
					return // a read before the second one is due
				}
				confirm, confirmAt = nil, time.Time{}
				c.log.Warn("config history replaced: following the config service's new one",
					zap.Int64("was", c.Current().Revision), zap.Int64("revision", snap.Revision))
				c.replace(snap)
				return
			}
			confirm, confirmAt = nil, time.Time{}
			c.install(snap)
		}()
		c.readDone(n, err == nil)
	}
}

// fetchPause is the longest pause between two attempts of fetch. The
// first pauses are shorter: a config service that is starting answers
// Unavailable at once (its health answers from the moment it listens),
// where its socket held the call in the backlog until it served, and a
// fixed 100 ms put up to that much on every start of the stack.
const fetchPause = 100 * time.Millisecond

func (c *Client) fetch(ctx context.Context) (Snapshot, error) {
	pause := 5 * time.Millisecond
	for {
		live, err := c.rpc.Live(ctx, &configv1.LiveRequest{}, grpc.WaitForReady(true))
		if err == nil {
			return Snapshot{Revision: live.GetRevision(), Document: live.GetDocument().AsMap(), History: live.GetHistory(), Digest: live.GetDigest()}, nil
		}
		select {
		case <-ctx.Done():
			return Snapshot{}, fmt.Errorf("read the live config: %w", err)
		case <-time.After(pause):
		}
		pause = min(2*pause, fetchPause)
	}
}

func (c *Client) install(s Snapshot) {
	c.mu.Lock()
	if s.Revision <= c.cur.Revision {
		if s.Revision == c.cur.Revision && c.cur.History == "" {
			// Read first from a config service that predates history
			// ids: the same revision, now with its history's id.
			c.cur.History = s.History
		}
		if s.Revision == c.cur.Revision && c.cur.Digest == "" && !otherHistory(s.History, c.cur.History) {
			// Likewise from one that predates digests.
			c.cur.Digest = s.Digest
		}
		c.mu.Unlock()
		return
	}
	// The props are the whole difference only for the revision staged
	// on the one held: a follower holding revision N of a history that
	// was restored (an older dump put back) and committed on up to N+1
	// read N+1 as the next of its N, and its watchers were told N+1's
	// props alone, not what the restored N had changed.
	a, exact := c.props[s.Revision]
	props := a.props
	if s.Revision != c.cur.Revision+1 || a.parent != c.cur.Digest {
		props, exact = nil, false
	}
	for rev := range c.props {
		if rev <= s.Revision {
			delete(c.props, rev)
		}
	}
	c.cur = s
	watchers := append([]func(Snapshot, []string){}, c.watchers...)
	c.mu.Unlock()
	if !exact {
		props = nil
	}
	for _, fn := range watchers {
		fn(s, props)
	}
}

// replace installs s, a revision below the one read or of another
// history, whatever its number, as the start of a new history: what was
// announced of the old one is forgotten, and the watchers are told that
// anything may have changed (props nil).
func (c *Client) replace(s Snapshot) {
	c.mu.Lock()
	clear(c.props)
	c.pending = 0
	c.cur = s
	watchers := append([]func(Snapshot, []string){}, c.watchers...)
	c.mu.Unlock()
	for _, fn := range watchers {
		fn(s, nil)
	}
}

// Errors of a per-request call on the config service.
var (
	// ErrConfigUnavailable wraps a failure to reach the config service.
	ErrConfigUnavailable = errors.New("config service unavailable")
	// ErrConfigNoAnswer wraps a call the config service did not answer
	// within CallTimeout (hung, or its host stalled): it is also an
	// ErrConfigUnavailable.
	ErrConfigNoAnswer = fmt.Errorf("%w: the config service did not answer within %v", ErrConfigUnavailable, CallTimeout)
)

// CallTimeout bounds each call a request makes on the config service
// (Authorize, Reveal) when the caller's own deadline is later or absent.
// The config service answers them from memory, in well under a
// millisecond; 3 s leaves room for a loaded two-core host and a GC pause
// while failing long before the connection's keepalive gives up on a
// hung peer (grpcclient: 10 s + 5 s of silence), which a turn or a
// channel post otherwise waited out, with a message naming nothing.
const CallTimeout = 3 * time.Second

// Bounded derives the context of one per-request call on the config
// service: ctx with CallTimeout at most, whose expiry is the cause
// ErrConfigNoAnswer (see NoAnswer).
func Bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, CallTimeout, ErrConfigNoAnswer)
}

// NoAnswer returns err wrapped with ErrConfigNoAnswer when the call of
// ctx (from Bounded) failed because CallTimeout passed, else err. gRPC
// reports a deadline as DeadlineExceeded, not the context's cause.
//
// The call's end and the bound's are not ordered: the server's own
// timer, set from the deadline the call sent, may end the call (a hung
// config service answered Unavailable as its context ended) before the
// bound's timer here has fired and set its cause, and the error named
// no missing answer. An error within boundEdge of the deadline waits
// for the context to end, at most that long, and its cause decides.
func NoAnswer(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= boundEdge {
		<-ctx.Done() // at dl at the latest
	}
	if errors.Is(context.Cause(ctx), ErrConfigNoAnswer) {
		return fmt.Errorf("%w: %w", ErrConfigNoAnswer, err)
	}
	return err
}

// boundEdge is how close to a bound's deadline a failed call is taken as
// possibly ended by it (NoAnswer): far more than the timers' skew between
// a caller and a server on one host, and a small share of CallTimeout.
const boundEdge = 100 * time.Millisecond

// Authorize asks the config service whether principal holds permission on
// resource. It returns nil when allowed, a PermissionDenied status with
// the forbidden reason (ready to return to the gateway, which sends
// -32012) when not, and an error wrapping ErrConfigUnavailable when the
// question could not be asked.
//
// The call is bounded by CallTimeout (Bounded): a hung config service
// held every request that asked it until the caller's deadline, or, with
// none, the connection's keepalive.
func Authorize(ctx context.Context, rpc configv1.ConfigServiceClient, principal *commonv1.Principal, permission, resource string) error {
	ctx, cancel := Bounded(ctx)
	defer cancel()
	resp, err := rpc.Authorize(ctx, &configv1.AuthorizeRequest{Principal: principal, Permission: permission, Resource: resource})
	if err != nil {
		if noAnswer := NoAnswer(ctx, err); noAnswer != err {
			return noAnswer
		}
		return fmt.Errorf("%w: %w", ErrConfigUnavailable, err)
	}
	if !resp.GetAllowed() {
		return rpcerr.Error(codes.PermissionDenied, rpcerr.ReasonForbidden, rpcerr.NoIndex, resp.GetReason())
	}
	return nil
}

// Authorize is the package-level Authorize on the client's connection.
func (c *Client) Authorize(ctx context.Context, principal *commonv1.Principal, permission, resource string) error {
	return Authorize(ctx, c.rpc, principal, permission, resource)
}
