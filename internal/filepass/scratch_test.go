package filepass

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

var (
	connA = ScratchBinding{Gateway: "gw-1", Conn: "conn-a"}
	connB = ScratchBinding{Gateway: "gw-1", Conn: "conn-b"}
)

func listenScratches(t *testing.T, o ScratchOptions) (*Scratches, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "upload-staging.scratch.sock")
	s, err := ListenScratches(path, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

func newScratch(t *testing.T) *Scratch {
	t.Helper()
	s, err := NewScratch()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func passScratch(t *testing.T, path string, s *Scratch, bind ScratchBinding, replaces string) string {
	t.Helper()
	tok, err := PassScratch(context.Background(), path, s, bind, replaces)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// read is what Read gives for n bytes of tok, copied.
func read(r *Scratches, tok string, bind ScratchBinding, n int64) ([]byte, error) {
	var got []byte
	err := r.Read(tok, bind, n, func(b []byte) error { got = bytes.Clone(b); return nil })
	return got, err
}

func TestAScratchIsReadByItsConnectionOnly(t *testing.T) {
	r, path := listenScratches(t, ScratchOptions{})
	s := newScratch(t)
	copy(s.Bytes(), "the chunk's bytes")
	tok := passScratch(t, path, s, connA, "")
	got, err := read(r, tok, connA, 11)
	if err != nil || string(got) != "the chunk's" {
		t.Fatalf("its own connection read %q, %v", got, err)
	}
	// What the sender writes next is what the next read sees: the
	// receiver reads the memfd, not a copy made at the pass.
	copy(s.Bytes(), "next")
	if got, _ := read(r, tok, connA, 4); string(got) != "next" {
		t.Fatalf("read %q after the sender wrote again", got)
	}
	for _, other := range []ScratchBinding{connB, {Gateway: "gw-2", Conn: "conn-a"}} {
		if _, err := read(r, tok, other, 4); !errors.Is(err, ErrScratchUnknown) {
			t.Fatalf("%+v read connA's scratch: %v", other, err)
		}
	}
	for _, bad := range []string{"", "zz", strings.Repeat("0", TokenHexLen)} {
		if _, err := read(r, bad, connA, 4); !errors.Is(err, ErrScratchUnknown) {
			t.Fatalf("token %q: %v", bad, err)
		}
	}
}

func TestAScratchLengthPastAChunkIsRefused(t *testing.T) {
	r, path := listenScratches(t, ScratchOptions{})
	tok := passScratch(t, path, newScratch(t), connA, "")
	for _, n := range []int64{0, -1, ScratchBytes + 1, scratchFileBytes, 1 << 40} {
		called := false
		err := r.Read(tok, connA, n, func([]byte) error { called = true; return nil })
		if !errors.Is(err, ErrTooLarge) || called {
			t.Fatalf("length %d: %v (read: %v)", n, err, called)
		}
	}
	if got, err := read(r, tok, connA, ScratchBytes); err != nil || len(got) != ScratchBytes {
		t.Fatalf("a whole chunk: %d bytes, %v", len(got), err)
	}
}

// A memfd whose size may still change, or a file that is no memfd, is
// refused: a mapping of it could reach past its end (SIGBUS in the
// receiver) once its sender shrinks it.
func TestAnUnsealedScratchIsRefused(t *testing.T) {
	r, path := listenScratches(t, ScratchOptions{})
	fd, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, scratchFileBytes); err != nil {
		t.Fatal(err)
	}
	unsealed := &Scratch{Buffer: &Buffer{fd: fd}}
	defer unix.Close(fd)
	if _, err := PassScratch(context.Background(), path, unsealed, connA, ""); err == nil || !strings.Contains(err.Error(), "sealed") {
		t.Fatalf("an unsealed memfd: %v", err)
	}
	// Shrink sealed but not grow: refused all the same.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK); err != nil {
		t.Fatal(err)
	}
	if _, err := PassScratch(context.Background(), path, unsealed, connA, ""); err == nil {
		t.Fatal("a memfd that may grow was held")
	}
	f, err := os.CreateTemp(t.TempDir(), "plain")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_ = f.Truncate(scratchFileBytes)
	if _, err := PassScratch(context.Background(), path, &Scratch{Buffer: &Buffer{fd: int(f.Fd())}}, connA, ""); err == nil {
		t.Fatal("a plain file was held")
	}
	if r.Held() != 0 {
		t.Fatalf("%d held", r.Held())
	}
}

func TestScratchesAreBoundedPerConnectionAndInAll(t *testing.T) {
	r, path := listenScratches(t, ScratchOptions{MaxPerConn: 2, Max: 3})
	a1 := passScratch(t, path, newScratch(t), connA, "")
	a2 := passScratch(t, path, newScratch(t), connA, "")
	a3 := passScratch(t, path, newScratch(t), connA, "")
	if _, err := read(r, a1, connA, 1); !errors.Is(err, ErrScratchUnknown) {
		t.Fatalf("a connection's third scratch kept its first: %v", err)
	}
	if r.Held() != 2 {
		t.Fatalf("%d held for one connection", r.Held())
	}
	// a3 named last: a2 is the least recently used when B's come.
	if _, err := read(r, a3, connA, 1); err != nil {
		t.Fatal(err)
	}
	b1 := passScratch(t, path, newScratch(t), connB, "")
	_ = passScratch(t, path, newScratch(t), connB, "")
	if r.Held() != 3 {
		t.Fatalf("%d held past the bound of 3", r.Held())
	}
	if _, err := read(r, a2, connA, 1); !errors.Is(err, ErrScratchUnknown) {
		t.Fatalf("the least recently used was kept: %v", err)
	}
	// A replacement drops the one it replaces, and only of its binding.
	b3 := passScratch(t, path, newScratch(t), connB, b1)
	if _, err := read(r, b1, connB, 1); !errors.Is(err, ErrScratchUnknown) {
		t.Fatalf("a replaced scratch was kept: %v", err)
	}
	// Naming another connection's token as replaced drops nothing of it:
	// B's own oldest goes, to its bound of two.
	b4 := passScratch(t, path, newScratch(t), connB, a3)
	if _, err := read(r, a3, connA, 1); err != nil {
		t.Fatalf("B's pass dropped A's scratch: %v", err)
	}
	if n := r.DropConnection(connB); n != 2 {
		t.Fatalf("dropped %d of B's", n)
	}
	for _, tok := range []string{b3, b4} {
		if _, err := read(r, tok, connB, 1); !errors.Is(err, ErrScratchUnknown) {
			t.Fatalf("a dropped connection's scratch: %v", err)
		}
	}
	r.DropGateway("gw-1")
	if r.Held() != 0 {
		t.Fatalf("%d held after the gateway's drop", r.Held())
	}
}

// A scratch dropped (its connection closed, or replaced) while a read of
// it runs stays mapped until that read ends.
func TestAScratchDroppedDuringItsReadStaysMapped(t *testing.T) {
	r, path := listenScratches(t, ScratchOptions{})
	s := newScratch(t)
	copy(s.Bytes(), "abcd")
	tok := passScratch(t, path, s, connA, "")
	err := r.Read(tok, connA, 4, func(b []byte) error {
		r.DropConnection(connA)
		if string(b) != "abcd" {
			t.Errorf("read %q", b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := read(r, tok, connA, 4); !errors.Is(err, ErrScratchUnknown) {
		t.Fatal(err)
	}
}

func TestAScratchOfAnotherUserIsRefused(t *testing.T) {
	other := uint32(os.Getuid() + 1)
	r, path := listenScratches(t, ScratchOptions{peerUID: &other})
	if _, err := PassScratch(context.Background(), path, newScratch(t), connA, ""); err == nil {
		t.Fatal("a peer of another uid was let in")
	}
	if r.Held() != 0 {
		t.Fatal("held")
	}
}

func TestScratchSocketFor(t *testing.T) {
	if got := ScratchSocketFor("/run/x/upload-staging.sock"); got != "/run/x/upload-staging.scratch.sock" {
		t.Fatal(got)
	}
	if got := ScratchSocketFor("upload-staging:7003"); got != "" {
		t.Fatal(got)
	}
}

// A memfd larger than a scratch is refused: held by its mapping of the
// first MiB, the whole file's pages stay with the receiver, past any
// charge of a scratch, once its sender let go of it.
func TestAScratchLargerThanAScratchIsRefused(t *testing.T) {
	r, path := listenScratches(t, ScratchOptions{})
	big, err := newMapped("big", 8<<20, scratchSeals|unix.F_SEAL_SEAL)
	if err != nil {
		t.Fatal(err)
	}
	defer big.Close()
	if _, err := PassScratch(context.Background(), path, &Scratch{Buffer: big}, connA, ""); err == nil {
		t.Fatal("a memfd of 8 MiB was held as a scratch")
	}
	if r.Held() != 0 {
		t.Fatalf("%d held", r.Held())
	}
}

// waitHeld waits until r holds n scratches: a drop that follows a
// peer's close is seen by the receiver's own goroutine, a moment later.
func waitHeld(t *testing.T, r *Scratches, n int, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for r.Held() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d scratches held after 10 s, want %d", what, r.Held(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A scratch goes with the connection it was passed on: its sender's
// close of it (a gateway connection's end, a retirement) or its sender's
// death (the kernel closes its descriptors) drops it at once, whether or
// not the gateway holds a lease of upload-staging.
func TestAScratchGoesWithItsPassingConnection(t *testing.T) {
	r, path := listenScratches(t, ScratchOptions{})
	a, b := newScratch(t), newScratch(t)
	passScratch(t, path, a, connA, "")
	tokB := passScratch(t, path, b, connB, "")
	if r.Held() != 2 {
		t.Fatalf("%d held", r.Held())
	}
	a.Close()
	waitHeld(t, r, 1, "A's sender closed its scratch")
	if _, err := read(r, tokB, connB, 1); err != nil {
		t.Fatalf("B's scratch went with A's: %v", err)
	}
}

// budget is a ScratchBudget of limit bytes.
type budget struct {
	mu           sync.Mutex
	limit, taken int64
}

func (b *budget) ChargeScratch(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.taken+n > b.limit {
		return false
	}
	b.taken += n
	return true
}

func (b *budget) ReleaseScratch(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.taken -= n
}

func (b *budget) held() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.taken
}

// Each scratch held is charged its file's size until it is unmapped:
// passes past the budget's room evict the least recently used, a budget
// with no room refuses them, and Evict gives room back.
func TestScratchesAreChargedToTheirBudget(t *testing.T) {
	b := &budget{limit: 3*ScratchFileBytes + 100}
	r, path := listenScratches(t, ScratchOptions{Budget: b})
	var toks []string
	for i := range 5 {
		toks = append(toks, passScratch(t, path, newScratch(t), ScratchBinding{Gateway: "gw-1", Conn: fmt.Sprintf("conn-%d", i)}, ""))
	}
	if r.Held() != 3 || b.held() != 3*ScratchFileBytes {
		t.Fatalf("%d held, %d charged, in a budget of three", r.Held(), b.held())
	}
	if _, err := read(r, toks[1], ScratchBinding{Gateway: "gw-1", Conn: "conn-1"}, 1); !errors.Is(err, ErrScratchUnknown) {
		t.Fatalf("the least recently used was kept: %v", err)
	}
	r.Evict(1)
	if r.Held() != 2 || b.held() != 2*ScratchFileBytes {
		t.Fatalf("after an eviction of a byte: %d held, %d charged", r.Held(), b.held())
	}
	// A scratch dropped while it is read stays charged until the read's end.
	conn4 := ScratchBinding{Gateway: "gw-1", Conn: "conn-4"}
	_ = r.Read(toks[4], conn4, 1, func([]byte) error {
		r.DropConnection(conn4)
		if b.held() != 2*ScratchFileBytes {
			t.Errorf("a scratch being read gave its charge back: %d", b.held())
		}
		return nil
	})
	if b.held() != ScratchFileBytes {
		t.Fatalf("after the read: %d charged", b.held())
	}
	b.mu.Lock()
	b.limit = 0
	b.mu.Unlock()
	if _, err := PassScratch(context.Background(), path, newScratch(t), connA, ""); err == nil {
		t.Fatal("a pass held in a budget with no room")
	}
	if r.Held() != 0 || b.held() != 0 {
		t.Fatalf("%d held, %d charged, in a budget with no room", r.Held(), b.held())
	}
}
