// Package coalesce shares a read among the callers that ask for the same
// thing at the same time, without ever answering a caller with a read that
// began before it asked.
//
// A caller arriving while a read of its key is in flight does not join
// that read (it may have read the state before the caller's own last
// write); it waits for the read to end, and one read started then answers
// every caller that waited. What a caller sees is therefore as fresh as
// its own read would have been, and under load the reads of a key drop to
// one per read's duration, whatever the number of callers. A read that
// can tell when it read the state (Group.Fresh) also answers the callers
// that arrived while it was in flight but before that moment.
package coalesce

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Group coalesces reads by key. The zero value is ready to use. Its memory
// is bounded by its callers: a key is kept only while a caller of it is
// inside Do or waits after Go, or a read of it runs.
type Group[K comparable, T any] struct {
	// Timeout bounds a shared read from its start (zero: no bound of the
	// group's). A shared read runs on no caller's cancellation or
	// deadline, so that a caller giving up does not fail the others; each
	// caller still stops waiting at its own deadline (Do's ctx's, Go's
	// deadline) or when it leaves. The caller that runs
	// the read waits for it to end, at most Timeout.
	Timeout time.Duration
	// OnPanic, when set, is told of a panic in a read run for callers of
	// Go only (there is no caller's stack to carry it up) and of a panic
	// in a Go caller's done; the batch's other callers are answered all
	// the same.
	OnPanic func(v any)
	// Fresh and Clock, when both are set, let a read answer the callers
	// of Go that came while it was in flight and that it is fresh enough
	// for, instead of making them wait for the next read: Clock stamps a
	// caller's arrival (never earlier than the moment it is called), and
	// Fresh(val, arrived) reports whether val reflects every write that
	// ended before that arrival (a read that reports when it read the
	// state, on a clock Clock shares). The promise stays the package's:
	// no caller gets a state read before it asked. Callers of Do always
	// wait for a read that started after them. Fresh runs with the
	// group's lock held: it must be quick and must not call the group.
	Fresh func(val T, arrived int64) bool
	Clock func() int64

	mu      sync.Mutex
	keys    map[K]*slot[K, T]
	running sync.WaitGroup // reads run for callers of Go (see Wait)
}

type slot[K comparable, T any] struct {
	key     K
	cur     *batch[K, T] // the read in flight, nil when none
	next    *batch[K, T] // callers waiting for the next read, nil when none
	callers int          // callers inside Do or waiting after Go, and runAsync's runners
}

type batch[K comparable, T any] struct {
	done  chan struct{} // closed once val and err are set
	ended bool          // set under Group.mu as the slot's cur is cleared
	val   T
	err   error

	// Callers of Go: no goroutine waits for them; whoever ends the batch
	// answers them. The first one's read and context run the batch when
	// no caller of Do does.
	waiters []*waiter[K, T]
	live    int  // waiters not answered before the read (deadline, context, owner)
	async   bool // run by runAsync, whose runner counts as a caller
	read    func(context.Context) (T, error)
	readCtx context.Context

	// One timer for the deadlines of all its waiters, at the earliest
	// one not yet answered, rather than one timer per caller: under load
	// a batch has dozens of callers, and a context with a timer each was
	// 5% of the gateway's CPU under status (docs/performance.md,
	// nineteenth round). Set under Group.mu.
	timer   *time.Timer
	timerAt time.Time
}

// waiter is one caller of Go.
type waiter[K comparable, T any] struct {
	done     func(T, error)
	at       int64     // arrival, by Group.Clock (when Fresh is set)
	deadline time.Time // zero: none
	// answered is set, under Group.mu, by whichever of the read's end,
	// the deadline, the context's end and the owner's leaving takes the
	// caller first: each caller is answered once.
	answered bool
	// unwatch ends the watch on the caller's context; nil when the
	// context can never end.
	unwatch func() bool
	owned   // on its Owner's list, when it has one
	g       *Group[K, T]
	s       *slot[K, T]
	b       *batch[K, T]
}

// take claims w for the one answer it gets, reporting false when
// something else claimed it first; called with Group.mu held.
func (w *waiter[K, T]) take() bool {
	if w.answered {
		return false
	}
	w.answered = true
	if w.unwatch != nil {
		w.unwatch()
	}
	w.owned.unlink()
	return true
}

// abandon answers w with cause, its context having ended or its owner
// having left, unless something else answered it first.
func (w *waiter[K, T]) abandon(cause error) {
	g := w.g
	g.mu.Lock()
	if !w.take() {
		g.mu.Unlock()
		return
	}
	w.b.live--
	g.leave(w.s, 1)
	g.mu.Unlock()
	var zero T
	g.call(w.done, zero, cause)
}

// An Owner stands for callers of Go that leave together, the requests of
// one client connection: Leave answers at once those still waiting, in
// any group, where each caller's own context would cost a registration
// with it per call (nearly a tenth of status's rate in the gateway,
// docs/performance.md, nineteenth round). The zero Owner is ready to use;
// it must not be copied once used.
type Owner struct {
	mu    sync.Mutex // after any Group's mu
	first *owned
	left  error // set by Leave
}

// owned is a caller's place on its Owner's list. owner and caller are
// set once, before the caller is seen by anyone else; the rest is the
// owner's, under its mu.
type owned struct {
	owner      *Owner
	caller     interface{ abandon(error) }
	linked     bool
	prev, next *owned
}

// join puts o on owner's list, reporting false, with the cause, when the
// owner has left already.
func (o *owned) join(owner *Owner, caller interface{ abandon(error) }) (bool, error) {
	owner.mu.Lock()
	defer owner.mu.Unlock()
	if owner.left != nil {
		return false, owner.left
	}
	o.owner, o.caller = owner, caller
	o.linked, o.next = true, owner.first
	if o.next != nil {
		o.next.prev = o
	}
	owner.first = o
	return true, nil
}

// unlink takes o off its owner's list, if it is still on it.
func (o *owned) unlink() {
	owner := o.owner
	if owner == nil {
		return
	}
	owner.mu.Lock()
	defer owner.mu.Unlock()
	if !o.linked { // Leave took the list meanwhile
		return
	}
	if o.prev != nil {
		o.prev.next = o.next
	} else {
		owner.first = o.next
	}
	if o.next != nil {
		o.next.prev = o.prev
	}
	o.linked, o.prev, o.next = false, nil, nil
}

// Leave answers every caller of Go still waiting for owner with cause
// (nil: context.Canceled), and any that comes later at once: the owner is
// gone.
func (owner *Owner) Leave(cause error) {
	if cause == nil {
		cause = context.Canceled
	}
	owner.mu.Lock()
	if owner.left != nil {
		owner.mu.Unlock()
		return
	}
	owner.left = cause
	var callers []interface{ abandon(error) }
	for o := owner.first; o != nil; {
		next := o.next
		callers = append(callers, o.caller)
		o.linked, o.prev, o.next = false, nil, nil
		o = next
	}
	owner.first = nil
	owner.mu.Unlock()
	for _, c := range callers {
		c.abandon(cause)
	}
}

// Do returns read's result for a read of key that started after Do was
// called. The value is shared by every caller of the batch: treat it as
// read-only. A caller whose ctx ends while it waits returns ctx's cause.
func (g *Group[K, T]) Do(ctx context.Context, key K, read func(context.Context) (T, error)) (T, error) {
	g.mu.Lock()
	s := g.slot(key)
	// Every path below returns with g.mu released.
	defer func() {
		g.mu.Lock()
		g.leave(s, 1)
		g.mu.Unlock()
	}()
	for {
		if s.cur == nil {
			// Nothing in flight: run the waiting batch (joining it) or a
			// new one, now.
			b := s.next
			if b == nil {
				b = &batch[K, T]{done: make(chan struct{})}
			}
			s.cur, s.next = b, nil
			g.mu.Unlock()
			g.run(ctx, s, b, read)
			return b.val, b.err
		}
		// A read is in flight: wait for the next one.
		if s.next == nil {
			s.next = &batch[K, T]{done: make(chan struct{})}
		}
		b, inFlight := s.next, s.cur.done
		g.mu.Unlock()
		if ran, val, err := b.wait(ctx, inFlight); ran {
			return val, err
		}
		g.mu.Lock()
		if s.cur == b {
			// Another caller of the batch runs it.
			g.mu.Unlock()
			_, val, err := b.wait(ctx, nil)
			return val, err
		}
		// b may have run and ended while we were away.
		if b.ended {
			g.mu.Unlock()
			return b.val, b.err
		}
		// Loop: run b if nothing is in flight (s.next is still b), else
		// wait again.
	}
}

// run runs b's read and ends the batch, even when read panics: the
// panic goes on up the runner's stack, the batch's other callers get
// ErrReadPanicked, and the key's next read can start (a batch left in
// flight would make every later caller of the key wait out its deadline).
func (g *Group[K, T]) run(ctx context.Context, s *slot[K, T], b *batch[K, T], read func(context.Context) (T, error)) {
	defer g.end(s, b)
	rctx, cancel := g.readContext(ctx)
	defer cancel()
	b.err = ErrReadPanicked // unless read returns
	b.val, b.err = read(rctx)
}

// end ends b, whose val and err are set: when callers of Go wait for the
// next read, it starts that read (no goroutine of theirs would), then it
// answers b's callers. In that order: answering a batch of callers of Go
// takes a write to each one's connection in the gateway, and the next read
// has no reason to wait for them (a few percent of status's rate under 64
// clients at most: docs/performance.md, seventeenth round).
func (g *Group[K, T]) end(s *slot[K, T], b *batch[K, T]) {
	g.mu.Lock()
	s.cur, b.ended = nil, true
	next := s.next
	var joined []*waiter[K, T]
	if next != nil && b.err == nil && g.fresh() {
		joined = g.join(next, b.val)
	}
	if next != nil && next.live > 0 {
		// Callers of Go still wait for it (callers of Do among them,
		// woken by b's end, find it running).
		s.cur, s.next = next, nil
		next.async = true
		s.callers++ // its runner, until it ends
	} else {
		next = nil
	}
	g.mu.Unlock()
	close(b.done)
	if next != nil {
		g.startAsync(s, next)
	}
	g.answer(s, b)
	for _, w := range joined {
		g.call(w.done, b.val, b.err)
	}
	if b.async || len(joined) > 0 {
		n := len(joined)
		if b.async {
			n++
		}
		g.mu.Lock()
		g.leave(s, n)
		g.mu.Unlock()
	}
}

func (g *Group[K, T]) fresh() bool { return g.Fresh != nil && g.Clock != nil }

// join takes out of next the callers of Go that val is fresh enough for,
// claimed, for the batch that read val to answer; called with g.mu held.
// A caller already answered by its deadline or its context's end stays in
// next, which answers it no second time.
func (g *Group[K, T]) join(next *batch[K, T], val T) []*waiter[K, T] {
	var joined []*waiter[K, T]
	kept := next.waiters[:0]
	for _, w := range next.waiters {
		if !w.answered && g.Fresh(val, w.at) && w.take() {
			next.live--
			joined = append(joined, w)
			continue
		}
		kept = append(kept, w)
	}
	clear(next.waiters[len(kept):])
	next.waiters = kept
	if len(kept) == 0 {
		// The next caller of Go brings its own read and context.
		next.read, next.readCtx = nil, nil
	}
	return joined
}

// answer answers b's callers of Go that their deadlines or contexts did
// not.
func (g *Group[K, T]) answer(s *slot[K, T], b *batch[K, T]) {
	if len(b.waiters) == 0 {
		return
	}
	g.mu.Lock()
	mine := make([]*waiter[K, T], 0, len(b.waiters))
	for _, w := range b.waiters {
		if w.take() {
			mine = append(mine, w)
		}
	}
	b.stopTimer()
	if len(mine) > 0 {
		g.leave(s, len(mine))
	}
	g.mu.Unlock()
	for _, w := range mine {
		g.call(w.done, b.val, b.err)
	}
}

// stopTimer stops b's deadline timer; called with Group.mu held.
func (b *batch[K, T]) stopTimer() {
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
}

// armDeadline has b's timer fire by d; called with g.mu held.
func (g *Group[K, T]) armDeadline(s *slot[K, T], b *batch[K, T], d time.Time) {
	switch {
	case b.timer == nil:
		b.timerAt = d
		b.timer = time.AfterFunc(time.Until(d), func() { g.expire(s, b) })
	case d.Before(b.timerAt):
		b.timerAt = d
		b.timer.Reset(time.Until(d))
	}
}

// expire answers context.DeadlineExceeded to b's callers whose deadline
// has passed, and sets b's timer for the earliest deadline left.
func (g *Group[K, T]) expire(s *slot[K, T], b *batch[K, T]) {
	g.mu.Lock()
	now := time.Now()
	var late []*waiter[K, T]
	var next time.Time
	for _, w := range b.waiters {
		switch {
		case w.answered || w.deadline.IsZero():
		case !now.Before(w.deadline):
			w.take()
			late = append(late, w)
		case next.IsZero() || w.deadline.Before(next):
			next = w.deadline
		}
	}
	if len(late) > 0 {
		b.live -= len(late)
		g.leave(s, len(late))
	}
	if b.timer != nil {
		if next.IsZero() {
			b.timer = nil
		} else {
			b.timerAt = next
			b.timer.Reset(next.Sub(now))
		}
	}
	g.mu.Unlock()
	var zero T
	for _, w := range late {
		g.call(w.done, zero, context.DeadlineExceeded)
	}
}

// call calls a Go caller's done; a panic in it is told to OnPanic, and
// the batch's other callers are answered all the same.
func (g *Group[K, T]) call(done func(T, error), val T, err error) {
	defer g.recovered()
	done(val, err)
}

func (g *Group[K, T]) recovered() {
	if p := recover(); p != nil && g.OnPanic != nil {
		g.OnPanic(p)
	}
}

// startAsync runs b on a goroutine of its own, which Wait waits for.
func (g *Group[K, T]) startAsync(s *slot[K, T], b *batch[K, T]) {
	g.running.Add(1)
	go func() {
		defer g.running.Done()
		g.runAsync(s, b)
	}()
}

// Wait waits for the reads Go started on goroutines of their own, each
// ending within Timeout, and for the answers it sent on goroutines of
// their own to callers whose owner had left. Call it once no more callers
// come (a server's connections closed): a read ending meanwhile may start
// the next one for the callers still waiting.
func (g *Group[K, T]) Wait() { g.running.Wait() }

// runAsync runs b for its callers of Go, with the read and context of the
// first of them; a panicking read answers them ErrReadPanicked and is
// told to OnPanic (there is no caller's stack to carry it up).
func (g *Group[K, T]) runAsync(s *slot[K, T], b *batch[K, T]) {
	defer g.end(s, b)
	rctx, cancel := g.readContext(b.readCtx)
	defer cancel()
	b.err = ErrReadPanicked
	defer g.recovered()
	b.val, b.err = b.read(rctx)
}

// slot returns key's slot, made if need be, with one caller more; called
// with g.mu held.
func (g *Group[K, T]) slot(key K) *slot[K, T] {
	s := g.keys[key]
	if s == nil {
		if g.keys == nil {
			g.keys = make(map[K]*slot[K, T])
		}
		s = &slot[K, T]{key: key}
		g.keys[key] = s
	}
	s.callers++
	return s
}

// leave drops n callers of s, n > 0 (with none, a slot already gone
// would take its key's newer slot with it); called with g.mu held.
func (g *Group[K, T]) leave(s *slot[K, T], n int) {
	if s.callers -= n; s.callers == 0 {
		delete(g.keys, s.key)
	}
}

// Go is Do for a caller with no goroutine to spare: it returns at once,
// and done is called exactly once, with the result of a read of key that
// started after Go was called, context.DeadlineExceeded when deadline (if
// not zero) passes first, ctx's cause when ctx ends first, or owner's
// cause (when owner is not nil) when it leaves first (see Owner), at once
// if it has left already. done is called on the goroutine that ran the
// read, on the one the deadline or ctx's end runs it on, on Leave's or
// on one of its own, never on Go's: it must not block for long, as the
// other callers of the batch are answered after it. When no read of key is
// in flight, Go starts one on a goroutine of its own.
//
// The deadline is a time, not ctx's, so that a batch keeps one timer for
// all its callers; the owner stands for many calls' contexts. Watching
// ctx costs a registration with it per call: a ctx that can never end
// (context.WithoutCancel's) costs nothing.
func (g *Group[K, T]) Go(ctx context.Context, key K, deadline time.Time, owner *Owner, read func(context.Context) (T, error), done func(T, error)) {
	w := &waiter[K, T]{done: done, deadline: deadline, g: g}
	if g.fresh() {
		w.at = g.Clock()
	}
	g.mu.Lock()
	if owner != nil {
		// Before anything else is changed: a caller whose owner has left
		// joins nothing. Leave answering w meanwhile waits for g.mu, so
		// it finds w whole.
		if ok, cause := w.owned.join(owner, w); !ok {
			g.mu.Unlock()
			g.running.Add(1)
			go func() { // done never runs on Go's goroutine
				defer g.running.Done()
				var zero T
				g.call(done, zero, cause)
			}()
			return
		}
	}
	s := g.slot(key)
	var b *batch[K, T]
	start := s.cur == nil
	if start {
		b = s.next
		if b == nil {
			b = &batch[K, T]{done: make(chan struct{})}
		}
		s.cur, s.next = b, nil
		b.async = true
		s.callers++ // the runner, until the read ends
	} else {
		if s.next == nil {
			s.next = &batch[K, T]{done: make(chan struct{})}
		}
		b = s.next
	}
	if b.read == nil {
		b.read, b.readCtx = read, ctx
	}
	w.s, w.b = s, b
	b.waiters = append(b.waiters, w)
	b.live++
	if !deadline.IsZero() {
		g.armDeadline(s, b, deadline)
	}
	if ctx.Done() != nil {
		// Registered under g.mu, so that whoever answers w finds unwatch
		// set; the function runs on a goroutine of its own, after g.mu is
		// released.
		w.unwatch = context.AfterFunc(ctx, func() { w.abandon(context.Cause(ctx)) })
	}
	g.mu.Unlock()
	if start {
		g.startAsync(s, b)
	}
}

// ErrReadPanicked is what the callers sharing a read get when it panicked
// (its runner gets the panic).
var ErrReadPanicked = errors.New("coalesce: the shared read panicked")

// wait waits for b's read, ctx's end or, when it is not nil, the end of
// the read in flight. ran is false when only inFlight ended.
func (b *batch[K, T]) wait(ctx context.Context, inFlight <-chan struct{}) (ran bool, val T, err error) {
	select {
	case <-b.done:
		return true, b.val, b.err
	case <-ctx.Done():
		return true, val, context.Cause(ctx)
	case <-inFlight:
		return false, val, nil
	}
}

// readContext is the context of a shared read: ctx's values, neither its
// cancellation nor its deadline (the caller that runs the read is often
// the one that waited longest, with the least time left: its deadline
// would fail callers that had time to spare), and Timeout from now.
func (g *Group[K, T]) readContext(ctx context.Context) (context.Context, context.CancelFunc) {
	rctx := context.WithoutCancel(ctx)
	if g.Timeout > 0 {
		return context.WithTimeout(rctx, g.Timeout)
	}
	return context.WithCancel(rctx)
}

// Len reports how many keys have callers inside Do (for tests and
// diagnostics).
func (g *Group[K, T]) Len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.keys)
}
