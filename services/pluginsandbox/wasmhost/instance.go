package wasmhost

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/sys"

	"github.com/clawmesh/clawmesh/plugins/abi"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmbin"
)

// maxResultBytes caps what an export may return.
const maxResultBytes = 16 << 20

// instance is one instantiated module. It is used by one call at a time.
type instance struct {
	c         *compiled
	mod       api.Module
	fuel      api.MutableGlobal // nil when fuel is disabled
	mark      api.MutableGlobal // where the guest's next yield is due (wasmbin); with fuel
	interrupt api.MutableGlobal // the guest's interrupt flag (wasmbin); with fuel
	alloc     api.Function
	dealloc   api.Function
	callFn    api.Function // c.callExport, or nil
	stderr    tailBuffer
	// sleepDone is the Done channel of the running call, so that WASI sleeps
	// (poll_oneoff clock waits) end with the call.
	sleepDone atomic.Pointer[<-chan struct{}]
	broken    bool
	closed    atomic.Bool
	// memRefused is set when the host's memory budget refused a growth
	// of this instance's memory.
	memRefused atomic.Bool
}

// newInstance instantiates c and runs its start function and _initialize
// under the call limits, with no service frame (config and secrets are
// unavailable there). The caller holds a slot for it; newInstance does not
// release it on failure.
func (h *Host) newInstance(ctx context.Context, c *compiled) (*instance, error) {
	in := &instance{c: c}
	cfg := wazero.NewModuleConfig().
		WithName("").
		WithStartFunctions().
		WithNanosleep(in.nanosleep).
		WithStdout(io.Discard).
		WithStderr(&in.stderr)
	if h.cfg.DeterministicWASI {
		cfg = cfg.WithRandSource(mrand.NewChaCha8([32]byte{}))
	} else {
		cfg = cfg.WithSysWalltime().WithSysNanotime().WithRandSource(crand.Reader)
	}
	ictx := ctx
	if alloc := memoryAllocator(h.mem, &in.memRefused); alloc != nil {
		if !h.mem.fits(c.minMemory) {
			return nil, h.mem.spent()
		}
		ictx = experimental.WithMemoryAllocator(ctx, alloc)
	}
	mod, err := h.rt.InstantiateModule(ictx, c.mod, cfg)
	if err != nil {
		if h.closed.Load() {
			return nil, ErrClosed // the runtime closed under a call racing Close
		}
		return nil, fmt.Errorf("%w: instantiate: %w", ErrInvalidModule, err)
	}
	in.mod = mod
	in.alloc = mod.ExportedFunction(abi.ExportAlloc)
	in.dealloc = mod.ExportedFunction(abi.ExportDealloc)
	if c.callExport != "" {
		in.callFn = mod.ExportedFunction(c.callExport)
	}
	if g, ok := mod.ExportedGlobal(wasmbin.FuelGlobalExport).(api.MutableGlobal); ok {
		in.fuel = g
		if in.interrupt, ok = mod.ExportedGlobal(wasmbin.InterruptGlobalExport).(api.MutableGlobal); !ok {
			in.close(context.Background())
			return nil, fmt.Errorf("%w: fuel counter without an interrupt flag", ErrInvalidModule)
		}
		if in.mark, ok = mod.ExportedGlobal(wasmbin.YieldMarkGlobalExport).(api.MutableGlobal); !ok {
			in.close(context.Background())
			return nil, fmt.Errorf("%w: fuel counter without a yield mark", ErrInvalidModule)
		}
	}
	// The module's start function (exported by wasmbin in place of its
	// start section), then the reactor's _initialize, each a call of its
	// own.
	for _, init := range []struct{ name, export string }{
		{"the start function", wasmbin.StartExport},
		{"_initialize", abi.ExportInitialize},
	} {
		fn := mod.ExportedFunction(init.export)
		if fn == nil {
			continue
		}
		cctx, cancel := h.callContext(ctx)
		_, err := in.invoke(cctx, nil, func(ctx context.Context) ([]byte, error) {
			_, err := fn.Call(ctx)
			return nil, err
		})
		cancel()
		if err != nil {
			in.close(context.Background())
			return nil, fmt.Errorf("%s: %w", init.name, err)
		}
	}
	return in, nil
}

func (in *instance) nanosleep(ns int64) {
	t := time.NewTimer(time.Duration(ns))
	defer t.Stop()
	var done <-chan struct{}
	if p := in.sleepDone.Load(); p != nil {
		done = *p
	}
	select {
	case <-t.C:
	case <-done:
	}
}

// call runs one export with a JSON argument (nil for none) inside frame f
// (nil outside any service frame) and returns the bytes it returns. ctx must
// carry the call deadline (Host.callContext).
func (in *instance) call(ctx context.Context, f *frame, export string, arg []byte, release bool) ([]byte, error) {
	var out []byte
	if err := in.callRead(ctx, f, export, arg, release, func(view []byte) { out = append([]byte(nil), view...) }); err != nil {
		return nil, err
	}
	return out, nil
}

// callRead is call handing what the export returns to read, as a view of
// the guest's memory valid during read only: a reader that keeps part of
// a result of up to 16 MiB copies only that part. read runs inside the
// call (the host's Close waits for it, as the memory is then still
// mapped), before any dealloc; what it read counts only when callRead
// returns nil.
func (in *instance) callRead(ctx context.Context, f *frame, export string, arg []byte, release bool, read func(view []byte)) error {
	fn := in.callFn
	if fn == nil || export != in.c.callExport {
		fn = in.mod.ExportedFunction(export)
	}
	if fn == nil {
		return fmt.Errorf("%w: missing export %q", ErrABI, export)
	}
	if f != nil {
		ctx = withFrame(ctx, f)
		defer f.drop()
	}
	_, err := in.invoke(ctx, f, func(ctx context.Context) ([]byte, error) {
		var params []uint64
		if arg != nil {
			res, err := in.alloc.Call(ctx, uint64(len(arg)))
			if err != nil {
				return nil, err
			}
			if len(res) != 1 {
				return nil, fmt.Errorf("%w: alloc returned %d values, want one i32", ErrABI, len(res))
			}
			ptr := uint32(res[0])
			if len(arg) > 0 && !in.mod.Memory().Write(ptr, arg) {
				return nil, fmt.Errorf("%w: alloc returned an out-of-bounds buffer", ErrABI)
			}
			params = []uint64{uint64(ptr), uint64(len(arg))}
		}
		res, err := fn.Call(ctx, params...)
		if err != nil {
			return nil, err
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// A module may declare an export with any type: one without a
		// result crashed the whole sandbox here (an index out of range).
		if len(res) != 1 {
			return nil, fmt.Errorf("%w: %s returned %d values, want one i64", ErrABI, export, len(res))
		}
		ptr, size := uint32(res[0]>>32), uint32(res[0])
		if size > maxResultBytes {
			return nil, fmt.Errorf("%w: %s returned %d bytes, limit %d", ErrABI, export, size, maxResultBytes)
		}
		view, ok := in.mod.Memory().Read(ptr, size)
		if !ok {
			return nil, fmt.Errorf("%w: %s returned an out-of-bounds buffer", ErrABI, export)
		}
		read(view)
		if release && size > 0 {
			if _, err := in.dealloc.Call(ctx, uint64(ptr), uint64(size)); err != nil {
				return nil, err
			}
		}
		return nil, nil
	})
	return err
}

// invoke runs body under the fuel budget and the deadline in ctx, and turns
// whatever stopped it into one of the package's errors.
func (in *instance) invoke(ctx context.Context, f *frame, body func(context.Context) ([]byte, error)) ([]byte, error) {
	if in.broken || in.closed.Load() {
		return nil, fmt.Errorf("%w: instance was stopped by an earlier failure", ErrUnavailable)
	}
	h := in.c.host
	if !h.beginCall() {
		return nil, ErrClosed
	}
	defer h.endCall()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer context.AfterFunc(h.stopCtx, func() { cancel(ErrClosed) })()
	if in.fuel != nil {
		in.fuel.Set(h.cfg.Limits.CallFuel)
		in.mark.Set(wasmbin.YieldMark(h.cfg.Limits.CallFuel))
		in.interrupt.Set(0)
	}
	done := ctx.Done()
	in.sleepDone.Store(&done)
	wd := in.startWatchdog(ctx)
	out, err := body(ctx)
	fired := wd.stop()
	in.sleepDone.Store(nil)
	if err == nil && ctx.Err() != nil {
		err = ctx.Err() // the context is checked after every call
	}
	if err == nil && in.fuelLeft() < 0 {
		// The guest tests its counter at loop headers and function
		// entries only (wasmbin): a call whose budget ran out in its last
		// straight-line stretch returns normally, and is exhausted all
		// the same.
		err = errFuelSpent
	}
	if err != nil {
		in.broken = true
		return nil, in.classify(ctx, err, fired)
	}
	return out, nil
}

// errFuelSpent is what a call that returned with its counter negative
// failed with (classify turns it into ErrFuelExhausted).
var errFuelSpent = errors.New("fuel counter negative after the call")

func (in *instance) fuelLeft() int64 {
	if in.fuel == nil {
		return 0
	}
	return int64(in.fuel.Get())
}

// classify maps what stopped a call to a sentinel error. Order matters: a
// guest stopped at its deadline traps in its fuel test, so the deadline is
// checked first.
func (in *instance) classify(ctx context.Context, err error, watchdogFired bool) error {
	lim := in.c.host.cfg.Limits
	if errors.Is(err, ErrABI) {
		return err
	}
	if watchdogFired || ctx.Err() != nil {
		if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, errCallDeadline) {
			return fmt.Errorf("%w: %w", ErrCancelled, cause)
		}
		return fmt.Errorf("%w: plugins.limits.call_timeout_ms %d", ErrCallTimeout, lim.CallTimeoutMS)
	}
	if in.fuel != nil && in.fuelLeft() < 0 {
		return fmt.Errorf("%w: plugins.limits.call_fuel %d", ErrFuelExhausted, lim.CallFuel)
	}
	if in.memRefused.Load() {
		return in.c.host.mem.spent()
	}
	if in.outOfMemory() {
		return fmt.Errorf("%w: plugins.limits.max_memory_mb %d", ErrMemoryLimit, lim.MaxMemoryMB)
	}
	var exit *sys.ExitError
	if errors.As(err, &exit) {
		return fmt.Errorf("%w: guest exited with code %d", ErrTrap, exit.ExitCode())
	}
	msg := err.Error()
	if i := strings.IndexByte(msg, '\n'); i >= 0 {
		msg = msg[:i] // drop wazero's stack trace
	}
	return fmt.Errorf("%w: %s", ErrTrap, msg)
}

// outOfMemory reports whether a failed call ran out of linear memory: the Go
// runtime says so on stderr before trapping, and any guest whose memory is
// within 8 MiB of the limit when it traps is taken to have hit it.
func (in *instance) outOfMemory() bool {
	if bytes.Contains(in.stderr.bytes(), []byte("out of memory")) {
		return true
	}
	mem := in.mod.Memory()
	if mem == nil {
		return false
	}
	limit := in.c.host.cfg.Limits.MaxMemoryMB << 20
	return uint64(mem.Size())+8<<20 >= limit
}

// close closes the module; it is safe to call twice.
func (in *instance) close(ctx context.Context) {
	if in.closed.CompareAndSwap(false, true) && in.mod != nil {
		_ = in.mod.Close(ctx)
	}
}

// watchdog enforces the deadline under InterruptWatchdog: when the context
// ends it raises the guest's interrupt flag, which the guest tests with its
// fuel counter at every loop header and function entry (wasmbin). The guest
// never writes the flag, so one write is enough.
type watchdog struct {
	stopFn func() bool
	done   chan struct{}
}

func (in *instance) startWatchdog(ctx context.Context) *watchdog {
	if in.fuel == nil || in.c.host.cfg.Interrupt != InterruptWatchdog {
		return nil
	}
	w := &watchdog{done: make(chan struct{})}
	w.stopFn = context.AfterFunc(ctx, func() {
		defer close(w.done)
		in.interrupt.Set(interruptBits)
	})
	return w
}

// stop ends the watchdog and reports whether it fired.
func (w *watchdog) stop() bool {
	if w == nil || w.stopFn() {
		return false
	}
	<-w.done
	return true
}

// interruptBits is what the watchdog writes into the interrupt flag: the
// sign bit alone, so that the flag or-ed with any counter is negative.
const interruptBits = uint64(1) << 63

// tailBuffer keeps the last 4 KiB written to it (the guest's stderr), only
// to recognise an out-of-memory report; it is never shown to callers. It
// holds at most twice that: a write was appended whole before it was cut,
// and the cut kept the grown array, so one fd_write of a guest's 100 MiB
// took 100 MiB of the host's heap, outside the guest's memory limit, for
// as long as the instance lived.
type tailBuffer struct{ b []byte }

const tailBytes = 4 << 10

func (t *tailBuffer) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) >= tailBytes {
		t.b = append(t.b[:0], p[len(p)-tailBytes:]...)
		return n, nil
	}
	if len(t.b)+len(p) > 2*tailBytes {
		drop := len(t.b) + len(p) - tailBytes
		t.b = t.b[:copy(t.b, t.b[drop:])]
	}
	t.b = append(t.b, p...)
	return n, nil
}

func (t *tailBuffer) bytes() []byte { return t.b[max(len(t.b)-tailBytes, 0):] }
