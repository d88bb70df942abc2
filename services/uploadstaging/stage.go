// Package uploadstaging is the upload-staging service: chunked uploads
// held in this process's memory, under their limits (docs/spec.md §6), until
// commit hands them to the session service's StoreFile.
//
// What a client can make this process hold is bounded by the budget
// (uploads.max_staged_bytes). Each upload is charged, from begin, its
// whole declared size plus the metadata it keeps (see charge): the
// payload buffer is allocated once at exactly the declared size, or is a
// finished upload's kept buffer of up to a quarter more and charged as
// such, so the charge is what it will ever hold, and a begin that does
// not fit is refused (after dropping kept buffers and reclaiming idle
// uploads) rather than a later chunk. file/attach's bytes are charged too
// while they wait to be stored (Hold). Kept buffers count against the
// same budget, and so do the scratch memfds gateways pass (ChargeScratch):
// both give way to uploads.
//
// An upload belongs to the gateway connection that began it, named by
// the gateway process's id and the connection's id, and to the principal
// bound to that connection then. Anything else naming it is told it does
// not exist. A connection's uploads go when it closes (DiscardConnection),
// when they are idle past uploads.idle_timeout_secs, and when their
// gateway stops renewing its lease (it died: see Renew), or sooner once
// the gRPC transport its calls came over has closed (TransportClosed).
package uploadstaging

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"

	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/filepass"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/uploads"
)

// UploadOverhead is charged per upload besides its payload and its kept
// strings: a bound on the upload record itself (its struct and the slice
// header of its payload) and its entries in the stage's indexes (by id,
// by connection, and its gateway's lease). A test checks it against the
// record's real size.
const UploadOverhead = 512

// MaxStorableBytes bounds a file whatever uploads.max_file_bytes says: a
// file travels to the session service in one gRPC message, limited to
// 16 MiB (internal/grpcserver), less room for the rest of the request.
const MaxStorableBytes = 15 << 20

// DefaultLease is how long a gateway's uploads outlive its last renewal.
const DefaultLease = 15 * time.Second

// Owner is who may name an upload: the gateway process and its
// connection that began it, and the principal bound to it then.
type Owner struct {
	Gateway, Conn, Principal string
}

func (o Owner) connKey() string { return o.Gateway + "/" + o.Conn }

// Declared is a begin's request once the session service accepted it.
type Declared struct {
	Owner     Owner
	SessionID string
	Size      int64
	Filename  string
	MIME      string
	// SHA256 is the declared hash, normalized, or "".
	SHA256 string
	// Operator is set when the principal is the operator, whose uploads
	// uploads.max_user_staged_bytes does not bound.
	Operator bool
	// The session as CheckUpload saw it; StoreFile re-checks them.
	Generation, Incarnation int64
	SessionOwner, Agent     string
}

// gatewayLease is a gateway's: its last renewal and how many uploads it holds
// (a gateway without uploads has none).
type gatewayLease struct {
	renewed time.Time
	uploads int
	// transport is the gRPC transport (Transports) its last call came
	// over, 0 when unknown; cut is set once that transport closed and
	// no call came over another since: the gateway is gone.
	transport uint64
	cut       bool
}

// upload is one staged upload.
type upload struct {
	id    string
	owner Owner
	decl  Declared
	// data has capacity decl.Size from the first chunk on; len(data) is
	// the bytes received.
	data []byte
	// file is the memfd data is mapped from, when it is (Stage.memfds):
	// commit hands its descriptor over instead of copying the bytes
	// into a message. data is unmapped when file closes.
	file   *filepass.Buffer
	charge int64
	// userCharge is what the upload adds to its principal's staged bytes
	// (0 for the operator's).
	userCharge int64
	lastActive time.Time
	// committing is set while StoreFile runs: the upload is neither
	// expired nor reclaimed, and a discard leaves its charge for Finish to
	// release.
	committing bool
	// shared is set once a commit's call may still be reading data after
	// it returned (a loan grpc had not given back): the buffer is never
	// kept as a spare, where a later upload would write into it.
	shared bool
}

// charge is what an upload costs the budget: its declared payload and
// every string it keeps, plus UploadOverhead. An empty upload with a
// 255-byte filename still costs about 900 bytes, so no number of them
// holds memory for free.
func charge(id string, d Declared) int64 {
	n := d.Size + UploadOverhead
	for _, s := range []string{id, d.Owner.Gateway, d.Owner.Conn, d.Owner.Principal, d.SessionID, d.Filename, d.MIME, d.SHA256, d.SessionOwner, d.Agent} {
		n += int64(len(s))
	}
	return n
}

// Limits are the effective settings: uploads.* with the file limit
// capped at MaxStorableBytes.
func Limits(u configclient.Uploads) configclient.Uploads {
	u.MaxFileBytes = min(u.MaxFileBytes, MaxStorableBytes)
	return u
}

// Stage holds the staged uploads. Its methods are safe for concurrent
// use; one mutex guards everything, and no call holds it longer than a
// copy of one chunk.
type Stage struct {
	settings func() configclient.Uploads
	lease    time.Duration
	now      func() time.Time
	log      *zap.Logger

	mu       sync.Mutex
	uploads  map[string]*upload
	byConn   map[string]map[string]*upload
	gateways map[string]*gatewayLease
	// byUser is the charge each principal but the operator has staged;
	// an entry goes when it reaches zero.
	byUser  map[string]int64
	charged int64
	payload int64
	// spares are payload buffers of finished uploads, newest last, kept
	// for the next uploads of about their size (see takeSpareLocked);
	// spare is their bytes, counted against the budget beside charged.
	spares []spareBuf
	spare  int64
	// memfds has each upload of at least minSpareBytes held in a memfd
	// (Server's FileSocket set): its commit hands the descriptor to the
	// session service.
	memfds bool
	// lapsed, when set, is told of each gateway whose lease ran out
	// (Sweep), after its uploads are dropped: its scratches go too.
	lapsed func(gateway string)
	// scratch is what the scratches gateways passed are charged
	// (ChargeScratch): room the uploads leave, which they take back
	// (fitScratchesLocked through scratches' Evict). Atomic: it is given
	// back under the receiver's lock, which Evict takes under mu.
	scratch   atomic.Int64
	scratches interface{ Evict(need int64) }
}

// spareBuf is a kept payload buffer, its memfd when it has one, and
// when it was kept.
type spareBuf struct {
	buf  []byte
	file *filepass.Buffer
	kept time.Time
}

// A finished upload's buffer of at least minSpareBytes is kept, up to
// maxSpares of them, for spareIdle, and given to the next upload whose
// size it fits with at most a quarter to spare. A new buffer of megabytes
// lands on pages the process has never touched as often as not, and each
// of those pages costs a fault as a chunk is copied in (docs/performance.md,
// twenty-seventh round); a kept one has them already.
const (
	minSpareBytes = 1 << 20
	maxSpares     = 2
	spareIdle     = 30 * time.Second
)

// NewStage builds a stage on the live settings; lease <= 0 is
// DefaultLease and now nil is time.Now.
func NewStage(settings func() configclient.Uploads, lease time.Duration, now func() time.Time, log *zap.Logger) *Stage {
	if lease <= 0 {
		lease = DefaultLease
	}
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = zap.NewNop()
	}
	return &Stage{
		settings: settings, lease: lease, now: now, log: log,
		uploads: map[string]*upload{}, byConn: map[string]map[string]*upload{}, gateways: map[string]*gatewayLease{},
		byUser: map[string]int64{},
	}
}

// Limits are the settings in force now.
func (st *Stage) Limits() configclient.Uploads { return Limits(st.settings()) }

// Lease is how long a gateway's uploads outlive its last renewal.
func (st *Stage) Lease() time.Duration { return st.lease }

func invalid(msg string) error {
	return rpcerr.Error(codes.InvalidArgument, rpcerr.ReasonInvalid, rpcerr.NoIndex, msg)
}
func capacity(msg string) error {
	return rpcerr.Error(codes.InvalidArgument, rpcerr.ReasonCapacity, rpcerr.NoIndex, msg)
}
func unknown(id string) error {
	return rpcerr.Error(codes.InvalidArgument, rpcerr.ReasonNotFound, rpcerr.NoIndex, uploads.UnknownUpload(id))
}

// CheckDeclared refuses a begin whose declared fields break the limits,
// before anyone is asked about the session. It returns the normalized
// hash.
func (st *Stage) CheckDeclared(size int64, filename, sha string) (string, error) {
	lim := st.Limits()
	if size < 0 {
		return "", invalid("`size_bytes` must not be negative")
	}
	if size > lim.MaxFileBytes {
		return "", invalid(uploads.FileTooLarge(size, lim.MaxFileBytes))
	}
	if msg := uploads.CheckFilename(filename); msg != "" {
		return "", invalid(msg)
	}
	sum, ok := uploads.NormalizeSHA256(sha)
	if !ok {
		return "", invalid(uploads.BadSHA256)
	}
	return sum, nil
}

// CheckRoom refuses a begin on a connection already at its limit of
// staged uploads (its idle ones expired first), so a full connection does
// not cost a call to the session service. Reserve checks again. d is the
// begin as the client declared it (no session check yet): a begin that
// may resume an upload (resumableLocked) is let through.
func (st *Stage) CheckRoom(d Declared) error {
	lim := st.Limits()
	st.mu.Lock()
	defer st.mu.Unlock()
	key := d.Owner.connKey()
	st.expireConnLocked(key, lim)
	if len(st.byConn[key]) >= lim.MaxPerConnection && st.resumableLocked(d, false) == nil {
		return capacity(uploads.TooManyForConnection(lim.MaxPerConnection))
	}
	return nil
}

// resumableLocked returns the upload a begin of d resumes, or nil: one
// its connection stages, not being committed, declared with a hash
// (which commit has the session service check, so the bytes it holds
// are d's content or the commit refuses them) and with every other declared field the same;
// with checked, the session as CheckUpload saw it the same too.
//
// A client whose begin's reply was lost (its own timeout) sends it
// again: staged a second time, the same content was charged twice, and
// a user with room for it once was refused for content it had staged.
func (st *Stage) resumableLocked(d Declared, checked bool) *upload {
	if d.SHA256 == "" {
		return nil
	}
	for _, u := range st.byConn[d.Owner.connKey()] {
		e := u.decl
		if !checked {
			e.Generation, e.Incarnation, e.SessionOwner, e.Agent = d.Generation, d.Incarnation, d.SessionOwner, d.Agent
		}
		if !u.committing && e == d {
			return u
		}
	}
	return nil
}

// Reserve stages a new upload and returns its id (32 hexadecimal
// characters, random), or resumes the upload a begin of d sent again
// names (resumableLocked) and returns its id. The connection may hold MaxPerConnection uploads;
// the daemon MaxStagedBytes of charge. When the new upload does not fit,
// every upload idle past the idle timeout is reclaimed first, whichever
// connection holds it.
func (st *Stage) Reserve(d Declared) (string, error) {
	lim := st.Limits()
	var raw [uploads.IDHexLen / 2]byte
	_, _ = rand.Read(raw[:]) // crypto/rand.Read never fails on supported platforms
	id := hex.EncodeToString(raw[:])
	c := charge(id, d)

	st.mu.Lock()
	defer st.mu.Unlock()
	key := d.Owner.connKey()
	st.expireConnLocked(key, lim)
	if u := st.resumableLocked(d, true); u != nil {
		// Charged once, its bytes kept (sent again, they are
		// acknowledged). Not activity: begins sent again must not keep
		// an upload that gets no bytes.
		return u.id, nil
	}
	if len(st.byConn[key]) >= lim.MaxPerConnection {
		return "", capacity(uploads.TooManyForConnection(lim.MaxPerConnection))
	}
	if st.charged+st.spare+c > lim.MaxStagedBytes {
		st.dropSparesLocked(time.Time{})
	}
	if st.charged+c > lim.MaxStagedBytes {
		if n := st.reclaimIdleLocked(lim, true); n > 0 {
			st.log.Info("idle uploads reclaimed for a new one", zap.Int("reclaimed", n))
		}
	}
	if st.charged+c > lim.MaxStagedBytes {
		return "", capacity(uploads.OverBudget)
	}
	// One user's connections together stage at most their share, so that
	// one paired client opening connections cannot take the whole budget
	// from everyone else. Their own idle uploads were reclaimed above only
	// if the budget was short: reclaim them here too before refusing.
	var userCharge int64
	if !d.Operator {
		if err := st.chargeUserLocked(d.Owner.Principal, c, lim); err != nil {
			return "", err
		}
		userCharge = c
	}
	now := st.now()
	u := &upload{id: id, owner: d.Owner, decl: d, charge: c, userCharge: userCharge, lastActive: now}
	st.uploads[id] = u
	if st.byConn[key] == nil {
		st.byConn[key] = map[string]*upload{}
	}
	st.byConn[key][id] = u
	l := st.gateways[d.Owner.Gateway]
	if l == nil {
		l = &gatewayLease{}
		st.gateways[d.Owner.Gateway] = l
	}
	l.renewed = now
	l.uploads++
	st.charged += c
	st.fitScratchesLocked(lim)
	return id, nil
}

// ChargeScratch takes n bytes of the budget for a scratch memfd a
// gateway passed (filepass.ScratchBudget), in the room the uploads,
// attaches and kept buffers leave: what this process maps, scratches
// included, stays within uploads.max_staged_bytes. False: no room.
func (st *Stage) ChargeScratch(n int64) bool {
	lim := st.Limits()
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.charged+st.spare+st.scratch.Load()+n > lim.MaxStagedBytes {
		return false
	}
	st.scratch.Add(n)
	return true
}

// ReleaseScratch gives back a scratch's charge once it is unmapped.
func (st *Stage) ReleaseScratch(n int64) { st.scratch.Add(-n) }

// fitScratchesLocked has the scratches give way to what the budget holds
// besides them: after an upload or an attach took room, or the budget
// shrank, the least recently used are evicted until all fits. One being
// read gives its room back at its read's end, a chunk's copy later.
func (st *Stage) fitScratchesLocked(lim configclient.Uploads) {
	if over := st.charged + st.spare + st.scratch.Load() - lim.MaxStagedBytes; over > 0 && st.scratches != nil {
		st.scratches.Evict(over)
	}
}

// chargeUserLocked adds c to what principal stages, or refuses it past
// the user's share (its own idle uploads reclaimed first).
func (st *Stage) chargeUserLocked(principal string, c int64, lim configclient.Uploads) error {
	if st.byUser[principal]+c > lim.MaxUserStagedBytes {
		st.reclaimIdleLocked(lim, true)
	}
	if held := st.byUser[principal]; held+c > lim.MaxUserStagedBytes {
		return capacity(uploads.UserStagingFull(held, c, lim.MaxUserStagedBytes))
	}
	st.byUser[principal] += c
	return nil
}

// releaseUserLocked takes c from what principal stages.
func (st *Stage) releaseUserLocked(principal string, c int64) {
	if st.byUser[principal] -= c; st.byUser[principal] <= 0 {
		delete(st.byUser, principal)
	}
}

// Hold charges n bytes of a whole-file attach to the budget while it is
// stored, reclaiming idle uploads first when they do not fit, and returns
// the function that gives them back. The attach's bytes are already in
// memory; holding them in the budget bounds how many wait to be stored.
// They count in the principal's share too (but the operator's), as its
// uploads do: else one paired client sending attaches on many
// connections took the whole budget from everyone else's begins.
func (st *Stage) Hold(principal string, operator bool, n int64) (release func(), err error) {
	lim := st.Limits()
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.charged+st.spare+n > lim.MaxStagedBytes {
		st.dropSparesLocked(time.Time{})
	}
	if st.charged+n > lim.MaxStagedBytes {
		st.reclaimIdleLocked(lim, true)
	}
	if st.charged+n > lim.MaxStagedBytes {
		return nil, capacity(uploads.OverBudget)
	}
	if !operator {
		if err := st.chargeUserLocked(principal, n, lim); err != nil {
			return nil, err
		}
	}
	st.charged += n
	st.fitScratchesLocked(lim)
	var once sync.Once
	return func() {
		once.Do(func() {
			st.mu.Lock()
			st.charged -= n
			if !operator {
				st.releaseUserLocked(principal, n)
			}
			st.mu.Unlock()
		})
	}, nil
}

// lookupLocked returns the upload id names for o, or the unknown refusal;
// an upload found idle past the timeout is dropped and unknown.
func (st *Stage) lookupLocked(o Owner, id string, lim configclient.Uploads) (*upload, error) {
	u := st.uploads[id]
	if u == nil || u.owner != o {
		return nil, unknown(id)
	}
	if !u.committing && st.now().Sub(u.lastActive) >= lim.IdleTimeout {
		st.dropLocked(u)
		return nil, unknown(id)
	}
	return u, nil
}

// Chunk adds data at offset and returns the bytes received. offset must
// equal the bytes received so far; bytes already received and resent
// identically are acknowledged without change, so a client may retry
// after a lost reply.
func (st *Stage) Chunk(o Owner, id string, offset int64, data []byte) (int64, error) {
	lim := st.Limits()
	st.mu.Lock()
	defer st.mu.Unlock()
	u, err := st.lookupLocked(o, id, lim)
	if err != nil {
		return 0, err
	}
	n := int64(len(data))
	if n < 1 || n > lim.ChunkBytes {
		return 0, invalid(uploads.ChunkSize(lim.ChunkBytes))
	}
	received := int64(len(u.data))
	switch {
	case offset < 0:
		return 0, invalid("`offset` must not be negative")
	case offset > received:
		return 0, invalid(uploads.ChunkGap(offset, received))
	case offset < received:
		if offset+n <= received && bytes.Equal(u.data[offset:offset+n], data) {
			// Acknowledged, but not activity: only new bytes keep an
			// upload from going idle, or resending one chunk would hold
			// its charge for ever.
			return received, nil
		}
		return 0, invalid(uploads.ChunkOverlap(offset, received))
	case offset+n > u.decl.Size:
		return 0, invalid(uploads.ChunkPastSize(offset+n, u.decl.Size))
	}
	if u.data == nil {
		if sp, ok := st.takeSpareLocked(u.decl.Size); ok {
			// The upload holds the spare's bytes now instead of the
			// buffer it was charged for.
			extra := int64(cap(sp.buf)) - u.decl.Size
			u.data, u.file = sp.buf[:0], sp.file
			u.charge += extra
			st.charged += extra
		} else {
			u.data, u.file = st.newBufferLocked(u.decl.Size)
		}
	}
	u.data = append(u.data, data...)
	st.payload += n
	u.lastActive = st.now()
	return int64(len(u.data)), nil
}

// Pending is an upload handed to commit.
type Pending struct {
	ID   string
	Decl Declared
	Data []byte
	// File is the memfd Data is mapped from, or nil. Both stay valid
	// until Finish, and not a moment longer: Data is then unmapped or
	// written into by the next upload.
	File *filepass.Buffer
}

// Take hands a complete upload to commit: every declared byte received.
// The declared hash, if any, is not checked here: the session service
// hashes the content to name the file, and StoreFile compares its sum
// with the declared one (Commit passes it), refusing a mismatch, which
// Commit's Finish then discards. Checked here too, a 10 MB upload was
// hashed twice, the first time on the commit's path beside nothing.
// The upload stays staged, and charged, until Finish.
func (st *Stage) Take(o Owner, id string) (Pending, error) {
	lim := st.Limits()
	st.mu.Lock()
	u, err := st.lookupLocked(o, id, lim)
	if err != nil {
		// A commit sent again, from a new connection, by a client whose
		// connection closed while its first commit stores the upload:
		// not unknown, and its answer is kept once it is done (Server's
		// answers).
		if v := st.uploads[id]; v != nil && v.committing && v.decl.Owner.Principal == o.Principal {
			err = invalid(uploads.Committing(id))
		}
		st.mu.Unlock()
		return Pending{}, err
	}
	if received := int64(len(u.data)); received != u.decl.Size {
		u.lastActive = st.now()
		st.mu.Unlock()
		return Pending{}, invalid(uploads.Incomplete(received, u.decl.Size))
	}
	// One commit at a time: a second handed the same bytes outlived the
	// first's Finish, which gave the buffer to the next upload of its
	// size, and stored that upload's bytes (another connection's, another
	// principal's) in this one's session.
	if u.committing {
		st.mu.Unlock()
		return Pending{}, invalid(uploads.Committing(id))
	}
	u.committing = true
	p := Pending{ID: u.id, Decl: u.decl, Data: u.data, File: u.file}
	st.mu.Unlock()
	return p, nil
}

// Finish ends a commit that Take started: the upload is dropped, or kept
// for another commit when keep (the store failed for a reason that may
// pass). reusable says the commit's call no longer reads the upload's
// bytes (bulkcodec.Loan's Return); when false the buffer goes to the
// collector, now or whenever the upload is dropped, never to a spare.
func (st *Stage) Finish(id string, keep, reusable bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	u := st.uploads[id]
	if u == nil || !u.committing {
		return
	}
	u.committing = false
	if !reusable {
		u.shared = true
	}
	if u.owner == (Owner{}) {
		// Discarded during the commit: its charge waited for now.
		st.releaseLocked(u)
		return
	}
	if keep {
		u.lastActive = st.now()
		return
	}
	st.dropLocked(u)
}

// DiscardConnection drops every upload of a connection and reports how
// many there were.
func (st *Stage) DiscardConnection(gateway, conn string) int {
	st.mu.Lock()
	defer st.mu.Unlock()
	us := st.byConn[Owner{Gateway: gateway, Conn: conn}.connKey()]
	n := len(us)
	for _, u := range us {
		st.dropLocked(u)
	}
	return n
}

// Renew extends the lease of a gateway's uploads; a gateway without
// uploads holds no lease.
func (st *Stage) Renew(gateway string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if l := st.gateways[gateway]; l != nil {
		l.renewed = st.now()
	}
}

// SeenOn records that a call of gateway came over transport (0:
// unknown, nothing recorded): a gateway calling is not gone, whatever
// transport it called over before.
func (st *Stage) SeenOn(gateway string, transport uint64) {
	if transport == 0 {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if l := st.gateways[gateway]; l != nil {
		l.transport, l.cut = transport, false
	}
}

// TransportClosed marks gone every gateway whose last call came over
// transport: its process died (a gateway keeps one connection to this
// service for its life, renewing on it). Their uploads are reclaimed
// when a begin or an attach needs room, not left to their lease.
func (st *Stage) TransportClosed(transport uint64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, l := range st.gateways {
		if l.transport == transport {
			l.cut = true
		}
	}
}

// Sweep drops every upload idle past the timeout and every upload of a
// gateway whose lease ran out. It returns how many uploads it dropped.
func (st *Stage) Sweep() int {
	lim := st.Limits()
	st.mu.Lock()
	defer st.mu.Unlock()
	n := st.reclaimIdleLocked(lim, false)
	now := st.now()
	st.dropSparesLocked(now.Add(-spareIdle))
	st.fitScratchesLocked(lim)
	lapsed := map[string]bool{}
	for gw, l := range st.gateways {
		if now.Sub(l.renewed) > st.lease {
			lapsed[gw] = true
		}
	}
	if len(lapsed) == 0 {
		return n
	}
	counts := map[string]int{}
	for _, u := range st.uploads {
		if gw := u.owner.Gateway; lapsed[gw] {
			st.dropLocked(u)
			counts[gw]++
		}
	}
	for gw, dropped := range counts {
		st.log.Warn("gateway lease lapsed, its uploads discarded", zap.String("gateway_id", gw), zap.Int("uploads", dropped))
		n += dropped
	}
	if st.lapsed != nil {
		for gw := range lapsed {
			st.lapsed(gw)
		}
	}
	return n
}

// Run sweeps until ctx ends, often enough that neither the idle timeout
// nor a lease is overrun by much.
func (st *Stage) Run(ctx context.Context) {
	for {
		every := min(st.Limits().IdleTimeout/4, st.lease/4, 5*time.Second)
		every = max(every, 50*time.Millisecond)
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
		if n := st.Sweep(); n > 0 {
			st.log.Info("staged uploads expired", zap.Int("uploads", n))
		}
	}
}

// Stats is what is staged now. Charged is the uploads' and attaches'
// charge; Spare the kept buffers', and Scratch the scratches', which give
// way to them (see takeSpareLocked and ChargeScratch).
type Stats struct {
	Uploads, Gateways                       int
	Charged, Payload, Spare, Scratch, Limit int64
}

// Stats reports the staged uploads and the budget.
func (st *Stage) Stats() Stats {
	lim := st.Limits()
	st.mu.Lock()
	defer st.mu.Unlock()
	return Stats{Uploads: len(st.uploads), Gateways: len(st.gateways), Charged: st.charged, Payload: st.payload, Spare: st.spare, Scratch: st.scratch.Load(), Limit: lim.MaxStagedBytes}
}

// reclaimIdleLocked drops every upload idle past the timeout and, with
// cut (a begin or an attach that needs room), every upload of a gateway
// whose transport closed (TransportClosed): no one can name them again,
// and left to their lease they held their user's share, refusing that
// user's begins on the gateway started in the dead one's place. The
// sweep leaves those to the lease: a transport cut under a gateway that
// lives (a network between containers) is followed by its renewal on a
// new one, and only room wanted now is worth its uploads.
func (st *Stage) reclaimIdleLocked(lim configclient.Uploads, cut bool) int {
	now := st.now()
	n := 0
	for _, u := range st.uploads {
		if u.committing || u.owner == (Owner{}) {
			continue
		}
		if l := st.gateways[u.owner.Gateway]; now.Sub(u.lastActive) >= lim.IdleTimeout || (cut && l != nil && l.cut) {
			st.dropLocked(u)
			n++
		}
	}
	return n
}

// expireConnLocked drops a connection's uploads idle past the timeout.
func (st *Stage) expireConnLocked(key string, lim configclient.Uploads) {
	now := st.now()
	for _, u := range st.byConn[key] {
		if !u.committing && now.Sub(u.lastActive) >= lim.IdleTimeout {
			st.dropLocked(u)
		}
	}
}

// dropLocked takes an upload from its owner: out of the indexes, and
// its charge released. An upload under commit stays charged, with no
// owner, until Finish: its bytes are still held.
func (st *Stage) dropLocked(u *upload) {
	if u.owner == (Owner{}) {
		return
	}
	key := u.owner.connKey()
	delete(st.byConn[key], u.id)
	if len(st.byConn[key]) == 0 {
		delete(st.byConn, key)
	}
	if l := st.gateways[u.owner.Gateway]; l != nil {
		if l.uploads--; l.uploads == 0 {
			delete(st.gateways, u.owner.Gateway)
		}
	}
	u.owner = Owner{}
	if !u.committing {
		st.releaseLocked(u)
	}
}

// releaseLocked forgets an ownerless upload and releases its charge.
func (st *Stage) releaseLocked(u *upload) {
	delete(st.uploads, u.id)
	st.charged -= u.charge
	if u.userCharge > 0 {
		st.releaseUserLocked(u.decl.Owner.Principal, u.userCharge)
		u.userCharge = 0
	}
	st.payload -= int64(len(u.data))
	if c := int64(cap(u.data)); c >= minSpareBytes && !u.shared {
		if len(st.spares) == maxSpares {
			st.spare -= int64(cap(st.spares[0].buf))
			closeSpare(st.spares[0])
			st.spares = slices.Delete(st.spares, 0, 1)
		}
		st.spares = append(st.spares, spareBuf{buf: u.data, file: u.file, kept: st.now()})
		st.spare += c
	} else if u.file != nil {
		// Unmapped here whatever shared says: a memfd is never lent to
		// a gRPC call (a commit sends a copy when it cannot hand the
		// descriptor over), and a session service still holding it
		// reads the pages, which stay until its descriptor closes.
		u.file.Close()
	}
	u.data, u.file = nil, nil
}

// newBufferLocked is a new upload's payload buffer of size bytes: a
// memfd's mapped pages when the stage hands uploads over in memfds and
// one can be made, else the heap's.
func (st *Stage) newBufferLocked(size int64) ([]byte, *filepass.Buffer) {
	if st.memfds && size >= minSpareBytes {
		f, err := filepass.NewBuffer(size)
		if err == nil {
			return f.Bytes()[:0], f
		}
		st.log.Warn("memfd not made, the upload is held on the heap", zap.Error(err))
	}
	return make([]byte, 0, size), nil
}

// closeSpare lets go of a spare's memfd, if it has one; a heap buffer
// goes to the collector.
func closeSpare(sp spareBuf) {
	if sp.file != nil {
		sp.file.Close()
	}
}

// takeSpareLocked hands over the newest spare of at least size bytes
// and at most a quarter more, or reports none.
func (st *Stage) takeSpareLocked(size int64) (spareBuf, bool) {
	for i := len(st.spares) - 1; i >= 0; i-- {
		c := int64(cap(st.spares[i].buf))
		if c >= size && c-size <= size/4 {
			sp := st.spares[i]
			st.spares = slices.Delete(st.spares, i, i+1)
			st.spare -= c
			return sp, true
		}
	}
	return spareBuf{}, false
}

// dropSparesLocked lets go of the spares kept before cutoff; the zero
// time drops them all. Like every removal from spares it goes through
// package slices, which clears the vacated slots: a buffer left there
// would stay reachable, uncounted.
func (st *Stage) dropSparesLocked(cutoff time.Time) {
	st.spares = slices.DeleteFunc(st.spares, func(sp spareBuf) bool {
		if !cutoff.IsZero() && sp.kept.After(cutoff) {
			return false
		}
		st.spare -= int64(cap(sp.buf))
		closeSpare(sp)
		return true
	})
}
