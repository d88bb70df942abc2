// Package wasmbuild encodes small core wasm modules from Go, for tests that
// need modules no compiler emits (a table without a maximum that grows, a
// bare loop with an exact instruction count) without a wat2wasm dependency.
package wasmbuild

// Value types.
const (
	I32     byte = 0x7f
	I64     byte = 0x7e
	FuncRef byte = 0x70
)

// Builder accumulates the parts of a module. Indices it returns are final:
// imports must be added before functions.
type Builder struct {
	types   [][]byte
	imports []byte
	nImport uint32
	funcs   []uint32
	codes   [][]byte
	tables  []byte
	nTables uint32
	memory  []byte
	globals []byte
	nGlobal uint32
	exports []byte
	nExport uint32
	elems   []byte
	nElems  uint32
	data    []byte
	nData   uint32
	start   []byte // the start section's payload, if any
}

// Type adds a function type and returns its index.
func (b *Builder) Type(params, results []byte) uint32 {
	t := []byte{0x60}
	t = U32(t, uint32(len(params)))
	t = append(t, params...)
	t = U32(t, uint32(len(results)))
	t = append(t, results...)
	b.types = append(b.types, t)
	return uint32(len(b.types) - 1)
}

// ImportFunc adds a function import and returns its function index.
func (b *Builder) ImportFunc(module, name string, typ uint32) uint32 {
	b.imports = Name(b.imports, module)
	b.imports = Name(b.imports, name)
	b.imports = append(b.imports, 0x00)
	b.imports = U32(b.imports, typ)
	b.nImport++
	return b.nImport - 1
}

// Func adds a function with raw local declarations (nil for none) and a body
// that must end with 0x0b, and returns its function index.
func (b *Builder) Func(typ uint32, locals, body []byte) uint32 {
	if locals == nil {
		locals = []byte{0x00}
	}
	b.funcs = append(b.funcs, typ)
	code := append(append([]byte(nil), locals...), body...)
	b.codes = append(b.codes, code)
	return b.nImport + uint32(len(b.funcs)-1)
}

// Table adds a funcref table.
func (b *Builder) Table(min, max uint32, hasMax bool) uint32 {
	b.tables = append(b.tables, FuncRef)
	b.tables = limits(b.tables, min, max, hasMax)
	b.nTables++
	return b.nTables - 1
}

// Memory declares memory 0 and exports it as "memory".
func (b *Builder) Memory(min, max uint32, hasMax bool) {
	b.memory = limits([]byte{0x01}, min, max, hasMax)
	b.export("memory", 0x02, 0)
}

// Elem adds an active element segment for table 0 at a constant offset.
func (b *Builder) Elem(offset int32, funcs ...uint32) {
	b.elems = append(b.elems, 0x00, 0x41)
	b.elems = S64(b.elems, int64(offset))
	b.elems = append(b.elems, 0x0b)
	b.elems = U32(b.elems, uint32(len(funcs)))
	for _, f := range funcs {
		b.elems = U32(b.elems, f)
	}
	b.nElems++
}

// Data adds an active data segment for memory 0 at a constant offset.
func (b *Builder) Data(offset int32, bytes []byte) {
	b.data = append(b.data, 0x00, 0x41)
	b.data = S64(b.data, int64(offset))
	b.data = append(b.data, 0x0b)
	b.data = U32(b.data, uint32(len(bytes)))
	b.data = append(b.data, bytes...)
	b.nData++
}

// Global adds a mutable i64 global initialised to init and returns its
// index (the builder imports no globals).
func (b *Builder) Global(init int64) uint32 {
	b.globals = append(b.globals, I64, 0x01, 0x42)
	b.globals = append(S64(b.globals, init), 0x0b)
	b.nGlobal++
	return b.nGlobal - 1
}

// ExportGlobal exports a global by index, which need not exist.
func (b *Builder) ExportGlobal(name string, idx uint32) { b.export(name, 0x03, idx) }

// ExportFunc exports a function.
func (b *Builder) ExportFunc(name string, idx uint32) { b.export(name, 0x00, idx) }

func (b *Builder) export(name string, kind byte, idx uint32) {
	b.exports = Name(b.exports, name)
	b.exports = append(b.exports, kind)
	b.exports = U32(b.exports, idx)
	b.nExport++
}

// Start makes function idx the module's start function.
func (b *Builder) Start(idx uint32) { b.start = U32(nil, idx) }

// Bytes encodes the module.
func (b *Builder) Bytes() []byte {
	out := []byte{0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00}
	var types []byte
	types = U32(types, uint32(len(b.types)))
	for _, t := range b.types {
		types = append(types, t...)
	}
	out = section(out, 1, types)
	if b.nImport > 0 {
		out = section(out, 2, append(U32(nil, b.nImport), b.imports...))
	}
	funcs := U32(nil, uint32(len(b.funcs)))
	for _, f := range b.funcs {
		funcs = U32(funcs, f)
	}
	out = section(out, 3, funcs)
	if b.nTables > 0 {
		out = section(out, 4, append(U32(nil, b.nTables), b.tables...))
	}
	if b.memory != nil {
		out = section(out, 5, b.memory)
	}
	if b.nGlobal > 0 {
		out = section(out, 6, append(U32(nil, b.nGlobal), b.globals...))
	}
	if b.nExport > 0 {
		out = section(out, 7, append(U32(nil, b.nExport), b.exports...))
	}
	if b.start != nil {
		out = section(out, 8, b.start)
	}
	if b.nElems > 0 {
		out = section(out, 9, append(U32(nil, b.nElems), b.elems...))
	}
	code := U32(nil, uint32(len(b.codes)))
	for _, c := range b.codes {
		code = U32(code, uint32(len(c)))
		code = append(code, c...)
	}
	out = section(out, 10, code)
	if b.nData > 0 {
		out = section(out, 11, append(U32(nil, b.nData), b.data...))
	}
	return out
}

func limits(dst []byte, min, max uint32, hasMax bool) []byte {
	if !hasMax {
		return U32(append(dst, 0x00), min)
	}
	return U32(U32(append(dst, 0x01), min), max)
}

func section(dst []byte, id byte, payload []byte) []byte {
	dst = append(dst, id)
	dst = U32(dst, uint32(len(payload)))
	return append(dst, payload...)
}

// U32 appends v as unsigned LEB128.
func U32(dst []byte, v uint32) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v == 0 {
			return append(dst, c)
		}
		dst = append(dst, c|0x80)
	}
}

// S64 appends v as signed LEB128 (for i32.const and i64.const immediates).
func S64(dst []byte, v int64) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0) {
			return append(dst, c)
		}
		dst = append(dst, c|0x80)
	}
}

// Name appends a length-prefixed string.
func Name(dst []byte, s string) []byte { return append(U32(dst, uint32(len(s))), s...) }
