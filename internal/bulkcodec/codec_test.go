package bulkcodec

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/clawmesh/clawmesh/internal/testwait"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
	uploadv1 "github.com/clawmesh/clawmesh/proto/clawmesh/upload/v1"
)

func dataField() *Codec {
	return New(1,
		(&sessionv1.StoreFileRequest{}).ProtoReflect().Descriptor().Fields().ByName("data"),
		(&uploadv1.ChunkRequest{}).ProtoReflect().Descriptor().Fields().ByName("data"))
}

// slices cuts b into buffers of size bytes, as the transport hands a
// message over in its frames' pieces.
func slices(b []byte, size int) mem.BufferSlice {
	var s mem.BufferSlice
	for len(b) > 0 {
		n := min(size, len(b))
		s = append(s, mem.SliceBuffer(bytes.Clone(b[:n])))
		b = b[n:]
	}
	return s
}

func payload(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>9)
	}
	return b
}

// check decodes wire with the codec and with grpc's, in pieces of each
// size, and wants the same message or both refusing it.
func check(t *testing.T, c *Codec, wire []byte, newMsg func() proto.Message) {
	t.Helper()
	grpcCodec := encoding.GetCodecV2("proto")
	want := newMsg()
	wantErr := grpcCodec.Unmarshal(slices(wire, len(wire)+1), want)
	for _, size := range []int{1, 7, 16 << 10, len(wire) + 1} {
		got := newMsg()
		err := c.Unmarshal(slices(wire, size), got)
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("pieces of %d: error %v, grpc's codec %v", size, err, wantErr)
		}
		if err == nil && !proto.Equal(got, want) {
			t.Fatalf("pieces of %d: decoded differently from grpc's codec", size)
		}
		if err == nil {
			c.Release(got.ProtoReflect().Get(got.ProtoReflect().Descriptor().Fields().ByName("data")).Bytes())
		}
	}
}

// TestUnmarshalAsGRPC: messages with and without the field, with every
// other field set, the field sent twice (the last wins, empty or not),
// unknown fields of every wire type, and broken messages: the codec
// decodes each as grpc's codec does, whatever the pieces it comes in.
func TestUnmarshalAsGRPC(t *testing.T) {
	c := dataField()
	store := func() proto.Message { return &sessionv1.StoreFileRequest{} }
	full := &sessionv1.StoreFileRequest{
		Principal: &commonv1.Principal{}, SessionId: "sess_0123", Generation: 7, Filename: "a.bin", MimeType: "application/octet-stream",
		Data: payload(300 << 10), AgentAlias: "default", Owner: "me", Incarnation: 3, MaxBytes: 1 << 30,
	}
	for name, m := range map[string]proto.Message{
		"all fields":    full,
		"data only":     &sessionv1.StoreFileRequest{Data: payload(70 << 10)},
		"no data":       &sessionv1.StoreFileRequest{SessionId: "sess_1", Path: "/tmp/x", MaxBytes: 9},
		"one byte":      &sessionv1.StoreFileRequest{Data: []byte{1}},
		"empty message": &sessionv1.StoreFileRequest{},
	} {
		t.Run(name, func(t *testing.T) {
			wire, err := proto.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			check(t, c, wire, store)
		})
	}
	base, _ := proto.Marshal(&sessionv1.StoreFileRequest{SessionId: "sess_2", Generation: 1})
	data := func(b []byte, n int) []byte {
		return protowire.AppendBytes(protowire.AppendTag(b, 6, protowire.BytesType), payload(n))
	}
	cases := map[string][]byte{
		"twice, the longer first":   data(data(bytes.Clone(base), 5000), 300),
		"twice, the shorter first":  data(data(bytes.Clone(base), 300), 5000),
		"non-empty then empty":      data(data(bytes.Clone(base), 5000), 0),
		"empty then non-empty":      data(data(bytes.Clone(base), 0), 5000),
		"data as a varint":          protowire.AppendVarint(protowire.AppendTag(data(bytes.Clone(base), 10), 6, protowire.VarintType), 5),
		"unknown varint":            protowire.AppendVarint(protowire.AppendTag(data(bytes.Clone(base), 10), 99, protowire.VarintType), 1<<40),
		"unknown fixed32":           protowire.AppendFixed32(protowire.AppendTag(data(bytes.Clone(base), 10), 98, protowire.Fixed32Type), 7),
		"unknown fixed64":           protowire.AppendFixed64(protowire.AppendTag(data(bytes.Clone(base), 10), 97, protowire.Fixed64Type), 7),
		"unknown bytes":             protowire.AppendBytes(protowire.AppendTag(data(bytes.Clone(base), 10), 96, protowire.BytesType), []byte("x")),
		"a group":                   protowire.AppendTag(protowire.AppendTag(data(bytes.Clone(base), 10), 95, protowire.StartGroupType), 95, protowire.EndGroupType),
		"truncated data":            data(bytes.Clone(base), 5000)[:len(base)+100],
		"truncated length":          append(bytes.Clone(base), 6<<3|2, 0x80),
		"truncated tag":             append(data(bytes.Clone(base), 10), 0x80),
		"field number zero":         append(data(bytes.Clone(base), 10), 0<<3|0, 1),
		"length past the end":       append(protowire.AppendTag(bytes.Clone(base), 6, protowire.BytesType), 0xff, 0xff, 0x03, 1, 2),
		"a string field not UTF-8":  protowire.AppendBytes(protowire.AppendTag(data(bytes.Clone(base), 10), 2, protowire.BytesType), []byte{0xff}),
		"overlong varint":           append(data(bytes.Clone(base), 10), 3<<3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01),
		"varint with padding bytes": append(data(bytes.Clone(base), 10), 3<<3, 0x85, 0x80, 0x00),
	}
	for name, wire := range cases {
		t.Run(name, func(t *testing.T) { check(t, c, wire, store) })
	}
	t.Run("chunk", func(t *testing.T) {
		wire, _ := proto.Marshal(&uploadv1.ChunkRequest{ConnectionId: "c", UploadId: "u", Offset: 1 << 20, Data: payload(1 << 20), GatewayId: "g"})
		check(t, c, wire, func() proto.Message { return &uploadv1.ChunkRequest{} })
	})
}

// FuzzUnmarshal: whatever the bytes, the codec decodes them as grpc's
// codec does, or refuses them as it does.
func FuzzUnmarshal(f *testing.F) {
	full, _ := proto.Marshal(&sessionv1.StoreFileRequest{SessionId: "s", Data: payload(40), Filename: "f", MaxBytes: 3})
	f.Add(full)
	f.Add([]byte{6<<3 | 2, 2, 1, 2, 6<<3 | 2, 0})
	f.Add([]byte{})
	c := dataField()
	f.Fuzz(func(t *testing.T, wire []byte) {
		check(t, c, wire, func() proto.Message { return &sessionv1.StoreFileRequest{} })
	})
}

// TestReleasedBufferIsReused: the bytes a handler gives back are where
// the next call's bytes are read; bytes the codec did not lend are not
// taken; a message under the minimum goes to grpc's codec.
func TestReleasedBufferIsReused(t *testing.T) {
	c := dataField()
	c.min = 1 << 10
	decode := func(n int) *sessionv1.StoreFileRequest {
		wire, _ := proto.Marshal(&sessionv1.StoreFileRequest{SessionId: "s", Data: payload(n)})
		var m sessionv1.StoreFileRequest
		if err := c.Unmarshal(slices(wire, 16<<10), &m); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(m.Data, payload(n)) {
			t.Fatalf("%d bytes decoded wrong", n)
		}
		return &m
	}
	first := decode(100 << 10)
	at := unsafe.SliceData(first.Data)
	c.Release(first.Data)
	if c.Kept() != 1 {
		t.Fatalf("%d buffers kept after a release, want 1", c.Kept())
	}
	second := decode(90 << 10)
	if unsafe.SliceData(second.Data) != at {
		t.Fatal("the released buffer was not reused")
	}
	if c.Kept() != 0 {
		t.Fatalf("%d buffers kept while the only one is lent", c.Kept())
	}

	// A slice the codec did not lend, of the right size, is not taken.
	foreign := make([]byte, 100<<10)
	c.Release(foreign)
	c.Release(nil)
	if c.Kept() != 0 {
		t.Fatalf("%d buffers kept after releasing bytes the codec did not lend", c.Kept())
	}
	third := decode(100 << 10)
	if unsafe.SliceData(third.Data) == unsafe.SliceData(foreign) {
		t.Fatal("bytes the codec did not lend were handed out")
	}
	// Released twice: kept once.
	c.Release(third.Data)
	c.Release(third.Data)
	if c.Kept() != 1 {
		t.Fatalf("%d buffers kept after a double release, want 1", c.Kept())
	}

	small := decode(100)
	c.Release(small.Data)
	if c.Kept() != 1 {
		t.Fatal("a message under the minimum took a kept buffer")
	}
	c.Release(second.Data)
}

// TestLentAndKeptBounded: at most maxLent buffers are out at once (the
// calls after them are still decoded, by grpc's codec), at most maxIdle
// are kept, and the kept ones are let go keepFor after their release.
func TestLentAndKeptBounded(t *testing.T) {
	old := keepFor
	keepFor = 50 * time.Millisecond
	defer func() { keepFor = old }()
	c := dataField()
	wire, _ := proto.Marshal(&sessionv1.StoreFileRequest{Data: payload(4096)})
	var out []*sessionv1.StoreFileRequest
	for range maxLent + 3 {
		var m sessionv1.StoreFileRequest
		if err := c.Unmarshal(slices(wire, 1000), &m); err != nil || !bytes.Equal(m.Data, payload(4096)) {
			t.Fatalf("decode: %v", err)
		}
		out = append(out, &m)
	}
	c.mu.Lock()
	lent := len(c.lent)
	c.mu.Unlock()
	if lent != maxLent {
		t.Fatalf("%d buffers lent, want %d", lent, maxLent)
	}
	for _, m := range out {
		c.Release(m.Data)
	}
	if c.Kept() != maxIdle {
		t.Fatalf("%d buffers kept, want %d", c.Kept(), maxIdle)
	}
	waitKept(t, c, 0) // after keepFor
}

// waitKept waits until c keeps want buffers; what it waits for happens
// on another goroutine (a timer, grpc's writer).
func waitKept(t *testing.T, c *Codec, want int) {
	t.Helper()
	deadline := time.Now().Add(testwait.Bound)
	for c.Kept() != want {
		if time.Now().After(deadline) {
			t.Fatalf("%d buffers kept after %v, want %d", c.Kept(), testwait.Bound, want)
		}
		time.Sleep(time.Millisecond)
	}
}

// recorder is a StoreFile handler that gives the bytes back as the
// session service does, and says where they were.
type recorder struct {
	sessionv1.UnimplementedSessionServiceServer
	c  *Codec
	at chan *byte
}

func (r *recorder) StoreFile(_ context.Context, req *sessionv1.StoreFileRequest) (*sessionv1.StoreFileResponse, error) {
	defer r.c.Release(req.GetData())
	r.at <- unsafe.SliceData(req.GetData())
	if !bytes.Equal(req.GetData(), payload(len(req.GetData()))) {
		return nil, context.Canceled
	}
	return &sessionv1.StoreFileResponse{}, nil
}

// serveFiles serves a recorder, with a codec of DefaultMin forced on the
// server, over a Unix socket for the test's length, and returns a client
// of it whose codec is sender.
func serveFiles(t *testing.T, sender *Codec) (sessionv1.SessionServiceClient, *recorder) {
	t.Helper()
	c := dataField()
	c.min = DefaultMin
	sock := filepath.Join(t.TempDir(), "s.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ForceServerCodecV2(c), grpc.MaxRecvMsgSize(16<<20))
	rec := &recorder{c: c, at: make(chan *byte, 8)}
	sessionv1.RegisterSessionServiceServer(srv, rec)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(16<<20), grpc.ForceCodecV2(sender)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return sessionv1.NewSessionServiceClient(cc), rec
}

// TestThroughGRPC: with the codec forced on a real server, a 3 MB file's
// bytes arrive intact and the second call's land in the first's buffer.
func TestThroughGRPC(t *testing.T) {
	sender := dataField()
	client, rec := serveFiles(t, sender)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 2 {
		if _, err := client.StoreFile(ctx, &sessionv1.StoreFileRequest{SessionId: "s", Data: payload(3<<20 - i)}); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if first, second := <-rec.at, <-rec.at; first != second {
		t.Fatal("the second file was not read into the first one's buffer")
	}
	waitKept(t, sender, 1) // grpc gave the sender's buffer back once written
}

// TestMarshalAsGRPC: a named message is marshalled to grpc's bytes, into
// a buffer that comes back to the codec when freed and is used for the
// next one; other messages, and small ones, are grpc's.
func TestMarshalAsGRPC(t *testing.T) {
	c := dataField()
	c.min = DefaultMin
	grpcCodec := encoding.GetCodecV2("proto")
	first := &sessionv1.StoreFileRequest{Principal: &commonv1.Principal{PrincipalId: "p"}, SessionId: "s", Filename: "f", Data: payload(300 << 10), MaxBytes: 9}
	marshal := func(m proto.Message) (mem.BufferSlice, []byte) {
		t.Helper()
		got, err := c.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		want, err := grpcCodec.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Materialize(), want.Materialize()) {
			t.Fatalf("%T marshalled unlike grpc's codec", m)
		}
		return got, got[0].ReadOnlyData()
	}
	out, data := marshal(first)
	if c.Kept() != 0 {
		t.Fatal("a buffer in grpc's hands was kept")
	}
	out.Free()
	if c.Kept() != 1 {
		t.Fatalf("%d buffers kept once grpc freed its buffer, want 1", c.Kept())
	}
	again, data2 := marshal(&sessionv1.StoreFileRequest{SessionId: "t", Data: payload(290 << 10)})
	if unsafe.SliceData(data2) != unsafe.SliceData(data) {
		t.Fatal("the kept buffer was not used for the next message")
	}
	again.Free()
	// Both large enough for grpc's pool, so one taken into a kept buffer
	// would be the kept one (the response is its size) or come back to
	// the codec when freed.
	for _, m := range []proto.Message{
		&sessionv1.StoreFileRequest{SessionId: "small", Data: payload(100 << 10)},
		&sessionv1.StoreFileResponse{File: &sessionv1.FileEntry{RefId: string(bytes.Repeat([]byte("r"), 300<<10))}},
	} {
		out, got := marshal(m)
		out.Free()
		if unsafe.SliceData(got) == unsafe.SliceData(data) || c.Kept() != 1 {
			t.Fatalf("%T under the minimum or not named went into a kept buffer", m)
		}
	}
}

// sentFrom reports whether one of out's buffers is b itself, not a copy.
func sentFrom(out mem.BufferSlice, b []byte) bool {
	for _, buf := range out {
		if d := buf.ReadOnlyData(); len(d) == len(b) && unsafe.SliceData(d) == unsafe.SliceData(b) {
			return true
		}
	}
	return false
}

// TestLentBytesSentWhereTheyAre: a message whose field holds lent bytes
// is marshalled to the same message as grpc's codec makes (the field
// after the others), with the bytes themselves as one of its buffers;
// the loan says the owner may reuse them only once grpc has freed them.
// Bytes not lent, part of lent bytes, bytes lent twice and bytes under
// the minimum are copied as before.
func TestLentBytesSentWhereTheyAre(t *testing.T) {
	c := dataField()
	c.min = DefaultMin
	m := &sessionv1.StoreFileRequest{Principal: &commonv1.Principal{PrincipalId: "p"}, SessionId: "s", Filename: "f",
		Data: payload(300 << 10), MaxBytes: 9}
	m.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 7))
	marshal := func(m proto.Message) mem.BufferSlice {
		t.Helper()
		out, err := c.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		got := &sessionv1.StoreFileRequest{}
		if err := proto.Unmarshal(out.Materialize(), got); err != nil || !proto.Equal(got, m) {
			t.Fatalf("marshalled to another message (%v)", err)
		}
		return out
	}

	loan := c.Lend(m.Data)
	if loan == nil || c.Lend(m.Data) != nil {
		t.Fatal("lent bytes were not lent once, and only once")
	}
	out := marshal(m)
	if !sentFrom(out, m.Data) {
		t.Fatal("lent bytes were copied")
	}
	part := proto.Clone(m).(*sessionv1.StoreFileRequest)
	part.Data = m.Data[:len(m.Data)-1]
	if o := marshal(part); sentFrom(o, part.Data) {
		t.Fatal("part of the lent bytes was sent uncopied")
	} else {
		o.Free()
	}
	out.Free()
	if !loan.Return() {
		t.Fatal("the loan said grpc still held bytes it had freed")
	}

	loan = c.Lend(m.Data)
	out = marshal(m)
	if loan.Return() {
		t.Fatal("the loan said the bytes were free while grpc held them")
	}
	out.Free() // grpc done at last: nothing more to say to the owner
	if again := marshal(m); sentFrom(again, m.Data) {
		t.Fatal("bytes were sent uncopied after the loan ended")
	} else {
		again.Free()
	}

	if c.Lend(payload(100<<10)) != nil {
		t.Fatal("bytes under the minimum were lent")
	}
	var none *Loan
	if !none.Return() {
		t.Fatal("no loan said its bytes were held")
	}
}

// TestLentThroughGRPC: a file sent over a real connection from lent
// bytes arrives intact, and once the call has returned the loan says the
// bytes are the owner's again, who may write into them at once (the race
// detector checks that grpc no longer reads them); a call refused by
// the handler too. A call cancelled while its bytes are written gives
// them back when grpc drops it, if not at its return.
func TestLentThroughGRPC(t *testing.T) {
	sender := dataField()
	client, rec := serveFiles(t, sender)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	data := payload(3 << 20)
	for i, want := range []bool{true, false} { // the recorder refuses bytes not its payload
		loan := sender.Lend(data)
		_, err := client.StoreFile(ctx, &sessionv1.StoreFileRequest{SessionId: "s", Data: data})
		<-rec.at
		if (err == nil) != want {
			t.Fatalf("call %d: %v", i, err)
		}
		if !loan.Return() {
			t.Fatalf("call %d: grpc still held the bytes once the call returned", i)
		}
		data[len(data)/2] ^= 1 // the owner writes into its bytes again: the next call's are not the payload
	}
	if sender.Kept() != 0 {
		t.Fatal("lent bytes were marshalled into a kept buffer")
	}

	big := payload(12 << 20)
	for range 5 {
		loan := sender.Lend(big)
		cctx, ccancel := context.WithTimeout(ctx, time.Millisecond)
		_, _ = client.StoreFile(cctx, &sessionv1.StoreFileRequest{SessionId: "s", Data: big})
		ccancel()
		select {
		case <-rec.at:
		default:
		}
		if !loan.Return() {
			deadline := time.Now().Add(testwait.Bound)
			for loan.refs.Load() != 0 {
				if time.Now().After(deadline) {
					t.Fatalf("grpc still held a cancelled call's bytes after %v", testwait.Bound)
				}
				time.Sleep(time.Millisecond)
			}
		}
	}
}
