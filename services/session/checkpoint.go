package session

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/pg"
)

// Checkpoint batching. A running turn's events (message text coalesced,
// thoughts, tool calls and results, see store_durable.go) are written by
// one writer for the whole process: every CheckpointInterval (default
// 100 ms) after the first pending event, or at once when a turn has
// CheckpointBytes (default 4 KiB) pending, whatever the number of running
// turns, in one transaction. A tool call, its result and a turn's end are
// written right away, with the events before them, in the transaction
// that records them. So the write rate is bounded (about ten batches a
// second under streaming) and a crash loses at most the last batch. The
// marks of the updates published after their event was written (a tool
// call, its result, an approval request, a trim notice) go with the next
// batch too, added to the turn's last event when no event is pending to
// carry them (turnLog.mark): at most one more statement in a batch.
const (
	DefaultCheckpointInterval = 100 * time.Millisecond
	DefaultCheckpointBytes    = 4 << 10
)

// checkpointer is the process's one checkpoint writer.
type checkpointer struct {
	db       *pgxpool.Pool
	log      *zap.Logger
	interval time.Duration
	maxBytes int
	timeout  time.Duration

	// writeMu is held while a batch is written, so the events of a turn
	// land in the order of their numbers.
	writeMu sync.Mutex

	// mu guards logs: the turns that are running.
	mu   sync.Mutex
	logs map[*turnLog]struct{}

	// Kept from one batch to the next, under writeMu (see flush): the
	// running turns, their events taken, where each turn's end in them,
	// and the statement's columns.
	running []*turnLog
	events  []cpEvent
	ends    []int
	cols    eventColumns
	// lone are the marks of running[i] taken without an event to carry
	// them (takeLoneMarks), by i, with the event they go to.
	lone []loneMarks

	wake, urgent chan struct{}
	stop         chan struct{}
	done         chan struct{}
}

func newCheckpointer(st *store, log *zap.Logger, interval time.Duration, maxBytes int, timeout time.Duration) *checkpointer {
	c := &checkpointer{
		db: st.db, log: log, interval: interval, maxBytes: maxBytes, timeout: timeout,
		logs: map[*turnLog]struct{}{},
		wake: make(chan struct{}, 1), urgent: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	go c.run()
	return c
}

// turnLog is one running turn's pending checkpoint events. The turn's
// goroutine adds to it; the writer takes from it.
type turnLog struct {
	cp                         *checkpointer
	sessionID, turnID, surface string

	mu      sync.Mutex
	nextSeq int64
	pending []pendingEvent
	bytes   int
	// streamedSeq is the update seq of the last streamed chunk in the
	// log (pending or written), takenSeq its value when the log was last
	// taken: a reader of the written events knows which chunk updates
	// they hold (TurnEvents' covered_seq).
	streamedSeq, takenSeq int64
	// marks is where the updates published since the last take live
	// (see turn.mapUpdate), packed as update_marks (migration 0017)
	// holds them: a take hands them to its last event, so that a turn
	// cut by a crash has its marks up to its last batch. marksOff is set
	// once the turn's map is not whole; a mark of -1s says so.
	marks    []byte
	marksOff bool
}

// pendingEvent is an event not written yet; streamed text is appended to
// data until the batch is taken.
type pendingEvent struct {
	cpEvent
	data []byte
}

// open starts the log of a turn whose next event is numbered next.
func (c *checkpointer) open(sessionID, turnID, surface string, next int64) *turnLog {
	l := &turnLog{cp: c, sessionID: sessionID, turnID: turnID, surface: surface, nextSeq: next}
	c.mu.Lock()
	c.logs[l] = struct{}{}
	c.mu.Unlock()
	return l
}

// close forgets a finished turn's log; what is still pending is dropped
// (a turn's end writes it first).
func (c *checkpointer) close(l *turnLog) {
	c.mu.Lock()
	delete(c.logs, l)
	c.mu.Unlock()
}

// closeTaking is close for a turn whose end's write failed: it returns
// the events still pending, those the write carried. Under writeMu, so
// that no batch taken from l before is put back after.
func (c *checkpointer) closeTaking(l *turnLog) []cpEvent {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.close(l)
	return l.take()
}

// stream adds streamed text (or a thought) of a step, coalesced with the
// pending text before it; seq is its update's (0: not published). It
// returns the event that holds the text and the offset the text ends at
// in its content.
func (l *turnLog) stream(step int, thought bool, text string, seq int64) (event int64, end int) {
	kind := eventText
	if thought {
		kind = eventThought
	}
	l.mu.Lock()
	first := len(l.pending) == 0
	if n := len(l.pending); n > 0 && l.pending[n-1].Kind == kind && l.pending[n-1].Step == step {
		l.pending[n-1].data = append(l.pending[n-1].data, text...)
		p := &l.pending[n-1]
		event, end = p.Seq, len(p.Content)+len(p.data)
	} else {
		// A slot a taken batch left keeps its text's buffer (see take):
		// a stream's batches cost no buffer grown anew each time.
		var buf []byte
		if n < cap(l.pending) {
			buf = l.pending[:n+1][n].data[:0]
		}
		l.pending = append(l.pending, pendingEvent{cpEvent: l.event(step, kind), data: append(buf, text...)})
		event, end = l.nextSeq-1, len(text)
	}
	// Marked with its text: a batch that holds the text holds its mark.
	l.markLocked(seq, event, end)
	l.bytes += len(text)
	if seq > 0 {
		l.streamedSeq = seq
	}
	full := l.bytes >= l.cp.maxBytes
	l.mu.Unlock()
	switch {
	case full:
		signal(l.cp.urgent)
	case first:
		signal(l.cp.wake)
	}
	return event, end
}

// add appends one event (a tool call or result) to the pending ones and
// returns its seq; the caller writes it with write.
func (l *turnLog) add(e cpEvent) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	ev := l.event(e.Step, e.Kind)
	ev.Content, ev.CallID, ev.ToolCallID, ev.Name = e.Content, e.CallID, e.ToolCallID, e.Name
	l.pending = append(l.pending, pendingEvent{cpEvent: ev})
	l.bytes += len(e.Content)
	return ev.Seq
}

// mark records that update seq lives in event, ending at end of its
// content for a chunk (-1 for a tool call or result). A mark with no
// event pending to carry it (a tool call's or result's, an approval
// request's, a trim notice's: their events were written before they were
// published) wakes the writer, which stores it alone (takeLoneMarks):
// else it waited in memory for the turn's next event, and a crash while
// the tool ran or the approval waited lost the place of those updates.
func (l *turnLog) mark(seq, event int64, end int) {
	l.mu.Lock()
	l.markLocked(seq, event, end)
	lone := len(l.pending) == 0 && len(l.marks) > 0
	l.mu.Unlock()
	if lone {
		signal(l.cp.wake)
	}
}

// takeLoneMarks removes and returns the marks pending while no event is,
// and the event they are to be added to: the turn's last, which an
// earlier batch wrote (c.writeMu, held, orders the writes). nil when an
// event is pending (it carries them) or no mark is.
func (l *turnLog) takeLoneMarks() (event int64, marks []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.pending) > 0 || len(l.marks) == 0 {
		return 0, nil
	}
	marks = append([]byte(nil), l.marks...)
	l.marks = l.marks[:0]
	return l.nextSeq - 1, marks
}

// putBackMarks returns marks a failed write took, ahead of those made
// since.
func (l *turnLog) putBackMarks(marks []byte) {
	if len(marks) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.marks = append(marks, l.marks...)
}

// markLocked is mark; l.mu is held.
func (l *turnLog) markLocked(seq, event int64, end int) {
	if l.marksOff || seq == 0 && end < 0 {
		return
	}
	l.marks = appendMark(l.marks, seq, event, int64(end))
}

// stopMarks records that the turn's map is no longer whole: no mark
// follows.
func (l *turnLog) stopMarks() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.marksOff {
		l.marks, l.marksOff = appendMark(l.marks, -1, -1, -1), true
	}
}

// tailMarks removes and returns the marks no take handed to an event.
func (l *turnLog) tailMarks() []int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := unpackMarks(l.marks)
	l.marks = l.marks[:0]
	return m
}

// appendMark appends a mark, three little-endian int64s.
func appendMark(b []byte, seq, event, end int64) []byte {
	b = binary.LittleEndian.AppendUint64(b, uint64(seq))
	b = binary.LittleEndian.AppendUint64(b, uint64(event))
	return binary.LittleEndian.AppendUint64(b, uint64(end))
}

// unpackMarks appends the numbers of packed marks to a map (see
// turn.updates).
func unpackMarks(b []byte) []int64 {
	m := make([]int64, 0, len(b)/8)
	for ; len(b) >= 8; b = b[8:] {
		m = append(m, int64(binary.LittleEndian.Uint64(b)))
	}
	return m
}

// event numbers a new event; l.mu is held.
func (l *turnLog) event(step int, kind string) cpEvent {
	e := cpEvent{SessionID: l.sessionID, Seq: l.nextSeq, TurnID: l.turnID, Step: step, Kind: kind, Surface: l.surface, At: time.Now()}
	l.nextSeq++
	return e
}

// take removes and returns the pending events.
func (l *turnLog) take() []cpEvent { return l.takeInto(nil) }

// takeInto removes the pending events and appends them to dst.
func (l *turnLog) takeInto(dst []cpEvent) []cpEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	dst = slices.Grow(dst, len(l.pending))
	first := len(dst)
	for _, p := range l.pending {
		e := p.cpEvent
		switch {
		case p.data == nil:
		case p.Content == "":
			e.Content = string(p.data)
		default:
			// A text event put back after a failed write holds its text
			// as Content, and what was streamed since in data.
			e.Content = p.Content + string(p.data)
		}
		dst = append(dst, e)
	}
	if n := len(dst); n > first && len(l.marks) > 0 {
		// The marks go with the batch's last event (one put back after
		// a failed write may hold earlier ones).
		last := &dst[n-1]
		last.Marks = append(last.Marks[:len(last.Marks):len(last.Marks)], l.marks...)
		l.marks = l.marks[:0]
	}
	// Each slot keeps its text's buffer for the next batch, within
	// maxKeptStreamBuffer, and nothing else: an event's strings (a tool's
	// output) are not held until the slot is used again.
	for i, p := range l.pending {
		if cap(p.data) > maxKeptStreamBuffer {
			p.data = nil
		}
		l.pending[i] = pendingEvent{data: p.data[:0]}
	}
	l.pending, l.bytes = l.pending[:0], 0
	l.takenSeq = l.streamedSeq
	return dst
}

// maxKeptStreamBuffer bounds the buffer a turn's log keeps for a slot's
// streamed text between batches: a batch is written once it holds
// DefaultCheckpointBytes, and a larger buffer (a long chunk's) goes to
// the collector.
const maxKeptStreamBuffer = 2 * DefaultCheckpointBytes

// putBack returns events a failed write took, ahead of those added since.
func (l *turnLog) putBack(evs []cpEvent) {
	if len(evs) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	back := make([]pendingEvent, 0, len(evs)+len(l.pending))
	for _, e := range evs {
		back = append(back, pendingEvent{cpEvent: e})
		l.bytes += len(e.Content)
	}
	l.pending = append(back, l.pending...)
}

// write writes l's pending events and, in the same transaction, also
// (nil for none). On failure the events stay pending.
func (c *checkpointer) write(ctx context.Context, l *turnLog, also func(pgx.Tx) error) error {
	_, err := c.writeCovered(ctx, l, also)
	return err
}

// writeCovered is write, and on success the update seq of the last
// streamed chunk the turn's written events hold: a chunk published after
// it was streamed into the log after the events were taken.
func (c *checkpointer) writeCovered(ctx context.Context, l *turnLog, also func(pgx.Tx) error) (int64, error) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	return c.writeCoveredLocked(ctx, l, also)
}

// writeThenRead is writeCovered, then read, with no batch written
// between: what read finds of l's turn is what the returned seq covers.
// A batch the writer wrote between the two (every interval, 100 ms) was
// read as well, its chunks past the seq: a reader that applied their
// updates on top of the events showed them twice. A read failure is
// read's error as it is.
func (c *checkpointer) writeThenRead(ctx context.Context, l *turnLog, read func() error) (int64, error) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	covered, err := c.writeCoveredLocked(ctx, l, nil)
	if err != nil {
		return 0, fmt.Errorf("write checkpoint: %w", err)
	}
	if err := read(); err != nil {
		return 0, err
	}
	return covered, nil
}

// writeCoveredLocked is writeCovered; c.writeMu is held.
func (c *checkpointer) writeCoveredLocked(ctx context.Context, l *turnLog, also func(pgx.Tx) error) (int64, error) {
	evs := l.take()
	l.mu.Lock()
	covered := l.takenSeq
	l.mu.Unlock()
	defer c.cols.reset()
	err := pgx.BeginFunc(ctx, c.db, func(tx pgx.Tx) error {
		if err := c.cols.insert(ctx, tx, evs); err != nil {
			return err
		}
		if also != nil {
			return also(tx)
		}
		return nil
	})
	if err != nil {
		l.putBack(evs)
		return 0, err
	}
	return covered, nil
}

// run is the writer's loop: once an event is pending it waits for the
// interval, or less when a turn fills a batch, and writes every turn's
// pending events. A signal that a batch was full may be stale (the
// batch went with the previous write): fullness is checked again.
func (c *checkpointer) run() {
	defer close(c.done)
	for {
		select {
		case <-c.stop:
			c.flush()
			return
		case <-c.wake:
		case <-c.urgent:
		}
		t := time.NewTimer(c.interval)
		for waiting := !c.anyFull(); waiting; {
			select {
			case <-c.stop:
				waiting = false
			case <-c.urgent:
				waiting = !c.anyFull()
			case <-t.C:
				waiting = false
			}
		}
		t.Stop()
		c.flush()
	}
}

// anyFull reports whether a running turn has a full batch pending.
func (c *checkpointer) anyFull() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for l := range c.logs {
		l.mu.Lock()
		full := l.bytes >= c.maxBytes
		l.mu.Unlock()
		if full {
			return true
		}
	}
	return false
}

// flush writes the pending events of every running turn in one
// transaction. When that fails for another reason than an unreachable
// database, each turn's events are tried on their own, so one bad batch
// cannot hold back the others; what still fails is dropped and logged.
func (c *checkpointer) flush() {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	logs, all := c.gather()
	defer c.release()
	lone := c.lone
	if len(all) == 0 && len(lone) == 0 {
		return
	}
	// batch is the events of logs[i] in all.
	batch := func(i int) []cpEvent {
		start := 0
		if i > 0 {
			start = c.ends[i-1]
		}
		return all[start:c.ends[i]:c.ends[i]]
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	err := pgx.BeginFunc(ctx, c.db, func(tx pgx.Tx) error {
		if err := c.cols.insert(ctx, tx, all); err != nil {
			return err
		}
		return addMarks(ctx, tx, logs, lone)
	})
	if err == nil {
		return
	}
	if pg.IsUnavailable(err) {
		c.log.Warn("write checkpoint", zap.Int("events", len(all)), zap.Error(err))
		for i, l := range logs {
			l.putBack(batch(i))
		}
		for _, m := range lone {
			logs[m.log].putBackMarks(m.marks)
		}
		return
	}
	for i, l := range logs {
		evs := batch(i)
		var marks []loneMarks
		for _, m := range lone {
			if m.log == i {
				marks = append(marks, m)
			}
		}
		if len(evs) == 0 && len(marks) == 0 {
			continue
		}
		if err := pgx.BeginFunc(ctx, c.db, func(tx pgx.Tx) error {
			if err := c.cols.insert(ctx, tx, evs); err != nil {
				return err
			}
			return addMarks(ctx, tx, logs, marks)
		}); err != nil {
			c.log.Warn("checkpoint dropped", zap.String("session_id", l.sessionID), zap.String("turn_id", l.turnID),
				zap.Int("events", len(evs)), zap.Int("lone_marks", len(marks)), zap.Error(err))
		}
	}
}

// gather takes the pending events of every running turn into c.events,
// each turn's ending at its c.ends; c.writeMu is held. A batch's slices
// are the writer's, kept for the next batch (release), so that the
// writer's every 100 ms costs no array a turn and none grown anew.
func (c *checkpointer) gather() (logs []*turnLog, all []cpEvent) {
	c.mu.Lock()
	logs = c.running[:0]
	for l := range c.logs {
		logs = append(logs, l)
	}
	c.mu.Unlock()
	all, ends, lone := c.events[:0], c.ends[:0], c.lone[:0]
	for i, l := range logs {
		n := len(all)
		all = l.takeInto(all)
		ends = append(ends, len(all))
		if len(all) == n {
			if ev, m := l.takeLoneMarks(); m != nil {
				lone = append(lone, loneMarks{log: i, event: ev, marks: m})
			}
		}
	}
	c.running, c.events, c.ends, c.lone = logs, all, ends, lone
	return logs, all
}

// release lets go of what a batch's kept slices hold (the turns, the
// events' text), and of slices past maxKeptBatch; c.writeMu is held.
func (c *checkpointer) release() {
	clear(c.running)
	clear(c.events)
	clear(c.lone)
	c.cols.reset()
	if cap(c.running) > maxKeptBatch || cap(c.events) > maxKeptBatch {
		c.running, c.events, c.ends, c.lone = nil, nil, nil, nil
	}
}

// loneMarks are a turn's marks that a batch stores on its last event
// written (see turnLog.mark).
type loneMarks struct {
	log   int // the turn's index in the batch's running
	event int64
	marks []byte
}

// addMarks appends the lone marks of ms to their events' update_marks,
// in one statement.
func addMarks(ctx context.Context, tx pgx.Tx, logs []*turnLog, ms []loneMarks) error {
	if len(ms) == 0 {
		return nil
	}
	sids, turns, evs, marks := make([]string, len(ms)), make([]string, len(ms)), make([]int64, len(ms)), make([][]byte, len(ms))
	for i, m := range ms {
		sids[i], turns[i], evs[i], marks[i] = logs[m.log].sessionID, logs[m.log].turnID, m.event, m.marks
	}
	if _, err := tx.Exec(ctx, `UPDATE checkpoint_events e SET update_marks = COALESCE(e.update_marks, ''::bytea) || u.marks
		FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bytea[]) AS u(session_id, turn_id, seq, marks)
		WHERE e.session_id = u.session_id AND e.seq = u.seq AND e.turn_id = u.turn_id`, sids, turns, evs, marks); err != nil {
		return fmt.Errorf("write checkpoint marks: %w", err)
	}
	return nil
}

// maxKeptBatch bounds the turns and events whose slices the writer keeps
// between batches: a batch of more (a burst of tool events, thousands of
// turns) is laid out in slices the collector takes back.
const maxKeptBatch = 4096

// shutdown writes what is pending and stops the writer.
func (c *checkpointer) shutdown() {
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	<-c.done
}

// signal wakes a waiter without blocking.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
