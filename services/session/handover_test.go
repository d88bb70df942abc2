package session

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

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
// message: under its hash, checked against the declared one. It is
// written from its memfd's mapping, not read at the take, and its hash
// is of the file written: a sender that writes its memfd after the
// checks (after the take) has what it wrote refused by the declared
// hash, and what it writes once the store answered changes nothing
// stored.
func TestStoreFileTakesAHandedOverFile(t *testing.T) {
	h, path := handOverHarness(t)
	id := h.newSession(alice, "default")
	data := patterned(3<<20+11, 4)
	tok, mem := handOver(t, path, data)
	f := h.mustStore(byToken(id, tok, int64(len(data)), data))
	mem.Bytes()[0]++ // the sender writes after the store
	if f.GetRefId() != "sha256:"+sha(data) || f.GetSizeBytes() != int64(len(data)) {
		t.Fatalf("entry %v", f)
	}
	got, err := os.ReadFile(f.GetWorkspacePath())
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the file on disk is not the bytes handed over (%v)", err)
	}

	id = h.newSession(alice, "default")
	tok, mem = handOver(t, path, data)
	hook := func(string) { mem.Bytes()[0]++ } // the sender writes after the take
	storeChecked.Store(&hook)
	_, err = h.storeFile(byToken(id, tok, int64(len(data)), data))
	storeChecked.Store(nil)
	wantRefusal(t, err, codes.InvalidArgument, rpcerr.ReasonInvalid, uploads.HashMismatch)
	h.nothingStored(id)

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
		b := mem.Bytes()
		f, err := storeWhile(h, id, tok, data, declared, func(i int) {
			b[(i*7919)%len(b)]++
		})
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

// rawHandOver passes fd for alice's upload of size bytes on the file
// socket as any process of the daemon's user may, without filepass's
// sender, and returns the token or the receiver's refusal.
func rawHandOver(t *testing.T, path string, fd int, size int64) (tok, refusal string) {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg, _ := json.Marshal(map[string]any{"upload_id": handUpload, "principal": alice.GetPrincipalId(), "size": size})
	if _, _, err := c.(*net.UnixConn).WriteMsgUnix(msg, unix.UnixRights(fd), nil); err != nil {
		t.Fatal(err)
	}
	var rep struct{ Token, Error string }
	if err := json.NewDecoder(c).Decode(&rep); err != nil {
		t.Fatal(err)
	}
	return rep.Token, rep.Error
}

// memfdOf is a memfd holding data, with seals (none when 0).
func memfdOf(t *testing.T, data []byte, seals int) int {
	t.Helper()
	fd, err := unix.MemfdCreate("sender", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if _, err := unix.Pwrite(fd, data, 0); err != nil {
		t.Fatal(err)
	}
	if seals != 0 {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
			t.Fatal(err)
		}
	}
	return fd
}

// The session service writes a handed-over file from a mapping of its
// memfd, and a mapping read past its file's end faults (SIGBUS): a
// sender that shrinks its memfd during the store must not crash the
// service. An unsealed memfd is refused at the pass (upload-staging then
// sends the bytes), so a store cannot name it; a sealed one cannot be
// shrunk, by a goroutine truncating it over and over from the moment
// the checks passed until the store answered, and is stored whole.
func TestAHandedOverFileShrunkDuringItsStoreCannotFaultIt(t *testing.T) {
	h, path := handOverHarness(t)
	data := patterned(4<<20+3, 9)

	unsealed := memfdOf(t, data, 0)
	tok, refusal := rawHandOver(t, path, unsealed, int64(len(data)))
	if tok != "" || !strings.Contains(refusal, "sealed") {
		t.Fatalf("an unsealed memfd's pass: token %q, refusal %q", tok, refusal)
	}
	id := h.newSession(alice, "default")
	_, err := h.storeFile(byToken(id, strings.Repeat("0", filepass.TokenHexLen), int64(len(data)), data))
	wantRefusal(t, err, codes.FailedPrecondition, rpcerr.ReasonInvalid, uploads.HandOverUnknown)
	h.nothingStored(id)

	for round, declared := range []bool{true, false} {
		sealed := memfdOf(t, data, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW)
		tok, refusal = rawHandOver(t, path, sealed, int64(len(data)))
		if tok == "" {
			t.Fatalf("a sealed memfd refused: %s", refusal)
		}
		id := h.newSession(alice, "default")
		var shrunk, tries atomic.Int64
		f, err := storeWhile(h, id, tok, data, declared, func(int) {
			tries.Add(1)
			if unix.Ftruncate(sealed, 1<<10) == nil {
				shrunk.Add(1)
			}
		})
		if shrunk.Load() != 0 || tries.Load() == 0 {
			t.Fatalf("round %d: %d of %d shrinks of a sealed memfd went through", round, shrunk.Load(), tries.Load())
		}
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		got, err := os.ReadFile(f.GetWorkspacePath())
		if err != nil || !bytes.Equal(got, data) || f.GetRefId() != "sha256:"+sha(data) {
			t.Fatalf("round %d: stored %d bytes as %s (%v)", round, len(got), f.GetRefId(), err)
		}
	}
}

// storeWhile stores the handed-over file tok as data into session id,
// its hash declared or not, while a goroutine calls meddle (with a count)
// over and over from the moment the store's checks passed until it
// returned, and waits for that goroutine.
func storeWhile(h *harness, id, tok string, data []byte, declared bool, meddle func(i int)) (*sessionv1.FileEntry, error) {
	stop, done := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hook := func(string) {
		once.Do(func() {
			go func() {
				defer close(done)
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					meddle(i)
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
	once.Do(func() { close(done) }) // the checks never passed
	<-done
	return f, err
}
