package wasmhost

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/clawmesh/clawmesh/plugins/abi"
)

// ToolCall is one invocation of a tool.
type ToolCall struct {
	// CallID and Principal attribute the call (logs, audit).
	CallID, Principal string
	// Args is the JSON object of arguments. A caller-supplied "__config" is
	// stripped; the host injects the validated public config there.
	Args json.RawMessage
	// OutputLimit, when above zero, is how many bytes of the output, and
	// of an error, the caller keeps: a longer one comes back cut to at
	// most that many bytes at a character boundary, with OutputBytes or
	// ErrorBytes its whole size.
	OutputLimit int
}

// ToolResult is the tool-result record. A guest's err result becomes
// Success false with Error set.
type ToolResult struct {
	Success bool
	Output  string
	Error   *string
	// OutputBytes is the whole output's size when Output was cut to the
	// call's OutputLimit, else zero.
	OutputBytes int
	// ErrorBytes is the whole error's size when Error was cut to the
	// call's OutputLimit, else zero.
	ErrorBytes int
	// FuelUsed is the fuel the call spent (argument copy and result read
	// included); it is deterministic for a deterministic guest.
	FuelUsed uint64
}

// Tool is a loaded tool plugin. Each Execute runs in a fresh instance.
type Tool struct {
	h    *Host
	c    *compiled
	pool *pool

	name        string
	description string
	schema      json.RawMessage
}

// LoadTool compiles a tool plugin, checks its ABI version and reads its
// name, description and parameters schema once, in an instance that is then
// discarded.
func (h *Host) LoadTool(ctx context.Context, spec PluginSpec) (*Tool, error) {
	spec.World = WorldTool
	c, err := h.compile(ctx, spec)
	if err != nil {
		return nil, err
	}
	c.callExport = abi.ExportToolExecute
	t := &Tool{h: h, c: c}
	if err := h.withMetadataInstance(ctx, c, func(ctx context.Context, in *instance) error {
		var err error
		if err = in.callJSON(ctx, abi.ExportToolName, &t.name); err != nil {
			return err
		}
		if err = in.callJSON(ctx, abi.ExportToolDescription, &t.description); err != nil {
			return err
		}
		var raw json.RawMessage
		if err = in.callJSON(ctx, abi.ExportToolParametersSchema, &raw); err != nil {
			return err
		}
		t.schema = raw
		return nil
	}); err != nil {
		_ = c.mod.Close(ctx)
		return nil, err
	}
	if err := checkToolMetadata(t.name, t.description, t.schema); err != nil {
		_ = c.mod.Close(ctx)
		return nil, err
	}
	t.pool = newPool(h, c, h.cfg.PoolSize)
	return t, nil
}

// Bounds on a tool's metadata. Each was read up to 16 MiB, the bound of
// any guest result, and every tool goes into one ListTools answer, which
// gRPC caps at 16 MiB: one tool whose schema held 16 MiB made the listing
// fail, and the session service then saw no plugin tool at all.
const (
	MaxToolName        = 64
	MaxToolDescription = 16 << 10
	MaxToolSchema      = 64 << 10
)

// checkToolMetadata refuses a tool's metadata past its bounds.
func checkToolMetadata(name, description string, schema []byte) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: tool_name is empty", ErrABI)
	case len(name) > MaxToolName:
		return fmt.Errorf("%w: tool_name is %d bytes; the limit is %d", ErrABI, len(name), MaxToolName)
	case len(description) > MaxToolDescription:
		return fmt.Errorf("%w: tool_description is %d bytes; the limit is %d", ErrABI, len(description), MaxToolDescription)
	case len(schema) > MaxToolSchema:
		return fmt.Errorf("%w: tool_parameters_schema is %d bytes; the limit is %d", ErrABI, len(schema), MaxToolSchema)
	}
	return nil
}

// Name, Description and ParametersSchema are the metadata read at load.
func (t *Tool) Name() string                      { return t.name }
func (t *Tool) Description() string               { return t.description }
func (t *Tool) ParametersSchema() json.RawMessage { return t.schema }

// PluginName is the package name of the plugin.
func (t *Tool) PluginName() string { return t.c.spec.Name }

// Close stops the tool's pool and releases its compiled module.
func (t *Tool) Close(ctx context.Context) error {
	t.pool.close()
	return t.c.mod.Close(ctx)
}

// Execute runs the tool once in a fresh instance under every limit: the
// deadline covers waiting for an instance slot, the guest and its imports.
// Errors wrap the package's sentinels (ErrFuelExhausted, ErrCallTimeout,
// ErrMemoryLimit, ErrTrap, ErrInstanceLimit, ErrConfig, ...).
func (t *Tool) Execute(ctx context.Context, call ToolCall) (ToolResult, error) {
	args, err := readToolArgs(call.Args)
	if err != nil {
		return ToolResult{}, err
	}

	ctx, cancel := t.h.callContext(ctx)
	defer cancel()
	f := &frame{
		host: t.h, plugin: t.c.spec, service: true,
		span: frameSpan{plugin: t.c.spec.Name, world: string(WorldTool), export: abi.ExportToolExecute, callID: call.CallID, principal: call.Principal},
	}
	if err := f.view(ctx); err != nil {
		return ToolResult{}, err
	}
	var config json.RawMessage
	if len(f.public) > 0 {
		if config, err = json.Marshal(f.public); err != nil {
			return ToolResult{}, fmt.Errorf("%w: %w", ErrConfig, err)
		}
	}
	argJSON, err := args.with(config)
	if err != nil {
		return ToolResult{}, err
	}

	in, err := t.h.acquire(ctx, t.pool)
	if err != nil {
		return ToolResult{}, err
	}
	defer t.h.discard(in)
	// The envelope is read from the guest's memory, not from a copy of
	// it: only the output's kept start is written out.
	var (
		env                     abi.ToolEnvelope
		outputBytes, errorBytes int
		decodeErr               error
	)
	if err := in.callRead(ctx, f, abi.ExportToolExecute, argJSON, false, func(view []byte) {
		env, outputBytes, errorBytes, decodeErr = abi.DecodeToolEnvelopeCut(view, call.OutputLimit)
	}); err != nil {
		return ToolResult{}, err
	}
	if decodeErr != nil || (env.Ok == nil) == (env.Err == nil) {
		return ToolResult{}, fmt.Errorf("%w: tool_execute returned neither ok nor err", ErrABI)
	}
	used := t.h.cfg.Limits.CallFuel - uint64(in.fuelLeft())
	if in.fuel == nil {
		used = 0
	}
	if env.Err != nil {
		return ToolResult{Success: false, Error: env.Err, ErrorBytes: errorBytes, FuelUsed: used}, nil
	}
	return ToolResult{Success: env.Ok.Success, Output: env.Ok.Output, Error: env.Ok.Error,
		OutputBytes: outputBytes, ErrorBytes: errorBytes, FuelUsed: used}, nil
}

// withMetadataInstance runs fn in a new instance outside any service frame
// (config and secrets answer unavailable), after checking the ABI version,
// then discards the instance.
func (h *Host) withMetadataInstance(ctx context.Context, c *compiled, fn func(context.Context, *instance) error) error {
	ctx, cancel := h.callContext(ctx)
	defer cancel()
	if err := h.slots.acquire(ctx); err != nil {
		return err
	}
	in, err := h.newInstance(ctx, c)
	if err != nil {
		h.slots.release()
		return err
	}
	defer h.discardNow(in)
	if err := in.checkVersion(ctx); err != nil {
		return err
	}
	return fn(ctx, in)
}

func (in *instance) checkVersion(ctx context.Context) error {
	fn := in.mod.ExportedFunction(abi.ExportABIVersion)
	var res []uint64
	// Under the call's budget like any export: the counter holds what
	// _initialize left, or nothing in a guest without one.
	_, err := in.invoke(ctx, nil, func(ctx context.Context) ([]byte, error) {
		var err error
		res, err = fn.Call(ctx)
		return nil, err
	})
	if err != nil {
		return fmt.Errorf("%w: clawmesh_abi_version: %w", ErrABI, err)
	}
	if len(res) != 1 {
		return fmt.Errorf("%w: clawmesh_abi_version returned %d values, want one i32", ErrABI, len(res))
	}
	if uint32(res[0]) != ABIVersion {
		return fmt.Errorf("%w: module speaks ABI version %d, host speaks %d", ErrABI, uint32(res[0]), ABIVersion)
	}
	return nil
}

// callJSON calls a metadata export (no argument, no frame) and decodes its
// JSON result into v.
func (in *instance) callJSON(ctx context.Context, export string, v any) error {
	out, err := in.call(ctx, nil, export, nil, true)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(out, v); err != nil {
		return fmt.Errorf("%w: %s returned invalid JSON", ErrABI, export)
	}
	return nil
}
