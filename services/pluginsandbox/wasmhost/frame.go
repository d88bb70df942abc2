package wasmhost

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/clawmesh/clawmesh/plugins/abi"
)

// MaxHostCallsPerFrame is the fixed per-frame budget shared by every
// Clawmesh-owned import (logging, config, secrets, inbound, HTTP). When it is
// spent, logging does nothing, inbound polling reports empty, and config,
// secret and HTTP calls return unavailable. A new frame resets it.
const MaxHostCallsPerFrame = abi.MaxHostCallsPerFrame

// frameSpan is the attribution captured with each log record.
type frameSpan struct {
	plugin, world, export, callID, principal string
}

// frame is the host state of one guest call: one export invocation and every
// import it makes. Imports run on the calling goroutine, so a frame is never
// touched concurrently. The materialised config view lives only as long as
// the frame.
type frame struct {
	host    *Host
	plugin  *PluginSpec
	span    frameSpan
	service bool // an authorised service frame: config, secrets, HTTP allowed
	calls   int

	resolved   bool
	resolveErr error
	public     map[string]any
	secrets    map[string]string
	denied     map[string]bool

	httpResp []byte
	inbound  *InboundQueue
}

type frameKey struct{}

func withFrame(ctx context.Context, f *frame) context.Context {
	return context.WithValue(ctx, frameKey{}, f)
}

func frameFrom(ctx context.Context) *frame {
	f, _ := ctx.Value(frameKey{}).(*frame)
	return f
}

// spend takes one host call from the frame's budget.
func (f *frame) spend() bool {
	f.calls++
	return f.calls <= MaxHostCallsPerFrame
}

// view resolves the plugin's config once for the frame: one revision,
// materialised, validated and partitioned into public values and secrets.
// When config_read is not effectively granted, the empty object is
// validated instead, so a schema with required properties fails safely.
func (f *frame) view(ctx context.Context) error {
	if f.resolved {
		return f.resolveErr
	}
	f.resolved = true
	schema := f.plugin.Schema
	if schema == nil {
		return nil
	}
	values := map[string]string{}
	if f.plugin.Grants.ConfigRead {
		if f.plugin.Config == nil {
			f.resolveErr = fmt.Errorf("%w: no config source", ErrConfig)
			return f.resolveErr
		}
		rev, err := f.plugin.Config.Resolve(ctx, f.plugin.InstanceKey)
		switch {
		case errors.Is(err, ErrNoConfig):
		case err != nil:
			f.resolveErr = fmt.Errorf("%w: resolve: %w", ErrConfig, err)
			return f.resolveErr
		default:
			values = rev.Values
			for _, k := range rev.Denied {
				if f.denied == nil {
					f.denied = map[string]bool{}
				}
				f.denied[k] = true
			}
		}
	}
	pub, sec, err := schema.Materialize(values)
	if err != nil {
		f.resolveErr = fmt.Errorf("%w: %w", ErrConfig, err)
		return f.resolveErr
	}
	f.public, f.secrets = pub, sec
	return nil
}

// publicJSON is the public config as JSON, for config.get.
func (f *frame) publicJSON() []byte {
	if f.public == nil {
		return []byte("{}")
	}
	b, _ := json.Marshal(f.public)
	return b
}

// drop clears the materialised view; called on every exit path.
func (f *frame) drop() {
	f.public, f.secrets, f.denied, f.httpResp = nil, nil, nil, nil
}
