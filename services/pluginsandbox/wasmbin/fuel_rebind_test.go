package wasmbin

import (
	"context"
	"math"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	wb "github.com/clawmesh/clawmesh/services/pluginsandbox/wasmbin/wasmbuild"
)

// rebindModule exports mixed(a i32, b i64, c f32, d f64, n i32) i64, a loop
// of n iterations that changes every parameter and an i64 local, and
// wide(n i32) i64, a loop over 20 i64 locals (past maxRebind, so its slow
// path rebinds none). Each returns a value that depends on every local's
// last value.
func rebindModule() []byte {
	var b wb.Builder
	b.Memory(1, 1, true)
	const f32, f64 = 0x7d, 0x7c
	mixed := b.Func(b.Type([]byte{wb.I32, wb.I64, f32, f64, wb.I32}, []byte{wb.I64}), []byte{0x01, 0x01, wb.I64}, []byte{
		0x03, 0x40, // loop
		0x20, 0x00, 0x41, 0x03, 0x6c, 0x41, 0x01, 0x6a, 0x21, 0x00, // a = a*3 + 1
		0x20, 0x01, 0x42, 0x05, 0x7e, 0x20, 0x00, 0xad, 0x7c, 0x21, 0x01, // b = b*5 + u64(a)
		0x20, 0x02, 0x43, 0x00, 0x00, 0x80, 0x3f, 0x92, 0x21, 0x02, // c = c + 1.0
		0x20, 0x03, 0x44, 0x8d, 0xed, 0xb5, 0xa0, 0xf7, 0xc6, 0xb0, 0x3e, 0xa0, 0x21, 0x03, // d = d + 1e-6
		0x20, 0x05, 0x20, 0x01, 0x85, 0x21, 0x05, // acc ^= b
		0x20, 0x04, 0x41, 0x01, 0x6b, 0x22, 0x04, // n--
		0x0d, 0x00, // br_if 0
		0x0b,                               // end
		0x20, 0x05, 0x20, 0x00, 0xad, 0x85, // acc ^ u64(a)
		0x20, 0x02, 0xbc, 0xad, 0x85, // ^ u64(bits(c))
		0x20, 0x03, 0xbd, 0x85, // ^ bits(d)
		0x0b,
	})
	b.ExportFunc("mixed", mixed)

	const wideLocals = 20
	body := []byte{0x03, 0x40} // loop
	for j := range wideLocals {
		l := byte(1 + j)
		body = append(body, 0x20, l, 0x42, byte(j+1), 0x7c, 0x20, 0x01, 0x85, 0x21, l) // x_j = (x_j + j+1) ^ x_0
	}
	body = append(body, 0x20, 0x00, 0x41, 0x01, 0x6b, 0x22, 0x00, 0x0d, 0x00, 0x0b) // n--; br_if 0; end
	body = append(body, 0x42, 0x00)
	for j := range wideLocals {
		body = append(body, 0x20, byte(1+j), 0x7c) // sum
	}
	body = append(body, 0x0b)
	wide := b.Func(b.Type([]byte{wb.I32}, []byte{wb.I64}), []byte{0x01, wideLocals, wb.I64}, body)
	b.ExportFunc("wide", wide)
	return b.Bytes()
}

// A loop header's slow path rebinds the function's integer locals to
// fresh values before its yield calls out (appendLoopTest): it must
// change no local's value, of whatever type, rebound or not, and no
// count. The loops here run tens of millions of units, crossing the yield
// period dozens of times; each result is checked against the module
// unmetered, and the counter left against the reference rewriter.
func TestYieldRebindKeepsEveryLocal(t *testing.T) {
	ctx := context.Background()
	r := wazero.NewRuntime(ctx)
	defer r.Close(ctx)
	wasm := rebindModule()
	out, _, err := Prepare(wasm, Options{MaxTableElements: 10, Fuel: true})
	if err != nil {
		t.Fatal(err)
	}
	inst := func(wasm []byte) api.Module {
		mod, err := r.InstantiateWithConfig(ctx, wasm, wazero.NewModuleConfig().WithName(""))
		if err != nil {
			t.Fatal(err)
		}
		return mod
	}
	plain, got, ref := inst(wasm), inst(out), inst(refPrepare(t, wasm))
	calls := []struct {
		name string
		args []uint64
	}{
		{"mixed", []uint64{7, 11, uint64(math.Float32bits(0.5)), math.Float64bits(-2.25), 1}},
		{"mixed", []uint64{7, 11, uint64(math.Float32bits(0.5)), math.Float64bits(-2.25), 1_000_000}},
		{"wide", []uint64{1}},
		{"wide", []uint64{300_000}},
	}
	const budget = 1 << 40
	for _, c := range calls {
		want, err := plain.ExportedFunction(c.name).Call(ctx, c.args...)
		if err != nil {
			t.Fatal(err)
		}
		got.ExportedGlobal(FuelGlobalExport).(api.MutableGlobal).Set(budget)
		got.ExportedGlobal(YieldMarkGlobalExport).(api.MutableGlobal).Set(YieldMark(budget))
		res, err := got.ExportedFunction(c.name).Call(ctx, c.args...)
		if err != nil {
			t.Fatalf("%s(%d): %v", c.name, c.args[len(c.args)-1], err)
		}
		left := int64(got.ExportedGlobal(FuelGlobalExport).Get())
		ref.ExportedGlobal(FuelGlobalExport).(api.MutableGlobal).Set(budget)
		if _, err := ref.ExportedFunction(c.name).Call(ctx, c.args...); err != nil {
			t.Fatal(err)
		}
		refLeft := int64(ref.ExportedGlobal(FuelGlobalExport).Get())
		if res[0] != want[0] || left != refLeft {
			t.Errorf("%s(%d): metered %#x, counter %d; unmetered %#x, reference counter %d",
				c.name, c.args[len(c.args)-1], res[0], left, want[0], refLeft)
		}
		if used := budget - left; c.args[len(c.args)-1] > 1 && used < 20*yieldPeriod {
			t.Errorf("%s(%d) used %d units: fewer than 20 yield periods", c.name, c.args[len(c.args)-1], used)
		}
	}
}
