package wasmhost_test

import (
	"context"
	"errors"
	"testing"
	"time"

	wb "github.com/clawmesh/clawmesh/services/pluginsandbox/wasmbin/wasmbuild"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// minimalTool encodes the smallest tool guest the ABI allows, written by
// hand (no compiler, no runtime): its metadata and its result are constant
// strings in a data segment, alloc hands out one fixed buffer, and
// tool_execute returns {"ok":{"success":true,"output":"ok"}}. It shows
// what a call costs the host itself, next to a Go guest's runtime.
//
// pad > 0 puts that many units of work in an if-body before the result:
// straight code, charged but not tested for exhaustion, with an exact fuel
// cost.
func minimalTool(pad int) []byte {
	return handTool(func(b *wb.Builder, result []byte) []byte {
		var body []byte
		if pad > 0 {
			body = append(body, 0x41, 0x01, 0x04, 0x40) // i32.const 1; if
			body = append(body, work(pad)...)
			body = append(body, 0x0b) // end
		}
		return append(body, result...)
	})
}

// handTool encodes a hand-assembled tool guest like minimalTool's whose
// tool_execute body is execute's: result is the code that pushes the
// constant result and ends. execute may add functions of its own.
func handTool(execute func(b *wb.Builder, result []byte) []byte) []byte {
	return handToolImporting(nil, func(b *wb.Builder, result []byte, _ []uint32) []byte { return execute(b, result) })
}

// handToolImporting is handTool whose module first imports the clawmesh
// functions named in imports, each of type () -> i64; execute gets their
// function indices.
func handToolImporting(imports []string, execute func(b *wb.Builder, result []byte, imported []uint32) []byte) []byte {
	var b wb.Builder
	i32, i64 := []byte{wb.I32}, []byte{wb.I64}
	var imported []uint32
	for _, name := range imports {
		imported = append(imported, b.ImportFunc("clawmesh", name, b.Type(nil, i64)))
	}
	b.Memory(2, 2, true)
	const argBuf = 65536 // the second page holds the arguments
	strs := []string{`"minimal"`, `"a hand-assembled tool"`, `{"type":"object"}`, `{"ok":{"success":true,"output":"ok"}}`}
	ptrLen := make([]int64, len(strs))
	off := int32(1024)
	for i, s := range strs {
		b.Data(off, []byte(s))
		ptrLen[i] = int64(off)<<32 | int64(len(s))
		off += int32(len(s))
	}
	constI64 := func(v int64) []byte { return append(wb.S64([]byte{0x42}, v), 0x0b) }

	version := b.Func(b.Type(nil, i32), nil, []byte{0x41, 0x01, 0x0b})
	// alloc(size): argBuf when the arguments fit in a page, else a trap.
	alloc := b.Func(b.Type(i32, i32), nil, []byte{
		0x20, 0x00, 0x41, 0x80, 0x80, 0x04, 0x4b, // local.get 0; i32.const 65536; i32.gt_u
		0x04, 0x40, 0x00, 0x0b, // if; unreachable; end
		0x41, 0x80, 0x80, 0x04, 0x0b, // i32.const argBuf (65536)
	})
	dealloc := b.Func(b.Type([]byte{wb.I32, wb.I32}, nil), nil, []byte{0x0b})
	meta := b.Type(nil, i64)
	name := b.Func(meta, nil, constI64(ptrLen[0]))
	desc := b.Func(meta, nil, constI64(ptrLen[1]))
	schema := b.Func(meta, nil, constI64(ptrLen[2]))
	body := execute(&b, constI64(ptrLen[3]), imported)
	exec := b.Func(b.Type([]byte{wb.I32, wb.I32}, i64), nil, body)

	b.ExportFunc("clawmesh_abi_version", version)
	b.ExportFunc("alloc", alloc)
	b.ExportFunc("dealloc", dealloc)
	b.ExportFunc("tool_name", name)
	b.ExportFunc("tool_description", desc)
	b.ExportFunc("tool_parameters_schema", schema)
	b.ExportFunc("tool_execute", exec)
	return b.Bytes()
}

func loadMinimal(tb testing.TB, h *wasmhost.Host, pad int) *wasmhost.Tool {
	tb.Helper()
	return loadHandTool(tb, h, minimalTool(pad))
}

func loadHandTool(tb testing.TB, h *wasmhost.Host, wasm []byte) *wasmhost.Tool {
	tb.Helper()
	tool, err := h.LoadTool(context.Background(), wasmhost.PluginSpec{Name: "minimal", Version: "0.1.0", Wasm: wasm})
	if err != nil {
		tb.Fatalf("load the minimal tool: %v", err)
	}
	tb.Cleanup(func() { _ = tool.Close(context.Background()) })
	return tool
}

// A call whose budget runs out in straight-line code returns normally
// from the guest (only loop headers and function entries test the
// counter), and is reported out of fuel all the same, at the same count
// as when every segment tested it.
func TestFuelSpentInStraightCodeIsExhaustion(t *testing.T) {
	call := wasmhost.ToolCall{Args: args(map[string]string{"text": "x"})}
	// Measure the exact cost with a large budget.
	big := loadMinimal(t, newHost(t, wasmhost.Limits{CallFuel: 1 << 30}), 100)
	res, err := big.Execute(context.Background(), call)
	if err != nil || !res.Success {
		t.Fatalf("with a large budget: %+v, %v", res, err)
	}
	need := res.FuelUsed
	// alloc: its entry segment (4 and the entry's unit) and its tail
	// (i32.const; end: 1, end is free); execute: its entry segment
	// (i32.const; if; the unit), the if-body (100 units and end) and its
	// tail (i64.const; end).
	if want := uint64(5 + 1 + 3 + 100 + 1); need != want {
		t.Fatalf("fuel used = %d, want %d", need, want)
	}
	for _, budget := range []uint64{need - 1, need - 50, need - 102} {
		tool := loadMinimal(t, newHost(t, wasmhost.Limits{CallFuel: budget}), 100)
		if _, err := tool.Execute(context.Background(), call); !errors.Is(err, wasmhost.ErrFuelExhausted) {
			t.Errorf("budget %d of %d: err = %v, want ErrFuelExhausted", budget, need, err)
		}
	}
	exact := loadMinimal(t, newHost(t, wasmhost.Limits{CallFuel: need}), 100)
	if res, err := exact.Execute(context.Background(), call); err != nil || !res.Success || res.FuelUsed != need {
		t.Errorf("budget exactly %d: %+v, %v", need, res, err)
	}
}

// BenchmarkMinimalCall is BenchmarkEchoCall's paced mode for the
// hand-assembled guest: a fresh instance per call, the pool given time to
// refill between calls as in a turn.
func BenchmarkMinimalCall(b *testing.B) {
	h := newHost(b, wasmhost.Limits{})
	tool := loadMinimal(b, h, 0)
	call := wasmhost.ToolCall{Args: args(map[string]string{"text": "hello"})}
	time.Sleep(50 * time.Millisecond) // let the pool fill
	timeCalls(b, tool, call, 2*time.Millisecond)
}
