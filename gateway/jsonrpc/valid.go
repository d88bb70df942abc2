package jsonrpc

import (
	"bytes"
	"encoding/binary"
	"math/bits"

	"github.com/segmentio/asm/ascii"

	"github.com/clawmesh/clawmesh/internal/jsonstr"
	"github.com/clawmesh/clawmesh/internal/jsonwalk"
)

// maxValidDepth is encoding/json's nesting limit: json.Valid refuses a
// value nested deeper, and so does valid.
const maxValidDepth = 10000

// valid reports whether b is one JSON value, exactly as json.Valid does
// (same grammar, same depth limit; invalid UTF-8 inside strings is
// accepted by both), but several times faster on long strings: a chunk
// frame is one 1.4 MB base64 string, which json.Valid's state machine
// walks one byte and one indirect call at a time. A string without an
// escape is found by the runtime's vector search for its closing quote
// and checked for a backslash and control bytes; one with escapes is
// walked a word at a time until a word may hold a quote, a backslash or
// a control byte. The fuzz test FuzzValid holds it to json.Valid.
func valid(b []byte) bool {
	i := validValue(b, jsonwalk.SkipSpace(b, 0), 0)
	return i >= 0 && jsonwalk.SkipSpace(b, i) == len(b)
}

// validFrame is valid, and when e is not nil and b is an object it also
// hands each of b's members to e as it passes them: Classify's envelope
// read in the same pass as the check. Read apart, the envelope's walk
// searched a chunk's 1.4 MB string twice more (its closing quote, a
// backslash) after the check had.
func validFrame(b []byte, e *envelope) bool {
	i := jsonwalk.SkipSpace(b, 0)
	if e == nil || i >= len(b) || b[i] != '{' {
		return valid(b)
	}
	return validEnvelope(b, i, e)
}

// validEnvelope is validFrame for the object at b[i] == '{'. Its own
// members are read by a loop of their own, not validValue's: a key that
// is one of the envelope's names as written is told by comparing it whole
// (no string walk, no name lookup after it), and a value is checked by
// what its first byte says it is, an empty object or array on the spot,
// a container with anything in it by validValue. A request's frame is
// mostly its envelope (health's is nothing else), which validValue's
// general loop walked at some 120 instructions a key or value: health's
// classification took 2,372 instructions there, 1,312 here ("Sixty-seventh
// round" in docs/performance.md).
func validEnvelope(b []byte, i int, e *envelope) bool {
	i = jsonwalk.SkipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return jsonwalk.SkipSpace(b, i+1) == len(b)
	}
	for {
		// A key starts at b[i].
		if i >= len(b) || b[i] != '"' {
			return false
		}
		ks := i
		bit, ke := envelopeKey(b, i)
		if ke < 0 {
			if ke = validString(b, i); ke < 0 {
				return false
			}
			bit = keyBit(b[ks:ke])
		}
		i = jsonwalk.SkipSpace(b, ke)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		i = jsonwalk.SkipSpace(b, i+1)
		// Its value starts at b[i].
		vs := i
		if i >= len(b) {
			return false
		}
		switch c := b[i]; c {
		case '"':
			if bit == hasJSONRPC && hasWord(b, i, `"2.0"`) {
				i += 5
			} else if i = validString(b, i); i < 0 {
				return false
			}
		case '{', '[':
			// The envelope is the first level of nesting: its values
			// may open maxValidDepth-1 more.
			if j := jsonwalk.SkipSpace(b, i+1); j < len(b) && b[j] == c+2 {
				i = j + 1
			} else if i = validValue(b, i, 1); i < 0 {
				return false
			}
		case 't':
			if !hasWord(b, i, "true") {
				return false
			}
			i += 4
		case 'f':
			if !hasWord(b, i, "false") {
				return false
			}
			i += 5
		case 'n':
			if !hasWord(b, i, "null") {
				return false
			}
			i += 4
		default:
			if i = jsonstr.NumberEnd(b, i); i < 0 {
				return false
			}
		}
		e.set(bit, b[vs:i])
		i = jsonwalk.SkipSpace(b, i)
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i = jsonwalk.SkipSpace(b, i+1)
		case '}':
			return jsonwalk.SkipSpace(b, i+1) == len(b)
		default:
			return false
		}
	}
}

// envelopeKey reads the key at b[i] == '"' when it is one of the six
// envelope names written as they are, and returns its has* bit and the
// index past its closing quote; ke is -1 for any other key (valid or
// not), which is then read as any string is. Each name is compared whole,
// its closing quote with it, in one or two word loads.
func envelopeKey(b []byte, i int) (bit uint8, ke int) {
	r := b[i+1:]
	if len(r) < 3 {
		return 0, -1
	}
	switch r[0] {
	case 'i':
		if r[1] == 'd' && r[2] == '"' {
			return hasID, i + 4
		}
	case 'j':
		if len(r) >= 8 && string(r[:8]) == `jsonrpc"` {
			return hasJSONRPC, i + 9
		}
	case 'm':
		if len(r) >= 7 && string(r[:7]) == `method"` {
			return hasMethod, i + 8
		}
	case 'p':
		if len(r) >= 7 && string(r[:7]) == `params"` {
			return hasParams, i + 8
		}
	case 'r':
		if len(r) >= 7 && string(r[:7]) == `result"` {
			return hasResult, i + 8
		}
	case 'e':
		if len(r) >= 6 && string(r[:6]) == `error"` {
			return hasError, i + 7
		}
	}
	return 0, -1
}

// validValue checks the value at b[i] with depth containers open around
// it and returns the index past it, or -1 when it is not valid JSON.
func validValue(b []byte, i int, depth int) int {
	// stack holds one byte per container open in this value: '{' or
	// '['; the first levels live in the array, deeper ones spill to the
	// heap.
	var small [64]byte
	stack := small[:0]
	for {
		// A value starts at b[i].
		if i >= len(b) {
			return -1
		}
		switch c := b[i]; c {
		case '{', '[':
			if depth+len(stack) >= maxValidDepth {
				return -1
			}
			stack = append(stack, c)
			i = jsonwalk.SkipSpace(b, i+1)
			if i < len(b) && b[i] == c+2 { // '}' is '{'+2, ']' is '['+2
				stack = stack[:len(stack)-1]
				i++
				break
			}
			if c == '{' {
				if i = validKey(b, i); i < 0 {
					return -1
				}
			}
			continue
		case '"':
			if i = validString(b, i); i < 0 {
				return -1
			}
		case 't':
			if !hasWord(b, i, "true") {
				return -1
			}
			i += 4
		case 'f':
			if !hasWord(b, i, "false") {
				return -1
			}
			i += 5
		case 'n':
			if !hasWord(b, i, "null") {
				return -1
			}
			i += 4
		default:
			if i = jsonstr.NumberEnd(b, i); i < 0 {
				return -1
			}
		}
		// After a value: a separator, the end of containers, or the end
		// of the value checked. Each time round, a value at the depth of
		// the stack has just ended at b[i].
		for {
			if len(stack) == 0 {
				return i
			}
			i = jsonwalk.SkipSpace(b, i)
			if i >= len(b) {
				return -1
			}
			top := stack[len(stack)-1]
			switch b[i] {
			case ',':
				i = jsonwalk.SkipSpace(b, i+1)
				if top == '{' {
					if i = validKey(b, i); i < 0 {
						return -1
					}
				}
			case top + 2:
				stack = stack[:len(stack)-1]
				i++
				continue
			default:
				return -1
			}
			break
		}
	}
}

// validKey checks a member's key and colon at b[i] and returns the index
// of its value, or -1 when they are not valid.
func validKey(b []byte, i int) int {
	if i >= len(b) || b[i] != '"' {
		return -1
	}
	if i = validString(b, i); i < 0 {
		return -1
	}
	i = jsonwalk.SkipSpace(b, i)
	if i >= len(b) || b[i] != ':' {
		return -1
	}
	return jsonwalk.SkipSpace(b, i+1)
}

func hasWord(b []byte, i int, w string) bool {
	return len(b)-i >= len(w) && string(b[i:i+len(w)]) == w
}

// SWAR constants: a byte's high bit set in the result of has* marks a
// byte that matched (exact for "is there any", which is all we ask).
const (
	swarOnes  = 0x0101010101010101
	swarHighs = 0x8080808080808080
)

// special marks, in its bytes' high bits, the bytes of x that may end a
// run of plain string bytes: below 0x20, '"' or '\\'. A mark may be
// false only in a byte above a true one, so "is any byte special" is
// exact.
func special(x uint64) uint64 {
	q := x ^ ('"' * swarOnes)
	s := x ^ ('\\' * swarOnes)
	return control(x) | ((q - swarOnes) &^ q) | ((s - swarOnes) &^ s)
}

// control marks the bytes of x below 0x20, as special does.
func control(x uint64) uint64 { return (x - 0x20*swarOnes) &^ x }

// hasControl reports whether b holds a byte below 0x20.
func hasControl(b []byte) bool {
	i := 0
	for ; len(b)-i >= 32; i += 32 {
		w := b[i : i+32]
		if (control(binary.LittleEndian.Uint64(w))|control(binary.LittleEndian.Uint64(w[8:]))|
			control(binary.LittleEndian.Uint64(w[16:]))|control(binary.LittleEndian.Uint64(w[24:])))&swarHighs != 0 {
			return true
		}
	}
	for ; i < len(b); i++ {
		if b[i] < 0x20 {
			return true
		}
	}
	return false
}

// shortString is how many bytes of a string validString reads a word at
// a time before it hands the rest to the vector searches. A key, an id or
// a streamed chunk's few words ends within it: every string of a session
// update does. Those searches cost a call and a set-up each, three a
// string, more than such a string's words; they were a tenth of the
// gateway's CPU a streamed chunk ("Fifty-ninth round: fan-out" in
// docs/performance.md).
const shortString = 64

// validString checks the string at b[i] == '"' and returns the index past
// its closing quote, or -1.
func validString(b []byte, i int) int {
	i++
	// Its first shortString bytes a word at a time. The lowest byte
	// special marks is the first that is special: a quote ends the
	// string, anything else is for the byte loop.
	for end := i + shortString; i < end && len(b)-i >= 8; i += 8 {
		if m := special(binary.LittleEndian.Uint64(b[i:])) & swarHighs; m != 0 {
			i += bits.TrailingZeros64(m) / 8
			if b[i] == '"' {
				return i + 1
			}
			return validStringRest(b, i)
		}
	}
	if len(b)-i < 8 {
		return validStringRest(b, i)
	}
	// A long string (a chunk's base64), its first bytes plain: the rest
	// without an escape is up to the first quote, with no backslash and no
	// control byte. The two searches are the runtime's vector code. The
	// control bytes are looked for by segmentio/asm's vector test for
	// printable ASCII, which a chunk's base64 is: a seventh of
	// hasControl's time on a 1.4 MB string (the largest of the three
	// passes over it). A string with other bytes (non-ASCII text) is left
	// to hasControl, which alone says whether one is a control.
	if e := bytes.IndexByte(b[i:], '"'); e >= 0 {
		if seg := b[i : i+e]; bytes.IndexByte(seg, '\\') < 0 {
			if ascii.ValidPrint(seg) || !hasControl(seg) {
				return i + e + 1
			}
			return -1
		}
	}
	return validStringRest(b, i)
}

// validStringRest checks a string from b[i] on, every byte of it before
// b[i] plain, and returns the index past its closing quote, or -1.
func validStringRest(b []byte, i int) int {
	for {
		// Thirty-two plain bytes at a time while there are (a long string
		// with escapes), one branch for four words that the core works on
		// side by side.
		for len(b)-i >= 32 {
			w := b[i : i+32]
			if (special(binary.LittleEndian.Uint64(w))|special(binary.LittleEndian.Uint64(w[8:]))|
				special(binary.LittleEndian.Uint64(w[16:]))|special(binary.LittleEndian.Uint64(w[24:])))&swarHighs != 0 {
				break
			}
			i += 32
		}
		// Eight plain bytes at a time: none below 0x20, none '"' or '\\'.
		for len(b)-i >= 8 {
			if special(binary.LittleEndian.Uint64(b[i:]))&swarHighs != 0 {
				break
			}
			i += 8
		}
		if i >= len(b) {
			return -1
		}
		switch c := b[i]; {
		case c == '"':
			return i + 1
		case c == '\\':
			if i+1 >= len(b) {
				return -1
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if len(b)-i < 6 || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) || !isHex(b[i+5]) {
					return -1
				}
				i += 6
			default:
				return -1
			}
		case c < 0x20:
			return -1
		default:
			i++
		}
	}
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}
