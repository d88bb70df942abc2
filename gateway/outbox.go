package gateway

import (
	"context"
	"encoding/json"
	"sync"
	"unsafe"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/bus"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
)

// outbox delivers session updates to one connection, in arrival order.
// While it holds nothing and the connection's output is idle, the fan-out
// writes an update itself, without waiting (push); otherwise the outbox's
// own goroutine writes what is queued, so a connection that stops reading
// blocks only its own outbox until the edge's write-stall rule closes it.
// Nothing is ever dropped from the middle of a stream: a connection whose
// backlog passes maxOutboxBytes (it reads far slower than its sessions
// produce) is closed instead, like a stalled one, and its turns are
// cancelled.
type outbox struct {
	ctx   context.Context // the gateway's serving context
	cs    *connState
	g     *Gateway
	mu    sync.Mutex
	cond  *sync.Cond
	q     []queued
	bytes int  // memory the updates in q hold: see entryBytes
	busy  bool // run is delivering a batch
	done  bool
	// written counts the updates written to the connection: a prompt
	// waiting for its turn_complete sees the stream ahead of it move.
	written uint64

	// completed records the turn_ids whose turn_complete was written, so a
	// session/prompt response never overtakes its own turn_complete. The
	// connection sees the turns of every session it attached to, not only
	// its own prompts, so a turn_complete is recorded only while a prompt
	// of the connection on its session is in flight (prompting, counted
	// by session): only such a prompt can come to collect it, and a
	// prompt's turn_complete is written after its start. The entries of a
	// session (bySession) go when its last prompt ends. Remembering the
	// last 64 turn_completes of the connection instead, whoever's, lost a
	// prompt's own behind those of the other turns of the sessions it
	// followed that ended before its answer came: it waited in vain, and
	// the connection was closed as one whose updates were lost.
	completed map[string]chan struct{}
	prompting map[string]int
	bySession map[string][]string

	// asks are the elicitations put to the client and not yet answered,
	// by session, each with what cancels it. An approval decided elsewhere
	// (session/approve, the phone, its timeout) left its elicitation
	// waiting for the client for up to the approval's timeout (a day at
	// most), a goroutine and a pending call each: it ends with its turn
	// now, and at most maxAsks are open at once.
	asks   map[string]map[uint64]context.CancelFunc
	nasks  int
	askSeq uint64
}

// maxAsks bounds the elicitations open on one connection; an approval
// past it is not put to the client, which may still decide it with
// session/approve.
const maxAsks = 64

// maxRecentTurns bounds the completions remembered for the prompts in
// flight on one session to collect, the oldest dropped past it. A session
// runs one turn at a time: it takes that many turns, each admitted and
// ended, between a prompt's turn_complete and its answer to drop the
// prompt's own (the prompt then waits out turnCompleteWait and closes
// the connection, as for a turn_complete lost).
const maxRecentTurns = 64

// maxOutboxBytes bounds the memory the updates queued for one connection
// hold (entryBytes), beside the engine's own output queue
// (jsonrpc.DefaultMaxPendingBytes).
const maxOutboxBytes = 32 << 20

// Every outbox is bounded alone, but 512 connections that follow busy
// sessions and read nothing could hold 512 times maxOutboxBytes: the
// updates queued count against the gateway's output budget
// (rpc.max_buffered_output_bytes, shared with the connections' output
// queues), and past it a connection holding more than
// jsonrpc.FairOutputShare of updates is closed as one past its own bound
// is, while the connections holding little keep theirs.

// outboxEntryOverhead is what a queued update holds beside its JSON,
// charged with it so that the bound is on memory held, not on JSON alone
// (a backlog of streamed chunks of about 140 B of JSON held 2.3 times the
// bound): the entry's slot in the queue (unsafe.Sizeof(queued{}), 128 B),
// the room the queue's array grows into ahead of it (up to a quarter
// more), and the rest of the bus message the JSON is cut from (its
// session id, type and seq, rounded up to the allocator's size class).
// Measured by TestOutboxBoundIsOnMemoryHeld: 171 B an update beside
// 169 B of JSON (0.80 times the bound held in all).
const outboxEntryOverhead = 2 * int(unsafe.Sizeof(queued{}))

// entryBytes is what queuing u is charged against maxOutboxBytes.
func entryBytes(u bus.Update) int { return len(u.JSON) + outboxEntryOverhead }

func newOutbox(ctx context.Context, g *Gateway, cs *connState) *outbox {
	o := &outbox{ctx: ctx, cs: cs, g: g, completed: map[string]chan struct{}{}, prompting: map[string]int{},
		bySession: map[string][]string{}, asks: map[string]map[uint64]context.CancelFunc{}}
	o.cond = sync.NewCond(&o.mu)
	return o
}

// queued is one update and its notification, checked once by the hub for
// every connection it goes to.
type queued struct {
	u bus.Update
	n jsonrpc.Notification
}

func (o *outbox) push(u bus.Update, n jsonrpc.Notification) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.done {
		return
	}
	e := entryBytes(u)
	if o.bytes+e > maxOutboxBytes {
		o.g.log.Warn("closing connection: session updates backlog over its bound",
			zap.String("conn", o.cs.id), zap.Int("limit_bytes", maxOutboxBytes))
		o.abandonLocked()
		return
	}
	if !o.g.output.Admits(int64(o.bytes), int64(e)) {
		o.g.log.Warn("closing connection: the output held for clients is over its bound and this connection's session updates backlog holds more than its share",
			zap.String("conn", o.cs.id), zap.Int("held_bytes", o.bytes), zap.Int64("limit_bytes", o.g.output.Capacity()))
		o.abandonLocked()
		return
	}
	if len(o.q) == 0 && !o.busy && o.cs.conn.TrySend(n) {
		// The connection's output was idle: written (or handed to its
		// writer) on this goroutine, with no wake-up of run. Under o.mu,
		// so an update pushed next cannot overtake it.
		o.sent(u)
		return
	}
	o.q = append(o.q, queued{u, n})
	o.bytes += e
	o.g.output.Charge(int64(e))
	o.cond.Signal()
}

// cut closes the connection because its stream of session updates would
// have a hole in it (updates lost on the bus): it is never fed one.
// What is queued is abandoned, as when the backlog passes its bound;
// like any disconnect, the connection's turns are cancelled. msg is the
// static reason logged with the connection's id and fields.
func (o *outbox) cut(msg string, fields ...zap.Field) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.done {
		return
	}
	o.g.log.Warn(msg, append(fields, zap.String("conn", o.cs.id))...)
	o.abandonLocked()
}

// abandonLocked drops what is queued, stops run and closes the
// connection; o.mu is held.
func (o *outbox) abandonLocked() {
	o.g.output.Charge(-int64(o.bytes))
	o.done, o.q, o.bytes = true, nil, 0
	o.cond.Broadcast()
	o.g.spawn(func() { _ = o.cs.conn.Close() }) // not under o.mu
}

// progress returns the updates written to the connection so far and
// whether any wait in the queue or in a write now.
func (o *outbox) progress() (written uint64, pending bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.written, len(o.q) > 0 || o.busy
}

// ended reports whether the outbox stopped: its connection is closed or
// being closed.
func (o *outbox) ended() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.done
}

// close stops run after the queue is abandoned (the connection is gone).
func (o *outbox) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.done = true
	if o.g != nil {
		o.g.output.Charge(-int64(o.bytes))
	}
	o.q, o.bytes = nil, 0
	o.cond.Broadcast()
	for _, ch := range o.completed {
		select {
		case <-ch:
		default:
			close(ch)
		}
	}
}

// turnDone returns a channel closed once the turn's turn_complete has been
// written to the connection (or the connection is gone).
func (o *outbox) turnDone(turnID string) <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	ch, ok := o.completed[turnID]
	if !ok {
		ch = make(chan struct{})
		if o.done {
			close(ch)
		}
		o.completed[turnID] = ch
	}
	return ch
}

func (o *outbox) forgetTurn(turnID string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.completed, turnID)
}

// promptBegins and promptEnds bracket a prompt of the connection on the
// session: while one is in flight, the session's turn_completes are
// recorded for it to collect (see completed).
func (o *outbox) promptBegins(sessionID string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.prompting[sessionID]++
}

func (o *outbox) promptEnds(sessionID string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.prompting[sessionID] > 1 {
		o.prompting[sessionID]--
		return
	}
	delete(o.prompting, sessionID)
	for _, turn := range o.bySession[sessionID] {
		delete(o.completed, turn)
	}
	delete(o.bySession, sessionID)
}

// maxBatchBytes bounds the frames run takes off the queue to write at
// once; maxKeptBatch bounds the slots of a batch's array run keeps.
const (
	maxBatchBytes = 256 << 10
	maxKeptBatch  = 1024
)

func (o *outbox) run() {
	var batch []queued
	var frames []jsonrpc.Notification
	for {
		o.mu.Lock()
		o.busy = false
		for len(o.q) == 0 && !o.done {
			o.cond.Wait()
		}
		if o.done {
			o.mu.Unlock()
			return
		}
		// Everything queued meanwhile goes out in one write, up to
		// maxBatchBytes of frames (at least one update). size counts what
		// o.bytes counted (entryBytes).
		size, frameBytes, n := 0, 0, 0
		for n < len(o.q) && (n == 0 || frameBytes+o.q[n].n.Len() <= maxBatchBytes) {
			size += entryBytes(o.q[n].u)
			frameBytes += o.q[n].n.Len()
			n++
		}
		if n == len(o.q) {
			batch, o.q = o.q, batch[:0] // the two arrays take turns
		} else {
			batch = append(batch[:0], o.q[:n]...)
			clear(o.q[:n])
			o.q = o.q[n:]
		}
		o.bytes -= size
		o.g.output.Charge(-int64(size))
		o.busy = true
		o.mu.Unlock()
		frames = frames[:0]
		for _, q := range batch {
			frames = append(frames, q.n)
		}
		o.deliver(batch, frames)
		clear(batch)
		clear(frames)
		if cap(batch) > maxKeptBatch {
			batch, frames = nil, nil // a backlog's arrays are not kept
		}
	}
}

// deliver writes a batch of updates, in order. SendAll writes it on this
// goroutine when the connection's output is idle (the common case: no
// hand-off to the writer goroutine); the outbox serves this connection
// alone, so a peer that stops reading holds only its own outbox, until
// the write-stall rule closes it.
func (o *outbox) deliver(batch []queued, frames []jsonrpc.Notification) {
	if err := o.cs.conn.SendAll(o.ctx, frames); err != nil {
		o.g.log.Debug("update not delivered", zap.String("conn", o.cs.id), zap.Error(err))
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, q := range batch {
		o.sent(q.u)
	}
}

// sent does what follows an update's writing to the connection: an
// approval request is put to the client, a turn_complete wakes the
// prompt waiting for it. o.mu is held.
func (o *outbox) sent(u bus.Update) {
	o.written++
	switch u.Type {
	case busv1.UpdateType_UPDATE_TYPE_APPROVAL_REQUEST:
		if o.cs.canElicit() && !settledAsk(u) {
			o.ask(u)
		}
	case busv1.UpdateType_UPDATE_TYPE_TURN_COMPLETE:
		var tc struct {
			TurnID string `json:"turn_id"`
		}
		if o.prompting[u.SessionID] > 0 && json.Unmarshal(u.JSON, &tc) == nil && tc.TurnID != "" {
			o.markCompleted(u.SessionID, tc.TurnID)
		}
		// A session runs one turn at a time: its approvals ended with it.
		for _, cancel := range o.asks[u.SessionID] {
			cancel()
		}
	}
}

// settledAsk reports whether approval request u says the decision that
// settled it: the session service sends an ask again (Resend) with its
// decision once it has one, and a client asked for it would answer
// what nobody can change any more.
func settledAsk(u bus.Update) bool {
	var ar struct {
		Decision string `json:"decision"`
	}
	return json.Unmarshal(u.JSON, &ar) == nil && ar.Decision != ""
}

// ask puts the approval u requests to the client, within maxAsks; o.mu is
// held.
func (o *outbox) ask(u bus.Update) {
	if o.nasks >= maxAsks {
		o.g.log.Warn("approval not put to the client: too many open", zap.String("conn", o.cs.id),
			zap.String("session_id", u.SessionID), zap.Int("open", o.nasks))
		return
	}
	ctx, cancel := context.WithCancel(o.ctx)
	o.askSeq++
	id := o.askSeq
	if o.asks[u.SessionID] == nil {
		o.asks[u.SessionID] = map[uint64]context.CancelFunc{}
	}
	o.asks[u.SessionID][id] = cancel
	o.nasks++
	o.g.spawn(func() {
		defer func() {
			cancel()
			o.mu.Lock()
			delete(o.asks[u.SessionID], id)
			if len(o.asks[u.SessionID]) == 0 {
				delete(o.asks, u.SessionID)
			}
			o.nasks--
			o.mu.Unlock()
		}()
		o.g.elicitApproval(ctx, o.cs, u)
	})
}

// markCompleted records that the turn_complete of turnID, a turn of the
// session, was written, waking a prompt waiting for it; o.mu is held and
// a prompt of the connection on the session is in flight.
func (o *outbox) markCompleted(sessionID, turnID string) {
	ch, ok := o.completed[turnID]
	if !ok {
		ch = make(chan struct{})
		o.completed[turnID] = ch
		kept := append(o.bySession[sessionID], turnID)
		if len(kept) > maxRecentTurns {
			delete(o.completed, kept[0])
			kept = kept[1:]
		}
		o.bySession[sessionID] = kept
	}
	select {
	case <-ch:
	default:
		close(ch)
	}
}
