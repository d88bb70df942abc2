package filepass

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
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

// scratchFileBytes is a scratch memfd's size: a page past ScratchBytes,
// for base64's decoder wants room for DecodedLen, up to two bytes more
// than a chunk of ScratchBytes decodes to.
const scratchFileBytes = ScratchBytes + 4096

// scratchSeals are the seals a scratch must carry: its size fixed, so
// that a mapping of it never reaches past its end (SIGBUS) whatever its
// sender does.
const scratchSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW

// Default bounds of the scratches a receiver holds: two a connection (one
// in use and one taking its place), 64 MiB in all.
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
// Bytes, its Close), its mapping's cap no pool's.
type Scratch struct{ *Buffer }

// NewScratch makes a scratch memfd of scratchFileBytes, sealed against
// any change of size, and maps it.
func NewScratch() (*Scratch, error) {
	b, err := newMapped("clawmesh-chunk", scratchFileBytes, scratchSeals|unix.F_SEAL_SEAL)
	if err != nil {
		return nil, err
	}
	return &Scratch{b}, nil
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
func PassScratch(ctx context.Context, path string, s *Scratch, bind ScratchBinding, replaces string) (string, error) {
	msg, err := json.Marshal(scratchHeader{ScratchBinding: bind, Replaces: replaces})
	if err != nil {
		return "", err
	}
	return passFD(ctx, path, s.fd, msg)
}

// mapped is a scratch held by the receiver.
type mapped struct {
	mem  []byte
	bind ScratchBinding
	used time.Time
	// refs counts the reads in progress; a scratch dropped meanwhile is
	// unmapped by the last of them.
	refs    int
	dropped bool
}

// Scratches is the receiver's side: the scratches passed to it, each
// mapped read-only, at most MaxPerConn a connection and Max in all (the
// least recently used goes first).
type Scratches struct {
	sock *socket
	max  int
	per  int
	now  func() time.Time

	mu    sync.Mutex
	held  map[string]*mapped
	byKey map[ScratchBinding][]string // tokens, oldest first
}

// ScratchOptions tunes a scratch receiver; zero values take the defaults.
type ScratchOptions struct {
	MaxPerConn, Max int
	// Now is the clock (tests); nil is time.Now.
	Now func() time.Time
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
	s := &Scratches{sock: sock, max: o.Max, per: o.MaxPerConn, now: o.Now,
		held: map[string]*mapped{}, byKey: map[ScratchBinding][]string{}}
	sock.serve(s.hold)
	return s, nil
}

// Close stops serving, waits for the serving goroutine and drops every
// scratch (those being read are unmapped by their reads' end).
func (s *Scratches) Close() error {
	err := s.sock.stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for tok := range s.held {
		s.dropLocked(tok)
	}
	return err
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
	mem, err := unix.Mmap(fd, 0, ScratchBytes, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return "", fmt.Errorf("map the passed scratch: %w", err)
	}
	// The mapping keeps the memfd; the descriptor is not needed.
	unix.Close(fd)
	var raw [TokenHexLen / 2]byte
	_, _ = rand.Read(raw[:])
	tok := hex.EncodeToString(raw[:])
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.held[h.Replaces]; old != nil && old.bind == h.ScratchBinding {
		s.dropLocked(h.Replaces)
	}
	for len(s.byKey[h.ScratchBinding]) >= s.per {
		s.dropLocked(s.byKey[h.ScratchBinding][0])
	}
	for len(s.held) >= s.max {
		s.dropLocked(s.leastUsedLocked())
	}
	s.held[tok] = &mapped{mem: mem, bind: h.ScratchBinding, used: s.now()}
	s.byKey[h.ScratchBinding] = append(s.byKey[h.ScratchBinding], tok)
	return tok, nil
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
	if m.refs == 0 {
		_ = unix.Munmap(m.mem)
		m.mem = nil
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
			_ = unix.Munmap(m.mem)
			m.mem = nil
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
