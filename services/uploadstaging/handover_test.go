package uploadstaging

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/clawmesh/clawmesh/internal/filepass"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/uploads"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
	uploadv1 "github.com/clawmesh/clawmesh/proto/clawmesh/upload/v1"
)

// takingSessions is the session service's StoreFile as far as the
// hand-over goes: a file token is taken from a real receiver on the file
// socket, as services/session does (whose own tests store it), and
// refused as it refuses one it does not hold.
type takingSessions struct {
	sessions

	mu       sync.Mutex
	receiver *filepass.Receiver
	// stored are the bytes of each store, however they came; tokens
	// the file tokens named.
	stored [][]byte
	tokens []string
}

func (f *takingSessions) StoreFile(ctx context.Context, req *sessionv1.StoreFileRequest, opts ...grpc.CallOption) (*sessionv1.StoreFileResponse, error) {
	data := req.GetData()
	if tok := req.GetFileToken(); tok != "" {
		f.mu.Lock()
		r := f.receiver
		f.tokens = append(f.tokens, tok)
		f.mu.Unlock()
		if len(data) > 0 {
			return nil, rpcerr.Error(codes.InvalidArgument, rpcerr.ReasonInvalid, rpcerr.NoIndex, "both a token and bytes")
		}
		got, err := r.Take(tok, req.GetFileSize(), filepass.Binding{Upload: req.GetUploadId(), Principal: req.GetPrincipal().GetPrincipalId()}, nil)
		if err != nil {
			return nil, rpcerr.Error(codes.FailedPrecondition, rpcerr.ReasonInvalid, rpcerr.NoIndex, uploads.HandOverUnknown)
		}
		data = got
	}
	f.mu.Lock()
	f.stored = append(f.stored, bytes.Clone(data))
	f.mu.Unlock()
	d := sha256.Sum256(data)
	return &sessionv1.StoreFileResponse{File: &sessionv1.FileEntry{RefId: "sha256:" + hex.EncodeToString(d[:]), SizeBytes: int64(len(data))}}, nil
}

// restart stands for the session service started again: a new receiver
// on the same socket, holding nothing the old one held.
func (f *takingSessions) restart(t *testing.T, path string) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.receiver.Close(); err != nil {
		t.Error(err)
	}
	r, err := filepass.Listen(path, filepass.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f.receiver = r
}

func newHandOverServer(t *testing.T) (*Server, *takingSessions, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "session.files.sock")
	r, err := filepass.Listen(path, filepass.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f := &takingSessions{receiver: r}
	t.Cleanup(func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.receiver.Close()
	})
	s, err := New(Config{Sessions: f, Settings: defaults, FileSocket: path})
	if err != nil {
		t.Fatal(err)
	}
	return s, f, path
}

// stageMiB stages an upload of n MiB of random bytes on conn-1 and
// returns its id and bytes.
func stageMiB(t *testing.T, s *Server, n int) (string, []byte) {
	t.Helper()
	data := make([]byte, n<<20)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	id := begin(t, s, user, int64(len(data)), "")
	for off := 0; off < len(data); off += 1 << 20 {
		if _, err := s.Chunk(context.Background(), &uploadv1.ChunkRequest{Principal: user, GatewayId: "gw-1", ConnectionId: "conn-1",
			UploadId: id, Offset: int64(off), Data: data[off : off+1<<20]}); err != nil {
			t.Fatal(err)
		}
	}
	return id, data
}

// An upload of a MiB or more is held in a memfd and handed over: the
// store names a token, carries no bytes, and stores the upload's bytes;
// the memfd goes to the next upload, whose bytes are its own.
func TestCommitHandsTheMemfdOver(t *testing.T) {
	s, f, _ := newHandOverServer(t)
	for i := range 2 {
		id, data := stageMiB(t, s, 2)
		if _, err := commit(s, user, id); err != nil {
			t.Fatal(err)
		}
		f.mu.Lock()
		tokens, stored := len(f.tokens), f.stored[len(f.stored)-1]
		f.mu.Unlock()
		if tokens != i+1 || !bytes.Equal(stored, data) {
			t.Fatalf("commit %d: %d tokens, bytes stored equal: %v", i, tokens, bytes.Equal(stored, data))
		}
		if st := s.Stage().Stats(); st.Uploads != 0 || st.Charged != 0 || st.Spare != 2<<20 {
			t.Fatalf("after commit %d: %+v", i, st)
		}
	}
}

// The session service started again between the pass and StoreFile:
// its new receiver does not know the token, and the commit sends the
// bytes instead. The upload is stored, the client sees no error.
func TestCommitFallsBackWhenTheSessionServiceRestartedAfterThePass(t *testing.T) {
	s, f, path := newHandOverServer(t)
	id, data := stageMiB(t, s, 2)
	restart := func() { f.restart(t, path) }
	passedHook.Store(&restart)
	defer passedHook.Store(nil)
	resp, err := commit(s, user, id)
	if err != nil {
		t.Fatalf("commit across the restart: %v", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.tokens) != 1 || len(f.stored) != 1 || !bytes.Equal(f.stored[0], data) {
		t.Fatalf("%d tokens, %d stores", len(f.tokens), len(f.stored))
	}
	if resp.GetFile().GetSizeBytes() != int64(len(data)) {
		t.Fatalf("commit answered %v", resp)
	}
	if st := s.Stage().Stats(); st.Uploads != 0 || st.Charged != 0 {
		t.Fatalf("after the commit: %+v", st)
	}
}

// No file socket (a session service without one, or not yet listening):
// the commit sends the bytes, as before the hand-over.
func TestCommitSendsTheBytesWithoutAFileSocket(t *testing.T) {
	s, f, path := newHandOverServer(t)
	f.mu.Lock()
	f.receiver.Close()
	f.mu.Unlock()
	f.receiver, _ = filepass.Listen(filepath.Join(filepath.Dir(path), "elsewhere.sock"), filepass.Options{})
	id, data := stageMiB(t, s, 1)
	if _, err := commit(s, user, id); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.tokens) != 0 || len(f.stored) != 1 || !bytes.Equal(f.stored[0], data) {
		t.Fatalf("%d tokens, %d stores", len(f.tokens), len(f.stored))
	}
}

// A store that failed after the hand-over keeps the upload for another
// commit, and its memfd never becomes a spare: a late read of the
// session service must not see a later upload's bytes in it.
func TestAFailedHandOverStoreKeepsNoSpare(t *testing.T) {
	s, f, _ := newHandOverServer(t)
	id, data := stageMiB(t, s, 2)
	failing := &failingSessions{takingSessions: f}
	s.cfg.Sessions = failing
	if _, err := commit(s, user, id); err == nil {
		t.Fatal("the store did not fail")
	}
	s.cfg.Sessions = f
	if _, err := commit(s, user, id); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	stored := f.stored[len(f.stored)-1]
	f.mu.Unlock()
	if !bytes.Equal(stored, data) {
		t.Fatal("the upload kept after a failure stored other bytes")
	}
	if st := s.Stage().Stats(); st.Spare != 0 {
		t.Fatalf("a memfd handed over to a failed store was kept: %+v", st)
	}
}

// failingSessions takes the token, then fails as a session service
// going away mid-store does.
type failingSessions struct {
	*takingSessions
}

func (f *failingSessions) StoreFile(ctx context.Context, req *sessionv1.StoreFileRequest, opts ...grpc.CallOption) (*sessionv1.StoreFileResponse, error) {
	return nil, rpcerr.Error(codes.Unavailable, rpcerr.ReasonDependency, rpcerr.NoIndex, "database unavailable")
}
