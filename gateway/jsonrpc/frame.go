package jsonrpc

import (
	"bytes"
	"errors"
	"io"
	"os"
	"time"
)

// DefaultMaxFrameBytes is the docs/spec.md §3 frame size limit: 8 MiB per line.
const DefaultMaxFrameBytes = 8 << 20

// initialFrameBuf is the reader's buffer size between large frames.
const initialFrameBuf = 64 << 10

// readDeadliner is the part of net.Conn the frame timeout needs.
type readDeadliner interface {
	SetReadDeadline(time.Time) error
}

// FrameReader splits a byte stream into NDJSON frames.
//
// A frame is the bytes before an LF, with surrounding whitespace (and so a
// trailing CR) trimmed; blank lines are skipped. A line of more than max
// bytes before its LF is refused with ErrFrameTooLarge, and the reader
// never reads more than max+1 bytes past the first byte of the current
// frame: the rest of an oversized line stays unread in the socket.
//
// When the underlying reader can SetReadDeadline and the timeout is
// positive, a frame must be complete within that time of its first byte
// (any byte, whitespace included, after the previous LF), or ReadFrame
// returns ErrFrameTimeout. Time between frames is not bounded.
//
// A final frame without LF at end of stream is returned like any other,
// then io.EOF. A FrameReader is not safe for concurrent use.
//
// With a FrameBudget (see UseBudget), growing the buffer beyond its
// initial 64 KiB first reserves the growth from the budget.
type FrameReader struct {
	r       io.Reader
	dl      readDeadliner
	max     int
	timeout time.Duration

	budget   *FrameBudget
	done     <-chan struct{} // ends a wait for budget
	reserved int64           // budget held for buf beyond initialFrameBuf

	buf        []byte
	start, end int       // unread bytes are buf[start:end]
	readAt     time.Time // when the latest Read returned data
	frameAt    time.Time // when the current frame's first byte arrived; zero if none
	armedFor   time.Time // the frameAt the read deadline is set for; zero if none
	err        error     // sticky read error, returned once the buffer is drained
}

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

// UseBudget makes the reader reserve from b before growing its buffer
// beyond 64 KiB. A wait for budget ends at the frame deadline
// (ErrFrameTimeout) or when done is closed (ErrClosed). Call it before the
// first ReadFrame, and Release when done with the reader.
func (f *FrameReader) UseBudget(b *FrameBudget, done <-chan struct{}) {
	f.budget, f.done = b, done
}

// Release returns the reader's budget and drops its buffer, partial frame
// included (nothing is copied). The reader must not be used afterwards.
func (f *FrameReader) Release() {
	if f.budget != nil {
		f.budget.release(f.reserved)
	}
	f.reserved = 0
	f.buf, f.start, f.end = nil, 0, 0
}

// Own returns frame, which ReadFrame has just returned, as a slice the
// caller may keep: a small frame is copied; a large one is handed over
// with the buffer it lies in (no copy), the reader moving what follows it
// to a new buffer and returning the budget it no longer needs. Call it
// before the next ReadFrame.
func (f *FrameReader) Own(frame []byte) []byte {
	if len(frame) <= initialFrameBuf || len(f.buf) <= initialFrameBuf {
		return append([]byte(nil), frame...)
	}
	// What follows the frame is shorter than the buffer less the frame,
	// so it fits the budget already held for the old buffer.
	rest := f.buf[f.start:f.end]
	buf := make([]byte, max(initialFrameBuf, len(rest)))
	f.buf, f.start, f.end = buf, 0, copy(buf, rest)
	f.resize()
	return frame
}

// resize gives back the budget beyond what the current buffer needs.
func (f *FrameReader) resize() {
	if f.budget == nil {
		return
	}
	need := int64(max(len(f.buf)-initialFrameBuf, 0))
	if f.reserved > need {
		f.budget.release(f.reserved - need)
		f.reserved = need
	}
}

// MaxBytes returns the frame size limit.
func (f *FrameReader) MaxBytes() int { return f.max }

// Buffered reports whether part of a frame has been read.
func (f *FrameReader) Buffered() bool { return f.start < f.end }

// ReadFrame returns the next frame. The slice is valid until the next call.
// Errors: ErrFrameTooLarge, ErrFrameTimeout, io.EOF at a clean end of
// stream, or the underlying read error.
func (f *FrameReader) ReadFrame() ([]byte, error) {
	for {
		if i := bytes.IndexByte(f.buf[f.start:f.end], '\n'); i >= 0 {
			line := f.buf[f.start : f.start+i]
			f.start += i + 1
			if f.start == f.end {
				f.start, f.end = 0, 0
				f.frameAt = time.Time{}
			} else {
				f.frameAt = f.readAt // the next frame began in that read, or before
			}
			if len(line) > f.max {
				return nil, ErrFrameTooLarge
			}
			if line = trimSpace(line); len(line) > 0 {
				return line, nil
			}
			continue
		}
		n := f.end - f.start
		if n > f.max {
			return nil, ErrFrameTooLarge
		}
		if f.err != nil {
			err := f.err
			if line := trimSpace(f.buf[f.start:f.end]); len(line) > 0 && err == io.EOF {
				f.start, f.end = 0, 0
				return line, nil
			}
			if n > 0 && errors.Is(err, os.ErrDeadlineExceeded) {
				return nil, ErrFrameTimeout
			}
			return nil, err
		}
		f.fill(n)
	}
}

// fill reads more bytes of the current frame, of which n are buffered.
func (f *FrameReader) fill(n int) {
	if f.start > 0 || (len(f.buf) > initialFrameBuf && n < initialFrameBuf) {
		// Move the partial frame to the front; after a large frame, give
		// the large buffer back.
		buf := f.buf
		if len(buf) > initialFrameBuf && n < initialFrameBuf {
			buf = make([]byte, initialFrameBuf)
		}
		copy(buf, f.buf[f.start:f.end])
		f.buf, f.start, f.end = buf, 0, n
		f.resize()
	}
	if f.end == len(f.buf) {
		size := 2 * len(f.buf)
		if size < min(initialFrameBuf, f.max+1) {
			size = min(initialFrameBuf, f.max+1)
		}
		size = min(size, f.max+1)
		// The old buffer stays reserved until the copy is done: the budget
		// bounds what is really live, the moment of the copy included.
		grown, err := f.reserve(size)
		if err != nil {
			f.err = err
			return
		}
		buf := make([]byte, size)
		copy(buf, f.buf[:f.end])
		f.buf = buf
		if f.budget != nil {
			f.budget.release(f.reserved)
			f.reserved = grown
		}
	}
	// Never read past max+1 bytes from the frame's first byte.
	limit := min(len(f.buf), f.max+1)

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
	m, err := f.r.Read(f.buf[f.end:limit])
	if m > 0 {
		f.readAt = time.Now()
		if f.end == 0 {
			f.frameAt = f.readAt
		}
		f.end += m
	}
	if err != nil {
		f.err = err
	}
}

// reserve takes from the budget what a new buffer of size bytes needs
// beyond the initial 64 KiB, on top of what the current one holds, waiting
// at most until the current frame's deadline. It returns the amount.
func (f *FrameReader) reserve(size int) (int64, error) {
	need := int64(size - initialFrameBuf)
	if f.budget == nil || need <= 0 {
		return 0, nil
	}
	var deadline time.Time
	if f.dl != nil && !f.frameAt.IsZero() {
		deadline = f.frameAt.Add(f.timeout)
	}
	if err := f.budget.reserve(need, deadline, f.done); err != nil {
		return 0, err
	}
	return need, nil
}
