package uploadstaging

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/filepass"
	"github.com/clawmesh/clawmesh/internal/uploads"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
	uploadv1 "github.com/clawmesh/clawmesh/proto/clawmesh/upload/v1"
)

// newScratchServer is a server holding the scratches passed on a real
// scratch socket, and a scratch passed there for gw-1/conn-1.
func newScratchServer(t *testing.T) (*Server, *sessions, *filepass.Scratches, *filepass.Scratch, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "upload-staging.scratch.sock")
	f := &sessions{}
	s, err := New(Config{Sessions: f, Settings: defaults, ScratchSocket: path})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	sc := s.Scratches()
	mem, err := filepass.NewScratch()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	tok, err := filepass.PassScratch(context.Background(), path, mem, filepass.ScratchBinding{Gateway: "gw-1", Conn: "conn-1"}, "")
	if err != nil {
		t.Fatal(err)
	}
	return s, f, sc, mem, tok
}

func scratchChunk(s *Server, p *commonv1.Principal, conn, id string, off int64, tok string, n int64) (*uploadv1.ChunkResponse, error) {
	return s.Chunk(context.Background(), &uploadv1.ChunkRequest{Principal: p, GatewayId: "gw-1", ConnectionId: conn, UploadId: id,
		Offset: off, ScratchToken: tok, ScratchLength: n})
}

func wantStatus(t *testing.T, what string, err error, code codes.Code, msg string) {
	t.Helper()
	if st, _ := status.FromError(err); err == nil || st.Code() != code || !strings.Contains(st.Message(), msg) {
		t.Fatalf("%s: %v, want %v %q", what, err, code, msg)
	}
}

// A chunk read from its connection's scratch lands as one sent in the
// message, under the same checks (the offset, an identical resend, the
// declared size), and a commit stores those bytes.
func TestAChunkFromAScratchLandsAsOneInItsMessage(t *testing.T) {
	s, f, _, mem, tok := newScratchServer(t)
	id := begin(t, s, user, 10, "")
	copy(mem.Bytes(), "hello")
	if r, err := scratchChunk(s, user, "conn-1", id, 0, tok, 5); err != nil || r.GetReceivedBytes() != 5 {
		t.Fatalf("first chunk: %v, %v", r, err)
	}
	// The same bytes again at 0: acknowledged; other bytes: refused.
	if r, err := scratchChunk(s, user, "conn-1", id, 0, tok, 5); err != nil || r.GetReceivedBytes() != 5 {
		t.Fatalf("identical resend: %v, %v", r, err)
	}
	copy(mem.Bytes(), "HELLO")
	_, err := scratchChunk(s, user, "conn-1", id, 0, tok, 5)
	wantStatus(t, "a changed resend", err, codes.InvalidArgument, uploads.ChunkOverlap(0, 5))
	_, err = scratchChunk(s, user, "conn-1", id, 7, tok, 3)
	wantStatus(t, "a gap", err, codes.InvalidArgument, uploads.ChunkGap(7, 5))
	_, err = scratchChunk(s, user, "conn-1", id, 5, tok, 6)
	wantStatus(t, "past the size", err, codes.InvalidArgument, uploads.ChunkPastSize(11, 10))
	copy(mem.Bytes(), "world")
	if r, err := scratchChunk(s, user, "conn-1", id, 5, tok, 5); err != nil || r.GetReceivedBytes() != 10 {
		t.Fatalf("second chunk: %v, %v", r, err)
	}
	if _, err := commit(s, user, id); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	got := string(f.stores[len(f.stores)-1].GetData())
	f.mu.Unlock()
	if got != "helloworld" {
		t.Fatalf("stored %q", got)
	}
}

// A chunk naming another connection's scratch, a token never passed, a
// length past a scratch, or a scratch beside bytes, is refused, and
// nothing is read into the upload.
func TestAChunkNamingAScratchNotItsOwnIsRefused(t *testing.T) {
	s, _, sc, mem, tok := newScratchServer(t)
	copy(mem.Bytes(), "secret")
	// conn-2's own upload, which names conn-1's scratch.
	resp, err := s.Begin(context.Background(), &uploadv1.BeginRequest{Principal: user, GatewayId: "gw-1", ConnectionId: "conn-2", SessionId: "sess_1", SizeBytes: 6})
	if err != nil {
		t.Fatal(err)
	}
	other := resp.GetUploadId()
	_, err = scratchChunk(s, user, "conn-2", other, 0, tok, 6)
	wantStatus(t, "another connection's scratch", err, codes.FailedPrecondition, uploads.ScratchUnknown)
	_, err = scratchChunk(s, user, "conn-2", other, 0, strings.Repeat("a", filepass.TokenHexLen), 6)
	wantStatus(t, "a token never passed", err, codes.FailedPrecondition, uploads.ScratchUnknown)

	id := begin(t, s, user, 2<<20, "")
	_, err = scratchChunk(s, user, "conn-1", id, 0, tok, filepass.ScratchBytes+1)
	wantStatus(t, "a length past the scratch", err, codes.InvalidArgument, uploads.ChunkSize(filepass.ScratchBytes))
	_, err = scratchChunk(s, user, "conn-1", id, 0, tok, 0)
	wantStatus(t, "an empty length", err, codes.InvalidArgument, uploads.ChunkSize(filepass.ScratchBytes))
	_, err = s.Chunk(context.Background(), &uploadv1.ChunkRequest{Principal: user, GatewayId: "gw-1", ConnectionId: "conn-1", UploadId: id,
		ScratchToken: tok, ScratchLength: 1, Data: []byte("x")})
	wantStatus(t, "a scratch and bytes", err, codes.InvalidArgument, uploads.ScratchAndData)
	if st := s.Stage().Stats(); st.Payload != 0 {
		t.Fatalf("%d bytes received from refused chunks", st.Payload)
	}

	// Its connection closed, its scratch is gone.
	if _, err := s.DiscardConnection(context.Background(), &uploadv1.DiscardConnectionRequest{GatewayId: "gw-1", ConnectionId: "conn-1"}); err != nil {
		t.Fatal(err)
	}
	if sc.Held() != 0 {
		t.Fatalf("%d scratches held after their connection's discard", sc.Held())
	}
}

// A server without a scratch socket refuses a chunk naming a scratch as
// unknown, which the gateway answers with the bytes in the message.
func TestAChunkNamingAScratchWithoutScratchesIsUnknown(t *testing.T) {
	s, _ := newServer(t, nil)
	id := begin(t, s, user, 10, "")
	_, err := scratchChunk(s, user, "conn-1", id, 0, strings.Repeat("a", filepass.TokenHexLen), 5)
	wantStatus(t, "no scratches", err, codes.FailedPrecondition, uploads.ScratchUnknown)
}

// Scratches are charged to the staging budget (uploads.max_staged_bytes)
// beside the uploads, and give way to them: passes past the room the
// uploads leave evict the least recently used scratch, and a begin that
// needs room drops scratches. What upload-staging maps, uploads and
// scratches together, stays within the budget.
func TestScratchesStayWithinTheStagingBudget(t *testing.T) {
	const budget = 4 << 20
	lim := defaults()
	lim.MaxStagedBytes = budget
	path := filepath.Join(t.TempDir(), "upload-staging.scratch.sock")
	s, err := New(Config{Sessions: &sessions{}, Settings: func() configclient.Uploads { return lim }, ScratchSocket: path})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	sc := s.Scratches()
	within := func(what string) {
		t.Helper()
		held, st := int64(sc.Held()), s.Stage().Stats()
		if held*filepass.ScratchBytes+st.Charged > budget || st.Scratch != held*filepass.ScratchFileBytes || st.Charged+st.Spare+st.Scratch > budget {
			t.Fatalf("%s: %d scratches held (charged %d) beside %d charged, past the budget of %d", what, held, st.Scratch, st.Charged, budget)
		}
	}
	pass := func(conn string) (string, error) {
		mem, err := filepass.NewScratch()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { mem.Close() })
		return filepass.PassScratch(context.Background(), path, mem, filepass.ScratchBinding{Gateway: "gw-1", Conn: conn}, "")
	}
	var last string
	for i := range 10 {
		tok, err := pass(fmt.Sprintf("conn-%d", i))
		if err != nil {
			t.Fatalf("pass %d: %v", i, err)
		}
		last = tok
	}
	within("ten passes")
	if sc.Held() == 0 {
		t.Fatal("no scratch held in a budget with room for three")
	}
	// The newest is held: those evicted were the least recently used.
	if err := sc.Read(last, filepass.ScratchBinding{Gateway: "gw-1", Conn: "conn-9"}, 1, func([]byte) error { return nil }); err != nil {
		t.Fatalf("the newest scratch: %v", err)
	}
	// A begin of 2 MiB fits the budget only once scratches give way.
	if _, err := s.Begin(context.Background(), &uploadv1.BeginRequest{Principal: user, GatewayId: "gw-1", ConnectionId: "conn-1", SessionId: "sess_1", SizeBytes: 2 << 20}); err != nil {
		t.Fatalf("a begin refused for scratches: %v", err)
	}
	within("a begin of 2 MiB")
}
