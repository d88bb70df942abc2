package jsonrpc

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"runtime"
	"testing"
)

// frameBody is n bytes without whitespace or LF, different for every
// seed, so that a frame copied from the wrong block shows.
func frameBody(n, seed int) []byte {
	b := make([]byte, n)
	x := uint32(seed*2654435761 + 1)
	for i := range b {
		x = x*1664525 + 1013904223
		b[i] = 'A' + byte(x>>24)%58
	}
	return b
}

// TestFrameReaderAcrossBlocks: frames of around one, two and three of
// the reader's blocks, exactly at the limit, with whitespace around them
// and the last without its LF, come out whole under reads of several
// sizes; a frame handed over with Own stays as it was while the reader's
// blocks are reused for the frames after it; the budget is whole between
// frames; and the reader never reads past max+1 bytes of a frame.
func TestFrameReaderAcrossBlocks(t *testing.T) {
	const b = initialFrameBuf
	max := 3*b + 5
	var data []byte
	for i, n := range []int{10, b - 1, b, b + 1, 2 * b, 17, max, 3, 2*b + 3} {
		switch i % 3 {
		case 1:
			data = append(data, "  "...)
		case 2:
			data = append(data, '\n')
		}
		data = append(data, frameBody(n, i)...)
		if i%2 == 1 {
			data = append(data, '\r')
		}
		if i < 8 {
			data = append(data, '\n')
		}
		if i == 4 {
			// A blank line of several blocks, then a small frame.
			data = append(append(data, bytes.Repeat([]byte(" "), 2*b+5)...), "\n{}\n"...)
		}
	}
	want := refFrames(data, max)
	for _, chunk := range []int{1<<10 + 7, b - 1, b, 3 * b} {
		t.Run(fmt.Sprint(chunk), func(t *testing.T) {
			readOwned(t, &countingReader{t: t, data: data, chunk: chunk, max: max}, max, want)
		})
	}
}

// TestFrameReaderSmallReads: frames read a few bytes a read, so that
// reads end at every offset of a frame and of a block, frames of one,
// two blocks and more among small ones and blank lines, come out whole:
// the search for a frame's LF goes on from where the search after the
// read before stopped (scanned), never past a frame's end or before it.
func TestFrameReaderSmallReads(t *testing.T) {
	const b = initialFrameBuf
	max := 2*b + 9
	var data []byte
	for i, n := range []int{1, 2, 40, b - 2, 3, b + 1, 1, 2 * b, 5, max} {
		data = append(data, frameBody(n, i)...)
		if i%3 == 0 {
			data = append(data, "\n  \r\n"...) // a blank line after it
		}
		data = append(data, '\n')
	}
	want := refFrames(data, max)
	for _, most := range []int{1, 3, 7} {
		t.Run(fmt.Sprint(most), func(t *testing.T) {
			readOwned(t, &repeatReader{line: data, most: most, once: true}, max, want)
		})
	}
}

// TestFrameReaderTooLargeAcrossBlocks: a line one byte over a limit of
// several blocks is refused without reading past max+1 bytes of it, and
// its blocks go back to the budget. A line of the limit and a CR is not
// over it, however the reads fall: the CR is read, then the LF.
func TestFrameReaderTooLargeAcrossBlocks(t *testing.T) {
	max := 2*initialFrameBuf + 100
	data := append(append(frameBody(max, 1), '\n'), frameBody(max, 3)...)
	data = append(data, "\r\n"...)
	data = append(data, frameBody(max+1, 2)...)
	data = append(data, "\n{}\n"...)
	for _, chunk := range []int{4093, 3 * initialFrameBuf, max, max + 1} {
		budget := NewFrameBudget(64 << 20)
		fr := NewFrameReader(&countingReader{t: t, data: data, chunk: chunk, max: max}, max, 0)
		fr.UseBudget(budget, nil)
		if got, err := fr.ReadFrame(); err != nil || len(got) != max {
			t.Fatalf("frame at the limit: %d bytes, %v", len(got), err)
		}
		if got, err := fr.ReadFrame(); err != nil || !bytes.Equal(got, frameBody(max, 3)) {
			t.Fatalf("frame at the limit ending in CRLF: %d bytes, %v", len(got), err)
		}
		if got, err := fr.ReadFrame(); !errors.Is(err, ErrFrameTooLarge) {
			t.Fatalf("frame over the limit: %d bytes, %v; want ErrFrameTooLarge", len(got), err)
		}
		fr.Release()
		if r := budget.Reserved(); r != 0 {
			t.Fatalf("%d bytes reserved after Release", r)
		}
	}
}

// TestFrameReaderNotOwned: a large frame the caller does not keep gives
// its budget back at the next ReadFrame, and a partial one at Release.
func TestFrameReaderNotOwned(t *testing.T) {
	data := append(frameBody(3*initialFrameBuf, 1), '\n')
	data = append(data, frameBody(2*initialFrameBuf, 2)...) // unfinished
	budget := NewFrameBudget(64 << 20)
	fr := NewFrameReader(&countingReader{t: t, data: data, chunk: 50000, max: DefaultMaxFrameBytes}, 0, 0)
	fr.UseBudget(budget, nil)
	if _, err := fr.ReadFrame(); err != nil {
		t.Fatal(err)
	}
	if r := budget.Reserved(); r < 3*initialFrameBuf {
		t.Fatalf("%d bytes reserved while a large frame is out, want at least its size", r)
	}
	// The unfinished frame at the end of the stream is returned too.
	if got, err := fr.ReadFrame(); err != nil || len(got) != 2*initialFrameBuf {
		t.Fatalf("last frame: %d bytes, %v", len(got), err)
	}
	fr.Release()
	if r := budget.Reserved(); r != 0 {
		t.Fatalf("%d bytes reserved after Release", r)
	}
}

// TestLargeFrameAllocatedOnce: reading a large frame allocates about its
// own size, the slice Own hands over, rather than a buffer grown by
// doubling (about four times the frame, zeroed, and copied at each step,
// before this reader). An upload chunk is such a frame.
func TestLargeFrameAllocatedOnce(t *testing.T) {
	const size, frames = 1400 << 10, 20
	line := append(frameBody(size, 3), '\n')
	var data []byte
	for range frames {
		data = append(data, line...)
	}
	fr := NewFrameReader(bytes.NewReader(data), 0, 0)
	defer fr.Release()
	if f, err := fr.ReadFrame(); err != nil || len(f) != size { // the pool's first blocks
		t.Fatalf("first frame: %d bytes, %v", len(f), err)
	}
	fr.Own(nil)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := 1; i < frames; i++ {
		f, err := fr.ReadFrame()
		if err != nil || len(f) != size {
			t.Fatalf("frame %d: %d bytes, %v", i, len(f), err)
		}
		_, _ = fr.Own(f)
	}
	runtime.ReadMemStats(&after)
	perFrame := float64(after.TotalAlloc-before.TotalAlloc) / (frames - 1)
	t.Logf("%.0f bytes allocated per %d-byte frame", perFrame, size)
	// About its size: 1.0x, and 1.25x under the race detector, whose
	// sync.Pool drops a quarter of what is put back; 2.46x before.
	if perFrame > 1.75*size {
		t.Fatalf("%.0f bytes allocated per %d-byte frame, want about its size", perFrame, size)
	}
}

// FuzzFramesAcrossBlocks is FuzzFrames with every byte other than LF
// stretched into a run of up to about 90 KB (blank ones into short or
// long runs), so that frames and blank lines span the reader's blocks and
// cross a limit of three of them, read in pieces of
// 1 to 200 KB (the reference reader's cost grows with the input over
// the piece, so no smaller).
func FuzzFramesAcrossBlocks(f *testing.F) {
	f.Add([]byte("ab\ncd \r\n\n e"), uint16(7))
	f.Add([]byte("abcd\nx"), uint16(65535))
	f.Add([]byte("\x01\x02\x03\x04\x05\n"), uint16(1))
	f.Fuzz(func(t *testing.T, in []byte, chunk uint16) {
		if len(in) > 64 {
			return
		}
		max := 3*initialFrameBuf + 11
		var data []byte
		for i, c := range in {
			n := (int(c)*7919 + i*104729) % 90000
			switch c {
			case '\n':
				n = 1
			case ' ', '\r', '\t':
				n = n%3 + n/3*(i%2) // blank runs short and long
			}
			data = append(data, bytes.Repeat([]byte{c}, n)...)
		}
		src := &countingReader{t: t, data: data, chunk: 1000 + int(chunk)*3, max: max}
		readOwned(t, src, max, refFrames(data, max))
	})
}

// readOwned reads src with a FrameReader of limit max and a budget,
// expecting the frames want (refFrames): each frame as want has it, then
// ErrFrameTooLarge where want says so, else EOF. Every frame is handed
// over with Own, after which the budget must be whole; every second one's
// Lease is returned, and the others are compared once more after the
// later frames reused the reader's blocks and the returned buffers; after
// Release the budget is whole too.
func readOwned(t *testing.T, src io.Reader, max int, want []refFrame) {
	t.Helper()
	budget := NewFrameBudget(64 << 20)
	fr := NewFrameReader(src, max, 0)
	fr.UseBudget(budget, nil)
	var owned [][]byte
	for i := 0; ; i++ {
		got, err := fr.ReadFrame()
		if i == len(want) {
			if !errors.Is(err, io.EOF) {
				t.Fatalf("after %d frames: %d bytes, %v; want EOF", i, len(got), err)
			}
			break
		}
		if want[i].tooLarge {
			if !errors.Is(err, ErrFrameTooLarge) {
				t.Fatalf("frame %d: %d bytes, %v; want ErrFrameTooLarge", i, len(got), err)
			}
			break
		}
		if err != nil || !bytes.Equal(got, want[i].frame) {
			t.Fatalf("frame %d: %d bytes, %v; want %d bytes", i, len(got), err, len(want[i].frame))
		}
		o, lease := fr.Own(got)
		if r := budget.Reserved(); r != 0 {
			t.Fatalf("%d bytes reserved after frame %d was handed over", r, i)
		}
		if i%2 == 1 {
			// Given back: the frames after it may be assembled in it.
			lease.Return()
			o = nil
		}
		owned = append(owned, o)
	}
	for i, o := range owned {
		if o != nil && !bytes.Equal(o, want[i].frame) {
			t.Fatalf("frame %d changed after it was handed over", i)
		}
	}
	fr.Release()
	if r := budget.Reserved(); r != 0 {
		t.Fatalf("%d bytes reserved after Release", r)
	}
}

// repeatReader hands out line over and over, as a socket would with a
// client that sends the same frame again and again.
type repeatReader struct {
	line []byte
	pos  int
	most int  // the most one Read returns; 0: as much as fits
	once bool // line once, then io.EOF
}

func (r *repeatReader) Read(p []byte) (int, error) {
	if r.once && r.pos == len(r.line) {
		return 0, io.EOF
	}
	if r.most > 0 && len(p) > r.most {
		p = p[:r.most]
	}
	n := copy(p, r.line[r.pos:])
	r.pos += n
	if !r.once {
		r.pos %= len(r.line)
	}
	return n, nil
}

// BenchmarkReadLargeFrame is an upload chunk's frame (1 MiB in base64,
// about 1.4 MB) read across the reader's blocks and handed over, as the
// gateway's read loop does with every chunk: kept, a frame whose buffer
// is never given back (a new one each); returned, one whose Lease is
// returned once it is answered (file/upload/chunk's), its buffer the
// next one's.
//
// The frame comes whole blocks a read there; a socket hands a frame
// over as its sender's writes reach it, often a few KiB a read:
// BenchmarkReadFramePartial reads the same frame 4 KiB at a time.
func BenchmarkReadLargeFrame(b *testing.B) {
	const size = 1400 << 10
	for _, give := range []bool{false, true} {
		b.Run(map[bool]string{false: "kept", true: "returned"}[give], func(b *testing.B) {
			fr := NewFrameReader(&repeatReader{line: append(frameBody(size, 5), '\n')}, 0, 0)
			defer fr.Release()
			b.SetBytes(size)
			b.ReportAllocs()
			for b.Loop() {
				f, err := fr.ReadFrame()
				if err != nil || len(f) != size {
					b.Fatalf("%d bytes, %v", len(f), err)
				}
				if _, lease := fr.Own(f); give {
					lease.Return()
				}
			}
		})
	}
}

// BenchmarkReadFramePartial reads BenchmarkReadLargeFrame's frame, its
// lease returned, from a reader that gives at most 4 KiB a read: each
// read adds a little to a block that may hold tens of KiB of the frame
// already, and the reader looks for the frame's LF after each.
func BenchmarkReadFramePartial(b *testing.B) {
	const size = 1400 << 10
	fr := NewFrameReader(&repeatReader{line: append(frameBody(size, 5), '\n'), most: 4 << 10}, 0, 0)
	defer fr.Release()
	b.SetBytes(size)
	b.ReportAllocs()
	for b.Loop() {
		f, err := fr.ReadFrame()
		if err != nil || len(f) != size {
			b.Fatalf("%d bytes, %v", len(f), err)
		}
		_, lease := fr.Own(f)
		lease.Return()
	}
}
