package wasmbin

import "fmt"

// readU32 decodes an unsigned LEB128 value of at most 32 bits at b[pos:].
// It returns the value and the position just after it.
func readU32(b []byte, pos int) (uint32, int, error) {
	v, next, err := readUnsigned(b, pos, 32)
	return uint32(v), next, err
}

// readU64 decodes an unsigned LEB128 value of at most 64 bits.
func readU64(b []byte, pos int) (uint64, int, error) {
	return readUnsigned(b, pos, 64)
}

func readUnsigned(b []byte, pos, bits int) (uint64, int, error) {
	var v uint64
	for shift := 0; ; shift += 7 {
		if pos >= len(b) {
			return 0, pos, fmt.Errorf("%w: truncated LEB128 at offset %d", ErrMalformed, pos)
		}
		if shift >= bits {
			return 0, pos, fmt.Errorf("%w: LEB128 too long at offset %d", ErrMalformed, pos)
		}
		c := b[pos]
		pos++
		v |= uint64(c&0x7f) << shift
		if c&0x80 == 0 {
			return v, pos, nil
		}
	}
}

// skipSigned skips a signed LEB128 value of at most maxBytes bytes.
func skipSigned(b []byte, pos, maxBytes int) (int, error) {
	for i := 0; i < maxBytes; i++ {
		if pos >= len(b) {
			return pos, fmt.Errorf("%w: truncated LEB128 at offset %d", ErrMalformed, pos)
		}
		c := b[pos]
		pos++
		if c&0x80 == 0 {
			return pos, nil
		}
	}
	return pos, fmt.Errorf("%w: LEB128 too long at offset %d", ErrMalformed, pos)
}

// readS64 decodes a signed LEB128 value of at most 64 bits.
func readS64(b []byte, pos int) (int64, int, error) {
	var v int64
	var shift uint
	for {
		if pos >= len(b) {
			return 0, pos, fmt.Errorf("%w: truncated LEB128 at offset %d", ErrMalformed, pos)
		}
		if shift >= 70 {
			return 0, pos, fmt.Errorf("%w: LEB128 too long at offset %d", ErrMalformed, pos)
		}
		c := b[pos]
		pos++
		v |= int64(c&0x7f) << shift
		shift += 7
		if c&0x80 == 0 {
			if shift < 64 && c&0x40 != 0 {
				v |= -1 << shift
			}
			return v, pos, nil
		}
	}
}

// appendU32 appends v as unsigned LEB128.
func appendU32(dst []byte, v uint32) []byte { return appendU64(dst, uint64(v)) }

// appendU64 appends v as unsigned LEB128.
func appendU64(dst []byte, v uint64) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			dst = append(dst, c|0x80)
			continue
		}
		return append(dst, c)
	}
}

// appendS64 appends v as signed LEB128.
func appendS64(dst []byte, v int64) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0) {
			return append(dst, c)
		}
		dst = append(dst, c|0x80)
	}
}

// appendName appends a length-prefixed UTF-8 name.
func appendName(dst []byte, s string) []byte {
	dst = appendU32(dst, uint32(len(s)))
	return append(dst, s...)
}

func readName(b []byte, pos int) (string, int, error) {
	n, pos, err := readU32(b, pos)
	if err != nil {
		return "", pos, err
	}
	end := pos + int(n)
	if end > len(b) || end < pos {
		return "", pos, fmt.Errorf("%w: name past end at offset %d", ErrMalformed, pos)
	}
	return string(b[pos:end]), end, nil
}
