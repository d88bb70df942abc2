// Package wasmbin reads and rewrites core WebAssembly binaries before wazero
// compiles them. It does what wazero does not: it meters fuel by
// instrumenting every basic block, inspects tables so that a table limit can
// be enforced, and merges data segments so that instantiation is cheap.
//
// The package only inserts code and re-encodes section headers: instructions
// of the original module are copied byte for byte, so a module that validated
// before the rewrite validates after it.
package wasmbin

import "errors"

// Sentinel errors. Every error returned by this package wraps one of them.
var (
	// ErrMalformed reports bytes that are not a well-formed wasm binary.
	ErrMalformed = errors.New("wasmbin: malformed module")
	// ErrUnsupported reports a well-formed module that uses a feature the
	// rewriter does not handle (exception handling, GC types, memory64 tables).
	ErrUnsupported = errors.New("wasmbin: unsupported feature")
	// ErrTableLimit reports a table that breaks the table-element limit.
	ErrTableLimit = errors.New("wasmbin: table over the element limit")
	// ErrNameClash reports that the module already exports a name the
	// rewriter needs.
	ErrNameClash = errors.New("wasmbin: export name already used")
)
