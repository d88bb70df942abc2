package wasmhost_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	wb "github.com/clawmesh/clawmesh/services/pluginsandbox/wasmbin/wasmbuild"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// work returns n units of fuel: (i32.const 0; drop) n times (drop, like
// nop, is free).
func work(n int) []byte {
	var b []byte
	for range n {
		b = append(b, 0x41, 0x00, 0x1a)
	}
	return b
}

// The guest keeps its fuel counter in a local of each function (wasmbin):
// the watchdog's interrupt flag must still stop a loop that never calls
// anything and loops that spend their iterations in long straight code,
// in the loop's function or in another, with the garbage collector asking
// for stop-the-worlds all along. (With the counter in a local, a watchdog
// writing the counter itself would lose its write to the guest's next
// store of it, which in such loops comes a whole straight stretch after
// the guest last read it: hence the flag.)
func TestWatchdogStopsLoopWithCountInLocal(t *testing.T) {
	loops := map[string][]byte{
		"bare loop": handTool(func(b *wb.Builder, result []byte) []byte {
			return append([]byte{0x03, 0x40, 0x0c, 0x00, 0x0b}, result...) // loop; br 0; end
		}),
		"loop of straight code and an if": handTool(func(b *wb.Builder, result []byte) []byte {
			// loop; 5000 units; i32.const 1; if; nop; end; br 0; end
			body := append([]byte{0x03, 0x40}, work(5000)...)
			body = append(body, 0x41, 0x01, 0x04, 0x40, 0x01, 0x0b, 0x0c, 0x00, 0x0b)
			return append(body, result...)
		}),
		"loop calling straight code": handTool(func(b *wb.Builder, result []byte) []byte {
			straight := b.Func(b.Type(nil, nil), nil, append(work(5000), 0x0b))
			// loop; call straight; br 0; end
			return append([]byte{0x03, 0x40, 0x10, byte(straight), 0x0c, 0x00, 0x0b}, result...)
		}),
	}
	for name, wasm := range loops {
		t.Run(name, func(t *testing.T) {
			h := newHost(t, wasmhost.Limits{CallFuel: 1 << 60, CallTimeoutMS: 200})
			tool := loadHandTool(t, h, wasm)
			stopGC := collectContinuously()
			start := time.Now()
			_, err := tool.Execute(context.Background(), wasmhost.ToolCall{Args: args(map[string]string{})})
			elapsed := time.Since(start)
			stopGC()
			if !errors.Is(err, wasmhost.ErrCallTimeout) {
				t.Fatalf("err = %v after %v, want ErrCallTimeout", err, elapsed)
			}
			t.Logf("stopped after %v", elapsed)
		})
	}
}

// A call to another guest function keeps the exact count: the callee
// charges the counter the caller stored, and the caller goes on from the
// counter the callee left, to the instruction.
func TestFuelExactAcrossGuestCall(t *testing.T) {
	wasm := handTool(func(b *wb.Builder, result []byte) []byte {
		helper := b.Func(b.Type(nil, nil), nil, append(work(100), 0x0b))
		body := []byte{0x10, byte(helper), 0x41, 0x01, 0x04, 0x40} // call helper; i32.const 1; if
		body = append(body, work(50)...)
		body = append(body, 0x0b) // end
		return append(body, result...)
	})
	call := wasmhost.ToolCall{Args: args(map[string]string{})}
	big := loadHandTool(t, newHost(t, wasmhost.Limits{CallFuel: 1 << 30}), wasm)
	res, err := big.Execute(context.Background(), call)
	if err != nil || !res.Success {
		t.Fatalf("with a large budget: %+v, %v", res, err)
	}
	// alloc: its entry's unit, its entry segment 4 and its tail 1;
	// execute's entry segment (call; i32.const; if) 3 and its unit; the
	// helper 100 and its unit; the if-body 50; execute's tail 1 (end is
	// free).
	const need = 1 + 4 + 1 + 1 + 3 + 1 + 100 + 50 + 1
	if res.FuelUsed != need {
		t.Fatalf("fuel used = %d, want %d", res.FuelUsed, need)
	}
	// Short in execute's tail; in the if-body (by 1 and by all of it); at
	// the helper's entry (by 1, 100 and all its 101); at execute's entry
	// (by 1 and by all its 4); in alloc's tail; at alloc's entry.
	for _, budget := range []uint64{need - 1, need - 2, need - 51, need - 52, need - 151, need - 152, need - 153, need - 156, need - 157, need - 158} {
		t.Run(fmt.Sprint("budget ", budget), func(t *testing.T) {
			tool := loadHandTool(t, newHost(t, wasmhost.Limits{CallFuel: budget}), wasm)
			if _, err := tool.Execute(context.Background(), call); !errors.Is(err, wasmhost.ErrFuelExhausted) {
				t.Errorf("budget %d of %d: err = %v, want ErrFuelExhausted", budget, need, err)
			}
		})
	}
	exact := loadHandTool(t, newHost(t, wasmhost.Limits{CallFuel: need}), wasm)
	if res, err := exact.Execute(context.Background(), call); err != nil || !res.Success || res.FuelUsed != need {
		t.Errorf("budget exactly %d: %+v, %v", need, res, err)
	}
}

// A guest cannot name the counter local or the globals the fuel rewriter
// adds: tools whose loop refills the counter (local 2 of tool_execute,
// which has two parameters and no locals) or lowers the interrupt flag
// (global 1: the tool defines no global, so the fuel counter is 0) are
// refused at load, before any of their code can run.
func TestToolNamingTheMeteringStateIsRefused(t *testing.T) {
	refill := wb.S64([]byte{0x42}, 1<<62)
	escapes := map[string][]byte{
		// loop; i64.const 2^62; local.set 2; br 0; end
		"refills the counter local": append(append([]byte{0x03, 0x40}, refill...), 0x21, 0x02, 0x0c, 0x00, 0x0b),
		// loop; i64.const 2^62; local.set 2; i64.const 0; global.set 1; br 0; end
		"refills the counter and lowers the flag": append(append([]byte{0x03, 0x40}, refill...),
			0x21, 0x02, 0x42, 0x00, 0x24, 0x01, 0x0c, 0x00, 0x0b),
		// loop; i64.const 2^62; global.set 0; br 0; end
		"refills the fuel global": append(append([]byte{0x03, 0x40}, refill...), 0x24, 0x00, 0x0c, 0x00, 0x0b),
	}
	h := newHost(t, wasmhost.Limits{CallFuel: 10000, CallTimeoutMS: 100})
	for name, loop := range escapes {
		t.Run(name, func(t *testing.T) {
			wasm := handTool(func(b *wb.Builder, result []byte) []byte { return append(loop, result...) })
			tool, err := h.LoadTool(context.Background(), wasmhost.PluginSpec{Name: "minimal", Version: "0.1.0", Wasm: wasm})
			if err == nil {
				_ = tool.Close(context.Background())
				t.Fatal("the tool was loaded")
			}
			if !errors.Is(err, wasmhost.ErrInvalidModule) {
				t.Fatalf("err = %v, want ErrInvalidModule", err)
			}
		})
	}
}

// A module's start function runs under the limits of a call, before
// _initialize, as Wasmtime runs it on the store's fuel. wazero would run
// it inside instantiation, before the host sets the counter (0 then), so
// every start function trapped at its entry's charge and the module could
// not load; and one that spent its budget was not told from a broken
// module.
func TestStartFunctionRunsUnderCallLimits(t *testing.T) {
	call := wasmhost.ToolCall{Args: args(map[string]string{})}
	h := newHost(t, wasmhost.Limits{CallFuel: 10_000, CallTimeoutMS: 2_000})

	// (work; i64.const 7; global.set g; end): the tool sees what it set.
	sets := handTool(func(b *wb.Builder, result []byte) []byte {
		g := b.Global(0)
		start := append(work(100), 0x42, 0x07, 0x24, byte(g), 0x0b)
		b.Start(b.Func(b.Type(nil, nil), nil, start))
		return append([]byte{0x23, byte(g), 0x42, 0x07, 0x52, 0x04, 0x40, 0x00, 0x0b}, result...)
	})
	tool := loadHandTool(t, h, sets)
	if res, err := tool.Execute(context.Background(), call); err != nil || !res.Success {
		t.Fatalf("a tool whose start function sets a global: %+v, %v", res, err)
	}

	// loop; br 0; end: stopped by its budget, and said so.
	spins := handTool(func(b *wb.Builder, result []byte) []byte {
		b.Start(b.Func(b.Type(nil, nil), nil, []byte{0x03, 0x40, 0x0c, 0x00, 0x0b, 0x0b}))
		return result
	})
	_, err := h.LoadTool(context.Background(), wasmhost.PluginSpec{Name: "minimal", Version: "0.1.0", Wasm: spins})
	if !errors.Is(err, wasmhost.ErrFuelExhausted) || !strings.Contains(err.Error(), "start function") {
		t.Fatalf("a start function that never returns: err = %v, want ErrFuelExhausted naming the start function", err)
	}

	// A start function must take and return nothing, as the start section
	// requires: wasmbin's export of it must not make such a module valid.
	takes := handTool(func(b *wb.Builder, result []byte) []byte {
		b.Start(b.Func(b.Type([]byte{wb.I32}, nil), nil, []byte{0x0b}))
		return result
	})
	if _, err := h.LoadTool(context.Background(), wasmhost.PluginSpec{Name: "minimal", Version: "0.1.0", Wasm: takes}); !errors.Is(err, wasmhost.ErrInvalidModule) {
		t.Fatalf("a start function taking an i32: err = %v, want ErrInvalidModule", err)
	}

	// A module exporting the name the start function takes is refused.
	clash := handTool(func(b *wb.Builder, result []byte) []byte {
		b.ExportFunc("__clawmesh_start", b.Func(b.Type(nil, nil), nil, []byte{0x0b}))
		return result
	})
	if _, err := h.LoadTool(context.Background(), wasmhost.PluginSpec{Name: "minimal", Version: "0.1.0", Wasm: clash}); !errors.Is(err, wasmhost.ErrInvalidModule) {
		t.Fatalf("a module exporting __clawmesh_start: err = %v, want ErrInvalidModule", err)
	}
}

// fuel_left answers what the call has left at the moment of the import,
// to the unit: the guest stores its counter before every call.
func TestFuelLeftIsExact(t *testing.T) {
	const budget = 10_000
	// alloc: 1 + 4 + 1; execute's entry segment (call fuel_left; i64.const;
	// i64.ne; if) 4 and its unit, charged before the call.
	const left = budget - 6 - 5
	wasm := handToolImporting([]string{"fuel_left"}, func(b *wb.Builder, result []byte, imported []uint32) []byte {
		body := []byte{0x10, byte(imported[0])}
		body = append(wb.S64(append(body, 0x42), left), 0x52, 0x04, 0x40, 0x00, 0x0b) // i64.ne; if; unreachable; end
		return append(body, result...)
	})
	tool := loadHandTool(t, newHost(t, wasmhost.Limits{CallFuel: budget}), wasm)
	if res, err := tool.Execute(context.Background(), wasmhost.ToolCall{Args: args(map[string]string{})}); err != nil || !res.Success {
		t.Fatalf("fuel_left did not answer %d: %+v, %v", left, res, err)
	}
}
