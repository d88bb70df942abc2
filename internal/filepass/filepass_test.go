package filepass

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const uploadID = "0123456789abcdef0123456789abcdef"

var alice = Binding{Upload: uploadID, Principal: "alice"}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func listen(t *testing.T, o Options) (*Receiver, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "session.files.sock")
	r, err := Listen(path, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r, path
}

// filled is a memfd of size bytes holding a pattern.
func filled(t *testing.T, size int64) *Buffer {
	t.Helper()
	b, err := NewBuffer(size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	for i := range b.Bytes() {
		b.Bytes()[i] = byte(i * 7)
	}
	return b
}

func pass(t *testing.T, path string, b *Buffer, size int64, bind Binding) string {
	t.Helper()
	tok, err := Pass(context.Background(), path, b, size, bind)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// The bytes taken are the memfd's, read once: the sender writing into
// its memfd afterwards changes nothing taken, and the token is gone.
func TestTakeReadsThePassedBytesOnce(t *testing.T) {
	r, path := listen(t, Options{})
	b := filled(t, 3<<20)
	want := bytes.Clone(b.Bytes()[:3<<20-5])
	tok := pass(t, path, b, int64(len(want)), alice)
	got, err := r.Take(tok, int64(len(want)), alice, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.Bytes()[0]++
	if !bytes.Equal(got, want) {
		t.Fatal("the bytes taken are not the bytes passed")
	}
	if _, err := r.Take(tok, int64(len(want)), alice, nil); !errors.Is(err, ErrUnknown) {
		t.Fatalf("a token taken twice: %v, want ErrUnknown", err)
	}
	if n := r.Held(); n != 0 {
		t.Fatalf("%d files held after their take", n)
	}
}

// A token bound to one principal's upload is refused to another
// principal and to another upload, and is gone after the refusal.
func TestATokenOfAnotherCallerIsRefused(t *testing.T) {
	r, path := listen(t, Options{})
	b := filled(t, 1<<20)
	for _, other := range []Binding{
		{Upload: uploadID, Principal: "mallory"},
		{Upload: strings.Repeat("f", 32), Principal: "alice"},
	} {
		tok := pass(t, path, b, 1<<20, alice)
		if _, err := r.Take(tok, 1<<20, other, nil); !errors.Is(err, ErrUnknown) {
			t.Fatalf("%+v took alice's file: %v", other, err)
		}
		if _, err := r.Take(tok, 1<<20, alice, nil); !errors.Is(err, ErrUnknown) {
			t.Fatalf("a token refused once still names its file: %v", err)
		}
	}
}

// A token never given, one malformed, and one past its time are unknown;
// an expired file's descriptor is let go.
func TestUnknownAndExpiredTokensAreRefused(t *testing.T) {
	c := &clock{t: time.Unix(1e9, 0)}
	r, path := listen(t, Options{TTL: 30 * time.Second, Now: c.Now})
	for _, tok := range []string{strings.Repeat("0", 32), "../../etc/passwd", ""} {
		if _, err := r.Take(tok, 1, alice, nil); !errors.Is(err, ErrUnknown) {
			t.Fatalf("token %q: %v, want ErrUnknown", tok, err)
		}
	}
	b := filled(t, 1<<20)
	tok := pass(t, path, b, 1<<20, alice)
	c.add(30 * time.Second)
	if _, err := r.Take(tok, 1<<20, alice, nil); !errors.Is(err, ErrUnknown) {
		t.Fatalf("an expired token: %v, want ErrUnknown", err)
	}
	if n := r.Held(); n != 0 {
		t.Fatalf("%d files held past their time", n)
	}
}

// A size past the memfd's is refused: at the pass, in a header that
// claims more than the descriptor holds, and at the take.
func TestASizePastTheMemfdsIsRefused(t *testing.T) {
	r, path := listen(t, Options{})
	b := filled(t, 1<<20)
	if _, err := Pass(context.Background(), path, b, 1<<20+1, alice); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a pass past the memfd: %v", err)
	}
	// A sender that lies in its header.
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg, _ := json.Marshal(header{Binding: alice, Size: 1<<20 + 1})
	if _, _, err := c.(*net.UnixConn).WriteMsgUnix(msg, unix.UnixRights(b.fd), nil); err != nil {
		t.Fatal(err)
	}
	var rep reply
	if err := json.NewDecoder(c).Decode(&rep); err != nil {
		t.Fatal(err)
	}
	if rep.Token != "" || rep.Error != ErrTooLarge.Error() {
		t.Fatalf("a header past the memfd: %+v", rep)
	}
	tok := pass(t, path, b, 1<<19, alice)
	if _, err := r.Take(tok, 1<<19+1, alice, nil); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a take past the size passed: %v", err)
	}
	// The memfd cannot be shrunk after the pass: its seals refuse it,
	// and the take reads it whole.
	tok = pass(t, path, b, 1<<20, alice)
	if err := unix.Ftruncate(b.fd, 1<<10); !errors.Is(err, unix.EPERM) {
		t.Fatalf("a sealed memfd shrunk: %v", err)
	}
	if got, err := r.Take(tok, 1<<20, alice, nil); err != nil || !bytes.Equal(got, b.Bytes()) {
		t.Fatalf("a take after a refused shrink: %v", err)
	}
}

// rawPass passes fd with alice's header of size bytes, as any process
// of the receiver's user may, and returns the receiver's answer.
func rawPass(t *testing.T, path string, fd int, size int64) reply {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg, _ := json.Marshal(header{Binding: alice, Size: size})
	if _, _, err := c.(*net.UnixConn).WriteMsgUnix(msg, unix.UnixRights(fd), nil); err != nil {
		t.Fatal(err)
	}
	var rep reply
	if err := json.NewDecoder(c).Decode(&rep); err != nil {
		t.Fatal(err)
	}
	return rep
}

// Only a memfd of shared memory sealed against a change of size is
// held: the taker maps it, and a mapping of a file its sender may shrink
// faults (SIGBUS) where the file no longer reaches. An unsealed memfd,
// one sealed against shrinking only, a plain file and a hugetlb memfd
// (sealed, whose pages a read may fail to get) are refused at the pass.
func TestAnUnsealedFileIsRefused(t *testing.T) {
	r, path := listen(t, Options{})
	const size = 1 << 20
	fd, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	if rep := rawPass(t, path, fd, size); rep.Token != "" || !strings.Contains(rep.Error, "sealed") {
		t.Fatalf("an unsealed memfd: %+v", rep)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK); err != nil {
		t.Fatal(err)
	}
	if rep := rawPass(t, path, fd, size); rep.Token != "" {
		t.Fatal("a memfd that may grow was held")
	}
	f, err := os.CreateTemp(t.TempDir(), "plain")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_ = f.Truncate(size)
	if rep := rawPass(t, path, int(f.Fd()), size); rep.Token != "" {
		t.Fatal("a plain file was held")
	}
	if hfd, err := unix.MemfdCreate("huge", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_HUGETLB); err == nil {
		defer unix.Close(hfd)
		if err := unix.Ftruncate(hfd, 2<<20); err == nil {
			if _, err := unix.FcntlInt(uintptr(hfd), unix.F_ADD_SEALS, fileSeals); err == nil {
				if rep := rawPass(t, path, hfd, size); rep.Token != "" {
					t.Fatal("a hugetlb memfd was held")
				}
			}
		}
	}
	if r.Held() != 0 {
		t.Fatalf("%d held", r.Held())
	}
}

// A file taken mapped is the memfd's first size bytes, read-only, the
// token gone after it; the refusals are Take's.
func TestTakeMappedGivesThePassedFile(t *testing.T) {
	r, path := listen(t, Options{})
	b := filled(t, 3<<20)
	size := int64(3<<20 - 5)
	tok := pass(t, path, b, size, alice)
	if _, err := r.TakeMapped(tok, size, Binding{Upload: uploadID, Principal: "mallory"}); !errors.Is(err, ErrUnknown) {
		t.Fatalf("another's take: %v", err)
	}
	tok = pass(t, path, b, size, alice)
	if _, err := r.TakeMapped(tok, size+1, alice); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a take past the size passed: %v", err)
	}
	tok = pass(t, path, b, size, alice)
	m, err := r.TakeMapped(tok, size, alice)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if !bytes.Equal(m.Bytes(), b.Bytes()[:size]) {
		t.Fatal("the mapping is not the bytes passed")
	}
	if _, err := r.TakeMapped(tok, size, alice); !errors.Is(err, ErrUnknown) {
		t.Fatalf("a token taken twice: %v", err)
	}
	if r.Held() != 0 {
		t.Fatalf("%d held after their take", r.Held())
	}
}

// A peer of another uid is refused; one of the receiver's own is let in.
func TestAPeerOfAnotherUserIsRefused(t *testing.T) {
	uid := uint32(os.Getuid())
	if err := CheckPeer(&unix.Ucred{Pid: 1, Uid: uid + 1, Gid: uint32(os.Getgid())}, uid); err == nil {
		t.Fatal("a peer of another uid was let in")
	}
	if err := CheckPeer(nil, uid); err == nil {
		t.Fatal("a peer without credentials was let in")
	}
	if err := CheckPeer(&unix.Ucred{Uid: uid}, uid); err != nil {
		t.Fatalf("a peer of the same uid: %v", err)
	}
	// The receiver asks it of every connection: here with a want no
	// process has, every pass is refused and nothing held.
	other := uid + 1
	r, path := listen(t, Options{peerUID: &other})
	if _, err := Pass(context.Background(), path, filled(t, 1<<10), 1<<10, alice); err == nil || !strings.Contains(err.Error(), "another user") {
		t.Fatalf("a pass from a peer of another uid: %v", err)
	}
	if n := r.Held(); n != 0 {
		t.Fatalf("%d files held from a refused peer", n)
	}
}

// The receiver holds at most MaxHeld files: the next pass is refused
// until one is taken or expires.
func TestTheFilesHeldAreBounded(t *testing.T) {
	c := &clock{t: time.Unix(1e9, 0)}
	r, path := listen(t, Options{MaxHeld: 2, TTL: time.Minute, Now: c.Now})
	b := filled(t, 1<<10)
	first := pass(t, path, b, 1<<10, alice)
	pass(t, path, b, 1<<10, alice)
	if _, err := Pass(context.Background(), path, b, 1<<10, alice); err == nil || !strings.Contains(err.Error(), ErrFull.Error()) {
		t.Fatalf("a pass past the bound: %v", err)
	}
	if n := r.Held(); n != 2 {
		t.Fatalf("%d files held, want 2", n)
	}
	if _, err := r.Take(first, 1<<10, alice, nil); err != nil {
		t.Fatal(err)
	}
	pass(t, path, b, 1<<10, alice)
	c.add(time.Minute)
	pass(t, path, b, 1<<10, alice) // the two held expired, room again
	if n := r.Held(); n != 1 {
		t.Fatalf("%d files held after the others expired, want 1", n)
	}
}

// A receiver started again on the same socket holds nothing the first
// held: a token given before is unknown.
func TestAReceiverStartedAgainForgetsItsTokens(t *testing.T) {
	path := filepath.Join(t.TempDir(), "session.files.sock")
	r, err := Listen(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := filled(t, 1<<10)
	tok := pass(t, path, b, 1<<10, alice)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	r, err = Listen(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Take(tok, 1<<10, alice, nil); !errors.Is(err, ErrUnknown) {
		t.Fatalf("a token of the receiver before: %v", err)
	}
}
