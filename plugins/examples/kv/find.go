package main

import (
	"math/rand/v2"
	"strings"
)

// finder looks for one query in many entries in time linear in their
// length, whatever the two hold.
//
// strings.Contains, on wasm, compares the whole query at each place its
// first byte matches until its failures pass one in sixteen bytes, then
// turns to Rabin-Karp with a fixed hash: a query of a few hundred bytes
// repeating a period of sixteen, against content of the same period,
// was compared in full at every period (12 bytes compared a byte, and at
// kv's 6 MiB the recall ran out of fuel); and a query whose hash equals
// that of the content's every window (easy to make, the hash is public)
// is compared at every byte. finder keeps the fast part, IndexByte to
// the next place the query's first byte is, and counts the bytes its
// compares take: once they pass the bytes it has moved over, it goes on
// with Rabin-Karp modulo a prime, its base drawn at random for each
// recall (the Go runtime's generator, which the sandbox seeds from
// crypto/rand), where a window that is not the query matches its hash
// with a chance of at most len(query) in 2^31.
type finder struct {
	q    string
	base uint64 // the hash's base, drawn per finder
	hash uint64 // of q
	pow  uint64 // base^len(q) mod rkPrime
}

// rkPrime is 2^31-1: a product of two values under it fits in 64 bits,
// and a value is reduced by shifts and adds (Go's % by a constant is a
// 128-bit multiply, emulated on wasm).
const rkPrime = 1<<31 - 1

// mod reduces x < 2^63 modulo rkPrime.
func mod(x uint64) uint64 {
	x = x&rkPrime + x>>31
	x = x&rkPrime + x>>31
	if x >= rkPrime {
		x -= rkPrime
	}
	return x
}

func newFinder(q string) *finder {
	f := &finder{q: q, base: 256 + rand.Uint64N(rkPrime-512), pow: 1}
	for i := 0; i < len(q); i++ {
		f.hash = mod(f.hash*f.base + uint64(q[i]))
		f.pow = mod(f.pow * f.base)
	}
	return f
}

// in reports whether the query occurs in s.
func (f *finder) in(s string) bool {
	q := f.q
	n := len(q)
	switch {
	case n == 0:
		return true
	case n == 1:
		return strings.IndexByte(s, q[0]) >= 0
	case n > len(s):
		return false
	}
	c0, c1 := q[0], q[1]
	last := len(s) - n // the last place q can start
	compared := 0
	for i := 0; i <= last; i++ {
		if s[i] != c0 {
			o := strings.IndexByte(s[i+1:last+1], c0)
			if o < 0 {
				return false
			}
			i += o + 1
		}
		if s[i+1] == c1 {
			if s[i:i+n] == q {
				return true
			}
			compared += n
		}
		compared += 2
		if compared > i+64 {
			return f.rabinKarp(s[i+1:])
		}
	}
	return false
}

// rabinKarp reports whether the query occurs in s, comparing only where
// a window's hash is the query's.
func (f *finder) rabinKarp(s string) bool {
	q, n := f.q, len(f.q)
	if n > len(s) {
		return false
	}
	base, pow, hash := f.base, f.pow, f.hash
	var h uint64
	for i := 0; i < n; i++ {
		h = mod(h*base + uint64(s[i]))
	}
	if h == hash && s[:n] == q {
		return true
	}
	// Window i+1 takes in[i] and drops out[i].
	in := s[n:]
	out := s[:len(in)]
	for i := 0; i < len(in); i++ {
		// 256 times the prime is more than any byte times pow, so the
		// sum stays unsigned.
		h = mod(h*base + uint64(in[i]) + rkPrime<<8 - pow*uint64(out[i]))
		if h == hash && s[i+1:i+1+n] == q {
			return true
		}
	}
	return false
}
