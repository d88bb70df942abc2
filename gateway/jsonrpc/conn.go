package jsonrpc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/jsonstr"
)

// Defaults of docs/spec.md §3, and of the settings it leaves open.
const (
	DefaultInitializeTimeout = 30 * time.Second
	DefaultFrameTimeout      = 30 * time.Second
	DefaultWriteStallTimeout = 30 * time.Second
	DefaultCallTimeout       = 30 * time.Second
	// DefaultMaxPendingBytes is how much encoded output may wait for a slow
	// reader before Call and Notify block (see Conn.Notify).
	DefaultMaxPendingBytes = 16 << 20
	// DefaultMaxInflightRequests is how many requests and notifications of
	// one connection may be in flight before its reading pauses (see
	// Options.MaxInflightRequests).
	DefaultMaxInflightRequests = 64
	// UrgentReserve is how many urgent requests (Options.Urgent) may be
	// in flight past MaxInflightRequests.
	UrgentReserve = 4
)

// Polling for a hang-up while the read loop is stopped at its bounds
// (sleepForRoom), or has left after a half-close (awaitHangUp): the first
// look after hangupPollMin, then twice as long each time up to
// hangupPollMax, so that a peer gone while its connection waited for long
// is seen within hangupPollMax, and one held only for a moment costs no
// system call.
const (
	hangupPollMin = 20 * time.Millisecond
	hangupPollMax = time.Second
)

// maxWriteChunk bounds one socket write, so that the write-stall deadline
// is renewed whenever the peer makes progress on a large backlog.
const maxWriteChunk = 256 << 10

// Options configures a Conn. The zero value is the docs/spec.md §3 configuration.
// For the durations, zero means the default and a negative value disables
// the limit (tests only: production keeps every limit).
type Options struct {
	// MaxFrameBytes bounds one incoming line (bytes before the LF, a CR
	// just before it not counted).
	// Default 8 MiB. Breach: one -32600, id null,
	// data {"reason":"frame_too_large","limit_bytes":N}, then close; the
	// rest of the line is never read.
	MaxFrameBytes int
	// InitializeTimeout runs from NewConn (accept). On expiry the
	// connection closes with no reply unless MarkInitialized was called,
	// even if an initialize request is still being handled.
	InitializeTimeout time.Duration
	// FrameTimeout runs from a frame's first byte. Breach: one -32600, id
	// null, data {"reason":"frame_timeout","limit_ms":N}, then close. Time
	// between frames is unbounded.
	FrameTimeout time.Duration
	// WriteStallTimeout: when output is pending and the peer reads none of
	// it for this long, the connection is closed. On a Linux Unix socket
	// the peer's reads are seen in the kernel's send queue, and the close
	// comes within this limit plus at most 1 s of the peer's last read; a
	// peer that keeps reading, however slowly, is never cut. Elsewhere a
	// write that moves no byte for this long is a stall.
	WriteStallTimeout time.Duration
	// CallTimeout bounds an outgoing Call whose ctx has no deadline.
	CallTimeout time.Duration
	// MaxPendingBytes bounds output queued for the peer; see Notify.
	// While at least this much is queued the connection reads no further
	// frames either: a peer that does not read gets no more work done for
	// it. Default 16 MiB.
	MaxPendingBytes int
	// MaxInflightRequests bounds the requests and notifications of this
	// connection in flight: being handled, or holding an encoded reply not
	// yet queued for the socket. At the bound the connection stops reading
	// until one finishes, so a peer pipelining requests it never reads the
	// answers to holds at most about MaxInflightRequests replies plus
	// MaxPendingBytes of output. Inline methods count while they run and
	// keep their order. One exception keeps outgoing calls from deadlocking:
	// while a Call of this connection waits for its response, reading goes
	// on, but a request read meanwhile is held (not dispatched) until there
	// is room, and served as soon as there is (an inline one runs at once,
	// exceeding the bound by one); a second such request stops reading
	// until both fit, so a peer that pipelines more requests before its
	// answers waits for the call's timeout.
	//
	// At the bound the connection still reads, as it does for a call's
	// answer: a peer's hang-up must be seen (its requests' contexts are
	// then cancelled at once, not when one of them ends), and so must a
	// request that ends the ones in flight (Options.Urgent), which can
	// free room only if it is read. Reading on holds at most two
	// requests (the held one, and the one that stops reading again); a
	// loop stopped so polls the socket for a hang-up. Default 64.
	MaxInflightRequests int
	// Urgent reports the methods (requests or notifications) that end
	// others in flight, e.g. a cancel: one read at the in-flight bound is
	// dispatched at once, past the bound, by at most UrgentReserve at a
	// time; more wait for room like any other request.
	Urgent func(method string) bool
	// FrameBudget, when set, bounds the memory unfinished frames hold
	// across every connection sharing it (see FrameBudget); a frame that
	// cannot get budget waits, and is cut by FrameTimeout as usual. A
	// Server uses its own budget of DefaultMaxBufferedFrameBytes when this
	// is nil; a bare Conn then has none (MaxFrameBytes still applies).
	FrameBudget *FrameBudget
	// OutputBudget, when set, bounds the output queued for peers across
	// every connection sharing it (see OutputBudget). A Server uses its
	// own budget of DefaultMaxBufferedOutputBytes when this is nil; a bare
	// Conn then has none (MaxPendingBytes still applies).
	OutputBudget *OutputBudget
	// Inline reports the methods handled on the read loop, in arrival
	// order, before the next frame is read (e.g. "initialize"). Every
	// other request is handled on its own goroutine. An inline handler
	// must not wait for anything the peer sends (no Call), and must keep
	// nothing of the request once it has returned: not the *Request,
	// which the connection reuses for its next request, nor its ID, whose
	// text (a number's, or a string's with no escape) is read where it
	// came, nor its Params (no slice of them, in anything that outlives
	// the call), read there too: in the buffer the next frame is read
	// into, not copied. Its Method is a string of its own.
	Inline func(method string) bool
	// Deferred reports the methods a DeferredHandler takes without a
	// goroutine of their own: HandleDeferred is called on the read loop
	// (or on the goroutine that frees room for a held request) and must
	// not block; the request counts as in flight until its
	// reply is given. Ignored unless the Handler is a DeferredHandler.
	Deferred func(method string) bool
	// ParamsDone reports the methods whose Handle keeps nothing of the
	// request's Params (no slice of them, in anything that outlives the
	// call) once it has returned: a large frame of such a request is
	// assembled again, once answered, in the same memory by a later
	// frame. Deferred methods are never recycled so. Upload chunks are
	// such requests: 1.4 MB frames, one after another.
	ParamsDone func(method string) bool
	// Logger receives static messages with structured fields; never frame
	// contents. Nil means no logging.
	Logger *zap.Logger
}

func (o Options) withDefaults() Options {
	dur := func(d *time.Duration, def time.Duration) {
		switch {
		case *d == 0:
			*d = def
		case *d < 0:
			*d = 0
		}
	}
	if o.MaxFrameBytes <= 0 {
		o.MaxFrameBytes = DefaultMaxFrameBytes
	}
	dur(&o.InitializeTimeout, DefaultInitializeTimeout)
	dur(&o.FrameTimeout, DefaultFrameTimeout)
	dur(&o.WriteStallTimeout, DefaultWriteStallTimeout)
	dur(&o.CallTimeout, DefaultCallTimeout)
	if o.MaxPendingBytes <= 0 {
		o.MaxPendingBytes = DefaultMaxPendingBytes
	}
	if o.MaxInflightRequests <= 0 {
		o.MaxInflightRequests = DefaultMaxInflightRequests
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return o
}

// Handler serves one incoming request or notification.
//
// It is called on its own goroutine, or on the read loop when
// Options.Inline says so. ctx is cancelled, with a cause wrapping ErrClosed,
// when the connection closes. For a notification the result is discarded
// and nothing is ever sent. Returning an *Error (possibly wrapped; found
// with errors.As) sends that error; any other error sends -32603 with a
// generic message, so a handler should map its errors itself. A panic is
// recovered and answered like a non-*Error error.
type Handler interface {
	Handle(ctx context.Context, c *Conn, req *Request) (result any, err error)
}

// DeferredHandler is a Handler that can take some requests (those
// Options.Deferred names) and answer them later, with no goroutine waiting
// for each one: a read shared by many requests answers them all from the
// goroutine that ran it.
type DeferredHandler interface {
	Handler
	// HandleDeferred is called on the read loop or, for a request held
	// until there was room for it, on the goroutine that made the room:
	// two calls of one connection may overlap. It must return without
	// blocking, having arranged for reply to be called exactly once, from
	// any goroutine, or having called it. ctx is the one Handle would get.
	HandleDeferred(ctx context.Context, c *Conn, req *Request, reply Reply)
}

// Reply gives a deferred request its answer, as Handle's results would.
// It never blocks: the response is written at once if the socket takes it
// now, else queued for the connection's writer, past
// Options.MaxPendingBytes if need be (the bound on requests in flight
// bounds that excess). A second call is ignored.
type Reply func(result any, err error)

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, c *Conn, req *Request) (any, error)

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, c *Conn, req *Request) (any, error) {
	return f(ctx, c, req)
}

// Conn is one JSON-RPC connection: it reads frames, dispatches requests to
// its Handler, writes responses and notifications through one writer
// goroutine (so a peer that does not read never blocks another connection),
// and correlates responses to its own outgoing calls.
type Conn struct {
	nc   net.Conn
	h    Handler
	opts Options
	log  *zap.Logger
	fr   *FrameReader

	mu      sync.Mutex
	started bool
	// closed is set once, under mu, with reason; read without mu by
	// isClosed, which the read loop asks after every request it answers
	// (a lock a request, where one atomic load says the same).
	closed atomic.Bool
	reason error // why the connection closed, set once
	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{}

	initState atomic.Int32 // 0 pending, 1 initialized, 2 expired
	initTimer *time.Timer

	// Output: producers append encoded frames to wq; the writer swaps it
	// out and writes it. wspace is closed when queued output shrinks, to
	// wake producers waiting for room. wbusy is the part of the writer's
	// batch not yet written; queued output is len(wq)+wbusy, mirrored in
	// outq for the read loop.
	wmu   sync.Mutex
	wq    []byte
	wbusy int
	// waiting is what frames waiting in enqueue for room in the queue
	// hold (under wmu): their senders keep them, but they are output
	// held for the peer all the same.
	waiting    int
	outq       atomic.Int64
	wspace     chan struct{}
	wclosed    bool
	writing    bool  // a goroutine is writing to the socket
	flushClose bool  // close once wq is written
	flushWhy   error // the reason for that close
	wbell      chan struct{}
	writerDone chan struct{}

	// Write-stall watch, touched only by the goroutine writing (c.writing):
	// bytes the kernel has accepted, and how to read its queue.
	sent       int64
	kq         func() (int, bool)
	kqResolved bool
	// deadlineSet says the socket has a write deadline, which writeAll
	// leaves behind; a write through writeNow would fail on it once past.
	deadlineSet bool

	// Outgoing calls.
	seq     atomic.Uint64
	pmu     sync.Mutex
	pending map[ID]chan *Response

	// Incoming requests being handled (inline ones included).
	hmu      sync.Mutex
	inflight int
	draining bool
	drainWhy error
	wg       sync.WaitGroup

	// Back-pressure on reading. active counts requests in flight (as
	// inflight does, read without a lock); room is rung when active drops
	// below the bound, when queued output drops below MaxPendingBytes and
	// when an outgoing call starts. held is a request read while over the
	// bounds (see awaitRoom); it is never an inline one. peakActive and
	// readGated are for tests and diagnostics.
	active     atomic.Int32
	peakActive atomic.Int32
	// heldFrames is the bytes of the assembled frames (longer than a read
	// block) that requests in flight hold; the loop reads on only while it
	// is under maxHeldFrames. The frame budget counts a frame until it is
	// handed to its handler: one that waits (a prompt for its turn, a
	// config write for the lock) held it uncounted, 64 of 8 MiB a
	// connection, every connection.
	heldFrames atomic.Int64
	room       chan struct{}
	held       atomic.Pointer[Request]
	readGated  atomic.Bool
	// hupTimer paces the polls for a hang-up (awaitPollingHangUp); only
	// the read loop's goroutine touches it. hupPolls counts the polls
	// (tests and diagnostics).
	hupTimer *time.Timer
	hupPolls atomic.Int64

	// workers, when the connection belongs to a Server, run its handlers.
	workers *workers

	// writeNow writes what the socket takes without waiting (nil where
	// unavailable): deferred replies use it, as they must not block.
	writeNow func([]byte) (int, error)

	// rc is the socket the read loop reads in place (nil where it reads
	// through nc); inPlace is set while it does (readInPlace).
	rc      syscall.RawConn
	inPlace atomic.Bool
	// readsSkipped counts the reads the loop did not try, reading in
	// place (socketSource): for tests and diagnostics.
	readsSkipped atomic.Int64

	// methods are the method names this connection's requests used
	// last, so that each request does not allocate its own (read loop
	// only).
	methods methodNames
	// req is where the read loop classifies each request (read loop
	// only): an inline one is handled in it, its id's text a view of the
	// frame, and answered before the next frame is read over both; any
	// other is moved out of it first (keep).
	req Request
}

// NewConn wraps an accepted connection. The initialize deadline starts now;
// nothing is read until Run. A nil h answers every request with -32601.
func NewConn(nc net.Conn, h Handler, opts Options) *Conn {
	opts = opts.withDefaults()
	if h == nil {
		h = notFoundHandler
	}
	c := &Conn{
		nc:         nc,
		h:          h,
		opts:       opts,
		log:        opts.Logger,
		fr:         NewFrameReader(nc, opts.MaxFrameBytes, opts.FrameTimeout),
		done:       make(chan struct{}),
		wbell:      make(chan struct{}, 1),
		room:       make(chan struct{}, 1),
		writerDone: make(chan struct{}),
		pending:    make(map[ID]chan *Response),
		writeNow:   writeNow(nc),
		rc:         inPlaceConn(nc),
	}
	if opts.FrameBudget != nil {
		c.fr.UseBudget(opts.FrameBudget, c.done)
	}
	if d := opts.InitializeTimeout; d > 0 {
		c.initTimer = time.AfterFunc(d, c.initializeExpired)
	}
	return c
}

func (c *Conn) initializeExpired() {
	if c.initState.CompareAndSwap(0, 2) {
		c.log.Info("closing connection: initialize deadline passed",
			zap.Duration("limit", c.opts.InitializeTimeout))
		c.closeWith(ErrInitializeTimeout)
	}
}

// MarkInitialized stops the initialize deadline. It reports false if the
// deadline had already passed (the connection is then closing, and the
// caller should not bind anything to it).
func (c *Conn) MarkInitialized() bool {
	if c.initState.CompareAndSwap(0, 1) {
		if c.initTimer != nil {
			c.initTimer.Stop()
		}
		return true
	}
	return c.initState.Load() == 1
}

// Done is closed when the connection has closed.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Close closes the connection at once: pending output is dropped, handler
// contexts are cancelled, pending calls fail. Safe to call more than once.
func (c *Conn) Close() error {
	c.closeWith(ErrClosed)
	return nil
}

// Err returns why the connection closed (nil while open, or when the peer
// hung up or Close was called).
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if errors.Is(c.reason, ErrClosed) || errors.Is(c.reason, ErrPeerClosed) {
		return nil
	}
	return c.reason
}

// Run reads and dispatches frames until the peer hangs up, a limit is
// breached, ctx is done or Close is called. It returns once the connection
// is closed and every handler it started has returned: nil when the peer
// hung up or Close was called, else the reason (wrapping ErrFrameTooLarge,
// ErrFrameTimeout, ErrInitializeTimeout, ErrWriteStall, the ctx's cause,
// or the read error). Run must be called once.
//
// When the peer shuts down only its sending side, requests already read
// are still answered before the connection closes. A Unix socket's peer
// that then closes altogether is seen within a second (hangupPollMax):
// the connection closes, as on any hang-up, and cancels its handlers.
func (c *Conn) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.started {
		c.mu.Unlock()
		return errors.New("jsonrpc: Run called twice")
	}
	c.started = true
	c.ctx, c.cancel = context.WithCancelCause(ctx)
	if c.closed.Load() {
		c.cancel(c.reason)
	}
	c.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { c.closeWith(context.Cause(ctx)) })
	defer stop()

	go c.writer()
	c.readLoop()
	c.awaitHangUp()
	<-c.writerDone
	c.wg.Wait()
	// Closed, its writer gone and its handlers returned: nothing charges
	// the budget or returns to it any more.
	c.opts.OutputBudget.Charge(-c.outq.Swap(0))
	return c.Err()
}

// readLoop reads and dispatches frames until the connection ends: in
// place on a Unix socket (readInPlace), else through net.Conn. A wait
// that failed in place (a frame deadline passed, the socket closed) is
// read out through the frame reader, as any read error is.
func (c *Conn) readLoop() {
	defer c.fr.Release() // its budget, and any partial frame, uncopied
	if c.rc != nil {
		err := c.readInPlace()
		if err == nil {
			return
		}
		c.fr.fail(err)
	}
	c.serveFrames()
}

// readInPlace runs the read loop inside the socket's RawConn.Read, where
// the runtime's poller keeps the socket's readiness from one read to the
// next: after a read that emptied the socket, the loop waits for it to
// become readable instead of trying a read that would find nothing,
// when what it read is answered (see socketSource). A client that waits
// for each answer, as most do, then costs one read a request instead of
// two, and system calls are most of what a request costs the gateway
// (docs/performance.md, twenty-ninth and fifty-ninth rounds).
//
// While the loop runs inside RawConn.Read the descriptor cannot be
// closed: net.Conn.Close would wait for the loop to leave, and the loop
// may be the caller. closeWith therefore shuts the socket down, which
// ends the loop's wait and reads, and the loop closes the socket as it
// leaves. readInPlace returns the error of a failed wait, nil when the
// loop ended inside.
func (c *Conn) readInPlace() error {
	src := &socketSource{skips: &c.readsSkipped}
	c.fr.inPlace = src
	c.inPlace.Store(true)
	defer func() {
		c.fr.inPlace = nil
		c.inPlace.Store(false)
		if c.isClosed() {
			_ = c.nc.Close() // closeWith only shut it down
		}
	}()
	first := true
	return c.rc.Read(func(fd uintptr) bool {
		src.fd = int(fd)
		src.ready = !first // every call but the first follows a wait
		first = false
		return !c.serveFrames()
	})
}

// unanswered notes that the frame just read gets no answer: reading in
// place, the read after it is tried before any wait (see socketSource).
func (c *Conn) unanswered() {
	if c.fr.inPlace != nil {
		c.fr.inPlace.unanswered = true
	}
}

// serveFrames reads and dispatches frames until the connection ends or,
// reading in place, until the socket has nothing more to read: it
// reports true then, and the caller waits for the socket.
func (c *Conn) serveFrames() (wait bool) {
	for {
		if !c.awaitRoom() {
			return false
		}
		line, err := c.fr.ReadFrame()
		if err == errWouldBlock {
			// Our own close shuts the socket down, and its wake-up may
			// have come with the bytes just read: it would not come again.
			return !c.isClosed()
		}
		if err != nil {
			// A request held is answered before a half-close drains; a
			// peer gone altogether is closed at once, whatever is held
			// (waiting for room here kept its requests running until one
			// of them ended).
			if c.held.Load() != nil && errors.Is(err, io.EOF) && !peerHungUp(c.nc) && c.waitRoom() {
				c.dispatchHeld()
			}
			c.readFailed(err)
			return false
		}
		// Classified where it was read, a request into c.req: what
		// outlives the next read is copied out below, and nothing else
		// is copied or allocated.
		m := classifyInto(line, &c.methods, &c.req)
		switch m.Kind {
		case KindRequest, KindNotification:
			req := m.Request
			if m.Kind == KindNotification {
				c.unanswered()
			}
			inline := c.opts.Inline != nil && c.opts.Inline(req.Method)
			req.inline = inline
			if !inline {
				// An inline request's handler returns before the next
				// read, and keeps nothing of the request (Options.Inline):
				// it is handled in c.req, its params and id read where
				// they came. Any other request's handler runs while later
				// frames are read into the same buffer, and later
				// requests classified into c.req.
				req = keep(req)
				var lease Lease
				req.Params, lease = c.own(line, req.Params)
				req.lease = lease
				if req.held = int64(cap(lease.buf)); req.held > 0 {
					c.heldFrames.Add(req.held)
				}
				// Answered off this loop, maybe much later (a read of a
				// hung service, a deferred status): no answer the peer
				// reads soon would wake the poller for an end of stream
				// that came with this frame, and a leaver's connection
				// was kept until that answer was written.
				c.unanswered()
			}
			if c.held.Load() != nil && c.hasRoom() {
				c.dispatchHeld()
			}
			reserved := false
			switch {
			case c.held.Load() == nil && c.reserve():
				reserved = true
			case inline:
				// Over the bounds, reading on for a call's answer: an
				// inline request runs now, one at a time on this loop, so
				// it keeps its order and exceeds the bound by at most one.
			case c.opts.Urgent != nil && c.opts.Urgent(req.Method) &&
				int(c.active.Load()) < c.opts.MaxInflightRequests+UrgentReserve:
				// It may end requests in flight (a cancel): past the
				// bound, by at most the reserve, rather than behind it.
			case c.held.CompareAndSwap(nil, req):
				continue
			default:
				// A second request while one is held: read nothing more
				// until both have room, the held one first (dispatched
				// here or by the handler whose end made the room).
				for c.held.Load() != nil {
					if !c.waitRoom() {
						return false
					}
					c.dispatchHeld()
				}
				for !c.reserve() {
					if !c.sleepForRoom() {
						return false
					}
				}
				reserved = true
			}
			c.dispatchIn(req, reserved)
			if inline {
				// Answered: nothing of its frame stays reachable from here.
				c.req = Request{}
			}
		case KindResponse:
			c.unanswered()
			// The caller keeps the result: out of the read buffer with it.
			r := m.Response
			frame, _ := c.fr.Own(line)
			r.Result = rebase(r.Result, line, frame)
			if r.Error != nil {
				r.Error.Data = rebase(r.Error.Data, line, frame)
			}
			c.deliver(r)
		default:
			if m.Reply != nil {
				c.log.Debug("invalid frame answered", zap.String("problem", m.Problem),
					zap.Int64("code", m.Reply.Error.Code))
				c.send(context.Background(), m.Reply)
			} else {
				c.unanswered()
				c.log.Warn("malformed response dropped", zap.String("problem", m.Problem))
			}
		}
	}
}

// keep moves a request the read loop classified into its connection's
// Request (classifyInto) into one of its own, with its id's text a string
// of its own: the same two allocations a request made before inline ones
// were classified in place.
func keep(r *Request) *Request {
	k := new(Request)
	*k = *r
	if r.ID != nil {
		k.ID = &k.id
	}
	if k.idView {
		k.id.text, k.idView = strings.Clone(k.id.text), false
	}
	return k
}

// own returns params, a slice of line (the frame ReadFrame has just
// returned), where they may be kept past the next read: in line's own
// buffer, handed over with its Lease, when the frame was assembled from
// blocks, else in a copy of line.
func (c *Conn) own(line, params []byte) ([]byte, Lease) {
	frame, lease := c.fr.Own(line)
	return rebase(params, line, frame), lease
}

// rebase returns the bytes of part, when it lies in from, at the same
// place in to (a copy of from, or from itself); anything else (nil, a
// constant such as emptyObject) as it is.
func rebase(part, from, to []byte) []byte {
	if len(part) == 0 || len(from) == 0 || cap(part) > cap(from) {
		return part
	}
	// A slice of from ends where from's buffer ends: its first byte is
	// from's byte at cap(from)-cap(part), past from's length if it lies
	// beyond it (then it is not in from).
	off := cap(from) - cap(part)
	if &from[:cap(from)][off] != &part[0] || off+len(part) > len(from) {
		return part
	}
	return to[off : off+len(part) : off+len(part)]
}

// hasRoom reports whether the read loop may take more work.
func (c *Conn) hasRoom() bool {
	return int(c.active.Load()) < c.opts.MaxInflightRequests && c.outq.Load() < int64(c.opts.MaxPendingBytes) &&
		c.heldFrames.Load() < c.maxHeldFrames()
}

// maxHeldFrames bounds the assembled frames a connection's requests in
// flight hold: two of the largest, so that one is always handled while
// the next is read.
func (c *Conn) maxHeldFrames() int64 { return 2 * int64(c.opts.MaxFrameBytes) }

// awaitRoom holds the read loop, before it reads a frame, while
// MaxInflightRequests are in flight or MaxPendingBytes of output are
// queued. It returns early, with the loop allowed to read, while an
// outgoing call waits for its answer: the answer may be behind requests in
// the stream, so the loop reads on and holds one request (c.held), which
// is dispatched as soon as there is room, by this loop or by the handler
// whose end makes the room. It reports false when the connection closed.
func (c *Conn) awaitRoom() bool {
	for {
		if c.hasRoom() {
			// With nothing held (all but always) there is nothing to
			// dispatch, and room need not be asked again.
			if c.held.Load() == nil {
				return true
			}
			c.dispatchHeld()
			if c.hasRoom() {
				return true
			}
			continue
		}
		if c.callsPending() || c.readsOn() {
			return true
		}
		if !c.sleepForRoom() {
			return false
		}
	}
}

// readsOn reports whether the loop, over its bounds, reads on all the
// same: when only the count of requests in flight is at its bound. A
// read loop that stopped there saw neither the peer's hang-up (its
// requests, a turn each, ran on for a client gone) nor a cancel, the one
// request that would make room. Reading on costs at most two requests
// held (serveFrames holds one and stops reading at the second, in
// sleepForRoom) besides responses and urgent requests, which are bounded
// by the calls pending and UrgentReserve. With output or assembled frames
// at their bounds it stops at once: the peer is not reading, or its
// frames are what is held.
func (c *Conn) readsOn() bool {
	return c.outq.Load() < int64(c.opts.MaxPendingBytes) && c.heldFrames.Load() < c.maxHeldFrames()
}

// dispatchHeld dispatches the held request, if any. Once the connection
// has closed it is dropped: its peer is gone, and the room it gets then
// is the room its cancelled fellows made as they ended. Closed is asked
// of the flag closeWith sets under c.mu, not of c.done: closeWith
// cancels the handlers before it closes done, and a handler ending on
// that cancel in between made the room that dispatched the held request
// (1 in 60 runs of TestHangUpAtBoundCancelsInflight under -race).
//
// It takes its place among the requests in flight first (reserve): the
// read loop and every handler ending may dispatch at once, and each one
// that saw room and then dispatched made the count pass its bound
// (9 and 10 of 8 in TestPipelineBackPressure, 2 runs in 150).
func (c *Conn) dispatchHeld() {
	if c.held.Load() == nil || !c.reserve() {
		return
	}
	h := c.held.Swap(nil)
	if h == nil {
		c.release()
		return
	}
	if c.isClosed() {
		c.release()
		c.heldFrames.Add(-h.held)
		h.held = 0
		h.returnLease() // nothing read its params
		return
	}
	c.dispatchIn(h, true)
}

// reserve takes a place among the requests in flight when the
// connection has room (hasRoom), in one step: checked, then taken, two
// dispatchers could both take the last place.
func (c *Conn) reserve() bool {
	for {
		n := c.active.Load()
		if int(n) >= c.opts.MaxInflightRequests || !c.readsOn() {
			return false
		}
		if c.active.CompareAndSwap(n, n+1) {
			c.notePeak(n + 1)
			return true
		}
	}
}

// release gives back a place among the requests in flight, ringing
// room when it is the one that brings the count below its bound.
func (c *Conn) release() {
	if n := int(c.active.Add(-1)); n < c.opts.MaxInflightRequests && n+1 >= c.opts.MaxInflightRequests {
		c.ringRoom()
	}
}

func (c *Conn) notePeak(n int32) {
	for p := c.peakActive.Load(); n > p && !c.peakActive.CompareAndSwap(p, n); p = c.peakActive.Load() {
	}
}

// waitRoom holds the read loop until there is room for one more request;
// false means the connection closed.
func (c *Conn) waitRoom() bool {
	for !c.hasRoom() {
		if !c.sleepForRoom() {
			return false
		}
	}
	return true
}

// sleepForRoom waits for a ring of room; false means the connection
// closed. The loop reads nothing meanwhile, so it would not see the peer
// hang up: on a Unix socket it polls for that (awaitPollingHangUp).
// Polling, not a wait in the runtime's poller: the loop may be inside the
// socket's RawConn.Read, where it cannot wait for readiness and for room
// at once, and the poll only runs while the loop is stopped, backing off
// to one a second.
func (c *Conn) sleepForRoom() bool {
	c.readGated.Store(true)
	defer c.readGated.Store(false)
	return c.awaitPollingHangUp(c.room, "closing connection: peer hung up while its reading waited for room")
}

// awaitHangUp holds Run, once the read loop has left with the
// connection still open, until it closes, polling the socket for the
// peer's hang-up meanwhile (awaitPollingHangUp). The loop leaves so
// after a half-close (the peer shut down its sending side: what it sent
// is answered, then the connection closes) or a limit's last answer.
// A peer that half-closes and then closes altogether is gone: reading
// would tell nothing more (the end of stream was read already), and
// its requests in flight, a prompt waiting on its turn, ran on for
// nobody until one of them ended and its answer's write failed. Seen
// now within hangupPollMax, as at the in-flight bound, it closes the
// connection, which cancels their contexts.
func (c *Conn) awaitHangUp() {
	select {
	case <-c.done:
		return // the common end: nothing to wait for, no timer
	default:
	}
	c.awaitPollingHangUp(nil, "closing connection: peer hung up after it finished sending")
}

// awaitPollingHangUp waits until wake is rung (never, for a nil wake) or
// the connection closes, and reports which: true for wake. On a Unix
// socket it polls meanwhile for the peer's hang-up (POLLHUP, which the
// kernel sets when the peer has closed, unread bytes or not, and not
// when it only shut down its sending side), and closes the connection
// when it sees one (logging msg), which cancels its handlers' contexts:
// the first look after hangupPollMin, then twice as long each time up
// to hangupPollMax, so that a wait of a moment costs no system call and
// a long one one a second. Only the read loop's goroutine (Run's) calls
// it: it owns hupTimer.
func (c *Conn) awaitPollingHangUp(wake <-chan struct{}, msg string) bool {
	if c.rc == nil {
		select {
		case <-wake:
			return true
		case <-c.done:
			return false
		}
	}
	every := hangupPollMin
	if c.hupTimer == nil {
		c.hupTimer = time.NewTimer(every)
	} else {
		c.hupTimer.Reset(every)
	}
	defer c.hupTimer.Stop()
	for {
		select {
		case <-wake:
			return true
		case <-c.done:
			return false
		case <-c.hupTimer.C:
			c.hupPolls.Add(1)
			if peerHungUp(c.nc) {
				c.log.Debug(msg)
				c.closeWith(ErrPeerClosed)
				return false
			}
			every = min(2*every, hangupPollMax)
			c.hupTimer.Reset(every)
		}
	}
}

func (c *Conn) ringRoom() {
	select {
	case c.room <- struct{}{}:
	default:
	}
}

func (c *Conn) callsPending() bool {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	return len(c.pending) > 0
}

func (c *Conn) readFailed(err error) {
	if c.isClosed() {
		return // the read failed because we closed
	}
	switch {
	case errors.Is(err, ErrFrameTooLarge):
		c.log.Warn("closing connection: frame too large", zap.Int("limit_bytes", c.opts.MaxFrameBytes))
		c.send(context.Background(), &Response{Error: NewError(CodeInvalidRequest, "Frame too large",
			json.RawMessage(`{"reason":"frame_too_large","limit_bytes":`+strconv.Itoa(c.opts.MaxFrameBytes)+`}`))})
		c.closeAfterFlush(ErrFrameTooLarge)
	case errors.Is(err, ErrFrameTimeout):
		ms := c.opts.FrameTimeout.Milliseconds()
		c.log.Warn("closing connection: frame timeout", zap.Int64("limit_ms", ms))
		c.send(context.Background(), &Response{Error: NewError(CodeInvalidRequest, "Frame timeout",
			json.RawMessage(`{"reason":"frame_timeout","limit_ms":`+strconv.FormatInt(ms, 10)+`}`))})
		c.closeAfterFlush(ErrFrameTimeout)
	case errors.Is(err, io.EOF) && !peerHungUp(c.nc):
		// The peer shut down its sending side only: answer what it sent.
		c.log.Debug("peer finished sending")
		c.drain(ErrPeerClosed)
	case errors.Is(err, io.EOF):
		c.closeWith(ErrPeerClosed)
	default:
		c.closeWith(fmt.Errorf("%w: %w", ErrPeerClosed, err))
	}
}

func (c *Conn) isClosed() bool { return c.closed.Load() }

// drain stops taking requests; once those in flight are answered and the
// output is written, the connection closes with reason.
func (c *Conn) drain(reason error) {
	c.hmu.Lock()
	if c.draining {
		c.hmu.Unlock()
		return
	}
	c.draining, c.drainWhy = true, reason
	idle := c.inflight == 0
	c.hmu.Unlock()
	if idle {
		c.closeAfterFlush(reason)
	}
}

// dispatchIn runs req; reserved says it holds its place among the
// requests in flight already (reserve), else it takes one past the
// bounds (an inline or urgent request).
func (c *Conn) dispatchIn(req *Request, reserved bool) {
	c.hmu.Lock()
	if c.draining {
		c.hmu.Unlock()
		if reserved {
			c.release()
		}
		if req.ID != nil {
			// Never blocking: dispatch also runs on goroutines that answer
			// other connections (a deferred reply dispatching a held
			// request).
			c.sendNoWait(&Response{ID: req.ID, Error: NewError(CodeInternal, "Server is shutting down", nil)})
		}
		c.heldFrames.Add(-req.held)
		req.held = 0
		req.returnLease() // nothing read its params
		return
	}
	c.inflight++
	c.hmu.Unlock()
	if !reserved {
		c.notePeak(c.active.Add(1))
	}
	if req.inline {
		c.handle(req)
		return
	}
	if dh, ok := c.h.(DeferredHandler); ok && c.opts.Deferred != nil && c.opts.Deferred(req.Method) {
		c.wg.Add(1)
		c.handleDeferred(dh, req)
		return
	}
	c.wg.Add(1)
	task := func() {
		defer c.wg.Done()
		c.handle(req)
	}
	if c.workers != nil {
		c.workers.run(task)
		return
	}
	go task()
}

func (c *Conn) handle(req *Request) {
	result, err := c.call(req)
	c.finish(req, result, err, false)
	// The answer is encoded (its id is a string of its own): a handler
	// that keeps nothing of the params leaves nothing referring to the
	// frame. Only a large frame has a lease: every other request skips
	// the method lookup.
	if req.lease.buf != nil && c.opts.ParamsDone != nil && c.opts.ParamsDone(req.Method) {
		req.returnLease()
	}
}

// handleDeferred hands req to dh; its reply finishes it (and the wg count
// dispatch took for it).
func (c *Conn) handleDeferred(dh DeferredHandler, req *Request) {
	var once atomic.Bool
	reply := func(result any, err error) {
		if !once.CompareAndSwap(false, true) {
			return
		}
		defer c.wg.Done()
		c.finish(req, result, err, true)
	}
	defer func() {
		if p := recover(); p != nil {
			c.log.Error("handler panicked", zap.String("method", req.Method), zap.Any("panic", p), zap.StackSkip("stack", 1))
			reply(nil, errHandlerPanic)
		}
	}()
	dh.HandleDeferred(c.ctx, c, req, reply)
}

// finish answers req with the handler's results and releases its place
// among the requests in flight; noWait sends the answer without ever
// blocking (see Reply).
func (c *Conn) finish(req *Request, result any, err error, noWait bool) {
	defer func() {
		c.release()
		if req.held > 0 {
			c.heldFrames.Add(-req.held)
			req.held = 0
			c.ringRoom()
		}
		if c.held.Load() != nil && c.hasRoom() {
			c.dispatchHeld() // the read loop may be blocked reading
		}
		c.hmu.Lock()
		c.inflight--
		idle := c.draining && c.inflight == 0
		why := c.drainWhy
		c.hmu.Unlock()
		if idle {
			c.closeAfterFlush(why)
		}
	}()
	if req.ID == nil {
		if err != nil {
			c.log.Debug("notification handler failed", zap.String("method", req.Method), zap.Error(err))
		}
		return
	}
	resp := &Response{ID: req.ID}
	if err == nil {
		resp.Result, err = marshalResult(result)
	}
	if err != nil {
		var e *Error
		if errors.As(err, &e) && e != nil {
			resp.Error = e
		} else {
			c.log.Warn("handler failed", zap.String("method", req.Method), zap.Error(err))
			resp.Error = &Error{Code: CodeInternal, Message: "Internal error"}
		}
		resp.Result = nil
	}
	if noWait {
		c.sendNoWait(resp)
		return
	}
	c.send(context.Background(), resp)
}

// call runs the handler, turning a panic into an error.
func (c *Conn) call(req *Request) (result any, err error) {
	defer func() {
		if p := recover(); p != nil {
			c.log.Error("handler panicked", zap.String("method", req.Method), zap.Any("panic", p), zap.StackSkip("stack", 1))
			result, err = nil, errHandlerPanic
		}
	}()
	return c.h.Handle(c.ctx, c, req)
}

var errHandlerPanic = errors.New("jsonrpc: handler panicked")

// EncodedJSON is a handler result already encoded as one compact, valid
// JSON value with no newline: it is written as it is. A json.RawMessage
// result is checked first; this one is the handler's word, for hot paths
// that assemble their reply from bytes they made themselves.
type EncodedJSON []byte

func marshalResult(v any) (json.RawMessage, error) {
	switch r := v.(type) {
	case nil:
		return json.RawMessage("null"), nil
	case EncodedJSON:
		if len(r) == 0 {
			return json.RawMessage("null"), nil
		}
		return json.RawMessage(r), nil
	case json.RawMessage:
		if len(r) == 0 {
			return json.RawMessage("null"), nil
		}
		if compactJSON(r) {
			return r, nil
		}
	}
	return json.Marshal(v)
}

// compactJSON reports whether b is valid JSON with no LF, fit to be sent
// as is.
func compactJSON(b []byte) bool {
	return bytes.IndexByte(b, '\n') < 0 && valid(b)
}

func marshalParams(params any) (json.RawMessage, error) {
	switch p := params.(type) {
	case nil:
		return nil, nil
	case json.RawMessage:
		if compactJSON(p) {
			return p, nil
		}
	}
	b, err := json.Marshal(params)
	if err != nil {
		return nil, fmt.Errorf("%w: params: %w", ErrInvalidFrame, err)
	}
	return b, nil
}

// deliver completes the pending call a response answers.
func (c *Conn) deliver(r *Response) {
	if r.ID == nil {
		c.log.Warn("response with id null ignored", zap.Bool("error", r.Error != nil))
		return
	}
	c.pmu.Lock()
	ch, ok := c.pending[*r.ID]
	if ok {
		delete(c.pending, *r.ID)
	}
	c.pmu.Unlock()
	if !ok {
		c.log.Warn("response for no pending request ignored", zap.String("id", logID(r.ID)))
		return
	}
	ch <- r
}

// logID bounds a peer-chosen id for a log field.
func logID(id *ID) string {
	s := id.String()
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

var scratchPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// send writes a response: directly from the calling goroutine when no
// other output is pending or being written (the common case, which spares
// a hand-off to the writer goroutine), else through the queue. Either way
// frames go out in the order they were sent. Only handler goroutines and
// the read loop send responses, so a stalled peer only ever blocks work of
// its own connection, and the write-stall deadline bounds even that.
func (c *Conn) send(ctx context.Context, r *Response) {
	bp, b := c.encodeResponse(r)
	if !c.writeDirect(b) {
		if err := c.enqueue(ctx, b); err != nil {
			c.log.Debug("response not sent", zap.Error(err))
		}
	}
	putScratch(bp, b)
}

// encodeResponse encodes r (without LF) into a scratch buffer, to be
// given back with putScratch; a result that cannot be encoded becomes an
// internal error.
func (c *Conn) encodeResponse(r *Response) (*[]byte, []byte) {
	bp := scratchPool.Get().(*[]byte)
	b, err := appendResponse((*bp)[:0], r)
	if err != nil {
		c.log.Error("response not encodable", zap.Error(err))
		b, _ = appendResponse((*bp)[:0], &Response{ID: r.ID, Error: &Error{Code: CodeInternal, Message: "Internal error"}})
	}
	return bp, b
}

// sendNoWait is send for a goroutine that must not block on this
// connection's peer (one answering the requests of many connections): it
// writes what the socket takes at once, and queues the rest, ahead of
// anything queued meanwhile, for the writer, whatever is already queued.
// The excess over MaxPendingBytes is bounded by the requests in flight,
// which the read loop bounds (and it reads nothing while output is over
// MaxPendingBytes).
func (c *Conn) sendNoWait(r *Response) {
	bp, b := c.encodeResponse(r)
	b = append(b, '\n')
	c.writeNoWait(b, true)
	putScratch(bp, b)
}

// TrySend sends n without ever blocking, when this connection's output
// is idle: one non-blocking write, and what the socket did not take
// queued for the writer ahead of anything queued after it. It reports
// false, having sent nothing, when output is being written or queued (or
// the connection cannot write without waiting, or is closed): the caller
// then sends n in order after that output, with SendAll. A fan-out
// goroutine serving many connections uses it to write an update at once,
// with no hand-off, and never waits on a slow peer.
func (c *Conn) TrySend(n Notification) bool {
	if n.size == 0 || c.writeNow == nil {
		return false
	}
	bp := scratchPool.Get().(*[]byte)
	b := append(n.appendTo((*bp)[:0]), '\n')
	ok := c.writeNoWait(b, false)
	putScratch(bp, b)
	return ok
}

// writeNoWait writes the LF-terminated lines b without blocking: what the
// socket takes at once when the output is idle, the rest queued for the
// writer ahead of anything queued meanwhile. When the output is busy it
// queues all of b if queueBusy, else it does nothing and reports false.
// The excess over MaxPendingBytes is one frame per caller: callers of
// sendNoWait are bounded by the requests in flight (the read loop reads
// nothing while output is over MaxPendingBytes), and TrySend queues only
// the rest of a write it began.
func (c *Conn) writeNoWait(b []byte, queueBusy bool) bool {
	c.wmu.Lock()
	if c.wclosed || c.flushClose {
		c.wmu.Unlock()
		return queueBusy
	}
	rest := b
	if c.writeNow != nil && !c.writing && len(c.wq) == 0 {
		c.writing = true
		c.wmu.Unlock()
		n, err := c.tryWrite(b)
		rest = b[n:]
		c.wmu.Lock()
		c.writing = false
		if err != nil {
			c.wmu.Unlock()
			c.log.Debug("closing connection: write failed", zap.Error(err))
			c.closeWith(fmt.Errorf("%w: %w", ErrPeerClosed, err))
			return true
		}
		if len(rest) == 0 {
			more := len(c.wq) > 0 || c.flushClose
			c.wmu.Unlock()
			if more {
				c.ring()
			}
			return true
		}
		if !c.admitsLocked(len(rest)) {
			c.wmu.Unlock()
			c.overBudget(len(rest))
			return true
		}
		// Frames queued while this one was being written go after it.
		c.wq = slices.Insert(c.wq, 0, rest...)
	} else if queueBusy {
		if !c.admitsLocked(len(rest)) {
			c.wmu.Unlock()
			c.overBudget(len(rest))
			return true
		}
		c.wq = append(c.wq, rest...)
	} else {
		c.wmu.Unlock()
		return false
	}
	c.charge(len(rest))
	c.wmu.Unlock()
	c.ring()
	return true
}

// admitsLocked reports whether the output budget lets this connection
// queue n more bytes; c.wmu is held.
func (c *Conn) admitsLocked(n int) bool {
	return c.opts.OutputBudget.Admits(c.outq.Load()+int64(c.waiting), int64(n))
}

// charge counts n bytes queued for the writer, against MaxPendingBytes
// and the output budget; c.wmu is held.
func (c *Conn) charge(n int) {
	c.outq.Add(int64(n))
	c.opts.OutputBudget.Charge(int64(n))
}

// overBudget closes the connection because queuing n more bytes for it
// would pass the output budget while it holds more than its share.
func (c *Conn) overBudget(n int) {
	c.log.Warn("closing connection: the output held for clients is over its bound and this connection holds more than its share",
		zap.Int64("held_bytes", c.outq.Load()), zap.Int("adding_bytes", n),
		zap.Int64("limit_bytes", c.opts.OutputBudget.Capacity()))
	c.closeWith(ErrOutputOverBudget)
}

// putScratch returns a scratch buffer to the pool, unless it grew large:
// the pool would keep a big reply's memory alive for nothing.
func putScratch(bp *[]byte, b []byte) {
	if cap(b) <= maxScratch {
		*bp = b
		scratchPool.Put(bp)
	}
}

const maxScratch = 64 << 10

// writeDirect writes frame (plus LF) on the calling goroutine if the
// output is idle, and reports whether it did (or the connection failed).
// frame must have room for the LF or be the caller's to grow.
func (c *Conn) writeDirect(frame []byte) bool {
	return c.writeLinesDirect(append(frame, '\n'))
}

// writeLinesDirect is writeDirect of frames already LF-terminated.
func (c *Conn) writeLinesDirect(lines []byte) bool {
	c.wmu.Lock()
	if c.writing || len(c.wq) > 0 || c.wclosed || c.flushClose {
		c.wmu.Unlock()
		return false
	}
	c.writing = true
	c.wmu.Unlock()
	err := c.writeAll(lines, false)
	c.wmu.Lock()
	c.writing = false
	more := len(c.wq) > 0 || c.flushClose
	c.wmu.Unlock()
	if err != nil {
		c.closeWith(err)
		return true
	}
	if more {
		c.ring()
	}
	return true
}

func (c *Conn) ring() {
	select {
	case c.wbell <- struct{}{}:
	default:
	}
}

// Notify sends a notification. Notifications are written in the order of
// the Notify calls that returned. Notify does not wait for the peer to read:
// it queues the frame and returns, unless more than
// Options.MaxPendingBytes are already queued, in which case it waits for
// room until ctx is done or the connection closes (a stalled peer is closed
// after Options.WriteStallTimeout). A caller fanning out to many
// connections should pass a short ctx.
func (c *Conn) Notify(ctx context.Context, method string, params any) error {
	raw, err := marshalParams(params)
	if err != nil {
		return err
	}
	bp := scratchPool.Get().(*[]byte)
	b := appendRequest((*bp)[:0], nil, method, raw)
	err = c.enqueue(ctx, b)
	putScratch(bp, b)
	return err
}

// Notification is one notification checked once, to be sent on any
// number of connections (a session update fanned out to every connection
// attached to the session): the params are checked and the frame measured
// once, not once per connection. It is immutable. It holds its method and
// params, not a frame: every send copies a frame into the connection's
// scratch buffer (to end it with an LF, or to join a batch) and builds it
// there, so an update costs the fan-out no frame of its own.
type Notification struct {
	method string
	params json.RawMessage // compact valid JSON, or empty for none; kept, not copied
	size   int             // the frame's length without its LF; 0 only in the zero Notification
}

// Len is the length of the encoded frame, without its LF.
func (n Notification) Len() int { return n.size }

// appendTo appends the frame, without its LF.
func (n Notification) appendTo(dst []byte) []byte {
	return appendRequest(dst, nil, n.method, n.params)
}

// EncodeNotification builds a notification of method with params (like
// Notify's: nil for none, a json.RawMessage taken as it is when compact
// and valid, anything else marshalled). A json.RawMessage taken as it is
// is kept, not copied: the caller must not change it afterwards.
func EncodeNotification(method string, params any) (Notification, error) {
	raw, err := marshalParams(params)
	if err != nil {
		return Notification{}, err
	}
	return newNotification(method, raw), nil
}

// EncodeRawNotification is EncodeNotification for params already
// encoded, as a session update's come off the bus: typed, so that
// passing them boxes nothing in an interface, and kept as they are (the
// bus message's own bytes), never copied into a frame of their own.
// Params that are not compact valid JSON take EncodeNotification's way
// (marshalled, or refused).
func EncodeRawNotification(method string, params json.RawMessage) (Notification, error) {
	if !compactJSON(params) {
		return EncodeNotification(method, params)
	}
	return newNotification(method, params), nil
}

// newNotification measures the frame appendRequest builds of method and
// params (compact valid JSON or empty).
func newNotification(method string, params json.RawMessage) Notification {
	size := len(`{"jsonrpc":"2.0","method":`) + jsonstr.Len(method) + len(`}`)
	if len(params) > 0 {
		size += len(`,"params":`) + len(params)
	}
	return Notification{method: method, params: params, size: size}
}

// SendAll sends ns in order. Like Notify it keeps the order of the calls
// that returned and waits for room past Options.MaxPendingBytes; unlike
// Notify, when nothing else is queued or being written it writes them on
// the calling goroutine (as responses are), in one write: a backlog of
// updates costs one system call and no hand-off to the writer goroutine.
// The caller must therefore be a goroutine this connection's peer may
// hold, up to Options.WriteStallTimeout: one serving this connection
// alone. Frames of other senders never come between them.
func (c *Conn) SendAll(ctx context.Context, ns []Notification) error {
	size := 0
	for _, n := range ns {
		if n.size == 0 {
			return fmt.Errorf("%w: empty notification", ErrInvalidFrame)
		}
		size += n.size + 1
	}
	if size == 0 {
		return nil
	}
	bp := scratchPool.Get().(*[]byte)
	b := slices.Grow((*bp)[:0], size)
	for _, n := range ns {
		b = append(n.appendTo(b), '\n')
	}
	defer putScratch(bp, b)
	if c.writeLinesDirect(b) {
		return c.writeErr()
	}
	// enqueue adds the LF of the last frame.
	return c.enqueue(ctx, b[:len(b)-1])
}

// writeErr is nil while the connection is open, else why it closed (a
// direct write that failed closed it).
func (c *Conn) writeErr() error {
	if c.isClosed() {
		return c.closedErr()
	}
	return nil
}

// Call sends a request with the id zc-out-<n> (n counting from 0 on this
// connection) and waits for its response. An explicit "result": null
// returns json.RawMessage("null"); an error reply returns the *Error. When
// ctx has no deadline, Options.CallTimeout applies (ErrCallTimeout). The
// connection closing fails the call with an error wrapping ErrClosed.
func (c *Conn) Call(ctx context.Context, method string, params any) (json.RawMessage, error) {
	raw, err := marshalParams(params)
	if err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok && c.opts.CallTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, c.opts.CallTimeout, ErrCallTimeout)
		defer cancel()
	}
	id := StringID("zc-out-" + strconv.FormatUint(c.seq.Add(1)-1, 10))
	ch := make(chan *Response, 1)
	c.pmu.Lock()
	if c.pending == nil {
		c.pmu.Unlock()
		return nil, c.closedErr()
	}
	c.pending[id] = ch
	c.pmu.Unlock()
	c.ringRoom() // a read loop holding back must read on for the answer
	forget := func() {
		c.pmu.Lock()
		delete(c.pending, id)
		c.pmu.Unlock()
	}

	b := appendRequest(make([]byte, 0, 64+len(method)+len(raw)), &id, method, raw)
	if err := c.enqueue(ctx, b); err != nil {
		forget()
		return nil, err
	}
	select {
	case r := <-ch:
		return callResult(r)
	case <-ctx.Done():
		forget()
		return nil, context.Cause(ctx)
	case <-c.done:
		select {
		case r := <-ch:
			return callResult(r)
		default:
			return nil, c.closedErr()
		}
	}
}

func callResult(r *Response) (json.RawMessage, error) {
	if r.Error != nil {
		return nil, r.Error
	}
	return r.Result, nil
}

// closedErr is the error for operations on a closed connection.
func (c *Conn) closedErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return wrapClosed(c.reason)
}

func wrapClosed(reason error) error {
	if reason == nil || errors.Is(reason, ErrClosed) {
		return ErrClosed
	}
	return fmt.Errorf("%w: %w", ErrClosed, reason)
}

// enqueue queues one encoded frame (without LF) for the writer.
func (c *Conn) enqueue(ctx context.Context, frame []byte) error {
	n := len(frame) + 1
	c.wmu.Lock()
	if q := len(c.wq) + c.wbusy; q > 0 && q+len(frame) > c.opts.MaxPendingBytes && !c.wclosed {
		// The peer is behind: the frame waits for room, held by its
		// sender, and counts against the output budget while it does
		// (64 replies in flight, each waiting, held four times what the
		// queue may).
		if !c.admitsLocked(n) {
			c.wmu.Unlock()
			c.overBudget(n)
			return c.closedErr()
		}
		c.waiting += n
		c.opts.OutputBudget.Charge(int64(n))
		err := c.awaitSpaceLocked(ctx, len(frame))
		c.waiting -= n
		c.opts.OutputBudget.Charge(-int64(n))
		if err != nil {
			c.wmu.Unlock()
			return err
		}
	}
	if c.wclosed || c.flushClose {
		c.wmu.Unlock()
		return c.closedErr()
	}
	if !c.admitsLocked(n) {
		c.wmu.Unlock()
		c.overBudget(n)
		return c.closedErr()
	}
	c.wq = append(c.wq, frame...)
	c.wq = append(c.wq, '\n')
	c.charge(n)
	c.wmu.Unlock()
	c.ring()
	return nil
}

// awaitSpaceLocked waits until a frame of size bytes fits in the output
// queue, or the queue is empty, or the connection closes; it fails when
// ctx ends. c.wmu is held when it is called and when it returns, and
// released while it waits.
func (c *Conn) awaitSpaceLocked(ctx context.Context, size int) error {
	for q := len(c.wq) + c.wbusy; q > 0 && q+size > c.opts.MaxPendingBytes && !c.wclosed; q = len(c.wq) + c.wbusy {
		if c.wspace == nil {
			c.wspace = make(chan struct{})
		}
		space := c.wspace
		c.wmu.Unlock()
		select {
		case <-space:
		case <-ctx.Done():
			c.wmu.Lock()
			return context.Cause(ctx)
		case <-c.done:
		}
		c.wmu.Lock()
	}
	return nil
}

// closeAfterFlush closes the connection with reason once the queued
// output is written (or the write stalls).
func (c *Conn) closeAfterFlush(reason error) {
	c.wmu.Lock()
	if !c.flushClose {
		c.flushClose, c.flushWhy = true, reason
	}
	c.wmu.Unlock()
	c.ring()
}

// writer writes queued output. Only it, or one writeDirect at a time
// (c.writing), writes to the socket.
func (c *Conn) writer() {
	defer close(c.writerDone)
	var spare []byte
	for {
		c.wmu.Lock()
		for len(c.wq) == 0 || c.writing {
			if len(c.wq) == 0 && !c.writing && c.flushClose {
				why := c.flushWhy
				c.wmu.Unlock()
				c.closeWith(why)
				return
			}
			c.wmu.Unlock()
			select {
			case <-c.wbell:
			case <-c.done:
				return
			}
			c.wmu.Lock()
		}
		out := c.wq
		c.wq = spare[:0]
		c.writing = true
		c.wbusy = len(out)
		c.wmu.Unlock()

		err := c.writeAll(out, true)
		c.wmu.Lock()
		c.writing = false
		c.wmu.Unlock()
		if err != nil {
			c.closeWith(err)
			return
		}
		if cap(out) <= 1<<20 {
			spare = out[:0]
		} else {
			spare = nil
		}
	}
}

// wrote accounts n bytes of the writer's batch as written: producers
// waiting for room, and the read loop, may go on.
func (c *Conn) wrote(n int) {
	c.wmu.Lock()
	c.wbusy -= n
	if c.wspace != nil {
		close(c.wspace)
		c.wspace = nil
	}
	c.wmu.Unlock()
	c.opts.OutputBudget.Charge(-int64(n))
	max := int64(c.opts.MaxPendingBytes)
	if q := c.outq.Add(-int64(n)); q < max && q+int64(n) >= max {
		c.ringRoom()
	}
}

// writeAll writes b for the goroutine holding the output (c.writing);
// queued says b is the writer's batch, whose progress is accounted with
// wrote. It fails with ErrWriteStall when the peer reads
// nothing for WriteStallTimeout while b is pending (see stallWatch).
//
// Where the kernel's queue is seen, a chunk is first written without
// waiting: on the path every connection takes (the socket has room) that
// is one write and no deadline, and a write that falls short is the
// moment output begins to wait, which starts the rule's clock.
func (c *Conn) writeAll(b []byte, queued bool) error {
	limit := c.opts.WriteStallTimeout
	var queue func() (int, bool)
	if limit > 0 {
		queue = c.kernelQueue()
	}
	first := queue != nil && c.writeNow != nil
	var w stallWatch
	for len(b) > 0 {
		chunk := b[:min(len(b), maxWriteChunk)]
		if first && !w.watching {
			n, err := c.tryWrite(chunk)
			b = b[n:]
			if queued && n > 0 {
				c.wrote(n)
			}
			if err != nil {
				return c.writeFailed(err)
			}
			if n < len(chunk) {
				w.start(time.Now(), c.sent, queue)
			}
			continue
		}
		if limit > 0 {
			_ = c.nc.SetWriteDeadline(w.deadline(time.Now(), limit, queue != nil))
			c.deadlineSet = true
		}
		n, err := c.nc.Write(chunk)
		b = b[n:]
		c.sent += int64(n)
		if queued && n > 0 {
			c.wrote(n)
		}
		timedOut := errors.Is(err, os.ErrDeadlineExceeded)
		if err != nil && !timedOut {
			return c.writeFailed(err)
		}
		if limit <= 0 || (!timedOut && !w.watching) {
			continue // the socket took it all
		}
		if w.stalled(time.Now(), limit, n, c.sent, queue) {
			c.log.Warn("closing connection: write stalled", zap.Duration("limit", limit))
			return ErrWriteStall
		}
	}
	return nil
}

// writeFailed maps a failed write's error: ErrClosed when this side
// closed the connection, else the peer's end.
func (c *Conn) writeFailed(err error) error {
	if c.isClosed() {
		return ErrClosed
	}
	return fmt.Errorf("%w: %w", ErrPeerClosed, err)
}

// tryWrite is one non-blocking write of b (writeNow), for a caller that
// holds the output: it returns what the socket took at once.
func (c *Conn) tryWrite(b []byte) (int, error) {
	if c.deadlineSet {
		// A deadline writeAll left behind would fail the write once past.
		_ = c.nc.SetWriteDeadline(time.Time{})
		c.deadlineSet = false
	}
	n, err := c.writeNow(b)
	c.sent += int64(n)
	return n, err
}

// kernelQueue returns the function reading how many bytes the kernel holds
// for the peer, or nil where there is none (see sendQueue).
func (c *Conn) kernelQueue() func() (int, bool) {
	if !c.kqResolved {
		c.kq, c.kqResolved = sendQueue(c.nc), true
	}
	return c.kq
}

// stallWatch applies the write-stall rule to one writeAll: the connection
// is cut when, with output pending, the peer has read nothing for the
// limit.
//
// Progress is measured from the reader's side. Where the kernel reports
// the bytes queued for the peer (SIOCOUTQ on a Linux Unix socket), the
// watch samples sent - queued, which only the peer's reads raise (our
// writes add at least as much to queued as to sent); a rise is progress.
// The first sample is taken the moment a write first falls short (a
// write without waiting, see writeAll), and starts the clock: output
// waits from then on. It was taken once a write had blocked for a tick,
// which cut a peer that never read a tick (up to 1 s) past the limit.
// Later writes block for at most a tick, so a read is seen within a tick
// of happening and a stall is cut at the limit after the last one seen:
// within limit + tick (tick at most 1 s) of the peer's last read, and at
// the limit after output first waited for a peer that read none of it.
// Output the kernel took while the socket had room does not start the
// clock: it waits in the peer's buffer, not here, and a peer that leaves
// a reply unread while it is idle is not stalled. Bytes the kernel accepted into its buffer are never taken for
// the peer's progress: they were, and a peer that read nothing was cut at
// twice the limit. The kernel frees the peer's bytes a buffer (about
// 32 KiB) at a time, so a peer must take that much per limit to count as
// reading.
//
// Elsewhere the rule is the portable one: a write that has moved no byte
// for the limit is a stall.
type stallWatch struct {
	watching bool
	best     int64     // the highest sent - queued seen
	since    time.Time // when best was last raised, or the clock started
}

// stallTick is how long a write blocks between two samples.
func stallTick(limit time.Duration) time.Duration {
	return min(max(limit/8, 10*time.Millisecond), time.Second)
}

func (w *stallWatch) deadline(now time.Time, limit time.Duration, sampled bool) time.Time {
	if !sampled {
		return now.Add(limit)
	}
	d := now.Add(stallTick(limit))
	if w.watching {
		if end := w.since.Add(limit); end.Before(d) {
			d = end
		}
	}
	return d
}

// start takes the first sample, at the moment a write fell short with
// sent bytes written in all.
func (w *stallWatch) start(now time.Time, sent int64, queue func() (int, bool)) {
	w.watching, w.since = true, now
	if q, ok := queue(); ok {
		w.best = sent - int64(q)
	}
}

// stalled takes a sample after a write that moved n bytes (sent in all)
// and reports whether the peer has read nothing for the limit.
func (w *stallWatch) stalled(now time.Time, limit time.Duration, n int, sent int64, queue func() (int, bool)) bool {
	if queue != nil {
		if q, ok := queue(); ok {
			read := sent - int64(q)
			switch {
			case !w.watching:
				w.watching, w.best, w.since = true, read, now
			case read > w.best:
				w.best, w.since = read, now
			}
			return now.Sub(w.since) >= limit
		}
	}
	// No kernel figure: a write that moved nothing in its whole window.
	return n == 0
}

// closeSocket closes the socket or, while the read loop reads it in
// place, shuts it down: the loop closes it as it leaves (readInPlace).
// closeWith marks the connection closed before it calls this, and
// readInPlace clears inPlace before it looks at that mark, so one of the
// two closes the socket.
func (c *Conn) closeSocket() {
	if c.inPlace.Load() {
		shutdownSocket(c.rc)
		return
	}
	_ = c.nc.Close()
}

// closeWith closes the connection once, recording reason.
func (c *Conn) closeWith(reason error) {
	if reason == nil {
		reason = ErrClosed
	}
	c.mu.Lock()
	if c.closed.Load() {
		c.mu.Unlock()
		return
	}
	c.closed.Store(true)
	c.reason = reason
	cancel := c.cancel
	c.mu.Unlock()

	if c.initTimer != nil {
		c.initTimer.Stop()
	}
	// Writes stop before handlers are cancelled: a handler that returns on
	// its cancelled context must find nothing to write to (the initialize
	// deadline closes with no reply).
	c.wmu.Lock()
	c.wclosed = true
	c.wq = nil
	if c.wspace != nil {
		close(c.wspace)
		c.wspace = nil
	}
	c.wmu.Unlock()
	c.closeSocket()
	if cancel != nil {
		cancel(wrapClosed(reason))
	}
	close(c.done)

	c.pmu.Lock()
	c.pending = nil
	c.pmu.Unlock()
}
