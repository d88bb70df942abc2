package filepass

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/clawmesh/clawmesh/internal/ids"
)

// A scratch is a memfd one gateway connection decodes its upload chunks
// into, passed once to upload-staging's scratch socket and named by each
// chunk call after (docs/performance.md, sixty-fifth round): the chunk's
// megabyte then crosses no gRPC message. The sender writes it only while
// no call names it; the receiver maps it read-only and copies from it
// under every check a chunk in a message gets.

// ScratchBytes is the most a chunk read from a scratch may hold: the
// spec's default chunk (docs/spec.md §6).
const ScratchBytes = 1 << 20

// ScratchFileBytes is a scratch memfd's size, and the most a receiver
// holds of one: a page past ScratchBytes, for base64's decoder wants room
// for DecodedLen, up to two bytes more than a chunk of ScratchBytes
// decodes to.
const ScratchFileBytes = ScratchBytes + 4096

const scratchFileBytes = ScratchFileBytes

// scratchSeals are the seals a scratch must carry: its size fixed, so
// that a mapping of it never reaches past its end (SIGBUS) whatever its
// sender does.
const scratchSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW

// Default bounds of the scratches a receiver holds: two a connection (two
// of its chunks in flight at once), 64 in all; a budget, when the
// receiver has one, bounds their bytes too.
const (
	MaxScratchesPerConn = 2
	MaxScratches        = 64
)

// ErrScratchUnknown is a scratch token the receiver does not hold for
// the caller: never passed, replaced, dropped, evicted, another
// connection's, or passed before the receiver restarted. The caller
// sends the chunk's bytes in the message.
var ErrScratchUnknown = errors.New("upload scratch unknown")

// ScratchBinding is who may name a scratch: the gateway process and its
// connection that passed it.
type ScratchBinding struct {
	Gateway string `json:"gateway_id"`
	Conn    string `json:"connection_id"`
}

// Scratch is the sender's side: a sealed memfd mapped read-write (its
// Bytes), its mapping's cap no pool's, and the connection it was passed
// over, which the receiver holds it for the life of.
type Scratch struct {
	*Buffer
	link *net.UnixConn
}

// Close unmaps the scratch and closes its descriptor and the connection
// it was passed over: the receiver drops it then (a read in progress
// keeps its mapping to its end).
func (s *Scratch) Close() error {
	var err error
	if s.link != nil {
		err = s.link.Close()
		s.link = nil
	}
	return errors.Join(err, s.Buffer.Close())
}

// NewScratch makes a scratch memfd of scratchFileBytes, sealed against
// any change of size, and maps it.
func NewScratch() (*Scratch, error) {
	b, err := newMapped("clawmesh-chunk", scratchFileBytes, scratchSeals|unix.F_SEAL_SEAL)
	if err != nil {
		return nil, err
	}
	return &Scratch{Buffer: b}, nil
}

// scratchHeader is a scratch pass's message beside its descriptor.
type scratchHeader struct {
	ScratchBinding
	// Replaces is a token of the same binding the sender retired: it is
	// dropped as this one is held.
	Replaces string `json:"replaces,omitempty"`
}

// PassScratch hands s to the scratch receiver at path, bound to bind, and
// returns the token chunk calls name it by. replaces, when set, is the
// token of a scratch of the same binding the sender no longer writes.
// The connection of the pass stays open until s's Close (or this
// process's end): the receiver holds the scratch no longer. A scratch is
// passed once.
func PassScratch(ctx context.Context, path string, s *Scratch, bind ScratchBinding, replaces string) (string, error) {
	if s.link != nil {
		return "", errors.New("a scratch is passed once")
	}
	msg, err := json.Marshal(scratchHeader{ScratchBinding: bind, Replaces: replaces})
	if err != nil {
		return "", err
	}
	tok, c, err := passFDKeep(ctx, path, s.fd, msg)
	if err != nil {
		return "", err
	}
	s.link = c
	return tok, nil
}

// ScratchBudget is what a receiver's scratches are charged to, each its
// file's size while it is mapped (upload-staging's staging budget,
// beside its uploads). ReleaseScratch is called with the receiver's lock
// held and must not wait on anything that calls the receiver;
// ChargeScratch never is.
type ScratchBudget interface {
	// ChargeScratch takes n bytes, or reports that there is no room.
	ChargeScratch(n int64) bool
	// ReleaseScratch gives back n bytes ChargeScratch took.
	ReleaseScratch(n int64)
}

// ErrScratchNoRoom is a pass refused because the budget has no room for
// it even with every other scratch evicted: uploads fill it.
var ErrScratchNoRoom = errors.New("no room in the staging budget for a scratch")

// mapped is a scratch held by the receiver.
type mapped struct {
	mem  []byte
	bind ScratchBinding
	used time.Time
	// size is the file's size, charged to the budget until unmapped.
	size int64
	// link is the connection it was passed over; its close by the
	// sender (or the sender's end) drops the scratch.
	link *net.UnixConn
	// refs counts the reads in progress; a scratch dropped meanwhile is
	// unmapped by the last of them.
	refs    int
	dropped bool
}

// Scratches is the receiver's side: the scratches passed to it, each
// mapped read-only for as long as the connection it was passed over
// stays open, at most MaxPerConn a connection, Max in all and what the
// budget has room for (the least recently used goes first).
type Scratches struct {
	sock   *socket
	max    int
	per    int
	now    func() time.Time
	budget ScratchBudget

	// links counts the goroutines that wait for a held scratch's
	// connection to close (watch); Close waits for them.
	links sync.WaitGroup

	mu    sync.Mutex
	held  map[string]*mapped
	byKey map[ScratchBinding][]string // tokens, oldest first
}

// ScratchOptions tunes a scratch receiver; zero values take the defaults.
type ScratchOptions struct {
	MaxPerConn, Max int
	// Now is the clock (tests); nil is time.Now.
	Now func() time.Time
	// Budget, when set, is charged each scratch held; a pass past its
	// room evicts the least recently used, or is refused.
	Budget ScratchBudget
	// peerUID, when set (tests), is the uid a peer must have.
	peerUID *uint32
}

// ListenScratches creates the scratch socket at path (0600) and serves
// passes on it until Close.
func ListenScratches(path string, o ScratchOptions) (*Scratches, error) {
	if o.MaxPerConn <= 0 {
		o.MaxPerConn = MaxScratchesPerConn
	}
	if o.Max <= 0 {
		o.Max = MaxScratches
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	sock, err := listenFor(path, o.peerUID)
	if err != nil {
		return nil, err
	}
	s := &Scratches{sock: sock, max: o.Max, per: o.MaxPerConn, now: o.Now, budget: o.Budget,
		held: map[string]*mapped{}, byKey: map[ScratchBinding][]string{}}
	sock.keep = s.keep
	sock.serve(s.hold)
	return s, nil
}

// Close stops serving, waits for the serving goroutine, drops every
// scratch (those being read are unmapped by their reads' end) and waits
// for the goroutines that watched their connections.
func (s *Scratches) Close() error {
	err := s.sock.stop()
	s.mu.Lock()
	for tok := range s.held {
		s.dropLocked(tok)
	}
	s.mu.Unlock()
	s.links.Wait()
	return err
}

// keep ties the scratch held under tok to c, the connection it was
// passed over: when the sender closes it, or dies, the scratch goes.
// False (c is closed by the caller) when tok went meanwhile.
func (s *Scratches) keep(tok string, c *net.UnixConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.held[tok]
	if m == nil {
		return false
	}
	_ = c.SetDeadline(time.Time{})
	m.link = c
	s.links.Go(func() {
		// Nothing is sent on it after the pass: a byte or its end
		// alike is the sender letting go. A drop here closes c, which
		// ends this read too.
		var b [1]byte
		_, _ = c.Read(b[:])
		s.mu.Lock()
		defer s.mu.Unlock()
		if m := s.held[tok]; m != nil && m.link == c {
			s.dropLocked(tok)
		}
	})
	return true
}

// Held is how many scratches the receiver holds.
func (s *Scratches) Held() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.held)
}

// hold maps a passed scratch once its header and the file check out: a
// memfd sealed against shrinking and growing, of a scratch's size.
func (s *Scratches) hold(fd int, hdr []byte) (string, error) {
	var h scratchHeader
	if err := json.Unmarshal(hdr, &h); err != nil {
		return "", errors.New("malformed header")
	}
	if ids.Check(h.Gateway) != nil || ids.Check(h.Conn) != nil {
		return "", errors.New("malformed binding")
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&scratchSeals != scratchSeals {
		return "", errors.New("the passed scratch is not a memfd sealed against a change of size")
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "", fmt.Errorf("stat the passed scratch: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size < ScratchBytes {
		return "", errors.New("the passed scratch is smaller than a chunk")
	}
	// The mapping of its first MiB keeps the whole file, whose pages
	// would then be held here past a scratch's charge.
	if st.Size > ScratchFileBytes {
		return "", errors.New("the passed scratch is larger than a scratch")
	}
	// Room is made first, within the bounds the new one counts in: the
	// one it replaces, its connection's oldest past MaxPerConn, the
	// least used past Max, then as many of the least used as the budget
	// wants. Passes are held one at a time (socket.serve): nothing else
	// is added meanwhile.
	s.mu.Lock()
	if old := s.held[h.Replaces]; old != nil && old.bind == h.ScratchBinding {
		s.dropLocked(h.Replaces)
	}
	for len(s.byKey[h.ScratchBinding]) >= s.per {
		s.dropLocked(s.byKey[h.ScratchBinding][0])
	}
	for len(s.held) >= s.max {
		s.dropLocked(s.leastUsedLocked())
	}
	s.mu.Unlock()
	if err := s.charge(st.Size); err != nil {
		return "", err
	}
	mem, err := unix.Mmap(fd, 0, ScratchBytes, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		if s.budget != nil {
			s.budget.ReleaseScratch(st.Size)
		}
		return "", fmt.Errorf("map the passed scratch: %w", err)
	}
	// The mapping keeps the memfd; the descriptor is not needed.
	unix.Close(fd)
	var raw [TokenHexLen / 2]byte
	_, _ = rand.Read(raw[:])
	tok := hex.EncodeToString(raw[:])
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held[tok] = &mapped{mem: mem, bind: h.ScratchBinding, used: s.now(), size: st.Size}
	s.byKey[h.ScratchBinding] = append(s.byKey[h.ScratchBinding], tok)
	return tok, nil
}

// charge takes n bytes of the budget for a new scratch, evicting the
// least recently used until there is room; ErrScratchNoRoom when there
// is none with every scratch gone (those being read are released only
// at their reads' end).
func (s *Scratches) charge(n int64) error {
	if s.budget == nil {
		return nil
	}
	for !s.budget.ChargeScratch(n) {
		s.mu.Lock()
		tok := s.leastUsedLocked()
		if tok != "" {
			s.dropLocked(tok)
		}
		s.mu.Unlock()
		if tok == "" {
			return ErrScratchNoRoom
		}
	}
	return nil
}

// Evict drops the least recently used scratches until need bytes of
// their charge are given back, or none is left: the budget's owner
// makes room for what comes first (an upload). A scratch being read
// gives its charge back at its read's end.
func (s *Scratches) Evict(need int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for freed := int64(0); freed < need && len(s.held) > 0; {
		tok := s.leastUsedLocked()
		if m := s.held[tok]; m.refs == 0 {
			freed += m.size
		}
		s.dropLocked(tok)
	}
}

// leastUsedLocked is the token of the scratch named longest ago.
func (s *Scratches) leastUsedLocked() string {
	var oldest string
	var at time.Time
	for tok, m := range s.held {
		if oldest == "" || m.used.Before(at) {
			oldest, at = tok, m.used
		}
	}
	return oldest
}

// dropLocked forgets tok and unmaps its scratch unless a read holds it.
func (s *Scratches) dropLocked(tok string) {
	m := s.held[tok]
	if m == nil {
		return
	}
	delete(s.held, tok)
	toks := s.byKey[m.bind]
	for i, t := range toks {
		if t == tok {
			toks = append(toks[:i:i], toks[i+1:]...)
			break
		}
	}
	if len(toks) == 0 {
		delete(s.byKey, m.bind)
	} else {
		s.byKey[m.bind] = toks
	}
	m.dropped = true
	if m.link != nil {
		m.link.Close()
	}
	if m.refs == 0 {
		s.unmapLocked(m)
	}
}

// unmapLocked unmaps a dropped scratch no read holds, and gives back its
// charge.
func (s *Scratches) unmapLocked(m *mapped) {
	_ = unix.Munmap(m.mem)
	m.mem = nil
	if s.budget != nil {
		s.budget.ReleaseScratch(m.size)
	}
}

// Read calls fn with the first n bytes of the scratch token names, when
// bind passed it; fn must not keep them. ErrScratchUnknown for a token
// not held for bind (the same answer whether another's or none), an
// error wrapping ErrTooLarge for n outside 1..ScratchBytes. A scratch
// dropped while fn runs stays mapped until fn returns.
func (s *Scratches) Read(token string, bind ScratchBinding, n int64, fn func([]byte) error) error {
	if n < 1 || n > ScratchBytes {
		return fmt.Errorf("a chunk of %d bytes from a scratch of %d: %w", n, ScratchBytes, ErrTooLarge)
	}
	if !ids.LowerHex(token, TokenHexLen) {
		return ErrScratchUnknown
	}
	s.mu.Lock()
	m := s.held[token]
	if m == nil || m.bind != bind {
		s.mu.Unlock()
		return ErrScratchUnknown
	}
	m.refs++
	m.used = s.now()
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		m.refs--
		if m.dropped && m.refs == 0 {
			s.unmapLocked(m)
		}
	}()
	return fn(m.mem[:n])
}

// DropConnection drops a connection's scratches and reports how many.
func (s *Scratches) DropConnection(bind ScratchBinding) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	toks := append([]string(nil), s.byKey[bind]...)
	for _, tok := range toks {
		s.dropLocked(tok)
	}
	return len(toks)
}

// DropGateway drops every scratch of a gateway process.
func (s *Scratches) DropGateway(gateway string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for tok, m := range s.held {
		if m.bind.Gateway == gateway {
			s.dropLocked(tok)
		}
	}
}

// ScratchSocketFor is the scratch socket beside a service's gRPC socket
// at addr: <name>.scratch.sock for <name>.sock, "" when addr is not a
// Unix socket path (see SocketFor).
func ScratchSocketFor(addr string) string {
	p := SocketFor(addr)
	if p == "" {
		return ""
	}
	return p[:len(p)-len(".files.sock")] + ".scratch.sock"
}
