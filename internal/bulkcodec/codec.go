// Package bulkcodec is gRPC's proto codec for a server that receives
// files: the one large bytes field of a request (a file's bytes, an
// upload chunk's) is read from the transport's buffers straight into a
// buffer the process keeps from one call to the next.
//
// grpc's own codec copies such a field twice into memory it has just
// allocated: it assembles the whole message in one buffer, then
// proto.Unmarshal copies the field out of it. Memory new to the process
// costs a page fault a page, about 10 µs on the benchmark machine
// (docs/performance.md, "Thirty-third round"): a 10 MB file's two copies
// took 27 ms on average and up to 70, where a copy into pages the process
// already has takes about 2.
//
// A client sending such a message uses the codec too. Bytes its owner
// lends (Lend: the gateway's decoded chunk, upload-staging's file) are
// sent from where they are: the message's other fields are marshalled on
// their own and the field's bytes follow them uncopied, held by grpc
// until it has written them. Any other such message is marshalled into a
// kept buffer, which grpc gives back once it has written it.
//
// The handler owns the field's bytes until it gives them back with
// Release (they are overwritten by a later call once given back, so
// nothing may keep them past that). Every handler given such bytes must
// give them back: a buffer never released stays counted, and held, as
// lent (at most maxLent; beyond that grpc's codec decodes the calls).
package bulkcodec

import (
	"encoding/binary"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the codec wrapped here
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// keepFor is how long a buffer is kept once given back (a variable for
// the tests).
var keepFor = 30 * time.Second

const (
	// DefaultMin is the smallest message that takes the kept buffers:
	// below it grpc's pooled buffers cost little.
	DefaultMin = 256 << 10
	// maxIdle buffers are kept between calls, each for keepFor after it
	// was given back: an upload's chunks or a commit's file reuse one,
	// and a process that stopped receiving files gives the memory back.
	maxIdle = 2
	// maxLent bounds the buffers out with handlers at once; a call beyond
	// it is decoded by grpc's codec.
	maxLent = 8
)

// Codec is the codec; Name is "proto", so it stands in for grpc's
// own with grpc.ForceServerCodecV2 or grpc.ForceCodecV2.
type Codec struct {
	proto  encoding.CodecV2
	min    int
	fields map[protoreflect.FullName]protoreflect.FieldDescriptor

	mu    sync.Mutex
	idle  []idleBuf
	lent  map[*byte]struct{} // first byte of each buffer out with a handler
	loans map[*byte]*Loan    // first byte of each buffer lent to Marshal
	timer *time.Timer        // prunes idle buffers; nil when none is armed
	keep  time.Duration
}

type idleBuf struct {
	buf []byte
	at  time.Time
}

// New returns a codec that reads field (a singular bytes field of its
// message) of each of fields into kept buffers when the message is at
// least min bytes long (min <= 0 means DefaultMin).
func New(min int, fields ...protoreflect.FieldDescriptor) *Codec {
	if min <= 0 {
		min = DefaultMin
	}
	c := &Codec{
		proto:  encoding.GetCodecV2("proto"),
		min:    min,
		fields: map[protoreflect.FullName]protoreflect.FieldDescriptor{},
		lent:   map[*byte]struct{}{},
		loans:  map[*byte]*Loan{},
		keep:   keepFor,
	}
	for _, fd := range fields {
		if fd.Kind() != protoreflect.BytesKind || fd.Cardinality() == protoreflect.Repeated {
			panic("bulkcodec: " + string(fd.FullName()) + " is not a singular bytes field")
		}
		c.fields[fd.ContainingMessage().FullName()] = fd
	}
	return c
}

// Name implements encoding.CodecV2.
func (c *Codec) Name() string { return c.proto.Name() }

// Marshal implements encoding.CodecV2. A message named to the codec whose
// field holds lent bytes (Lend) is sent from them. Any other message named
// to the codec, of min bytes or more, is marshalled into a kept buffer,
// which grpc gives back (Put) once it has written it: the sending side's
// copy, too, goes into pages the process has. Anything else is grpc's.
func (c *Codec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return c.proto.Marshal(v)
	}
	fd, ok := c.fields[m.ProtoReflect().Descriptor().FullName()]
	if !ok {
		return c.proto.Marshal(v)
	}
	if l := c.borrow(m.ProtoReflect().Get(fd).Bytes()); l != nil {
		return c.marshalLent(m, fd, l)
	}
	size := proto.Size(m)
	if size < c.min {
		return c.proto.Marshal(v)
	}
	buf := c.Get(size)
	// UseCachedSize: the size was computed just above.
	out, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend((*buf)[:0], m)
	if err != nil {
		c.Put(buf)
		return nil, err
	}
	*buf = out
	return mem.BufferSlice{mem.NewBuffer(buf, c)}, nil
}

// A Loan lends a buffer's bytes to Marshal, which sends a message whose
// field holds exactly those bytes from them instead of copying them. grpc
// holds them until it has written them, or dropped the call; the owner
// ends the loan with Return, which says whether it may write into them
// again.
type Loan struct {
	c    *Codec
	key  *byte
	n    int
	refs atomic.Int32 // the owner's, until Return, and one a Marshal until grpc frees it
}

// Lend lends b to Marshal until the Loan's Return. Bytes shorter than the
// codec's min are not lent: nil, whose Return reports true, since Marshal
// copies them. A nil Codec lends nothing. Bytes are lent by their one
// owner, once at a time: bytes out on a loan already are not lent again
// (nil), and only the first loan's Return says whether grpc holds them.
func (c *Codec) Lend(b []byte) *Loan {
	if c == nil || len(b) < c.min {
		return nil
	}
	l := &Loan{c: c, key: unsafe.SliceData(b), n: len(b)}
	l.refs.Store(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.loans[l.key]; ok {
		return nil
	}
	c.loans[l.key] = l
	return l
}

// Return ends the loan: Marshal copies the bytes again from now on. It
// reports whether grpc still holds none of them, in which case the owner
// may reuse them; when it reports false the owner must leave them to the
// collector, since grpc may still read them (a call that failed before
// its message was written). Return is called once.
func (l *Loan) Return() bool {
	if l == nil {
		return true
	}
	l.c.mu.Lock()
	if l.c.loans[l.key] == l {
		delete(l.c.loans, l.key)
	}
	l.c.mu.Unlock()
	return l.refs.Add(-1) == 0
}

// borrow takes a reference for a Marshal on the loan of b, when b is
// exactly the bytes lent; nil otherwise.
func (c *Codec) borrow(b []byte) *Loan {
	if len(b) < c.min {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.loans[unsafe.SliceData(b)]
	if l == nil || l.n != len(b) {
		return nil
	}
	l.refs.Add(1)
	return l
}

// marshalLent marshals m's other fields, then the field's tag and length,
// and hands grpc the lent bytes after them as a buffer of their own,
// whose release (Put) gives back the Marshal's reference. Fields may come
// in any order on the wire: a parser keeps the last occurrence of a
// singular field wherever it is.
func (c *Codec) marshalLent(m proto.Message, fd protoreflect.FieldDescriptor, l *Loan) (mem.BufferSlice, error) {
	rm := m.ProtoReflect()
	bulk := rm.Get(fd).Bytes()
	rest := rm.New()
	rm.Range(func(f protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if f != fd {
			rest.Set(f, v) // shared, not copied: only read from here
		}
		return true
	})
	rest.SetUnknown(rm.GetUnknown())
	head, err := proto.MarshalOptions{}.MarshalAppend(nil, rest.Interface())
	if err != nil {
		l.refs.Add(-1)
		return nil, err
	}
	head = protowire.AppendTag(head, fd.Number(), protowire.BytesType)
	head = protowire.AppendVarint(head, uint64(len(bulk)))
	return mem.BufferSlice{mem.SliceBuffer(head), mem.NewBuffer(&bulk, loanRef{l})}, nil
}

// loanRef is the pool of a lent buffer handed to grpc: its Put is grpc's
// release of the buffer, which gives back one reference of the loan.
type loanRef struct{ l *Loan }

// Get implements mem.BufferPool; grpc never asks a buffer's own pool for
// another.
func (loanRef) Get(n int) *[]byte {
	b := make([]byte, n)
	return &b
}

// Put implements mem.BufferPool: grpc is done with the lent bytes.
func (r loanRef) Put(*[]byte) { r.l.refs.Add(-1) }

// Get implements mem.BufferPool for Marshal's buffers: a kept one that
// fits, or a new one.
func (c *Codec) Get(n int) *[]byte {
	c.mu.Lock()
	buf := c.takeIdle(n)
	c.mu.Unlock()
	if buf == nil {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	return &buf
}

// Put implements mem.BufferPool: grpc is done with a buffer Marshal
// made; it is kept for the next call.
func (c *Codec) Put(b *[]byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.keepLocked(*b)
}

// Unmarshal implements encoding.CodecV2.
func (c *Codec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok || data.Len() < c.min {
		return c.proto.Unmarshal(data, v)
	}
	fd, ok := c.fields[m.ProtoReflect().Descriptor().FullName()]
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	r := data.Reader()
	defer r.Close()
	rest, bulk, err := c.split(r, fd.Number())
	if err != nil {
		// Anything but a well-formed message of the common wire types is
		// left to grpc's codec, which answers it as it always has: the
		// reader took references of its own, data is whole.
		c.giveBack(bulk)
		return c.proto.Unmarshal(data, v)
	}
	if err := proto.Unmarshal(rest, m); err != nil {
		c.giveBack(bulk)
		return err
	}
	if bulk != nil {
		m.ProtoReflect().Set(fd, protoreflect.ValueOfBytes(bulk))
	}
	return nil
}

var errFallBack = errors.New("bulkcodec: left to grpc's codec")

// split reads a message's fields from r: every occurrence of field num
// that is not empty into a kept buffer (the last one is the field's
// value, as proto.Unmarshal would have it), everything else re-encoded
// into rest. bulk is nil when the field is absent or its last occurrence
// empty (rest then holds that one). bulk is a lent buffer whenever it is
// not nil, even with an error.
func (c *Codec) split(r *mem.Reader, num protowire.Number) (rest, bulk []byte, err error) {
	var buf []byte // the kept buffer: bulk, when set, is buf[:n]
	set := false
	done := func(err error) ([]byte, []byte, error) {
		if !set {
			c.giveBack(buf)
			buf = nil
		}
		if buf == nil {
			return rest, nil, err
		}
		return rest, buf, err
	}
	// Varints are copied as they came, not re-encoded: a field the
	// message does not know keeps its bytes as they were sent.
	var head [2 * binary.MaxVarintLen64]byte
	for r.Remaining() > 0 {
		h, tag, err := appendVarint(head[:0], r)
		if err != nil {
			return done(errFallBack)
		}
		n, typ := protowire.DecodeTag(tag)
		if n < protowire.MinValidNumber {
			return done(errFallBack)
		}
		switch typ {
		case protowire.VarintType:
			if rest, _, err = appendVarint(append(rest, h...), r); err != nil {
				return done(errFallBack)
			}
		case protowire.Fixed32Type, protowire.Fixed64Type:
			size := 4
			if typ == protowire.Fixed64Type {
				size = 8
			}
			if rest, err = appendRead(append(rest, h...), r, size); err != nil {
				return done(errFallBack)
			}
		case protowire.BytesType:
			h, l, err := appendVarint(h, r)
			if err != nil || l > uint64(r.Remaining()) {
				return done(errFallBack)
			}
			if n != num || l == 0 {
				if n == num {
					set = false // an empty last occurrence: the field is empty
				}
				if rest, err = appendRead(append(rest, h...), r, int(l)); err != nil {
					return done(errFallBack)
				}
				continue
			}
			if cap(buf) < int(l) {
				c.giveBack(buf)
				if buf = c.lend(int(l)); buf == nil {
					return done(errFallBack)
				}
			}
			buf = buf[:l]
			if _, err := io.ReadFull(r, buf); err != nil {
				return done(errFallBack)
			}
			set = true
		default: // groups: not in any message here
			return done(errFallBack)
		}
	}
	return done(nil)
}

// appendVarint reads a varint from r and appends its bytes, as they
// came, to b. It refuses what protowire.ConsumeVarint refuses.
func appendVarint(b []byte, r io.ByteReader) ([]byte, uint64, error) {
	var x uint64
	for i := range binary.MaxVarintLen64 {
		c, err := r.ReadByte()
		if err != nil {
			return b, 0, errFallBack
		}
		b = append(b, c)
		if i == binary.MaxVarintLen64-1 && c > 1 {
			return b, 0, errFallBack
		}
		x |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			return b, x, nil
		}
	}
	return b, 0, errFallBack
}

// appendRead appends the next n bytes of r to b.
func appendRead(b []byte, r io.Reader, n int) ([]byte, error) {
	b = append(b, make([]byte, n)...)
	_, err := io.ReadFull(r, b[len(b)-n:])
	return b, err
}

// lend returns a buffer of at least n bytes, kept or new, recorded as
// out with a handler; nil when maxLent are out.
func (c *Codec) lend(n int) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.lent) >= maxLent {
		return nil
	}
	buf := c.takeIdle(n)
	if buf == nil {
		buf = make([]byte, n)
	}
	c.lent[unsafe.SliceData(buf)] = struct{}{}
	return buf
}

// takeIdle takes the smallest kept buffer of at least n bytes that
// wastes at most half of itself; nil if none. c.mu is held.
func (c *Codec) takeIdle(n int) []byte {
	best := -1
	for i, ib := range c.idle {
		if cap(ib.buf) >= n && cap(ib.buf) <= 2*n && (best < 0 || cap(ib.buf) < cap(c.idle[best].buf)) {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	buf := c.idle[best].buf
	last := len(c.idle) - 1
	copy(c.idle[best:], c.idle[best+1:])
	c.idle[last] = idleBuf{} // no view of a buffer in use kept past len
	c.idle = c.idle[:last]
	return buf
}

// Release gives back the bytes an Unmarshal set in a message's field,
// once the handler is done with them. Bytes that did not come from the
// codec (grpc's codec decoded the call, or the caller made them) are
// left alone.
func (c *Codec) Release(b []byte) {
	if c == nil || cap(b) == 0 {
		return
	}
	c.giveBack(b)
}

// giveBack takes a lent buffer back and keeps it for the next call.
func (c *Codec) giveBack(b []byte) {
	if cap(b) == 0 {
		return
	}
	key := unsafe.SliceData(b)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.lent[key]; !ok {
		return
	}
	delete(c.lent, key)
	c.keepLocked(b)
}

// keepLocked keeps b for the next call, in place of the oldest kept
// buffer when maxIdle are. c.mu is held.
func (c *Codec) keepLocked(b []byte) {
	if len(c.idle) == maxIdle {
		copy(c.idle, c.idle[1:])
		c.idle = c.idle[:maxIdle-1]
	}
	c.idle = append(c.idle, idleBuf{buf: b[:cap(b)], at: time.Now()})
	if c.timer == nil {
		c.timer = time.AfterFunc(c.keep, c.prune)
	}
}

// Kept is the number of buffers kept for the next calls.
func (c *Codec) Kept() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.idle)
}

// prune drops the buffers kept for keepFor, and waits on for the others.
func (c *Codec) prune() {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	kept := c.idle[:0]
	for _, ib := range c.idle {
		if now.Sub(ib.at) < c.keep {
			kept = append(kept, ib)
		}
	}
	clear(c.idle[len(kept):])
	c.idle = kept
	c.timer = nil
	if len(kept) > 0 {
		c.timer = time.AfterFunc(c.keep-now.Sub(kept[0].at), c.prune)
	}
}
