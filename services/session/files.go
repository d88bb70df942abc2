package session

// Files in session workspaces: CheckUpload (file/upload/begin's check),
// StoreFile (the one step every stored file goes through, file/attach and
// file/upload/commit alike) and the markers of session/prompt
// attachments. docs/spec.md §6; the shared limits and messages are in
// internal/uploads.
//
// StoreFile holds the session's lock, shared across processes, from its
// first check to its last write: one transaction that reads the session
// row FOR UPDATE. Close, kill, delete, reopen and every transcript append
// update that row, so each of them happens wholly before the store (which
// then sees the session changed and writes nothing) or wholly after it.
// Within that transaction, before asking the config service anything, it
// takes the policy lock shared (internal/policylock): a policy change or
// an unpairing committed after the checks waits until the file is
// stored, and one in progress is live before the checks read it.
//
// A stored file is <workspace>/uploads/<sha256 hex><.ext>, written to a
// temporary file in that folder and renamed into place. Every name is
// opened relative to its folder without following links, so a link the
// agent left in the workspace is replaced, never written through. The
// index (table session_files) keeps one row per content per session: a
// file is stored once however often it is sent.
//
// The SQL of this file is here rather than in store.go so that files stay
// one concern in one file; it touches the sessions row only to read and
// lock it.

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/configschema"
	"github.com/clawmesh/clawmesh/internal/filepass"
	"github.com/clawmesh/clawmesh/internal/grpcserver"
	"github.com/clawmesh/clawmesh/internal/ids"
	"github.com/clawmesh/clawmesh/internal/policylock"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/steptrace"
	"github.com/clawmesh/clawmesh/internal/uploads"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

const (
	// UploadsDir is the workspace folder stored files go in.
	UploadsDir = "uploads"
	// storeTimeout bounds one StoreFile: the session row and the policy
	// lock are held at most this long.
	storeTimeout = 30 * time.Second
	// maxExtLen bounds the extension a stored file keeps from its name.
	maxExtLen = 16
)

// errUnstableDir: a workspace folder kept changing while it was opened.
var errUnstableDir = errors.New("folder replaced while it was opened")

// storeChecked, when set (tests only), runs inside StoreFile once every
// check passed, before anything is written, with the session row and the
// policy lock held.
var storeChecked atomic.Pointer[func(sessionID string)]

// storeSync, when set (tests only), syncs a stored file's temporary file
// in place of (*os.File).Sync; storeRowsWritten, when set, runs once a
// store wrote its rows, before its transaction commits.
var (
	storeSync        atomic.Pointer[func(*os.File) error]
	storeRowsWritten atomic.Pointer[func()]
)

// syncTemp syncs a temporary file (storeSync in tests).
func syncTemp(f *os.File) error {
	if hook := storeSync.Load(); hook != nil {
		return (*hook)(f)
	}
	return f.Sync()
}

// fileSession is what storing a file needs of a session row.
type fileSession struct {
	ID, AgentAlias, Owner, State, WorkspaceDir string
	Generation, Incarnation                    int64
}

type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// readFileSession reads a session, locking its row when forUpdate (q must
// then be a transaction); errNoRow when there is none.
func readFileSession(ctx context.Context, q rowQuerier, id string, forUpdate bool) (fileSession, error) {
	sql := "SELECT agent_alias, owner, state, generation, incarnation, workspace_dir FROM sessions WHERE session_id = $1"
	if forUpdate {
		sql += " FOR UPDATE"
	}
	r := fileSession{ID: id}
	err := q.QueryRow(ctx, sql, id).Scan(&r.AgentAlias, &r.Owner, &r.State, &r.Generation, &r.Incarnation, &r.WorkspaceDir)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, errNoRow
	}
	if err != nil {
		return r, fmt.Errorf("read session: %w", err)
	}
	return r, nil
}

// errSessionChanged refuses a store into a session that is no longer the
// one the upload began in.
func errSessionChanged(id string) error {
	return rpcerr.Error(codes.NotFound, rpcerr.ReasonSessionNotFound, rpcerr.NoIndex,
		fmt.Sprintf("Session %s was closed or recreated since the upload began; begin the upload again", id))
}

// authorize asks the config service, reporting an unreachable one as
// Unavailable.
func (s *Server) authorize(ctx context.Context, p *commonv1.Principal, permission, resource string) error {
	err := s.cfg.Authz.Authorize(ctx, p, permission, resource)
	if errors.Is(err, configclient.ErrConfigUnavailable) {
		return configAway(permission)
	}
	return err
}

// mayCreateFiles refuses a principal without files:create; the config
// service also refuses a principal whose token was unpaired or whose
// binding no longer stands, so this is the credential's check too.
func (s *Server) mayCreateFiles(ctx context.Context, p *commonv1.Principal) error {
	if p.GetOperator() || s.cfg.Authz == nil {
		return nil
	}
	return s.authorize(ctx, p, configschema.PermFilesCreate, "")
}

// mayReadPath refuses a file named by path to all but the operator and
// an admin. The file is read as the daemon's user: another principal (a
// uid named by users.<name>.uid, a paired token) could otherwise copy the
// daemon's own secrets into a workspace, and learn from the refusals
// whether any file exists, its size and its hash. It runs before the file
// is opened.
func (s *Server) mayReadPath(ctx context.Context, p *commonv1.Principal) error {
	if p.GetOperator() {
		return nil
	}
	if s.cfg.Authz != nil {
		err := s.authorize(ctx, p, configschema.PermAdmin, "")
		if status.Code(err) != codes.PermissionDenied {
			return err
		}
	}
	return rpcerr.Error(codes.PermissionDenied, rpcerr.ReasonForbidden, rpcerr.NoIndex, uploads.PathForbidden)
}

// mayStoreIn refuses a principal that neither owns the session nor is an
// admin.
func (s *Server) mayStoreIn(ctx context.Context, p *commonv1.Principal, r fileSession) error {
	if p.GetOperator() || r.Owner == p.GetPrincipalId() {
		return nil
	}
	if s.cfg.Authz == nil {
		return errSessionNotOwned(r.ID)
	}
	err := s.authorize(ctx, p, configschema.PermAdmin, "")
	if status.Code(err) == codes.PermissionDenied {
		return errSessionNotOwned(r.ID)
	}
	return err
}

// mayUpload runs every check of docs/spec.md §6 for a principal and an open
// session: files:create (and the credential), ownership, agent use.
func (s *Server) mayUpload(ctx context.Context, p *commonv1.Principal, r fileSession) error {
	if r.State == stateClosed || r.State == stateKilled {
		return errSessionEnded(r.ID, r.State)
	}
	if err := s.mayStoreIn(ctx, p, r); err != nil {
		return err
	}
	return s.mayUseAgent(ctx, p, r.AgentAlias)
}

func checkSessionID(id string) error {
	if err := ids.Check(id); err != nil {
		return errInvalid("`session_id` " + err.Error())
	}
	return nil
}

// CheckUpload is file/upload/begin's check: the principal holds
// files:create, the session exists and is open, the principal owns it (or
// is an admin) and may use its agent. It returns what StoreFile later
// re-checks: the session's generation, incarnation, owner and agent.
func (s *Server) CheckUpload(ctx context.Context, req *sessionv1.CheckUploadRequest) (*sessionv1.CheckUploadResponse, error) {
	p := req.GetPrincipal()
	if err := requirePrincipal(p); err != nil {
		return nil, err
	}
	if err := checkSessionID(req.GetSessionId()); err != nil {
		return nil, err
	}
	if err := s.mayCreateFiles(ctx, p); err != nil {
		return nil, err
	}
	r, err := readFileSession(ctx, s.store.db, req.GetSessionId(), false)
	if errors.Is(err, errNoRow) {
		return nil, errSessionNotFound(req.GetSessionId())
	}
	if err != nil {
		return nil, err
	}
	if err := s.mayUpload(ctx, p, r); err != nil {
		return nil, err
	}
	sum, ok := uploads.NormalizeSHA256(req.GetSha256())
	if !ok {
		return nil, errInvalid(uploads.BadSHA256)
	}
	held, err := holdsContent(ctx, s.store.db, r.ID, sum)
	if err != nil {
		return nil, err
	}
	// Content the session holds is deduplicated when stored and takes no
	// new room: a client that lost its commit's reply and sends the file
	// again must not be refused for the room the file already has.
	if !held {
		if err := s.mayStoreBytes(ctx, r.Owner, req.GetSizeBytes()); err != nil {
			return nil, err
		}
	}
	return &sessionv1.CheckUploadResponse{Generation: r.Generation, Incarnation: r.Incarnation, AgentAlias: r.AgentAlias, Owner: r.Owner}, nil
}

// StoreFile stores one file into a session's workspace in one step under
// the session's lock (see the top of this file). A non-zero generation
// binds the store to the session an upload began in: the same generation,
// incarnation, owner and agent. Then, under the policy in force at that
// moment, the caller must hold files:create (with its credential still
// standing), own the session (or be an admin) and be allowed its agent.
// Only then is the file written, under its content hash, and indexed; any
// refusal leaves the workspace and the index as they were.
//
// A file the session already indexed is compared with its copy on disk: a
// copy edited, deleted or replaced by a link is written again (the link
// is replaced, its target untouched) and the entry reports deduplicated.
func (s *Server) StoreFile(ctx context.Context, req *sessionv1.StoreFileRequest) (*sessionv1.StoreFileResponse, error) {
	// Nothing keeps the bytes past the call: the file is written and
	// hashed before it returns.
	defer s.cfg.Files.Release(req.GetData())
	defer steptrace.Since("session", "storefile", time.Now())
	p := req.GetPrincipal()
	if err := requirePrincipal(p); err != nil {
		return nil, err
	}
	id := req.GetSessionId()
	if err := checkSessionID(id); err != nil {
		return nil, err
	}
	name := req.GetFilename()
	if name == "" {
		name = uploads.DefaultFilename
	}
	if msg := uploads.CheckFilename(name); msg != "" {
		return nil, errInvalid(msg)
	}
	mimeType, err := declaredMIME(req.GetMimeType())
	if err != nil {
		return nil, err
	}
	if u := req.GetUploadId(); u != "" && !ids.LowerHex(u, uploads.IDHexLen) {
		return nil, errInvalid(uploads.BadUploadID)
	}
	// The expected hash is upload-staging's copy of a begin's, which it
	// normalized: anything else is a caller's fault, refused before the
	// bytes are hashed.
	wantSum := req.GetSha256()
	if wantSum != "" && !ids.LowerHex(wantSum, 2*sha256.Size) {
		return nil, errInvalid(uploads.BadSHA256)
	}
	if req.GetPath() != "" {
		if err := s.mayReadPath(ctx, p); err != nil {
			return nil, err
		}
	}
	var data []byte
	var src *filepass.Mapped
	if req.GetFileToken() != "" {
		src, err = s.handedOver(req)
		defer src.Close()
	} else {
		data, err = fileContent(req)
	}
	if err != nil {
		return nil, err
	}
	size := int64(len(data))
	if src != nil {
		size = int64(len(src.Bytes()))
	} else if mimeType == "" {
		// A handed-over file's is guessed from what writeFile wrote:
		// its mapping is read by the kernel's write alone.
		mimeType = guessMIME(name, data)
	}
	// The checks are the caller's: a caller gone (a client that closed
	// its connection in the middle of a commit, a deadline) ends them.
	// The write and the commit are the store's own, bounded by
	// storeTimeout alone: cut between the rename and the commit, the
	// store left a file no row indexes, charged to no one.
	caller := ctx
	storeCtx, cancel := context.WithTimeout(context.WithoutCancel(caller), storeTimeout)
	defer cancel()
	ctx, cancelChecks := context.WithCancel(storeCtx)
	defer cancelChecks()
	defer context.AfterFunc(caller, cancelChecks)()
	var entry *sessionv1.FileEntry
	var placed bool
	start := time.Now()
	var written time.Time // the transaction's work done: its commit follows
	err = pgx.BeginFunc(storeCtx, s.store.db, func(tx pgx.Tx) error {
		defer func() { written = time.Now() }()
		r, err := readFileSession(ctx, tx, id, true)
		if errors.Is(err, errNoRow) {
			if req.GetGeneration() != 0 {
				return errSessionChanged(id)
			}
			return errSessionNotFound(id)
		}
		if err != nil {
			return err
		}
		if gen := req.GetGeneration(); gen != 0 {
			if r.Generation != gen || r.Incarnation != req.GetIncarnation() ||
				(req.GetOwner() != "" && r.Owner != req.GetOwner()) ||
				(req.GetAgentAlias() != "" && r.AgentAlias != req.GetAgentAlias()) {
				return errSessionChanged(id)
			}
		}
		if err := policylock.Shared(ctx, tx); err != nil {
			return err
		}
		if err := s.mayCreateFiles(ctx, p); err != nil {
			return err
		}
		if err := s.mayUpload(ctx, p, r); err != nil {
			return err
		}
		if hook := storeChecked.Load(); hook != nil {
			(*hook)(id)
		}
		if err := ctx.Err(); err != nil {
			return status.FromContextError(err).Err()
		}
		steptrace.Since("session", "store.checks", start)
		entry, placed, err = s.writeFile(storeCtx, tx, r, storedFile{data: data, src: src, size: size, name: name, mime: mimeType, principal: p.GetPrincipalId(), uploadID: req.GetUploadId(), sha256: wantSum})
		return err
	})
	if !written.IsZero() {
		steptrace.Since("session", "store.commit", written)
	}
	if err != nil {
		if placed {
			// The file is in place and its row is not (the commit
			// failed): the next store into the session removes it.
			s.forgetCleared(id)
		}
		return nil, err
	}
	s.log.Info("file stored", zap.String("session_id", id), zap.String("ref_id", entry.GetRefId()),
		zap.Int64("size_bytes", entry.GetSizeBytes()), zap.Bool("deduplicated", entry.GetDeduplicated()))
	return &sessionv1.StoreFileResponse{File: entry}, nil
}

// FileHandOverTTL is how long a file passed on the file socket waits for
// the StoreFile that names it: the store's own bound.
const FileHandOverTTL = storeTimeout

// errHandOver refuses a file token; upload-staging then sends the bytes.
func errHandOver() error {
	return rpcerr.Error(codes.FailedPrecondition, rpcerr.ReasonInvalid, rpcerr.NoIndex, uploads.HandOverUnknown)
}

// handedOver is the file a StoreFile names by its token (Config's
// FileReceiver), mapped read-only and not read: writeFile writes it into
// the workspace from the mapping and hashes the file it wrote, so
// whatever the sender does with its memfd meanwhile, the file is named
// by the bytes stored (and refused when a hash was declared and they are
// not those). Its memfd is sealed against shrinking (the receiver holds
// no other), so no page of the mapping is ever past its end. Any failure
// to take it is the hand-over's refusal, and the caller sends the bytes
// instead.
func (s *Server) handedOver(req *sessionv1.StoreFileRequest) (*filepass.Mapped, error) {
	if len(req.GetData()) > 0 || req.GetPath() != "" {
		return nil, errInvalid("send either `file_token` or the file's bytes, not both")
	}
	size := req.GetFileSize()
	if limit := req.GetMaxBytes(); limit > 0 && size > limit {
		return nil, errInvalid(uploads.FileTooLarge(size, limit))
	}
	// Never more than a message could have carried.
	if size <= 0 || size > grpcserver.MaxMessageBytes || s.cfg.FileReceiver == nil || req.GetUploadId() == "" {
		return nil, errHandOver()
	}
	bind := filepass.Binding{Upload: req.GetUploadId(), Principal: req.GetPrincipal().GetPrincipalId()}
	defer steptrace.Since("session", "store.take", time.Now())
	m, err := s.cfg.FileReceiver.TakeMapped(req.GetFileToken(), size, bind)
	if err != nil {
		s.log.Info("file hand-over refused", zap.String("upload_id", bind.Upload), zap.Error(err))
		return nil, errHandOver()
	}
	return m, nil
}

// fileContent is the file's bytes: data, or the local file at path (an
// absolute path; max_bytes is then required, as the bound of the read).
func fileContent(req *sessionv1.StoreFileRequest) ([]byte, error) {
	limit := req.GetMaxBytes()
	path := req.GetPath()
	if path == "" {
		if limit > 0 && int64(len(req.GetData())) > limit {
			return nil, errInvalid(uploads.FileTooLarge(int64(len(req.GetData())), limit))
		}
		return req.GetData(), nil
	}
	if len(req.GetData()) > 0 {
		return nil, errInvalid("send either `path` or `data_b64`, not both")
	}
	if !filepath.IsAbs(path) {
		return nil, errInvalid("`path` must be an absolute path")
	}
	if limit <= 0 {
		return nil, errInvalid("`max_bytes` is required with `path`")
	}
	// O_NONBLOCK: a FIFO must not hang the call; it is refused below.
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, errInvalid(fmt.Sprintf("`path` %s cannot be read: %s", path, pathErrText(err)))
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, errInvalid(fmt.Sprintf("`path` %s cannot be read: %s", path, pathErrText(err)))
	}
	if !st.Mode().IsRegular() {
		return nil, errInvalid(fmt.Sprintf("`path` %s is not a regular file", path))
	}
	if st.Size() > limit {
		return nil, errInvalid(uploads.FileTooLarge(st.Size(), limit))
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, errInvalid(fmt.Sprintf("`path` %s cannot be read: %s", path, pathErrText(err)))
	}
	if int64(len(data)) > limit {
		return nil, errInvalid(uploads.FileTooLarge(int64(len(data)), limit))
	}
	return data, nil
}

func pathErrText(err error) string {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

// declaredMIME checks and normalizes a client's mime_type: type/subtype,
// parameters dropped, lower case.
func declaredMIME(s string) (string, error) {
	if s == "" {
		return "", nil
	}
	mt, ok := uploads.NormalizeMIME(s)
	if !ok {
		return "", errInvalid(uploads.BadMIME)
	}
	return mt, nil
}

// guessMIME types a file sent without mime_type: by its name's extension,
// else by its first bytes.
func guessMIME(name string, data []byte) string {
	if ext := fileExt(name); ext != "" {
		if t := mime.TypeByExtension(ext); t != "" {
			if mt, _, err := mime.ParseMediaType(t); err == nil {
				return mt
			}
		}
	}
	if mt, _, err := mime.ParseMediaType(http.DetectContentType(data)); err == nil {
		return mt
	}
	return "application/octet-stream"
}

// fileExt is the extension a stored file keeps from its name: a dot and 1
// to 16 lower-case letters or digits, else nothing.
func fileExt(name string) string {
	ext := strings.ToLower(filepath.Ext(name))
	if len(ext) < 2 || len(ext) > maxExtLen+1 {
		return ""
	}
	for _, c := range ext[1:] {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return ""
		}
	}
	return ext
}

// storedFile is one file to store; uploadID, when set, is the chunked
// upload it comes from, recorded for principal (CommittedUpload).
type storedFile struct {
	name, mime string
	// data is the file's bytes, or nil when src is set: a handed-over
	// file, whose bytes its sender may still change, mapped. size is
	// the file's size, either way.
	data                []byte
	src                 *filepass.Mapped
	size                int64
	principal, uploadID string
	// sha256 is the hash the content must have (the upload's declared
	// one), or "": compared with the sum computed to name the file, so
	// that the content is hashed once, here, not also by upload-staging.
	sha256 string
}

// maxUploadsPerFile bounds the upload ids recorded beside one stored
// file: the same content committed again and again, each time from a
// new upload, is recorded for its newest uploads only.
const maxUploadsPerFile = 16

// CommittedUpload returns the entry the store of the principal's upload
// answered, while its file is stored (docs/spec.md §6): upload-staging
// asks it for a commit of an upload it does not know, sent again after
// it restarted. Another principal's upload is never answered.
func (s *Server) CommittedUpload(ctx context.Context, req *sessionv1.CommittedUploadRequest) (*sessionv1.CommittedUploadResponse, error) {
	if err := requirePrincipal(req.GetPrincipal()); err != nil {
		return nil, err
	}
	if !ids.LowerHex(req.GetUploadId(), uploads.IDHexLen) {
		return nil, errInvalid(uploads.BadUploadID)
	}
	var sum, name, mimeType, rel, workspace string
	var size int64
	var dedup bool
	err := s.store.db.QueryRow(ctx, `SELECT u.sha256, u.filename, u.mime_type, u.deduplicated, f.path, f.size_bytes, s.workspace_dir
		FROM session_file_uploads u
		JOIN session_files f ON f.session_id = u.session_id AND f.sha256 = u.sha256
		JOIN sessions s ON s.session_id = u.session_id
		WHERE u.principal = $1 AND u.upload_id = $2`,
		req.GetPrincipal().GetPrincipalId(), req.GetUploadId()).Scan(&sum, &name, &mimeType, &dedup, &rel, &size, &workspace)
	if errors.Is(err, pgx.ErrNoRows) {
		return &sessionv1.CommittedUploadResponse{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read committed upload: %w", err)
	}
	return &sessionv1.CommittedUploadResponse{File: fileEntry(workspace, rel, sum, name, mimeType, size, dedup)}, nil
}

// fileEntry is a stored file's entry: rel is its path in workspace.
func fileEntry(workspace, rel, sum, name, mimeType string, size int64, dedup bool) *sessionv1.FileEntry {
	path := filepath.Join(workspace, rel)
	return &sessionv1.FileEntry{
		RefId: uploads.RefID(sum), Marker: uploads.Marker(mimeType, name, path), WorkspacePath: path,
		SizeBytes: size, Deduplicated: dedup,
	}
}

// writeAheadMin is the size from which a file is written and synced
// while it is hashed, before its hash says whether the session holds it
// already: the SHA-256 of 10 MB takes 6 to 8 ms on the two cores the
// benchmarks run on, the write of a new file of 10 MB about 2 ms and its
// sync about 7 (the virtual disk's flush; docs/performance.md,
// "Thirty-sixth round"), and the sync waits on the disk, not a core, so
// the three overlap. A copy found already in place then costs a write and
// a flush it did not need, overlapped with the hash all the same: storing
// the same file again is the rarer case, and it takes no longer than a
// new file. Below 1 MiB the hash takes under a millisecond, less than
// creating and removing a file that turns out not to be needed; such a
// file is written, and synced, only once it is known to be kept. A
// handed-over file is written ahead whatever its size: its bytes are
// known only once written.
const writeAheadMin = 1 << 20

// writeFile writes f into the workspace unless an identical copy is
// already at its indexed path, and indexes it; tx holds the session row.
// placed reports a new file renamed into place, which no committed row
// names until tx commits.
//
// A file written ahead is written and synced on a goroutine of its own
// (aheadWrite) while this one hashes it, then reads the index, charges
// the owner and writes the rows, about a millisecond of round trips to
// PostgreSQL that the sync would otherwise wait for. None of it is
// visible until tx commits, after the file is synced, renamed into place
// and its folder synced: a sync that fails rolls the rows back, and a
// row that fails removes the file, which is still a temporary one.
func (s *Server) writeFile(ctx context.Context, tx pgx.Tx, r fileSession, f storedFile) (entry *sessionv1.FileEntry, placed bool, err error) {
	dir, err := openUploadsDir(r.WorkspaceDir)
	if err != nil {
		return nil, false, fmt.Errorf("open workspace of session %s: %w", r.ID, err)
	}
	defer unix.Close(dir)
	s.clearLeftovers(ctx, tx, r.ID, dir)

	var sum string
	var ahead *aheadWrite
	// Before the folder closes: it waits for the write and removes the
	// temporary file unless it was placed.
	defer func() { ahead.discard() }()
	start := time.Now()
	switch {
	case f.src != nil:
		if ahead, err = startAhead(dir, f.src.Bytes(), syncTemp); err != nil {
			return nil, false, fmt.Errorf("write file into session %s: %w", r.ID, err)
		}
		var head []byte
		if sum, head, err = ahead.hashWritten(f.size); err != nil {
			return nil, false, fmt.Errorf("write file into session %s: %w", r.ID, err)
		}
		if f.mime == "" {
			f.mime = guessMIME(f.name, head)
		}
	case len(f.data) >= writeAheadMin:
		if ahead, err = startAhead(dir, f.data, syncTemp); err != nil {
			return nil, false, fmt.Errorf("write file into session %s: %w", r.ID, err)
		}
		sum = uploads.Sum(f.data)
	default:
		sum = uploads.Sum(f.data)
	}
	steptrace.Since("session", "store.hash", start)
	if f.sha256 != "" && sum != f.sha256 {
		// Before the index and the charge: nothing is stored, and the
		// file written ahead is discarded (deferred above).
		return nil, false, errInvalid(uploads.HashMismatch)
	}
	start = time.Now()
	rel := UploadsDir + "/" + sum + fileExt(f.name)
	var indexed string
	err = tx.QueryRow(ctx, "SELECT path FROM session_files WHERE session_id = $1 AND sha256 = $2", r.ID, sum).Scan(&indexed)
	dedup := err == nil
	switch {
	case dedup:
		// Only paths this code wrote are indexed; anything else is not
		// followed.
		if dir, base := filepath.Split(indexed); dir != UploadsDir+"/" || !strings.HasPrefix(base, sum) {
			return nil, false, fmt.Errorf("index of session %s names %q for %s", r.ID, indexed, sum)
		}
		rel = indexed
	case !errors.Is(err, pgx.ErrNoRows):
		return nil, false, fmt.Errorf("read file index: %w", err)
	}

	if !dedup {
		// Charged before the file is placed: a refusal leaves nothing.
		if err := s.chargeStored(ctx, tx, r.Owner, f.size); err != nil {
			return nil, false, err
		}
	}
	steptrace.Since("session", "store.index+charge", start)
	start = time.Now()
	if err := s.writeRows(ctx, tx, r, f, sum, rel, dedup); err != nil {
		return nil, false, err
	}
	steptrace.Since("session", "store.rows", start)
	if hook := storeRowsWritten.Load(); hook != nil {
		(*hook)()
	}
	start = time.Now()
	base := filepath.Base(rel)
	same, err := sameContent(dir, base, sum, f.size)
	if err != nil {
		return nil, false, fmt.Errorf("compare stored file: %w", err)
	}
	if !same {
		var tmp *tempFile
		if ahead != nil {
			tmp, err = ahead.wait()
		} else {
			tmp, err = createTemp(dir, f.data)
			defer tmp.discard()
		}
		steptrace.Since("session", "store.synced", start)
		if err != nil {
			return nil, false, fmt.Errorf("write file into session %s: %w", r.ID, err)
		}
		start = time.Now()
		if err := tmp.placeAs(base); err != nil {
			return nil, tmp.placed && !dedup, fmt.Errorf("write file into session %s: %w", r.ID, err)
		}
		steptrace.Since("session", "store.place", start)
		// From here a file is in place that no committed row names.
		placed = !dedup
		if dedup {
			s.log.Info("workspace copy restored", zap.String("session_id", r.ID), zap.String("path", rel))
		}
	}
	return fileEntry(r.WorkspaceDir, rel, sum, f.name, f.mime, f.size, dedup), placed, nil
}

// writeRows indexes a new file (dedup false) and records the upload it
// came from, if any, in tx: nothing of it is visible until tx commits.
func (s *Server) writeRows(ctx context.Context, tx pgx.Tx, r fileSession, f storedFile, sum, rel string, dedup bool) error {
	if !dedup {
		if _, err := tx.Exec(ctx, `INSERT INTO session_files (session_id, sha256, path, size_bytes, filename, mime_type)
			VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (session_id, sha256) DO NOTHING`,
			r.ID, sum, rel, f.size, f.name, f.mime); err != nil {
			return fmt.Errorf("index file: %w", err)
		}
	}
	if f.uploadID == "" {
		return nil
	}
	// In the store's transaction: an answer recorded is a file stored,
	// and a file stored has its answer recorded.
	if _, err := tx.Exec(ctx, `INSERT INTO session_file_uploads (principal, upload_id, session_id, sha256, filename, mime_type, deduplicated)
		VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (principal, upload_id) DO NOTHING`,
		f.principal, f.uploadID, r.ID, sum, f.name, f.mime, dedup); err != nil {
		return fmt.Errorf("record upload: %w", err)
	}
	if dedup {
		if _, err := tx.Exec(ctx, `DELETE FROM session_file_uploads WHERE session_id = $1 AND sha256 = $2 AND seq < (
			SELECT min(seq) FROM (SELECT seq FROM session_file_uploads WHERE session_id = $1 AND sha256 = $2 ORDER BY seq DESC LIMIT $3) AS newest)`,
			r.ID, sum, maxUploadsPerFile); err != nil {
			return fmt.Errorf("bound recorded uploads: %w", err)
		}
	}
	return nil
}

// storedQuota is what a user's sessions may hold in stored files: the
// config's, or its defaults without one (tests).
func (s *Server) storedQuota() (bytes, files int64) {
	if s.cfg.Uploads == nil {
		return DefaultMaxUserStoredBytes, DefaultMaxUserStoredFiles
	}
	u := s.cfg.Uploads()
	return u.MaxUserStoredBytes, u.MaxUserStoredFiles
}

// Defaults of uploads.max_user_stored_bytes and uploads.max_user_stored_files.
const (
	DefaultMaxUserStoredBytes = 1 << 30
	DefaultMaxUserStoredFiles = 100000
)

// chargeStored adds a new stored file of n bytes to what its owner's
// sessions hold (table stored_usage), or refuses it when that would pass
// the owner's quota. Without one, a user stored any number of 10 MB files
// across its 10,000 sessions: a paired token could fill the daemon's
// disk. The operator is not charged.
//
// One statement checks and adds under the owner's row lock, held to the
// end of tx: two stores of one owner into different sessions (whose own
// locks do not order them) cannot both pass on the same room, and a store
// that fails later gives its charge back with its rollback.
func (s *Server) chargeStored(ctx context.Context, tx pgx.Tx, owner string, n int64) error {
	if owner == configschema.OperatorPrincipal {
		return nil
	}
	maxBytes, maxFiles := s.storedQuota()
	if n <= maxBytes && maxFiles > 0 {
		// A first file fits (the check above): it is inserted; any other
		// is added only within the quota.
		var charged bool
		err := tx.QueryRow(ctx, `INSERT INTO stored_usage AS u (owner, bytes, files) VALUES ($1, $2, 1)
			ON CONFLICT (owner) DO UPDATE SET bytes = u.bytes + EXCLUDED.bytes, files = u.files + 1
			WHERE u.bytes + EXCLUDED.bytes <= $3 AND u.files < $4
			RETURNING true`, owner, n, maxBytes, maxFiles).Scan(&charged)
		if err == nil {
			return nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("charge stored file: %w", err)
		}
	}
	held, files, err := storedUsage(ctx, tx, owner)
	if err != nil {
		return err
	}
	return storedFull(held, files, n, maxBytes, maxFiles)
}

// mayStoreBytes refuses, ahead of a store, a new file of n bytes (n > 0)
// its owner's quota has no room for now. It only reads: the store's
// chargeStored decides.
func (s *Server) mayStoreBytes(ctx context.Context, owner string, n int64) error {
	if n <= 0 || owner == configschema.OperatorPrincipal {
		return nil
	}
	maxBytes, maxFiles := s.storedQuota()
	held, files, err := storedUsage(ctx, s.store.db, owner)
	if err != nil {
		return err
	}
	if held+n > maxBytes || files >= maxFiles {
		return storedFull(held, files, n, maxBytes, maxFiles)
	}
	return nil
}

// holdsContent reports whether a session indexes the content whose
// SHA-256 is sum (hexadecimal; "" holds nothing).
func holdsContent(ctx context.Context, q rowQuerier, sessionID, sum string) (bool, error) {
	if sum == "" {
		return false, nil
	}
	var one int
	err := q.QueryRow(ctx, "SELECT 1 FROM session_files WHERE session_id = $1 AND sha256 = $2", sessionID, sum).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read file index: %w", err)
	}
	return true, nil
}

// storedUsage is what owner's sessions hold in stored files (none
// without a row).
func storedUsage(ctx context.Context, q rowQuerier, owner string) (bytes, files int64, err error) {
	err = q.QueryRow(ctx, "SELECT bytes, files FROM stored_usage WHERE owner = $1", owner).Scan(&bytes, &files)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return 0, 0, fmt.Errorf("read stored usage: %w", err)
	}
	return bytes, files, nil
}

// storedFull is the refusal of a file past its owner's quota: -32602
// with reason capacity, as the other upload limits (docs/spec.md §6).
func storedFull(held, files, n, maxBytes, maxFiles int64) error {
	msg := uploads.StoredBytesFull(held, n, maxBytes)
	if held+n <= maxBytes && files >= maxFiles {
		msg = uploads.StoredFilesFull(maxFiles)
	}
	return rpcerr.Error(codes.InvalidArgument, rpcerr.ReasonCapacity, rpcerr.NoIndex, msg)
}

// aheadWrite is a temporary file being written and synced on a
// goroutine of its own (startAhead), which its owner waits for (wait or
// discard) before it lets go of the bytes written.
type aheadWrite struct {
	tmp *tempFile
	// written has each piece's end once it is written, and is closed
	// when the write ended; a slot a piece, so the write never waits
	// for its reader.
	written chan int64
	done    chan struct{}
	err     error // the write's or the sync's, once done is closed
}

// startAhead creates a temporary file in dir and writes data into it in
// pieces (writePieces), then syncs it (with sync), on a goroutine of its
// own. data is read by the kernel's write alone: it may be a mapping of
// a memfd another process can still write, whose bytes the caller then
// reads back from the file (hashWritten).
func startAhead(dir int, data []byte, sync func(*os.File) error) (*aheadWrite, error) {
	tmp, err := newTemp(dir)
	if err != nil {
		return nil, err
	}
	a := &aheadWrite{tmp: tmp, written: make(chan int64, len(data)/writePiece+1), done: make(chan struct{})}
	go func() {
		defer close(a.done)
		start := time.Now()
		var off int64
		err := writePiecesThen(tmp.f, data, func(n int) {
			off += int64(n)
			a.written <- off
		})
		close(a.written)
		steptrace.Since("session", "store.write", start)
		if err == nil {
			syncing := time.Now()
			if err = sync(tmp.f); err != nil {
				err = fmt.Errorf("sync temporary file: %w", err)
			}
			steptrace.Since("session", "store.sync", syncing)
		}
		a.err = err
	}()
	return a, nil
}

// hashPiece is what hashWritten reads back at a time: small enough to
// stay in a core's cache between the read and the hash.
const hashPiece = 256 << 10

// sniffLen is what http.DetectContentType looks at.
const sniffLen = 512

// hashWritten hashes the size bytes of the file as they are written,
// read back from it piece by piece behind the write, and returns the
// sum and the file's first bytes (to guess its type by). What is hashed
// is what is in the file, not what the source held: a handed-over
// memfd's sender can still write it, and whatever it does the file is
// named by its own bytes, and a declared hash that is not theirs refuses
// them. A write that failed or came up short is its error.
func (a *aheadWrite) hashWritten(size int64) (sum string, head []byte, err error) {
	h := sha256.New()
	buf := make([]byte, hashPiece)
	var off int64
	for end := range a.written {
		for err == nil && off < end {
			var n int
			n, err = a.tmp.f.ReadAt(buf[:min(int64(len(buf)), end-off)], off)
			if off < sniffLen {
				head = append(head, buf[:min(n, sniffLen-int(off))]...)
			}
			h.Write(buf[:n])
			off += int64(n)
			if errors.Is(err, io.EOF) && n > 0 {
				err = nil
			}
		}
	}
	if err != nil {
		return "", nil, fmt.Errorf("read back temporary file: %w", err)
	}
	if off != size {
		<-a.done
		if a.err != nil {
			return "", nil, a.err
		}
		return "", nil, fmt.Errorf("wrote %d bytes of %d", off, size)
	}
	return hex.EncodeToString(h.Sum(nil)), head, nil
}

// wait waits for the write and the sync and returns the file, synced,
// for its owner to place; discard still removes it unless placed.
func (a *aheadWrite) wait() (*tempFile, error) {
	<-a.done
	if a.err != nil {
		return nil, a.err
	}
	a.tmp.synced = true
	return a.tmp, nil
}

// discard waits for the write and the sync, then closes the file and
// removes it unless it was placed; a nil aheadWrite is left alone.
func (a *aheadWrite) discard() {
	if a == nil {
		return
	}
	<-a.done
	a.tmp.discard()
}

// openUploadsDir opens <workspace>/uploads, creating what is missing. The
// workspace's parent is the service's own; the workspace and everything
// in it may have been changed by the agent, so from there on no link is
// followed.
//
// The parent (<data>/workspaces) is made again when it is gone: removed
// under a running service, every store into a session made before failed
// until the service restarted or the session was resumed.
func openUploadsDir(workspace string) (int, error) {
	parent, err := unix.Open(filepath.Dir(workspace), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		if err := os.MkdirAll(filepath.Dir(workspace), 0o700); err != nil {
			return -1, fmt.Errorf("create %s: %w", filepath.Dir(workspace), err)
		}
		parent, err = unix.Open(filepath.Dir(workspace), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", filepath.Dir(workspace), err)
	}
	defer unix.Close(parent)
	ws, err := openDir(parent, filepath.Base(workspace))
	if err != nil {
		return -1, err
	}
	defer unix.Close(ws)
	return openDir(ws, UploadsDir)
}

// openDir opens the folder name in parent without following a link,
// creating it (0700) when missing. A link or a file in its place is
// removed first; a link's target is never touched.
func openDir(parent int, name string) (int, error) {
	for range 3 {
		fd, err := unix.Openat(parent, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		switch {
		case err == nil:
			return fd, nil
		case errors.Is(err, unix.ENOENT):
		case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR):
			if err := unix.Unlinkat(parent, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
				return -1, fmt.Errorf("remove %s: %w", name, err)
			}
		default:
			return -1, fmt.Errorf("open %s: %w", name, err)
		}
		if err := unix.Mkdirat(parent, name, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, fmt.Errorf("create %s: %w", name, err)
		}
	}
	return -1, fmt.Errorf("open %s: %w", name, errUnstableDir)
}

// sameContent reports whether name in dir is a regular file (not a link)
// of size bytes whose SHA-256 is sum.
func sameContent(dir int, name, sum string, size int64) (bool, error) {
	fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return false, err
	}
	if !st.Mode().IsRegular() || st.Size() != size {
		return false, nil
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return false, err
	}
	return hex.EncodeToString(h.Sum(nil)) == sum, nil
}

// tempFile is a new file written in a folder under a temporary name:
// placeAs keeps it, synced and renamed over its name (which replaces a
// link without following it). Its owner defers discard, which closes it
// and removes it unless it was placed.
type tempFile struct {
	dir    int
	name   string
	f      *os.File // nil once discarded
	synced bool     // synced already (aheadWrite)
	placed bool
}

// createTemp writes data to a new temporary file in dir; nothing is left
// behind when it fails.
func createTemp(dir int, data []byte) (*tempFile, error) {
	t, err := newTemp(dir)
	if err != nil {
		return nil, err
	}
	if err := writePieces(t.f, data); err != nil {
		t.discard()
		return nil, err
	}
	return t, nil
}

// newTemp creates a new, empty temporary file in dir, open to be written
// and read back.
func newTemp(dir int) (*tempFile, error) {
	var rnd [tempHexLen / 2]byte
	_, _ = rand.Read(rnd[:])
	t := &tempFile{dir: dir, name: tempPrefix + hex.EncodeToString(rnd[:])}
	fd, err := unix.Openat(dir, t.name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create temporary file: %w", err)
	}
	t.f = os.NewFile(uintptr(fd), t.name)
	return t, nil
}

// placeAs syncs the file unless it is synced already, renames it over
// name and syncs the folder, then gives the file's pages in the page
// cache back to the kernel.
//
// The stack reads a stored file back only to check the copy in place
// when the same bytes are stored again (a tool may read it, later): such
// a read comes from the disk then (storing 10 MB again, medians of
// twelve, 25.3 → 31.6 ms). On a virtual machine whose free
// memory goes back to its host (free page reporting, as on the machine
// the benchmarks run on) every page the page cache takes beyond those
// recently freed is faulted in from the host: there the write of a new
// 10 MB file took about 1.6 ms for the first sixty uploads of a run and
// 19 to 20 ms for every one after, once about 600 MB of stored files
// held the pages freed before. Dropped once durable, each file's pages
// are the next file's, and the write stayed at 1.5 to 1.7 ms
// (docs/performance.md, "Thirty-seventh round").
func (t *tempFile) placeAs(name string) error {
	if !t.synced {
		if err := t.f.Sync(); err != nil {
			return err
		}
	}
	if err := unix.Renameat(t.dir, t.name, t.dir, name); err != nil {
		return fmt.Errorf("rename into place: %w", err)
	}
	t.placed = true
	defer steptrace.Since("session", "store.dirsync", time.Now())
	if err := unix.Fsync(t.dir); err != nil {
		return fmt.Errorf("sync folder: %w", err)
	}
	// Advice only: a file system that keeps the pages (tmpfs) or refuses
	// changes nothing stored.
	_ = unix.Fadvise(int(t.f.Fd()), 0, 0, unix.FADV_DONTNEED)
	return nil
}

// discard closes the file and removes it unless it was placed; a nil or
// already discarded tempFile is left alone.
func (t *tempFile) discard() {
	if t == nil || t.f == nil {
		return
	}
	t.f.Close()
	t.f = nil
	if !t.placed {
		_ = unix.Unlinkat(t.dir, t.name, 0)
	}
}

// tempPrefix and tempHexLen make a temporary file's name.
const (
	tempPrefix = ".tmp-"
	tempHexLen = 24
)

// staleTempAge is how long a temporary file goes unwritten before it is
// taken for one a dead process left even if it was written after this
// process started: a StoreFile holds its session's row, so no other
// writes into the same folder, and gives up after storeTimeout.
const staleTempAge = 2 * storeTimeout

// maxClearedSessions bounds the sessions whose uploads folder this process
// remembers having cleared; past it the set starts again (a folder cleared
// twice costs a read of it).
const maxClearedSessions = 4096

// clearLeftovers removes, the first time this process stores a file into
// a session, the temporary files a StoreFile left in its uploads folder
// when its process died between writing and placing them (a SIGKILL, a
// crash, the machine stopped): otherwise each would stay there, as large
// as the file it was, for good. dir is the folder, held under the
// session's row, so a temporary file written before this process started
// is a dead process's. So are the stored files no row indexes: a store
// that died, or whose commit failed, between placing its file and
// committing its row left it there, uncharged to the owner's quota (see
// removeUnindexed). A clearing that fails is logged and tried again at
// the next store; the store goes on.
func (s *Server) clearLeftovers(ctx context.Context, tx pgx.Tx, sessionID string, dir int) {
	s.clearedMu.Lock()
	_, done := s.cleared[sessionID]
	s.clearedMu.Unlock()
	if done {
		return
	}
	cutoff := time.Now().Add(-staleTempAge)
	if s.started.After(cutoff) {
		cutoff = s.started
	}
	removed, err := removeLeftTemps(dir, cutoff)
	for _, name := range removed {
		s.log.Info("temporary file left by a stopped store removed",
			zap.String("session_id", sessionID), zap.String("name", UploadsDir+"/"+name))
	}
	if err != nil {
		s.log.Warn("temporary files left by a stopped store not cleared", zap.String("session_id", sessionID), zap.Error(err))
		return
	}
	removed, err = removeUnindexed(ctx, tx, sessionID, dir)
	for _, name := range removed {
		s.log.Info("file a failed store left unindexed removed",
			zap.String("session_id", sessionID), zap.String("name", UploadsDir+"/"+name))
	}
	if err != nil {
		s.log.Warn("files a failed store left unindexed not cleared", zap.String("session_id", sessionID), zap.Error(err))
		return
	}
	s.clearedMu.Lock()
	if len(s.cleared) >= maxClearedSessions {
		clear(s.cleared)
	}
	s.cleared[sessionID] = struct{}{}
	s.clearedMu.Unlock()
}

// clearAllLeftovers clears, once as the process starts and while it
// serves, the uploads folder of every session that holds something a
// dead process's store may have left (clearLeftovers): without it a
// session never stored into again kept what a SIGKILL in the middle of
// a commit left, as large as the upload, until it was deleted. Each
// folder is cleared under its session's row, as a store would; a folder
// that holds no name the stack makes is only read. A failure is logged
// and left to the session's next store.
func (s *Server) clearAllLeftovers(stop <-chan struct{}) {
	root, err := os.Open(s.workspacesRoot())
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	if err != nil {
		s.log.Warn("workspaces not cleared of what stopped stores left", zap.Error(err))
		return
	}
	defer root.Close()
	for {
		entries, err := root.ReadDir(orphanBatch)
		for _, e := range entries {
			select {
			case <-stop:
				return
			default:
			}
			if !e.IsDir() || !ids.Token(e.Name()) {
				continue
			}
			if err := s.clearSessionLeftovers(e.Name()); err != nil {
				s.log.Warn("uploads folder not cleared of what stopped stores left", zap.String("session_id", e.Name()), zap.Error(err))
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				s.log.Warn("workspaces not all read", zap.Error(err))
			}
			return
		}
	}
}

// clearSessionLeftovers runs clearLeftovers on the uploads folder of
// session id, under its row, when the folder holds a temporary file or a
// stored file's name. Nothing is made: no folder, no row.
func (s *Server) clearSessionLeftovers(id string) error {
	if !mayHoldLeftovers(filepath.Join(s.workspacesRoot(), id, UploadsDir)) {
		return nil
	}
	ctx, cancel := context.WithTimeout(s.base, storeTimeout)
	defer cancel()
	return pgx.BeginFunc(ctx, s.store.db, func(tx pgx.Tx) error {
		r, err := readFileSession(ctx, tx, id, true)
		if errors.Is(err, errNoRow) {
			return nil // deleted: its workspace goes with it
		}
		if err != nil {
			return err
		}
		dir, err := openExistingUploadsDir(r.WorkspaceDir)
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		if err != nil {
			return err
		}
		defer unix.Close(dir)
		s.clearLeftovers(ctx, tx, id, dir)
		return nil
	})
}

// mayHoldLeftovers reports whether the folder at path (read without the
// session's lock, a hint only) names a temporary file or a stored file.
// A link or anything but a folder in its place is not opened: the agent
// may have put a FIFO there, whose plain open would wait for a writer.
func mayHoldLeftovers(path string) bool {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	for {
		names, err := f.Readdirnames(256)
		for _, name := range names {
			if _, ok := storedSum(name); ok || isTempName(name) {
				return true
			}
		}
		if err != nil {
			return false
		}
	}
}

// openExistingUploadsDir opens <workspace>/uploads as openUploadsDir does
// but makes nothing: a folder missing, or a link in its place, is ENOENT.
func openExistingUploadsDir(workspace string) (int, error) {
	const flags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	parent, err := unix.Open(filepath.Dir(workspace), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(parent)
	ws, err := unix.Openat(parent, filepath.Base(workspace), flags, 0)
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		return -1, unix.ENOENT
	}
	if err != nil {
		return -1, err
	}
	defer unix.Close(ws)
	dir, err := unix.Openat(ws, UploadsDir, flags, 0)
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		return -1, unix.ENOENT
	}
	return dir, err
}

// forgetCleared has the next store into the session clear its uploads
// folder again: a store placed a file there and failed to commit its row.
func (s *Server) forgetCleared(sessionID string) {
	s.clearedMu.Lock()
	delete(s.cleared, sessionID)
	s.clearedMu.Unlock()
}

// removeUnindexed removes from dir, the uploads folder of session
// sessionID held under its row by tx, every file placed as writeFile
// places them that no row of the session's index names, and returns
// their names. Under the row the index is settled: no store into the
// session is between its rename and its commit but one whose
// transaction is already lost. Only a regular file named as a stored file
// is (a SHA-256 and the extension fileExt keeps) and holding the content
// its name says is removed: what the agent made under another name, or
// wrote over such a name, is left.
func removeUnindexed(ctx context.Context, tx pgx.Tx, sessionID string, dir int) (removed []string, err error) {
	// A descriptor of its own: one duplicated from dir would share its
	// offset, at the end once removeLeftTemps read the folder.
	fd, err := unix.Openat(dir, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("read folder: %w", err)
	}
	f := os.NewFile(uintptr(fd), UploadsDir)
	defer f.Close()
	for {
		entries, rerr := f.ReadDir(256)
		sums := map[string]string{} // name -> the SHA-256 it carries
		var list []string
		for _, e := range entries {
			if sum, ok := storedSum(e.Name()); ok && e.Type().IsRegular() {
				sums[e.Name()] = sum
				list = append(list, sum)
			}
		}
		if len(list) > 0 {
			rows, err := tx.Query(ctx, "SELECT path FROM session_files WHERE session_id = $1 AND sha256 = ANY($2)", sessionID, list)
			if err != nil {
				return removed, fmt.Errorf("read file index: %w", err)
			}
			indexed, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				return removed, fmt.Errorf("read file index: %w", err)
			}
			for _, path := range indexed {
				delete(sums, strings.TrimPrefix(path, UploadsDir+"/"))
			}
			for name, sum := range sums {
				var st unix.Stat_t
				if err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
					if errors.Is(err, unix.ENOENT) {
						continue
					}
					return removed, fmt.Errorf("look at %s: %w", name, err)
				}
				// Larger than any file a store takes (one message between
				// the processes), it is not one; and it is not read.
				if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size > grpcserver.MaxMessageBytes {
					continue
				}
				same, err := sameContent(dir, name, sum, st.Size)
				if err != nil {
					return removed, fmt.Errorf("read %s: %w", name, err)
				}
				if !same {
					continue
				}
				if err := unix.Unlinkat(dir, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
					return removed, fmt.Errorf("remove %s: %w", name, err)
				}
				removed = append(removed, name)
			}
		}
		if errors.Is(rerr, io.EOF) {
			return removed, nil
		}
		if rerr != nil {
			return removed, fmt.Errorf("read folder: %w", rerr)
		}
	}
}

// storedSum returns the SHA-256 a stored file's name carries, when name
// is one writeFile makes: 64 lower-case hexadecimal digits and the
// extension fileExt keeps, if any.
func storedSum(name string) (string, bool) {
	const n = 2 * sha256.Size
	if len(name) < n || !ids.LowerHex(name[:n], n) {
		return "", false
	}
	if ext := name[n:]; ext != "" && fileExt(ext) != ext {
		return "", false
	}
	return name[:n], true
}

// removeLeftTemps removes from dir every regular file named as createTemp
// names them and last written before cutoff, and returns their names.
// Nothing else is touched: not a link, not a folder, not a name the stack
// does not make.
func removeLeftTemps(dir int, cutoff time.Time) (removed []string, err error) {
	fd, err := unix.FcntlInt(uintptr(dir), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("read folder: %w", err)
	}
	f := os.NewFile(uintptr(fd), UploadsDir)
	defer f.Close()
	for {
		entries, err := f.ReadDir(256)
		for _, e := range entries {
			name := e.Name()
			if !isTempName(name) {
				continue
			}
			var st unix.Stat_t
			if err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				if errors.Is(err, unix.ENOENT) {
					continue
				}
				return removed, fmt.Errorf("look at %s: %w", name, err)
			}
			if st.Mode&unix.S_IFMT != unix.S_IFREG || !time.Unix(st.Mtim.Unix()).Before(cutoff) {
				continue
			}
			if err := unix.Unlinkat(dir, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
				return removed, fmt.Errorf("remove %s: %w", name, err)
			}
			removed = append(removed, name)
		}
		if errors.Is(err, io.EOF) {
			return removed, nil
		}
		if err != nil {
			return removed, fmt.Errorf("read folder: %w", err)
		}
	}
}

// isTempName reports whether name is one createTemp makes.
func isTempName(name string) bool {
	hexPart, ok := strings.CutPrefix(name, tempPrefix)
	return ok && ids.LowerHex(hexPart, tempHexLen)
}

// writePiece is the most writePieces hands the kernel in one write.
const writePiece = 1 << 20

// writePieces writes data to w in pieces of at most writePiece bytes. A
// file's bytes are written this way because the kernel can take far
// longer over one large write into the page cache than over the same
// bytes in smaller writes: on the 2-core machine the benchmarks run on
// (Linux 6.18, ext4, a virtual machine), a new 10 MB file written in one
// call took 23 to 29 ms in three runs of five (3 and 8 ms in the others),
// in 1 MiB calls 3 ms in all five, and dd behaved alike; the pieces are
// fast for as long as the kernel has recently freed pages to give the
// page cache (docs/performance.md, "Eighth round"). An upload's commit
// spent half its time in that one call.
func writePieces(w io.Writer, data []byte) error {
	return writePiecesThen(w, data, func(int) {})
}

// writePiecesThen is writePieces that tells done of each piece written.
func writePiecesThen(w io.Writer, data []byte, done func(n int)) error {
	for len(data) > 0 {
		n := min(len(data), writePiece)
		if _, err := w.Write(data[:n]); err != nil {
			return err
		}
		done(n)
		data = data[n:]
	}
	return nil
}

// indexedFile is one row of the attachment index.
type indexedFile struct {
	Path, Filename, MIME string
}

// withAttachments appends the marker of each attachment to prompt, one a
// line. Each must name, by its ref_id, a file stored in this session; a
// workspace_path sent must be where it is stored and a marker sent must be
// a marker of that file (only the filename of a document marker is the
// client's), so a prompt can never point the agent at another path.
func (s *Server) withAttachments(ctx context.Context, sessionID, workspace, prompt string, refs []*sessionv1.FileRef) (string, error) {
	if len(refs) > uploads.MaxAttachments {
		return "", errInvalid(uploads.TooManyAttachments(len(refs)))
	}
	if len(refs) == 0 {
		return prompt, nil
	}
	var out strings.Builder
	out.WriteString(prompt)
	for i, ref := range refs {
		sum, ok := uploads.ParseRefID(ref.GetRefId())
		if !ok {
			return "", errInvalid(fmt.Sprintf("`attachments[%d].ref_id` must be sha256: and 64 lower-case hexadecimal characters", i))
		}
		var f indexedFile
		err := s.store.db.QueryRow(ctx, "SELECT path, filename, mime_type FROM session_files WHERE session_id = $1 AND sha256 = $2",
			sessionID, sum).Scan(&f.Path, &f.Filename, &f.MIME)
		if errors.Is(err, pgx.ErrNoRows) {
			return "", errInvalid(fmt.Sprintf("`attachments[%d]`: %s is not a file of session %s; store it with file/attach or file/upload first", i, ref.GetRefId(), sessionID))
		}
		if err != nil {
			return "", fmt.Errorf("read file index: %w", err)
		}
		path := filepath.Join(workspace, f.Path)
		if wp := ref.GetWorkspacePath(); wp != "" && wp != path {
			return "", errInvalid(fmt.Sprintf("`attachments[%d].workspace_path` is not where %s is stored", i, ref.GetRefId()))
		}
		marker := ref.GetMarker()
		if marker == "" {
			marker = uploads.Marker(f.MIME, f.Filename, path)
		} else if !validMarker(marker, f.MIME, path) {
			return "", errInvalid(fmt.Sprintf("`attachments[%d].marker` is not a marker of %s", i, ref.GetRefId()))
		}
		if out.Len() > 0 {
			out.WriteByte('\n')
		}
		out.WriteString(marker)
	}
	return out.String(), nil
}

// validMarker reports whether marker is the marker of the file at path
// with that MIME type, under some acceptable filename.
func validMarker(marker, mimeType, path string) bool {
	if uploads.IsImage(mimeType) {
		return marker == uploads.Marker(mimeType, "", path)
	}
	name, ok := strings.CutPrefix(marker, "[Document: ")
	if !ok {
		return false
	}
	name, ok = strings.CutSuffix(name, "] "+path)
	return ok && name != "" && uploads.CheckFilename(name) == ""
}
