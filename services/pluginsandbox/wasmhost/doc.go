// Package wasmhost runs Clawmesh plugins on wazero under the limits of seed
// 003: fuel, a wall-clock deadline, linear memory, table elements and a
// host-wide instance cap. It speaks the core-wasm ABI of plugins/ABI.md and
// adapts the tool, channel and memory worlds to Go types.
//
// A Host owns one wazero runtime (compiled once per module, with an on-disk
// compilation cache), the host imports and the logging queue. Modules are
// rewritten before compilation (package wasmbin): fuel metering, table
// checks and data-segment merging. Tool calls each get a fresh instance,
// taken from a small pool of pre-instantiated, never-used instances so that
// instantiation stays off the call path. Channel and memory plugins keep one
// instance, refuelled before each call and never resumed after a trap.
package wasmhost
