package wasmbin

import (
	"context"
	"math"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	wb "github.com/clawmesh/clawmesh/services/pluginsandbox/wasmbin/wasmbuild"
)

// The rewriter before the counter moved into a local of each function:
// every segment charges the global itself (global.get; i64.const cost;
// i64.sub; global.set), and the sign is tested at function entries and
// loop headers. It is kept here as the reference the rewriter must agree
// with: the same counter at every return and every trap. Its costs are
// stated here again, from Wasmtime's table (an instruction one unit;
// nop, drop, block, loop, else, end, unreachable and return none, a
// function's entry one), not
// taken from instrCost, which would agree with itself.
func refInstrumentBody(expr []byte, g uint32, yield bool, out []byte) []byte {
	segStart, n, cost := 0, 0, 1 // a unit for entering the function
	afterLoop := false
	for pos := 0; pos < len(expr); {
		op, next, err := nextInstr(expr, pos)
		if err != nil {
			panic(err)
		}
		n++
		switch expr[pos] {
		case 0x01, 0x1a, 0x02, 0x03, 0x05, 0x0b, 0x00, 0x0f:
		default:
			cost++
		}
		pos = next
		if !segmentEnds(op) {
			continue
		}
		if segStart == 0 || n > 1 || (op != opEnd && op != opElse) {
			if yield && afterLoop {
				out = refAppendCharge(out, g, int64(cost), false)
				out = refAppendLoopTest(out, g, int64(cost))
			} else {
				out = refAppendCharge(out, g, int64(cost), segStart == 0 || afterLoop)
			}
		}
		out = append(out, expr[segStart:pos]...)
		segStart, n, cost = pos, 0, 0
		afterLoop = op == opLoop
	}
	return out
}

func refAppendCharge(out []byte, g uint32, cost int64, check bool) []byte {
	out = append(out, 0x23)
	out = appendU32(out, g)
	out = append(out, 0x42)
	out = appendS64(out, cost)
	out = append(out, 0x7d, 0x24)
	out = appendU32(out, g)
	if !check {
		return out
	}
	out = append(out, 0x23)
	out = appendU32(out, g)
	return append(out, 0x42, 0x00, 0x53, 0x04, 0x40, 0x00, 0x0b)
}

func refAppendLoopTest(out []byte, g uint32, cost int64) []byte {
	out = append(out, 0x23)
	out = appendU32(out, g)
	out = append(out, 0x42)
	out = appendS64(out, math.MinInt64|(yieldPeriod-1))
	out = append(out, 0x83, 0x42)
	out = appendS64(out, cost)
	out = append(out, 0x7d, 0x42)
	out = appendS64(out, yieldPeriod)
	out = append(out, 0x5a, 0x04, 0x40, 0x23)
	out = appendU32(out, g)
	out = append(out, 0x42, 0x00, 0x53, 0x04, 0x40, 0x00, 0x0b)
	return append(out, 0x41, 0x00, 0x40, 0x00, 0x1a, 0x0b)
}

// refPrepare instruments wasm with the reference rewriter: one exported
// global, the fuel counter.
func refPrepare(t *testing.T, wasm []byte) []byte {
	t.Helper()
	m, err := Parse(wasm)
	if err != nil {
		t.Fatal(err)
	}
	bodies, err := decodeCode(m.section(secCode))
	if err != nil {
		t.Fatal(err)
	}
	g := m.ImportedGlobals + m.DefinedGlobals
	code := appendU32(nil, uint32(len(bodies)))
	for _, b := range bodies {
		body := refInstrumentBody(b.expr, g, m.HasMemory, append([]byte(nil), b.locals...))
		code = appendU32(code, uint32(len(body)))
		code = append(code, body...)
	}
	m.setSection(secCode, code)
	globals := appendU32(nil, m.DefinedGlobals+1)
	if old := m.section(secGlobal); old != nil {
		_, pos, _ := readU32(old, 0)
		globals = append(globals, old[pos:]...)
	}
	m.setSection(secGlobal, append(globals, 0x7e, 0x01, 0x42, 0x00, 0x0b))
	exports := appendU32(nil, uint32(len(m.Exports)+1))
	if old := m.section(secExport); old != nil {
		_, pos, _ := readU32(old, 0)
		exports = append(exports, old[pos:]...)
	}
	exports = appendName(exports, FuelGlobalExport)
	exports = append(exports, 0x03)
	m.setSection(secExport, appendU32(exports, g))
	return m.Encode()
}

// callsModule exercises every way the counter crosses a function boundary:
// call, call_indirect, return, br_if, br and br_table to the function's
// label, an unreachable of the guest's own, tree recursion, nested loops,
// a function of nothing but its end.
// run(n) returns a value depending on every path taken.
func callsModule(memory bool) []byte {
	var b wb.Builder
	tI32I32 := b.Type([]byte{wb.I32}, []byte{wb.I32})
	tI32 := b.Type([]byte{wb.I32}, nil)
	if memory {
		b.Memory(1, 1, true)
	}
	// leaf(x) = x + 3
	leaf := b.Func(tI32I32, nil, []byte{0x20, 0x00, 0x41, 0x03, 0x6a, 0x0b})
	// early(x): returns by br_if out of a block when x is odd, by return
	// when x&2, by br_table to its own label otherwise.
	early := b.Func(tI32, nil, []byte{
		0x02, 0x40, // block
		0x20, 0x00, 0x41, 0x01, 0x71, // local.get 0; i32.const 1; i32.and
		0x0d, 0x01, // br_if 1 (the function)
		0x01,                         // nop
		0x0b,                         // end
		0x20, 0x00, 0x41, 0x02, 0x71, // local.get 0; i32.const 2; i32.and
		0x04, 0x40, 0x0f, 0x0b, // if; return; end
		0x01,                               // nop
		0x20, 0x00, 0x0e, 0x01, 0x00, 0x00, // local.get 0; br_table 0 0
		0x0b, // end
	})
	// tree(d): calls itself twice while d > 0, no loop.
	tree := early + 1
	b.Func(tI32, nil, []byte{
		0x20, 0x00, 0x45, 0x0d, 0x00, // local.get 0; i32.eqz; br_if 0
		0x20, 0x00, 0x41, 0x01, 0x6b, 0x10, byte(tree), // local.get 0; i32.const 1; i32.sub; call tree
		0x20, 0x00, 0x41, 0x01, 0x6b, 0x10, byte(tree),
		0x0b,
	})
	// trapIf(x): an unreachable of the guest's own when x == 77 (in the
	// first iteration of run(71)).
	trapIf := b.Func(tI32, nil, []byte{0x20, 0x00, 0x41, 0xcd, 0x00, 0x46, 0x04, 0x40, 0x00, 0x0b, 0x0b})
	// empty(): nothing but its entry.
	empty := b.Func(b.Type(nil, nil), nil, []byte{0x0b})
	// run(n): acc = 0; while n != 0 { acc = leaf(acc); early(n);
	// acc = table[0](acc); tree(2); trapIf(acc+n); empty(); inner loop twice;
	// if acc > 40 return acc; n-- }; return acc
	run := b.Func(tI32I32, []byte{0x01, 0x02, wb.I32}, []byte{
		0x02, 0x40, // block
		0x03, 0x40, // loop
		0x20, 0x00, 0x45, 0x0d, 0x01, // local.get 0; i32.eqz; br_if 1
		0x20, 0x01, 0x10, byte(leaf), 0x21, 0x01, // acc = leaf(acc)
		0x20, 0x00, 0x10, byte(early), // early(n)
		0x20, 0x01, 0x41, 0x00, 0x11, byte(tI32I32), 0x00, 0x21, 0x01, // acc = table[0](acc)
		0x41, 0x02, 0x10, byte(tree), // tree(2)
		0x20, 0x01, 0x20, 0x00, 0x6a, 0x10, byte(trapIf), // trapIf(acc+n)
		0x10, byte(empty), // empty()
		0x41, 0x02, 0x21, 0x02, // i = 2
		0x03, 0x40, 0x20, 0x02, 0x41, 0x01, 0x6b, 0x22, 0x02, 0x0d, 0x00, 0x0b, // loop; i--; br_if; end
		0x20, 0x01, 0x41, 0x28, 0x4a, // acc > 40
		0x04, 0x40, 0x20, 0x01, 0x0f, 0x0b, // if; return acc; end
		0x20, 0x00, 0x41, 0x01, 0x6b, 0x21, 0x00, // n--
		0x0c, 0x00, // br 0
		0x0b, 0x0b, // end loop, end block
		0x20, 0x01, 0x0b,
	})
	b.Table(1, 1, true)
	b.Elem(0, leaf)
	b.ExportFunc("run", run)
	return b.Bytes()
}

// TestFuelAgreesWithReference runs the same calls under every budget from
// nothing to enough, rewritten by the rewriter and by the reference, and
// requires the same outcome: the same result or a trap, and the same
// counter afterwards.
func TestFuelAgreesWithReference(t *testing.T) {
	ctx := context.Background()
	r := wazero.NewRuntime(ctx)
	defer r.Close(ctx)
	type side struct {
		run  api.Function
		fuel api.MutableGlobal
	}
	load := func(wasm []byte) side {
		mod, err := r.InstantiateWithConfig(ctx, wasm, wazero.NewModuleConfig().WithName(""))
		if err != nil {
			t.Fatal(err)
		}
		return side{mod.ExportedFunction("run"), mod.ExportedGlobal(FuelGlobalExport).(api.MutableGlobal)}
	}
	call := func(s side, budget int64, n uint64) (uint64, bool, int64) {
		s.fuel.Set(uint64(budget))
		res, err := s.run.Call(ctx, n)
		if err != nil {
			return 0, true, int64(s.fuel.Get())
		}
		return res[0], false, int64(s.fuel.Get())
	}
	for _, memory := range []bool{false, true} {
		wasm := callsModule(memory)
		out, _, err := Prepare(wasm, Options{MaxTableElements: 10, Fuel: true})
		if err != nil {
			t.Fatal(err)
		}
		got, want := load(out), load(refPrepare(t, wasm))
		for _, n := range []uint64{0, 1, 2, 3, 4, 7, 71} {
			_, trapped, left := call(want, 1<<40, n)
			need := 1<<40 - left
			if trapped != (n == 71) {
				t.Fatalf("run(%d) trapped %v with a large budget", n, trapped)
			}
			for budget := int64(0); budget <= need+2; budget++ {
				gr, gt, gl := call(got, budget, n)
				wr, wt, wl := call(want, budget, n)
				if gr != wr || gt != wt || gl != wl {
					t.Fatalf("memory %v, run(%d), budget %d of %d: result %d trapped %v counter %d; reference %d %v %d",
						memory, n, budget, need, gr, gt, gl, wr, wt, wl)
				}
			}
		}
	}
}
