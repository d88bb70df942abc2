package wasmbin

import (
	"fmt"
	"sort"
)

// maxMergeGap is the largest run of zero bytes mergeData fills to join two
// segments. Linear memory starts zeroed, so filling a gap changes nothing.
const maxMergeGap = 4096

type dataSegment struct {
	offset uint32
	bytes  []byte
}

// mergeData joins active data segments of memory 0 with constant offsets
// into as few segments as gaps allow. wazero evaluates each segment on every
// instantiation; a Go guest has tens of thousands of them. The section is
// left alone when any segment is passive, targets another memory or has a
// computed offset, or when the code refers to segments by index.
// It returns the segment counts before and after.
func (m *Module) mergeData(codeUsesDataIndex bool) (before, after int, err error) {
	p := m.section(secData)
	if p == nil {
		return 0, 0, nil
	}
	n, pos, err := readU32(p, 0)
	if err != nil {
		return 0, 0, err
	}
	before = int(n)
	if codeUsesDataIndex {
		return before, before, nil
	}
	segs := make([]dataSegment, 0, min(int(n), len(p)))
	for i := uint32(0); i < n; i++ {
		var flag, off, size uint32
		if flag, pos, err = readU32(p, pos); err != nil {
			return before, before, err
		}
		// Only flag 0 with (i32.const N) end is mergeable.
		if flag != 0 || pos >= len(p) || p[pos] != 0x41 {
			return before, before, nil
		}
		var v int64
		if v, pos, err = readS64(p, pos+1); err != nil {
			return before, before, err
		}
		if pos >= len(p) || p[pos] != 0x0b {
			return before, before, nil
		}
		off = uint32(v)
		if size, pos, err = readU32(p, pos+1); err != nil {
			return before, before, err
		}
		end := pos + int(size)
		if end > len(p) || end < pos {
			return before, before, fmt.Errorf("%w: data segment %d past end", ErrMalformed, i)
		}
		segs = append(segs, dataSegment{offset: off, bytes: p[pos:end]})
		pos = end
	}
	if pos != len(p) {
		return before, before, fmt.Errorf("%w: trailing bytes in data section", ErrMalformed)
	}
	if dc := m.section(secDataCount); dc != nil {
		// The section is rewritten with the merged count: a count that
		// disagrees with the data section must not be made to agree.
		if want, _, err := readU32(dc, 0); err != nil || want != n {
			return before, before, fmt.Errorf("%w: data count %d, %d data segments", ErrMalformed, want, n)
		}
	}
	// Segments are applied in order, so order matters only where they
	// overlap: sort by offset and give up on any overlap.
	sort.SliceStable(segs, func(i, j int) bool { return segs[i].offset < segs[j].offset })
	var merged []dataSegment
	for _, s := range segs {
		if k := len(merged); k > 0 {
			last := &merged[k-1]
			lastEnd := uint64(last.offset) + uint64(len(last.bytes))
			if uint64(s.offset) < lastEnd {
				return before, before, nil
			}
			if uint64(s.offset)-lastEnd <= maxMergeGap {
				gap := int(uint64(s.offset) - lastEnd)
				last.bytes = append(last.bytes, make([]byte, gap)...)
				last.bytes = append(last.bytes, s.bytes...)
				continue
			}
		}
		merged = append(merged, dataSegment{offset: s.offset, bytes: append([]byte(nil), s.bytes...)})
	}
	out := appendU32(nil, uint32(len(merged)))
	for _, s := range merged {
		out = append(out, 0x00, 0x41)
		out = appendS64(out, int64(int32(s.offset)))
		out = append(out, 0x0b)
		out = appendU32(out, uint32(len(s.bytes)))
		out = append(out, s.bytes...)
	}
	m.setSection(secData, out)
	if m.section(secDataCount) != nil {
		m.setSection(secDataCount, appendU32(nil, uint32(len(merged))))
	}
	return before, len(merged), nil
}
