package wasmhost

import (
	"context"
	"math"

	"github.com/tetratelabs/wazero/api"

	"github.com/clawmesh/clawmesh/plugins/abi"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmbin"
)

// HostModule is the import module name of the plugin ABI.
const HostModule = abi.HostModule

// Result codes of host imports (plugins/ABI.md).
const (
	codeAccessDenied    = abi.CodeAccessDenied
	codeNotFound        = abi.CodeNotFound
	codeUnavailable     = abi.CodeUnavailable
	codeInvalidArgument = abi.CodeInvalidArgument
	codeTooLarge        = abi.CodeTooLarge
)

var (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

// instantiateImports registers the "clawmesh" host module. Every function
// finds its call frame through the context wazero passes in; none calls
// back into the guest, and the only one that waits (http_request) honours
// the context.
func (h *Host) instantiateImports(ctx context.Context) error {
	b := h.rt.NewHostModuleBuilder(HostModule)
	fn := func(name string, f api.GoModuleFunc, params, results []api.ValueType) {
		b.NewFunctionBuilder().WithGoModuleFunction(f, params, results).Export(name)
	}
	fn(abi.ImportLogRecord, h.importLogRecord, []api.ValueType{i32, i32, i32}, nil)
	fn(abi.ImportSecretsGet, h.importSecretsGet, []api.ValueType{i32, i32, i32, i32}, []api.ValueType{i64})
	fn(abi.ImportConfigGet, h.importConfigGet, []api.ValueType{i32, i32}, []api.ValueType{i64})
	fn(abi.ImportInboundPoll, h.importInboundPoll, []api.ValueType{i32, i32}, []api.ValueType{i64})
	fn(abi.ImportInboundPending, h.importInboundPending, nil, []api.ValueType{i32})
	fn(abi.ImportHTTPRequest, h.importHTTPRequest, []api.ValueType{i32, i32}, []api.ValueType{i64})
	fn(abi.ImportHTTPResponse, h.importHTTPResponse, []api.ValueType{i32, i32}, []api.ValueType{i64})
	fn(abi.ImportFuelLeft, importFuelLeft, nil, []api.ValueType{i64})
	_, err := b.Instantiate(ctx)
	return err
}

// importFuelLeft answers the fuel the calling guest has left: the guest
// stores its counter into the global before every call (wasmbin), so the
// global holds it exactly. It spends nothing of the frame's budget of host
// calls: it does no work a guest's own fuel does not already pay for. A
// guest run without metering has all the fuel there is.
func importFuelLeft(_ context.Context, m api.Module, stack []uint64) {
	g, ok := m.ExportedGlobal(wasmbin.FuelGlobalExport).(api.MutableGlobal)
	if !ok {
		stack[0] = math.MaxInt64
		return
	}
	stack[0] = g.Get()
}

// writeOut copies data into the guest buffer when it fits and returns the
// length either way: the guest retries with a larger buffer.
func writeOut(m api.Module, ptr, capacity uint32, data []byte) int64 {
	if uint32(len(data)) > capacity {
		return int64(len(data))
	}
	if !m.Memory().Write(ptr, data) {
		return codeInvalidArgument
	}
	return int64(len(data))
}

func readGuest(m api.Module, ptr, size uint32) ([]byte, bool) {
	b, ok := m.Memory().Read(ptr, size)
	if !ok {
		return nil, false
	}
	return append([]byte(nil), b...), true
}

func (h *Host) importLogRecord(ctx context.Context, m api.Module, stack []uint64) {
	level, ptr, size := api.DecodeU32(stack[0]), api.DecodeU32(stack[1]), api.DecodeU32(stack[2])
	var span frameSpan
	if f := frameFrom(ctx); f != nil {
		if !f.spend() {
			h.logs.dropped.Add(1)
			return
		}
		span = f.span
	}
	h.logs.offer(span, level, size, func() ([]byte, bool) { return readGuest(m, ptr, size) })
}

func (h *Host) importSecretsGet(ctx context.Context, m api.Module, stack []uint64) {
	namePtr, nameLen := api.DecodeU32(stack[0]), api.DecodeU32(stack[1])
	buf, capacity := api.DecodeU32(stack[2]), api.DecodeU32(stack[3])
	stack[0] = u64(h.secretsGet(ctx, m, namePtr, nameLen, buf, capacity))
}

func (h *Host) secretsGet(ctx context.Context, m api.Module, namePtr, nameLen, buf, capacity uint32) int64 {
	f := frameFrom(ctx)
	if f == nil || !f.service || !f.spend() {
		return codeUnavailable
	}
	if !f.plugin.Grants.ConfigRead || !abi.WorldHasImport(f.plugin.World, abi.ImportSecretsGet) {
		return codeAccessDenied // memory and observer worlds have no secrets import
	}
	if nameLen > 256 {
		return codeNotFound
	}
	name, ok := readGuest(m, namePtr, nameLen)
	if !ok {
		return codeInvalidArgument
	}
	if err := f.view(ctx); err != nil {
		return codeUnavailable
	}
	v, ok := f.secrets[string(name)]
	switch {
	case f.denied[string(name)]:
		return codeAccessDenied
	case !ok:
		return codeNotFound
	}
	return writeOut(m, buf, capacity, []byte(v))
}

func (h *Host) importConfigGet(ctx context.Context, m api.Module, stack []uint64) {
	buf, capacity := api.DecodeU32(stack[0]), api.DecodeU32(stack[1])
	f := frameFrom(ctx)
	switch {
	case f == nil || !f.service || !f.spend():
		stack[0] = u64(codeUnavailable)
	case !abi.WorldHasImport(f.plugin.World, abi.ImportConfigGet):
		// Seed 003 gives config only to the channel world: a tool reads its
		// public config in __config, memory and observer have none.
		stack[0] = u64(codeAccessDenied)
	case !f.plugin.Grants.ConfigRead || f.plugin.Schema == nil:
		stack[0] = u64(codeAccessDenied)
	case f.view(ctx) != nil:
		stack[0] = u64(codeUnavailable)
	default:
		stack[0] = u64(writeOut(m, buf, capacity, f.publicJSON()))
	}
}

func (h *Host) importInboundPoll(ctx context.Context, m api.Module, stack []uint64) {
	buf, capacity := api.DecodeU32(stack[0]), api.DecodeU32(stack[1])
	f := frameFrom(ctx)
	if f == nil || !f.service || f.inbound == nil || !f.spend() {
		stack[0] = 0
		return
	}
	msg, size := f.inbound.popIfFits(capacity)
	if msg == nil {
		stack[0] = u64(int64(size))
		return
	}
	if !m.Memory().Write(buf, msg) {
		stack[0] = u64(codeInvalidArgument)
		return
	}
	stack[0] = u64(int64(size))
}

func (h *Host) importInboundPending(ctx context.Context, _ api.Module, stack []uint64) {
	f := frameFrom(ctx)
	if f == nil || !f.service || f.inbound == nil || !f.spend() {
		stack[0] = 0
		return
	}
	stack[0] = api.EncodeU32(uint32(f.inbound.Pending()))
}

func (h *Host) importHTTPRequest(ctx context.Context, m api.Module, stack []uint64) {
	ptr, size := api.DecodeU32(stack[0]), api.DecodeU32(stack[1])
	f := frameFrom(ctx)
	switch {
	case f == nil || !f.service || !f.spend():
		stack[0] = u64(codeUnavailable)
		return
	case !f.plugin.httpAllowed():
		stack[0] = u64(codeAccessDenied)
		return
	case int64(size) > h.cfg.HTTP.MaxRequestBytes*2+64<<10:
		stack[0] = u64(codeTooLarge)
		return
	}
	req, ok := readGuest(m, ptr, size)
	if !ok {
		stack[0] = u64(codeInvalidArgument)
		return
	}
	resp, code := h.doHTTP(ctx, req)
	if code < 0 {
		stack[0] = u64(code)
		return
	}
	f.httpResp = resp
	stack[0] = u64(int64(len(resp)))
}

func (h *Host) importHTTPResponse(ctx context.Context, m api.Module, stack []uint64) {
	buf, capacity := api.DecodeU32(stack[0]), api.DecodeU32(stack[1])
	f := frameFrom(ctx)
	if f == nil || f.httpResp == nil {
		stack[0] = u64(codeUnavailable)
		return
	}
	n := writeOut(m, buf, capacity, f.httpResp)
	if n >= 0 && n <= int64(capacity) {
		f.httpResp = nil
	}
	stack[0] = u64(n)
}

// u64 stores a signed result in a wasm i64 stack slot.
func u64(v int64) uint64 { return uint64(v) }
