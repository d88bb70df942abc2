package wasmhost_test

import (
	"context"
	"errors"
	"testing"

	wb "github.com/clawmesh/clawmesh/services/pluginsandbox/wasmbin/wasmbuild"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// resultlessTool is minimalTool with the export named void declared
// without a result: a module the host cannot read an answer from.
func resultlessTool(void string) []byte {
	var b wb.Builder
	i32, i64 := []byte{wb.I32}, []byte{wb.I64}
	b.Memory(2, 2, true)
	strs := []string{`"minimal"`, `"a hand-assembled tool"`, `{"type":"object"}`, `{"ok":{"success":true,"output":"ok"}}`}
	ptrLen := make([]int64, len(strs))
	off := int32(1024)
	for i, s := range strs {
		b.Data(off, []byte(s))
		ptrLen[i] = int64(off)<<32 | int64(len(s))
		off += int32(len(s))
	}
	// fn declares export's function: without a result (its body drops
	// the value it would have answered) when export is void.
	fn := func(export string, params, result, body []byte) uint32 {
		if export == void {
			return b.Func(b.Type(params, nil), nil, append(append(body[:len(body)-1:len(body)-1], 0x1a), 0x0b)) // drop; end
		}
		return b.Func(b.Type(params, result), nil, body)
	}
	constI64 := func(v int64) []byte { return append(wb.S64([]byte{0x42}, v), 0x0b) }
	b.ExportFunc("clawmesh_abi_version", fn("clawmesh_abi_version", nil, i32, []byte{0x41, 0x01, 0x0b}))
	b.ExportFunc("alloc", fn("alloc", i32, i32, []byte{0x41, 0x80, 0x80, 0x04, 0x0b}))
	b.ExportFunc("dealloc", b.Func(b.Type([]byte{wb.I32, wb.I32}, nil), nil, []byte{0x0b}))
	b.ExportFunc("tool_name", fn("tool_name", nil, i64, constI64(ptrLen[0])))
	b.ExportFunc("tool_description", fn("tool_description", nil, i64, constI64(ptrLen[1])))
	b.ExportFunc("tool_parameters_schema", fn("tool_parameters_schema", nil, i64, constI64(ptrLen[2])))
	b.ExportFunc("tool_execute", fn("tool_execute", []byte{wb.I32, wb.I32}, i64, constI64(ptrLen[3])))
	return b.Bytes()
}

// An export declared without the result the ABI gives it is the
// plugin's error, at load or at the call: the host read the first
// result of every call, and a module declaring none crashed the whole
// sandbox (an index out of range) at its first call.
func TestAnExportWithoutItsResultIsThePluginsError(t *testing.T) {
	h := newHost(t, wasmhost.Limits{})
	call := wasmhost.ToolCall{Args: args(map[string]string{"text": "x"})}
	for _, void := range []string{"clawmesh_abi_version", "alloc", "tool_name", "tool_description", "tool_parameters_schema", "tool_execute"} {
		t.Run(void, func(t *testing.T) {
			tool, err := h.LoadTool(context.Background(), wasmhost.PluginSpec{Name: "minimal", Version: "0.1.0", Wasm: resultlessTool(void)})
			if err == nil {
				defer tool.Close(context.Background())
				_, err = tool.Execute(context.Background(), call)
			}
			if !errors.Is(err, wasmhost.ErrABI) {
				t.Fatalf("a module whose %s has no result: %v, want an ErrABI", void, err)
			}
		})
	}
	// The control: the same module with every result declared works.
	tool, err := h.LoadTool(context.Background(), wasmhost.PluginSpec{Name: "minimal", Version: "0.1.0", Wasm: resultlessTool("")})
	if err != nil {
		t.Fatal(err)
	}
	defer tool.Close(context.Background())
	if res, err := tool.Execute(context.Background(), call); err != nil || !res.Success {
		t.Fatalf("the module with its results: %+v, %v", res, err)
	}
}
