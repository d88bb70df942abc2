package wasmhost

import (
	"context"
	"fmt"

	"github.com/clawmesh/clawmesh/plugins/abi"
)

// ObserverEvent is one host event handed to an observer plugin.
type ObserverEvent = abi.ObserverEvent

// Observer is a loaded observer plugin (an observability backend): one
// resident instance, refuelled before each call, importing only logging.
// After a limit or a trap its instance is rebuilt on the next event (an
// observer keeps nothing the host owns).
type Observer struct {
	r    *resident
	name string
}

// LoadObserver compiles an observer plugin, builds its instance and reads
// its name once.
func (h *Host) LoadObserver(ctx context.Context, spec PluginSpec) (*Observer, error) {
	spec.World = WorldObserver
	o := &Observer{}
	r, err := h.loadResident(ctx, spec, nil, func(ctx context.Context, r *resident) error {
		return r.metadata(ctx, abi.ExportObserverName, &o.name)
	})
	if err != nil {
		return nil, err
	}
	if o.name == "" {
		r.close()
		_ = r.c.mod.Close(ctx)
		return nil, fmt.Errorf("%w: observer_name is empty", ErrABI)
	}
	o.r = r
	return o, nil
}

// Name is the observer's name, read at load.
func (o *Observer) Name() string { return o.name }

// PluginName is the package name of the plugin.
func (o *Observer) PluginName() string { return o.r.c.spec.Name }

// RecordEvent hands one event to the plugin.
func (o *Observer) RecordEvent(ctx context.Context, e ObserverEvent) error {
	arg, err := guestJSON(e)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrABI, err)
	}
	return o.r.callSmall(ctx, abi.ExportObserverRecordEvent, arg, frameSpan{}, true, nil)
}

// Flush asks the plugin to flush what it buffers.
func (o *Observer) Flush(ctx context.Context) error {
	return o.r.callSmall(ctx, abi.ExportObserverFlush, nil, frameSpan{}, true, nil)
}

// Close waits for a running call, closes the instance and releases the
// compiled module.
func (o *Observer) Close(ctx context.Context) error {
	o.r.close()
	return o.r.c.mod.Close(ctx)
}
