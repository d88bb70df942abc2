package wasmbin

import "fmt"

// Opcodes the rewriters care about. Prefixed opcodes are encoded as
// prefix<<16 | sub-opcode.
// MaxLocals is the most locals a function may declare besides its
// parameters. wazero sizes allocations by the declared count (a single
// group declaring 2^28 locals, in 8 bytes, made it panic); compilers emit
// a few hundred at most.
const MaxLocals = 50_000

const (
	opUnreachable        = 0x00
	opNop                = 0x01
	opBlock              = 0x02
	opLoop               = 0x03
	opIf                 = 0x04
	opElse               = 0x05
	opEnd                = 0x0b
	opBr                 = 0x0c
	opBrIf               = 0x0d
	opBrTable            = 0x0e
	opReturn             = 0x0f
	opCall               = 0x10
	opCallIndirect       = 0x11
	opDrop               = 0x1a
	opReturnCall         = 0x12
	opReturnCallIndirect = 0x13
	opLocalGet           = 0x20
	opLocalSet           = 0x21
	opLocalTee           = 0x22
	opGlobalGet          = 0x23
	opGlobalSet          = 0x24

	opMemoryInit = 0xfc<<16 | 8
	opDataDrop   = 0xfc<<16 | 9
	opMemoryCopy = 0xfc<<16 | 10
	opMemoryFill = 0xfc<<16 | 11
	opTableInit  = 0xfc<<16 | 12
	opTableCopy  = 0xfc<<16 | 14
	opTableGrow  = 0xfc<<16 | 15
	opTableFill  = 0xfc<<16 | 17
)

// nextInstr decodes the instruction at code[pos:] and returns its opcode and
// the position just after its immediates. It knows every instruction of core
// wasm 2.0 (MVP, sign extension, saturating truncation, bulk memory,
// reference types, SIMD), tail calls and threads. Exception handling and GC
// instructions are refused with ErrUnsupported.
func nextInstr(code []byte, pos int) (op uint32, next int, err error) {
	if pos >= len(code) {
		return 0, pos, fmt.Errorf("%w: code ends without end", ErrMalformed)
	}
	c := code[pos]
	pos++
	op = uint32(c)
	switch {
	case c == 0x00, c == 0x01, c == 0x05, c == 0x0b, c == 0x0f, c == 0x1a, c == 0x1b, c == 0xd1:
		return op, pos, nil
	case c >= 0x45 && c <= 0xc4: // numeric, no immediates
		return op, pos, nil
	case c == 0x02, c == 0x03, c == 0x04: // block type
		pos, err = skipBlockType(code, pos)
	case c == 0x0c, c == 0x0d, c == 0x10, c == 0x12, c == 0xd2, // br, br_if, call, return_call, ref.func
		c >= 0x20 && c <= 0x26: // local.*, global.*, table.get/set
		_, pos, err = readU32(code, pos)
	case c == 0x0e: // br_table
		var n uint32
		if n, pos, err = readU32(code, pos); err != nil {
			return op, pos, err
		}
		for i := uint32(0); i <= n && err == nil; i++ {
			_, pos, err = readU32(code, pos)
		}
	case c == 0x11, c == 0x13: // call_indirect, return_call_indirect: type, table
		if _, pos, err = readU32(code, pos); err == nil {
			_, pos, err = readU32(code, pos)
		}
	case c == 0x1c: // select t*
		var n uint32
		if n, pos, err = readU32(code, pos); err != nil {
			return op, pos, err
		}
		for i := uint32(0); i < n && err == nil; i++ {
			pos, err = skipValType(code, pos)
		}
	case c >= 0x28 && c <= 0x3e: // loads and stores
		pos, err = skipMemArg(code, pos)
	case c == 0x3f, c == 0x40: // memory.size, memory.grow
		_, pos, err = readU32(code, pos)
	case c == 0x41:
		pos, err = skipSigned(code, pos, 5)
	case c == 0x42:
		pos, err = skipSigned(code, pos, 10)
	case c == 0x43:
		pos, err = skipBytes(code, pos, 4)
	case c == 0x44:
		pos, err = skipBytes(code, pos, 8)
	case c == 0xd0: // ref.null
		pos, err = skipRefType(code, pos)
	case c == 0xfc:
		return nextMisc(code, pos)
	case c == 0xfd:
		return nextSIMD(code, pos)
	case c == 0xfe:
		return nextAtomic(code, pos)
	default:
		return op, pos, fmt.Errorf("%w: opcode %#x at offset %d", ErrUnsupported, c, pos-1)
	}
	return op, pos, err
}

func nextMisc(code []byte, pos int) (uint32, int, error) {
	sub, pos, err := readU32(code, pos)
	if err != nil {
		return 0, pos, err
	}
	op := 0xfc<<16 | sub
	switch {
	case sub <= 7: // saturating truncation
	case sub == 8: // memory.init data mem
		if _, pos, err = readU32(code, pos); err == nil {
			_, pos, err = readU32(code, pos)
		}
	case sub == 9, sub == 11, sub == 13, sub == 15, sub == 16, sub == 17: // one index
		_, pos, err = readU32(code, pos)
	case sub == 10, sub == 12, sub == 14: // two indices
		if _, pos, err = readU32(code, pos); err == nil {
			_, pos, err = readU32(code, pos)
		}
	default:
		err = fmt.Errorf("%w: opcode 0xfc %d", ErrUnsupported, sub)
	}
	return op, pos, err
}

func nextSIMD(code []byte, pos int) (uint32, int, error) {
	sub, pos, err := readU32(code, pos)
	if err != nil {
		return 0, pos, err
	}
	op := 0xfd<<16 | sub
	switch {
	case sub <= 0x0b, sub == 0x5c, sub == 0x5d: // loads, stores, load_zero
		pos, err = skipMemArg(code, pos)
	case sub == 0x0c, sub == 0x0d: // v128.const, i8x16.shuffle
		pos, err = skipBytes(code, pos, 16)
	case sub >= 0x15 && sub <= 0x22: // extract/replace lane
		pos, err = skipBytes(code, pos, 1)
	case sub >= 0x54 && sub <= 0x5b: // load/store lane
		if pos, err = skipMemArg(code, pos); err == nil {
			pos, err = skipBytes(code, pos, 1)
		}
	case sub <= 0x113: // no immediates
	default:
		err = fmt.Errorf("%w: opcode 0xfd %d", ErrUnsupported, sub)
	}
	return op, pos, err
}

func nextAtomic(code []byte, pos int) (uint32, int, error) {
	sub, pos, err := readU32(code, pos)
	if err != nil {
		return 0, pos, err
	}
	op := 0xfe<<16 | sub
	switch {
	case sub == 0x03: // atomic.fence
		pos, err = skipBytes(code, pos, 1)
	case sub <= 0x02, sub >= 0x10 && sub <= 0x4e:
		pos, err = skipMemArg(code, pos)
	default:
		err = fmt.Errorf("%w: opcode 0xfe %d", ErrUnsupported, sub)
	}
	return op, pos, err
}

func skipBlockType(code []byte, pos int) (int, error) {
	if pos >= len(code) {
		return pos, fmt.Errorf("%w: truncated block type", ErrMalformed)
	}
	switch code[pos] {
	case 0x40, 0x7f, 0x7e, 0x7d, 0x7c, 0x7b, 0x70, 0x6f:
		return pos + 1, nil
	}
	return skipSigned(code, pos, 5) // s33 type index
}

// skipMemArg skips align and offset; bit 6 of align announces a memory index
// (multi-memory).
func skipMemArg(code []byte, pos int) (int, error) {
	align, pos, err := readU32(code, pos)
	if err != nil {
		return pos, err
	}
	if align&0x40 != 0 {
		if _, pos, err = readU32(code, pos); err != nil {
			return pos, err
		}
	}
	_, pos, err = readU64(code, pos)
	return pos, err
}

func skipBytes(code []byte, pos, n int) (int, error) {
	if pos+n > len(code) {
		return pos, fmt.Errorf("%w: truncated immediate", ErrMalformed)
	}
	return pos + n, nil
}

// funcBody is one entry of the code section.
type funcBody struct {
	locals []byte // the local declarations, raw
	expr   []byte // the instructions, ending with end
}

// decodeCode splits the code section into function bodies.
func decodeCode(p []byte) ([]funcBody, error) {
	n, pos, err := readU32(p, 0)
	if err != nil {
		return nil, err
	}
	bodies := make([]funcBody, 0, min(int(n), len(p)))
	for i := uint32(0); i < n; i++ {
		var size uint32
		if size, pos, err = readU32(p, pos); err != nil {
			return nil, err
		}
		end := pos + int(size)
		if end > len(p) || end < pos {
			return nil, fmt.Errorf("%w: function body %d past end", ErrMalformed, i)
		}
		body := p[pos:end]
		groups, lp, err := readU32(body, 0)
		if err != nil {
			return nil, err
		}
		var locals uint64
		for g := uint32(0); g < groups; g++ {
			var k uint32
			if k, lp, err = readU32(body, lp); err != nil {
				return nil, err
			}
			if locals += uint64(k); locals > MaxLocals {
				return nil, fmt.Errorf("%w: function body %d declares over %d locals", ErrMalformed, i, MaxLocals)
			}
			if lp, err = skipValType(body, lp); err != nil {
				return nil, err
			}
		}
		bodies = append(bodies, funcBody{locals: body[:lp], expr: body[lp:]})
		pos = end
	}
	if pos != len(p) {
		return nil, fmt.Errorf("%w: trailing bytes in code section", ErrMalformed)
	}
	return bodies, nil
}

// scanOps calls fn for every instruction of every body.
func scanOps(bodies []funcBody, fn func(op uint32)) error {
	for i, b := range bodies {
		for pos := 0; pos < len(b.expr); {
			op, next, err := nextInstr(b.expr, pos)
			if err != nil {
				return fmt.Errorf("function body %d: %w", i, err)
			}
			fn(op)
			pos = next
		}
	}
	return nil
}
