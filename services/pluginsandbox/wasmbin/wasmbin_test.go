package wasmbin_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmbin"
	wb "github.com/clawmesh/clawmesh/services/pluginsandbox/wasmbin/wasmbuild"
)

// spinModule exports spin(n i32): a loop that runs n times. Instrumented, a
// call costs 5 an iteration and a unit for entering the function (its
// entry segment, the loop instruction, costs nothing else).
func spinModule() []byte {
	var b wb.Builder
	t := b.Type([]byte{wb.I32}, nil)
	f := b.Func(t, nil, []byte{
		0x03, 0x40, // loop
		0x20, 0x00, // local.get 0
		0x41, 0x01, // i32.const 1
		0x6b,       // i32.sub
		0x22, 0x00, // local.tee 0
		0x0d, 0x00, // br_if 0
		0x0b, // end
		0x0b, // end
	})
	b.ExportFunc("spin", f)
	return b.Bytes()
}

// work is k units of fuel: (i32.const 0; drop) k times.
func work(k int) []byte {
	var b []byte
	for range k {
		b = append(b, 0x41, 0x00, 0x1a)
	}
	return b
}

func instantiate(t *testing.T, wasm []byte) api.Module {
	t.Helper()
	ctx := context.Background()
	r := wazero.NewRuntime(ctx)
	t.Cleanup(func() { _ = r.Close(ctx) })
	mod, err := r.Instantiate(ctx, wasm)
	if err != nil {
		t.Fatalf("instantiate: %v", err)
	}
	return mod
}

// metered prepares wasm with fuel metering and instantiates it, and
// returns the module and its fuel counter.
func metered(t *testing.T, wasm []byte, maxTable uint64) (api.Module, api.MutableGlobal) {
	t.Helper()
	out, _, err := wasmbin.Prepare(wasm, wasmbin.Options{MaxTableElements: maxTable, Fuel: true})
	if err != nil {
		t.Fatal(err)
	}
	mod := instantiate(t, out)
	return mod, mod.ExportedGlobal(wasmbin.FuelGlobalExport).(api.MutableGlobal)
}

func TestFuelCountsExactly(t *testing.T) {
	out, rep, err := wasmbin.Prepare(spinModule(), wasmbin.Options{MaxTableElements: 10, Fuel: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.FuelCharges != 2 {
		t.Fatalf("charges = %d, want 2", rep.FuelCharges)
	}
	mod := instantiate(t, out)
	fuel := mod.ExportedGlobal(wasmbin.FuelGlobalExport).(api.MutableGlobal)
	spin := mod.ExportedFunction("spin")
	ctx := context.Background()

	for _, n := range []uint64{1, 10, 1000} {
		fuel.Set(1 << 40)
		if _, err := spin.Call(ctx, n); err != nil {
			t.Fatalf("spin(%d): %v", n, err)
		}
		used := int64(1<<40) - int64(fuel.Get())
		if want := int64(5*n + 1); used != want {
			t.Errorf("spin(%d) used %d fuel, want %d", n, used, want)
		}
	}

	// A budget one short of the need traps and leaves the counter negative.
	fuel.Set(uint64(5 * 100))
	if _, err := spin.Call(ctx, 100); err == nil {
		t.Fatal("spin with short budget did not trap")
	}
	if v := int64(fuel.Get()); v >= 0 {
		t.Errorf("fuel after trap = %d, want negative", v)
	}
}

// The counter is charged exactly at every segment but tested only at the
// function's entry and at loop headers: a budget spent in straight-line
// code is charged to the same count as when every segment tested it, and
// the call returns with the counter negative (the host reports that as
// exhaustion); a loop traps at its next header with the same count.
func TestFuelTestedAtEntriesAndLoopHeaders(t *testing.T) {
	var b wb.Builder
	ty := b.Type(nil, nil)
	// Segments: [i32.const 1; if] 2 and the entry's unit (tested),
	// [(i32.const 0; drop) x3; end] 3, [(i32.const 0; drop) x4; end] 4: 10
	// in all (drop and end are free).
	body := []byte{0x41, 0x01, 0x04, 0x40}
	body = append(body, work(3)...)
	body = append(body, 0x0b)
	body = append(body, work(4)...)
	straight := b.Func(ty, nil, append(body, 0x0b))
	b.ExportFunc("straight", straight)
	out, rep, err := wasmbin.Prepare(b.Bytes(), wasmbin.Options{MaxTableElements: 10, Fuel: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.FuelCharges != 3 {
		t.Fatalf("charges = %d, want 3", rep.FuelCharges)
	}
	mod := instantiate(t, out)
	fuel := mod.ExportedGlobal(wasmbin.FuelGlobalExport).(api.MutableGlobal)
	f := mod.ExportedFunction("straight")
	ctx := context.Background()
	for budget := int64(0); budget <= 12; budget++ {
		fuel.Set(uint64(budget))
		_, err := f.Call(ctx)
		left := int64(fuel.Get())
		switch {
		case budget < 3:
			// The entry segment's test traps before anything else runs.
			if err == nil || left != budget-3 {
				t.Errorf("budget %d: err %v, left %d; want a trap with %d", budget, err, left, budget-3)
			}
		default:
			// Past the entry, no test: the call returns, charged exactly.
			if err != nil || left != budget-10 {
				t.Errorf("budget %d: err %v, left %d; want a return with %d", budget, err, left, budget-10)
			}
		}
	}

	// spin's loop body is tested at every iteration: a budget k short of
	// the need traps in the iteration that spends it, as before.
	out, _, err = wasmbin.Prepare(spinModule(), wasmbin.Options{MaxTableElements: 10, Fuel: true})
	if err != nil {
		t.Fatal(err)
	}
	mod = instantiate(t, out)
	fuel = mod.ExportedGlobal(wasmbin.FuelGlobalExport).(api.MutableGlobal)
	spin := mod.ExportedFunction("spin")
	for _, short := range []int64{1, 4, 5, 6, 250} {
		budget := 5*100 + 1 - short
		fuel.Set(uint64(budget))
		if _, err := spin.Call(ctx, 100); err == nil {
			t.Fatalf("short by %d: no trap", short)
		}
		// Past the entry's unit, iterations paid in full: (budget-1)/5;
		// the next one's charge makes the counter negative and its header
		// test traps.
		want := budget - 1 - 5*((budget-1)/5+1)
		if left := int64(fuel.Get()); left != want {
			t.Errorf("short by %d: counter %d after the trap, want %d", short, left, want)
		}
	}
}

// A function keeps the counter in a local, stores it before a call and
// loads it after: the caller's and the callee's charges add up exactly, and
// a callee whose entry spends the budget traps there with the count of
// that moment.
func TestFuelExactAcrossCalls(t *testing.T) {
	var b wb.Builder
	ty := b.Type(nil, nil)
	callee := b.Func(ty, nil, append(work(4), 0x0b)) // one segment of 4, 5 with the entry
	// i32.const 1; drop; call callee; (i32.const 0; drop) x4; end: one
	// segment of 6 around the call, charged at the caller's entry with its
	// unit: 7.
	caller := b.Func(ty, nil, append(append([]byte{0x41, 0x01, 0x1a, 0x10, byte(callee)}, work(4)...), 0x0b))
	b.ExportFunc("caller", caller)
	mod, fuel := metered(t, b.Bytes(), 10)
	f := mod.ExportedFunction("caller")
	ctx := context.Background()
	for budget := int64(0); budget <= 14; budget++ {
		fuel.Set(uint64(budget))
		_, err := f.Call(ctx)
		left := int64(fuel.Get())
		switch {
		case budget < 7: // the caller's entry test
			if err == nil || left != budget-7 {
				t.Errorf("budget %d: err %v, left %d; want a trap with %d", budget, err, left, budget-7)
			}
		case budget < 12: // the callee's entry test
			if err == nil || left != budget-12 {
				t.Errorf("budget %d: err %v, left %d; want a trap with %d", budget, err, left, budget-12)
			}
		default:
			if err != nil || left != budget-12 {
				t.Errorf("budget %d: err %v, left %d; want a return with %d", budget, err, left, budget-12)
			}
		}
	}
}

// The interrupt flag is tested with the counter: raised before a call, the
// guest traps at its entry; raised while a loop runs (here by the host
// function the loop calls, in its k-th call), the loop traps at its next
// header, its counter stored exactly.
func TestInterruptFlagStopsEntriesAndLoops(t *testing.T) {
	for _, memory := range []bool{false, true} {
		var b wb.Builder
		ty := b.Type(nil, nil)
		tick := b.ImportFunc("env", "tick", ty)
		if memory {
			b.Memory(1, 1, true)
		}
		// spin(n): loop { call tick; n--; br_if n != 0 }: the entry segment
		// (loop) costs the entry's unit, each iteration 6.
		spin := b.Func(b.Type([]byte{wb.I32}, nil), nil, []byte{
			0x03, 0x40, 0x10, byte(tick), 0x20, 0x00, 0x41, 0x01, 0x6b, 0x22, 0x00, 0x0d, 0x00, 0x0b, 0x0b,
		})
		b.ExportFunc("spin", spin)
		out, _, err := wasmbin.Prepare(b.Bytes(), wasmbin.Options{MaxTableElements: 10, Fuel: true})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		r := wazero.NewRuntime(ctx)
		calls, raiseAt := 0, 0
		_, err = r.NewHostModuleBuilder("env").NewFunctionBuilder().
			WithFunc(func(ctx context.Context, m api.Module) {
				if calls++; calls == raiseAt {
					m.ExportedGlobal(wasmbin.InterruptGlobalExport).(api.MutableGlobal).Set(1 << 63)
				}
			}).Export("tick").Instantiate(ctx)
		if err != nil {
			t.Fatal(err)
		}
		mod, err := r.Instantiate(ctx, out)
		if err != nil {
			t.Fatal(err)
		}
		fuel := mod.ExportedGlobal(wasmbin.FuelGlobalExport).(api.MutableGlobal)
		flag := mod.ExportedGlobal(wasmbin.InterruptGlobalExport).(api.MutableGlobal)
		const budget = 1 << 40
		for _, k := range []int{1, 2, 50} {
			fuel.Set(budget)
			flag.Set(0)
			calls, raiseAt = 0, k
			if _, err := mod.ExportedFunction("spin").Call(ctx, 1000); err == nil {
				t.Fatalf("memory %v: flag raised in call %d: no trap", memory, k)
			}
			// The entry, k iterations paid and the next header's charge.
			if want := budget - 1 - 6*int64(k+1); calls != k || int64(fuel.Get()) != want {
				t.Errorf("memory %v: flag raised in call %d: %d calls, counter %d; want %d, %d",
					memory, k, calls, int64(fuel.Get()), k, want)
			}
		}
		fuel.Set(budget)
		flag.Set(1 << 63)
		calls, raiseAt = 0, 0
		if _, err := mod.ExportedFunction("spin").Call(ctx, 1000); err == nil || calls != 0 || int64(fuel.Get()) != budget-1 {
			t.Errorf("memory %v: flag raised before the call: err %v, %d calls, counter %d; want a trap at entry with %d",
				memory, err, calls, int64(fuel.Get()), budget-1)
		}
		_ = r.Close(ctx)
	}
}

func TestTableLimits(t *testing.T) {
	build := func(min, max uint32, hasMax, grow bool) []byte {
		var b wb.Builder
		ty := b.Type(nil, []byte{wb.I32})
		b.Table(min, max, hasMax)
		body := []byte{0x41, 0x00, 0x0b} // i32.const 0
		if grow {
			// ref.null func; i32.const 1; table.grow 0
			body = []byte{0xd0, 0x70, 0x41, 0x01, 0xfc, 0x0f, 0x00, 0x0b}
		}
		b.ExportFunc("f", b.Func(ty, nil, body))
		return b.Bytes()
	}
	cases := []struct {
		name      string
		wasm      []byte
		wantError bool
	}{
		{"small fixed", build(4, 8, true, false), false},
		{"no max, never grows", build(4, 0, false, false), false},
		{"no max, grows", build(4, 0, false, true), true},
		{"max within limit, grows", build(4, 100, true, true), false},
		{"max over limit", build(4, 1000, true, false), true},
		{"min over limit", build(1000, 1000, true, false), true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := wasmbin.Prepare(c.wasm, wasmbin.Options{MaxTableElements: 100, Fuel: true})
			if got := errors.Is(err, wasmbin.ErrTableLimit); got != c.wantError {
				t.Fatalf("err = %v, want table-limit error %v", err, c.wantError)
			}
		})
	}
}

func TestMergeDataKeepsContents(t *testing.T) {
	var b wb.Builder
	ty := b.Type(nil, nil)
	b.ExportFunc("f", b.Func(ty, nil, []byte{0x0b}))
	b.Memory(1, 1, true)
	b.Data(16, []byte("hello"))
	b.Data(24, []byte("world"))
	b.Data(9000, []byte("far"))
	out, rep, err := wasmbin.Prepare(b.Bytes(), wasmbin.Options{MaxTableElements: 1, MergeData: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.DataSegmentsBefore != 3 || rep.DataSegmentsAfter != 2 {
		t.Fatalf("segments %d -> %d, want 3 -> 2", rep.DataSegmentsBefore, rep.DataSegmentsAfter)
	}
	mod := instantiate(t, out)
	mem, _ := mod.Memory().Read(0, 9100)
	want := make([]byte, 9100)
	copy(want[16:], "hello")
	copy(want[24:], "world")
	copy(want[9000:], "far")
	if !bytes.Equal(mem, want) {
		t.Fatal("memory contents differ after merging")
	}
}

func TestRefusesMalformed(t *testing.T) {
	good := spinModule()
	// Every cut inside the last (code) section is malformed.
	codeStart := bytes.LastIndexByte(good[:len(good)-14], 0x0a)
	for i := codeStart + 1; i < len(good); i++ {
		if _, _, err := wasmbin.Prepare(good[:i], wasmbin.Options{MaxTableElements: 1, Fuel: true}); !errors.Is(err, wasmbin.ErrMalformed) {
			t.Fatalf("truncated at %d: err = %v, want ErrMalformed", i, err)
		}
	}
}

// The rewriter adds a local to every function (the counter) and two
// globals (the fuel counter and the interrupt flag). Guest code naming
// them is invalid in the module as written but would be valid once
// rewritten, and wazero sees only the rewritten module: such code could
// refill its own budget or lower the host's interrupt flag. Prepare
// refuses it.
func TestRefusesIndicesOfAddedLocalAndGlobals(t *testing.T) {
	// f(i32) with one declared i64 local: locals 0 and 1 exist, the
	// counter would be 2. One defined global (0): the fuel counter would
	// be 1 and the interrupt flag 2.
	build := func(body []byte, exportGlobal int) []byte {
		var b wb.Builder
		b.Global(7)
		f := b.Func(b.Type([]byte{wb.I32}, nil), []byte{0x01, 0x01, wb.I64}, append(body, 0x0b))
		b.ExportFunc("f", f)
		if exportGlobal >= 0 {
			b.ExportGlobal("g", uint32(exportGlobal))
		}
		return b.Bytes()
	}
	bigI64 := wb.S64([]byte{0x42}, 1<<62)
	zeroI64 := []byte{0x42, 0x00}
	cases := []struct {
		name   string
		body   []byte
		export int
		refuse bool
	}{
		{"local.get of the last local", []byte{0x20, 0x01, 0x1a}, -1, false},
		{"global.get and global.set of the module's global", []byte{0x23, 0x00, 0x24, 0x00}, -1, false},
		{"export of the module's global", nil, 0, false},
		{"local.get of the counter", []byte{0x20, 0x02, 0x1a}, -1, true},
		{"local.set of the counter", append(bigI64, 0x21, 0x02), -1, true},
		{"local.tee of the counter", append(bigI64, 0x22, 0x02, 0x1a), -1, true},
		{"local.set far past the counter", append(bigI64, 0x21, 0x80, 0x80, 0x04), -1, true},
		{"global.get of the fuel counter", []byte{0x23, 0x01, 0x1a}, -1, true},
		{"global.set of the fuel counter", append(bigI64, 0x24, 0x01), -1, true},
		{"global.set of the interrupt flag", append(zeroI64, 0x24, 0x02), -1, true},
		{"export of the fuel counter", nil, 1, true},
		{"export of the interrupt flag", nil, 2, true},
	}
	ctx := context.Background()
	r := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	t.Cleanup(func() { _ = r.Close(ctx) })
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			wasm := build(c.body, c.export)
			// The fixture itself is what it claims: valid exactly when it
			// should be accepted.
			if mod, err := r.CompileModule(ctx, wasm); (err != nil) != c.refuse {
				t.Fatalf("wazero on the original: %v, want invalid %v", err, c.refuse)
			} else if err == nil {
				_ = mod.Close(ctx)
			}
			out, _, err := wasmbin.Prepare(wasm, wasmbin.Options{MaxTableElements: 10, Fuel: true})
			if !c.refuse {
				if err != nil {
					t.Fatalf("Prepare: %v", err)
				}
				mod, err := r.CompileModule(ctx, out)
				if err != nil {
					t.Fatalf("rewritten module does not compile: %v", err)
				}
				_ = mod.Close(ctx)
				return
			}
			if !errors.Is(err, wasmbin.ErrMalformed) {
				t.Fatalf("Prepare: err = %v, want ErrMalformed", err)
			}
		})
	}
}

// A section's declared count is the module's word, not a size to
// allocate: a 16-byte section announcing hundreds of millions of entries
// is refused without reserving room for them, here or later in wazero's
// decoder (found by FuzzPrepare: the fuzzing worker ran out of memory).
func TestCountsDoNotSizeAllocations(t *testing.T) {
	for _, wasm := range [][]byte{
		[]byte("\x00asm\x01\x00\x00\x00\n\x10\xe0\xe0\xe0\xe00'0000000000"), // code
		[]byte("\x00asm\x01\x00\x00\x00\v\x10\xe0\xe0\xe000\x80000000%000"), // data
	} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, _, err := wasmbin.Prepare(wasm, wasmbin.Options{MaxTableElements: 100, Fuel: true, MergeData: true})
		runtime.ReadMemStats(&after)
		if !errors.Is(err, wasmbin.ErrMalformed) {
			t.Errorf("section %d: err = %v, want ErrMalformed", wasm[8], err)
		}
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
			t.Errorf("section %d: Prepare of a 26-byte module allocated %d bytes", wasm[8], grew)
		}
	}
}

// Counts inside a section's entries size allocations too (wazero makes a
// slice of a data segment's declared size, of an element vector's declared
// length and of a function's declared locals): a few bytes declaring
// gigabytes are refused by Prepare whatever the options, before any such
// allocation, as is a function with more than MaxLocals locals.
func TestCountsInsideSectionsDoNotSizeAllocations(t *testing.T) {
	const magic = "\x00asm\x01\x00\x00\x00"
	memory := "\x05\x03\x01\x00\x00"
	funcType := "\x01\x04\x01\x60\x00\x00\x03\x02\x01\x00" // type ()->(); one function of it
	body := func(locals string) string {
		b := locals + "\x0b"
		code := "\x01" + string(wb.U32(nil, uint32(len(b)))) + b
		return "\x0a" + string(wb.U32(nil, uint32(len(code)))) + code
	}
	locals := func(groups ...uint32) string {
		s := string(wb.U32(nil, uint32(len(groups))))
		for _, n := range groups {
			s += string(wb.U32(nil, n)) + "\x7f"
		}
		return s
	}
	gib3 := "\x80\x80\x80\x80\x0c" // 3 GiB
	two27 := "\x80\x80\x80\x40"    // 2^27
	cases := []struct {
		name string
		wasm string
		ok   bool
	}{
		{"passive data segment of 3 GiB", magic + memory + "\x0b\x07\x01\x01" + gib3, false},
		{"data segment of 3 GiB for memory 0 by index", magic + memory + "\x0b\x0b\x01\x02\x00\x41\x00\x0b" + gib3, false},
		{"active data segment of 3 GiB", magic + memory + "\x0b\x0a\x01\x00\x41\x00\x0b" + gib3, false},
		{"active data segment of 3 GiB at a computed offset",
			magic + "\x02\x08\x01\x01m\x01g\x03\x7f\x00" + memory + "\x0b\x0a\x01\x00\x23\x00\x0b" + gib3, false},
		{"data segment longer than the section", magic + memory + "\x0b\x05\x01\x01\x05ab", false},
		{"element vector of 2^27 function indices", magic + "\x09\x07\x01\x01\x00" + two27, false},
		{"element vector of 2^27 expressions", magic + "\x09\x07\x01\x05\x70" + two27, false},
		{"active element vector of 2^27", magic + "\x09\x08\x01\x00\x41\x00\x0b" + two27, false},
		{"local group of 2^28", magic + funcType + body(locals(1<<28)), false},
		{"locals over the limit in two groups", magic + funcType + body(locals(wasmbin.MaxLocals/2, wasmbin.MaxLocals/2+1)), false},
		{"locals at the limit", magic + funcType + body(locals(wasmbin.MaxLocals/2, wasmbin.MaxLocals/2)), true},
		{"passive data segment that fits", magic + memory + "\x0b\x06\x01\x01\x03abc", true},
		{"function type of 2^27 parameters", magic + section(1, "\x01\x60"+two27+"\x00"), false},
		{"function type of 2^27 results", magic + section(1, "\x01\x60\x00"+two27), false},
		{"function type (i32, i64) -> f32", magic + section(1, "\x01\x60\x02\x7f\x7e\x01\x7d"), true},
		{"name section naming 2^27 functions", magic + section(0, "\x04name"+subsection(1, two27)), false},
		{"name section with local names of 2^27 functions", magic + section(0, "\x04name"+subsection(2, two27)), false},
		{"name section with 2^27 local names of one function", magic + section(0, "\x04name"+subsection(2, "\x01\x00"+two27)), false},
		{"name section with a name past its map", magic + section(0, "\x04name"+subsection(1, "\x01\x00\x7fab")), false},
		{"name section with a module name of 4 GiB", magic + section(0, "\x04name"+subsection(0, "\xf0\xff\xff\xff\x0f")), false},
		{"custom section named with 4 GiB", magic + section(0, "\xf0\xff\xff\xff\x0fab"), false},
		{"name section naming a function and its local", magic + funcType + section(0, "\x04name"+subsection(0, "\x01m")+
			subsection(1, "\x01\x00\x01f")+subsection(2, "\x01\x00\x01\x00\x01x")) + body(locals(1)), true},
	}
	ctx := context.Background()
	r := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer r.Close(ctx)
	for _, c := range cases {
		for _, opts := range []wasmbin.Options{
			{MaxTableElements: 100},
			{MaxTableElements: 100, Fuel: true},
			{MaxTableElements: 100, MergeData: true},
			{MaxTableElements: 100, Fuel: true, MergeData: true},
		} {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			out, _, err := wasmbin.Prepare([]byte(c.wasm), opts)
			runtime.ReadMemStats(&after)
			if c.ok {
				if err != nil {
					t.Errorf("%s (fuel %v, merge %v): %v", c.name, opts.Fuel, opts.MergeData, err)
				} else if mod, err := r.CompileModule(ctx, out); err != nil {
					t.Errorf("%s (fuel %v, merge %v): wazero refuses the prepared module: %v", c.name, opts.Fuel, opts.MergeData, err)
				} else {
					_ = mod.Close(ctx)
				}
				continue
			}
			if !errors.Is(err, wasmbin.ErrMalformed) {
				t.Errorf("%s (fuel %v, merge %v): err = %v, want ErrMalformed", c.name, opts.Fuel, opts.MergeData, err)
			}
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
				t.Errorf("%s (fuel %v, merge %v): Prepare of %d bytes allocated %d bytes", c.name, opts.Fuel, opts.MergeData, len(c.wasm), grew)
			}
		}
	}
}

// section encodes a section of the id around payload.
func section(id byte, payload string) string {
	return string([]byte{id}) + string(wb.U32(nil, uint32(len(payload)))) + payload
}

// subsection encodes a name subsection (the same framing as a section).
func subsection(id byte, payload string) string { return section(id, payload) }

// FuzzPrepare feeds Prepare arbitrary bytes: it must not panic; a module
// wazero accepts must still be accepted once rewritten (the rewriter
// inserts code around calls, exits and loop headers, and a local in every
// function); and a module wazero refuses must not become acceptable once
// rewritten (the added local and globals must not give meaning to indices
// that had none: see TestRefusesIndicesOfAddedLocalAndGlobals).
func FuzzPrepare(f *testing.F) {
	f.Add(spinModule())
	f.Add(callsFixture(false))
	f.Add(callsFixture(true))
	f.Add(escapeFixture())
	ctx := context.Background()
	// Without DWARF, as the host compiles: with it wazero refuses an empty
	// custom section at the end of a module, which the rewrite moves.
	r := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter().WithDebugInfoEnabled(false))
	f.Cleanup(func() { _ = r.Close(ctx) })
	f.Fuzz(func(t *testing.T, b []byte) {
		out, _, err := wasmbin.Prepare(b, wasmbin.Options{MaxTableElements: 100, Fuel: true, MergeData: true})
		if err == nil && len(out) < 8 {
			t.Fatal("short output without error")
		}
		if err != nil {
			return
		}
		in, inErr := r.CompileModule(ctx, b)
		if inErr == nil {
			_ = in.Close(ctx)
		}
		rewritten, outErr := r.CompileModule(ctx, out)
		if outErr == nil {
			_ = rewritten.Close(ctx)
		}
		switch {
		case inErr == nil && outErr != nil:
			t.Fatalf("the input compiles, the rewritten module does not: %v", outErr)
		case inErr != nil && outErr == nil:
			t.Fatalf("the input does not compile (%v), the rewritten module does", inErr)
		}
	})
}

// callsFixture is a module with calls, call_indirect, early returns and
// nested loops (the same shapes as the reference test's).
func callsFixture(memory bool) []byte {
	var b wb.Builder
	tI32 := b.Type([]byte{wb.I32}, []byte{wb.I32})
	if memory {
		b.Memory(1, 1, true)
	}
	leaf := b.Func(tI32, nil, []byte{0x20, 0x00, 0x41, 0x03, 0x6a, 0x0b})
	run := b.Func(tI32, []byte{0x01, 0x01, wb.I32}, []byte{
		0x02, 0x40, 0x03, 0x40, // block; loop
		0x20, 0x00, 0x45, 0x0d, 0x01, // local.get 0; i32.eqz; br_if 1
		0x20, 0x01, 0x10, byte(leaf), 0x21, 0x01, // acc = leaf(acc)
		0x20, 0x01, 0x41, 0x00, 0x11, byte(tI32), 0x00, 0x21, 0x01, // acc = table[0](acc)
		0x20, 0x01, 0x41, 0x28, 0x4a, 0x04, 0x40, 0x20, 0x01, 0x0f, 0x0b, // if acc > 40 return acc
		0x20, 0x00, 0x41, 0x01, 0x6b, 0x21, 0x00, 0x0c, 0x00, // n--; br 0
		0x0b, 0x0b, 0x20, 0x01, 0x0b,
	})
	b.Table(1, 1, true)
	b.Elem(0, leaf)
	b.ExportFunc("run", run)
	return b.Bytes()
}

// escapeFixture is a module whose only function sets the local and the
// global the rewriter would add: invalid, and a seed from which the fuzzer
// reaches the other indices.
func escapeFixture() []byte {
	var b wb.Builder
	b.Global(0)
	body := append(wb.S64([]byte{0x03, 0x40, 0x42}, 1<<62), 0x21, 0x01, 0x42, 0x00, 0x24, 0x02, 0x0c, 0x00, 0x0b, 0x0b)
	b.ExportFunc("f", b.Func(b.Type([]byte{wb.I32}, nil), nil, body))
	return b.Bytes()
}

// The seed's engine charges nothing for what compiles to no code: a Go
// guest's function is a loop around a br_table under one block per
// resumption point, re-entered at every jump, and was charged for every
// block each time. Here a dispatch over 100 blocks costs its two real
// instructions an iteration, as in Wasmtime.
func TestFuelChargesNothingForBlocks(t *testing.T) {
	const blocks = 100
	var b wb.Builder
	// loop; block x100; local.get 0; br_table 0 (out of the innermost);
	// end; local.get 0; i32.const 1; i32.sub; local.tee 0; br_if (the
	// loop); end x99; end (loop); end
	body := []byte{0x03, 0x40}
	for range blocks {
		body = append(body, 0x02, 0x40)
	}
	body = append(body, 0x20, 0x00, 0x0e, 0x00, 0x00, 0x0b)
	body = append(body, 0x20, 0x00, 0x41, 0x01, 0x6b, 0x22, 0x00, 0x0d, blocks-1)
	for range blocks - 1 {
		body = append(body, 0x0b)
	}
	body = append(body, 0x0b, 0x0b)
	f := b.Func(b.Type([]byte{wb.I32}, nil), nil, body)
	b.ExportFunc("dispatch", f)
	mod, fuel := metered(t, b.Bytes(), 10)
	for _, n := range []uint64{1, 10, 1000} {
		fuel.Set(1 << 40)
		if _, err := mod.ExportedFunction("dispatch").Call(context.Background(), n); err != nil {
			t.Fatal(err)
		}
		// The entry's unit, then an iteration: local.get; br_table; then
		// local.get; i32.const; i32.sub; local.tee; br_if.
		if used, want := int64(1<<40)-int64(fuel.Get()), int64(7*n+1); used != want {
			t.Errorf("dispatch(%d) used %d fuel, want %d", n, used, want)
		}
	}
}

// A guest loop yields to the Go runtime once its counter crosses a
// multiple of the yield period, wherever in the loop that happens. Before,
// only the header's own charge was looked at: here it is 3 units of an
// iteration's 32 as main counted them (2 of 16 now), and the budget put
// every header at 16 modulo 32, so no header saw a crossing, the loop
// never left compiled code, a collection's stop-the-world waited for it,
// and so did the goroutine meant to raise the interrupt flag, until the
// budget was spent.
func TestLoopsYieldWhateverTheirShape(t *testing.T) {
	var b wb.Builder
	b.Memory(1, 1, true)
	// loop; block; i32.const 0; br_if 0; (13 units); nop; end; br 1 (the
	// loop); end; end
	body := []byte{0x03, 0x40, 0x02, 0x40, 0x41, 0x00, 0x0d, 0x00}
	body = append(body, work(13)...)
	body = append(body, 0x01, 0x0b, 0x0c, 0x00, 0x0b, 0x0b)
	f := b.Func(b.Type(nil, nil), nil, body)
	b.ExportFunc("forever", f)
	out, _, err := wasmbin.Prepare(b.Bytes(), wasmbin.Options{MaxTableElements: 10, Fuel: true})
	if err != nil {
		t.Fatal(err)
	}
	mod := instantiate(t, out)
	const budget = 1<<34 + 17 // seconds of this loop
	mod.ExportedGlobal(wasmbin.FuelGlobalExport).(api.MutableGlobal).Set(budget)
	mod.ExportedGlobal(wasmbin.YieldMarkGlobalExport).(api.MutableGlobal).Set(wasmbin.YieldMark(budget))
	flag := mod.ExportedGlobal(wasmbin.InterruptGlobalExport).(api.MutableGlobal)

	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			default:
				runtime.GC()
			}
		}
	}()
	raise := time.AfterFunc(50*time.Millisecond, func() { flag.Set(1 << 63) })
	defer raise.Stop()
	_, err = mod.ExportedFunction("forever").Call(context.Background())
	close(quit)
	<-done
	left := int64(mod.ExportedGlobal(wasmbin.FuelGlobalExport).(api.MutableGlobal).Get())
	if err == nil || left < 0 {
		t.Fatalf("err %v, counter %d: the loop ran until its budget was spent, not stopped by the flag", err, left)
	}
	t.Logf("stopped by the flag with %d of %d units left", left, int64(budget))
}

// The globals the rewriter adds are exported under names a module must not
// use itself: one that does is refused, whichever of the three it takes.
func TestRefusesTheAddedNames(t *testing.T) {
	for _, name := range []string{wasmbin.FuelGlobalExport, wasmbin.InterruptGlobalExport, wasmbin.YieldMarkGlobalExport} {
		var b wb.Builder
		b.ExportGlobal(name, b.Global(0))
		if _, _, err := wasmbin.Prepare(b.Bytes(), wasmbin.Options{MaxTableElements: 10, Fuel: true}); !errors.Is(err, wasmbin.ErrNameClash) {
			t.Errorf("a module exporting %s: err = %v, want ErrNameClash", name, err)
		}
	}
}

// A bulk instruction pays for its length, a unit a byte or element, as in
// Wasmtime, before it runs: charged its unit alone, a memory.fill of the
// whole memory cost what an add does, and a loop of them ran for its
// deadline, not its fuel.
func TestFuelChargesBulkLengths(t *testing.T) {
	var b wb.Builder
	b.Memory(2, 2, true)
	ty := b.Type([]byte{wb.I32}, nil)
	// fill(n): i32.const 0; i32.const 7; local.get 0; memory.fill; end
	fill := b.Func(ty, nil, []byte{0x41, 0x00, 0x41, 0x07, 0x20, 0x00, 0xfc, 0x0b, 0x00, 0x0b})
	// move(n): i32.const 65536; i32.const 0; local.get 0; memory.copy; end
	move := b.Func(ty, nil, []byte{0x41, 0x80, 0x80, 0x04, 0x41, 0x00, 0x20, 0x00, 0xfc, 0x0a, 0x00, 0x00, 0x0b})
	b.Table(65536, 65536, true)
	// clear(n): i32.const 0; ref.null func; local.get 0; table.fill 0; end
	clear := b.Func(ty, nil, []byte{0x41, 0x00, 0xd0, 0x70, 0x20, 0x00, 0xfc, 0x11, 0x00, 0x0b})
	b.ExportFunc("fill", fill)
	b.ExportFunc("move", move)
	b.ExportFunc("clear", clear)
	mod, fuel := metered(t, b.Bytes(), 65536)
	ctx := context.Background()
	for _, name := range []string{"fill", "move", "clear"} {
		for _, n := range []uint64{0, 1, 1000, 65536} {
			fuel.Set(1 << 40)
			if _, err := mod.ExportedFunction(name).Call(ctx, n); err != nil {
				t.Fatalf("%s(%d): %v", name, n, err)
			}
			// The entry's unit, three operands and the instruction, then
			// the length.
			if used, want := int64(1<<40)-int64(fuel.Get()), int64(5+n); used != want {
				t.Errorf("%s(%d) used %d fuel, want %d", name, n, used, want)
			}
		}
	}
	// A budget short of the length traps before a byte is written.
	mem := mod.ExportedMemory("memory")
	mem.Write(0, make([]byte, 65536))
	fuel.Set(5 + 65536 - 1)
	if _, err := mod.ExportedFunction("fill").Call(ctx, 65536); err == nil {
		t.Fatal("a fill the budget cannot pay for ran")
	}
	if got, _ := mem.ReadByte(0); got != 0 || int64(fuel.Get()) != -1 {
		t.Errorf("after the trap: memory[0] = %d, counter %d; want 0, -1", got, int64(fuel.Get()))
	}
}

// Wasmtime's own fuel tests (tests/all/fuel.wast: a start function run
// with consume_fuel) give what each function below costs there; every one
// of those counts is two more than the rewriter charges the same function,
// the empty function included (3 there, 1 here): what Wasmtime spends
// around running a start function, outside the function's own code. The
// differences between the cases are the whole cost table: an instruction
// a unit, none for nop, drop, block, loop, else, end, unreachable and
// return, a unit to enter a function, a unit a byte or element of a bulk
// instruction, and nothing for code a branch skips.
func TestFuelMatchesWasmtimesCounts(t *testing.T) {
	i32 := func(v int64) []byte { return wb.S64([]byte{0x41}, v) }
	cat := func(parts ...[]byte) []byte {
		var out []byte
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	end := []byte{0x0b}
	const (
		none = iota
		memory
		table
	)
	type other struct {
		params, results []byte
		body            []byte
	}
	type wastCase struct {
		name     string
		wasmtime int64 // fuel.wast's count
		body     []byte
		other    *other // function 1, called by f
		has      int
		tableMin uint32
		traps    bool
	}
	cases := []wastCase{
		{name: "empty", wasmtime: 3, body: end},
		{name: "const drop", wasmtime: 4, body: cat(i32(0), []byte{0x1a}, end)},
		{name: "block", wasmtime: 3, body: []byte{0x02, 0x40, 0x0b, 0x0b}},
		{name: "unreachable", wasmtime: 3, body: []byte{0x00, 0x0b}, traps: true},
		{name: "six consts, unreachable", wasmtime: 9,
			body: cat(i32(0), i32(0), i32(0), i32(0), i32(0), i32(0), []byte{0x00, 0x0b}), traps: true},
		{name: "return before code", wasmtime: 3,
			body: cat([]byte{0x0f}, i32(0), i32(0), i32(0), i32(0), i32(0), i32(0), []byte{0x00, 0x0b})},
		{name: "if not taken", wasmtime: 5, body: cat(i32(0), []byte{0x04, 0x40, 0x10, 0x00, 0x0b, 0x0b})},
		{name: "if taken", wasmtime: 6, body: cat(i32(1), []byte{0x04, 0x40}, i32(0), []byte{0x1a, 0x0b, 0x0b})},
		{name: "if taken, else skipped", wasmtime: 6,
			body: cat(i32(1), []byte{0x04, 0x40}, i32(0), []byte{0x1a, 0x05, 0x10, 0x00, 0x0b, 0x0b})},
		{name: "else taken", wasmtime: 6,
			body: cat(i32(0), []byte{0x04, 0x40, 0x10, 0x00, 0x05}, i32(0), []byte{0x1a, 0x0b, 0x0b})},
		{name: "br_if taken", wasmtime: 5,
			body: cat([]byte{0x02, 0x40}, i32(1), []byte{0x0d, 0x00}, i32(0), []byte{0x1a, 0x0b, 0x0b})},
		{name: "br_if not taken", wasmtime: 6,
			body: cat([]byte{0x02, 0x40}, i32(0), []byte{0x0d, 0x00}, i32(0), []byte{0x1a, 0x0b, 0x0b})},
		{name: "code before unreachable", wasmtime: 4, body: cat(i32(0), []byte{0x00, 0x0b}), traps: true},
		{name: "code before return", wasmtime: 4, body: cat(i32(0), []byte{0x0f, 0x0b})},
		{name: "call of an empty function", wasmtime: 5, body: []byte{0x10, 0x01, 0x0b}, other: &other{body: end}},
		{name: "call with an argument", wasmtime: 7,
			body:  cat(i32(0), []byte{0x10, 0x01}, i32(0), []byte{0x1a, 0x0b}),
			other: &other{params: []byte{wb.I32}, body: end}},
		{name: "call with a result", wasmtime: 6, body: []byte{0x10, 0x01, 0x1a, 0x0b},
			other: &other{results: []byte{wb.I32}, body: cat(i32(0), end)}},
		{name: "call_indirect", wasmtime: 6, body: cat(i32(0), []byte{0x11, 0x00, 0x00, 0x0b}),
			other: &other{body: end}, has: table, tableMin: 1},
		{name: "empty loop", wasmtime: 3, body: []byte{0x03, 0x40, 0x0b, 0x0b}},
		{name: "ten iterations", wasmtime: 55, body: cat(i32(10), []byte{0x21, 0x00, 0x03, 0x40, 0x20, 0x00},
			i32(1), []byte{0x6b, 0x22, 0x00, 0x0d, 0x00, 0x0b, 0x0b})},
	}
	// The bulk instructions at 100 and at 200 (past 128, Wasmtime pays the
	// length after the instruction has run: the same count). operands are
	// what each pushes before its length.
	for _, n := range []int64{100, 200} {
		for _, bc := range []struct {
			name     string
			operands []byte
			op       []byte
			has      int
			tableMin uint32
			extra    int64 // fuel.wast's count is 7 + n (2 around the start function, the entry, 3 operands, the instruction) + extra
		}{
			{"memory.copy", cat(i32(0), i32(0)), []byte{0xfc, 0x0a, 0x00, 0x00}, memory, 0, 0},
			{"memory.fill", cat(i32(0), i32(0)), []byte{0xfc, 0x0b, 0x00}, memory, 0, 0},
			{"table.copy", cat(i32(0), i32(0)), []byte{0xfc, 0x0e, 0x00, 0x00}, table, uint32(n), 0},
			{"table.fill", cat(i32(0), []byte{0xd0, 0x70}), []byte{0xfc, 0x11, 0x00}, table, uint32(n), 0},
			// ref.null; delta; table.grow; drop (its result): an operand fewer.
			{"table.grow", []byte{0xd0, 0x70}, []byte{0xfc, 0x0f, 0x00, 0x1a}, table, 0, -1},
		} {
			cases = append(cases, wastCase{
				name:     fmt.Sprint(bc.name, " ", n),
				wasmtime: 7 + n + bc.extra, // fuel.wast: 107, 106 (table.grow), 207, 206
				body:     cat(bc.operands, i32(n), bc.op, end),
				has:      bc.has, tableMin: bc.tableMin,
			})
		}
	}
	const outside = 2 // what fuel.wast counts around a start function
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var b wb.Builder
			switch c.has {
			case memory:
				b.Memory(1, 1, true)
			case table:
				b.Table(c.tableMin, 1000, true)
			}
			f := b.Func(b.Type(nil, nil), []byte{0x01, 0x01, wb.I32}, c.body)
			if c.other != nil {
				g := b.Func(b.Type(c.other.params, c.other.results), nil, c.other.body)
				if c.has == table {
					b.Elem(0, g)
				}
			}
			b.ExportFunc("f", f)
			mod, fuel := metered(t, b.Bytes(), 1000)
			fuel.Set(1 << 40)
			_, err := mod.ExportedFunction("f").Call(context.Background())
			if trapped := err != nil; trapped != c.traps {
				t.Fatalf("err = %v, want a trap: %v", err, c.traps)
			}
			if used, want := int64(1<<40)-int64(fuel.Get()), c.wasmtime-outside; used != want {
				t.Errorf("used %d fuel, want %d (Wasmtime's %d less %d)", used, want, c.wasmtime, outside)
			}
		})
	}
}

// A start section becomes an export the host calls under its limits: the
// prepared module instantiates without running it (here it would trap),
// and the export runs it, charged like any function. A start section with
// bytes past its index is refused.
func TestStartSectionBecomesExport(t *testing.T) {
	var b wb.Builder
	start := b.Func(b.Type(nil, nil), nil, append(work(3), 0x00, 0x0b)) // 3 units; unreachable
	b.Start(start)
	wasm := b.Bytes()
	out, _, err := wasmbin.Prepare(wasm, wasmbin.Options{MaxTableElements: 10, Fuel: true})
	if err != nil {
		t.Fatal(err)
	}
	mod := instantiate(t, out)
	fn := mod.ExportedFunction(wasmbin.StartExport)
	if fn == nil {
		t.Fatalf("no export %s", wasmbin.StartExport)
	}
	fuel := mod.ExportedGlobal(wasmbin.FuelGlobalExport).(api.MutableGlobal)
	fuel.Set(100)
	if _, err := fn.Call(context.Background()); err == nil {
		t.Fatal("the start function did not trap")
	}
	if left := int64(fuel.Get()); left != 100-4 {
		t.Errorf("counter %d after the start function, want %d", left, 100-4)
	}

	// The sections of wasm, walked to the start section (id 8, one byte of
	// size): given a byte past its index.
	for pos := 8; pos < len(wasm); {
		id, size := wasm[pos], int(wasm[pos+1])
		if id == 8 {
			bad := append(append(append([]byte(nil), wasm[:pos]...), 8, byte(size+1)), wasm[pos+2:pos+2+size]...)
			bad = append(append(bad, 0x00), wasm[pos+2+size:]...)
			if _, _, err := wasmbin.Prepare(bad, wasmbin.Options{MaxTableElements: 10, Fuel: true}); !errors.Is(err, wasmbin.ErrMalformed) {
				t.Errorf("a start section with a trailing byte: err = %v, want ErrMalformed", err)
			}
			return
		}
		pos += 2 + size
	}
	t.Fatal("no start section in the module")
}
