// Package filepass hands a file's bytes from one process to another on
// the same host without copying them through a gRPC message: the sender
// holds them in a memfd (Buffer) and passes its descriptor over a Unix
// socket (SCM_RIGHTS); the receiver keeps it under a random token, bound
// to who may name it, for a short time, and gives its bytes once to the
// call that names the token (Receiver.Take).
//
// The socket is 0600 in the runtime folder and the receiver checks the
// peer's uid (SO_PEERCRED): only a process of its own user may pass it a
// descriptor. A descriptor held is a memfd's pages pinned, so the
// receiver holds few (MaxHeld) and none past its ttl; a process that dies
// leaves nothing to sweep (a memfd goes with its last descriptor).
package filepass

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/clawmesh/clawmesh/internal/ids"
	"github.com/clawmesh/clawmesh/internal/unixsock"
)

// TokenHexLen is a token's length: 128 random bits in lower-case hex.
const TokenHexLen = 32

// MaxHeld bounds the descriptors a receiver holds at once by default.
const MaxHeld = 8

// maxHeader bounds a pass's header (its binding and size, in JSON).
const maxHeader = 4 << 10

// exchangeTimeout bounds one pass on either side: a connect, one
// message and its answer on the same host.
const exchangeTimeout = 5 * time.Second

// ErrUnknown is a token the receiver does not hold: never given, taken
// already, expired, another caller's, or given before the receiver
// restarted. The caller sends the bytes another way.
var ErrUnknown = errors.New("file hand-over token unknown or expired")

// ErrTooLarge is a size past the bytes the passed file holds.
var ErrTooLarge = errors.New("size past the handed-over file's")

// ErrFull is a pass refused because the receiver holds MaxHeld already.
var ErrFull = errors.New("file hand-over: too many files held")

// Binding is who may take a passed file: the upload it is and the
// principal that committed it.
type Binding struct {
	Upload    string `json:"upload_id"`
	Principal string `json:"principal"`
}

// Buffer is a memfd and its bytes mapped into this process: what is
// written into Bytes is the file passed.
type Buffer struct {
	fd  int
	mem []byte
}

// fileSeals are the seals a passed file must carry: its size fixed, so
// that the receiver's mapping of it never reaches past its end (SIGBUS)
// whatever its sender does. Its bytes may still change: what a taker
// makes of them it checks itself.
const fileSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW

// NewBuffer creates a memfd of size bytes (size > 0), sealed against a
// change of size, and maps it.
func NewBuffer(size int64) (*Buffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("memfd of %d bytes", size)
	}
	return newMapped("clawmesh-upload", size, fileSeals|unix.F_SEAL_SEAL)
}

// newMapped creates a memfd of size bytes, adds seals (none when 0; they
// are added before the mapping, which F_SEAL_WRITE would refuse after),
// and maps it read-write.
func newMapped(name string, size int64, seals int) (*Buffer, error) {
	flags := unix.MFD_CLOEXEC
	if seals != 0 {
		flags |= unix.MFD_ALLOW_SEALING
	}
	fd, err := unix.MemfdCreate(name, flags)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("memfd size: %w", err)
	}
	if seals != 0 {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("seal memfd: %w", err)
		}
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mmap memfd: %w", err)
	}
	return &Buffer{fd: fd, mem: mem}, nil
}

// Bytes is the mapped memory, valid until Close.
func (b *Buffer) Bytes() []byte { return b.mem }

// Close unmaps the memory and closes the descriptor; a receiver holding
// the file still reads it.
func (b *Buffer) Close() error {
	err := unix.Munmap(b.mem)
	b.mem = nil
	return errors.Join(err, unix.Close(b.fd))
}

// header is a pass's message beside its descriptor.
type header struct {
	Binding
	Size int64 `json:"size"`
}

// reply is the receiver's answer to a pass.
type reply struct {
	Token string `json:"token,omitempty"`
	Error string `json:"error,omitempty"`
}

// Pass hands b's first size bytes to the receiver listening at path, to
// be taken by bind, and returns the token naming them.
func Pass(ctx context.Context, path string, b *Buffer, size int64, bind Binding) (string, error) {
	if size <= 0 || size > int64(len(b.mem)) {
		return "", fmt.Errorf("pass %d bytes of a %d-byte memfd: %w", size, len(b.mem), ErrTooLarge)
	}
	msg, err := json.Marshal(header{Binding: bind, Size: size})
	if err != nil {
		return "", err
	}
	return passFD(ctx, path, b.fd, msg)
}

// passFD sends fd and the header msg to the receiver at path and returns
// the token it answers.
func passFD(ctx context.Context, path string, fd int, msg []byte) (string, error) {
	tok, c, err := passFDKeep(ctx, path, fd, msg)
	if c != nil {
		c.Close()
	}
	return tok, err
}

// passFDKeep is passFD that keeps the connection the pass went over,
// when it succeeded, with no deadline: a receiver that holds what was
// passed for that connection's life (Scratches) drops it once it closes.
func passFDKeep(ctx context.Context, path string, fd int, msg []byte) (string, *net.UnixConn, error) {
	ctx, cancel := context.WithTimeout(ctx, exchangeTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return "", nil, fmt.Errorf("file socket: %w", err)
	}
	uc := c.(*net.UnixConn)
	tok, err := exchangePass(ctx, uc, fd, msg)
	if err != nil {
		uc.Close()
		return "", nil, err
	}
	_ = uc.SetDeadline(time.Time{})
	return tok, uc, nil
}

// exchangePass is a pass's side of the exchange on uc: fd and msg sent,
// the token answered read.
func exchangePass(ctx context.Context, uc *net.UnixConn, fd int, msg []byte) (string, error) {
	if dl, ok := ctx.Deadline(); ok {
		_ = uc.SetDeadline(dl)
	}
	if _, _, err := uc.WriteMsgUnix(msg, unix.UnixRights(fd), nil); err != nil {
		return "", fmt.Errorf("pass the file: %w", err)
	}
	buf := make([]byte, 512)
	n, err := uc.Read(buf)
	if err != nil {
		return "", fmt.Errorf("file socket's answer: %w", err)
	}
	var r reply
	if err := json.Unmarshal(buf[:n], &r); err != nil {
		return "", fmt.Errorf("file socket's answer: %w", err)
	}
	if r.Error != "" {
		return "", fmt.Errorf("file socket refused the pass: %s", r.Error)
	}
	if !ids.LowerHex(r.Token, TokenHexLen) {
		return "", errors.New("file socket answered a malformed token")
	}
	return r.Token, nil
}

// held is a passed file waiting for its Take.
type held struct {
	fd      int
	size    int64 // the size the sender declared
	bind    Binding
	expires time.Time
}

// Receiver listens on the file socket and holds what is passed to it.
type Receiver struct {
	sock *socket
	ttl  time.Duration
	max  int
	now  func() time.Time

	mu    sync.Mutex
	files map[string]held
}

// Options tunes a receiver; zero values take the defaults.
type Options struct {
	// TTL is how long a passed file waits for its Take.
	TTL time.Duration
	// MaxHeld bounds the files held at once (default MaxHeld).
	MaxHeld int
	// Now is the clock (tests); nil is time.Now.
	Now func() time.Time
	// peerUID, when set (tests), is the uid a peer must have instead of
	// this process's.
	peerUID *uint32
}

// socket is a receiving socket (0600) whose peers must be of uid, served
// one exchange at a time by one goroutine until stop: a peer's exchange
// is bounded by exchangeTimeout, so a stuck one delays others by that at
// most.
type socket struct {
	lis  *net.UnixListener
	uid  uint32
	done chan struct{}
	// keep, when set, is offered each connection whose pass was held,
	// under its token: true, and it owns the connection (Scratches ties
	// what was passed to its life); else the connection is closed.
	keep func(tok string, c *net.UnixConn) bool
}

// listenFor creates a socket at path whose peers must have this
// process's uid, or peerUID (tests).
func listenFor(path string, peerUID *uint32) (*socket, error) {
	lis, err := unixsock.Listen(path)
	if err != nil {
		return nil, err
	}
	uid := uint32(os.Getuid())
	if peerUID != nil {
		uid = *peerUID
	}
	return &socket{lis: lis, uid: uid, done: make(chan struct{})}, nil
}

// serve answers each pass with what hold makes of it (exchangeOne).
func (s *socket) serve(hold func(fd int, hdr []byte) (string, error)) {
	go func() {
		defer close(s.done)
		acceptLoop(s.lis, func(c *net.UnixConn) {
			if tok := exchangeOne(c, s.uid, hold); tok == "" || s.keep == nil || !s.keep(tok, c) {
				c.Close()
			}
		})
	}()
}

// stop closes the socket and waits for its goroutine.
func (s *socket) stop() error {
	err := s.lis.Close()
	<-s.done
	return err
}

// Listen creates the file socket at path (0600) and serves passes on it
// until Close.
func Listen(path string, o Options) (*Receiver, error) {
	if o.TTL <= 0 {
		o.TTL = 30 * time.Second
	}
	if o.MaxHeld <= 0 {
		o.MaxHeld = MaxHeld
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	sock, err := listenFor(path, o.peerUID)
	if err != nil {
		return nil, err
	}
	r := &Receiver{sock: sock, ttl: o.TTL, max: o.MaxHeld, now: o.Now, files: map[string]held{}}
	sock.serve(r.exchange)
	return r, nil
}

// Close stops serving, waits for the serving goroutine and closes every
// descriptor held.
func (r *Receiver) Close() error {
	err := r.sock.stop()
	r.mu.Lock()
	defer r.mu.Unlock()
	for tok, h := range r.files {
		unix.Close(h.fd)
		delete(r.files, tok)
	}
	return err
}

// Held is how many passed files wait for their Take.
func (r *Receiver) Held() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.files)
}

// acceptLoop runs exchange on each connection lis accepts, one at a
// time, until lis closes.
func acceptLoop(lis *net.UnixListener, exchange func(*net.UnixConn)) {
	for {
		c, err := lis.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // EMFILE and the like pass
			continue
		}
		exchange(c)
	}
}

// exchange holds one pass's descriptor under its header.
func (r *Receiver) exchange(fd int, hdr []byte) (string, error) {
	var h header
	if err := json.Unmarshal(hdr, &h); err != nil {
		return "", errors.New("malformed header")
	}
	return r.hold(fd, h)
}

// exchangeOne reads one pass from c (a header and one descriptor from a
// peer of uid) and answers it with what hold makes of it: a token, or
// its refusal, in which case the descriptor is closed here. It returns
// the token answered, "" for none; the caller closes c.
func exchangeOne(c *net.UnixConn, uid uint32, hold func(fd int, hdr []byte) (string, error)) string {
	_ = c.SetDeadline(time.Now().Add(exchangeTimeout))
	answer := func(rep reply) {
		msg, _ := json.Marshal(rep)
		_, _ = c.Write(msg)
	}
	buf := make([]byte, maxHeader)
	oob := make([]byte, unix.CmsgSpace(4*4)) // room to see, and close, a few descriptors sent by mistake
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return ""
	}
	fds, err := descriptors(oob[:oobn])
	if err != nil {
		answer(reply{Error: err.Error()})
		return ""
	}
	// Read before the check so that the refusal reaches the peer rather
	// than a reset, and a descriptor it sent is closed here.
	if err := checkConnPeer(c, uid); err != nil {
		closeAll(fds)
		answer(reply{Error: err.Error()})
		return ""
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || len(fds) != 1 {
		closeAll(fds)
		answer(reply{Error: "one descriptor and a header of at most 4 KiB expected"})
		return ""
	}
	tok, err := hold(fds[0], buf[:n])
	if err != nil {
		unix.Close(fds[0])
		answer(reply{Error: err.Error()})
		return ""
	}
	answer(reply{Token: tok})
	return tok
}

// checkConnPeer refuses a peer of another user than uid.
func checkConnPeer(c *net.UnixConn, uid uint32) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("peer credentials: %w", cerr)
	}
	return CheckPeer(cred, uid)
}

// CheckPeer refuses a peer whose uid is not want: a descriptor passed by
// another user's process is never read.
func CheckPeer(cred *unix.Ucred, want uint32) error {
	if cred == nil || cred.Uid != want {
		return errors.New("peer of another user refused")
	}
	return nil
}

// descriptors are the descriptors SCM_RIGHTS messages in oob carry.
func descriptors(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("control message: %w", err)
	}
	var fds []int
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_SOCKET || m.Header.Type != unix.SCM_RIGHTS {
			continue
		}
		got, err := unix.ParseUnixRights(&m)
		if err != nil {
			closeAll(fds)
			return nil, fmt.Errorf("control message: %w", err)
		}
		fds = append(fds, got...)
	}
	return fds, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// hold keeps fd under a new token, once its header and the file check
// out: a memfd sealed against a change of size (sealedMemfd), of at
// least the declared size.
func (r *Receiver) hold(fd int, h header) (string, error) {
	if !ids.LowerHex(h.Upload, 32) || h.Principal == "" || len(h.Principal) > 256 {
		return "", errors.New("malformed binding")
	}
	if err := sealedMemfd(fd, fileSeals); err != nil {
		return "", err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "", fmt.Errorf("stat the passed file: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return "", errors.New("the passed descriptor is not a regular file")
	}
	if h.Size <= 0 || h.Size > st.Size {
		return "", ErrTooLarge
	}
	var raw [TokenHexLen / 2]byte
	_, _ = rand.Read(raw[:]) // crypto/rand.Read never fails on supported platforms
	tok := hex.EncodeToString(raw[:])
	r.mu.Lock()
	defer r.mu.Unlock()
	r.expireLocked()
	if len(r.files) >= r.max {
		return "", ErrFull
	}
	r.files[tok] = held{fd: fd, size: h.Size, bind: h.Binding, expires: r.now().Add(r.ttl)}
	return tok, nil
}

// errUnsealed refuses a passed file that is not a memfd of plain shared
// memory sealed against a change of size.
var errUnsealed = errors.New("the passed file is not a memfd sealed against a change of size")

// sealedMemfd refuses fd unless it carries seals (seals cannot be taken
// off once added) and is of plain shared memory (tmpfs): a hugetlb memfd
// takes seals too, and a read of a page its pool cannot fill faults
// (SIGBUS) whatever its size.
func sealedMemfd(fd, seals int) error {
	got, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || got&seals != seals {
		return errUnsealed
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil || fs.Type != unix.TMPFS_MAGIC {
		return errUnsealed
	}
	return nil
}

// expireLocked closes the files whose time ran out.
func (r *Receiver) expireLocked() {
	now := r.now()
	for tok, h := range r.files {
		if !now.Before(h.expires) {
			unix.Close(h.fd)
			delete(r.files, tok)
		}
	}
}

// Take gives the size bytes the token names to bind, read once into buf
// (grown when short) so that nothing the sender does after changes them.
// The token is gone after it, whatever the answer, as with TakeMapped.
func (r *Receiver) Take(token string, size int64, bind Binding, buf []byte) ([]byte, error) {
	fd, err := r.take(token, size, bind)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	if int64(cap(buf)) < size {
		buf = make([]byte, size)
	}
	buf = buf[:size]
	for off := int64(0); off < size; {
		n, err := unix.Pread(fd, buf[off:], off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read the passed file: %w", err)
		}
		if n == 0 {
			return nil, ErrTooLarge
		}
		off += int64(n)
	}
	return buf, nil
}

// Mapped is a taken file's first bytes mapped read-only into this
// process, until Close. Its sender can still write them: a taker that
// must know what it used copies them once, or checks what it made of
// them (the session service writes them to a file and hashes that file).
// The file is sealed against shrinking (hold), so no page of the mapping
// is ever past its end.
type Mapped struct {
	mem []byte
}

// Bytes is the mapping, valid until Close.
func (m *Mapped) Bytes() []byte { return m.mem }

// Close unmaps the file; a nil Mapped is left alone.
func (m *Mapped) Close() error {
	if m == nil || m.mem == nil {
		return nil
	}
	err := unix.Munmap(m.mem)
	m.mem = nil
	return err
}

// TakeMapped gives bind the first size bytes of the file the token
// names, mapped read-only rather than read: no copy is made here. The
// token is gone after it, whatever the answer: ErrUnknown for a token
// not held (or another's), ErrTooLarge for a size past the file's. A
// token not of a token's form is unknown without a look-up.
func (r *Receiver) TakeMapped(token string, size int64, bind Binding) (*Mapped, error) {
	fd, err := r.take(token, size, bind)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("map the passed file: %w", err)
	}
	return &Mapped{mem: mem}, nil
}

// take removes the token's file from those held and returns its
// descriptor, for the caller to close, once bind may take it and size
// is within what was passed and what the file holds now.
func (r *Receiver) take(token string, size int64, bind Binding) (int, error) {
	if !ids.LowerHex(token, TokenHexLen) {
		return -1, ErrUnknown
	}
	r.mu.Lock()
	r.expireLocked()
	h, ok := r.files[token]
	if ok {
		delete(r.files, token)
	}
	r.mu.Unlock()
	if !ok {
		return -1, ErrUnknown
	}
	if h.bind != bind {
		unix.Close(h.fd)
		return -1, ErrUnknown
	}
	var st unix.Stat_t
	if err := unix.Fstat(h.fd, &st); err != nil {
		unix.Close(h.fd)
		return -1, fmt.Errorf("stat the passed file: %w", err)
	}
	// Against the file as it is now as well as it was passed (its seals
	// keep it from shrinking since; checked all the same).
	if size <= 0 || size > h.size || size > st.Size {
		unix.Close(h.fd)
		return -1, ErrTooLarge
	}
	return h.fd, nil
}

// SocketFor is the file socket beside a service's gRPC socket at addr:
// <name>.files.sock for <name>.sock, so that the folder, its mode and
// whoever may reach it are the gRPC socket's. It is "" when addr is not
// a Unix socket path (host:port, between containers or hosts): a
// descriptor does not cross a network, and there is no hand-over.
func SocketFor(addr string) string {
	if !filepath.IsAbs(addr) || !strings.HasSuffix(addr, ".sock") {
		return ""
	}
	return strings.TrimSuffix(addr, ".sock") + ".files.sock"
}
