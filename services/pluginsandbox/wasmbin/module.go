package wasmbin

import (
	"bytes"
	"fmt"
)

// Section ids of the core binary format.
const (
	secCustom    = 0
	secType      = 1
	secImport    = 2
	secFunction  = 3
	secTable     = 4
	secMemory    = 5
	secGlobal    = 6
	secExport    = 7
	secStart     = 8
	secElement   = 9
	secCode      = 10
	secData      = 11
	secDataCount = 12
	secTag       = 13
)

// sectionRank gives the position of each non-custom section in the order the
// binary format requires.
var sectionRank = map[byte]int{
	secType: 1, secImport: 2, secFunction: 3, secTable: 4, secMemory: 5, secTag: 6,
	secGlobal: 7, secExport: 8, secStart: 9, secElement: 10, secDataCount: 11, secCode: 12, secData: 13,
}

var magicVersion = []byte{0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00}

// Section is one raw section: its id and payload.
type Section struct {
	ID      byte
	Payload []byte
}

// Limits are the limits of a table or memory.
type Limits struct {
	Min    uint64
	Max    uint64
	HasMax bool
}

// Export is one entry of the export section.
type Export struct {
	Name  string
	Kind  byte // 0 func, 1 table, 2 memory, 3 global, 4 tag
	Index uint32
}

// Module is a parsed wasm binary: its raw sections plus the facts the
// rewriters need. Sections are shared with the input bytes; rewriters build
// new payloads and never modify old ones.
type Module struct {
	Sections []Section

	ImportedFuncs   uint32
	ImportedGlobals uint32
	ImportedTables  []Limits
	DefinedGlobals  uint32
	Tables          []Limits // defined tables, in order
	Exports         []Export
	Imports         []Import
	HasMemory       bool // memory 0 is defined or imported
}

// Import names one imported item.
type Import struct {
	Module, Name string
	Kind         byte
}

// Parse splits a binary into sections and decodes the import, table, global
// and export sections.
func Parse(b []byte) (*Module, error) {
	if len(b) < 8 || !bytes.Equal(b[:8], magicVersion) {
		return nil, fmt.Errorf("%w: bad magic or version", ErrMalformed)
	}
	m := &Module{}
	pos := 8
	lastRank := 0
	for pos < len(b) {
		id := b[pos]
		size, next, err := readU32(b, pos+1)
		if err != nil {
			return nil, err
		}
		end := next + int(size)
		if end > len(b) || end < next {
			return nil, fmt.Errorf("%w: section %d past end", ErrMalformed, id)
		}
		if id != secCustom {
			rank, ok := sectionRank[id]
			if !ok {
				return nil, fmt.Errorf("%w: unknown section id %d", ErrMalformed, id)
			}
			if rank <= lastRank {
				return nil, fmt.Errorf("%w: section %d out of order", ErrMalformed, id)
			}
			lastRank = rank
			if id == secDataCount {
				if _, n, err := readU32(b[next:end], 0); err != nil || n != int(size) {
					return nil, fmt.Errorf("%w: data count section of %d bytes", ErrMalformed, size)
				}
			} else if id != secStart {
				// Every entry of a vector section takes at least a byte: a
				// larger count is malformed, and refusing it here keeps
				// wazero's decoder from reserving room for it (26 bytes
				// announcing 100 million data segments made it allocate
				// 5.7 GB).
				count, _, err := readU32(b[next:end], 0)
				if err != nil {
					return nil, err
				}
				if uint64(count) > uint64(size) {
					return nil, fmt.Errorf("%w: section %d declares %d entries in %d bytes", ErrMalformed, id, count, size)
				}
			}
		}
		m.Sections = append(m.Sections, Section{ID: id, Payload: b[next:end]})
		pos = end
	}
	for _, s := range m.Sections {
		var err error
		switch s.ID {
		case secImport:
			err = m.decodeImports(s.Payload)
		case secTable:
			m.Tables, err = decodeTables(s.Payload)
		case secMemory:
			var n uint32
			n, _, err = readU32(s.Payload, 0)
			m.HasMemory = m.HasMemory || n > 0
		case secGlobal:
			m.DefinedGlobals, _, err = readU32(s.Payload, 0)
		case secExport:
			m.Exports, err = decodeExports(s.Payload)
		case secTag:
			err = fmt.Errorf("%w: exception tags", ErrUnsupported)
		}
		if err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Section returns the payload of the first section with the id, or nil.
func (m *Module) section(id byte) []byte {
	for _, s := range m.Sections {
		if s.ID == id {
			return s.Payload
		}
	}
	return nil
}

// setSection replaces the section with the id, or inserts it at its place
// in the required order.
func (m *Module) setSection(id byte, payload []byte) {
	for i, s := range m.Sections {
		if s.ID == id {
			m.Sections[i].Payload = payload
			return
		}
	}
	rank := sectionRank[id]
	at := len(m.Sections)
	for i, s := range m.Sections {
		if s.ID != secCustom && sectionRank[s.ID] > rank {
			at = i
			break
		}
	}
	m.Sections = append(m.Sections, Section{})
	copy(m.Sections[at+1:], m.Sections[at:])
	m.Sections[at] = Section{ID: id, Payload: payload}
}

// removeSection drops the section with the id.
func (m *Module) removeSection(id byte) {
	for i, s := range m.Sections {
		if s.ID == id {
			m.Sections = append(m.Sections[:i], m.Sections[i+1:]...)
			return
		}
	}
}

// Encode serialises the module.
func (m *Module) Encode() []byte {
	n := len(magicVersion)
	for _, s := range m.Sections {
		n += 6 + len(s.Payload)
	}
	out := make([]byte, 0, n)
	out = append(out, magicVersion...)
	for _, s := range m.Sections {
		out = append(out, s.ID)
		out = appendU32(out, uint32(len(s.Payload)))
		out = append(out, s.Payload...)
	}
	return out
}

// HasExport reports whether the module exports name.
func (m *Module) HasExport(name string) bool {
	for _, e := range m.Exports {
		if e.Name == name {
			return true
		}
	}
	return false
}

// StripCustomSections drops custom sections whose name starts with prefix
// (".debug_" for DWARF, which code rewriting makes stale).
func (m *Module) StripCustomSections(prefix string) {
	kept := m.Sections[:0]
	for _, s := range m.Sections {
		if s.ID == secCustom {
			if name, _, err := readName(s.Payload, 0); err == nil && len(name) >= len(prefix) && name[:len(prefix)] == prefix {
				continue
			}
		}
		kept = append(kept, s)
	}
	m.Sections = kept
}

func (m *Module) decodeImports(p []byte) error {
	n, pos, err := readU32(p, 0)
	if err != nil {
		return err
	}
	for i := uint32(0); i < n; i++ {
		var mod, name string
		if mod, pos, err = readName(p, pos); err != nil {
			return err
		}
		if name, pos, err = readName(p, pos); err != nil {
			return err
		}
		if pos >= len(p) {
			return fmt.Errorf("%w: truncated import", ErrMalformed)
		}
		kind := p[pos]
		pos++
		m.Imports = append(m.Imports, Import{Module: mod, Name: name, Kind: kind})
		switch kind {
		case 0: // func: type index
			m.ImportedFuncs++
			_, pos, err = readU32(p, pos)
		case 1: // table: reftype, limits
			var l Limits
			if pos, err = skipRefType(p, pos); err != nil {
				return err
			}
			l, pos, err = readLimits(p, pos)
			m.ImportedTables = append(m.ImportedTables, l)
		case 2: // memory
			m.HasMemory = true
			_, pos, err = readLimits(p, pos)
		case 3: // global: valtype, mut
			m.ImportedGlobals++
			if pos, err = skipValType(p, pos); err == nil {
				pos++
			}
		default:
			return fmt.Errorf("%w: import kind %d", ErrUnsupported, kind)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func decodeTables(p []byte) ([]Limits, error) {
	n, pos, err := readU32(p, 0)
	if err != nil {
		return nil, err
	}
	tables := make([]Limits, 0, min(int(n), len(p)))
	for i := uint32(0); i < n; i++ {
		if pos < len(p) && p[pos] == 0x40 {
			return nil, fmt.Errorf("%w: table with initialiser", ErrUnsupported)
		}
		if pos, err = skipRefType(p, pos); err != nil {
			return nil, err
		}
		var l Limits
		if l, pos, err = readLimits(p, pos); err != nil {
			return nil, err
		}
		tables = append(tables, l)
	}
	return tables, nil
}

func decodeExports(p []byte) ([]Export, error) {
	n, pos, err := readU32(p, 0)
	if err != nil {
		return nil, err
	}
	exports := make([]Export, 0, min(int(n), len(p)))
	for i := uint32(0); i < n; i++ {
		var e Export
		if e.Name, pos, err = readName(p, pos); err != nil {
			return nil, err
		}
		if pos >= len(p) {
			return nil, fmt.Errorf("%w: truncated export", ErrMalformed)
		}
		e.Kind = p[pos]
		if e.Index, pos, err = readU32(p, pos+1); err != nil {
			return nil, err
		}
		exports = append(exports, e)
	}
	if pos != len(p) {
		// Prepare appends entries to this section: trailing bytes must not
		// become part of them.
		return nil, fmt.Errorf("%w: trailing bytes in export section", ErrMalformed)
	}
	return exports, nil
}

func readLimits(p []byte, pos int) (Limits, int, error) {
	if pos >= len(p) {
		return Limits{}, pos, fmt.Errorf("%w: truncated limits", ErrMalformed)
	}
	flags := p[pos]
	pos++
	if flags > 0x07 {
		return Limits{}, pos, fmt.Errorf("%w: limits flags %#x", ErrMalformed, flags)
	}
	var l Limits
	var err error
	if l.Min, pos, err = readU64(p, pos); err != nil {
		return l, pos, err
	}
	if flags&1 != 0 {
		l.HasMax = true
		if l.Max, pos, err = readU64(p, pos); err != nil {
			return l, pos, err
		}
	}
	return l, pos, nil
}

// skipValType skips a value type; only the single-byte types of core wasm 2.0
// are accepted.
func skipValType(p []byte, pos int) (int, error) {
	if pos >= len(p) {
		return pos, fmt.Errorf("%w: truncated value type", ErrMalformed)
	}
	switch p[pos] {
	case 0x7f, 0x7e, 0x7d, 0x7c, 0x7b, 0x70, 0x6f:
		return pos + 1, nil
	default:
		return pos, fmt.Errorf("%w: value type %#x", ErrUnsupported, p[pos])
	}
}

func skipRefType(p []byte, pos int) (int, error) {
	if pos >= len(p) {
		return pos, fmt.Errorf("%w: truncated reference type", ErrMalformed)
	}
	switch p[pos] {
	case 0x70, 0x6f:
		return pos + 1, nil
	default:
		return pos, fmt.Errorf("%w: reference type %#x", ErrUnsupported, p[pos])
	}
}
