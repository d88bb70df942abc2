package wasmbin

import "fmt"

// checkSegments decodes the data and element sections far enough to check
// every count inside them against the bytes left: a data segment's size
// and an element segment's vector length each size an allocation in
// wazero's decoder, so a few bytes declaring gigabytes must be refused
// here (Parse bounds only each section's own entry count). Both sections
// must also end exactly after their last entry.
func (m *Module) checkSegments() error {
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
	return nil
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
