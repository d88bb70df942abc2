package jsonrpc

import (
	"bytes"
	"errors"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultMaxFrameBytes is the docs/spec.md §3 frame size limit: 8 MiB per line.
const DefaultMaxFrameBytes = 8 << 20

// initialFrameBuf is the size of the reader's buffer and of each block a
// larger frame is read into.
const initialFrameBuf = 64 << 10

// block is the unit a FrameReader reads into.
type block [initialFrameBuf]byte

// blocks keeps the blocks of finished frames for the next ones: a large
// frame is read into blocks taken from here rather than into buffers
// allocated (and zeroed) anew for every frame. What the pool holds is
// free memory the collector may take back; the FrameBudget counts the
// blocks while a frame holds them.
var blocks = sync.Pool{New: func() any { return new(block) }}

func getBlock() []byte { return blocks.Get().(*block)[:] }

func putBlock(b []byte) { blocks.Put((*block)(b)) }

// wholes keeps the buffers large frames were assembled in, by how many
// blocks they span: wholes[k] holds buffers of more than k-1 blocks and
// at most k. A frame given back (the reader was done with it, or its
// handler returned its Lease) is where the next frame of its size is
// assembled, in pages the process already has: a new 1.4 MB buffer an
// upload chunk had each of its pages faulted in anew once the runtime
// had handed free ones back to the system (docs/performance.md,
// thirty-fifth round). Frames past the default limit are not pooled.
var wholes [DefaultMaxFrameBytes/initialFrameBuf + 1]sync.Pool

// wholesPut counts the buffers put into each of wholes and not yet taken
// (more, after the collector emptied a pool, until a Get finds it
// empty). A pool nothing was given to is not asked: a Get on an empty
// sync.Pool slowed every frame never given back from 250 to 630 µs a
// 1.4 MB frame (BenchmarkReadLargeFrame/kept; the profile had the
// collector stopping the goroutine, runtime.suspendG, at a sixth of it).
var wholesPut [len(wholes)]atomic.Int32

// wholeClass is the pool of buffers for frames of size bytes, or -1.
func wholeClass(size int) int {
	if k := (size + initialFrameBuf - 1) / initialFrameBuf; k < len(wholes) {
		return k
	}
	return -1
}

// pooledWhole returns a pooled buffer of length size to assemble a frame
// in, or nil. A buffer of the class too short for this frame (the class
// spans a block's worth of sizes) is dropped: the frames of an upload
// are all of one size but the last.
func pooledWhole(size int) []byte {
	if k := wholeClass(size); k >= 0 {
		if wholesPut[k].Load() <= 0 {
			return nil
		}
		p, _ := wholes[k].Get().(*[]byte)
		if p == nil {
			wholesPut[k].Store(0)
			return nil
		}
		wholesPut[k].Add(-1)
		if cap(*p) >= size {
			return (*p)[:size]
		}
	}
	return nil
}

// putWhole gives a buffer a frame was assembled in to its pool.
func putWhole(b []byte) {
	if k := wholeClass(cap(b)); k >= 0 {
		b = b[:cap(b)]
		wholes[k].Put(&b)
		wholesPut[k].Add(1)
	}
}

// Lease is the buffer a frame Own handed over was assembled in. Return
// gives it to the frames after it: call it once, when nothing refers to
// the frame any more (its bytes are overwritten by a later one). A Lease
// never returned costs nothing but the buffer, which the collector takes
// like any slice; a frame that needed no assembly has a zero Lease,
// whose Return does nothing.
type Lease struct{ buf []byte }

// Return gives the buffer back; see Lease.
func (l Lease) Return() {
	if l.buf != nil {
		putWhole(l.buf)
	}
}

// readDeadliner is the part of net.Conn the frame timeout needs.
type readDeadliner interface {
	SetReadDeadline(time.Time) error
}

// FrameReader splits a byte stream into NDJSON frames.
//
// A frame is the bytes before an LF, with surrounding whitespace (and so a
// trailing CR) trimmed; blank lines are skipped. A line of more than max
// bytes before its LF, one CR just before the LF not counted, is refused
// with ErrFrameTooLarge, and the reader never reads more than max+1 bytes
// past the first byte of the current frame, or max+2 when the byte past
// max is a CR (its LF may come next): the rest of an oversized line stays
// unread in the socket.
//
// When the underlying reader can SetReadDeadline and the timeout is
// positive, a frame must be complete within that time of its first byte
// (any byte, whitespace included, after the previous LF), or ReadFrame
// returns ErrFrameTimeout. Time between frames is not bounded. Nor is the
// time the caller holds the reader between ReadFrame calls counted against
// a frame of which one read brought the start: the client sent those bytes
// and is not to blame that nobody read on (a connection held back by its
// bounds would otherwise be cut off for the server's own pause).
//
// A final frame without LF at end of stream is returned like any other,
// then io.EOF. A FrameReader is not safe for concurrent use.
//
// The reader reads into one 64 KiB block. A frame that fills it goes on
// into further blocks and, once its LF has come, is copied into one
// buffer: one an earlier frame of about its size was assembled in (see
// wholes), or a new one of its exact size. One copy a large frame,
// however it arrived, and the blocks go back to a pool for the next. The
// buffer goes to the pools at the next ReadFrame, or, once Own has
// handed the frame over, when the one it was handed to returns its
// Lease. With a FrameBudget (see UseBudget), every block beyond the
// first and the assembled frame are reserved from the budget first.
type FrameReader struct {
	r       io.Reader
	dl      readDeadliner
	max     int
	timeout time.Duration

	budget *FrameBudget
	done   <-chan struct{} // ends a wait for budget

	// With a budget, every piece and whole are reserved from it, in
	// their sizes, for as long as the reader holds them.
	buf        []byte    // one block; nil before the first read and after Release
	start, end int       // unread bytes are buf[start:end]
	pieces     [][]byte  // full blocks holding the current frame's first bytes; start is 0 while there are any
	whole      []byte    // the last frame assembled from pieces, until handed over or the next ReadFrame
	readAt     time.Time // when the latest Read returned data, moved on by heldAt pauses since
	frameAt    time.Time // when the current frame's first byte arrived, moved on likewise; zero if none
	heldAt     time.Time // when a frame was returned with the next one's start buffered; zero if not
	armedFor   time.Time // the frameAt the read deadline is set for; zero if none
	err        error     // sticky read error, returned once the buffer is drained

	// scanned counts the bytes from start already searched for the
	// frame's LF and without one: the search after a read goes on from
	// there. Searched from start after every read, a frame read a few
	// KiB at a time was searched anew up to its block's 64 KiB each
	// time: a 1.4 MB frame read 4 KiB a read took ten times as long as
	// one read a block at a time (fifty-sixth round).
	scanned int

	// inPlace, while set, is read instead of r (see readInPlace in
	// conn.go): errWouldBlock from it is passed on, not kept, and the
	// frame deadline is checked here before each read of a partial
	// frame, as the socket's own deadline is checked only in its waits.
	inPlace *socketSource
}

// errWouldBlock says the socket holds nothing to read now: the reader's
// caller gives the wait back to the runtime's poller (readInPlace).
var errWouldBlock = errors.New("jsonrpc: nothing to read yet")

// NewFrameReader returns a reader of frames of at most max bytes (max <= 0
// means DefaultMaxFrameBytes). timeout <= 0 disables the frame timeout.
func NewFrameReader(r io.Reader, max int, timeout time.Duration) *FrameReader {
	if max <= 0 {
		max = DefaultMaxFrameBytes
	}
	f := &FrameReader{r: r, max: max, timeout: timeout}
	if dl, ok := r.(readDeadliner); ok && timeout > 0 {
		f.dl = dl
	}
	return f
}

// UseBudget makes the reader reserve from b every block beyond its first
// and every frame it assembles from blocks. A wait for budget ends at the
// frame deadline (ErrFrameTimeout) or when done is closed (ErrClosed).
// Call it before the first ReadFrame, and Release when done with the
// reader.
func (f *FrameReader) UseBudget(b *FrameBudget, done <-chan struct{}) {
	f.budget, f.done = b, done
}

// Release returns the reader's budget and blocks, partial frame included
// (nothing is copied). The reader must not be used afterwards, nor any
// frame it returned that was not handed over with Own.
func (f *FrameReader) Release() {
	f.dropPieces()
	f.dropWhole()
	if f.buf != nil {
		putBlock(f.buf)
	}
	f.buf, f.start, f.end, f.scanned = nil, 0, 0, 0
}

// Own returns frame, which ReadFrame has just returned, as a slice the
// caller may keep: a frame that was read within one block is copied; one
// assembled from several is handed over as it is (no copy), with the
// Lease of the buffer it lies in, and its budget returned. Call it before
// the next ReadFrame.
func (f *FrameReader) Own(frame []byte) ([]byte, Lease) {
	if !f.inWhole(frame) {
		return append([]byte(nil), frame...), Lease{}
	}
	l := Lease{f.whole}
	f.release(len(f.whole))
	f.whole = nil // handed over: not pooled here
	return frame, l
}

// inWhole reports whether frame lies in the assembled frame: only that
// may be handed over without a copy; anything else lies in the block the
// reader reads on into.
func (f *FrameReader) inWhole(frame []byte) bool {
	if len(f.whole) == 0 || len(frame) == 0 || cap(frame) > cap(f.whole) {
		return false
	}
	// A slice of whole ends where whole's buffer ends: its first byte is
	// then the buffer's byte at cap(whole)-cap(frame). Indexed in the
	// whole buffer, past whole's length too: a pooled buffer is longer
	// than its frame, and a slice from elsewhere must be told apart, not
	// index past the length.
	all := f.whole[:cap(f.whole)]
	return &all[cap(all)-cap(frame)] == &frame[0]
}

// MaxBytes returns the frame size limit.
func (f *FrameReader) MaxBytes() int { return f.max }

// Buffered reports whether part of a frame has been read.
func (f *FrameReader) Buffered() bool { return f.start < f.end || len(f.pieces) > 0 }

// ReadFrame returns the next frame. The slice is valid until the next call.
// Errors: ErrFrameTooLarge, ErrFrameTimeout, io.EOF at a clean end of
// stream, or the underlying read error.
func (f *FrameReader) ReadFrame() ([]byte, error) {
	f.dropWhole() // not handed over: the caller is done with it
	if !f.heldAt.IsZero() {
		// The pause since the last frame was the caller's: the buffered
		// start of this frame (and the read it came in) is dated as if
		// read now. Only a read that ends in the middle of the next frame
		// pays for this; one whole frame per read does not.
		held := time.Since(f.heldAt)
		f.frameAt, f.readAt, f.heldAt = f.frameAt.Add(held), f.readAt.Add(held), time.Time{}
	}
	for {
		if i := bytes.IndexByte(f.buf[f.start+f.scanned:f.end], '\n'); i >= 0 {
			i += f.scanned
			f.scanned = 0
			line, err := f.take(i)
			f.start += i + 1
			if f.start == f.end {
				f.start, f.end = 0, 0
				f.frameAt = time.Time{}
			} else {
				f.frameAt = f.readAt // the next frame began in that read, or before
			}
			if err != nil {
				return nil, err
			}
			if line = trimSpace(line); len(line) > 0 {
				if f.start < f.end && f.buf[f.end-1] != '\n' {
					// The caller's pause counts against no frame when
					// what is buffered ends with an LF (see fill).
					f.heldAt = time.Now()
				}
				return line, nil
			}
			// A blank line: what it was assembled into is not returned,
			// so Own must not hand over the frame that follows it.
			f.dropWhole()
			continue
		}
		f.scanned = f.end - f.start
		n := f.buffered()
		if n > f.max && f.over(n, f.lastByte()) {
			return nil, ErrFrameTooLarge
		}
		if f.err == errWouldBlock {
			f.err = nil
			return nil, errWouldBlock
		}
		if f.err != nil {
			err := f.err
			if err == io.EOF && n > 0 {
				line, terr := f.take(f.end - f.start)
				f.start, f.end, f.scanned = 0, 0, 0
				if terr != nil {
					return nil, terr
				}
				if line = trimSpace(line); len(line) > 0 {
					return line, nil
				}
				f.dropWhole()
				return nil, err
			}
			if n > 0 && errors.Is(err, os.ErrDeadlineExceeded) {
				return nil, ErrFrameTimeout
			}
			return nil, err
		}
		f.fill(n)
	}
}

// buffered is how many bytes of the current frame have been read.
func (f *FrameReader) buffered() int {
	return len(f.pieces)*initialFrameBuf + f.end - f.start
}

// over reports whether a line of size bytes whose last is last passes
// the limit: the CR a line may end in before its LF is not the frame's
// (docs/spec.md §2), so max bytes and a CR are not over it.
func (f *FrameReader) over(size int, last byte) bool {
	return size > f.max && (size > f.max+1 || last != '\r')
}

// lastByte is the latest byte of the current frame read, 0 if none.
func (f *FrameReader) lastByte() byte {
	if f.end > f.start {
		return f.buf[f.end-1]
	}
	if len(f.pieces) > 0 {
		return f.pieces[len(f.pieces)-1][initialFrameBuf-1]
	}
	return 0
}

// take returns the current frame, whose last i bytes are buf[start:]: in
// place when it lies in the one block, else assembled from the pieces.
func (f *FrameReader) take(i int) ([]byte, error) {
	if len(f.pieces) == 0 {
		if i > f.max && f.over(i, f.buf[f.start+i-1]) {
			return nil, ErrFrameTooLarge
		}
		return f.buf[f.start : f.start+i], nil
	}
	size := len(f.pieces)*initialFrameBuf + i
	if size > f.max && f.over(size, f.lastOf(i)) {
		f.dropPieces()
		return nil, ErrFrameTooLarge
	}
	// The pieces stay reserved until the copy is done: the budget bounds
	// what is really live, the moment of the copy included.
	if err := f.reserve(int64(size)); err != nil {
		f.dropPieces()
		f.err = err
		return nil, err
	}
	last := f.buf[f.start : f.start+i]
	whole := pooledWhole(size)
	if whole != nil {
		n := 0
		for _, piece := range f.pieces {
			n += copy(whole[n:], piece)
		}
		copy(whole[n:], last)
	} else {
		// bytes.Join allocates its result without zeroing it first:
		// every byte is copied over at once, and zeroing a chunk's 1.4
		// MB first was a tenth of the read loop's work on an upload.
		parts := append(f.pieces, last)
		whole = bytes.Join(parts, nil)
		parts[len(parts)-1] = nil // the spare slot holds no view of buf
	}
	f.dropPieces()
	f.whole = whole
	return whole, nil
}

// lastOf is the last byte of the current frame, whose last i bytes are
// buf[start:]; there are pieces.
func (f *FrameReader) lastOf(i int) byte {
	if i > 0 {
		return f.buf[f.start+i-1]
	}
	return f.pieces[len(f.pieces)-1][initialFrameBuf-1]
}

// dropPieces returns the pieces to the pool and their budget.
func (f *FrameReader) dropPieces() {
	f.release(len(f.pieces) * initialFrameBuf)
	for i, p := range f.pieces {
		putBlock(p)
		f.pieces[i] = nil
	}
	f.pieces = f.pieces[:0]
}

// dropWhole lets go of the assembled frame, pooling its buffer unless it
// was handed over, and returns its budget.
func (f *FrameReader) dropWhole() {
	if f.whole == nil {
		return
	}
	f.release(len(f.whole))
	putWhole(f.whole)
	f.whole = nil
}

func (f *FrameReader) release(n int) {
	if f.budget != nil && n > 0 {
		f.budget.release(int64(n))
	}
}

// fill reads more bytes of the current frame, of which n are buffered.
func (f *FrameReader) fill(n int) {
	if f.buf == nil {
		f.buf = getBlock()
	}
	if f.start > 0 {
		// Move the partial frame to the front.
		copy(f.buf, f.buf[f.start:f.end])
		f.start, f.end = 0, f.end-f.start
	}
	if f.end == len(f.buf) {
		// The frame fills its block: keep the block as a piece and read
		// on into another.
		if err := f.reserve(initialFrameBuf); err != nil {
			f.err = err
			return
		}
		f.pieces = append(f.pieces, f.buf)
		f.buf, f.end, f.scanned = getBlock(), 0, 0
	}
	// Never read past max+1 bytes from the frame's first byte, but for
	// the LF after a CR at max+1 (ReadFrame has refused anything else).
	bound := f.max + 1
	if n > f.max {
		bound++
	}
	limit := min(len(f.buf), bound-len(f.pieces)*initialFrameBuf)

	if f.dl != nil {
		switch {
		case n > 0 && !f.armedFor.Equal(f.frameAt):
			f.armedFor = f.frameAt
			_ = f.dl.SetReadDeadline(f.frameAt.Add(f.timeout))
		case n == 0 && !f.armedFor.IsZero():
			f.armedFor = time.Time{}
			_ = f.dl.SetReadDeadline(time.Time{})
		}
	}
	r := f.r
	if f.inPlace != nil {
		if n > 0 && f.dl != nil && time.Now().After(f.frameAt.Add(f.timeout)) {
			f.err = os.ErrDeadlineExceeded
			return
		}
		f.inPlace.partial = n > 0
		r = f.inPlace
	}
	m, err := r.Read(f.buf[f.end:limit])
	if m > 0 {
		f.end += m
		// Only a frame this read leaves unfinished is timed from it: when
		// the read ends with an LF, every byte read belongs to a frame
		// whose LF came, which no deadline bounds any more, and the
		// frames after it start in a later read. A read of one whole
		// request, health's at tens of thousands a second, then reads
		// no clock (a vDSO call, dearer under a hypervisor's clock).
		if f.buf[f.end-1] != '\n' {
			f.readAt = time.Now()
			if n == 0 {
				f.frameAt = f.readAt
			}
		}
	}
	if err != nil {
		f.err = err
	}
}

// fail makes err the reader's sticky error, as if a read had returned it.
func (f *FrameReader) fail(err error) {
	if f.err == nil {
		f.err = err
	}
}

// reserve takes need bytes from the budget, waiting at most until the
// current frame's deadline.
func (f *FrameReader) reserve(need int64) error {
	if f.budget == nil {
		return nil
	}
	var deadline time.Time
	if f.dl != nil && !f.frameAt.IsZero() {
		deadline = f.frameAt.Add(f.timeout)
	}
	return f.budget.reserve(need, deadline, f.done)
}
