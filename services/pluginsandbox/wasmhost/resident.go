package wasmhost

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/clawmesh/clawmesh/plugins/abi"
)

// resident is the one long-lived instance of a channel or memory plugin.
// Calls are serialised by a one-token lock that honours the call deadline;
// each call is refuelled (instance.invoke sets the budget) and runs in its
// own service frame. An instance stopped by a limit or a trap is never
// resumed: it is closed, and what happens next is the adapter's rule
// (rebuild, or stay unavailable until the owner rebuilds).
type resident struct {
	h       *Host
	c       *compiled
	inbound *InboundQueue // channel only
	lock    chan struct{}
	in      *instance // nil after a failure or Close
	closed  bool
	// onBuild runs on a rebuilt instance before the call that needed it
	// (the channel re-runs configure); it holds the lock.
	onBuild func(ctx context.Context) error
}

func newResident(h *Host, c *compiled, inbound *InboundQueue) *resident {
	return &resident{h: h, c: c, inbound: inbound, lock: make(chan struct{}, 1)}
}

// acquireLock takes the instance lock within ctx.
func (r *resident) acquireLock(ctx context.Context) error {
	select {
	case r.lock <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctxFailure(ctx, r.h.cfg.Limits)
	}
}

func (r *resident) releaseLock() { <-r.lock }

// ctxFailure names why ctx ended: the call deadline or the caller.
func ctxFailure(ctx context.Context, lim Limits) error {
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, errCallDeadline) {
		return fmt.Errorf("%w: %w", ErrCancelled, cause)
	}
	return fmt.Errorf("%w: plugins.limits.call_timeout_ms %d", ErrCallTimeout, lim.CallTimeoutMS)
}

// build instantiates a new instance under a new slot; the caller holds
// the lock.
func (r *resident) build(ctx context.Context) error {
	if err := r.h.slots.acquire(ctx); err != nil {
		return err
	}
	in, err := r.h.newInstance(ctx, r.c)
	if err != nil {
		r.h.slots.release()
		return err
	}
	r.in = in
	return nil
}

// drop closes a failed instance and frees its slot; the caller holds the
// lock.
func (r *resident) drop() {
	if r.in != nil {
		r.h.discard(r.in)
		r.in = nil
	}
}

// metadata calls a no-argument export outside any service frame and
// decodes its JSON result into v. Only at load.
func (r *resident) metadata(ctx context.Context, export string, v any) error {
	out, err := r.in.call(ctx, nil, export, nil, true)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(out, v); err != nil {
		return fmt.Errorf("%w: %s returned invalid JSON", ErrABI, export)
	}
	return nil
}

// callRead runs one operational export in a service frame under the call
// limits, handing its answer to read as a view of the guest's memory,
// valid during read only (instance.callRead): a reader that keeps part of
// an answer of up to 16 MiB copies only that part. rebuild says whether a
// missing instance (after a failure) is rebuilt here; when false the
// plugin stays unavailable.
func (r *resident) callRead(ctx context.Context, export string, arg []byte, span frameSpan, rebuild bool, read func(view []byte)) error {
	if r.h.closed.Load() {
		return ErrClosed
	}
	ctx, cancel := r.h.callContext(ctx)
	defer cancel()
	if err := r.acquireLock(ctx); err != nil {
		return err
	}
	defer r.releaseLock()
	return r.callHeldRead(ctx, export, arg, span, rebuild, read)
}

// callAfterWait is callRead with the call deadline counted from when the
// instance is free: the wait for it is bounded by ctx alone. A channel's
// calls wait for one another (a reply behind a reply whose endpoint
// hangs, a poll behind both): counted from the request, the wait ate the
// budget, and a call asked for just after a hung one timed out with it
// without running, so the channel dropped an answer it had. The wait is
// still bounded: each call ahead runs within the limit, and the channel
// has a bounded number of callers.
//
// The answer is handed to read as callRead hands it.
func (r *resident) callAfterWait(ctx context.Context, export string, arg []byte, span frameSpan, rebuild bool, read func(view []byte)) error {
	if r.h.closed.Load() {
		return ErrClosed
	}
	if err := r.acquireLock(ctx); err != nil {
		return err
	}
	defer r.releaseLock()
	ctx, cancel := r.h.callContext(ctx)
	defer cancel()
	return r.callHeldRead(ctx, export, arg, span, rebuild, read)
}

// callSmall is callRead of an export whose ok value is small, decoded
// into v (nil for none) by decodeSmall as it is read.
func (r *resident) callSmall(ctx context.Context, export string, arg []byte, span frameSpan, rebuild bool, v any) error {
	var derr error
	if err := r.callRead(ctx, export, arg, span, rebuild, func(view []byte) { derr = decodeSmall(export, view, v) }); err != nil {
		return err
	}
	return derr
}

// callHeldRead is callRead once the lock is held.
func (r *resident) callHeldRead(ctx context.Context, export string, arg []byte, span frameSpan, rebuild bool, read func(view []byte)) error {
	if r.closed {
		return ErrClosed
	}
	if r.in == nil {
		if !rebuild {
			return fmt.Errorf("%w: instance was stopped by an earlier failure; rebuild it", ErrUnavailable)
		}
		if err := r.build(ctx); err != nil {
			return err
		}
		if r.onBuild != nil {
			if err := r.onBuild(ctx); err != nil {
				return err
			}
		}
	}
	return r.callLockedRead(ctx, export, arg, span, read)
}

// callLockedRead runs export on the current instance, handing its answer
// to read (callRead); the caller holds the lock and ctx carries the call
// deadline. A failed instance is dropped.
func (r *resident) callLockedRead(ctx context.Context, export string, arg []byte, span frameSpan, read func(view []byte)) error {
	return r.callLockedReadIn(ctx, r.inbound, export, arg, span, read)
}

// callLockedReadIn is callLockedRead with the frame's inbound queue
// inbound (nil: inbound_poll and inbound_pending answer empty).
func (r *resident) callLockedReadIn(ctx context.Context, inbound *InboundQueue, export string, arg []byte, span frameSpan, read func(view []byte)) error {
	span.plugin, span.world, span.export = r.c.spec.Name, string(r.c.spec.World), export
	f := &frame{host: r.h, plugin: r.c.spec, service: true, span: span, inbound: inbound}
	if abi.WorldHasImport(r.c.spec.World, abi.ImportConfigGet) {
		// Seed 003: the operator's values are materialised and validated
		// as a whole before any guest code of a configured world runs.
		if err := f.view(ctx); err != nil {
			f.drop()
			return err
		}
	}
	err := r.in.callRead(ctx, f, export, arg, true, read)
	if err != nil && r.in.broken {
		r.drop()
	}
	return err
}

// rebuild replaces the instance (whatever its state) with a new one.
func (r *resident) rebuild(ctx context.Context) error { return r.replace(ctx, true) }

// replace drops the instance (whatever its state) once no call runs on
// it; with build it makes the new one now, without, the next call does.
func (r *resident) replace(ctx context.Context, build bool) error {
	if r.h.closed.Load() {
		return ErrClosed
	}
	ctx, cancel := r.h.callContext(ctx)
	defer cancel()
	if err := r.acquireLock(ctx); err != nil {
		return err
	}
	defer r.releaseLock()
	if r.closed {
		return ErrClosed
	}
	r.drop()
	if !build {
		return nil
	}
	return r.build(ctx)
}

// close drops the instance and refuses further calls; safe twice. It
// waits for a running call to end.
func (r *resident) close() {
	r.lock <- struct{}{}
	defer r.releaseLock()
	r.closed = true
	if r.in != nil {
		r.h.discardNow(r.in)
		r.in = nil
	}
}

// decodeResult reads a WIT result<T, string> envelope: {"ok": T} into v
// (v may be nil for result<_, string>), or {"err": msg} as ErrPluginFailed.
//
// The envelope the guest library writes, {"ok":T} with nothing around it,
// is read by one decode of T: through the general path a 1 MiB recall
// answer was scanned four times (the envelope into a map, then T), 10 ms
// of plain text and 60 ms of control characters at about 100 MB/s of JSON
// (BenchmarkDecodeRecallAnswer). When T alone is valid JSON the general
// path's "ok" is exactly T, so both give the same answer; anything else,
// T's error included, takes the general path, which says what it is.
func decodeResult(export string, out []byte, v any) error {
	if v != nil {
		if t, ok := bytes.CutPrefix(out, []byte(`{"ok":`)); ok {
			if t, ok = bytes.CutSuffix(t, []byte("}")); ok && json.Unmarshal(t, v) == nil {
				return nil
			}
		}
	}
	return decodeEnvelope(export, out, v)
}

// decodeEnvelope is decodeResult's general path: any envelope
// encoding/json reads.
func decodeEnvelope(export string, out []byte, v any) error {
	var env map[string]json.RawMessage
	if err := json.Unmarshal(out, &env); err != nil {
		return fmt.Errorf("%w: %s returned invalid JSON", ErrABI, export)
	}
	okRaw, hasOK := env["ok"]
	errRaw, hasErr := env["err"]
	if hasOK == hasErr {
		return fmt.Errorf("%w: %s returned neither ok nor err", ErrABI, export)
	}
	if hasErr {
		var msg string
		if err := json.Unmarshal(errRaw, &msg); err != nil {
			return fmt.Errorf("%w: %s returned a non-string err", ErrABI, export)
		}
		return pluginFailed(msg, len(msg))
	}
	if v == nil {
		return nil
	}
	if err := json.Unmarshal(okRaw, v); err != nil {
		return fmt.Errorf("%w: %s returned a malformed ok value", ErrABI, export)
	}
	return nil
}

// flagSet reads a capability flag list such as ["health","typing"].
func flagSet(flags []string) map[string]bool {
	m := make(map[string]bool, len(flags))
	for _, f := range flags {
		m[f] = true
	}
	return m
}

// loadResident compiles spec, builds the resident instance, checks the ABI
// version and reads the metadata (outside any service frame).
func (h *Host) loadResident(ctx context.Context, spec PluginSpec, inbound *InboundQueue, meta func(context.Context, *resident) error) (*resident, error) {
	c, err := h.compile(ctx, spec)
	if err != nil {
		return nil, err
	}
	r := newResident(h, c, inbound)
	cctx, cancel := h.callContext(ctx)
	defer cancel()
	if err := r.build(cctx); err != nil {
		_ = c.mod.Close(ctx)
		return nil, err
	}
	err = r.in.checkVersion(cctx)
	if err == nil {
		err = meta(cctx, r)
	}
	if err != nil {
		r.close()
		_ = c.mod.Close(ctx)
		return nil, err
	}
	return r, nil
}
