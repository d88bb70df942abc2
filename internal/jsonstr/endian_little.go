//go:build 386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm

package jsonstr

// littleEndian: a word loaded from memory has its first byte lowest.
const littleEndian = true
