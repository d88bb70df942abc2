package gateway

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"testing"
)

// sameAsStd fails t unless decodeBase64 gives what encoding/base64 gives
// for in: the same bytes, or the same error.
func sameAsStd(t *testing.T, in []byte) {
	t.Helper()
	want := make([]byte, base64.StdEncoding.DecodedLen(len(in)))
	got := make([]byte, len(want))
	wn, werr := base64.StdEncoding.Decode(want, in)
	gn, gerr := decodeBase64(got, in)
	if fmt.Sprint(gerr) != fmt.Sprint(werr) {
		t.Fatalf("%.80q: error %v, encoding/base64 %v", in, gerr, werr)
	}
	if werr == nil && !bytes.Equal(got[:gn], want[:wn]) {
		t.Fatalf("%.80q: decoded %d bytes unlike encoding/base64's %d", in, gn, wn)
	}
}

// base64Seeds are inputs where a fast decoder could part from
// encoding/base64: line breaks (which it skips), padding, a bad byte deep
// in a long input (past the first vector), and a chunk-sized input.
func base64Seeds() [][]byte {
	long := make([]byte, 3000)
	_, _ = rand.Read(long)
	enc := []byte(base64.StdEncoding.EncodeToString(long))
	seeds := [][]byte{
		nil, []byte("QUJD"), []byte("QUI="), []byte("QQ=="), []byte("QQ="), []byte("QQ"), []byte("QR=="),
		[]byte("QUJD\nRA=="), []byte("QUJD\r\nRA==\n"), []byte("=QUJ"), []byte("QU=D"), []byte("QUJD===="),
		[]byte("QUJD-_"), []byte("QUJD RA=="), enc,
	}
	for _, at := range []int{0, 31, 32, 33, 64, 100, 1000, len(enc) - 5, len(enc) - 1} {
		for _, c := range []byte{'!', '\n', '=', '-', 0x80, ' '} {
			bad := bytes.Clone(enc)
			bad[at] = c
			seeds = append(seeds, bad)
		}
	}
	chunk := make([]byte, 1<<20)
	_, _ = rand.Read(chunk)
	return append(seeds, []byte(base64.StdEncoding.EncodeToString(chunk)), enc[:len(enc)-1], append(bytes.Clone(enc), 'Q'))
}

func TestDecodeBase64AsEncodingBase64(t *testing.T) {
	for _, in := range base64Seeds() {
		sameAsStd(t, in)
	}
}

func FuzzDecodeBase64(f *testing.F) {
	for _, in := range base64Seeds() {
		if len(in) < 4096 { // the fuzzer's corpus, not the megabyte
			f.Add(in)
		}
	}
	f.Fuzz(sameAsStd)
}

// A buffer too short for the decoded bytes is refused before the SIMD
// decoder could store past its end.
func TestDecodeBase64RefusesShortBuffer(t *testing.T) {
	src := []byte(base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xab}, 300)))
	buf := make([]byte, 400)
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
		for i, c := range buf[200:] {
			if c != 0 {
				t.Fatalf("byte %d past the buffer's end written", 200+i)
			}
		}
	}()
	for i := range buf[:200] {
		buf[i] = 0xff
	}
	_, _ = decodeBase64(buf[:200], src)
}

// BenchmarkDecodeBase64 decodes a 1 MiB chunk's base64 (1.4 MB) with
// decodeBase64 and, for scale, with encoding/base64.
func BenchmarkDecodeBase64(b *testing.B) {
	chunk := make([]byte, 1<<20)
	_, _ = rand.Read(chunk)
	src := []byte(base64.StdEncoding.EncodeToString(chunk))
	dst := make([]byte, base64.StdEncoding.DecodedLen(len(src)))
	for _, c := range []struct {
		name   string
		decode func(dst, src []byte) (int, error)
	}{{"decodeBase64", decodeBase64}, {"encoding-base64", base64.StdEncoding.Decode}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(src)))
			for b.Loop() {
				if _, err := c.decode(dst, src); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// Decoding into a buffer of exactly DecodedLen writes nothing past it,
// for every input length around the SIMD decoder's vector sizes, valid
// or not: the buffer may sit inside a larger pooled array (chunkBuffer)
// or a size class's spare room, and the client chooses the length.
func TestDecodeBase64StaysInsideItsBuffer(t *testing.T) {
	raw := make([]byte, 300)
	_, _ = rand.Read(raw)
	for n := range len(raw) {
		enc := []byte(base64.StdEncoding.EncodeToString(raw[:n]))
		for _, in := range [][]byte{enc, append(bytes.Clone(enc), '!')} {
			room := base64.StdEncoding.DecodedLen(len(in))
			backing := bytes.Repeat([]byte{0xee}, room+64)
			_, _ = decodeBase64(backing[:room:room], in)
			for i, c := range backing[room:] {
				if c != 0xee {
					t.Fatalf("input of %d bytes: byte %d past the buffer's end written", len(in), i)
				}
			}
		}
	}
}
