package gateway

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/clawmesh/clawmesh/internal/bulkcodec"
	"github.com/clawmesh/clawmesh/internal/filepass"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/uploads"
	uploadv1 "github.com/clawmesh/clawmesh/proto/clawmesh/upload/v1"
)

// scratchSink is an upload-staging server holding real scratches on a
// scratch socket: it keeps the hash of each chunk it receives and how it
// came.
type scratchSink struct {
	uploadv1.UnimplementedUploadServiceServer
	scratches *filepass.Scratches

	mu      sync.Mutex
	got     map[string][32]byte
	byBytes int
	byToken int
	tokens  map[string]bool
	// dropFirst drops the caller's scratches before reading it, as an
	// upload-staging restarted since the pass would not know them.
	dropFirst bool
	// pause, when set, is called inside the first scratch read with the
	// bytes read, before they are hashed.
	pause func([]byte)
	// allIn, when set, holds the first together calls until all of
	// them are in, so that they are provably in flight at once.
	allIn    chan struct{}
	together int
	// next is each upload's next offset; disorder counts the chunks
	// that did not come at it.
	next     map[string]int64
	disorder int
}

// arrive records a chunk's place in its upload and waits, while allIn is
// set, for together calls to be in.
func (s *scratchSink) arrive(id string, off, n int64) error {
	s.mu.Lock()
	if s.next[id] != off {
		s.disorder++
	}
	s.next[id] = off + n
	wait := s.allIn
	if wait != nil {
		if s.together--; s.together == 0 {
			close(s.allIn)
			s.allIn = nil
		}
	}
	s.mu.Unlock()
	if wait != nil {
		select {
		case <-wait:
		case <-time.After(30 * time.Second):
			return errors.New("the chunks in flight together never came")
		}
	}
	return nil
}

// counts are the chunks received by bytes and by scratch, and the
// scratches named.
func (s *scratchSink) counts() (byBytes, byToken, tokens int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byBytes, s.byToken, len(s.tokens)
}

func (s *scratchSink) Chunk(_ context.Context, req *uploadv1.ChunkRequest) (*uploadv1.ChunkResponse, error) {
	key := fmt.Sprint(req.GetUploadId(), "@", req.GetOffset())
	n := int64(len(req.GetData()))
	if req.GetScratchToken() != "" {
		n = req.GetScratchLength()
	}
	if err := s.arrive(req.GetUploadId(), req.GetOffset(), n); err != nil {
		return nil, err
	}
	if req.GetScratchToken() == "" {
		sum := sha256.Sum256(req.GetData())
		s.mu.Lock()
		s.got[key], s.byBytes = sum, s.byBytes+1
		s.mu.Unlock()
		return &uploadv1.ChunkResponse{ReceivedBytes: req.GetOffset() + int64(len(req.GetData()))}, nil
	}
	bind := filepass.ScratchBinding{Gateway: req.GetGatewayId(), Conn: req.GetConnectionId()}
	s.mu.Lock()
	drop, pause := s.dropFirst, s.pause
	s.pause = nil
	if !drop {
		s.tokens[req.GetScratchToken()] = true
	}
	s.mu.Unlock()
	if drop {
		s.scratches.DropConnection(bind)
	}
	err := s.scratches.Read(req.GetScratchToken(), bind, req.GetScratchLength(), func(b []byte) error {
		if pause != nil {
			pause(b)
		}
		sum := sha256.Sum256(b)
		s.mu.Lock()
		s.got[key], s.byToken = sum, s.byToken+1
		s.mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, rpcerr.Error(codes.FailedPrecondition, rpcerr.ReasonInvalid, rpcerr.NoIndex, uploads.ScratchUnknown)
	}
	return &uploadv1.ChunkResponse{ReceivedBytes: req.GetOffset() + req.GetScratchLength()}, nil
}

// scratchGateway is a gateway whose upload-staging is sink, served on a
// socket with the scratch socket beside it (or at path, when set).
func scratchGateway(t *testing.T, sink *scratchSink, path string) *Gateway {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "upload-staging.scratch.sock")
		sc, err := filepass.ListenScratches(path, filepass.ScratchOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sc.Close() })
		sink.scratches = sc
	}
	sink.got, sink.tokens, sink.next = map[string][32]byte{}, map[string]bool{}, map[string]int64{}
	codec := bulkcodec.New(0, (&uploadv1.ChunkRequest{}).ProtoReflect().Descriptor().Fields().ByName("data"))
	return &Gateway{upload: serveStaging(t, sink, grpc.WithDefaultCallOptions(grpc.ForceCodecV2(codec))), chunks: codec,
		scratchPath: path, id: "gw-1", log: zap.NewNop()}
}

// chunkParams are a chunk's params and the hash of its bytes.
func chunkParams(t *testing.T, id string, off int64, size int) (json.RawMessage, [32]byte) {
	t.Helper()
	data := make([]byte, size)
	_, _ = rand.Read(data)
	raw, err := json.Marshal(map[string]any{"upload_id": id, "offset": off, "data_b64": base64.StdEncoding.EncodeToString(data)})
	if err != nil {
		t.Fatal(err)
	}
	return raw, sha256.Sum256(data)
}

// sendChunks sends n chunks of an upload on cs, one after another, and
// checks each arrived as sent.
func sendChunks(t *testing.T, g *Gateway, sink *scratchSink, cs *connState, id string, sizes ...int) {
	t.Helper()
	var off int64
	for _, size := range sizes {
		p, sum := chunkParams(t, id, off, size)
		if _, err := methods["file/upload/chunk"].call(g, context.Background(), cs, p); err != nil {
			t.Fatal(err)
		}
		sink.mu.Lock()
		got := sink.got[fmt.Sprint(id, "@", off)]
		sink.mu.Unlock()
		if got != sum {
			t.Fatalf("chunk at %d arrived changed", off)
		}
		off += int64(size)
	}
}

func localConn(id string) *connState { return &connState{id: id, transport: transportLocal} }

// A connection's chunks are read from its scratch, one scratch for all
// of them, as sent; one past what a scratch carries and an empty one go
// in the message.
func TestChunksGoByTheConnectionsScratch(t *testing.T) {
	sink := &scratchSink{}
	g := scratchGateway(t, sink, "")
	cs := localConn("conn-a")
	sendChunks(t, g, sink, cs, fmt.Sprintf("%032x", 1), 1<<20, 1<<20, 1000, 1<<20-1)
	if bb, bt, nt := sink.counts(); bt != 4 || bb != 0 || nt != 1 {
		t.Fatalf("%d chunks by scratch (%d scratches), %d by bytes", bt, nt, bb)
	}
	sendChunks(t, g, sink, cs, fmt.Sprintf("%032x", 2), 1<<20+10)
	if bb, _, _ := sink.counts(); bb != 1 {
		t.Fatalf("a chunk past a scratch's: %d by bytes", bb)
	}
	// Its connection closed, the gateway unmaps it.
	cs.scratch.close() // connectionClosed's part that concerns it
	if cs.scratch.n != 0 || len(cs.scratch.free) != 0 {
		t.Fatal("a closed connection's scratch kept")
	}
	// Closed here, it is dropped by upload-staging (the connection it
	// was passed over closed).
	deadline := time.Now().Add(10 * time.Second)
	for sink.scratches.Held() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("upload-staging holds %d scratches of a closed connection", sink.scratches.Held())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A chunk call cancelled while upload-staging reads its scratch leaves
// that scratch as it was: the next chunk is decoded into a new one, the
// old one's late read sees the first chunk's bytes, and the next chunk
// arrives as sent.
func TestAChunkCancelledMidReadLeavesTheNextCorrect(t *testing.T) {
	sink := &scratchSink{}
	g := scratchGateway(t, sink, "")
	cs := localConn("conn-a")
	id := fmt.Sprintf("%032x", 1)
	first, firstSum := chunkParams(t, id, 0, 1<<20)
	reading, resume := make(chan struct{}), make(chan struct{})
	lateSum := make(chan [32]byte, 1)
	sink.pause = func(b []byte) {
		close(reading)
		<-resume
		lateSum <- sha256.Sum256(b)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := methods["file/upload/chunk"].call(g, ctx, cs, first)
		done <- err
	}()
	select {
	case <-reading:
	case <-time.After(30 * time.Second):
		t.Fatal("the first chunk's read never began")
	}
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the cancelled call answered")
	}
	// The first read still runs; the next chunk, on the same connection.
	second, secondSum := chunkParams(t, id, 0, 1<<20)
	if _, err := methods["file/upload/chunk"].call(g, context.Background(), cs, second); err != nil {
		t.Fatal(err)
	}
	sink.mu.Lock()
	got := sink.got[id+"@0"]
	sink.mu.Unlock()
	if got != secondSum {
		t.Fatal("the chunk after a cancelled one arrived changed")
	}
	close(resume)
	if late := <-lateSum; late != firstSum {
		t.Fatal("the cancelled chunk's scratch was written while upload-staging read it")
	}
	if _, _, nt := sink.counts(); nt != 2 {
		t.Fatalf("%d scratches named, want the retired one and its replacement", nt)
	}
	// The replacement dropped the retired one from upload-staging.
	if n := sink.scratches.Held(); n != 1 {
		t.Fatalf("upload-staging holds %d scratches of the connection", n)
	}
}

// Where the scratch cannot be used the chunks go in the message, intact:
// no scratch socket, one that refuses the pass (not a scratch receiver),
// and an upload-staging that does not know the scratch named (restarted
// since the pass), whose chunk is sent again with its bytes.
func TestChunksFallBackToBytes(t *testing.T) {
	t.Run("no socket", func(t *testing.T) {
		sink := &scratchSink{}
		g := scratchGateway(t, sink, filepath.Join(t.TempDir(), "missing.scratch.sock"))
		sendChunks(t, g, sink, localConn("conn-a"), fmt.Sprintf("%032x", 1), 1<<20, 1<<20)
		if bb, bt, _ := sink.counts(); bb != 2 || bt != 0 {
			t.Fatalf("%d by bytes, %d by scratch", bb, bt)
		}
	})
	t.Run("pass refused", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "upload-staging.scratch.sock")
		r, err := filepass.Listen(path, filepass.Options{}) // a file receiver: the scratch's header is no binding of its
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		sink := &scratchSink{}
		g := scratchGateway(t, sink, path)
		cs := localConn("conn-a")
		sendChunks(t, g, sink, cs, fmt.Sprintf("%032x", 1), 1<<20, 1<<20)
		if bb, bt, _ := sink.counts(); bb != 2 || bt != 0 || r.Held() != 0 {
			t.Fatalf("%d by bytes, %d by scratch, %d held", bb, bt, r.Held())
		}
		if cs.scratch.refusedUntil.IsZero() {
			t.Fatal("a refused pass is tried again at every chunk")
		}
	})
	t.Run("scratch unknown", func(t *testing.T) {
		sink := &scratchSink{dropFirst: true}
		g := scratchGateway(t, sink, "")
		cs := localConn("conn-a")
		sendChunks(t, g, sink, cs, fmt.Sprintf("%032x", 1), 1<<20, 1<<20, 77)
		if bb, bt, _ := sink.counts(); bb != 3 || bt != 0 {
			t.Fatalf("%d by bytes, %d by scratch", bb, bt)
		}
		sink.mu.Lock()
		sink.dropFirst = false
		sink.mu.Unlock()
		// The same connection: the scratch upload-staging did not know
		// was retired, so its next chunk passes a new one and goes by it,
		// rather than naming the unknown one again at every chunk and
		// sending each twice.
		sendChunks(t, g, sink, cs, fmt.Sprintf("%032x", 2), 1<<20)
		if bb, bt, _ := sink.counts(); bt != 1 || bb != 3 {
			t.Fatalf("after upload-staging knew scratches again: %d by scratch, %d by bytes", bt, bb)
		}
	})
}

// A connection with two chunks in flight at once (pipelined, each of its
// own upload) decodes each into a scratch of its own: the second is not
// sent in its message for the first's scratch being busy. Each upload's
// chunks land intact and in order, every one read from a scratch, two
// scratches for the connection.
func TestPipelinedChunksUseBothScratches(t *testing.T) {
	sink := &scratchSink{}
	g := scratchGateway(t, sink, "")
	sink.allIn, sink.together = make(chan struct{}), 2
	cs := localConn("conn-a")
	const chunks = 4
	type chunk struct {
		params json.RawMessage
		key    string
		sum    [32]byte
	}
	var uploads [2][]chunk
	for u := range uploads {
		id := fmt.Sprintf("%032x", u+1)
		for i := range chunks {
			off := int64(i) << 20
			p, sum := chunkParams(t, id, off, 1<<20)
			uploads[u] = append(uploads[u], chunk{p, fmt.Sprint(id, "@", off), sum})
		}
	}
	errs := make(chan error, len(uploads))
	var wg sync.WaitGroup
	for u := range uploads {
		wg.Go(func() {
			for _, c := range uploads[u] {
				if _, err := methods["file/upload/chunk"].call(g, context.Background(), cs, c.params); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	sink.mu.Lock()
	for _, up := range uploads {
		for _, c := range up {
			if sink.got[c.key] != c.sum {
				t.Errorf("chunk %s arrived changed", c.key)
			}
		}
	}
	disorder := sink.disorder
	sink.mu.Unlock()
	if disorder != 0 {
		t.Fatalf("%d chunks out of their upload's order", disorder)
	}
	if bb, bt, nt := sink.counts(); bt != 2*chunks || bb != 0 || nt != 2 {
		t.Fatalf("%d chunks by scratch (%d scratches), %d by bytes", bt, nt, bb)
	}
	if n := sink.scratches.Held(); n != 2 {
		t.Fatalf("upload-staging holds %d scratches of the connection", n)
	}
}
