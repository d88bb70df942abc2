package wasmhost

import (
	"context"
	"sync"

	"go.uber.org/zap"
)

// pool keeps up to size pre-instantiated, never-used instances of one
// module, so a call gets a fresh instance without waiting for
// instantiation. Instances are used once and closed.
type pool struct {
	h     *Host
	c     *compiled
	ready chan *instance
	kickc chan struct{}
	stopc chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
}

func newPool(h *Host, c *compiled, size int) *pool {
	p := &pool{h: h, c: c, ready: make(chan *instance, size), kickc: make(chan struct{}, 1), stopc: make(chan struct{})}
	if size > 0 {
		h.addPool(p)
		p.wg.Add(1)
		go p.run()
		p.kick()
	}
	return p
}

func (p *pool) kick() {
	select {
	case p.kickc <- struct{}{}:
	default:
	}
}

func (p *pool) run() {
	defer p.wg.Done()
	for {
		select {
		case <-p.stopc:
			return
		case <-p.kickc:
			p.fill()
		}
	}
}

// fill instantiates until the pool is full or no slot is idle.
func (p *pool) fill() {
	for len(p.ready) < cap(p.ready) {
		select {
		case <-p.stopc:
			return
		default:
		}
		if !p.h.slots.tryAcquireIdle() {
			return
		}
		in, err := p.h.newInstance(context.Background(), p.c)
		if err != nil {
			p.h.slots.release()
			p.h.logger.Warn("plugin pre-instantiation failed", zap.String("plugin", p.c.spec.Name), zap.Error(err))
			return
		}
		select {
		case p.ready <- in:
			p.h.slots.idleAdded()
		default:
			p.h.discard(in)
		}
	}
}

// take returns a ready instance, or nil when none is ready. Taking a
// ready instance does not start a refill: the refill starts when the call
// is over and its instance is discarded (Host.discardNow kicks every pool),
// so that instantiating the replacement, about 4 ms of CPU for a Go guest,
// does not compete with the call on a two-core machine. An empty pool is
// kicked at once.
func (p *pool) take() *instance {
	select {
	case in := <-p.ready:
		return in
	default:
		p.kick()
		return nil
	}
}

func (p *pool) evictOne() bool {
	select {
	case in := <-p.ready:
		p.h.discardNow(in)
		return true
	default:
		return false
	}
}

// close stops refilling and closes the idle instances. Safe to call twice.
func (p *pool) close() {
	p.once.Do(func() {
		close(p.stopc)
		p.wg.Wait()
		p.h.removePool(p)
		for {
			select {
			case in := <-p.ready:
				p.h.discardNow(in)
			default:
				return
			}
		}
	})
}

// acquire returns a fresh instance holding a slot: from the pool when one is
// ready, else instantiated now (after waiting for a slot, within ctx).
func (h *Host) acquire(ctx context.Context, p *pool) (*instance, error) {
	if h.closed.Load() {
		return nil, ErrClosed
	}
	if p != nil {
		if in := p.take(); in != nil {
			return in, nil
		}
	}
	if err := h.slots.acquire(ctx); err != nil {
		return nil, err
	}
	c := p.c
	in, err := h.newInstance(ctx, c)
	if err != nil {
		h.slots.release()
		return nil, err
	}
	return in, nil
}

// discard hands a used instance to the reaper, which closes it and frees its
// slot off the caller's path. It never blocks: when the reaper is stopped
// (Close) or its queue is full, the instance is closed here.
func (h *Host) discard(in *instance) {
	if !h.reaper.enqueue(in) {
		h.discardNow(in)
	}
}

// reaper is the one goroutine that closes used instances (closing one
// unmaps its memory and releases the module: tens of µs that a caller
// should not wait for), owned by the host: Close stops it and waits until
// it has closed everything queued.
type reaper struct {
	mu      sync.Mutex
	q       chan *instance
	stopped bool
	done    chan struct{}
}

// maxReaperQueue bounds the queue when plugins.limits.max_instances is
// larger than the config schema allows (the Limits of a Host built in code).
const maxReaperQueue = 4096

// start starts the goroutine. Its queue holds one entry per instance slot
// (every queued instance still holds its slot until it is closed), so with
// the schema's limits a discard always finds room.
func (r *reaper) start(h *Host, slots int) {
	r.q = make(chan *instance, min(slots, maxReaperQueue))
	r.done = make(chan struct{})
	go func() {
		defer close(r.done)
		for in := range r.q {
			h.discardNow(in)
		}
	}()
}

// enqueue queues in for closing; false when the reaper is stopped or full.
func (r *reaper) enqueue(in *instance) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return false
	}
	select {
	case r.q <- in:
		return true
	default:
		return false
	}
}

// stop closes the queue and waits until every queued instance is closed.
// Later discards close their instance themselves.
func (r *reaper) stop() {
	r.mu.Lock()
	if !r.stopped {
		r.stopped = true
		close(r.q)
	}
	r.mu.Unlock()
	<-r.done
}

func (h *Host) discardNow(in *instance) {
	in.close(context.Background())
	h.slots.release()
	h.kickPools()
}
