package uploadstaging

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/clawmesh/clawmesh/internal/bulkcodec"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/uploads"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
	uploadv1 "github.com/clawmesh/clawmesh/proto/clawmesh/upload/v1"
)

// sessions stands in for the session service's file RPCs; what they
// decide is the session package's and is tested there and end to end.
type sessions struct {
	sessionv1.SessionServiceClient

	mu       sync.Mutex
	storeErr error
	stores   []*sessionv1.StoreFileRequest
	checks   []*sessionv1.CheckUploadRequest
	// committed is what CommittedUpload answers, by "principal id";
	// lookups the ids it was asked.
	committed map[string]*sessionv1.FileEntry
	lookups   []string
	lookupErr error
}

func (f *sessions) CheckUpload(_ context.Context, req *sessionv1.CheckUploadRequest, _ ...grpc.CallOption) (*sessionv1.CheckUploadResponse, error) {
	f.mu.Lock()
	f.checks = append(f.checks, proto.Clone(req).(*sessionv1.CheckUploadRequest))
	f.mu.Unlock()
	if req.GetSessionId() == "sess_none" {
		return nil, rpcerr.Error(codes.NotFound, rpcerr.ReasonSessionNotFound, rpcerr.NoIndex, "Session sess_none not found")
	}
	if req.GetSessionId() == "sess_down" { // the session service's process gone
		return nil, status.Error(codes.Unavailable, "connection error")
	}
	return &sessionv1.CheckUploadResponse{Generation: 3, Incarnation: 9, Owner: req.GetPrincipal().GetPrincipalId(), AgentAlias: "default"}, nil
}

func (f *sessions) StoreFile(_ context.Context, req *sessionv1.StoreFileRequest, _ ...grpc.CallOption) (*sessionv1.StoreFileResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	// A copy, as a gRPC client's server would hold: the request's Data
	// goes to the next upload once this returns.
	f.stores = append(f.stores, proto.Clone(req).(*sessionv1.StoreFileRequest))
	if f.storeErr != nil {
		return nil, f.storeErr
	}
	// Summed without uploads.Sum, which counts the bytes this process
	// hashed (TestCommitLeavesTheDeclaredHashToTheSessionService).
	d := sha256.Sum256(req.GetData())
	return &sessionv1.StoreFileResponse{File: &sessionv1.FileEntry{RefId: "sha256:" + hex.EncodeToString(d[:]), SizeBytes: int64(len(req.GetData()))}}, nil
}

// CommittedUpload answers the entries set in committed, by principal
// and upload id, and records what it was asked.
func (f *sessions) CommittedUpload(_ context.Context, req *sessionv1.CommittedUploadRequest, _ ...grpc.CallOption) (*sessionv1.CommittedUploadResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lookups = append(f.lookups, req.GetUploadId())
	if f.lookupErr != nil {
		return nil, f.lookupErr
	}
	return &sessionv1.CommittedUploadResponse{File: f.committed[req.GetPrincipal().GetPrincipalId()+" "+req.GetUploadId()]}, nil
}

func (f *sessions) failWith(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.storeErr = err
}

// denyAll refuses files:create to everyone but the operator.
type denyAll struct{}

func (denyAll) Authorize(_ context.Context, p *commonv1.Principal, perm, _ string) error {
	return rpcerr.Error(codes.PermissionDenied, rpcerr.ReasonForbidden, rpcerr.NoIndex, p.GetPrincipalId()+" does not hold "+perm)
}

var (
	op   = &commonv1.Principal{PrincipalId: "shared-operator", Operator: true}
	user = &commonv1.Principal{PrincipalId: "user:alice", User: "alice"}
)

func newServer(t *testing.T, authz Authorizer) (*Server, *sessions) {
	t.Helper()
	f := &sessions{}
	s, err := New(Config{Sessions: f, Authz: authz, Settings: defaults})
	if err != nil {
		t.Fatal(err)
	}
	return s, f
}

func begin(t *testing.T, s *Server, p *commonv1.Principal, size int64, sha string) string {
	t.Helper()
	resp, err := s.Begin(context.Background(), &uploadv1.BeginRequest{Principal: p, GatewayId: "gw-1", ConnectionId: "conn-1", SessionId: "sess_1", SizeBytes: size, Sha256: sha})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetChunkBytes() != 1048576 || resp.GetMaxBytes() != 10485760 {
		t.Fatalf("begin %v", resp)
	}
	return resp.GetUploadId()
}

func chunk(s *Server, p *commonv1.Principal, id string, off int64, data string) (*uploadv1.ChunkResponse, error) {
	return s.Chunk(context.Background(), &uploadv1.ChunkRequest{Principal: p, GatewayId: "gw-1", ConnectionId: "conn-1", UploadId: id, Offset: off, Data: []byte(data)})
}

func commit(s *Server, p *commonv1.Principal, id string) (*uploadv1.CommitResponse, error) {
	return s.Commit(context.Background(), &uploadv1.CommitRequest{Principal: p, GatewayId: "gw-1", ConnectionId: "conn-1", UploadId: id})
}

// Commit binds the store to the session begin saw, and a store refused
// discards the upload while one that may pass keeps it.
func TestCommitHandsTheUploadToStoreFile(t *testing.T) {
	s, f := newServer(t, nil)
	id := begin(t, s, op, 5, "")
	if _, err := chunk(s, op, id, 0, "hello"); err != nil {
		t.Fatal(err)
	}
	// Its process gone: the failure names the session service (the edge
	// would name upload-staging), and the upload stays.
	f.failWith(status.Error(codes.Unavailable, "connection error: desc = \"transport: Error while dialing: dial unix session.sock: connect: connection refused\""))
	_, err := commit(s, op, id)
	if reason, _ := rpcerr.Details(status.Convert(err)); status.Code(err) != codes.Unavailable || reason != rpcerr.ReasonDependency ||
		status.Convert(err).Message() != "session service unavailable" {
		t.Fatalf("commit with the session service down: %v", err)
	}
	if _, err := s.Begin(context.Background(), &uploadv1.BeginRequest{Principal: op, GatewayId: "gw-1", ConnectionId: "conn-1",
		SessionId: "sess_down", SizeBytes: 1}); status.Code(err) != codes.Unavailable || status.Convert(err).Message() != "session service unavailable" {
		t.Fatalf("begin with the session service down: %v", err)
	}
	// Up, with a dependency of its own down and named: passed as it is.
	f.failWith(rpcerr.Error(codes.Unavailable, rpcerr.ReasonDependency, rpcerr.NoIndex, "database unavailable"))
	if _, err := commit(s, op, id); status.Convert(err).Message() != "database unavailable" {
		t.Fatalf("commit with the session service's database down: %v", err)
	}
	f.failWith(nil)
	resp, err := commit(s, op, id)
	if err != nil || resp.GetFile().GetRefId() != "sha256:"+uploads.Sum([]byte("hello")) {
		t.Fatalf("commit after: %v %v", resp, err)
	}
	last := f.stores[len(f.stores)-1]
	if last.GetGeneration() != 3 || last.GetIncarnation() != 9 || last.GetOwner() != "shared-operator" || last.GetAgentAlias() != "default" ||
		last.GetSessionId() != "sess_1" || last.GetMaxBytes() != 10485760 || string(last.GetData()) != "hello" {
		t.Fatalf("store request %v", last)
	}
	// Committed: a second commit is answered the same file, not stored
	// again (TestCommitSentAgainGetsTheSameFile).
	stores := len(f.stores)
	if again, err := commit(s, op, id); err != nil || !proto.Equal(again, resp) || len(f.stores) != stores {
		t.Fatalf("second commit: %v %v, %d stores", again, err, len(f.stores)-stores)
	}

	id = begin(t, s, op, 1, "")
	if _, err := chunk(s, op, id, 0, "x"); err != nil {
		t.Fatal(err)
	}
	f.failWith(rpcerr.Error(codes.PermissionDenied, rpcerr.ReasonForbidden, rpcerr.NoIndex, "revoked"))
	if _, err := commit(s, op, id); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("refused commit: %v", err)
	}
	if st := s.Stage().Stats(); st.Uploads != 0 || st.Charged != 0 {
		t.Fatalf("a refused upload stayed staged: %+v", st)
	}
}

// Stats shows the buffer a committed upload left for the next apart from
// the uploads' charge, so that an operator (grpcurl) sees what the budget
// holds: nothing staged, 2 MiB kept, then taken by the next upload.
func TestStatsReportsKeptBuffers(t *testing.T) {
	s, _ := newServer(t, nil)
	stats := func() *uploadv1.StatsResponse {
		t.Helper()
		st, err := s.Stats(context.Background(), &uploadv1.StatsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	upload := func(size int) string {
		t.Helper()
		id := begin(t, s, op, int64(size), "")
		for off := 0; off < size; off += 1 << 20 {
			if _, err := chunk(s, op, id, int64(off), strings.Repeat("k", min(1<<20, size-off))); err != nil {
				t.Fatal(err)
			}
		}
		return id
	}
	if _, err := commit(s, op, upload(2<<20)); err != nil {
		t.Fatal(err)
	}
	if st := stats(); st.GetUploads() != 0 || st.GetStagedBytes() != 0 || st.GetKeptBytes() != 2<<20 || st.GetBudgetBytes() == 0 {
		t.Fatalf("after a 2 MiB upload: %v", st)
	}
	upload(2<<20 - 5)
	if st := stats(); st.GetUploads() != 1 || st.GetKeptBytes() != 0 || st.GetStagedBytes() < 2<<20 {
		t.Fatalf("with the kept buffer taken: %v", st)
	}
}

// Begin: the declared limits first, then the session service's check.
func TestBeginRefusals(t *testing.T) {
	s, _ := newServer(t, nil)
	ctx := context.Background()
	for _, tc := range []struct {
		req  *uploadv1.BeginRequest
		code codes.Code
		msg  string
	}{
		{&uploadv1.BeginRequest{Principal: op, GatewayId: "gw-1", ConnectionId: "conn-1", SessionId: "sess_1", SizeBytes: 10485761}, codes.InvalidArgument, "Upload of 10485761 bytes exceeds the 10 MB file limit"},
		{&uploadv1.BeginRequest{Principal: op, GatewayId: "gw-1", ConnectionId: "conn-1", SessionId: "sess_none", SizeBytes: 1}, codes.NotFound, "Session sess_none not found"},
		{&uploadv1.BeginRequest{Principal: op, GatewayId: "gw/1", ConnectionId: "conn-1", SessionId: "sess_1"}, codes.InvalidArgument, "`gateway_id` must be"},
		{&uploadv1.BeginRequest{Principal: op, GatewayId: "gw-1", ConnectionId: "", SessionId: "sess_1"}, codes.InvalidArgument, "`connection_id` is required"},
		{&uploadv1.BeginRequest{GatewayId: "gw-1", ConnectionId: "conn-1", SessionId: "sess_1"}, codes.InvalidArgument, "`principal` is required"},
	} {
		_, err := s.Begin(ctx, tc.req)
		if st := status.Convert(err); err == nil || st.Code() != tc.code || !strings.HasPrefix(st.Message(), tc.msg) {
			t.Errorf("%v: got %v, want %v %q", tc.req, err, tc.code, tc.msg)
		}
	}
	// The per-connection limit is checked before the session is asked.
	for range 4 {
		begin(t, s, op, 1, "")
	}
	_, err := s.Begin(ctx, &uploadv1.BeginRequest{Principal: op, GatewayId: "gw-1", ConnectionId: "conn-1", SessionId: "sess_none", SizeBytes: 1})
	if !strings.HasPrefix(status.Convert(err).Message(), "This connection already has 4 uploads in progress") {
		t.Fatalf("fifth begin: %v", err)
	}
}

// Begin tells the session service the declared hash, normalized, with
// the size: content the session already holds takes no new room, and
// its check must not refuse it for room (a client resending a file
// whose commit reply it lost).
func TestBeginDeclaresTheHashToTheSessionService(t *testing.T) {
	s, f := newServer(t, nil)
	sum := uploads.Sum([]byte("hello"))
	begin(t, s, user, 5, " "+strings.ToUpper(sum)+" ")
	begin(t, s, user, 5, "")
	if len(f.checks) != 2 || f.checks[0].GetSha256() != sum || f.checks[0].GetSizeBytes() != 5 || f.checks[1].GetSha256() != "" {
		t.Fatalf("checks %v", f.checks)
	}
}

// A declared hash is checked once, by the session service, which hashes
// the content anyway to name the file: commit hands it to StoreFile and
// hashes nothing itself. Before, Take hashed the whole upload first, on
// the commit's path and beside nothing (30 ms of a 10 MB commit at load,
// docs/performance.md, "Sixtieth round: upload"). The session service's
// refusal of a mismatch reaches the client as the stage's did, and
// discards the upload.
func TestCommitLeavesTheDeclaredHashToTheSessionService(t *testing.T) {
	s, f := newServer(t, nil)
	content := strings.Repeat("0123456789abcdef", 1<<12)
	sum := uploads.Sum([]byte(content))

	before := uploads.HashedBytes()
	id := begin(t, s, user, int64(len(content)), strings.ToUpper(sum))
	if _, err := chunk(s, user, id, 0, content); err != nil {
		t.Fatal(err)
	}
	if _, err := commit(s, user, id); err != nil {
		t.Fatal(err)
	}
	if n := uploads.HashedBytes() - before; n != 0 {
		t.Fatalf("upload-staging hashed %d bytes of a %d-byte upload; the session service hashes it", n, len(content))
	}
	if len(f.stores) != 1 || f.stores[0].GetSha256() != sum {
		t.Fatalf("StoreFile was not handed the declared hash: %v", f.stores)
	}

	// No hash declared, none handed on.
	id = begin(t, s, user, 3, "")
	if _, err := chunk(s, user, id, 0, "abc"); err != nil {
		t.Fatal(err)
	}
	if _, err := commit(s, user, id); err != nil || len(f.stores) != 2 || f.stores[1].GetSha256() != "" {
		t.Fatalf("commit without a hash: %v, %v", err, f.stores)
	}

	// The session service's refusal of a mismatch: the same answer as
	// ever, and the upload is gone.
	id = begin(t, s, user, 3, uploads.Sum([]byte("abd")))
	if _, err := chunk(s, user, id, 0, "abc"); err != nil {
		t.Fatal(err)
	}
	f.failWith(rpcerr.Error(codes.InvalidArgument, rpcerr.ReasonInvalid, rpcerr.NoIndex, uploads.HashMismatch))
	_, err := commit(s, user, id)
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || st.Message() != uploads.HashMismatch {
		t.Fatalf("mismatch: %v", err)
	}
	f.failWith(nil)
	if _, err := commit(s, user, id); status.Convert(err).Message() != uploads.UnknownUpload(id) {
		t.Fatalf("commit after the mismatch: %v", err)
	}
	if st := s.stage.Stats(); st.Uploads != 0 || st.Charged != 0 {
		t.Fatalf("left staged: %+v", st)
	}
}

// Chunk needs files:create, like every upload method.
func TestChunkNeedsFilesCreate(t *testing.T) {
	s, _ := newServer(t, denyAll{})
	id := begin(t, s, user, 1, "")
	if _, err := chunk(s, user, id, 0, "x"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("chunk without files:create: %v", err)
	}
}

// Attach checks every file before storing any, and names the index of
// the one refused.
func TestAttachNamesTheRefusedFile(t *testing.T) {
	s, f := newServer(t, nil)
	ctx := context.Background()
	req := &uploadv1.AttachRequest{Principal: op, ConnectionId: "conn-1", SessionId: "sess_1", Files: []*uploadv1.AttachFile{
		{Data: []byte("ok")}, {Data: make([]byte, 10485761)},
	}}
	_, err := s.Attach(ctx, req)
	st := status.Convert(err)
	reason, index := rpcerr.Details(st)
	if st.Message() != "Upload of 10485761 bytes exceeds the 10 MB file limit" || index != 1 || reason != rpcerr.ReasonInvalid {
		t.Fatalf("attach refusal %v (index %d)", err, index)
	}
	if len(f.stores) != 0 {
		t.Fatal("a file was stored before the batch was checked")
	}
	req.Files[1] = &uploadv1.AttachFile{Filename: strings.Repeat("n", 256)}
	if _, err := s.Attach(ctx, req); status.Convert(err).Message() != "`filename` is 256 bytes; the limit is 255" {
		t.Fatalf("filename: %v", err)
	}
	// A malformed mime_type too: the first file was stored, then the
	// session service refused the second's.
	req.Files[1] = &uploadv1.AttachFile{Data: []byte("two"), MimeType: "text"}
	_, err = s.Attach(ctx, req)
	if _, index := rpcerr.Details(status.Convert(err)); status.Convert(err).Message() != "`mime_type` must be a MIME type such as image/png" || index != 1 || len(f.stores) != 0 {
		t.Fatalf("mime_type: %v (index %d), %d stored", err, index, len(f.stores))
	}
	req.Files[1] = &uploadv1.AttachFile{Data: []byte("two")}
	f.failWith(nil)
	resp, err := s.Attach(ctx, req)
	if err != nil || len(resp.GetFiles()) != 2 {
		t.Fatalf("attach %v %v", resp, err)
	}
	for i, st := range f.stores {
		if st.GetGeneration() != 0 || st.GetMaxBytes() != 10485760 {
			t.Fatalf("store %d: %v", i, st)
		}
	}
	f.failWith(rpcerr.Error(codes.PermissionDenied, rpcerr.ReasonForbidden, rpcerr.NoIndex, "no files:create"))
	_, err = s.Attach(ctx, req)
	if _, index := rpcerr.Details(status.Convert(err)); status.Code(err) != codes.PermissionDenied || index != 0 {
		t.Fatalf("refused store: %v (index %d)", err, index)
	}
}

// The file limit never exceeds what one gRPC message carries.
func TestLimitsCapTheFileSize(t *testing.T) {
	u := defaults()
	u.MaxFileBytes = 1 << 30
	if got := Limits(u).MaxFileBytes; got != MaxStorableBytes {
		t.Fatalf("limit %d", got)
	}
}

// TestChunkGivesItsBytesBack: a chunk's bytes read by the process's codec
// into a kept buffer (cmd/upload-staging) go back to it when Chunk
// returns, and the upload keeps its own copy: the next chunk read into
// the same buffer does not change what is stored.
func TestChunkGivesItsBytesBack(t *testing.T) {
	chunks := bulkcodec.New(0, (&uploadv1.ChunkRequest{}).ProtoReflect().Descriptor().Fields().ByName("data"))
	f := &sessions{}
	s, err := New(Config{Sessions: f, Settings: defaults, Chunks: chunks})
	if err != nil {
		t.Fatal(err)
	}
	const size = bulkcodec.DefaultMin
	first, second := bytes.Repeat([]byte("a"), size), bytes.Repeat([]byte("b"), size)
	id := begin(t, s, op, 2*size, "")
	for i, data := range [][]byte{first, second} {
		wire, err := proto.Marshal(&uploadv1.ChunkRequest{Principal: op, GatewayId: "gw-1", ConnectionId: "conn-1", UploadId: id, Offset: int64(i * size), Data: data})
		if err != nil {
			t.Fatal(err)
		}
		var req uploadv1.ChunkRequest
		if err := chunks.Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, &req); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Chunk(context.Background(), &req); err != nil {
			t.Fatal(err)
		}
		if chunks.Kept() != 1 {
			t.Fatalf("chunk %d: %d buffers kept, want 1", i, chunks.Kept())
		}
	}
	if _, err := commit(s, op, id); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	got := f.stores[len(f.stores)-1].GetData()
	f.mu.Unlock()
	if !bytes.Equal(got, append(first, second...)) {
		t.Fatalf("stored %d bytes, not the two chunks as sent", len(got))
	}
}

// gatedSessions holds the first StoreFile until gate closes, as a store
// waiting on the session's lock or the store semaphore would, and records
// the hash of each store's bytes when it reads them.
type gatedSessions struct {
	sessions
	gate, in chan struct{}
	first    sync.Once
	sums     []string
}

func (f *gatedSessions) StoreFile(ctx context.Context, req *sessionv1.StoreFileRequest, _ ...grpc.CallOption) (*sessionv1.StoreFileResponse, error) {
	held := false
	f.first.Do(func() { held = true })
	if held {
		close(f.in)
		<-f.gate
	}
	sum := uploads.Sum(req.GetData())
	f.mu.Lock()
	f.sums = append(f.sums, sum)
	f.mu.Unlock()
	return &sessionv1.StoreFileResponse{File: &sessionv1.FileEntry{RefId: "sha256:" + sum}}, nil
}

// A second commit of an upload whose first is still storing it ran its
// own store and finished first; the buffer went to another connection's
// upload (alice's) while the first store was still to read it, and the
// first store wrote alice's bytes into the operator's session. The second
// commit is refused now, and every store has the upload's own bytes.
func TestCommitWhileOneRunsIsRefused(t *testing.T) {
	f := &gatedSessions{gate: make(chan struct{}), in: make(chan struct{})}
	s, err := New(Config{Sessions: f, Settings: defaults})
	if err != nil {
		t.Fatal(err)
	}
	mine := strings.Repeat("\xaa", 2<<20)
	id := begin(t, s, op, int64(len(mine)), "")
	for off := 0; off < len(mine); off += 1 << 20 {
		if _, err := chunk(s, op, id, int64(off), mine[off:off+1<<20]); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() { _, err := commit(s, op, id); done <- err }()
	<-f.in
	_, err = commit(s, op, id)
	if st, _ := status.FromError(err); err == nil || st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "is being committed") {
		t.Fatalf("a second commit while the first stores: %v", err)
	}
	// Another connection, another principal, the same size.
	theirs := strings.Repeat("\x55", 2<<20)
	resp, err := s.Begin(context.Background(), &uploadv1.BeginRequest{Principal: user, GatewayId: "gw-1", ConnectionId: "conn-2", SessionId: "sess_2", SizeBytes: int64(len(theirs))})
	if err != nil {
		t.Fatal(err)
	}
	for off := 0; off < len(theirs); off += 1 << 20 {
		if _, err := s.Chunk(context.Background(), &uploadv1.ChunkRequest{Principal: user, GatewayId: "gw-1", ConnectionId: "conn-2", UploadId: resp.GetUploadId(), Offset: int64(off), Data: []byte(theirs[off : off+1<<20])}); err != nil {
			t.Fatal(err)
		}
	}
	close(f.gate)
	if err := <-done; err != nil {
		t.Fatalf("the first commit: %v", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.sums) != 1 || f.sums[0] != uploads.Sum([]byte(mine)) {
		t.Fatalf("stored %v; the upload's own bytes are %s, the other connection's %s", f.sums, uploads.Sum([]byte(mine)), uploads.Sum([]byte(theirs)))
	}
}

// A commit whose reply was lost (the connection dropped as it was
// written) and that the client sends again, on the same connection or a
// new one, was told "Unknown or expired upload": its file was stored,
// and nothing said so. The same principal now gets the first commit's
// entry, with no second store, for the idle time after the commit;
// anyone else is still told the upload does not exist.
func TestCommitSentAgainGetsTheSameFile(t *testing.T) {
	f := &sessions{}
	c := &clock{now: time.Unix(1_700_000_000, 0)}
	s, err := New(Config{Sessions: f, Settings: defaults, Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	id := begin(t, s, user, 5, "")
	if _, err := chunk(s, user, id, 0, "hello"); err != nil {
		t.Fatal(err)
	}
	first, err := commit(s, user, id)
	if err != nil {
		t.Fatal(err)
	}
	on := func(p *commonv1.Principal, conn string) (*uploadv1.CommitResponse, error) {
		return s.Commit(context.Background(), &uploadv1.CommitRequest{Principal: p, GatewayId: "gw-2", ConnectionId: conn, UploadId: id})
	}
	for _, conn := range []string{"conn-1", "conn-9"} {
		again, err := on(user, conn)
		if err != nil || !proto.Equal(again.GetFile(), first.GetFile()) {
			t.Fatalf("commit sent again on %s: %v %v; want %v", conn, again, err, first)
		}
	}
	if len(f.stores) != 1 {
		t.Fatalf("%d stores; want 1", len(f.stores))
	}
	unknown := "Unknown or expired upload `" + id + "`"
	other := &commonv1.Principal{PrincipalId: "user:bob", User: "bob"}
	if _, err := on(other, "conn-1"); status.Convert(err).Message() != unknown {
		t.Fatalf("another principal's commit: %v", err)
	}
	c.advance(defaults().IdleTimeout)
	if _, err := on(user, "conn-1"); status.Convert(err).Message() != unknown {
		t.Fatalf("commit sent again after the idle time: %v", err)
	}
}

// A commit sent again from a new connection while the first still
// stores (its connection gone) is told the upload is being committed,
// not that it does not exist; once the first is done, it gets the file.
func TestCommitSentAgainWhileTheFirstStores(t *testing.T) {
	f := &gatedSessions{gate: make(chan struct{}), in: make(chan struct{})}
	s, err := New(Config{Sessions: f, Settings: defaults})
	if err != nil {
		t.Fatal(err)
	}
	id := begin(t, s, user, 5, "")
	if _, err := chunk(s, user, id, 0, "hello"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := commit(s, user, id); done <- err }()
	<-f.in
	s.DiscardConnection(context.Background(), &uploadv1.DiscardConnectionRequest{GatewayId: "gw-1", ConnectionId: "conn-1"})
	again := func() (*uploadv1.CommitResponse, error) {
		return s.Commit(context.Background(), &uploadv1.CommitRequest{Principal: user, GatewayId: "gw-1", ConnectionId: "conn-2", UploadId: id})
	}
	if _, err := again(); !strings.Contains(status.Convert(err).Message(), "is being committed") {
		t.Fatalf("commit from a new connection while the first stores: %v", err)
	}
	close(f.gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if resp, err := again(); err != nil || resp.GetFile().GetRefId() != "sha256:"+uploads.Sum([]byte("hello")) {
		t.Fatalf("commit from a new connection once the first stored: %v %v", resp, err)
	}
}

// cutSessions stores every file, as the session service does once its
// checks passed, but answers a caller whose context ended first with
// its context's error, as a gRPC client does whatever the server did.
type cutSessions struct {
	sessions
	in, gate chan struct{}
}

func (f *cutSessions) StoreFile(ctx context.Context, req *sessionv1.StoreFileRequest, opts ...grpc.CallOption) (*sessionv1.StoreFileResponse, error) {
	close(f.in)
	<-f.gate
	resp, err := f.sessions.StoreFile(ctx, req, opts...)
	if ctx.Err() != nil {
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return resp, err
}

// A client whose connection closed while its commit ran (the gateway
// cancels the call and discards the connection's uploads) and that
// commits again from a new connection was told "Unknown or expired
// upload": the session service had stored the file, the commit had seen
// only its own cancelled call, and no answer was kept. A commit, once
// its upload is taken, runs to its end whoever waits for it, and the
// commit sent again gets the file entry.
func TestCommitCutOffByItsClientStillAnswersTheRetry(t *testing.T) {
	f := &cutSessions{in: make(chan struct{}), gate: make(chan struct{})}
	s, err := New(Config{Sessions: f, Settings: defaults})
	if err != nil {
		t.Fatal(err)
	}
	id := begin(t, s, user, 5, "")
	if _, err := chunk(s, user, id, 0, "hello"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := s.Commit(ctx, &uploadv1.CommitRequest{Principal: user, GatewayId: "gw-1", ConnectionId: "conn-1", UploadId: id})
		done <- err
	}()
	<-f.in
	cancel()
	s.DiscardConnection(context.Background(), &uploadv1.DiscardConnectionRequest{GatewayId: "gw-1", ConnectionId: "conn-1"})
	close(f.gate)
	<-done
	resp, err := s.Commit(context.Background(), &uploadv1.CommitRequest{Principal: user, GatewayId: "gw-1", ConnectionId: "conn-2", UploadId: id})
	if err != nil || resp.GetFile().GetRefId() != "sha256:"+uploads.Sum([]byte("hello")) {
		t.Fatalf("commit sent again from a new connection after the first was cut off: %v %v", resp, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.stores) != 1 {
		t.Fatalf("%d stores; want 1", len(f.stores))
	}
	if st := s.Stage().Stats(); st.Uploads != 0 || st.Charged != 0 {
		t.Fatalf("staged after the commit: %+v", st)
	}
}

// The answers kept are bounded: past maxAnswers the oldest goes.
func TestCommitAnswersAreBounded(t *testing.T) {
	var a answers
	now := time.Unix(1_700_000_000, 0)
	f := &sessionv1.FileEntry{RefId: "sha256:x"}
	for i := range maxAnswers + 1 {
		a.keep(strconv.Itoa(i), "p", f, now, time.Minute)
	}
	if len(a.byID) != maxAnswers || len(a.order) != maxAnswers || a.get("0", "p", now, time.Minute) != nil || a.get("1", "p", now, time.Minute) != f {
		t.Fatalf("%d answers, %d in order", len(a.byID), len(a.order))
	}
}

// Begin sent again on a full connection, through the server: the
// connection's room is checked before the session is, and must let a
// begin it resumes through (TestStageBeginSentAgainResumesTheUpload).
func TestBeginSentAgainOnAFullConnection(t *testing.T) {
	s, _ := newServer(t, nil)
	sum := uploads.Sum([]byte("hello"))
	id := begin(t, s, user, 5, sum)
	for range 3 {
		begin(t, s, user, 1, "")
	}
	if again := begin(t, s, user, 5, strings.ToUpper(sum)); again != id {
		t.Fatalf("begin sent again: %s, want %s", again, id)
	}
}

// A mime_type the session service refuses at the store is refused at
// begin, before any byte is sent: it was taken, the whole file was sent,
// and commit was refused "`mime_type` must be a MIME type such as
// image/png", the upload discarded with it. A well-formed one passes.
func TestBeginRefusesAMalformedMIMEType(t *testing.T) {
	s, _ := newServer(t, nil)
	for _, m := range []string{"not a mime type", "text", "/", "text/plain; charset"} {
		_, err := s.Begin(context.Background(), &uploadv1.BeginRequest{Principal: user, GatewayId: "gw-1", ConnectionId: "conn-1", SessionId: "sess_1", SizeBytes: 5, MimeType: m})
		if st := status.Convert(err); st.Code() != codes.InvalidArgument || st.Message() != "`mime_type` must be a MIME type such as image/png" {
			t.Errorf("begin with mime_type %q: %v", m, err)
		}
	}
	if _, err := s.Begin(context.Background(), &uploadv1.BeginRequest{Principal: user, GatewayId: "gw-1", ConnectionId: "conn-1", SessionId: "sess_1", SizeBytes: 5, MimeType: "Text/Plain; charset=utf-8"}); err != nil {
		t.Fatal(err)
	}
}

// A commit of an upload this process does not know (it restarted since
// the store; its answers went with it) is answered from the session
// service, which recorded the upload id beside the stored file, for the
// principal that committed it. An id not of an upload id's form is not
// sent on; the session service unreachable is not "unknown", which would
// tell the client to upload again a file that may be stored.
func TestCommitOfAnUnknownUploadAsksTheSessionService(t *testing.T) {
	s, f := newServer(t, nil)
	id := strings.Repeat("ab", uploads.IDHexLen/2)
	entry := &sessionv1.FileEntry{RefId: "sha256:" + strings.Repeat("0", 64), SizeBytes: 3}
	f.committed = map[string]*sessionv1.FileEntry{user.GetPrincipalId() + " " + id: entry}
	resp, err := commit(s, user, id)
	if err != nil || !proto.Equal(resp.GetFile(), entry) {
		t.Fatalf("commit of an upload stored before a restart: %v, %v", resp, err)
	}
	bob := &commonv1.Principal{PrincipalId: "user:bob", User: "bob"}
	if _, err := commit(s, bob, id); status.Convert(err).Message() != uploads.UnknownUpload(id) {
		t.Fatalf("another user's commit of it: %v", err)
	}
	f.lookups = nil
	for _, bad := range []string{"nope", "x' OR '1'='1", strings.ToUpper(id)} {
		if _, err := commit(s, user, bad); status.Convert(err).Message() != uploads.UnknownUpload(bad) {
			t.Fatalf("commit of %q: %v", bad, err)
		}
	}
	if len(f.lookups) != 0 {
		t.Fatalf("malformed ids sent to the session service: %q", f.lookups)
	}
	f.lookupErr = status.Error(codes.Unavailable, "connection error")
	if _, err := commit(s, user, id); status.Code(err) != codes.Unavailable || status.Convert(err).Message() != "session service unavailable" {
		t.Fatalf("commit with the session service down: %v", err)
	}
}
