package session

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/clawmesh/clawmesh/internal/configschema"
	"github.com/clawmesh/clawmesh/internal/filepass"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/uploads"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

const handUpload = "0123456789abcdef0123456789abcdef"

// handOverHarness is fileHarness with a file socket whose receiver each
// start of the server makes anew, as cmd/session does.
func handOverHarness(t *testing.T) (*harness, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "session.files.sock")
	pol := newPolicy()
	pol.grant(alice, configschema.PermFilesCreate, useDefault)
	pol.grant(bob, configschema.PermFilesCreate, useDefault)
	h := newHarness(t, func(c *Config) {
		c.Authz = pol
		c.FileReceiver = listenFiles(t, path)
	})
	return h, path
}

func listenFiles(t *testing.T, path string) *filepass.Receiver {
	t.Helper()
	r, err := filepass.Listen(path, filepass.Options{TTL: FileHandOverTTL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// handOver passes data in a memfd on the file socket for alice's upload
// and returns the token and the memfd.
func handOver(t *testing.T, path string, data []byte) (string, *filepass.Buffer) {
	t.Helper()
	b, err := filepass.NewBuffer(int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	copy(b.Bytes(), data)
	tok, err := filepass.Pass(context.Background(), path, b, int64(len(data)), filepass.Binding{Upload: handUpload, Principal: alice.GetPrincipalId()})
	if err != nil {
		t.Fatal(err)
	}
	return tok, b
}

func byToken(id, tok string, size int64, data []byte) *sessionv1.StoreFileRequest {
	return &sessionv1.StoreFileRequest{Principal: alice, SessionId: id, Filename: "f.bin", UploadId: handUpload,
		FileToken: tok, FileSize: size, Sha256: sha(data), MaxBytes: 10 << 20}
}

// A file named by its token is stored as if its bytes had come in the
// message: under its hash, checked against the declared one, and written
// from the bytes read at the take, not from the memfd the sender keeps
// writing into.
func TestStoreFileTakesAHandedOverFile(t *testing.T) {
	h, path := handOverHarness(t)
	id := h.newSession(alice, "default")
	data := patterned(3<<20+11, 4)
	tok, mem := handOver(t, path, data)
	hook := func(string) { mem.Bytes()[0]++ } // the sender writes after the take
	storeChecked.Store(&hook)
	f := h.mustStore(byToken(id, tok, int64(len(data)), data))
	storeChecked.Store(nil)
	if f.GetRefId() != "sha256:"+sha(data) || f.GetSizeBytes() != int64(len(data)) {
		t.Fatalf("entry %v", f)
	}
	got, err := os.ReadFile(filepath.Join(h.dataDir, "workspaces", id, f.GetWorkspacePath()))
	if err != nil {
		got, err = os.ReadFile(f.GetWorkspacePath())
	}
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the file on disk is not the bytes handed over (%v)", err)
	}

	// The declared hash is still checked: a token of other bytes stores
	// nothing.
	id = h.newSession(alice, "default")
	other := patterned(len(data), 5)
	tok, _ = handOver(t, path, other)
	_, err = h.storeFile(byToken(id, tok, int64(len(other)), data))
	wantRefusal(t, err, codes.InvalidArgument, rpcerr.ReasonInvalid, uploads.HashMismatch)
	h.nothingStored(id)
}

// A token another principal names, one unknown, one taken already, a
// size past the memfd's, and a token passed before the service started
// again are each refused as the hand-over's failure (upload-staging then
// sends the bytes), with nothing stored.
func TestStoreFileRefusesATokenItCannotTake(t *testing.T) {
	h, path := handOverHarness(t)
	id := h.newSession(alice, "default")
	data := patterned(1<<20, 7)
	refused := func(what string, req *sessionv1.StoreFileRequest) {
		t.Helper()
		_, err := h.storeFile(req)
		wantRefusal(t, err, codes.FailedPrecondition, rpcerr.ReasonInvalid, uploads.HandOverUnknown)
		h.nothingStored(id)
	}

	tok, _ := handOver(t, path, data)
	req := byToken(id, tok, int64(len(data)), data)
	req.Principal = bob
	refused("another principal's token", req)
	refused("a token refused once", byToken(id, tok, int64(len(data)), data))

	tok, _ = handOver(t, path, data)
	req = byToken(id, tok, int64(len(data)), data)
	req.UploadId = "ffffffffffffffffffffffffffffffff"
	refused("another upload's token", req)

	refused("an unknown token", byToken(id, "00000000000000000000000000000000", int64(len(data)), data))
	refused("a malformed token", byToken(id, "../../x", int64(len(data)), data))

	tok, _ = handOver(t, path, data)
	refused("a size past the memfd's", byToken(id, tok, int64(len(data))+1, data))

	tok, _ = handOver(t, path, data)
	h.cfg.FileReceiver.Close()
	h.cfg.FileReceiver = listenFiles(t, path)
	h.restart()
	refused("a token of the service before it restarted", byToken(id, tok, int64(len(data)), data))

	// Bytes in the message are stored as ever.
	if f := h.mustStore(&sessionv1.StoreFileRequest{Principal: alice, SessionId: id, Filename: "f.bin", Data: data, UploadId: handUpload}); f.GetSizeBytes() != int64(len(data)) {
		t.Fatalf("entry %v", f)
	}
}

// A memfd its sender keeps writing into while the session service
// stores it (upload-staging never does; a process of the daemon's user
// could) never stores a file whose bytes are not what its name and its
// entry say: with a declared hash the store either refuses, storing
// nothing, or stores exactly the declared bytes; without one, the bytes
// on disk hash to the name they are stored under. The writer flips a
// byte somewhere in the file again and again from the moment the
// checks passed until the store returned.
func TestAHandedOverFileWrittenDuringItsStoreIsNamedByWhatIsOnDisk(t *testing.T) {
	h, path := handOverHarness(t)
	for round := range 6 {
		declared := round%2 == 0
		id := h.newSession(alice, "default")
		data := patterned(4<<20+round, 11+round)
		tok, mem := handOver(t, path, data)
		stop, done := make(chan struct{}), make(chan struct{})
		var once sync.Once
		hook := func(string) {
			once.Do(func() {
				go func() {
					defer close(done)
					b := mem.Bytes()
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						b[(i*7919)%len(b)]++
					}
				}()
			})
		}
		storeChecked.Store(&hook)
		req := byToken(id, tok, int64(len(data)), data)
		if !declared {
			req.Sha256 = ""
		}
		f, err := h.storeFile(req)
		storeChecked.Store(nil)
		close(stop)
		<-done
		if err != nil {
			if !declared {
				t.Fatalf("round %d: an undeclared store refused: %v", round, err)
			}
			wantRefusal(t, err, codes.InvalidArgument, rpcerr.ReasonInvalid, uploads.HashMismatch)
			h.nothingStored(id)
			continue
		}
		got, err := os.ReadFile(f.GetWorkspacePath())
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if "sha256:"+sha(got) != f.GetRefId() || filepath.Base(f.GetWorkspacePath()) != sha(got)+".bin" || int64(len(got)) != f.GetSizeBytes() {
			t.Fatalf("round %d (declared %v): the bytes on disk hash to %s, stored as %s (%s)", round, declared, sha(got), f.GetRefId(), f.GetWorkspacePath())
		}
		if declared && !bytes.Equal(got, data) {
			t.Fatalf("round %d: a declared store kept other bytes than the declared ones", round)
		}
	}
}
