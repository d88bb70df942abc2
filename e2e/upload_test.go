package e2e_test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/testenv"
	"github.com/clawmesh/clawmesh/internal/uploads"
	uploadv1 "github.com/clawmesh/clawmesh/proto/clawmesh/upload/v1"
)

const mib = 1 << 20

// fileEntry is a file entry result.
type fileEntry struct {
	RefID         string `json:"ref_id"`
	Marker        string `json:"marker"`
	WorkspacePath string `json:"workspace_path"`
	SizeBytes     int64  `json:"size_bytes"`
	Deduplicated  bool   `json:"deduplicated"`
}

// uc is one initialized client connection for the upload tests.
// grantUploads gives users, through the operator's connection op, the
// profile "up": files:create on the default agent.
func grantUploads(op *uc, users ...string) {
	sets := []map[string]any{
		{"prop": "permission_profiles.up.permissions", "value": []string{"files:create"}},
		{"prop": "permission_profiles.up.agents", "value": []string{"default"}},
	}
	for _, u := range users {
		sets = append(sets, map[string]any{"prop": "users." + u + ".permission_profiles", "value": []string{"up"}})
	}
	op.must("config/set-many", map[string]any{"sets": sets}, nil)
}

type uc struct {
	t *testing.T
	c *e2e.Client
}

func dialUC(t *testing.T, s *e2e.Stack, token ...string) *uc {
	t.Helper()
	c := s.Dial(t)
	if _, err := c.Initialize(token...); err != nil {
		t.Fatal(err)
	}
	return &uc{t: t, c: c}
}

// try calls method, decoding a result into out (when non-nil); it returns
// the refusal, if any.
func (u *uc) try(method string, params, out any) *e2e.RPCError {
	u.t.Helper()
	raw, err := u.c.Call(method, params)
	if err != nil {
		var re *e2e.RPCError
		if !errors.As(err, &re) {
			u.t.Fatalf("%s: %v", method, err)
		}
		return re
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			u.t.Fatalf("%s result %s: %v", method, raw, err)
		}
	}
	return nil
}

func (u *uc) must(method string, params, out any) {
	u.t.Helper()
	if re := u.try(method, params, out); re != nil {
		u.t.Fatalf("%s %v: %s", method, params, re.Describe())
	}
}

// refused checks a refusal's code and exact message.
func (u *uc) refused(method string, params any, code int64, msg string) *e2e.RPCError {
	u.t.Helper()
	re := u.try(method, params, nil)
	if re == nil || re.Code != code || re.Message != msg {
		got := "success"
		if re != nil {
			got = re.Describe()
		}
		u.t.Fatalf("%s: got %s, want %d %q", method, got, code, msg)
	}
	return re
}

type session struct{ ID, Workspace string }

func (u *uc) session(params map[string]any) session {
	u.t.Helper()
	var r struct {
		SessionID    string `json:"session_id"`
		WorkspaceDir string `json:"workspace_dir"`
	}
	u.must("session/new", params, &r)
	return session{r.SessionID, r.WorkspaceDir}
}

func (u *uc) begin(params map[string]any) (string, *e2e.RPCError) {
	u.t.Helper()
	var r struct {
		UploadID   string `json:"upload_id"`
		ChunkBytes int64  `json:"chunk_bytes"`
		MaxBytes   int64  `json:"max_bytes"`
	}
	if re := u.try("file/upload/begin", params, &r); re != nil {
		return "", re
	}
	if len(r.UploadID) != 32 || strings.Trim(r.UploadID, "0123456789abcdef") != "" || r.ChunkBytes != mib || r.MaxBytes != 10485760 {
		u.t.Fatalf("begin result %+v", r)
	}
	return r.UploadID, nil
}

func (u *uc) mustBegin(params map[string]any) string {
	u.t.Helper()
	id, re := u.begin(params)
	if re != nil {
		u.t.Fatalf("begin %v: %s", params, re.Describe())
	}
	return id
}

func chunkParams(id string, off int64, data []byte) map[string]any {
	return map[string]any{"upload_id": id, "offset": off, "data_b64": base64.StdEncoding.EncodeToString(data)}
}

// chunk sends one chunk and returns received_bytes.
func (u *uc) chunk(id string, off int64, data []byte) int64 {
	u.t.Helper()
	var r struct {
		ReceivedBytes int64 `json:"received_bytes"`
	}
	u.must("file/upload/chunk", chunkParams(id, off, data), &r)
	return r.ReceivedBytes
}

// sendAll sends data in 1 MiB chunks.
func (u *uc) sendAll(id string, data []byte) {
	u.t.Helper()
	for off := 0; off < len(data); off += mib {
		end := min(off+mib, len(data))
		if got := u.chunk(id, int64(off), data[off:end]); got != int64(end) {
			u.t.Fatalf("received_bytes %d after chunk at %d, want %d", got, off, end)
		}
	}
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func hexSHA(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// uploadsIn lists what is stored in a workspace's uploads folder.
func uploadsIn(t *testing.T, workspace string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(workspace, "uploads"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// stagingStats asks the upload-staging service directly, on its socket.
func stagingStats(t *testing.T, s *e2e.Stack) *uploadv1.StatsResponse {
	t.Helper()
	cc, err := grpc.NewClient("unix://"+filepath.Join(s.DataDir, "upload-staging.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	st, err := uploadv1.NewUploadServiceClient(cc).Stats(e2e.Context(t, 10*time.Second), &uploadv1.StatsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// A 9.5 MB file sent in 10 chunks lands in the session's workspace
// byte-identical, under its hash, and a file/attach of the same bytes
// finds it (same ref_id, workspace_path and marker; deduplicated). Its
// marker reaches the agent through session/prompt's attachments. Seed 000
// "chunked uploads": the section's opening and steps 1 to 3.
func TestUploadLandsLikeAttach(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	u := dialUC(t, s)
	sess := u.session(map[string]any{})
	data := randomBytes(t, 9*mib+mib/2)
	sum := hexSHA(data)

	id := u.mustBegin(map[string]any{"session_id": sess.ID, "size_bytes": len(data), "filename": "report.pdf",
		"sha256": " " + strings.ToUpper(sum) + " "})
	n := 0
	for off := 0; off < len(data); off += mib {
		end := min(off+mib, len(data))
		if got := u.chunk(id, int64(off), data[off:end]); got != int64(end) {
			t.Fatalf("received_bytes %d, want %d", got, end)
		}
		n++
		if n == 4 {
			// A lost reply: the same chunk again is acknowledged unchanged;
			// other bytes at that offset are refused.
			if got := u.chunk(id, int64(off), data[off:end]); got != int64(end) {
				t.Fatalf("resend: received_bytes %d, want %d", got, end)
			}
			other := append([]byte{^data[off]}, data[off+1:end]...)
			u.refused("file/upload/chunk", chunkParams(id, int64(off), other), -32602,
				fmt.Sprintf("Chunk at offset %d overlaps received data; the next offset is %d", off, end))
		}
	}
	if n != 10 {
		t.Fatalf("%d chunks", n)
	}
	var up fileEntry
	u.must("file/upload/commit", map[string]any{"upload_id": id}, &up)
	path := filepath.Join(sess.Workspace, "uploads", sum+".pdf")
	want := fileEntry{RefID: "sha256:" + sum, Marker: "[Document: report.pdf] " + path, WorkspacePath: path, SizeBytes: int64(len(data))}
	if up != want {
		t.Fatalf("commit %+v\nwant   %+v", up, want)
	}
	if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("stored file differs (%d bytes, %v)", len(got), err)
	}
	// A commit sent again (its reply lost) is answered the same file.
	var resent fileEntry
	u.must("file/upload/commit", map[string]any{"upload_id": id}, &resent)
	if resent != up {
		t.Fatalf("commit sent again %+v\nwant             %+v", resent, up)
	}

	// file/attach of the same bytes, by path (9.5 MB does not fit one
	// frame as base64): the same entry, deduplicated.
	src := filepath.Join(t.TempDir(), "report.pdf")
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	var att struct{ Files []fileEntry }
	u.must("file/attach", map[string]any{"session_id": sess.ID, "files": []map[string]any{{"path": src, "filename": "report.pdf"}}}, &att)
	want.Deduplicated = true
	if len(att.Files) != 1 || att.Files[0] != want {
		t.Fatalf("attach %+v\nwant   %+v", att.Files, want)
	}
	if names := uploadsIn(t, sess.Workspace); len(names) != 1 {
		t.Fatalf("workspace uploads %v", names)
	}

	// data_b64 and the reverse order: attach first, then upload; an image.
	png := append([]byte("\x89PNG\r\n\x1a\n"), randomBytes(t, 4000)...)
	u.must("file/attach", map[string]any{"session_id": sess.ID, "files": []map[string]any{
		{"data_b64": base64.StdEncoding.EncodeToString(png), "filename": "cat.png"},
		{"data_b64": base64.StdEncoding.EncodeToString([]byte("plain")), "mime_type": "text/plain"},
	}}, &att)
	img := att.Files[0]
	if img.Marker != "[IMAGE:"+img.WorkspacePath+"]" || img.Deduplicated || !strings.HasPrefix(att.Files[1].Marker, "[Document: upload] ") {
		t.Fatalf("attached %+v", att.Files)
	}
	id = u.mustBegin(map[string]any{"session_id": sess.ID, "size_bytes": len(png), "filename": "cat.png"})
	u.sendAll(id, png)
	var again fileEntry
	u.must("file/upload/commit", map[string]any{"upload_id": id}, &again)
	img.Deduplicated = true
	if again != img {
		t.Fatalf("upload after attach %+v, want %+v", again, img)
	}

	// session/prompt with attachments: each marker goes into the prompt.
	v := &conv{t: t, c: u.c, n: 1000}
	var pr struct{ Outcome, Content string }
	if err := json.Unmarshal(v.call("session/prompt", map[string]any{"session_id": sess.ID, "prompt": "/say read",
		"attachments": []fileEntry{up, img}}), &pr); err != nil {
		t.Fatal(err)
	}
	if pr.Outcome != "completed" || !strings.Contains(pr.Content, "report.pdf] "+path) || !strings.Contains(pr.Content, "[IMAGE:"+img.WorkspacePath+"]") {
		t.Fatalf("prompt with attachments: %+v", pr)
	}
	var msgs struct {
		Messages []struct{ Role, Content string }
	}
	u.must("session/messages", map[string]any{"session_id": sess.ID}, &msgs)
	if len(msgs.Messages) == 0 || msgs.Messages[0].Content != "/say read\n"+up.Marker+"\n"+img.Marker {
		t.Fatalf("transcript %+v", msgs.Messages)
	}
	forged := up
	forged.WorkspacePath = "/etc/passwd"
	_, f := v.until(v.send("session/prompt", map[string]any{"session_id": sess.ID, "prompt": "x", "attachments": []fileEntry{forged}}))
	if f.Error == nil || f.Error.Code != -32602 || !strings.Contains(f.Error.Message, "`attachments[0].workspace_path` is not where") {
		t.Fatalf("forged attachment: %+v", f.Error)
	}
	// One prompt names at most 64 files (each a lookup and a marker; an
	// 8 MiB frame listed 100,000 of them); the same file 64 times is fine.
	many := make([]fileEntry, 65)
	for i := range many {
		many[i] = up
	}
	_, f = v.until(v.send("session/prompt", map[string]any{"session_id": sess.ID, "prompt": "/say many", "attachments": many}))
	if f.Error == nil || f.Error.Code != -32602 || f.Error.Message != "Invalid params: `attachments` lists 65 files; the limit is 64" {
		t.Fatalf("65 attachments: %+v", f.Error)
	}
	if err := json.Unmarshal(v.call("session/prompt", map[string]any{"session_id": sess.ID, "prompt": "/say many", "attachments": many[:64]}), &pr); err != nil || pr.Outcome != "completed" {
		t.Fatalf("64 attachments: %+v %v", pr, err)
	}
}

// Four connections upload different files at once, so that chunk frames
// of several of the gateway's 64 KiB read blocks, and the buffers the
// chunks are decoded into, come and go from the gateway's pools for all
// of them together: every file lands byte-identical. A second round of
// slightly smaller files follows, two of them into the buffers
// upload-staging kept from the first: those land byte-identical too.
func TestConcurrentUploadsLandIntact(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	type job struct {
		u    *uc
		id   string
		data []byte
	}
	var conns []*uc
	var sessions []string
	for range 4 {
		u := dialUC(t, s)
		conns = append(conns, u)
		sessions = append(sessions, u.session(map[string]any{}).ID)
	}
	for round := range 2 {
		var jobs []job
		for i, u := range conns {
			data := randomBytes(t, 3*mib+mib/2+i-round*mib/4)
			id := u.mustBegin(map[string]any{"session_id": sessions[i], "size_bytes": len(data), "filename": fmt.Sprintf("f%d-%d.bin", round, i)})
			jobs = append(jobs, job{u, id, data})
		}
		errs := make(chan error, len(jobs))
		for _, j := range jobs {
			go func() {
				for off := 0; off < len(j.data); off += mib {
					end := min(off+mib, len(j.data))
					if _, err := j.u.c.Call("file/upload/chunk", chunkParams(j.id, int64(off), j.data[off:end])); err != nil {
						errs <- fmt.Errorf("chunk at %d of %s: %w", off, j.id, err)
						return
					}
				}
				errs <- nil
			}()
		}
		for range jobs {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		for i, j := range jobs {
			var up fileEntry
			j.u.must("file/upload/commit", map[string]any{"upload_id": j.id}, &up)
			if got, err := os.ReadFile(up.WorkspacePath); err != nil || !bytes.Equal(got, j.data) {
				t.Errorf("round %d: file %d stored differs (%d bytes of %d, %v)", round, i, len(got), len(j.data), err)
			}
			if up.RefID != "sha256:"+hexSHA(j.data) {
				t.Errorf("round %d: file %d ref %s", round, i, up.RefID)
			}
		}
	}
}

// A re-upload of an indexed file whose workspace copy was edited, deleted
// or replaced by a link writes the bytes back; the link's target is
// untouched. Seed 000 "chunked uploads", the re-upload paragraph.
func TestUploadRestoresTheWorkspaceCopy(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	u := dialUC(t, s)
	sess := u.session(map[string]any{})
	data := randomBytes(t, 3*mib+17)
	upload := func() fileEntry {
		t.Helper()
		id := u.mustBegin(map[string]any{"session_id": sess.ID, "size_bytes": len(data), "filename": "data.bin"})
		u.sendAll(id, data)
		var f fileEntry
		u.must("file/upload/commit", map[string]any{"upload_id": id}, &f)
		return f
	}
	first := upload()
	path := first.WorkspacePath
	target := filepath.Join(t.TempDir(), "elsewhere")
	if err := os.WriteFile(target, []byte("not the agent's"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		damage func() error
	}{
		{"edited", func() error { return os.WriteFile(path, []byte("edited"), 0o600) }},
		{"deleted", func() error { return os.Remove(path) }},
		{"replaced by a link", func() error {
			if err := os.Remove(path); err != nil {
				return err
			}
			return os.Symlink(target, path)
		}},
	} {
		if err := tc.damage(); err != nil {
			t.Fatal(err)
		}
		f := upload()
		if f.WorkspacePath != path || !f.Deduplicated || f.RefID != first.RefID {
			t.Fatalf("%s: %+v", tc.name, f)
		}
		st, err := os.Lstat(path)
		if err != nil || !st.Mode().IsRegular() {
			t.Fatalf("%s: not a regular file: %v %v", tc.name, st, err)
		}
		if got, _ := os.ReadFile(path); !bytes.Equal(got, data) {
			t.Fatalf("%s: not restored", tc.name)
		}
	}
	if got, _ := os.ReadFile(target); string(got) != "not the agent's" {
		t.Fatalf("the link's target was written: %q", got)
	}
}

// Every refusal of docs/spec.md §6 over the socket, and the ownership of an
// upload by its connection. Seed 000 "chunked uploads", steps 1 to 3 and
// the ownership paragraph. (The budget's refusal is in
// TestUploadBudgetConnectionsAndGatewayDeath; the non-local transport's
// -32012 in the gateway's TestUploadMethodsOnlyOnTheLocalSocket.)
func TestUploadRefusalsOverTheSocket(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	u := dialUC(t, s)
	other := dialUC(t, s)
	sess := u.session(map[string]any{})
	begin := func(extra map[string]any) map[string]any {
		p := map[string]any{"session_id": sess.ID, "size_bytes": 10}
		for k, v := range extra {
			p[k] = v
		}
		return p
	}
	const beginM = "file/upload/begin"
	u.refused(beginM, begin(map[string]any{"size_bytes": 10485761}), -32602, "Upload of 10485761 bytes exceeds the 10 MB file limit")
	u.refused(beginM, begin(map[string]any{"filename": strings.Repeat("n", 256)}), -32602, "`filename` is 256 bytes; the limit is 255")
	u.refused(beginM, begin(map[string]any{"sha256": "abc"}), -32602, "`sha256` must be 64 hexadecimal characters")
	u.refused(beginM, begin(map[string]any{"session_id": "sess_none"}), -32000, "Session sess_none not found")

	id := u.mustBegin(begin(nil))
	u.refused("file/upload/chunk", chunkParams(id, 0, nil), -32602, "A chunk must carry between 1 and 1048576 decoded bytes")
	u.refused("file/upload/chunk", chunkParams(id, 0, make([]byte, mib+1)), -32602, "A chunk must carry between 1 and 1048576 decoded bytes")
	u.refused("file/upload/chunk", chunkParams(id, 4, []byte("abcd")), -32602, "Chunk at offset 4 leaves a gap; the next offset is 0")
	u.chunk(id, 0, []byte("abcd"))
	u.refused("file/upload/chunk", chunkParams(id, 2, []byte("XY")), -32602, "Chunk at offset 2 overlaps received data; the next offset is 4")
	u.refused("file/upload/chunk", chunkParams(id, 4, []byte("1234567")), -32602, "Chunk ends at byte 11, past the declared size of 10")
	u.refused("file/upload/commit", map[string]any{"upload_id": id}, -32602, "Upload has 4 of 10 declared bytes; send the rest before committing")

	// Another connection cannot name it, not even to discard it.
	unknown := "Unknown or expired upload `" + id + "`"
	other.refused("file/upload/chunk", chunkParams(id, 4, []byte("efghij")), -32602, unknown)
	other.refused("file/upload/commit", map[string]any{"upload_id": id}, -32602, unknown)
	// Still staged for its own connection after every refusal.
	u.chunk(id, 4, []byte("efghij"))
	var f fileEntry
	u.must("file/upload/commit", map[string]any{"upload_id": id}, &f)
	if f.RefID != "sha256:"+hexSHA([]byte("abcdefghij")) || !strings.HasPrefix(f.Marker, "[Document: upload] ") {
		t.Fatalf("commit %+v", f)
	}
	fake := strings.Repeat("0", 32)
	u.refused("file/upload/chunk", chunkParams(fake, 0, []byte("x")), -32602, "Unknown or expired upload `"+fake+"`")

	// A declared hash that does not match: refused, and the upload is gone.
	id = u.mustBegin(begin(map[string]any{"size_bytes": 3, "sha256": hexSHA([]byte("abd"))}))
	u.chunk(id, 0, []byte("abc"))
	u.refused("file/upload/commit", map[string]any{"upload_id": id}, -32602, "Upload content does not match the SHA-256 declared at begin; begin again")
	u.refused("file/upload/commit", map[string]any{"upload_id": id}, -32602, "Unknown or expired upload `"+id+"`")

	// Four per connection; another connection has its own four.
	for range 4 {
		u.mustBegin(begin(nil))
	}
	u.refused(beginM, begin(nil), -32602, "This connection already has 4 uploads in progress; commit them or let them expire before beginning another")
	other.mustBegin(begin(nil))

	// Every upload method needs files:create, and begin checks ownership
	// and agent use: a user without them.
	u.must("config/set-many", map[string]any{"sets": []map[string]any{
		{"prop": "permission_profiles.chat.agents", "value": []string{"default"}},
		{"prop": "users.bob.permission_profiles", "value": []string{"chat"}},
	}}, nil)
	token := userToken(t, s, "bob")
	bob := dialUC(t, s, token)
	bobs := bob.session(map[string]any{})
	capsOf := func() string {
		init, err := bob.c.Initialize(token)
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(init["capabilities"])
	}
	if caps := capsOf(); strings.Contains(caps, "file/") {
		t.Fatalf("capabilities without files:create: %s", caps)
	}
	re := bob.refused(beginM, map[string]any{"session_id": bobs.ID, "size_bytes": 1}, -32012, "user:bob does not hold files:create")
	if !strings.Contains(string(re.Data), `"forbidden"`) {
		t.Fatalf("data %s", re.Data)
	}
	bob.refused("file/attach", map[string]any{"session_id": bobs.ID, "files": []map[string]any{{"data_b64": "eA=="}}}, -32012, "user:bob does not hold files:create")
	u.must("config/set", map[string]any{"prop": "permission_profiles.chat.permissions", "value": []string{"files:create"}}, nil)
	if caps := capsOf(); !strings.Contains(caps, "file/upload/begin") || !strings.Contains(caps, "file/attach") {
		t.Fatalf("capabilities with files:create: %s", caps)
	}
	bob.refused(beginM, map[string]any{"session_id": sess.ID, "size_bytes": 1}, -32003, "Session "+sess.ID+" belongs to another principal")
	bob.mustBegin(map[string]any{"session_id": bobs.ID, "size_bytes": 1})
	// A path is read as the daemon's user: a user's is refused before the
	// file is opened, the daemon's secret as any other.
	for _, path := range []string{filepath.Join(s.DataDir, ".secret_key"), filepath.Join(s.DataDir, "none")} {
		bob.refused("file/attach", map[string]any{"session_id": bobs.ID, "files": []map[string]any{{"path": path}}}, -32012, uploads.PathForbidden)
	}
	if names := uploadsIn(t, bobs.Workspace); len(names) != 0 {
		t.Fatalf("workspace uploads %v", names)
	}
	u.must("config/set", map[string]any{"prop": "permission_profiles.chat.agents", "value": []string{}}, nil)
	bob.refused(beginM, map[string]any{"session_id": bobs.ID, "size_bytes": 1}, -32012, "user:bob does not hold agent:use on `default`")
}

// The budget: payload and metadata are charged, a begin that does not fit
// is refused until idle uploads (of connections still open) are
// reclaimed; a closed connection's uploads go at once; a gateway that dies
// loses its uploads when its lease lapses. Seed 000 "chunked uploads",
// the limits paragraphs.
func TestUploadBudgetConnectionsAndGatewayDeath(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{
		Args: []string{"--set", "uploads.max_staged_bytes=1048576", "--set", "uploads.max_per_connection=1024"},
		Env:  []string{"CLAWMESH_UPLOAD_GATEWAY_LEASE=2s"},
	})
	op := dialUC(t, s)
	sess := op.session(map[string]any{})
	overBudget := "The daemon is staging too many uploads to accept this one now; retry after in-progress uploads finish"

	// Metadata counts: empty uploads with 255-byte filenames fill the
	// budget long before their filenames alone would.
	name := strings.Repeat("m", 255)
	meta := []*uc{dialUC(t, s), dialUC(t, s)}
	n := 0
	for ; ; n++ {
		if n > 1048576/255 {
			t.Fatal("empty uploads never hit the budget")
		}
		_, re := meta[n%2].begin(map[string]any{"session_id": sess.ID, "size_bytes": 0, "filename": name})
		if re != nil {
			if re.Code != -32602 || re.Message != overBudget {
				t.Fatalf("begin %d: %s", n, re.Describe())
			}
			break
		}
	}
	st := stagingStats(t, s)
	t.Logf("%d empty uploads with 255-byte filenames filled the 1 MiB budget (%d bytes charged)", n, st.GetStagedBytes())
	if int(st.GetUploads()) != n || st.GetStagedBytes() > 1048576 || st.GetPayloadBytes() != 0 || n*(255+300) > 1048576 {
		t.Fatalf("%d empty uploads, stats %v", n, st)
	}

	// Closing the connections frees the budget at once.
	for _, c := range meta {
		c.c.Close()
	}
	testenv.Eventually(t, 10*time.Second, 50*time.Millisecond, func() error {
		if st := stagingStats(t, s); st.GetUploads() != 0 || st.GetStagedBytes() != 0 {
			return fmt.Errorf("still staged after close: %v", st)
		}
		return nil
	})

	// Payload across connections: three of 300 kB fit, a fourth not.
	var holders []*uc
	var ids []string
	for range 3 {
		c := dialUC(t, s)
		id := c.mustBegin(map[string]any{"session_id": sess.ID, "size_bytes": 300000})
		c.chunk(id, 0, make([]byte, 1000))
		holders, ids = append(holders, c), append(ids, id)
	}
	late := dialUC(t, s)
	late.refused("file/upload/begin", map[string]any{"session_id": sess.ID, "size_bytes": 300000}, -32602, overBudget)
	// Another connection cannot name them.
	late.refused("file/upload/chunk", chunkParams(ids[0], 1000, []byte("x")), -32602, "Unknown or expired upload `"+ids[0]+"`")

	// Idle uploads are reclaimed for a new begin, though their
	// connections are open.
	op.must("config/set", map[string]any{"prop": "uploads.idle_timeout_secs", "value": 1}, nil)
	testenv.Eventually(t, 15*time.Second, 100*time.Millisecond, func() error {
		if _, re := late.begin(map[string]any{"session_id": sess.ID, "size_bytes": 300000}); re != nil {
			return errors.New(re.Describe())
		}
		return nil
	})
	holders[0].refused("file/upload/chunk", chunkParams(ids[0], 1000, []byte("x")), -32602, "Unknown or expired upload `"+ids[0]+"`")
	// The other idle ones go too (at the begin, or by the idle sweep when
	// they were not idle long enough yet at the begin): only late's stays.
	testenv.Eventually(t, 15*time.Second, 100*time.Millisecond, func() error {
		if st := stagingStats(t, s); st.GetUploads() != 1 {
			return fmt.Errorf("idle uploads kept: %v", st)
		}
		return nil
	})
	op.must("config/set", map[string]any{"prop": "uploads.idle_timeout_secs", "value": 300}, nil)
	late.c.Close()
	testenv.Eventually(t, 10*time.Second, 50*time.Millisecond, func() error {
		if st := stagingStats(t, s); st.GetUploads() != 0 {
			return fmt.Errorf("still staged: %v", st)
		}
		return nil
	})

	// The gateway dies with an upload staged: its lease lapses and the
	// budget is free again, though the upload is not idle long enough to
	// expire.
	g := dialUC(t, s)
	id := g.mustBegin(map[string]any{"session_id": sess.ID, "size_bytes": 900000})
	g.chunk(id, 0, make([]byte, 4096))
	if st := stagingStats(t, s); st.GetUploads() != 1 || st.GetGateways() != 1 {
		t.Fatalf("before the kill: %v", st)
	}
	pid := killGateway(t, s)
	testenv.Eventually(t, 20*time.Second, 100*time.Millisecond, func() error {
		if st := stagingStats(t, s); st.GetUploads() != 0 || st.GetStagedBytes() != 0 || st.GetGateways() != 0 {
			return fmt.Errorf("the dead gateway's upload is still staged: %v", st)
		}
		return nil
	})
	after := ucOnNewGateway(t, s, pid)
	after.mustBegin(map[string]any{"session_id": sess.ID, "size_bytes": 900000})
}

// killGateway kills s's gateway (SIGKILL), the launcher to start
// another in its place, and returns the killed one's pid.
func killGateway(t *testing.T, s *e2e.Stack) int {
	t.Helper()
	pid := s.PIDOf("gateway")
	if pid == 0 {
		t.Fatalf("no gateway among %v", s.PIDs())
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	return pid
}

// ucOnNewGateway waits for the gateway started in place of the one
// whose pid was dead to take a connection, initialized with token (if
// any), and returns it.
func ucOnNewGateway(t *testing.T, s *e2e.Stack, dead int, token ...string) *uc {
	t.Helper()
	var after *uc
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() error {
		if p := s.PIDOf("gateway"); p == 0 || p == dead {
			return errors.New("gateway not restarted yet")
		}
		c, err := e2e.Dial(s.Socket)
		if err != nil {
			return err
		}
		if _, err := c.Initialize(token...); err != nil {
			c.Close()
			return err
		}
		t.Cleanup(func() { c.Close() })
		after = &uc{t: t, c: c}
		return nil
	})
	return after
}

// A gateway that dies leaves its connections' uploads unnameable, but
// they stayed charged to their user's share until the gateway's lease
// lapsed (15 s): the user's client, reconnected to the gateway started
// in its place, was refused "You are staging H bytes of uploads ...;
// commit them or let them expire", which it could do neither of.
// upload-staging sees the dead gateway's transport close and reclaims
// its uploads when a begin needs their room (or at its next sweep).
func TestUploadShareFreedWhenTheGatewayDies(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{Args: []string{"--set", "uploads.max_user_staged_bytes=1048576"}})
	op := dialUC(t, s)
	grantUploads(op, "alice")
	token := userToken(t, s, "alice")
	alice := dialUC(t, s, token)
	sess := alice.session(map[string]any{})
	id := alice.mustBegin(map[string]any{"session_id": sess.ID, "size_bytes": 900000})
	alice.chunk(id, 0, make([]byte, 4096))
	// The share is full: another of her connections is refused.
	if _, re := dialUC(t, s, token).begin(map[string]any{"session_id": sess.ID, "size_bytes": 900000}); re == nil || !strings.HasPrefix(re.Message, "You are staging ") {
		t.Fatalf("begin past the share: %v", re)
	}

	pid := killGateway(t, s)
	after := ucOnNewGateway(t, s, pid, token)
	if _, re := after.begin(map[string]any{"session_id": sess.ID, "size_bytes": 900000}); re != nil {
		t.Fatalf("begin on the new gateway, the dead one's upload unnameable: %s (staged: %v)", re.Describe(), stagingStats(t, s))
	}
}

// Commit re-checks, under the session's lock, the session and the grants
// in force at that moment: a revoked files:create, an unpaired token, and
// a session closed and reopened, or deleted and created again, with the
// same id, each fail the commit with nothing written. Seed 000 "chunked
// uploads", the paragraph on the session an upload is bound to.
func TestUploadCommitRaces(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	op := dialUC(t, s)
	grantUploads(op, "alice")
	pair := func() *uc { return dialUC(t, s, userToken(t, s, "alice")) }
	alice := pair()
	sess := alice.session(map[string]any{})
	data := randomBytes(t, 2*mib+5)
	staged := func(c *uc) string {
		t.Helper()
		id := c.mustBegin(map[string]any{"session_id": sess.ID, "size_bytes": len(data), "filename": "race.bin"})
		c.sendAll(id, data)
		return id
	}
	nothing := func(why string) {
		t.Helper()
		if names := uploadsIn(t, sess.Workspace); len(names) != 0 {
			t.Fatalf("%s: written %v", why, names)
		}
	}

	// files:create revoked between the last chunk and commit.
	id := staged(alice)
	op.must("config/set", map[string]any{"prop": "permission_profiles.up.permissions", "value": []string{}}, nil)
	alice.refused("file/upload/commit", map[string]any{"upload_id": id}, -32012, "user:alice does not hold files:create")
	nothing("grant revoked")
	// A refused commit discards the upload.
	alice.refused("file/upload/commit", map[string]any{"upload_id": id}, -32602, "Unknown or expired upload `"+id+"`")
	op.must("config/set", map[string]any{"prop": "permission_profiles.up.permissions", "value": []string{"files:create"}}, nil)

	// The token unpaired between the last chunk and commit.
	id = staged(alice)
	if out, err := clawmesh(t, s, "token", "revoke", "--user", "alice"); err != nil {
		t.Fatalf("token revoke: %v\n%s", err, out)
	}
	re := alice.refused("file/upload/commit", map[string]any{"upload_id": id}, -32012, "the token of user \"alice\" was revoked")
	_ = re
	nothing("token unpaired")
	alice = pair()

	// Closed and reopened with the same id.
	id = staged(alice)
	alice.must("session/close", map[string]any{"session_id": sess.ID}, nil)
	alice.session(map[string]any{"session_id": sess.ID})
	alice.refused("file/upload/commit", map[string]any{"upload_id": id}, -32000,
		"Session "+sess.ID+" was closed or recreated since the upload began; begin the upload again")
	nothing("session reopened")

	// Deleted and created again with the same id.
	id = staged(alice)
	alice.must("session/delete", map[string]any{"session_id": sess.ID}, nil)
	if again := alice.session(map[string]any{"session_id": sess.ID}); again.ID != sess.ID {
		t.Fatalf("recreated %+v", again)
	}
	alice.refused("file/upload/commit", map[string]any{"upload_id": id}, -32000,
		"Session "+sess.ID+" was closed or recreated since the upload began; begin the upload again")
	nothing("session recreated")

	// Unchanged, it lands.
	id = staged(alice)
	var f fileEntry
	alice.must("file/upload/commit", map[string]any{"upload_id": id}, &f)
	if f.RefID != "sha256:"+hexSHA(data) || len(uploadsIn(t, sess.Workspace)) != 1 {
		t.Fatalf("commit %+v", f)
	}
}

// A client whose connection closes while its commit runs (it timed out,
// or crashed) commits the same upload again from a new connection, as
// step 3 lets it, and gets the file entry (once the first commit is
// done; "is being committed" until then). It was told "Unknown or
// expired upload", whether or not the session service had gone on to
// store the file: the gateway cancels a closed connection's calls, and
// the commit saw only its cancelled store. The connection is closed
// once another connection of the same user is told the upload is being
// committed; a commit that ends before that is seen is tried again with
// new content.
func TestUploadCommitCutOffByItsClient(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	u := dialUC(t, s)
	sess := u.session(map[string]any{})
	again := dialUC(t, s)
	for attempt := 1; ; attempt++ {
		if attempt > 5 {
			t.Fatal("no commit seen running in 5 attempts")
		}
		c := dialUC(t, s)
		data := randomBytes(t, 10*mib)
		id := c.mustBegin(map[string]any{"session_id": sess.ID, "size_bytes": len(data), "filename": "cut.bin"})
		c.sendAll(id, data)
		if err := c.c.Send(`{"jsonrpc":"2.0","method":"file/upload/commit","params":{"upload_id":"` + id + `"},"id":99}`); err != nil {
			t.Fatal(err)
		}
		var f fileEntry
		var re *e2e.RPCError
		// Unknown to another connection until the commit takes it.
		for deadline := time.Now().Add(30 * time.Second); ; {
			if re = again.try("file/upload/commit", map[string]any{"upload_id": id}, &f); re == nil || re.Message != uploads.UnknownUpload(id) || time.Now().After(deadline) {
				break
			}
		}
		c.c.Close()
		if re == nil {
			t.Logf("attempt %d: the commit ended before it was seen running", attempt)
			continue
		}
		if re.Message != uploads.Committing(id) {
			t.Fatalf("commit from another connection while the first runs: %s", re.Describe())
		}
		testenv.Eventually(t, 60*time.Second, 20*time.Millisecond, func() error {
			if re = again.try("file/upload/commit", map[string]any{"upload_id": id}, &f); re != nil && re.Message == uploads.Committing(id) {
				return errors.New(re.Message)
			}
			return nil
		})
		if re != nil {
			t.Fatalf("commit sent again from a new connection, its first cut off: %s (stored: %v)", re.Describe(), uploadsIn(t, sess.Workspace))
		}
		got, err := os.ReadFile(f.WorkspacePath)
		if err != nil || !bytes.Equal(got, data) || f.RefID != "sha256:"+hexSHA(data) || f.SizeBytes != int64(len(data)) {
			t.Fatalf("commit sent again %+v; stored %d bytes (%v)", f, len(got), err)
		}
		return
	}
}

// A session service killed while it stores a committed file, between
// writing the file under a temporary name and renaming it into place,
// left that temporary file, as large as the upload, in the workspace's
// uploads folder for good, and the commit was refused as "upload-staging
// unavailable". It is refused naming the session service, the upload
// stays staged, and the same commit tried again once
// the service is back lands the file, the first store of the new process
// into the session, which removes what the dead one left.
func TestSessionKilledWhileStoringLeavesNoTemporaryFile(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	u := dialUC(t, s)
	sess := u.session(map[string]any{})
	uploadsDir := filepath.Join(sess.Workspace, "uploads")
	temps := func() []string {
		var names []string
		for _, name := range uploadsIn(t, sess.Workspace) {
			if strings.HasPrefix(name, ".tmp-") {
				names = append(names, name)
			}
		}
		return names
	}

	const attempts = 8
	for attempt := 1; ; attempt++ {
		if attempt > attempts {
			t.Fatalf("no kill landed while the file was written, in %d commits", attempts)
		}
		data := randomBytes(t, 10*mib)
		id := u.mustBegin(map[string]any{"session_id": sess.ID, "size_bytes": len(data), "filename": "big.bin"})
		u.sendAll(id, data)
		pid := s.PIDOf("session")
		committed := make(chan error, 1)
		go func() {
			_, err := u.c.Call("file/upload/commit", map[string]any{"upload_id": id})
			committed <- err
		}()
		// Killed as soon as the temporary file shows.
		killed := false
		var err error
	watch:
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
			select {
			case err = <-committed:
				break watch
			default:
			}
			if len(temps()) > 0 {
				if e := syscall.Kill(pid, syscall.SIGKILL); e != nil {
					t.Fatal(e)
				}
				killed = true
				err = <-committed
				break
			}
			time.Sleep(100 * time.Microsecond)
		}
		if !killed {
			if err != nil {
				t.Fatalf("commit %d: %v", attempt, err)
			}
			continue // stored before the watch saw its file
		}
		if err == nil {
			// The store answered before the kill landed (the watch was
			// descheduled): nothing was left; try again once it is back.
			testenv.Eventually(t, 60*time.Second, 100*time.Millisecond, func() error {
				if p := s.PIDOf("session"); p == 0 || p == pid {
					return fmt.Errorf("session service pid %d (killed %d)", p, pid)
				}
				if re := u.try("session/state", map[string]any{"session_id": sess.ID}, nil); re != nil {
					return fmt.Errorf("session/state: %s", re.Describe())
				}
				return nil
			})
			continue
		}
		// Refused as the session service's failure, not upload-staging's.
		var re *e2e.RPCError
		if !errors.As(err, &re) || re.Code != -32603 || re.Message != "upload-staging: session service unavailable" {
			t.Fatalf("commit %d with its session service killed: %v, want -32603 %q", attempt, err, "upload-staging: session service unavailable")
		}
		left := temps()
		t.Logf("commit %d: killed with %v in the uploads folder; refused %s", attempt, left, re.Describe())

		// Tried again once the service is back, the staged upload lands.
		var fe fileEntry
		testenv.Eventually(t, 60*time.Second, 100*time.Millisecond, func() error {
			if p := s.PIDOf("session"); p == 0 || p == pid {
				return fmt.Errorf("session service pid %d (killed %d)", p, pid)
			}
			if re := u.try("file/upload/commit", map[string]any{"upload_id": id}, &fe); re != nil {
				return fmt.Errorf("commit again: %s", re.Describe())
			}
			return nil
		})
		if fe.RefID != "sha256:"+hexSHA(data) {
			t.Fatalf("commit again: %+v", fe)
		}
		if got, err := os.ReadFile(fe.WorkspacePath); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("stored file: %d bytes, %v", len(got), err)
		}
		if rest := temps(); len(rest) > 0 {
			t.Fatalf("left in %s after the next store: %v", uploadsDir, rest)
		}
		if len(left) > 0 {
			return // the case this test is for happened, and was mended
		}
	}
}

// A user's sessions hold at most uploads.max_user_stored_bytes in stored
// files, checked at begin (the declared size), again at commit (two
// uploads begun on the same room) and for file/attach; deleting a session
// frees its files' room, and the operator is not bounded. Without it a
// paired token stored 10 MB files in a loop until the disk was full.
func TestUploadUserStoredQuota(t *testing.T) {
	t.Parallel()
	const quota = 3 * mib
	s := e2e.Start(t, e2e.Options{Args: []string{"--set", fmt.Sprintf("uploads.max_user_stored_bytes=%d", quota)}})
	op := dialUC(t, s)
	grantUploads(op, "alice")
	token := userToken(t, s, "alice")
	alice := dialUC(t, s, token)
	s1, s2 := alice.session(map[string]any{}), alice.session(map[string]any{})
	upload := func(sess session, data []byte) string {
		id := alice.mustBegin(map[string]any{"session_id": sess.ID, "size_bytes": len(data)})
		alice.sendAll(id, data)
		return id
	}
	full := func(held, n int) string { return uploads.StoredBytesFull(int64(held), int64(n), quota) }

	a, b := randomBytes(t, 2*mib), randomBytes(t, 2*mib)
	// Two begun while nothing is stored: both pass begin; the second
	// commit finds the room taken and its upload is discarded.
	first, second := upload(s1, a), upload(s2, b)
	alice.must("file/upload/commit", map[string]any{"upload_id": first}, nil)
	re := alice.refused("file/upload/commit", map[string]any{"upload_id": second}, -32602, full(2*mib, 2*mib))
	if !strings.Contains(string(re.Data), `"capacity"`) {
		t.Fatalf("data %s", re.Data)
	}
	alice.refused("file/upload/commit", map[string]any{"upload_id": second}, -32602, "Unknown or expired upload `"+second+"`")
	if names := uploadsIn(t, s2.Workspace); len(names) != 0 {
		t.Fatalf("refused upload written: %v", names)
	}
	// Refused at begin, before any byte is sent, and for file/attach.
	alice.refused("file/upload/begin", map[string]any{"session_id": s2.ID, "size_bytes": 2 * mib}, -32602, full(2*mib, 2*mib))
	alice.refused("file/attach", map[string]any{"session_id": s2.ID, "files": []map[string]any{
		{"data_b64": base64.StdEncoding.EncodeToString(b[:mib+1])}}}, -32602, full(2*mib, mib+1))
	// What fits is stored.
	alice.must("file/upload/commit", map[string]any{"upload_id": upload(s2, b[:mib])}, nil)

	// The operator's own sessions are not bounded.
	ops := op.session(map[string]any{})
	for range 2 {
		data := randomBytes(t, 2*mib)
		id := op.mustBegin(map[string]any{"session_id": ops.ID, "size_bytes": len(data)})
		op.sendAll(id, data)
		op.must("file/upload/commit", map[string]any{"upload_id": id}, nil)
	}

	// Deleting s1 frees its 2 MiB.
	alice.must("session/delete", map[string]any{"session_id": s1.ID}, nil)
	alice.must("file/upload/commit", map[string]any{"upload_id": upload(s2, b)}, nil)
	if names := uploadsIn(t, s2.Workspace); len(names) != 2 {
		t.Fatalf("stored %v; want two files", names)
	}
	// The quota follows the live config (which each service follows over
	// NATS: a moment later).
	op.must("config/set", map[string]any{"prop": "uploads.max_user_stored_bytes", "value": 0}, nil)
	want := uploads.StoredBytesFull(3*mib, 1, 0)
	testenv.Eventually(t, 15*time.Second, 50*time.Millisecond, func() error {
		// A connection of its own each time: a begin that passed keeps
		// its upload, and a connection stages at most four.
		c := dialUC(t, s, token)
		defer c.c.Close()
		if _, re := c.begin(map[string]any{"session_id": s2.ID, "size_bytes": 1}); re == nil || re.Code != -32602 || re.Message != want {
			return fmt.Errorf("begin after the quota went to 0: %v", re)
		}
		return nil
	})
	// With no room at all, content s2 holds is still taken: a client
	// that lost a commit's reply sends the file again, declaring its
	// hash, and gets its entry, deduplicated (it was refused for the
	// room the file itself took); or it commits the same upload again
	// from a new connection and gets the entry it missed.
	c := dialUC(t, s, token)
	id := c.mustBegin(map[string]any{"session_id": s2.ID, "size_bytes": len(b), "sha256": hexSHA(b)})
	c.sendAll(id, b)
	var again, missed fileEntry
	c.must("file/upload/commit", map[string]any{"upload_id": id}, &again)
	if !again.Deduplicated || again.RefID != "sha256:"+hexSHA(b) {
		t.Fatalf("sent again %+v", again)
	}
	c.c.Close()
	dialUC(t, s, token).must("file/upload/commit", map[string]any{"upload_id": id}, &missed)
	if missed != again {
		t.Fatalf("committed again from a new connection %+v\nwant %+v", missed, again)
	}
}

// A commit's answer outlives upload-staging: killed after the session
// service stored the file (the client's reply lost with it), the
// process started again knows nothing of the upload, and the client's
// commit sent again was told "Unknown or expired upload" although its
// file was stored. It asks the session service, which recorded the
// upload id beside the file, and answers the same entry; another user
// naming that id is told it is unknown, as is an id never begun.
func TestUploadCommitAnsweredAfterStagingRestarts(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	op := dialUC(t, s)
	grantUploads(op, "alice", "bob")
	alice := dialUC(t, s, userToken(t, s, "alice"))
	bob := dialUC(t, s, userToken(t, s, "bob"))
	sess := alice.session(map[string]any{})
	data := randomBytes(t, 300000)
	id := alice.mustBegin(map[string]any{"session_id": sess.ID, "size_bytes": len(data), "filename": "kept.bin", "mime_type": "application/octet-stream"})
	alice.sendAll(id, data)
	var first fileEntry
	alice.must("file/upload/commit", map[string]any{"upload_id": id}, &first)

	pid := s.PIDOf("upload-staging")
	if pid == 0 {
		t.Fatal("no upload-staging process")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var again fileEntry
	var re *e2e.RPCError
	// Sent again until the new process answers it (not "unavailable").
	testenv.Eventually(t, 60*time.Second, 100*time.Millisecond, func() error {
		if p := s.PIDOf("upload-staging"); p == 0 || p == pid {
			return fmt.Errorf("upload-staging pid %d (killed %d)", p, pid)
		}
		if re = alice.try("file/upload/commit", map[string]any{"upload_id": id}, &again); re != nil && re.Code == -32603 {
			return fmt.Errorf("commit again: %s", re.Describe())
		}
		return nil
	})
	if re != nil {
		t.Fatalf("commit sent again after a restart: %s", re.Describe())
	}
	if again != first {
		t.Fatalf("commit sent again after a restart answered %+v, first %+v", again, first)
	}
	// Another user's commit of the same id, and an id never begun.
	bob.refused("file/upload/commit", map[string]any{"upload_id": id}, -32602, uploads.UnknownUpload(id))
	other := strings.Repeat("0", uploads.IDHexLen)
	alice.refused("file/upload/commit", map[string]any{"upload_id": other}, -32602, uploads.UnknownUpload(other))
	alice.refused("file/upload/commit", map[string]any{"upload_id": "x' OR '1'='1"}, -32602, "Invalid params: "+uploads.BadUploadID)
}

// A chunk's data_b64 is checked by its decoding alone on the gateway's
// common path (readChunk): through the real stack, JSON escapes in it
// are still read as JSON has them, an escaped quote that ends the fast
// reading's string early is refused as the ordinary reading refuses it
// (not as a chunk without an offset), and a bad byte anywhere in a full
// 1 MiB chunk is refused without the upload losing anything; the file,
// a full chunk and one byte, lands whole, its declared SHA-256 checked
// at commit.
func TestUploadChunkEncodingsOverTheSocket(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	u := dialUC(t, s)
	sess := u.session(map[string]any{})
	data := make([]byte, mib+1)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	id := u.mustBegin(map[string]any{"session_id": sess.ID, "size_bytes": len(data), "sha256": hexSHA(data)})
	chunk := func(off int, b64 string) json.RawMessage {
		return json.RawMessage(fmt.Sprintf(`{"upload_id":%q,"offset":%d,"data_b64":"%s"}`, id, off, b64))
	}
	const notB64 = "Invalid params: `data_b64` is not valid base64"
	full := base64.StdEncoding.EncodeToString(data[:mib])
	u.refused("file/upload/chunk", chunk(0, full[:len(full)-1]+"*"), -32602, notB64)
	u.refused("file/upload/chunk", chunk(0, full[:len(full)/2]+"*"+full[len(full)/2+1:]), -32602, notB64)
	u.refused("file/upload/chunk", chunk(0, full[:4]+"\xff"+full[5:]), -32602, notB64)
	u.refused("file/upload/chunk", json.RawMessage(fmt.Sprintf(`{"upload_id":%q,"data_b64":"%s\"}","offset":0}`, id, full[:8])), -32602, notB64)
	// Escaped, the same bytes: "\/" is '/', "\u0041" is 'A'.
	var r struct {
		ReceivedBytes int64 `json:"received_bytes"`
	}
	u.must("file/upload/chunk", chunk(0, strings.ReplaceAll(full, "/", `\/`)), &r)
	if r.ReceivedBytes != mib {
		t.Fatalf("received %d after the first chunk", r.ReceivedBytes)
	}
	last := base64.StdEncoding.EncodeToString(data[mib:])
	u.must("file/upload/chunk", chunk(mib, fmt.Sprintf(`\u%04x`, last[0])+last[1:]), &r)
	var f fileEntry
	u.must("file/upload/commit", map[string]any{"upload_id": id}, &f)
	if f.RefID != "sha256:"+hexSHA(data) || f.SizeBytes != int64(len(data)) {
		t.Fatalf("commit %+v", f)
	}
}

// A gateway's connection keeps the scratch its chunks were decoded into
// after its upload is committed, when the gateway holds no lease of
// upload-staging (no upload staged). Killed then, the gateway left it
// mapped in upload-staging until evicted at the bound; upload-staging
// now holds a scratch for as long as the connection it was passed over
// is open, which the gateway's death closes.
func TestUploadScratchesGoWithTheGatewayThatDied(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	c := dialUC(t, s)
	sess := c.session(map[string]any{})
	id := c.mustBegin(map[string]any{"session_id": sess.ID, "size_bytes": 1 << 20})
	c.chunk(id, 0, make([]byte, 1<<20))
	c.must("file/upload/commit", map[string]any{"upload_id": id}, nil)
	if st := stagingStats(t, s); st.GetScratches() != 1 || st.GetScratchBytes() == 0 || st.GetUploads() != 0 || st.GetGateways() != 0 {
		t.Fatalf("before the kill, a scratch held and no lease wanted: %v", st)
	}
	killGateway(t, s)
	testenv.Eventually(t, 20*time.Second, 100*time.Millisecond, func() error {
		if st := stagingStats(t, s); st.GetScratches() != 0 || st.GetScratchBytes() != 0 {
			return fmt.Errorf("the dead gateway's scratch is still held: %v", st)
		}
		return nil
	})
}
