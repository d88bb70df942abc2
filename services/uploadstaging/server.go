package uploadstaging

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/bulkcodec"
	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/configschema"
	"github.com/clawmesh/clawmesh/internal/filepass"
	"github.com/clawmesh/clawmesh/internal/ids"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/steptrace"
	"github.com/clawmesh/clawmesh/internal/uploads"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
	uploadv1 "github.com/clawmesh/clawmesh/proto/clawmesh/upload/v1"
)

// Authorizer answers whether a principal holds a permission: nil, or a
// PermissionDenied status ready for the gateway. configclient.Client is
// the production one.
type Authorizer interface {
	Authorize(ctx context.Context, p *commonv1.Principal, permission, resource string) error
}

// Config is what the service is built from.
type Config struct {
	// Sessions stores files (StoreFile) and checks begins (CheckUpload).
	// StoreFile must not keep its request's Data once it returns: the
	// buffer goes to a later upload (a gRPC client has sent it by then).
	Sessions sessionv1.SessionServiceClient
	// Authz checks files:create on each chunk; nil lets every principal.
	Authz Authorizer
	// Settings reads uploads.* from the live config.
	Settings func() configclient.Uploads
	// Lease is how long a gateway's uploads outlive its last renewal
	// (default DefaultLease).
	Lease time.Duration
	// MaxConcurrentStores bounds the files handed to the session service
	// at once: each is copied once more onto the wire (default 4).
	MaxConcurrentStores int
	Log                 *zap.Logger
	// Chunks is the server's codec when it reads a chunk's bytes into
	// kept buffers (cmd/upload-staging): Chunk gives them back once
	// copied into the upload. nil when the bytes are grpc's.
	Chunks *bulkcodec.Codec
	// Files is the codec of the Sessions client (cmd/upload-staging):
	// Commit lends it the upload's bytes, which StoreFile's request is
	// then sent from, uncopied. nil when grpc's codec marshals it.
	Files *bulkcodec.Codec
	// FileSocket, when set, is the session service's file socket
	// (internal/filepass): uploads of a MiB or more are then held in
	// memfds, and a commit hands the descriptor over there, StoreFile
	// naming its token, instead of copying the bytes into StoreFile's
	// message. Where the hand-over fails the bytes go in the message.
	FileSocket string
	// ScratchSocket, when set, is where gateways on this host pass the
	// scratch memfds their connections decode chunks into
	// (internal/filepass): a chunk that names one is read from it
	// instead of from its message, under the same checks. Each scratch
	// held is charged to the staging budget and gives way to uploads
	// (Stage.ChargeScratch). A socket that cannot be made leaves every
	// chunk to come in its message, as the gateway falls back to.
	ScratchSocket string
	// Now is the clock (tests); nil is time.Now.
	Now func() time.Time
	// Transports, when set, is the stats handler of the server this
	// service is registered on (cmd/upload-staging): it tells the stage
	// when a gateway's transport closes.
	Transports *Transports
}

// Transports is a gRPC stats handler that names each transport (client
// connection) the server accepts, and tells the stage when one closes
// (Stage.TransportClosed). A gateway that dies closes its transport at
// once; its lease would hold its uploads, and their user's share, for
// as long again.
type Transports struct {
	next  atomic.Uint64
	stage atomic.Pointer[Stage]
}

type transportKey struct{}

// transportOf is the transport a call came over, 0 when unknown.
func transportOf(ctx context.Context) uint64 {
	n, _ := ctx.Value(transportKey{}).(uint64)
	return n
}

// TagConn names a new transport.
func (t *Transports) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return context.WithValue(ctx, transportKey{}, t.next.Add(1))
}

// HandleConn tells the stage a transport closed.
func (t *Transports) HandleConn(ctx context.Context, cs stats.ConnStats) {
	if _, end := cs.(*stats.ConnEnd); !end {
		return
	}
	if st, n := t.stage.Load(), transportOf(ctx); st != nil && n != 0 {
		st.TransportClosed(n)
	}
}

// TagRPC does nothing: only transports are followed.
func (t *Transports) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

// HandleRPC does nothing.
func (t *Transports) HandleRPC(context.Context, stats.RPCStats) {}

// Server implements uploadv1.UploadServiceServer.
type Server struct {
	uploadv1.UnimplementedUploadServiceServer

	cfg     Config
	log     *zap.Logger
	stage   *Stage
	stores  chan struct{}
	answers answers
	// scratches holds the scratches passed on cfg.ScratchSocket; nil
	// without one.
	scratches *filepass.Scratches
}

// maxAnswers bounds the committed uploads' answers kept (answers): some
// 1,024 file entries of a few hundred bytes each.
const maxAnswers = 1024

// answers keeps the file entry each committed upload was answered with,
// for the idle time (uploads.idle_timeout_secs) after its commit, so a
// commit sent again gets it again. A client whose commit reply was lost
// (its connection dropped as the reply was written) commits again, from
// the same connection or a new one; it was told "Unknown or expired
// upload", as if the file it had stored were lost. Only the principal
// that committed it is answered; the oldest answers go first past
// maxAnswers; a commit sent again after that, or after this process
// restarted, is answered from the session service (committedBefore).
type answers struct {
	mu    sync.Mutex
	byID  map[string]answer
	order []string // ids, oldest first
}

type answer struct {
	principal string
	file      *sessionv1.FileEntry
	at        time.Time
}

// keep records the answer of upload id's commit.
func (a *answers) keep(id, principal string, file *sessionv1.FileEntry, now time.Time, ttl time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.byID == nil {
		a.byID = map[string]answer{}
	}
	a.expireLocked(now, ttl)
	if len(a.order) == maxAnswers {
		delete(a.byID, a.order[0])
		a.order = slices.Delete(a.order, 0, 1)
	}
	a.byID[id] = answer{principal: principal, file: file, at: now}
	a.order = append(a.order, id)
}

// get returns the file upload id's commit answered principal with, or
// nil.
func (a *answers) get(id, principal string, now time.Time, ttl time.Duration) *sessionv1.FileEntry {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.expireLocked(now, ttl)
	if ans, ok := a.byID[id]; ok && ans.principal == principal {
		return ans.file
	}
	return nil
}

// expireLocked drops the answers older than ttl.
func (a *answers) expireLocked(now time.Time, ttl time.Duration) {
	n := 0
	for n < len(a.order) && now.Sub(a.byID[a.order[n]].at) >= ttl {
		delete(a.byID, a.order[n])
		n++
	}
	a.order = slices.Delete(a.order, 0, n)
}

// New builds the service.
func New(cfg Config) (*Server, error) {
	if cfg.Sessions == nil || cfg.Settings == nil {
		return nil, errors.New("upload-staging: a session client and the live settings are required")
	}
	if cfg.MaxConcurrentStores <= 0 {
		cfg.MaxConcurrentStores = 4
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	s := &Server{
		cfg: cfg, log: cfg.Log, stage: NewStage(cfg.Settings, cfg.Lease, cfg.Now, cfg.Log),
		stores: make(chan struct{}, cfg.MaxConcurrentStores),
	}
	if cfg.Transports != nil {
		cfg.Transports.stage.Store(s.stage)
	}
	s.stage.memfds = cfg.FileSocket != ""
	if cfg.ScratchSocket != "" {
		sc, err := filepass.ListenScratches(cfg.ScratchSocket, filepass.ScratchOptions{Budget: s.stage})
		if err != nil {
			s.log.Warn("scratch socket not made, chunks come in messages", zap.String("path", cfg.ScratchSocket), zap.Error(err))
		} else {
			s.scratches = sc
			s.stage.scratches = sc
			s.stage.lapsed = sc.DropGateway
		}
	}
	return s, nil
}

// heldScratches is how many scratches the receiver holds.
func (s *Server) heldScratches() int {
	if s.scratches == nil {
		return 0
	}
	return s.scratches.Held()
}

// Scratches is the scratch receiver, nil without one.
func (s *Server) Scratches() *filepass.Scratches { return s.scratches }

// Close stops the scratch socket and drops the scratches held.
func (s *Server) Close() error {
	if s.scratches == nil {
		return nil
	}
	return s.scratches.Close()
}

// Stage is the server's staged uploads.
func (s *Server) Stage() *Stage { return s.stage }

// Run expires idle uploads and lapsed gateway leases until ctx ends.
func (s *Server) Run(ctx context.Context) { s.stage.Run(ctx) }

// owner reads and checks the caller's identity: ids the gateway made,
// which become map keys here and nothing else, but are checked all the
// same.
func owner(gateway, conn string, p *commonv1.Principal) (Owner, error) {
	if err := ids.Check(gateway); err != nil {
		return Owner{}, invalid("`gateway_id` " + err.Error())
	}
	if err := ids.Check(conn); err != nil {
		return Owner{}, invalid("`connection_id` " + err.Error())
	}
	if p.GetPrincipalId() == "" {
		return Owner{}, invalid("`principal` is required")
	}
	return Owner{Gateway: gateway, Conn: conn, Principal: p.GetPrincipalId()}, nil
}

func checkSessionID(id string) error {
	if err := ids.Check(id); err != nil {
		return invalid("`session_id` " + err.Error())
	}
	return nil
}

// checkMIME refuses a declared mime_type the session service would
// refuse when it stores the file, before any byte is sent (a begin) or
// any file of a batch stored (an attach): checked only at the store, a
// whole upload was sent and then discarded for it. Its length is bounded
// as given, for it is kept and charged as given.
func checkMIME(m string) string {
	if _, ok := uploads.NormalizeMIME(m); !ok || len(m) > 127 {
		return uploads.BadMIME
	}
	return ""
}

// Begin is file/upload/begin: the declared upload is checked against the
// limits, the session service checks the session and the principal
// (CheckUpload), and the upload's charge is reserved.
func (s *Server) Begin(ctx context.Context, req *uploadv1.BeginRequest) (*uploadv1.BeginResponse, error) {
	o, err := owner(req.GetGatewayId(), req.GetConnectionId(), req.GetPrincipal())
	if err != nil {
		return nil, err
	}
	if err := checkSessionID(req.GetSessionId()); err != nil {
		return nil, err
	}
	sum, err := s.stage.CheckDeclared(req.GetSizeBytes(), req.GetFilename(), req.GetSha256())
	if err != nil {
		return nil, err
	}
	if msg := checkMIME(req.GetMimeType()); msg != "" {
		return nil, invalid(msg)
	}
	d := Declared{
		Owner: o, SessionID: req.GetSessionId(), Size: req.GetSizeBytes(), Filename: req.GetFilename(), MIME: req.GetMimeType(), SHA256: sum,
		Operator: req.GetPrincipal().GetOperator(),
	}
	if err := s.stage.CheckRoom(d); err != nil {
		return nil, err
	}
	chk, err := s.cfg.Sessions.CheckUpload(ctx, &sessionv1.CheckUploadRequest{Principal: req.GetPrincipal(), SessionId: req.GetSessionId(), SizeBytes: req.GetSizeBytes(), Sha256: sum})
	if err != nil {
		return nil, fromSessions(err)
	}
	d.Generation, d.Incarnation, d.SessionOwner, d.Agent = chk.GetGeneration(), chk.GetIncarnation(), chk.GetOwner(), chk.GetAgentAlias()
	id, err := s.stage.Reserve(d)
	if err != nil {
		return nil, err
	}
	s.stage.SeenOn(o.Gateway, transportOf(ctx))
	lim := s.stage.Limits()
	s.log.Debug("upload begun", zap.String("upload_id", id), zap.String("session_id", req.GetSessionId()),
		zap.String("conn", o.Conn), zap.Int64("size_bytes", req.GetSizeBytes()))
	return &uploadv1.BeginResponse{UploadId: id, ChunkBytes: lim.ChunkBytes, MaxBytes: lim.MaxFileBytes}, nil
}

// Chunk is file/upload/chunk. It needs files:create, like every upload
// method.
func (s *Server) Chunk(ctx context.Context, req *uploadv1.ChunkRequest) (*uploadv1.ChunkResponse, error) {
	defer s.cfg.Chunks.Release(req.GetData()) // the stage copies what it keeps
	o, err := owner(req.GetGatewayId(), req.GetConnectionId(), req.GetPrincipal())
	if err != nil {
		return nil, err
	}
	if p := req.GetPrincipal(); !p.GetOperator() && s.cfg.Authz != nil {
		if err := s.cfg.Authz.Authorize(ctx, p, configschema.PermFilesCreate, ""); err != nil {
			if errors.Is(err, configclient.ErrConfigUnavailable) {
				// Named as the dependency's failure: a bare Unavailable
				// reached the client as "upload-staging unavailable".
				return nil, rpcerr.Error(codes.Unavailable, rpcerr.ReasonDependency, rpcerr.NoIndex,
					"config service unavailable (authorizing files:create)")
			}
			return nil, err
		}
	}
	defer steptrace.Since("upload-staging", "chunk", time.Now())
	if req.GetScratchToken() != "" {
		return s.chunkFromScratch(o, req)
	}
	received, err := s.stage.Chunk(o, req.GetUploadId(), req.GetOffset(), req.GetData())
	if err != nil {
		return nil, err
	}
	return &uploadv1.ChunkResponse{ReceivedBytes: received}, nil
}

// chunkFromScratch is a chunk whose bytes are the first scratch_length of
// the caller's scratch: the stage copies them in under every check a
// chunk in a message gets. The scratch is its gateway connection's alone
// (its token, bound to the gateway and connection ids), mapped read-only
// and sealed against a change of size; its sender writes it again only
// after this call answered.
func (s *Server) chunkFromScratch(o Owner, req *uploadv1.ChunkRequest) (*uploadv1.ChunkResponse, error) {
	if len(req.GetData()) > 0 {
		return nil, invalid(uploads.ScratchAndData)
	}
	if s.scratches == nil {
		return nil, rpcerr.Error(codes.FailedPrecondition, rpcerr.ReasonInvalid, rpcerr.NoIndex, uploads.ScratchUnknown)
	}
	var received int64
	err := s.scratches.Read(req.GetScratchToken(), filepass.ScratchBinding{Gateway: o.Gateway, Conn: o.Conn}, req.GetScratchLength(),
		func(data []byte) error {
			var err error
			received, err = s.stage.Chunk(o, req.GetUploadId(), req.GetOffset(), data)
			return err
		})
	switch {
	case errors.Is(err, filepass.ErrScratchUnknown):
		return nil, rpcerr.Error(codes.FailedPrecondition, rpcerr.ReasonInvalid, rpcerr.NoIndex, uploads.ScratchUnknown)
	case errors.Is(err, filepass.ErrTooLarge):
		return nil, invalid(uploads.ChunkSize(min(s.stage.Limits().ChunkBytes, filepass.ScratchBytes)))
	case err != nil:
		return nil, err
	}
	return &uploadv1.ChunkResponse{ReceivedBytes: received}, nil
}

// Commit is file/upload/commit: a complete upload goes to the session
// service's StoreFile, bound to the session it began in, and leaves the
// stage. A store refused (grant revoked, session changed) discards it; a
// store that failed for a passing reason (the session service
// unreachable) keeps it for another commit.
func (s *Server) Commit(ctx context.Context, req *uploadv1.CommitRequest) (*uploadv1.CommitResponse, error) {
	o, err := owner(req.GetGatewayId(), req.GetConnectionId(), req.GetPrincipal())
	if err != nil {
		return nil, err
	}
	ttl := s.stage.Limits().IdleTimeout
	if f := s.answers.get(req.GetUploadId(), o.Principal, s.stage.now(), ttl); f != nil {
		return &uploadv1.CommitResponse{File: f}, nil
	}
	start := time.Now()
	p, err := s.stage.Take(o, req.GetUploadId())
	steptrace.Since("upload-staging", "commit.take", start)
	if err != nil {
		if !isUnknown(err, req.GetUploadId()) {
			return nil, err
		}
		return s.committedBefore(ctx, req, err)
	}
	// Taken, the upload is committed whoever still waits for the answer.
	// A caller gone (a client that closed its connection mid-commit: the
	// gateway cancels its call and discards its uploads) cancelled the
	// store, and the session service, whose write outlives its caller,
	// could have stored the file while this commit saw only its own
	// cancelled call: it kept no answer, and the client's commit sent
	// again from a new connection read "Unknown or expired upload".
	// Run to its end, the commit keeps its answer for that retry.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	d := p.Decl
	sreq := &sessionv1.StoreFileRequest{
		Principal: req.GetPrincipal(), SessionId: d.SessionID, Generation: d.Generation, Incarnation: d.Incarnation,
		Owner: d.SessionOwner, AgentAlias: d.Agent, Filename: d.Filename, MimeType: d.MIME,
		MaxBytes: s.stage.Limits().MaxFileBytes, UploadId: p.ID, Sha256: d.SHA256,
	}
	start = time.Now()
	entry, reusable, err := s.storeUpload(ctx, sreq, p)
	steptrace.Since("upload-staging", "commit.store", start)
	keep := err != nil && passing(err)
	if err == nil {
		// Kept before the upload leaves the stage, so that a commit
		// sent again meanwhile is told it is being committed, then
		// gets this answer, and is never told it is unknown.
		s.answers.keep(p.ID, o.Principal, entry, s.stage.now(), ttl)
	}
	s.stage.Finish(p.ID, keep, reusable)
	if err != nil {
		s.log.Info("upload commit refused", zap.String("upload_id", p.ID), zap.Bool("kept", keep), zap.Error(err))
		return nil, err
	}
	return &uploadv1.CommitResponse{File: entry}, nil
}

// storeUpload stores a taken upload: its memfd handed over when it has
// one and the session service's file socket takes it, else its bytes in
// the message, as before there was a socket. reusable says nothing reads
// the upload's buffer any more (see Stage.Finish).
func (s *Server) storeUpload(ctx context.Context, req *sessionv1.StoreFileRequest, p Pending) (entry *sessionv1.FileEntry, reusable bool, err error) {
	if p.File != nil && s.cfg.FileSocket != "" {
		var handed bool
		entry, handed, err = s.storeHandedOver(ctx, req, p)
		if handed {
			// The memfd goes to a later upload only once the session
			// service answered a store, which took the token first:
			// after a failure its late read could see the next
			// upload's bytes.
			return entry, err == nil, err
		}
		// The copy is what gRPC is lent: Finish unmaps the memfd,
		// and a loan not given back would be read after it.
		req.Data = bytes.Clone(p.Data)
		entry, err = s.store(ctx, req, nil)
		return entry, false, err
	}
	loan := s.cfg.Files.Lend(p.Data)
	req.Data = p.Data
	entry, err = s.store(ctx, req, nil)
	return entry, loan.Return(), err
}

// storeHandedOver passes the upload's memfd to the session service's
// file socket and stores it by its token, within one store slot so that
// the token does not wait for a slot. handed is false when the bytes
// must go in the message instead: the socket is missing or refused the
// pass, or StoreFile did not know the token (the session service
// restarted since the pass, or the token expired).
func (s *Server) storeHandedOver(ctx context.Context, req *sessionv1.StoreFileRequest, p Pending) (entry *sessionv1.FileEntry, handed bool, err error) {
	handed = true
	entry, err = s.store(ctx, req, func() bool {
		defer steptrace.Since("upload-staging", "commit.pass", time.Now())
		tok, perr := filepass.Pass(ctx, s.cfg.FileSocket, p.File, p.Decl.Size,
			filepass.Binding{Upload: p.ID, Principal: req.GetPrincipal().GetPrincipalId()})
		if perr != nil {
			s.log.Debug("upload not handed over, its bytes are sent", zap.String("upload_id", p.ID), zap.Error(perr))
			handed = false
			return false
		}
		if hook := passedHook.Load(); hook != nil {
			(*hook)()
		}
		req.FileToken, req.FileSize = tok, p.Decl.Size
		return true
	})
	if handed && handOverRefused(err) {
		s.log.Info("file hand-over refused, the upload's bytes are sent", zap.String("upload_id", p.ID), zap.Error(err))
		req.FileToken, req.FileSize = "", 0
		return nil, false, nil
	}
	return entry, handed, err
}

// passedHook, when set (tests only), runs once a commit's memfd is
// passed and before StoreFile names its token.
var passedHook atomic.Pointer[func()]

// handOverRefused reports whether err is StoreFile's refusal of a file
// token: the file was not stored, and may be sent in the message.
func handOverRefused(err error) bool {
	st, ok := status.FromError(err)
	return ok && err != nil && st.Code() == codes.FailedPrecondition && st.Message() == uploads.HandOverUnknown
}

// isUnknown reports whether err is the stage's refusal of id as unknown.
func isUnknown(err error, id string) bool {
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.InvalidArgument && st.Message() == uploads.UnknownUpload(id)
}

// committedBefore answers a commit of an upload the stage does not know
// (refusal): the entry its store answered, if the session service
// recorded the principal's upload id beside a stored file. The answers
// kept here are lost when this process restarts, after a store whose
// reply its client never saw; the client's commit sent again then read
// "Unknown or expired upload" although its file was stored. An id not
// of an upload id's form is not sent on.
func (s *Server) committedBefore(ctx context.Context, req *uploadv1.CommitRequest, refusal error) (*uploadv1.CommitResponse, error) {
	if !ids.LowerHex(req.GetUploadId(), uploads.IDHexLen) {
		return nil, refusal
	}
	resp, err := s.cfg.Sessions.CommittedUpload(ctx, &sessionv1.CommittedUploadRequest{Principal: req.GetPrincipal(), UploadId: req.GetUploadId()})
	if err != nil {
		if passing(err) {
			// Whether the file was stored is not known: the client
			// may try again, where "unknown" would tell it to upload
			// again.
			return nil, fromSessions(err)
		}
		s.log.Warn("committed upload not read", zap.String("upload_id", req.GetUploadId()), zap.Error(err))
		return nil, refusal
	}
	if resp.GetFile() == nil {
		return nil, refusal
	}
	return &uploadv1.CommitResponse{File: resp.GetFile()}, nil
}

// commitTimeout bounds a commit once its upload is taken, with no
// caller to end it: its wait for a store slot (MaxConcurrentStores) and
// the session service's store, whose write is bounded by 30 s.
const commitTimeout = 2 * time.Minute

// passing reports whether a failed store may succeed if tried again.
func passing(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Aborted, codes.Internal, codes.Unknown:
		return true
	}
	return false
}

// store hands one file to the session service, at most
// MaxConcurrentStores at once. prepare, when set, runs once a slot is
// held; when it returns false nothing is sent, and store returns nil,
// nil.
func (s *Server) store(ctx context.Context, req *sessionv1.StoreFileRequest, prepare func() bool) (*sessionv1.FileEntry, error) {
	select {
	case s.stores <- struct{}{}:
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	defer func() { <-s.stores }()
	if prepare != nil && !prepare() {
		return nil, nil
	}
	resp, err := s.cfg.Sessions.StoreFile(ctx, req)
	if err != nil {
		return nil, fromSessions(err)
	}
	return resp.GetFile(), nil
}

// fromSessions names the session service when a call to it failed below
// its answers (its process gone or not yet back): the edge names the
// service it called in such a failure, and would have blamed
// upload-staging. The session service's own refusals and its own named
// dependencies pass as they are; the code stays, so a commit keeps its
// upload for another try.
func fromSessions(err error) error {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return err
	}
	if reason, _ := rpcerr.Details(st); reason != "" {
		return err
	}
	return rpcerr.Error(codes.Unavailable, rpcerr.ReasonDependency, rpcerr.NoIndex, "session service unavailable")
}

// Attach is file/attach: whole files, each stored through StoreFile in
// turn. Every file is checked before the first is stored; a refusal
// names the file's index. The bytes sent are charged to the staging
// budget until they are stored.
func (s *Server) Attach(ctx context.Context, req *uploadv1.AttachRequest) (*uploadv1.AttachResponse, error) {
	if req.GetPrincipal().GetPrincipalId() == "" {
		return nil, invalid("`principal` is required")
	}
	if err := checkSessionID(req.GetSessionId()); err != nil {
		return nil, err
	}
	if len(req.GetFiles()) == 0 {
		return nil, invalid("`files` must list at least one file")
	}
	lim := s.stage.Limits()
	for i, f := range req.GetFiles() {
		var msg string
		switch {
		case f.GetPath() != "" && len(f.GetData()) > 0:
			msg = "send either `path` or `data_b64`, not both"
		case int64(len(f.GetData())) > lim.MaxFileBytes:
			msg = uploads.FileTooLarge(int64(len(f.GetData())), lim.MaxFileBytes)
		default:
			msg = uploads.CheckFilename(f.GetFilename())
			if msg == "" {
				msg = checkMIME(f.GetMimeType())
			}
		}
		if msg != "" {
			return nil, rpcerr.Error(codes.InvalidArgument, rpcerr.ReasonInvalid, i, msg)
		}
	}
	var held int64
	for _, f := range req.GetFiles() {
		held += int64(len(f.GetData()))
	}
	if held > 0 {
		release, err := s.stage.Hold(req.GetPrincipal().GetPrincipalId(), req.GetPrincipal().GetOperator(), held+UploadOverhead)
		if err != nil {
			return nil, err
		}
		defer release()
	}
	resp := &uploadv1.AttachResponse{}
	for i, f := range req.GetFiles() {
		entry, err := s.store(ctx, &sessionv1.StoreFileRequest{
			Principal: req.GetPrincipal(), SessionId: req.GetSessionId(), Filename: f.GetFilename(), MimeType: f.GetMimeType(),
			Data: f.GetData(), Path: f.GetPath(), MaxBytes: lim.MaxFileBytes,
		}, nil)
		if err != nil {
			return nil, atIndex(err, i, len(req.GetFiles()))
		}
		resp.Files = append(resp.Files, entry)
	}
	return resp, nil
}

// atIndex adds a file's index to a refusal of a batch of several files.
func atIndex(err error, i, n int) error {
	st, ok := status.FromError(err)
	if !ok || n == 1 || st.Code() == codes.Unavailable || st.Code() == codes.Internal || st.Code() == codes.DeadlineExceeded {
		return err
	}
	reason, _ := rpcerr.Details(st)
	return rpcerr.Error(st.Code(), reason, i, st.Message())
}

// DiscardConnection drops a closed connection's uploads at once.
func (s *Server) DiscardConnection(_ context.Context, req *uploadv1.DiscardConnectionRequest) (*uploadv1.DiscardConnectionResponse, error) {
	if err := ids.Check(req.GetGatewayId()); err != nil {
		return nil, invalid("`gateway_id` " + err.Error())
	}
	if err := ids.Check(req.GetConnectionId()); err != nil {
		return nil, invalid("`connection_id` " + err.Error())
	}
	n := s.stage.DiscardConnection(req.GetGatewayId(), req.GetConnectionId())
	if s.scratches != nil {
		s.scratches.DropConnection(filepass.ScratchBinding{Gateway: req.GetGatewayId(), Conn: req.GetConnectionId()})
	}
	if n > 0 {
		s.log.Info("uploads of a closed connection discarded", zap.String("conn", req.GetConnectionId()), zap.Int("uploads", n))
	}
	return &uploadv1.DiscardConnectionResponse{Discarded: int32(n)}, nil
}

// Renew extends a gateway's lease and says how long it lasts.
func (s *Server) Renew(ctx context.Context, req *uploadv1.RenewRequest) (*uploadv1.RenewResponse, error) {
	if err := ids.Check(req.GetGatewayId()); err != nil {
		return nil, invalid("`gateway_id` " + err.Error())
	}
	s.stage.Renew(req.GetGatewayId())
	s.stage.SeenOn(req.GetGatewayId(), transportOf(ctx))
	return &uploadv1.RenewResponse{LeaseMs: s.stage.Lease().Milliseconds()}, nil
}

// Stats reports what is staged.
func (s *Server) Stats(context.Context, *uploadv1.StatsRequest) (*uploadv1.StatsResponse, error) {
	st := s.stage.Stats()
	return &uploadv1.StatsResponse{
		Uploads: int32(st.Uploads), StagedBytes: st.Charged, BudgetBytes: st.Limit, PayloadBytes: st.Payload, Gateways: int32(st.Gateways),
		KeptBytes: st.Spare, ScratchBytes: st.Scratch, Scratches: int32(s.heldScratches()),
	}, nil
}
