//go:build mips || mips64 || ppc64 || s390x

package jsonstr

// littleEndian: a word loaded from memory has its first byte highest.
const littleEndian = false
