package wasmbin

import (
	"fmt"
	"math"
)

// FuelGlobalExport is the name under which the rewritten module exports its
// fuel counter: a mutable i64 global, initialised to 0. The host sets it to
// the call budget before each call and reads it back afterwards.
const FuelGlobalExport = "__clawmesh_fuel"

// InterruptGlobalExport is the name under which the rewritten module exports
// its interrupt flag: a mutable i64 global, initialised to 0, that guest code
// only reads. The host sets it negative to stop a running call: the guest
// tests it with its counter at every function entry and loop header, and
// traps at the first of them it reaches.
const InterruptGlobalExport = "__clawmesh_interrupt"

// YieldMarkGlobalExport is the name under which the rewritten module
// exports where its next yield is due: a mutable i64 global. A loop header
// whose counter is below it yields to the Go runtime and moves it down to
// the start of the counter's block of yieldPeriod units. The host sets it
// with YieldMark when it sets the counter.
const YieldMarkGlobalExport = "__clawmesh_yield_mark"

// StartExport is the name under which the rewritten module exports its
// start function, if it has one, in place of its start section. wazero
// runs a start section inside instantiation, before the host can set the
// fuel counter (0 until then) or arm a deadline: every start function
// would trap at its entry's charge. The host calls it itself, under the
// limits of a call, before _initialize, as Wasmtime runs it on the store's
// fuel.
const StartExport = "__clawmesh_start"

// YieldMark is the yield mark for a counter of fuel: the start of its
// block of yieldPeriod units, so that the first yield comes when the
// counter leaves that block.
func YieldMark(fuel uint64) uint64 { return fuel &^ (yieldPeriod - 1) }

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

// fuelRewriter instruments one function body.
//
// Every segment is charged what its instructions cost (instrCost), the
// entry segment entryCost more, so the counter goes negative exactly when
// the budget is spent. Inside a function the counter lives in a local
// added to the function (a register in compiled code); the exported global
// holds it wherever something else may look:
//
//   - at entry the local is loaded from the global and charged the entry
//     segment: global.get $fuel; i64.const cost; i64.sub; local.set $n;
//   - other segments are charged in the local alone:
//     local.get $n; i64.const cost; i64.sub; local.set $n;
//   - the local is stored into the global (local.get $n; global.set $fuel)
//     before every call, return, trap (unreachable, the test's own trap) and
//     branch out of the function and before the function's end, and loaded
//     again after every call returns (the callee charged the global).
//
// So the global holds, whenever the host or another function can read it,
// the value it held when every segment charged the global itself.
//
// The counter and the interrupt flag are tested only where control can come
// back without bound: at the function's entry and at the start of every loop
// body, the only targets of a backward branch. There
//
//	local.get $n; global.get $interrupt; i64.or; i64.const 0; i64.lt_s
//	if; local.get $n; global.set $fuel; unreachable; end
//
// traps when the budget is spent or the host raised the flag, so a guest
// traps at the first loop iteration or call after either: past the
// exhausted segment it runs at most straight-line code (no backward branch,
// no call) before the trap, and the trap leaves the counter negative in the
// global for the host to read. A call that returns without reaching such a
// test still leaves it negative, and the host reports that as exhaustion
// too. A segment made of a lone end or else is not tested: it cannot repeat
// without a branch.
//
// The flag is a global of its own, never written by the guest, because a
// host's write into the counter could be overwritten by the guest storing
// its local (a whole straight stretch after the last load): the flag's
// write cannot be lost.
type fuelRewriter struct {
	fuel, interrupt, mark uint32 // global indices
	counter               uint32 // the added local
	length                uint32 // a second, i32: a bulk instruction's length
	yield                 bool   // the module has a memory to yield with
	live                  bool   // the local holds the counter
}

// instrCost is what one instruction is charged: a unit, as the seed's
// engine (Wasmtime with consume_fuel) counts, but nothing for those that
// compile to no code of their own: nop, drop, block, loop, else, end,
// unreachable and return. A loop still costs at least its branch back.
//
// Charging them too made a Go guest pay for its functions' shape: each
// one is a loop around a br_table under one block per resumption point,
// so every jump in Go code re-entered a segment of about a hundred
// blocks (kv's decoding spent some 1,200 units an escaped character).
func instrCost(op uint32) int {
	switch op {
	case opNop, opDrop, opBlock, opLoop, opElse, opEnd, opUnreachable, opReturn:
		return 0
	}
	return 1
}

// entryCost is what entering a function costs on top of its instructions,
// charged with its entry segment: Wasmtime charges a unit there, so that
// even an empty function costs something (in its fuel tests, a call to an
// empty function costs two units: the call and the callee's entry).
// Without it a guest's calls to small functions came cheaper than the
// seed's engine counts them.
const entryCost = 1

// bulk reports whether op's work grows with its last operand, a length
// (bytes or table elements; table.grow's delta): Wasmtime charges that
// length on top of the instruction's unit, and so does the rewriter.
// Charged one unit, a memory.fill of 256 MiB cost what an add does.
func bulk(op uint32) bool {
	switch op {
	case opMemoryInit, opMemoryCopy, opMemoryFill, opTableInit, opTableCopy, opTableGrow, opTableFill:
		return true
	}
	return false
}

// rewrite appends the instrumented body b (its locals with the counter
// added, then its code) to out and returns it with the number of charges.
func (r *fuelRewriter) rewrite(b funcBody, params uint32, out []byte) ([]byte, int, error) {
	groups, declStart, err := readU32(b.locals, 0)
	if err != nil {
		return nil, 0, err
	}
	pos := declStart
	locals := uint64(params)
	for g := uint32(0); g < groups; g++ {
		var n uint32
		if n, pos, err = readU32(b.locals, pos); err != nil {
			return nil, 0, err
		}
		if pos, err = skipValType(b.locals, pos); err != nil {
			return nil, 0, err
		}
		locals += uint64(n)
	}
	if locals >= math.MaxUint32 {
		return nil, 0, fmt.Errorf("%w: %d locals", ErrUnsupported, locals)
	}
	r.counter, r.length, r.live = uint32(locals), uint32(locals)+1, false
	out = appendU32(out, groups+2)
	out = append(out, b.locals[declStart:]...)
	out = append(out, 0x01, 0x7e, 0x01, 0x7f) // one i64, one i32

	expr := b.expr
	segStart, n, cost, charges, depth := 0, 0, entryCost, 0, 0
	afterLoop := false
	for pos := 0; pos < len(expr); {
		op, next, err := nextInstr(expr, pos)
		if err != nil {
			return nil, 0, err
		}
		n++
		cost += instrCost(op)
		pos = next
		if !segmentEnds(op) {
			continue
		}
		// A segment that costs nothing needs code only where it is tested;
		// the entry segment always costs.
		if segStart == 0 || (n > 1 || (op != opEnd && op != opElse)) && (afterLoop || cost > 0) {
			switch {
			case segStart == 0:
				out = r.appendEntry(out, int64(cost))
			case afterLoop && r.yield:
				out = r.appendLoopTest(out, int64(cost))
			case afterLoop:
				if cost > 0 {
					out = r.appendCharge(out, int64(cost))
				}
				out = r.appendTest(out)
			default:
				out = r.appendCharge(out, int64(cost))
			}
			charges++
		}
		if out, depth, err = r.copySegment(out, expr[segStart:pos], depth); err != nil {
			return nil, 0, err
		}
		segStart, n, cost = pos, 0, 0
		afterLoop = op == opLoop
	}
	if segStart != len(expr) {
		return nil, 0, fmt.Errorf("%w: function body does not end with end", ErrMalformed)
	}
	return out, charges, nil
}

// copySegment appends the instructions of seg with the counter stored
// before every exit and call and loaded after every call. depth is the
// number of blocks open around seg's start inside the function; the
// function's own label is depth deep.
func (r *fuelRewriter) copySegment(out, seg []byte, depth int) ([]byte, int, error) {
	for pos := 0; pos < len(seg); {
		op, next, err := nextInstr(seg, pos)
		if err != nil {
			return nil, 0, err
		}
		exits, reload := false, false
		switch op {
		case opBlock, opLoop, opIf:
			depth++
		case opEnd:
			if depth == 0 {
				exits = true // the function's end
			} else {
				depth--
			}
		case opBr, opBrIf, opBrTable:
			if exits, err = branchesOut(seg[pos+1:next], op, depth); err != nil {
				return nil, 0, err
			}
		case opReturn, opReturnCall, opReturnCallIndirect, opUnreachable:
			exits = true
		case opCall, opCallIndirect:
			exits, reload = true, true
		case opLocalGet, opLocalSet, opLocalTee, opGlobalGet, opGlobalSet:
			if err := r.checkIndex(op, seg[pos+1:next]); err != nil {
				return nil, 0, err
			}
		}
		if exits && r.live {
			out = r.appendStore(out)
		}
		if bulk(op) && r.live {
			out = r.appendLengthCharge(out)
		}
		out = append(out, seg[pos:next]...)
		if reload {
			out = append(out, 0x23)
			out = appendU32(out, r.fuel)
			out = append(out, 0x21)
			out = appendU32(out, r.counter)
		}
		pos = next
	}
	return out, depth, nil
}

// checkIndex refuses a local.* naming the counter or beyond, and a
// global.* naming the fuel counter, the interrupt flag or beyond. Such an
// instruction is invalid in the module as written but valid once the
// counter and the globals exist, and the compiler sees only the rewritten
// module: left in, it would let a guest refill its budget or lower the
// host's interrupt flag.
func (r *fuelRewriter) checkIndex(op uint32, imm []byte) error {
	idx, _, err := readU32(imm, 0)
	if err != nil {
		return err
	}
	if op == opGlobalGet || op == opGlobalSet {
		if idx >= r.fuel {
			return fmt.Errorf("%w: global index %d of %d globals", ErrMalformed, idx, r.fuel)
		}
		return nil
	}
	if idx >= r.counter {
		return fmt.Errorf("%w: local index %d of %d locals", ErrMalformed, idx, r.counter)
	}
	return nil
}

// branchesOut reports whether a br, br_if or br_table with the immediates
// imm may branch to the function's label (and so return).
func branchesOut(imm []byte, op uint32, depth int) (bool, error) {
	n, pos := uint32(0), 0
	if op == opBrTable {
		var err error
		if n, pos, err = readU32(imm, 0); err != nil {
			return false, err
		}
	}
	for i := uint32(0); i <= n; i++ {
		label, next, err := readU32(imm, pos)
		if err != nil {
			return false, err
		}
		if uint64(label) == uint64(depth) {
			return true, nil
		}
		pos = next
	}
	return false, nil
}

// appendEntry loads the counter, charges the entry segment and tests it.
func (r *fuelRewriter) appendEntry(out []byte, cost int64) []byte {
	out = append(out, 0x23)
	out = appendU32(out, r.fuel)
	out = append(out, 0x42)
	out = appendS64(out, cost)
	out = append(out, 0x7d, 0x21)
	out = appendU32(out, r.counter)
	r.live = true
	return r.appendTest(out)
}

func (r *fuelRewriter) appendCharge(out []byte, cost int64) []byte {
	out = append(out, 0x20)
	out = appendU32(out, r.counter)
	out = append(out, 0x42)
	out = appendS64(out, cost)
	out = append(out, 0x7d, 0x21)
	return appendU32(out, r.counter)
}

// appendLengthCharge charges the length on top of the stack, before the
// bulk instruction that takes it, and tests the counter: an instruction
// the budget cannot pay for traps before it runs.
//
//	local.tee $len; local.get $n; local.get $len; i64.extend_i32_u;
//	i64.sub; local.set $n; (the test of appendTest)
func (r *fuelRewriter) appendLengthCharge(out []byte) []byte {
	out = append(out, 0x22)
	out = appendU32(out, r.length)
	out = append(out, 0x20)
	out = appendU32(out, r.counter)
	out = append(out, 0x20)
	out = appendU32(out, r.length)
	out = append(out, 0xad, 0x7d, 0x21) // i64.extend_i32_u; i64.sub; local.set
	out = appendU32(out, r.counter)
	return r.appendTest(out)
}

// appendStore stores the counter into the global.
func (r *fuelRewriter) appendStore(out []byte) []byte {
	out = append(out, 0x20)
	out = appendU32(out, r.counter)
	out = append(out, 0x24)
	return appendU32(out, r.fuel)
}

// appendTest traps, the counter stored, when the counter is negative or the
// interrupt flag raised.
func (r *fuelRewriter) appendTest(out []byte) []byte {
	out = append(out, 0x20)
	out = appendU32(out, r.counter)
	out = append(out, 0x23)
	out = appendU32(out, r.interrupt)
	out = append(out, 0x84, 0x42, 0x00, 0x53, 0x04, 0x40)
	out = r.appendStore(out)
	return append(out, 0x00, 0x0b)
}

// yieldPeriod is how much fuel a loop spends between two yields (2^20
// units, about a millisecond of guest code).
const yieldPeriod = 1 << 20

// appendLoopTest charges a loop header in a module with a memory: it tests
// the counter and the flag and makes the loop exit to the Go runtime once
// the counter is below the yield mark, with one comparison on the fast
// path:
//
//	local.get $n; i64.const cost; i64.sub; local.set $n
//	local.get $n; global.get $mark; i64.sub; global.get $interrupt; i64.or
//	i64.const 0; i64.ge_s
//	if
//	else
//	  (the test of appendTest)
//	  local.get $n; i64.const -yieldPeriod; i64.and; global.set $mark
//	  i32.const 0; memory.grow 0; drop
//	end
//
// The slow path runs when the counter has left the block of yieldPeriod
// units the mark starts (or is negative), or the flag is raised: it traps,
// or moves the mark to the start of the counter's block and yields. The
// mark is one global, so each block is yielded once, whichever frame sees
// it first. (Before, a header yielded only when its own charge crossed a
// multiple of yieldPeriod: a loop whose length and header lined up badly
// never yielded.)
//
// The fast path is the then-arm, empty, and the slow path the else-arm:
// wazero's register allocator gives the code after the if the registers of
// the first arm it allocated, the then-arm. The other way round, every
// value live in the loop came back from its stack slot after every header,
// because memory.grow (a call) clobbers the registers on the slow path
// (measured: a 1.6x fuel ratio on a Go guest's loop, against 1.3-1.4x).
//
// wazero's compiled code cannot be preempted by the Go scheduler, so a guest
// loop that never leaves it would hold its thread through a garbage
// collector's stop-the-world, which then waits, and with it the watchdog
// that is meant to stop the loop, until the budget is spent. memory.grow
// leaves compiled code for a Go handler (a preemption point) and, with
// delta 0, changes nothing.
func (r *fuelRewriter) appendLoopTest(out []byte, cost int64) []byte {
	if cost > 0 {
		out = r.appendCharge(out, cost)
	}
	out = append(out, 0x20)
	out = appendU32(out, r.counter)
	out = append(out, 0x23)
	out = appendU32(out, r.mark)
	out = append(out, 0x7d, 0x23) // i64.sub; global.get
	out = appendU32(out, r.interrupt)
	out = append(out, 0x84, 0x42, 0x00, 0x59) // i64.or; i64.const 0; i64.ge_s
	out = append(out, 0x04, 0x40, 0x05)       // if; else
	out = r.appendTest(out)
	out = append(out, 0x20)
	out = appendU32(out, r.counter)
	out = append(out, 0x42)
	out = appendS64(out, -yieldPeriod)
	out = append(out, 0x83, 0x24) // i64.and; global.set
	out = appendU32(out, r.mark)
	return append(out, 0x41, 0x00, 0x40, 0x00, 0x1a, 0x0b)
}

// paramCounts returns the number of parameters of every defined function,
// in the order of the code section, which must hold n bodies.
func (m *Module) paramCounts(n int) ([]uint32, error) {
	var types []uint32
	if p := m.section(secType); p != nil {
		var err error
		if types, err = typeParams(p); err != nil {
			return nil, err
		}
	}
	var count uint32
	var pos int
	p := m.section(secFunction)
	if p != nil {
		var err error
		if count, pos, err = readU32(p, 0); err != nil {
			return nil, err
		}
	}
	if uint64(count) != uint64(n) {
		return nil, fmt.Errorf("%w: %d functions, %d bodies", ErrMalformed, count, n)
	}
	params := make([]uint32, 0, n)
	for i := 0; i < n; i++ {
		t, next, err := readU32(p, pos)
		if err != nil {
			return nil, err
		}
		if uint64(t) >= uint64(len(types)) {
			return nil, fmt.Errorf("%w: function %d has type %d of %d", ErrMalformed, i, t, len(types))
		}
		params = append(params, types[t])
		pos = next
	}
	return params, nil
}

// instrumentFuel rewrites the code section with fuel charges and adds the
// exported fuel counter, interrupt flag and yield mark. It returns the number of
// charges inserted.
func (m *Module) instrumentFuel(bodies []funcBody) (int, error) {
	added := []string{FuelGlobalExport, InterruptGlobalExport, YieldMarkGlobalExport}
	for _, name := range append(added, StartExport) {
		if m.HasExport(name) {
			return 0, fmt.Errorf("%w: %s", ErrNameClash, name)
		}
	}
	start, hasStart, err := m.startFunc()
	if err != nil {
		return 0, err
	}
	params, err := m.paramCounts(len(bodies))
	if err != nil {
		return 0, err
	}
	if n := uint64(m.ImportedGlobals) + uint64(m.DefinedGlobals); n+3 > math.MaxUint32 {
		return 0, fmt.Errorf("%w: %d globals", ErrUnsupported, n)
	}
	g := m.ImportedGlobals + m.DefinedGlobals
	// The added globals take the next indices: an export naming one of
	// them would be invalid as written and valid once rewritten.
	for _, e := range m.Exports {
		if e.Kind == 3 && e.Index >= g {
			return 0, fmt.Errorf("%w: export %q of global %d of %d", ErrMalformed, e.Name, e.Index, g)
		}
	}
	code := appendU32(nil, uint32(len(bodies)))
	var scratch []byte
	total := 0
	for i, b := range bodies {
		r := fuelRewriter{fuel: g, interrupt: g + 1, mark: g + 2, yield: m.HasMemory}
		var n int
		if scratch, n, err = r.rewrite(b, params[i], scratch[:0]); err != nil {
			return 0, fmt.Errorf("function body %d: %w", i, err)
		}
		total += n
		code = appendU32(code, uint32(len(scratch)))
		code = append(code, scratch...)
	}
	m.setSection(secCode, code)

	// Append (global (mut i64) (i64.const 0)) for each.
	globals := appendU32(nil, m.DefinedGlobals+uint32(len(added)))
	if old := m.section(secGlobal); old != nil {
		entries, err := globalEntries(old)
		if err != nil {
			return 0, err
		}
		globals = append(globals, entries...)
	}
	for range added {
		globals = append(globals, 0x7e, 0x01, 0x42, 0x00, 0x0b)
	}
	m.setSection(secGlobal, globals)
	m.DefinedGlobals += uint32(len(added))

	n := len(m.Exports) + len(added)
	if hasStart {
		n++
	}
	exports := appendU32(nil, uint32(n))
	if old := m.section(secExport); old != nil {
		_, pos, _ := readU32(old, 0)
		exports = append(exports, old[pos:]...)
	}
	for i, name := range added {
		exports = appendName(exports, name)
		exports = append(exports, 0x03)
		exports = appendU32(exports, g+uint32(i))
		m.Exports = append(m.Exports, Export{Name: name, Kind: 3, Index: g + uint32(i)})
	}
	if hasStart {
		exports = appendName(exports, StartExport)
		exports = append(exports, 0x00)
		exports = appendU32(exports, start)
		m.Exports = append(m.Exports, Export{Name: StartExport, Kind: 0, Index: start})
		m.removeSection(secStart)
	}
	m.setSection(secExport, exports)
	return total, nil
}

// startFunc returns the index of the module's start function, if it has
// one.
func (m *Module) startFunc() (uint32, bool, error) {
	p := m.section(secStart)
	if p == nil {
		return 0, false, nil
	}
	idx, pos, err := readU32(p, 0)
	if err != nil {
		return 0, false, err
	}
	if pos != len(p) {
		return 0, false, fmt.Errorf("%w: start section of %d bytes", ErrMalformed, len(p))
	}
	return idx, true, nil
}

// globalEntries returns the entries of a global section, checked to end
// exactly where the section does: instrumentFuel appends entries after
// them, and trailing bytes must not become part of those.
func globalEntries(p []byte) ([]byte, error) {
	n, start, err := readU32(p, 0)
	if err != nil {
		return nil, err
	}
	pos := start
	for i := uint32(0); i < n; i++ {
		if pos, err = skipValType(p, pos); err != nil {
			return nil, err
		}
		if pos >= len(p) {
			return nil, fmt.Errorf("%w: truncated global", ErrMalformed)
		}
		if pos, err = skipConstExpr(p, pos+1); err != nil { // past the mutability
			return nil, err
		}
	}
	if pos != len(p) {
		return nil, fmt.Errorf("%w: trailing bytes in global section", ErrMalformed)
	}
	return p[start:], nil
}
