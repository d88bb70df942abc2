package pluginsandbox

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/plugins/abi"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// observerQueue bounds the events waiting for one observer; more are
// dropped and counted, so a slow observer never holds up a tool call.
const observerQueue = 256

// observerTimeout bounds one event delivery (the plugin's own
// call_timeout_ms applies inside it too).
const observerTimeout = 10 * time.Second

// observerRun feeds one observer plugin from a bounded queue, in order,
// on a goroutine of its own.
type observerRun struct {
	o       *wasmhost.Observer
	queue   chan wasmhost.ObserverEvent
	quit    chan struct{}
	done    sync.WaitGroup
	dropped atomic.Uint64
	once    sync.Once
}

func (s *Server) startObserver(plugin string, o *wasmhost.Observer) *observerRun {
	r := &observerRun{o: o, queue: make(chan wasmhost.ObserverEvent, observerQueue), quit: make(chan struct{})}
	log := s.logger.With(zap.String("plugin", plugin))
	r.done.Add(1)
	go func() {
		defer r.done.Done()
		for {
			select {
			case <-r.quit:
				return
			case ev := <-r.queue:
				ctx, cancel := context.WithTimeout(context.Background(), observerTimeout)
				if err := o.RecordEvent(ctx, ev); err != nil {
					log.Warn("observer event failed", zap.String("kind", ev.Kind), zap.Error(err))
				}
				cancel()
			}
		}
	}()
	return r
}

// offer queues ev without blocking.
func (r *observerRun) offer(ev wasmhost.ObserverEvent) {
	select {
	case r.queue <- ev:
	default:
		r.dropped.Add(1)
	}
}

// stop ends the feeding goroutine, flushes the plugin and closes it.
func (r *observerRun) stop(ctx context.Context) {
	r.once.Do(func() {
		close(r.quit)
		r.done.Wait()
		fctx, cancel := context.WithTimeout(ctx, observerTimeout)
		_ = r.o.Flush(fctx)
		cancel()
		_ = r.o.Close(ctx)
	})
}

// observe hands an event to every active observer.
func (s *Server) observe(kind string, fields map[string]string) {
	c := s.current()
	ev := wasmhost.ObserverEvent{Kind: kind, Timestamp: time.Now().UnixMilli(), Fields: fields}
	for _, e := range c.entries {
		if e.observer != nil && c.active(e) {
			e.observer.offer(ev)
		}
	}
}

func observerLoaded(e *entry) (string, map[string]string) {
	return abi.ObserverPluginLoaded, map[string]string{"plugin": e.name(), "version": e.bundle.Manifest.Version}
}

func observerUnloaded(e *entry) (string, map[string]string) {
	return abi.ObserverPluginUnloaded, map[string]string{"plugin": e.name(), "dir": e.dir}
}
