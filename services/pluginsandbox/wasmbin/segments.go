package wasmbin

import "fmt"

// checkCounts decodes the sections whose entries hold counts far enough to
// check every such count against the bytes left: a function type's
// parameter and result vectors, a data segment's size, an element
// segment's vector and the name section's maps each size an allocation in
// wazero's decoder, so a few bytes declaring gigabytes must be refused
// here (Parse bounds only each section's own entry count). Measured with
// wazero 1.12: a 16-byte type section declaring 200 million parameters
// made it allocate 1.5 GB, a 21-byte name section 4.5 to 6 GB. The type,
// data and element sections must also end exactly after their last entry.
func (m *Module) checkCounts() error {
	if p := m.section(secType); p != nil {
		if _, err := typeParams(p); err != nil {
			return err
		}
	}
	if p := m.section(secData); p != nil {
		if err := checkData(p); err != nil {
			return err
		}
	}
	if p := m.section(secElement); p != nil {
		if err := checkElements(p); err != nil {
			return err
		}
	}
	for _, s := range m.Sections {
		if s.ID != secCustom {
			continue
		}
		// wazero sizes a buffer by every custom section's name length.
		name, pos, err := readName(s.Payload, 0)
		if err != nil {
			return fmt.Errorf("%w: custom section name: %w", ErrMalformed, err)
		}
		if name == "name" {
			if err := checkNames(s.Payload[pos:]); err != nil {
				return err
			}
		}
	}
	return nil
}

// typeParams walks the function types (the only form of core wasm 2.0),
// checking each vector's count against the bytes left, and returns the
// number of parameters of each type.
func typeParams(p []byte) ([]uint32, error) {
	n, pos, err := readU32(p, 0)
	if err != nil {
		return nil, err
	}
	params := make([]uint32, 0, min(int(n), len(p)))
	for i := uint32(0); i < n; i++ {
		if pos >= len(p) {
			return nil, fmt.Errorf("%w: truncated type section", ErrMalformed)
		}
		if p[pos] != 0x60 {
			return nil, fmt.Errorf("%w: type form %#x", ErrUnsupported, p[pos])
		}
		pos++
		for vec, what := range [2]string{"parameters", "results"} {
			var k uint32
			if k, pos, err = readU32(p, pos); err != nil {
				return nil, err
			}
			if uint64(k) > uint64(len(p)-pos) {
				return nil, fmt.Errorf("%w: type %d declares %d %s, %d bytes left", ErrMalformed, i, k, what, len(p)-pos)
			}
			for j := uint32(0); j < k; j++ {
				if pos, err = skipValType(p, pos); err != nil {
					return nil, err
				}
			}
			if vec == 0 {
				params = append(params, k)
			}
		}
	}
	if pos != len(p) {
		return nil, fmt.Errorf("%w: trailing bytes in type section", ErrMalformed)
	}
	return params, nil
}

// checkNames walks the subsections of the name section that wazero
// decodes: the module's name (0), function names (1) and local names
// (2); the others are one length-prefixed blob each.
func checkNames(p []byte) error {
	pos := 0
	for pos < len(p) {
		id := p[pos]
		size, next, err := readU32(p, pos+1)
		if err != nil {
			return err
		}
		end := next + int(size)
		if end > len(p) || end < next {
			return fmt.Errorf("%w: name subsection %d past the section's end", ErrMalformed, id)
		}
		sub := p[next:end]
		switch id {
		case 0:
			_, _, err = readName(sub, 0)
		case 1:
			_, err = skipNameMap(sub, 0)
		case 2:
			var n uint32
			var at int
			if n, at, err = readU32(sub, 0); err == nil {
				if uint64(n) > uint64(len(sub)-at) {
					return fmt.Errorf("%w: local names of %d functions in %d bytes", ErrMalformed, n, len(sub))
				}
				for i := uint32(0); i < n && err == nil; i++ {
					if _, at, err = readU32(sub, at); err == nil {
						at, err = skipNameMap(sub, at)
					}
				}
			}
		}
		if err != nil {
			return err
		}
		pos = end
	}
	return nil
}

// skipNameMap skips a vector of (index, name) pairs, each at least two
// bytes.
func skipNameMap(p []byte, pos int) (int, error) {
	n, pos, err := readU32(p, pos)
	if err != nil {
		return pos, err
	}
	if uint64(n) > uint64(len(p)-pos) {
		return pos, fmt.Errorf("%w: a name map of %d entries in %d bytes", ErrMalformed, n, len(p)-pos)
	}
	for i := uint32(0); i < n; i++ {
		if _, pos, err = readU32(p, pos); err != nil {
			return pos, err
		}
		var size uint32
		if size, pos, err = readU32(p, pos); err != nil {
			return pos, err
		}
		if uint64(size) > uint64(len(p)-pos) {
			return pos, fmt.Errorf("%w: name past the end of its map", ErrMalformed)
		}
		pos += int(size)
	}
	return pos, nil
}

func checkData(p []byte) error {
	n, pos, err := readU32(p, 0)
	if err != nil {
		return err
	}
	for i := uint32(0); i < n; i++ {
		var flag uint32
		if flag, pos, err = readU32(p, pos); err != nil {
			return err
		}
		switch flag {
		case 0: // active, memory 0: offset
			pos, err = skipConstExpr(p, pos)
		case 1: // passive
		case 2: // active: memory index, offset
			if _, pos, err = readU32(p, pos); err == nil {
				pos, err = skipConstExpr(p, pos)
			}
		default:
			err = fmt.Errorf("%w: data segment %d has flags %d", ErrMalformed, i, flag)
		}
		if err != nil {
			return err
		}
		var size uint32
		if size, pos, err = readU32(p, pos); err != nil {
			return err
		}
		if uint64(size) > uint64(len(p)-pos) {
			return fmt.Errorf("%w: data segment %d declares %d bytes, %d left", ErrMalformed, i, size, len(p)-pos)
		}
		pos += int(size)
	}
	if pos != len(p) {
		return fmt.Errorf("%w: trailing bytes in data section", ErrMalformed)
	}
	return nil
}

// checkElements walks the eight element segment encodings: bit 0 of the
// flags marks a passive or declarative segment (else active), bit 1 an
// explicit table index (active) or a declarative segment, bit 2 a vector
// of expressions instead of function indices.
func checkElements(p []byte) error {
	n, pos, err := readU32(p, 0)
	if err != nil {
		return err
	}
	for i := uint32(0); i < n; i++ {
		var flag uint32
		if flag, pos, err = readU32(p, pos); err != nil {
			return err
		}
		if flag > 7 {
			return fmt.Errorf("%w: element segment %d has flags %d", ErrMalformed, i, flag)
		}
		if flag&1 == 0 {
			if flag&2 != 0 {
				if _, pos, err = readU32(p, pos); err != nil {
					return err
				}
			}
			if pos, err = skipConstExpr(p, pos); err != nil {
				return err
			}
		}
		if flag&3 != 0 { // element kind or reference type
			if pos, err = skipBytes(p, pos, 1); err != nil {
				return err
			}
		}
		var count uint32
		if count, pos, err = readU32(p, pos); err != nil {
			return err
		}
		// Every element takes at least a byte.
		if uint64(count) > uint64(len(p)-pos) {
			return fmt.Errorf("%w: element segment %d declares %d elements, %d bytes left", ErrMalformed, i, count, len(p)-pos)
		}
		for j := uint32(0); j < count; j++ {
			if flag&4 != 0 {
				pos, err = skipConstExpr(p, pos)
			} else {
				_, pos, err = readU32(p, pos)
			}
			if err != nil {
				return err
			}
		}
	}
	if pos != len(p) {
		return fmt.Errorf("%w: trailing bytes in element section", ErrMalformed)
	}
	return nil
}

// skipConstExpr skips a constant expression: instructions up to the first
// end.
func skipConstExpr(p []byte, pos int) (int, error) {
	for op := uint32(0); op != opEnd; {
		var err error
		if op, pos, err = nextInstr(p, pos); err != nil {
			return pos, err
		}
	}
	return pos, nil
}
