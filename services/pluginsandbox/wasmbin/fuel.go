package wasmbin

import (
	"fmt"
	"math"
)

// FuelGlobalExport is the name under which the rewritten module exports its
// fuel counter: a mutable i64 global, initialised to 0. The host sets it to
// the call budget before each call and reads it back afterwards.
const FuelGlobalExport = "__clawmesh_fuel"

// segmentEnds reports whether op ends a metering segment. A segment is a run
// of instructions that, once its first instruction runs, runs to its last
// unless it traps: it ends at every instruction after which control may go
// elsewhere than the next instruction, and before every branch target (the
// body of a loop, of an if and of an else, and the code after an end).
// block does not end a segment: its body is entered only by falling through.
// Calls do not end one either: the callee meters itself.
func segmentEnds(op uint32) bool {
	switch op {
	case opLoop, opIf, opElse, opEnd, opBr, opBrIf, opBrTable, opReturn,
		opReturnCall, opReturnCallIndirect, opUnreachable:
		return true
	}
	return false
}

// instrumentBody returns expr with a fuel charge at the start of every
// segment. The charge is the number of instructions in the segment, so the
// counter goes negative exactly when the budget is spent:
//
//	global.get $fuel; i64.const cost; i64.sub; global.set $fuel
//
// The sign is tested only where control can come back without bound: at
// the function's entry and at the start of every loop body, the only
// targets of a backward branch. There the charge ends with
//
//	global.get $fuel; i64.const 0; i64.lt_s; if; unreachable; end
//
// so a guest traps at the first loop iteration or call after its budget
// ran out: past the exhausted segment it runs at most straight-line code
// (no backward branch, no call) before the trap, and the trap leaves the
// counter negative for the host to read. A call that returns without
// reaching such a check still leaves it negative, and the host reports that
// as exhaustion too. A segment made of a lone end or else is not charged:
// it cannot repeat without a charged branch.
func instrumentBody(expr []byte, fuelGlobal uint32, yield bool, out []byte) ([]byte, int, error) {
	segStart, cost, blocks := 0, 0, 0
	afterLoop := false
	for pos := 0; pos < len(expr); {
		op, next, err := nextInstr(expr, pos)
		if err != nil {
			return nil, 0, err
		}
		cost++
		pos = next
		if !segmentEnds(op) {
			continue
		}
		if cost > 1 || (op != opEnd && op != opElse) {
			switch {
			case yield && afterLoop:
				out = appendCharge(out, fuelGlobal, int64(cost), false)
				out = appendLoopTest(out, fuelGlobal, int64(cost))
			default:
				out = appendCharge(out, fuelGlobal, int64(cost), segStart == 0 || afterLoop)
			}
			blocks++
		}
		out = append(out, expr[segStart:pos]...)
		segStart, cost = pos, 0
		afterLoop = op == opLoop
	}
	if segStart != len(expr) {
		return nil, 0, fmt.Errorf("%w: function body does not end with end", ErrMalformed)
	}
	return out, blocks, nil
}

func appendCharge(out []byte, g uint32, cost int64, check bool) []byte {
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

// yieldPeriod is how much fuel a loop spends between two yields (2^20
// units, about a millisecond of guest code).
const yieldPeriod = 1 << 20

// appendLoopTest ends a loop header's charge in a module with a memory: it
// tests the counter's sign and makes the loop exit to the Go runtime about
// once per yieldPeriod units of fuel, with one comparison on the fast path:
//
//	global.get $fuel; i64.const 1<<63|yieldPeriod-1; i64.and
//	i64.const cost; i64.sub; i64.const yieldPeriod; i64.ge_u
//	if
//	  global.get $fuel; i64.const 0; i64.lt_s; if; unreachable; end
//	  i32.const 0; memory.grow 0; drop
//	end
//
// With x the counter's sign bit and low bits, x-cost (wrapping) is below
// yieldPeriod exactly when the counter is not negative and its low bits
// are at least cost: the slow path runs when the counter is negative (and
// traps) or when this charge crossed a multiple of yieldPeriod (and
// yields).
//
// wazero's compiled code cannot be preempted by the Go scheduler, so a guest
// loop that never leaves it would hold its thread through a garbage
// collector's stop-the-world, which then waits forever, and with it the
// watchdog that is meant to stop the loop. memory.grow leaves compiled code
// for a Go handler (a preemption point) and, with delta 0, changes nothing.
func appendLoopTest(out []byte, g uint32, cost int64) []byte {
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

// instrumentFuel rewrites the code section with fuel charges and adds the
// exported fuel global. It returns the number of charges inserted.
func (m *Module) instrumentFuel(bodies []funcBody) (int, error) {
	if m.HasExport(FuelGlobalExport) {
		return 0, fmt.Errorf("%w: %s", ErrNameClash, FuelGlobalExport)
	}
	g := m.ImportedGlobals + m.DefinedGlobals
	code := appendU32(nil, uint32(len(bodies)))
	var scratch []byte
	total := 0
	for i, b := range bodies {
		var err error
		var n int
		scratch = append(scratch[:0], b.locals...)
		if scratch, n, err = instrumentBody(b.expr, g, m.HasMemory, scratch); err != nil {
			return 0, fmt.Errorf("function body %d: %w", i, err)
		}
		total += n
		code = appendU32(code, uint32(len(scratch)))
		code = append(code, scratch...)
	}
	m.setSection(secCode, code)

	// Append (global (mut i64) (i64.const 0)).
	globals := appendU32(nil, m.DefinedGlobals+1)
	if old := m.section(secGlobal); old != nil {
		_, pos, _ := readU32(old, 0)
		globals = append(globals, old[pos:]...)
	}
	globals = append(globals, 0x7e, 0x01, 0x42, 0x00, 0x0b)
	m.setSection(secGlobal, globals)
	m.DefinedGlobals++

	exports := appendU32(nil, uint32(len(m.Exports)+1))
	if old := m.section(secExport); old != nil {
		_, pos, _ := readU32(old, 0)
		exports = append(exports, old[pos:]...)
	}
	exports = appendName(exports, FuelGlobalExport)
	exports = append(exports, 0x03)
	exports = appendU32(exports, g)
	m.setSection(secExport, exports)
	m.Exports = append(m.Exports, Export{Name: FuelGlobalExport, Kind: 3, Index: g})
	return total, nil
}
